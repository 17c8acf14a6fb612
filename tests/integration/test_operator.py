"""The operator, in-process, against the real apiserver: observedGeneration, the
Accepted condition, status patched only when something changed, curated Environments."""

from __future__ import annotations

import time

from tests.builders import TrainingRunBuilder, environment
from tests.cluster.harness import Cluster
from tests.integration.helpers import conditions, wait_status
from torchyard import k8s


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


def test_status_is_not_rewritten_when_nothing_changed(operator: object, namespace: str) -> None:
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
    time.sleep(2)
    after = k8s.get(k8s.TRAININGRUNS, namespace, "quiet")
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
