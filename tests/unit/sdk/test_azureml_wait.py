"""``Run.wait_for_completion(show_output=True)`` (and ``torchyard wait``, the same
``runs.wait``) when a run ends within one poll: the first look already finds it
Succeeded, so the log followers have only just started. Every node's log must still be
printed: live where its stream delivers, else from the run's archive, node by node.

The apiserver and the registry service are fakes of torchyard's own ``k8s`` and
``RegistryClient`` surfaces (the real ones are exercised by tests/integration/test_cli.py
and test_azureml.py)."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from torchyard import k8s
from torchyard.sdk import Experiment, Run, Workspace, runs

NS = "team"


def finished_run(name: str, nodes: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "environment": "pytorch",
            "command": ["python", "train.py"],
            "distribution": {"nodeCount": nodes, "processCountPerNode": 2},
        },
        "status": {"phase": "Succeeded", "completionTime": "2026-01-01T00:00:01Z"},
    }


def node_pod(run: str, node: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{run}-{node}",
            "labels": {"torchyard.dev/run": run, "torchyard.dev/node-rank": str(node)},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {},
        "status": {"phase": "Succeeded"},
    }


class Archive:
    """The registry service's view of the run: two ranks' logs per node."""

    def __init__(self, run: str, nodes: int) -> None:
        self.files = {
            f"logs/node-{n}/rank-{r}.txt": f"archived line of rank {r}\n"
            for n in range(nodes)
            for r in (2 * n, 2 * n + 1)
        }
        self.files["outputs/model.pt"] = "weights"
        self.run = run
        self.read: list[str] = []

    def run_files(self, namespace: str, run: str) -> list[str]:
        assert (namespace, run) == (NS, self.run)
        return sorted(self.files)

    def read_run_file(self, namespace: str, run: str, path: str) -> str:
        self.read.append(path)
        return self.files[path]


class Kubelet:
    """pods/log as the apiserver answers it: per Pod, after ``delay`` seconds (longer than
    the SDK's first look at the run), either lines or an error."""

    def __init__(self, answers: dict[str, list[str] | str], delay: float) -> None:
        self.answers = answers
        self.delay = delay
        self.asked: list[str] = []
        self.lock = threading.Lock()

    def pod_log_lines(self, namespace: str, pod: str, **_: object) -> Iterator[str]:
        with self.lock:
            self.asked.append(pod)
        time.sleep(self.delay)
        answer = self.answers[pod]
        if isinstance(answer, str):
            raise k8s.ApiError(502, "Bad Gateway", answer)
        yield from answer


@pytest.fixture
def cluster_with(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    def install(run: dict[str, Any], pods: list[dict[str, Any]], kubelet: Kubelet) -> None:
        name = run["metadata"]["name"]
        monkeypatch.setattr(runs, "get", lambda ns, n: run if (ns, n) == (NS, name) else {})
        monkeypatch.setattr(runs, "node_pods", lambda ns, n: list(pods))
        monkeypatch.setattr(k8s, "pod_log_lines", kubelet.pod_log_lines)

    return install


def sdk_run(name: str, archive: Archive) -> Run:
    ws = Workspace(namespace=NS)
    ws.registry = lambda: archive  # type: ignore[assignment,method-assign,return-value]
    return Run(Experiment(ws, "birds"), name)


def test_a_run_over_within_one_poll_still_prints_every_rank_from_the_archive(
    cluster_with: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # The kubelet answers after the first (and only) poll: it cannot be reached.
    kubelet = Kubelet(
        {f"fast-{n}": "dial tcp 10.0.0.1:10250: connection refused" for n in (0, 1)}, 0.3
    )
    cluster_with(finished_run("fast", 2), [node_pod("fast", 0), node_pod("fast", 1)], kubelet)
    archive = Archive("fast", 2)
    details = sdk_run("fast", archive).wait_for_completion(show_output=True)
    out = capsys.readouterr().out
    assert details["status"] == "Completed"
    assert sorted(kubelet.asked) == ["fast-0", "fast-1"]
    for node, rank in ((0, 0), (0, 1), (1, 2), (1, 3)):
        assert f"[node {node}] [rank {rank}] archived line of rank {rank}" in out, out
    assert "node 0: dial tcp 10.0.0.1:10250: connection refused" in out
    assert out.index("archived line") < out.index("TrainingRun fast succeeded")


def test_only_the_nodes_whose_live_log_did_not_deliver_come_from_the_archive(
    cluster_with: Any,
) -> None:
    # node 0 streams (late), node 1's kubelet is unreachable, node 2's Pod is gone.
    kubelet = Kubelet(
        {"mixed-0": ["[rank 0] live hello", "[rank 1] live hello"], "mixed-1": "no route"},
        0.3,
    )
    cluster_with(finished_run("mixed", 3), [node_pod("mixed", 0), node_pod("mixed", 1)], kubelet)
    archive = Archive("mixed", 3)
    out = io.StringIO()
    run = runs.wait(NS, "mixed", out=out, poll=5.0, registry=lambda: archive)  # type: ignore[arg-type,return-value]
    text = out.getvalue()
    assert run["status"]["phase"] == "Succeeded"
    assert "[node 0] [rank 0] live hello" in text and "[node 0] [rank 1] live hello" in text
    assert "archived line of rank 0" not in text, "node 0 delivered live: not twice"
    for node, rank in ((1, 2), (1, 3), (2, 4), (2, 5)):
        assert f"[node {node}] [rank {rank}] archived line of rank {rank}" in text, text
    assert sorted(archive.read) == [
        "logs/node-1/rank-2.txt",
        "logs/node-1/rank-3.txt",
        "logs/node-2/rank-4.txt",
        "logs/node-2/rank-5.txt",
    ]
    assert "node 1: no route" in text and "node 2: its Pod was not seen running" in text


def test_a_stream_that_never_ends_is_cut_after_the_grace_and_read_from_the_archive(
    cluster_with: Any,
) -> None:
    kubelet = Kubelet({"hung-0": ["never"]}, 30.0)  # answers long after the grace
    cluster_with(finished_run("hung", 1), [node_pod("hung", 0)], kubelet)
    archive = Archive("hung", 1)
    out = io.StringIO()
    started = time.monotonic()
    runs.wait(NS, "hung", out=out, registry=lambda: archive, log_grace=0.5)  # type: ignore[arg-type,return-value]
    assert time.monotonic() - started < 5, "the wait does not hang on a stream"
    text = out.getvalue()
    assert "[node 0] [rank 1] archived line of rank 1" in text
    assert "no end of the stream within 0.5s" in text
    assert "never" not in text


def test_no_archive_either_is_said_and_does_not_crash(cluster_with: Any) -> None:
    kubelet = Kubelet({"lost-0": "connection refused"}, 0.1)
    cluster_with(finished_run("lost", 1), [node_pod("lost", 0)], kubelet)
    out = io.StringIO()
    runs.wait(NS, "lost", out=out, registry=None)
    text = out.getvalue()
    assert "nor the archived logs: no registry client; try: torchyard logs lost" in text


def test_a_run_still_going_after_the_timeout_raises_timeouterror(cluster_with: Any) -> None:
    going = finished_run("slow", 1)
    going["status"] = {"phase": "Running"}
    cluster_with(going, [], Kubelet({}, 0))
    with pytest.raises(TimeoutError, match="TrainingRun slow did not finish within 0s"):
        sdk_run("slow", Archive("slow", 1)).wait_for_completion(poll=0.01, timeout=0.05)
