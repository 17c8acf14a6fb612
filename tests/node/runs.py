"""Helpers of the node tests' TrainingRuns: submitting one as a user does (``torchyard
submit --source``), waiting for it, reading its Pods' container states and logs from the
kubelet, and the operator restarted with settings for a test. Their fixtures (the operator
with the images made here, the curated Environment, the registry stand-in, the inputs
cache's volume) are in tests/node/conftest.py."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.builders import TrainingRunBuilder
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.conftest import InProcessOperator
from tests.integration.helpers import wait_status
from tests.integration.test_registry_service import trainer_token
from torchyard import k8s

REPO = Path(__file__).resolve().parents[2]


DDP = REPO / "examples" / "ddp"


# Small enough for two node Pods on the node's 2 CPUs, beside the other tests' Pods.
RESOURCES = {"cpu": "250m", "memory": "1Gi", "shmSize": "64Mi"}


@contextlib.contextmanager
def operator_with(operator: InProcessOperator, **env: str) -> Iterator[None]:
    """The in-process operator restarted with ``env`` set; restarted as before afterwards."""
    saved = {key: os.environ.get(key) for key in env}
    operator.stop()
    os.environ.update(env)
    try:
        operator.start()
        yield
    finally:
        operator.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        operator.start()


def archived_run(
    cluster: Cluster,
    operator: InProcessOperator,
    registry_url: str,
    body: dict[str, Any],
    source: Path,
    tmp_path: Path,
    timeout: float,
) -> tuple[dict[str, Any], float]:
    """``body`` submitted with ``source`` (``torchyard submit --source``) while the operator
    archives to the registry at ``registry_url``, promoting as the ``trainer``
    ServiceAccount (create modelversions); the run once finished, and the seconds it took."""
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    token_file = tmp_path / "operator-token"
    token_file.write_text(trainer_token(ns))
    with operator_with(
        operator, TORCHYARD_REGISTRY_URL=registry_url, TORCHYARD_REGISTRY_TOKEN_FILE=str(token_file)
    ):
        started = time.monotonic()
        submit(cluster, tmp_path, body, source=source)
        run = finished(ns, name, timeout=timeout)
        return run, time.monotonic() - started


def ddp_run(name: str, namespace: str, node: RealNode, *args: str) -> TrainingRunBuilder:
    """examples/ddp as a 2 nodes x 2 processes run on the real node's pool."""
    return (
        TrainingRunBuilder(name, namespace)
        .environment("pytorch")
        .command("python", "train.py", "--steps", "30", *args)
        .nodes(2)
        .procs(2)
        .pool(node.pool)
        .with_("spec.resources", dict(RESOURCES))
        .with_("spec.runAsUser", 1000)
    )


def torchyard(
    cluster: Cluster, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The ``torchyard`` CLI as a user runs it (admin kubeconfig, no registry URL)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_REGISTRY")}
    return subprocess.run(
        [sys.executable, "-m", "torchyard", *args],
        env={**env, "KUBECONFIG": str(cluster.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def submit(cluster: Cluster, tmp_path: Path, body: dict[str, Any], source: Path = DDP) -> None:
    """``torchyard submit FILE --source DIR``: the snapshot goes into a ConfigMap."""
    meta = body["metadata"]
    path = tmp_path / f"{meta['name']}.yaml"
    path.write_text(yaml.safe_dump(body))
    done = torchyard(cluster, "submit", str(path), "--source", str(source), "-n", meta["namespace"])
    assert done.returncode == 0, done.stderr
    assert f"trainingrun.torchyard.dev/{meta['name']} applied" in done.stdout
    assert "-> ConfigMap torchyard-src-" in done.stderr, done.stderr


def finished(namespace: str, name: str, timeout: float = 150) -> dict[str, Any]:
    return wait_status(
        k8s.TRAININGRUNS,
        namespace,
        name,
        lambda s: s.get("phase") in ("Succeeded", "Failed"),
        timeout,
    )


def container(pod: dict[str, Any], name: str, init: bool = False) -> dict[str, Any]:
    key = "initContainerStatuses" if init else "containerStatuses"
    for status in pod.get("status", {}).get(key) or []:
        if status["name"] == name:
            return dict(status)
    raise AssertionError(f"no status of container {name} in {pod['metadata']['name']}")


def logs(cluster: Cluster, namespace: str, pod: str, name: str = "trainer") -> str:
    """What the kubelet kept of a container's output (``pods/log``)."""
    return cluster.kubectl("logs", "-n", namespace, pod, "-c", name)


def on_real_node(pods: list[dict[str, Any]], node: RealNode, count: int) -> None:
    assert len(pods) == count, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        where = pod["spec"].get("nodeName")
        assert where == node.name, f"{pod['metadata']['name']} ran on {where!r}"


def explain(cluster: Cluster, namespace: str, run: str) -> str:
    """The run's status, Pods and Events, for a failed assertion."""
    return "\n".join(
        [
            cluster.kubectl("get", "tr", run, "-n", namespace, "-o", "yaml", check=False),
            cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False),
            cluster.kubectl("get", "events", "-n", namespace, check=False)[-4000:],
        ]
    )


BIRDS = REPO / "examples" / "birds"
