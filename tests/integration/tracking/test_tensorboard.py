"""``torchyard tensorboard`` against the real control plane and the registry service: a
finished run's event files (written to ``$TORCHYARD_TENSORBOARD_DIR`` by its rank 0,
archived by the launcher run here as the node Pod's process) are served by a real
TensorBoard, its scalars read over TensorBoard's HTTP API; a Sweep's trials side by side,
each a TensorBoard run of its own, those deleted by their TTL found in the registry's run
records; a run that is nowhere is an error that says so.

(The live path copies out of node 0's Pod through the exec API, which a KWOK Pod does not
serve: the live scalars are shown in local mode, tests/e2e/test_local_tensorboard.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.builders import SweepBuilder, TrainingRunBuilder, environment
from tests.cluster.harness import Cluster
from tests.integration.helpers import finish_pod, run_pods, wait_for, wait_status
from tests.integration.test_archiving import allow_default_service_account, run_node
from tests.integration.test_archiving import archiving_operator as archiving_operator
from tests.integration.test_registry_service import Service
from tests.integration.test_run_records import allow_records
from tests.tensorboards import SCALARS, tensorboard
from tests.tensorboards import tensorboard_venv as tensorboard_venv
from torchyard import k8s


def node_writes_scalars(cluster: Cluster, ns: str, name: str, tmp: Path, python: Path) -> None:
    """The run's node runs SCALARS here (all six steps, on the TensorBoard venv's Python)
    and archives, then its Pod ends."""
    tmp = tmp / name
    ctl = tmp / "ctl"
    ctl.mkdir(parents=True)
    (ctl / "more").touch()
    (ctl / "end").touch()
    (tmp / "scalars.py").write_text(SCALARS)
    wait_status(k8s.TRAININGRUNS, ns, name, lambda s: s.get("nodes", {}).get("running") == 1)
    [pod] = run_pods(ns, name)
    argv = [str(python), str(tmp / "scalars.py"), str(ctl)]
    rank = f"import subprocess; subprocess.run({argv!r}, check=True)"
    done = run_node(pod, tmp, rank)
    assert done.returncode == 0, done.stderr
    finish_pod(cluster, ns, pod["metadata"]["name"], 0)


def finished_run(cluster: Cluster, ns: str, name: str, tmp: Path, python: Path) -> None:
    """A TrainingRun whose node wrote SCALARS and archived, then ended."""
    k8s.create(TrainingRunBuilder(name, ns).environment("pytorch").pool("cpu").obj())
    node_writes_scalars(cluster, ns, name, tmp, python)
    wait_status(k8s.TRAININGRUNS, ns, name, lambda s: s.get("phase") == "Succeeded")


@pytest.fixture
def archiving(namespace: str, archiving_operator: Service) -> Service:
    """The operator archiving to the registry service, the node Pods' uploads allowed,
    and the Environment ``pytorch``."""
    allow_default_service_account(namespace)
    k8s.create(environment("pytorch", namespace))
    return archiving_operator


def test_a_finished_runs_scalars_come_from_its_archive(
    cluster: Cluster, namespace: str, archiving: Service, tmp_path: Path, tensorboard_venv: Path
) -> None:
    ns, archiving_operator = namespace, archiving
    python = tensorboard_venv / "bin" / "python"
    finished_run(cluster, ns, "birds", tmp_path, python)
    archived = archiving_operator.root / ns / "runs" / "birds" / "outputs" / "tensorboard"
    assert list(archived.glob("events.out.tfevents.*"))
    options = [
        "-n",
        ns,
        "--registry-url",
        archiving_operator.url,
        "--service-account",
        "default",
    ]
    env = {"KUBECONFIG": str(cluster.kubeconfig)}
    with tensorboard(tensorboard_venv, tmp_path / "kept", "birds", *options, env=env) as served:
        wait_for("the archived scalars", lambda: served.steps("birds") == list(range(6)), 60)
        assert "birds: event files from the run's archive in the registry" in served.output()

    binary = str(tensorboard_venv / "bin" / "tensorboard")
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchyard",
            "tensorboard",
            "ghost",
            *options,
            "--tensorboard",
            binary,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )
    assert missing.returncode == 1
    assert f"TrainingRun {ns}/ghost not found, nor an archive of it" in missing.stderr


def test_a_sweeps_deleted_trial_comes_from_its_record_and_archive_beside_a_live_one(
    cluster: Cluster, namespace: str, archiving: Service, tmp_path: Path, tensorboard_venv: Path
) -> None:
    ns = namespace
    allow_records(ns, "trainer")  # (the operator's identity here)
    trial = TrainingRunBuilder("trial").environment("pytorch").pool("cpu")
    k8s.create(SweepBuilder("tune", ns).trial(trial).trials(2, 2).seed(7).obj())
    python = tensorboard_venv / "bin" / "python"
    for name in ("tune-t0", "tune-t1"):
        wait_for(f"trial {name}", lambda n=name: k8s.get_or_none(k8s.TRAININGRUNS, ns, n), 60)
        node_writes_scalars(cluster, ns, name, tmp_path, python)
        wait_status(k8s.TRAININGRUNS, ns, name, recorded, timeout=60)
    # trial 0's TrainingRun deleted: only its record and archive are left
    cluster.kubectl("delete", "trainingrun", "tune-t0", "-n", ns, "--wait=true")
    wait_for("tune-t0 gone", lambda: k8s.get_or_none(k8s.TRAININGRUNS, ns, "tune-t0") is None)
    options = ["-n", ns, "--registry-url", archiving.url, "--service-account", "default"]
    env = {"KUBECONFIG": str(cluster.kubeconfig)}
    kept = tmp_path / "kept"
    with tensorboard(tensorboard_venv, kept, "--sweep", "tune", *options, env=env) as served:
        for name in ("tune-t0", "tune-t1"):
            wait_for(f"{name}'s scalars", lambda n=name: served.steps(n) == list(range(6)), 60)
        said = served.output()
    assert "tune-t0: event files from the run's archive in the registry" in said, said
    assert "tune-t1: event files from the run's archive in the registry" in said, said
    assert "left out" not in said, said


def recorded(status: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Recorded" and c["status"] == "True" for c in status.get("conditions", [])
    )
