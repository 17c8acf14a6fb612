"""The operator against the real apiserver: observedGeneration, the Accepted condition,
status patched only when something changed, curated Environments (in-process); and the
operator process SIGKILLed in the middle of a fan-out, again and again, ending each time
with exactly its node Pods (and no Service while its gang waits) once restarted
(``python -m torchyard.controller`` as a subprocess, as the chart runs it)."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.builders import TrainingRunBuilder, environment
from tests.cluster import chart
from tests.cluster.harness import Cluster
from tests.conftest import InProcessOperator
from tests.integration.helpers import OperatorProcess, conditions, wait_for, wait_status
from torchyard import k8s
from torchyard.planning import names


def test_trainingrun_gets_accepted_status(
    cluster: Cluster, operator: object, namespace: str
) -> None:
    k8s.create(TrainingRunBuilder("birds", namespace).nodes(2).procs(2).obj())
    obj = wait_status(
        k8s.TRAININGRUNS, namespace, "birds", lambda s: s.get("observedGeneration") == 1
    )
    accepted = conditions(obj)["Accepted"]
    assert (accepted["status"], accepted["reason"]) == ("True", "Valid")
    assert accepted["observedGeneration"] == 1
    assert obj["status"]["worldSize"] == 4
    assert obj["status"]["nodes"]["ready"] == "0/2"
    # No Environment "pytorch" yet: the run waits in Preparing and says why.
    assert obj["status"]["phase"] == "Preparing"
    env_cond = conditions(obj)["EnvironmentReady"]
    assert env_cond["reason"] == "EnvironmentNotFound"
    assert "Environment pytorch does not exist" in env_cond["message"]
    cluster.kubectl(
        "wait", "--for=condition=Accepted", "tr/birds", "-n", namespace, "--timeout=10s"
    )
    row = cluster.kubectl("get", "tr", "birds", "-n", namespace, "--no-headers").split()
    assert row[1:4] == ["Preparing", "0/2", "4"]


def test_spec_change_bumps_observed_generation(
    operator: object, namespace: str, cluster: Cluster
) -> None:
    k8s.create(TrainingRunBuilder("gen", namespace).obj())
    wait_status(k8s.TRAININGRUNS, namespace, "gen", lambda s: s.get("observedGeneration") == 1)
    cluster.kubectl(
        "patch",
        "tr",
        "gen",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"command":["python","b.py"]}}',
    )
    obj = wait_status(
        k8s.TRAININGRUNS, namespace, "gen", lambda s: s.get("observedGeneration") == 2
    )
    assert conditions(obj)["Accepted"]["observedGeneration"] == 2


def test_status_is_not_rewritten_when_nothing_changed(
    operator: InProcessOperator, namespace: str
) -> None:
    k8s.create(TrainingRunBuilder("quiet", namespace).obj())
    first = wait_status(
        k8s.TRAININGRUNS, namespace, "quiet", lambda s: s.get("observedGeneration") == 1
    )
    # A metadata-only change wakes the operator up but changes nothing it computes.
    k8s.apply(
        {
            "apiVersion": "torchyard.dev/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": "quiet", "namespace": namespace, "labels": {"team": "vision"}},
        },
        field_manager="test-user",
    )
    # The operator reconciled the labelled run (the version after the label), and that
    # version is still the run's: it wrote nothing, and nothing is due.
    labelled = operator.caught_up("TrainingRun", namespace, "quiet")
    after = k8s.get(k8s.TRAININGRUNS, namespace, "quiet")
    assert after["metadata"]["resourceVersion"] == labelled
    assert after["metadata"]["labels"] == {"team": "vision"}
    assert after["status"] == first["status"]
    managers = [m for m in after["metadata"]["managedFields"] if m["manager"] == "torchyard"]
    assert [m["subresource"] for m in managers] == ["status"], "the operator writes only status"


def test_curated_environment_is_ready_at_once(operator: object, namespace: str) -> None:
    k8s.create(environment("pytorch-cpu", namespace, image="python:3.11-slim"))
    obj = wait_status(
        k8s.ENVIRONMENTS, namespace, "pytorch-cpu", lambda s: s.get("phase") == "Ready"
    )
    assert obj["status"]["image"] == "python:3.11-slim"
    assert conditions(obj)["Ready"]["reason"] == "Curated"


# Node Pods per run: created 16 at a time, the fan-out lasts long enough for a kill to
# land inside it most of the time (the Pod count is read by LIST, which lags a little).
KILL_NODES = 96
MID_FANOUT_KILLS = 10


def run_pod_names(namespace: str, run: str) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in k8s.list_(k8s.PODS, namespace, label_selector=f"{names.LABEL_RUN}={run}")
    ]


@pytest.fixture
def namespaced_operator(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[Path]:
    """The kubeconfig of the chart's operator ServiceAccount of a release that watches
    ``namespace`` (``tests/cluster/chart.py``)."""
    with chart.namespaced_operator(cluster, namespace, tmp_path / "rbac") as kubeconfig:
        yield kubeconfig


def test_operator_sigkilled_mid_fanout_ends_with_exactly_n_pods_and_no_early_service(
    cluster: Cluster,
    namespace: str,
    stopped_operator: None,
    namespaced_operator: Path,
    tmp_path: Path,
) -> None:
    """SIGKILL (no graceful Kopf stop) at a random Pod count between the first and the
    last, at least 10 times; each restart must finish the gang: N Pods, N distinct node
    ranks, nothing twice, and no Service for the waiting gang (it comes with admission).
    The process is the chart's ServiceAccount, with the chart's RBAC and no more."""
    ns = namespace
    seed = int(os.environ.get("TORCHYARD_KILL_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    k8s.create(environment("pytorch", ns, image="ghcr.io/acme/pytorch:2.15-cuda12"))
    args = ["--namespace", ns]
    starts: list[float] = []

    def start(round_: int) -> OperatorProcess:
        began = time.monotonic()
        proc = OperatorProcess(namespaced_operator, tmp_path / f"operator-{round_}.log", *args)
        starts.append(began)
        return proc

    proc = start(0)
    wait_status(k8s.ENVIRONMENTS, ns, "pytorch", lambda s: s.get("phase") == "Ready", 60)
    first_action = time.monotonic() - starts[0]
    mid, rounds, report, finish = 0, 0, [], []
    try:
        while mid < MID_FANOUT_KILLS:
            rounds += 1
            assert rounds <= 3 * MID_FANOUT_KILLS, (
                f"only {mid} of {rounds - 1} kills came mid-fan-out (seed {seed}): {report}"
            )
            run = f"wide-{rounds}"
            # No pool of that name: the Pods are created (gated) and never scheduled, so
            # only the fan-out itself is measured.
            k8s.create(
                TrainingRunBuilder(run, ns)
                .environment("pytorch")
                .nodes(KILL_NODES)
                .pool("kill-test-nowhere")
                .with_("spec.resources.cpu", "100m")
                .obj()
            )
            target = rng.randint(1, KILL_NODES - 1)
            deadline = time.monotonic() + 60
            # As fast as the apiserver answers (no sleep): the fan-out takes a fraction of
            # a second, and the kill must land inside it.
            while len(run_pod_names(ns, run)) < target:
                assert time.monotonic() < deadline, f"{run} never reached {target} Pods"
                assert proc.process.poll() is None, "the operator exited by itself"
            proc.process.kill()  # SIGKILL: no handler runs, no request is finished
            proc.process.wait(10)
            proc.stop()
            at_kill = len(run_pod_names(ns, run))
            report.append((target, at_kill))
            assert at_kill >= 1
            if at_kill < KILL_NODES:
                mid += 1
            proc = start(rounds)
            restarted = time.monotonic()
            # The gang waits (no such pool): its headless Service comes with its
            # admission, so there is none.
            wait_for(
                f"exactly {KILL_NODES} Pods of {run} after the restart",
                lambda: len(run_pod_names(ns, run)) == KILL_NODES,  # noqa: B023
                timeout=60,
            )
            pods = k8s.list_(k8s.PODS, ns, label_selector=f"{names.LABEL_RUN}={run}")
            ranks = sorted(int(p["metadata"]["labels"][names.LABEL_NODE_RANK]) for p in pods)
            assert ranks == list(range(KILL_NODES)), f"{run}: node ranks {ranks}"
            assert sorted(p["metadata"]["name"] for p in pods) == sorted(
                names.pod(run, i) for i in range(KILL_NODES)
            )
            uid = k8s.get(k8s.TRAININGRUNS, ns, run)["metadata"]["uid"]
            assert all(o["uid"] == uid for p in pods for o in p["metadata"]["ownerReferences"])
            services = [
                s
                for s in k8s.list_(k8s.SERVICES, ns)
                if s["metadata"]["name"] == names.service(run)
                or s["metadata"].get("labels", {}).get(names.LABEL_RUN) == run
            ]
            assert services == []
            finish.append(time.monotonic() - restarted)
            k8s.delete(k8s.TRAININGRUNS, ns, run)
        assert proc.process.poll() is None, proc.text()[-3000:]
    except AssertionError as err:
        raise AssertionError(f"{err}\n--- operator log:\n{proc.text()[-3000:]}") from None
    finally:
        proc.stop()
    logs = "\n".join(p.read_text(errors="replace") for p in tmp_path.glob("operator-*.log"))
    assert chart.forbidden_lines(logs) == [], "\n".join(chart.forbidden_lines(logs))
    print(
        f"\n[kill test] seed {seed}: {mid} of {rounds} SIGKILLs mid-fan-out "
        f"(target, Pods at kill): {report}; operator process to first status "
        f"{first_action:.1f}s; restart to all Pods: median "
        f"{sorted(finish)[len(finish) // 2]:.1f}s, max {max(finish):.1f}s"
    )
