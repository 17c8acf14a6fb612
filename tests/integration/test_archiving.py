"""Archiving and registration on the real control plane: the launcher (run here as the
node Pods' process, with the Pods' own variables) uploads to the registry service with a
ServiceAccount token, KWOK ends the Pods, and the operator promotes the outputs to a
ModelVersion; a failed run still has its logs archived."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder, environment, role_binding
from tests.cluster.harness import Cluster, free_port
from tests.conftest import InProcessOperator
from tests.integration.conftest import operator_archiving_to
from tests.integration.helpers import (
    conditions,
    finish_pod,
    local_node_env,
    run_pods,
    wait_for,
    wait_status,
)
from tests.integration.test_registry_service import Service, trainer_token
from torchyard import k8s
from torchyard.launch import main, node_files
from torchyard.planning import names


@pytest.fixture
def archiving_operator(
    operator: InProcessOperator, tmp_path: Path, namespace: str, cluster: Cluster
) -> Iterator[Service]:
    """The registry service, and the operator restarted to archive to it."""
    svc = Service(tmp_path / "registry")
    try:
        with operator_archiving_to(operator, svc.url, trainer_token(namespace), tmp_path):
            yield svc
    finally:
        svc.stop()


def run_node(
    pod: dict[str, Any], tmp: Path, script: str, service_account: str = "default"
) -> subprocess.CompletedProcess[str]:
    """The node Pod's launcher as a local process, with the Pod's own environment and a
    registry token of ``service_account`` (the Pods' own: spec.serviceAccountName)."""
    work = tmp / f"node-{pod['metadata']['labels'][names.LABEL_NODE_RANK]}"
    work.mkdir()
    env = local_node_env(pod, work, service_account)
    return subprocess.run(
        [sys.executable, main.__file__, "--", sys.executable, "-c", script],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


TRAIN = (
    "import os, pathlib\n"
    "print('training rank', os.environ['RANK'])\n"
    "if os.environ['RANK'] == '0':\n"
    "    out = pathlib.Path(os.environ['TORCHYARD_OUTPUTS'])\n"
    "    (out / 'model.pt').write_bytes(b'weights' * 1000)\n"
    "    (out / 'metrics.json').write_text('{\"accuracy\": 0.9}')\n"
)


def allow_default_service_account(namespace: str) -> None:
    k8s.create(role_binding(namespace, "default-models", "models", "default"))


def test_a_run_ends_with_a_model_version_and_a_failed_run_keeps_its_logs(
    cluster: Cluster, namespace: str, archiving_operator: Service, tmp_path: Path
) -> None:
    ns = namespace
    allow_default_service_account(ns)
    k8s.create(environment("pytorch", ns, image="ghcr.io/acme/pytorch@sha256:" + "a" * 64))
    k8s.create(
        TrainingRunBuilder("birds", ns)
        .environment("pytorch")
        .nodes(2)
        .procs(2)
        .pool("cpu")
        .register("birds", path="outputs")
        .obj()
    )
    wait_status(k8s.TRAININGRUNS, ns, "birds", lambda s: s.get("nodes", {}).get("running") == 2)
    pods = run_pods(ns, "birds")
    assert all(
        e["name"] != "TORCHYARD_REGISTRY_URL" or e["value"] == archiving_operator.url
        for p in pods
        for e in p["spec"]["containers"][0]["env"]
    )
    for pod in pods:
        done = run_node(pod, tmp_path, TRAIN)
        assert done.returncode == 0, done.stderr
        assert "archived" in done.stderr
    for pod in pods:
        finish_pod(cluster, ns, pod["metadata"]["name"], 0)
    run = wait_status(k8s.TRAININGRUNS, ns, "birds", lambda s: s.get("phase") == "Succeeded")
    assert run["status"]["model"] == {"name": "birds", "version": 1}
    mv = k8s.get(k8s.MODELVERSIONS, ns, "birds-v1")
    files = {f["path"]: f for f in mv["spec"]["files"]}
    assert files["model.pt"]["sha256"] == hashlib.sha256(b"weights" * 1000).hexdigest()
    assert mv["spec"]["run"]["name"] == "birds"
    assert mv["spec"]["run"]["uid"] == run["metadata"]["uid"]
    assert mv["spec"]["environmentImage"] == "ghcr.io/acme/pytorch@sha256:" + "a" * 64
    assert mv["spec"]["metrics"] == {"accuracy": 0.9}
    assert "ownerReferences" not in mv["metadata"], "a model outlives its run"
    [available] = [c for c in mv["status"]["conditions"] if c["type"] == "Available"]
    assert (available["status"], available["reason"]) == ("True", "Published")
    assert available["message"].startswith("2 file(s), ")
    assert mv["status"]["createdTime"]
    cluster.kubectl("wait", "--for=condition=Available", "mv/birds-v1", "-n", ns, "--timeout=5s")
    logs = archiving_operator.root / ns / "runs" / "birds" / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["node-0", "node-1"]

    # A failing run: its logs are archived all the same.
    k8s.create(TrainingRunBuilder("broken", ns).environment("pytorch").pool("cpu").obj())
    wait_status(k8s.TRAININGRUNS, ns, "broken", lambda s: s.get("phase") == "Running")
    pod = run_pods(ns, "broken")[0]
    (tmp_path / "node-0").rename(tmp_path / "birds-node-0")
    done = run_node(pod, tmp_path, "raise SystemExit('out of memory, sort of')")
    assert done.returncode == 1
    finish_pod(cluster, ns, pod["metadata"]["name"], 1)
    wait_status(k8s.TRAININGRUNS, ns, "broken", lambda s: s.get("phase") == "Failed")
    log = archiving_operator.root / ns / "runs" / "broken" / "logs" / "node-0" / "rank-0.txt"
    wait_for("the failed run's log", log.exists)
    assert "out of memory, sort of" in log.read_text()


def termination(tmp: Path, node: int = 0) -> dict[str, Any]:
    """The launcher's termination message (what the kubelet would put in the Pod status)."""
    message: dict[str, Any] = json.loads((tmp / f"node-{node}" / "termination.json").read_text())
    return message


def create_service_account(namespace: str, name: str) -> None:
    k8s.create(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace},
        }
    )


