"""torchyard's own TrainingRuns on the REAL node: the operator (in-process) plans the node
Pods, the kubelet runs them in the locally made images, and nothing is finished by hand.

The node Pods have no init container: the launcher reaches them in the operator's
``torchyard-launcher-<hash>`` ConfigMap, and in the trainer container unpacks the source
snapshot ``torchyard submit --source`` put in a ConfigMap, then starts the ranks in the
PyTorch image (a curated Environment); they rendezvous with gloo through
``MASTER_ADDR``, node 0's headless-Service DNS name. The sleeping runs of the deadline and
deleted-Pod tests carry their code in the command (``source: {image: true}``), as a
non-root user in the image's own working directory. Every test checks that the Pods ran
on the real node (``spec.nodeName``) and reads what happened from the kubelet (container
states, ``pods/log``), so none passes on KWOK or with faked work.

Fixtures: ``real_node``, ``real_operator``, ``env`` and ``registry`` (tests/node/conftest.py),
``namespace`` and ``operator`` (tests/conftest.py); the helpers are tests/node/runs.py's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.builders import TrainingRunBuilder
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.conftest import InProcessOperator
from tests.integration.helpers import run_pods
from tests.integration.test_registry_service import Service
from tests.node.runs import (
    BIRDS,
    RESOURCES,
    archived_run,
    container,
    ddp_run,
    explain,
    finished,
    logs,
    on_real_node,
    submit,
    torchyard,
)
from torchyard import k8s

pytestmark = pytest.mark.node


RANK_LINE = re.compile(
    r"^\[rank (\d)\] rank (\d)/(\d): loss \S+ weight (\S+) bias (\S+)$", re.MULTILINE
)
CONTRACT_LINE = re.compile(r"^\[rank (\d)\] rank-contract (\{.*\})$", re.MULTILINE)


def rank_results(text: str) -> dict[int, tuple[int, str, str]]:
    """rank -> (world size, weight, bias) from the ddp example's last line per rank."""
    found = {}
    for label, rank, world, weight, bias in RANK_LINE.findall(text):
        assert label == rank
        found[int(rank)] = (int(world), weight, bias)
    return found


def test_ddp_two_nodes_by_two_processes_rendezvous_through_the_headless_service(
    cluster: Cluster, env: str, real_node: RealNode, tmp_path: Path
) -> None:
    ns, name = env, "ddp"
    started = time.monotonic()
    submit(cluster, tmp_path, ddp_run(name, ns, real_node).obj())
    run = finished(ns, name)
    elapsed = time.monotonic() - started
    print(f"\n[node] ddp 2x2 on real Pods: {run['status'].get('phase')} in {elapsed:.1f}s")
    assert run["status"]["phase"] == "Succeeded", explain(cluster, ns, name)
    pods = run_pods(ns, name)
    on_real_node(pods, real_node, 2)
    master = f"{name}-0.{name}.{ns}.svc"
    results: dict[int, tuple[int, str, str]] = {}
    for node, pod in enumerate(pods):
        pod_name = pod["metadata"]["name"]
        assert pod["status"]["phase"] == "Succeeded"
        assert container(pod, "trainer")["state"]["terminated"]["exitCode"] == 0
        # no init container: the launcher came from the operator's ConfigMap and, in the
        # trainer container itself, unpacked the snapshot's ConfigMap before the ranks
        assert "initContainers" not in pod["spec"]
        assert "initContainerStatuses" not in pod["status"]
        text = logs(cluster, ns, pod_name)
        assert re.search(r"unpacked the source snapshot: [1-9]\d* files", text), text[:3000]
        contracts = {int(r): json.loads(c) for r, c in CONTRACT_LINE.findall(text)}
        assert sorted(contracts) == [2 * node, 2 * node + 1], text[-3000:]
        for rank, contract in contracts.items():
            assert contract["MASTER_ADDR"] == master
            assert (contract["WORLD_SIZE"], contract["RANK"]) == ("4", str(rank))
            assert contract["NODE_RANK"] == str(node)
        mine = rank_results(text)
        assert sorted(mine) == sorted(contracts), text[-3000:]
        results.update(mine)
        assert f"all 2 ranks of node {node} succeeded" in text
    # all four ranks, two per Pod, saw a world of 4 and ended with the same parameters:
    # each rank drew its own data, so only gloo's all-reduce across both Pods (rendezvous
    # at MASTER_ADDR) makes them agree
    assert sorted(results) == [0, 1, 2, 3]
    assert {world for world, _, _ in results.values()} == {4}
    assert len({(weight, bias) for _, weight, bias in results.values()}) == 1, results
    assert pods[0]["status"]["podIP"] != pods[1]["status"]["podIP"]


