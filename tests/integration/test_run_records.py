"""Run records on the real control plane: the operator writes a run's record into the
registry service when the run ends, and the record outlives the TrainingRun (deleted as
``kubectl delete`` does) and its Pods (collected by the TTL). ``torchyard runs list --all``
and ``torchyard describe`` still show its spec, failure, log tails and metrics; records are
read under the archive's authorization (TokenReview + SubjectAccessReview), so a token of
another namespace reads nothing, and only the operator's identity writes them.

The node Pod's launcher runs here as a process with the Pod's own variables (KWOK runs no
container and serves no Pod log): it uploads the logs and metric reports as in a cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder, environment, role_binding
from tests.cluster.harness import Cluster
from tests.conftest import InProcessOperator
from tests.integration.conftest import operator_archiving_to
from tests.integration.helpers import finish_pod, run_pods, wait_for, wait_status
from tests.integration.test_archiving import allow_default_service_account, run_node
from tests.integration.test_registry_service import Service, trainer_token
from torchyard import k8s
from torchyard.api.wire import REGISTRY_AUDIENCE
from torchyard.registry.client import RegistryClient, RegistryError

REPO = Path(__file__).resolve().parents[2]
IMAGE = "ghcr.io/acme/pytorch@sha256:" + "a" * 64
TRAIN = (
    "import os\n"
    "from torchyard import progress\n"
    "for step in range(1, 4):\n"
    "    progress.report(step, total=10, loss=1.0 / step)\n"
    "print('about to fail at step 3', flush=True)\n"
    "raise ValueError('the labels do not match the classes')\n"
)


def allow_records(namespace: str, service_account: str) -> None:
    """``create`` on runrecords for ``service_account`` (what the chart gives the operator)."""
    k8s.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "records", "namespace": namespace},
            "rules": [
                {"apiGroups": ["torchyard.dev"], "resources": ["runrecords"], "verbs": ["create"]}
            ],
        }
    )
    k8s.create(role_binding(namespace, f"{service_account}-records", "records", service_account))


@pytest.fixture
def recording(
    operator: InProcessOperator, tmp_path: Path, namespace: str, cluster: Cluster
) -> Iterator[tuple[Service, str]]:
    """The registry service, the operator restarted to write records to it as ServiceAccount
    ``trainer`` (allowed runrecords here), and that token (which reads records too)."""
    svc = Service(tmp_path / "registry")
    token = trainer_token(namespace)
    allow_records(namespace, "trainer")
    allow_default_service_account(namespace)  # the node Pods' uploads
    k8s.create(environment("pytorch", namespace, image=IMAGE))
    try:
        with operator_archiving_to(operator, svc.url, token, tmp_path):
            wait_status(k8s.ENVIRONMENTS, namespace, "pytorch", lambda s: s.get("phase") == "Ready")
            yield svc, token
    finally:
        svc.stop()


def torchyard(cluster: Cluster, svc: Service, *args: str) -> str:
    """The CLI against the registry service (``args`` name the token file)."""
    done = subprocess.run(
        [sys.executable, "-m", "torchyard", *args, "--registry-url", svc.url],
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def failed_run(cluster: Cluster, ns: str, name: str, tmp_path: Path, ttl: int | None) -> Any:
    """Run ``name`` (one node) whose script reports three steps and raises; Failed."""
    builder = TrainingRunBuilder(name, ns).environment("pytorch").pool("cpu")
    builder = builder.with_("metadata.labels", {"torchyard.dev/experiment": "birds"})
    if ttl is not None:
        builder = builder.with_("spec.policy.ttlSecondsAfterFinished", ttl)
    k8s.create(builder.obj())
    wait_status(k8s.TRAININGRUNS, ns, name, lambda s: s.get("nodes", {}).get("running") == 1)
    [pod] = run_pods(ns, name)
    work = tmp_path / name
    work.mkdir(parents=True)
    done = run_node(pod, work, TRAIN)
    assert done.returncode == 1, done.stderr
    message = (work / "node-0" / "termination.json").read_text()
    finish_pod(cluster, ns, pod["metadata"]["name"], 1, message)
    return wait_status(
        k8s.TRAININGRUNS,
        ns,
        name,
        lambda s: any(
            c["type"] == "Recorded" and c["status"] == "True" for c in s.get("conditions", [])
        ),
        timeout=60,
    )


def test_a_deleted_run_still_shows_its_spec_failure_logs_and_metrics(
    cluster: Cluster, namespace: str, recording: tuple[Service, str], tmp_path: Path
) -> None:
    svc, token = recording
    ns = namespace
    run = failed_run(cluster, ns, "broken", tmp_path, ttl=None)
    uid = run["metadata"]["uid"]
    cluster.kubectl("delete", "trainingrun", "broken", "-n", ns, "--wait=true")
    wait_for(
        "the TrainingRun gone", lambda: k8s.get_or_none(k8s.TRAININGRUNS, ns, "broken") is None
    )

    (tmp_path / "token").write_text(token)
    auth = ["--token-file", str(tmp_path / "token")]
    listed = torchyard(cluster, svc, "runs", "list", "--all", "-n", ns, *auth)
    [row] = [line for line in listed.splitlines() if line.startswith("broken ")]
    assert "Failed" in row and "deleted" in row and "PythonException" in row
    described = torchyard(cluster, svc, "describe", "broken", "-n", ns, *auth)
    assert "from its record: its TrainingRun is gone" in described
    assert f"UID:          {uid}" in described
    assert "Environment:  pytorch" in described  # the spec
    assert "ValueError: the labels do not match the classes" in described  # the failure
    assert "class: PythonException" in described and "advice:" in described
    assert "Log tail of node 0:" in described and "about to fail at step 3" in described
    assert "Metric:       loss = 0.333" in described

    record = RegistryClient(svc.url, token).get_record(ns, "broken")
    assert record is not None and record["uid"] == uid and record["experiment"] == "birds"
    lines = RegistryClient(svc.url, token).metrics_lines(ns, "broken", uid)
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3]  # the metric history

    # The name used again: a record of its own, the older one kept.
    again = failed_run(cluster, ns, "broken", tmp_path / "again", ttl=None)
    listed = torchyard(cluster, svc, "runs", "list", "--all", "-n", ns, *auth)
    rows = [line for line in listed.splitlines() if line.startswith("broken ")]
    assert len(rows) == 2 and "live, recorded" in rows[0] and "deleted" in rows[1]
    assert again["metadata"]["uid"][:8] in rows[0] and uid[:8] in rows[1]
    older = RegistryClient(svc.url, token).get_record(ns, "broken", uid)
    assert older is not None and older["uid"] == uid


def test_a_run_whose_pods_its_ttl_collected_keeps_its_record(
    cluster: Cluster, namespace: str, recording: tuple[Service, str], tmp_path: Path
) -> None:
    svc, token = recording
    ns = namespace
    run = failed_run(cluster, ns, "brief", tmp_path, ttl=0)
    wait_for("the TTL", lambda: not run_pods(ns, "brief"), timeout=60)
    (tmp_path / "token").write_text(token)
    auth = ["--token-file", str(tmp_path / "token")]
    listed = torchyard(cluster, svc, "runs", "list", "--all", "-n", ns, *auth)
    [row] = [line for line in listed.splitlines() if line.startswith("brief ")]
    assert "live, recorded" in row
    uid = run["metadata"]["uid"]
    args = ["runs", "describe", "brief", "--uid", uid, "-n", ns, *auth]
    described = torchyard(cluster, svc, *args)
    assert "node 0  brief-0" in described and "Failed" in described  # the Pod, gone now
    assert "about to fail at step 3" in described and "Metric:       loss = 0.333" in described


def test_records_are_read_in_their_namespace_only_and_written_by_the_operator_only(
    cluster: Cluster, namespace: str, recording: tuple[Service, str], tmp_path: Path
) -> None:
    svc, token = recording
    ns = namespace
    failed_run(cluster, ns, "secret", tmp_path, ttl=None)
    other = cluster.create_namespace(ns[:50] + "-b")
    try:
        outsider = trainer_token(other)  # get and create modelversions, in b only
        refused = RegistryClient(svc.url, outsider)
        for call in (
            lambda: refused.list_records(ns),
            lambda: refused.get_record(ns, "secret"),
        ):
            with pytest.raises(RegistryError) as err:
                call()
            assert err.value.status == 403
        assert refused.list_records(other).items == []
        # The node Pods' identity reads its namespace's records, and writes none.
        default = k8s.request_token(ns, "default", [REGISTRY_AUDIENCE])
        record = RegistryClient(svc.url, default).get_record(ns, "secret")
        assert record is not None
        with pytest.raises(RegistryError) as err:
            RegistryClient(svc.url, default).put_record({**record, "phase": "Succeeded"})
        assert err.value.status == 403 and "may not create runrecords" in str(err.value)
        # A token for the apiserver (not the registry's audience) is no token at all.
        for wrong in (
            k8s.request_token(ns, "trainer", []),
            k8s.request_token(ns, "trainer", ["vault"]),
        ):
            with pytest.raises(RegistryError) as err:
                RegistryClient(svc.url, wrong).list_records(ns)
            assert err.value.status == 401
        assert (RegistryClient(svc.url, token).get_record(ns, "secret") or {})["phase"] == "Failed"
    finally:
        cluster.delete_namespace(other)


def test_a_run_deleted_while_it_runs_is_recorded_as_it_was(
    cluster: Cluster, namespace: str, recording: tuple[Service, str]
) -> None:
    svc, token = recording
    ns = namespace
    k8s.create(TrainingRunBuilder("cut", ns).environment("pytorch").pool("cpu").obj())
    run = wait_status(k8s.TRAININGRUNS, ns, "cut", lambda s: s.get("phase") == "Running")
    cluster.kubectl("delete", "trainingrun", "cut", "-n", ns, "--wait=true")
    reader = RegistryClient(svc.url, token)
    record = wait_for("the deleted run's record", lambda: reader.get_record(ns, "cut"))
    assert (record["uid"], record["phase"], record["deleted"]) == (
        run["metadata"]["uid"],
        "Running",
        True,
    )
    assert record["attempts"][-1]["outcome"] == "Deleted"
    assert record["spec"]["environment"] == "pytorch"