def test_an_archive_the_registry_refuses_fails_the_run_saying_why_and_what_to_fix(
    cluster: Cluster, namespace: str, archiving_operator: Service, tmp_path: Path
) -> None:
    ns = namespace
    allow_default_service_account(ns)
    create_service_account(ns, "intruder")  # not the run's, and allowed nothing
    k8s.create(environment("pytorch", ns, image="ghcr.io/acme/pytorch@sha256:" + "a" * 64))
    k8s.create(
        TrainingRunBuilder("refused", ns)
        .environment("pytorch")
        .pool("cpu")
        .register("birds")
        .with_("spec.policy.backoffLimit", 2)
        .obj()
    )
    wait_status(k8s.TRAININGRUNS, ns, "refused", lambda s: s.get("nodes", {}).get("running") == 1)
    [pod] = run_pods(ns, "refused")
    # The ranks succeed, the upload is refused (403): never a silent success.
    done = run_node(pod, tmp_path, TRAIN, service_account="intruder")
    assert done.returncode == node_files.ARCHIVE_FAILED_EXIT, done.stderr
    message = termination(tmp_path)
    assert (message["reason"], message["exitCode"]) == ("ArchiveFailed", 3)
    assert "HTTP 403" in message["message"]
    assert "set spec.serviceAccountName" in message["message"]
    assert not (archiving_operator.root / ns / "runs" / "refused" / "outputs").exists()
    finish_pod(cluster, ns, "refused-0", done.returncode, json.dumps(message))
    failed = wait_status(k8s.TRAININGRUNS, ns, "refused", lambda s: s.get("phase") == "Failed")
    failure = failed["status"]["failure"]
    assert (failure["reason"], failure["exitCode"], failure["pod"]) == (
        "ArchiveFailed",
        3,
        "refused-0",
    )
    assert "HTTP 403" in failure["message"]
    # Training again would not help: backoffLimit is not used, no model is registered.
    assert failed["status"]["restarts"] == 0
    assert "model" not in failed["status"]
    assert k8s.get_or_none(k8s.MODELVERSIONS, ns, "birds-v1") is None