def test_a_rank_that_raises_is_named_with_its_traceback_and_its_siblings_stop(
    cluster: Cluster, env: str, real_node: RealNode, tmp_path: Path
) -> None:
    ns, name = env, "fails"
    started = time.monotonic()
    submit(cluster, tmp_path, ddp_run(name, ns, real_node, "--fail_rank", "3").obj())
    run = finished(ns, name)
    print(f"\n[node] failing rank on real Pods: Failed in {time.monotonic() - started:.1f}s")
    assert run["status"]["phase"] == "Failed", explain(cluster, ns, name)
    failure = run["status"]["failure"]
    assert (failure["rank"], failure["node"], failure["pod"], failure["exitCode"]) == (
        3,
        1,
        f"{name}-1",
        1,
    ), failure
    assert failure["message"].startswith("Traceback (most recent call last)"), failure
    assert failure["message"].endswith(
        "RuntimeError: rank 3 failed on purpose: loss became NaN at step 10"
    ), failure
    # the kubelet wrote the launcher's termination message into the container status
    pod = k8s.get(k8s.PODS, ns, f"{name}-1")
    on_real_node([pod], real_node, 1)
    term = container(pod, "trainer")["state"]["terminated"]
    written = json.loads(term["message"])
    assert (written["rank"], written["nodeRank"], written["exitCode"]) == (3, 1, 1)
    assert term["exitCode"] == 1
    # its sibling on the same node was stopped by the launcher, the other node's Pod too
    text = logs(cluster, ns, f"{name}-1")
    assert "[torchyard] rank 3 exited with exit code 1: stopping the other ranks" in text

    def all_stopped() -> bool:
        live = [p for p in run_pods(ns, name) if p["status"].get("phase") in ("Pending", "Running")]
        return not live

    cluster.wait_for("every node Pod of the failed run to stop", all_stopped, timeout=60)
    assert "restarts" not in run["status"] or run["status"]["restarts"] == 0


# The guide's script, small: one pre-training and two fine-tuning epochs on 80 images.
BIRDS_COMMAND = (
    "python", "pytorch_train.py", "--num_epochs", "2", "--pretrain_epochs", "1",
    "--images", "80", "--output_dir", "./outputs",
)  # fmt: skip
CHECKSUM = re.compile(r"^\[rank (\d)\] param-checksum rank (\d) ([0-9a-f]{64})$", re.MULTILINE)


