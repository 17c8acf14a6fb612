"""Training in a namespace that enforces Pod Security "restricted": with spec.runAsUser the
node Pods are admitted and run; without it the apiserver refuses them, and the run fails
once with advice instead of retrying forever."""

from __future__ import annotations

from tests.builders import TrainingRunBuilder, environment
from tests.cluster.harness import Cluster
from tests.conftest import InProcessOperator
from tests.integration.helpers import conditions, run_pods, wait_status
from torchyard import k8s


def test_node_pods_in_a_restricted_namespace(
    cluster: Cluster, operator: InProcessOperator, namespace: str
) -> None:
    cluster.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    k8s.create(environment("pytorch", namespace, image="ghcr.io/acme/pytorch:2.15-cpu"))
    wait_status(k8s.ENVIRONMENTS, namespace, "pytorch", lambda s: s.get("phase") == "Ready")

    good = TrainingRunBuilder("non-root", namespace).environment("pytorch").nodes(2).obj()
    good["spec"]["runAsUser"] = 1000
    k8s.create(good)
    wait_status(
        k8s.TRAININGRUNS,
        namespace,
        "non-root",
        lambda s: s.get("phase") == "Running" and s.get("nodes", {}).get("running") == 2,
    )
    for pod in run_pods(namespace, "non-root"):
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True

    k8s.create(TrainingRunBuilder("as-root", namespace).environment("pytorch").obj())
    failed = wait_status(
        k8s.TRAININGRUNS, namespace, "as-root", lambda s: s.get("phase") == "Failed"
    )
    message = conditions(failed)["Failed"]["message"]
    assert "Pod Security" in message and "runAsNonRoot" in message
    assert "set spec.runAsUser" in message
    assert run_pods(namespace, "as-root") == []
