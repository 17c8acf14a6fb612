"""GitOps on the real control plane: the examples, server-side applied by a GitOps field
manager, reconciled by the operator, then applied again, change nothing; the operator's
field manager owns status fields only; and the status carries the conditions kstatus
(Flux) reads: observedGeneration, Ready, Reconciling, Stalled."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.harness import Cluster
from tests.conftest import InProcessOperator
from tests.integration.helpers import conditions, wait_status
from torchyard import k8s

REPO = Path(__file__).resolve().parents[2]
MANAGER = "gitops"


@pytest.fixture
def team(cluster: Cluster, namespace: str) -> Iterator[tuple[str, str]]:
    """Two namespaces: the examples use the same names (pytorch-cpu, ddp) twice."""
    other = cluster.create_namespace(f"{namespace[:56]}-b")
    yield namespace, other
    cluster.delete_namespace(other)


def apply(cluster: Cluster, namespace: str, *files: Path) -> str:
    args = [a for f in files for a in ("-f", str(f))]
    return cluster.kubectl(
        "apply", "--server-side", f"--field-manager={MANAGER}", "-n", namespace, *args
    )


def diff(cluster: Cluster, namespace: str, *files: Path) -> str:
    """``kubectl diff --server-side``: exit code 0 means no change; its output else."""
    args = [a for f in files for a in ("-f", str(f))]
    return cluster.kubectl(
        "diff",
        "--server-side",
        f"--field-manager={MANAGER}",
        "-n",
        namespace,
        *args,
        check=False,
    )


def owned_by(obj: dict[str, Any], manager: str) -> list[dict[str, Any]]:
    return [m for m in obj["metadata"].get("managedFields", []) if m["manager"] == manager]


EXAMPLES: dict[str, list[Path]] = {
    "ddp and birds": [
        REPO / "examples" / "birds" / "trainingrun.yaml",  # an Environment built from pip
        REPO / "examples" / "ddp" / "trainingrun.yaml",  # waits on the build above
    ],
    "gitops": [
        REPO / "examples" / "gitops" / "environment.yaml",  # curated: Ready at once
        REPO / "examples" / "gitops" / "trainingrun.yaml",  # gets its Pods, Running
    ],
}
OBJECTS: dict[str, list[tuple[k8s.Resource, str, str]]] = {
    # (resource, name, the phase the operator brings it to and keeps it in)
    "ddp and birds": [
        (k8s.ENVIRONMENTS, "pytorch-cpu", "Building"),
        (k8s.TRAININGRUNS, "pytorch-birds", "Preparing"),
        (k8s.TRAININGRUNS, "ddp", "Preparing"),
    ],
    "gitops": [(k8s.ENVIRONMENTS, "pytorch-cpu", "Ready"), (k8s.TRAININGRUNS, "ddp", "Running")],
}


def test_applying_the_examples_again_changes_nothing_and_the_operator_owns_only_status(
    cluster: Cluster, operator: InProcessOperator, team: tuple[str, str]
) -> None:
    for ns, example in zip(team, EXAMPLES, strict=True):
        files = EXAMPLES[example]
        if example == "gitops":  # the code, as kustomization.yaml's configMapGenerator makes it
            code = REPO / "examples" / "gitops" / "ddp" / "train.py"
            cluster.kubectl("create", "configmap", "ddp-src", f"--from-file={code}", "-n", ns)
        apply(cluster, ns, *files)
        reconciled = {}
        for res, name, phase in OBJECTS[example]:
            obj = wait_status(
                res,
                ns,
                name,
                lambda s, p=phase: (
                    s.get("phase") == p
                    # Running: every node Pod runs (the status settles).
                    and (p != "Running" or s["nodes"]["running"] == s["nodes"]["total"])
                ),
                timeout=60,
            )
            reconciled[name, res.plural] = obj
            assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"] == 1

        # The second apply: nothing to change, whatever the operator wrote meanwhile.
        assert diff(cluster, ns, *files) == ""
        out = apply(cluster, ns, *files)
        assert "serverside-applied" in out
        for res, name, _ in OBJECTS[example]:
            obj = k8s.get(res, ns, name)
            before = reconciled[name, res.plural]
            assert obj["metadata"]["generation"] == 1, f"{name}: the spec changed"
            assert obj["metadata"].get("labels") == before["metadata"].get("labels")
            assert obj["metadata"].get("annotations") == before["metadata"].get("annotations")
            assert obj["spec"] == before["spec"]
            assert "finalizers" not in obj["metadata"], "the operator adds no finalizer"

            # The operator's field manager owns status, through the status subresource.
            [torchyard] = owned_by(obj, k8s.FIELD_MANAGER)
            assert torchyard["subresource"] == "status"
            assert torchyard["operation"] == "Apply"
            assert set(torchyard["fieldsV1"]) == {"f:status"}, torchyard["fieldsV1"]
            # Only the GitOps manager owns spec and metadata (no one else wrote them).
            for entry in obj["metadata"]["managedFields"]:
                if entry["manager"] != MANAGER:
                    assert set(entry["fieldsV1"]) <= {"f:status"}, entry
            [gitops] = owned_by(obj, MANAGER)
            assert "f:spec" in gitops["fieldsV1"] and "f:status" not in gitops["fieldsV1"]
        assert diff(cluster, ns, *files) == ""


def test_kstatus_conditions_say_reconciling_stalled_or_ready(
    cluster: Cluster, operator: InProcessOperator, namespace: str
) -> None:
    """What Flux's kstatus (and `kubectl wait`) reads off the objects the operator wrote."""
    ns = namespace
    apply(cluster, ns, REPO / "examples" / "gitops" / "environment.yaml")
    env = wait_status(k8s.ENVIRONMENTS, ns, "pytorch-cpu", lambda s: s.get("phase") == "Ready")
    found = conditions(env)
    assert (found["Ready"]["status"], found["Reconciling"]["status"]) == ("True", "False")
    assert found["Stalled"]["status"] == "False"

    # A run whose Environment is missing: progressing (kstatus InProgress), not stalled.
    run = {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "waiting", "namespace": ns},
        "spec": {"environment": "missing", "source": {"image": True}, "command": ["python"]},
    }
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(run))
    obj = wait_status(k8s.TRAININGRUNS, ns, "waiting", lambda s: s.get("phase") == "Preparing")
    found = conditions(obj)
    assert [found[t]["status"] for t in ("Ready", "Reconciling", "Stalled")] == [
        "False",
        "True",
        "False",
    ]
    assert found["Reconciling"]["reason"] == "EnvironmentNotFound"
    assert all(c["observedGeneration"] == 1 for c in found.values())
    cluster.kubectl("wait", "--for=condition=Reconciling", "tr/waiting", "-n", ns, "--timeout=10s")
    cluster.kubectl(
        "wait", "--for=condition=Ready", "environment/pytorch-cpu", "-n", ns, "--timeout=10s"
    )