def checksum(state_dict: dict[str, Any]) -> str:
    """examples/birds' ``checksum``: sha256 over the sorted parameters' names and bytes."""
    digest = hashlib.sha256()
    for key, tensor in sorted(state_dict.items()):
        digest.update(key.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def test_the_birds_run_archives_and_registers_a_model_the_cli_downloads(
    cluster: Cluster,
    env: str,
    real_node: RealNode,
    operator: InProcessOperator,
    registry: tuple[Service, str, str],
    tmp_path: Path,
) -> None:
    ns, name = env, "birds"
    svc, url, ref = registry
    body = (
        ddp_run(name, ns, real_node)
        .command(*BIRDS_COMMAND)
        .register("pytorch-birds", path="outputs", exportOnnx=True)
        .with_("spec.serviceAccountName", "trainer")  # the archive's only writer
        .obj()
    )
    run, elapsed = archived_run(cluster, operator, url, body, BIRDS, tmp_path, 240)
    print(f"\n[node] birds 2x2 archived and registered: {run['status']['phase']} in {elapsed:.1f}s")
    assert run["status"]["phase"] == "Succeeded", explain(cluster, ns, name)
    assert run["status"]["model"] == {"name": "pytorch-birds", "version": 1}
    pods = run_pods(ns, name)
    on_real_node(pods, real_node, 2)
    checksums: dict[int, str] = {}
    for pod in pods:
        text = logs(cluster, ns, pod["metadata"]["name"])
        # the projected token (audience torchyard-registry) reached the registry through
        # the Service: the launcher says so, the kubelet kept it
        assert re.search(r"^\[torchyard\] archived [1-9]\d* file\(s\)", text, re.MULTILINE), text
        for label, rank, digest in CHECKSUM.findall(text):
            assert label == rank
            checksums[int(rank)] = digest
    # every rank, on both Pods, ended with the same parameters (DDP over gloo)
    assert sorted(checksums) == [0, 1, 2, 3] and len(set(checksums.values())) == 1, checksums
    archived = svc.root / ns / "runs" / name / "logs"
    assert sorted(p.name for p in archived.iterdir()) == ["node-0", "node-1"]
    for node in (0, 1):
        kept = sorted(p.name for p in (archived / f"node-{node}").iterdir())
        ranks = [k for k in kept if k.startswith("rank-")]
        assert ranks == [f"rank-{2 * node}.txt", f"rank-{2 * node + 1}.txt"]
        # beside them only the metrics the ranks reported (torchyard.progress): the
        # example's rank 0 reports loss and accuracy each epoch, so node 0 has them
        assert set(kept) - set(ranks) <= {"metrics.jsonl"}, kept
        assert node != 0 or "metrics.jsonl" in kept, kept
        for rank in (2 * node, 2 * node + 1):
            rank_log = (archived / f"node-{node}" / f"rank-{rank}.txt").read_text()
            assert f"param-checksum rank {rank} {checksums[rank]}" in rank_log
    mv = k8s.get(k8s.MODELVERSIONS, ns, "pytorch-birds-v1")
    files = {f["path"]: f for f in mv["spec"]["files"]}
    assert sorted(files) == ["history.json", "metrics.json", "model.onnx", "model.pt"], files
    assert mv["spec"]["run"]["uid"] == run["metadata"]["uid"]
    assert mv["spec"]["environmentImage"] == real_node.images["pytorch"].ref
    assert mv["spec"]["metrics"]["world_size"] == 4  # written by rank 0 of the 4

    # the user's way back: the CLI through the apiserver's service proxy, as trainer
    out = tmp_path / "downloaded"
    done = torchyard(
        cluster, "models", "download", "pytorch-birds:1", "-o", str(out), "-n", ns,
        "--registry-service", ref, "--service-account", "trainer",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "sha256 verified" in done.stdout
    data = (out / "model.pt").read_bytes()
    assert hashlib.sha256(data).hexdigest() == files["model.pt"]["sha256"]
    # and it is the model the ranks trained: its parameters have the checksum they printed
    import torch

    saved = torch.load(out / "model.pt", map_location="cpu")
    assert saved["classes"] == ["chicken", "turkey"]
    assert checksum(saved["state_dict"]) == checksums[0]
    # exportOnnx: rank 0 exported it with the image's torch 1.13, and it RUNS here
    # (onnxruntime) on fresh birds images, agreeing with the PyTorch model it came from
    assert "[rank 0] exported outputs/model.onnx" in logs(cluster, ns, f"{name}-0")
    onnx = (out / "model.onnx").read_bytes()
    assert hashlib.sha256(onnx).hexdigest() == files["model.onnx"]["sha256"]
    logits, expected = onnx_and_torch_logits(out, saved)
    assert logits.shape == expected.shape == (24, 2)
    assert np.allclose(logits, expected, atol=1e-4), abs(logits - expected).max()
    assert (logits.argmax(1) == expected.argmax(1)).all()


def onnx_and_torch_logits(folder: Path, saved: dict[str, Any]) -> tuple[Any, Any]:
    """The logits of ``folder/model.onnx`` (onnxruntime) and of the example's Classifier
    with ``saved``'s weights (torch) on 24 birds images the run never saw."""
    import importlib

    import onnxruntime
    import torch

    sys.path.insert(0, str(BIRDS))
    try:
        birds_data = importlib.import_module("birds_data")
        train = importlib.import_module("pytorch_train")
    finally:
        sys.path.remove(str(BIRDS))
    images, _labels = birds_data.birds(24, seed=7)
    session = onnxruntime.InferenceSession(
        str(folder / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    assert [i.name for i in session.get_inputs()] == ["image"]
    (logits,) = session.run(["logits"], {"image": images})
    model = train.Classifier(train.Backbone(), len(saved["classes"]))
    model.load_state_dict(saved["state_dict"])
    model.eval()
    with torch.no_grad():
        expected = model(torch.from_numpy(images)).numpy()
    return logits, expected


SLEEPER = (
    "import os, signal, sys, time\n"
    "def stop(signum, frame):\n"
    "    print('rank', os.environ['RANK'], 'got signal', signum, flush=True)\n"
    "    sys.exit(143)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('rank', os.environ['RANK'], 'sleeping', flush=True)\n"
    "time.sleep(600)\n"
)


def sleeper(name: str, namespace: str, node: RealNode) -> TrainingRunBuilder:
    """Two node Pods of one rank each that sleep until a signal ends them."""
    return (
        TrainingRunBuilder(name, namespace)
        .environment("pytorch")
        .command("python", "-c", SLEEPER)
        .nodes(2)
        .procs(1)
        .pool(node.pool)
        .with_("spec.resources", dict(RESOURCES))
        .with_("spec.runAsUser", 1000)
    )


def sleeping(cluster: Cluster, namespace: str, pod: str) -> bool:
    return "sleeping" in cluster.kubectl("logs", "-n", namespace, pod, "-c", "trainer", check=False)


def test_active_deadline_seconds_ends_a_sleeping_run(
    cluster: Cluster, env: str, real_node: RealNode
) -> None:
    ns, name = env, "deadline"
    deadline = 20
    k8s.create(
        sleeper(name, ns, real_node).with_("spec.policy.activeDeadlineSeconds", deadline).obj()
    )
    started = time.monotonic()
    for node in (0, 1):
        cluster.wait_for(
            f"rank {node} sleeping", lambda node=node: sleeping(cluster, ns, f"{name}-{node}"), 90
        )
    run = finished(ns, name, timeout=deadline + 60)
    elapsed = time.monotonic() - started
    print(f"\n[node] activeDeadlineSeconds {deadline}: Failed after {elapsed:.1f}s")
    assert run["status"]["phase"] == "Failed", explain(cluster, ns, name)
    assert run["status"]["failure"]["reason"] == "DeadlineExceeded", run["status"]
    assert elapsed < deadline + 30

    def ended() -> list[dict[str, Any]] | None:
        pods = run_pods(ns, name)
        return pods if all(p["status"].get("phase") == "Failed" for p in pods) else None

    pods = cluster.wait_for("the sleeping Pods to be ended", ended, timeout=60)
    on_real_node(pods, real_node, 2)
    for pod in pods:
        assert pod["status"].get("reason") == "DeadlineExceeded", pod["status"]


def test_a_node_pod_deleted_mid_run_signals_its_ranks_and_the_gang_restarts(
    cluster: Cluster, env: str, real_node: RealNode
) -> None:
    ns, name = env, "lost"
    k8s.create(sleeper(name, ns, real_node).obj())
    for node in (0, 1):
        cluster.wait_for(
            f"rank {node} sleeping", lambda node=node: sleeping(cluster, ns, f"{name}-{node}"), 90
        )
    first = {p["metadata"]["name"]: p["metadata"]["uid"] for p in run_pods(ns, name)}
    # `torchyard logs -f` follows node 1's live log from the kubelet until its container ends
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_REGISTRY")}
    follow = subprocess.Popen(
        [sys.executable, "-m", "torchyard", "logs", name, "-f", "--node", "1", "-n", ns],
        env={**env, "KUBECONFIG": str(cluster.kubeconfig)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(follow.stdout or []), daemon=True)
    reader.start()
    cluster.wait_for("the live log to arrive", lambda: any("sleeping" in s for s in seen), 30)
    deleted = time.monotonic()
    cluster.kubectl("delete", "pod", f"{name}-1", "-n", ns, "--wait=false")
    try:
        follow.wait(timeout=60)
    finally:
        if follow.poll() is None:
            follow.kill()
    reader.join(10)
    stopped = time.monotonic() - deleted
    text = "".join(seen)
    print(f"\n[node] node Pod deleted: its ranks stopped within {stopped:.1f}s")
    assert "[node 1] [rank 1] rank 1 got signal 15" in text, text
    assert "[node 1] [torchyard] received signal 15: stopping the ranks" in text, text
    assert stopped < 30  # the Pod's grace period

    def restarted() -> list[dict[str, Any]] | None:
        run = k8s.get(k8s.TRAININGRUNS, ns, name)
        pods = run_pods(ns, name)
        fresh = [p for p in pods if p["metadata"]["uid"] not in first.values()]
        if (run.get("status") or {}).get("restarts") != 1 or len(fresh) != 2:
            return None
        if not all(sleeping(cluster, ns, p["metadata"]["name"]) for p in fresh):
            return None
        return fresh

    fresh = cluster.wait_for("the gang restarted and sleeping", restarted, timeout=120)
    on_real_node(fresh, real_node, 2)
    assert {p["metadata"]["labels"]["torchyard.dev/attempt"] for p in fresh} == {"1"}
    run = k8s.get(k8s.TRAININGRUNS, ns, name)
    assert run["status"].get("failedAttempts", 0) == 0  # a platform failure, not the code's
    events = k8s.events_of(ns, name)
    assert any(e["reason"] == "Restarting" and "NodeLost" in e["message"] for e in events), events
    k8s.delete(k8s.TRAININGRUNS, ns, name)