def test_optional_outputs_let_the_run_succeed_with_a_warning_instead(
    cluster: Cluster, namespace: str, archiving_operator: Service, tmp_path: Path
) -> None:
    ns = namespace
    create_service_account(ns, "intruder")
    k8s.create(environment("pytorch", ns, image="ghcr.io/acme/pytorch@sha256:" + "a" * 64))
    k8s.create(
        TrainingRunBuilder("lenient", ns)
        .environment("pytorch")
        .pool("cpu")
        .register("birds")
        .with_("spec.outputs.optional", True)
        .obj()
    )
    wait_status(k8s.TRAININGRUNS, ns, "lenient", lambda s: s.get("nodes", {}).get("running") == 1)
    [pod] = run_pods(ns, "lenient")
    done = run_node(pod, tmp_path, TRAIN, service_account="intruder")
    assert done.returncode == 0, done.stderr
    message = termination(tmp_path)
    assert (message["reason"], message["exitCode"]) == ("ArchiveFailed", 0)
    finish_pod(cluster, ns, "lenient-0", 0, json.dumps(message))
    run = wait_status(k8s.TRAININGRUNS, ns, "lenient", lambda s: s.get("phase") == "Succeeded")
    archived = conditions(run)["OutputsArchived"]
    assert (archived["status"], archived["reason"]) == ("False", "ArchiveFailed")
    assert archived["message"].startswith("the model was not registered")
    assert "HTTP 403" in archived["message"]
    assert "model" not in run["status"]
    # The Events of a reconcile are recorded right after its status write: wait for them.
    wait_for(
        "the ArchiveFailed Warning",
        lambda: any(
            e["type"] == "Warning" and e["reason"] == "ArchiveFailed"
            for e in k8s.list_(k8s.EVENTS, ns, field_selector="involvedObject.name=lenient")
        ),
        timeout=120,
    )


def launcher_alone(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The launcher with a successful command and the given archive settings."""
    return subprocess.run(
        [sys.executable, main.__file__, "--", sys.executable, "-c", TRAIN],
        cwd=tmp_path,
        env={
            "PATH": os.environ["PATH"],
            "RANK": "0",
            "TORCHYARD_TERMINATION_LOG": str(tmp_path / "termination.json"),
            "TORCHYARD_RUN": "r",
            "TORCHYARD_NAMESPACE": "ns",
            # two attempts, not a minute of them, against a registry that is never there
            "TORCHYARD_ARCHIVE_ATTEMPTS": "2",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_unreachable_registry_or_a_missing_token_fails_the_node_too(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    closed = f"http://127.0.0.1:{free_port()}"
    done = launcher_alone(
        tmp_path, TORCHYARD_REGISTRY_URL=closed, TORCHYARD_REGISTRY_TOKEN_FILE=str(token)
    )
    assert done.returncode == node_files.ARCHIVE_FAILED_EXIT, done.stderr
    message = json.loads((tmp_path / "termination.json").read_text())
    assert message["reason"] == "ArchiveFailed"
    assert f"the registry service at {closed} is not reachable" in message["message"]

    done = launcher_alone(
        tmp_path,
        TORCHYARD_REGISTRY_URL=closed,
        TORCHYARD_REGISTRY_TOKEN_FILE=str(tmp_path / "missing"),
        TORCHYARD_OUTPUTS_OPTIONAL="1",
    )
    assert done.returncode == 0, done.stderr
    message = json.loads((tmp_path / "termination.json").read_text())
    assert (message["reason"], message["exitCode"]) == ("ArchiveFailed", 0)
    assert "no registry token at" in message["message"]


def test_a_failed_command_keeps_its_own_failure_when_the_archive_fails_too(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, main.__file__, "--", sys.executable, "-c", "raise SystemExit(7)"],
        cwd=tmp_path,
        env={
            "PATH": os.environ["PATH"],
            "TORCHYARD_TERMINATION_LOG": str(tmp_path / "termination.json"),
            "TORCHYARD_REGISTRY_URL": f"http://127.0.0.1:{free_port()}",
            "TORCHYARD_REGISTRY_TOKEN_FILE": str(tmp_path / "missing"),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 7
    message = json.loads((tmp_path / "termination.json").read_text())
    assert (message["reason"], message["exitCode"]) == ("Error", 7)
    assert "no registry token" in done.stderr
