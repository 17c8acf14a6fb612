"""Kubeflow's operators, built from their Go modules, run beside the control plane.

Marked ``peers``: deselected unless pytest runs with ``--peers`` (the first run builds
JobSet, Kubeflow Trainer and Training Operator: minutes on 2 cores; cached after).

    .venv/bin/python -m pytest --peers -m peers tests/integration/test_peers.py

What ``benchmarks/peers.py`` compares torchyard with must really work here: a TrainJob of
the ``torch-distributed`` runtime goes through Trainer's webhook and controller, JobSet's
webhooks and controller and the Job controller to Running Pods on KWOK nodes; a PyTorchJob
through Training Operator's webhook and controller; and the webhooks, served to the
apiserver with our certificate, refuse what their code refuses.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.harness import KWOK_NODE_ANNOTATION, Cluster
from tests.cluster.peers import Peers

pytestmark = pytest.mark.peers


@pytest.fixture(scope="module")
def peers(cluster: Cluster) -> Iterator[Peers]:
    p = Peers(cluster).start()
    print(f"\n[peers] timings: {', '.join(f'{k} {v:.1f}s' for k, v in p.timings.items())}")
    yield p
    p.stop()


def pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    code, body = cluster.request(
        "GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}"
    )
    assert code == 200, body
    items: list[dict[str, Any]] = body["items"]
    return items


def running_on_kwok(cluster: Cluster, namespace: str, selector: str, n: int) -> list[str]:
    """Waits until ``n`` Pods of ``selector`` are Running; returns their nodes."""

    def check() -> list[dict[str, Any]] | None:
        items = pods(cluster, namespace, selector)
        if len(items) == n and all(p["status"].get("phase") == "Running" for p in items):
            return items
        return None

    items = cluster.wait_for(f"{n} Pods of {selector} Running", check, timeout=180, interval=0.5)
    nodes = [p["spec"]["nodeName"] for p in items]
    for node in set(nodes):
        code, body = cluster.request("GET", f"/api/v1/nodes/{node}")
        assert code == 200
        assert body["metadata"]["annotations"].get(KWOK_NODE_ANNOTATION) == "fake", node
    return nodes


def create(cluster: Cluster, path: str, body: dict[str, Any]) -> dict[str, Any]:
    code, answer = cluster.request("POST", path, body)
    assert code == 201, answer
    result: dict[str, Any] = answer
    return result


def test_a_trainjob_reaches_running_pods_on_kwok_nodes(
    cluster: Cluster, peers: Peers, namespace: str
) -> None:
    create(
        cluster,
        f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs",
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "peer-trainjob"},
            "spec": {
                "runtimeRef": {"name": "torch-distributed"},
                "trainer": {"numNodes": 2, "image": "img", "command": ["python", "train.py"]},
            },
        },
    )
    # Trainer made a JobSet of that name; JobSet made the Job; the Job controller the Pods.
    running_on_kwok(cluster, namespace, "jobset.sigs.k8s.io/jobset-name=peer-trainjob", 2)
    code, jobset = cluster.request(
        "GET", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets/peer-trainjob"
    )
    assert code == 200, jobset
    assert jobset["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
    # the torch plugin's rendezvous environment reached the Pods (Trainer's own work)
    (pod, *_) = pods(cluster, namespace, "jobset.sigs.k8s.io/jobset-name=peer-trainjob")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
    assert env.get("PET_NNODES") == "2", env


def test_a_pytorchjob_reaches_running_pods_on_kwok_nodes(
    cluster: Cluster, peers: Peers, namespace: str
) -> None:
    def replica(replicas: int) -> dict[str, Any]:
        return {
            "replicas": replicas,
            "restartPolicy": "Never",
            "template": {
                "spec": {"containers": [{"name": "pytorch", "image": "img", "command": ["x"]}]}
            },
        }

    create(
        cluster,
        f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs",
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "peer-pytorchjob"},
            "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(2)}},
        },
    )
    running_on_kwok(cluster, namespace, "training.kubeflow.org/job-name=peer-pytorchjob", 3)


def test_the_peers_webhooks_refuse_what_their_code_refuses(
    cluster: Cluster, peers: Peers, namespace: str
) -> None:
    # A PyTorchJob with two Masters passes the CRD's schema; only the webhook says no.
    master = {
        "replicas": 2,
        "template": {"spec": {"containers": [{"name": "pytorch", "image": "img"}]}},
    }
    code, answer = cluster.request(
        "POST",
        f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs",
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "two-masters"},
            "spec": {"pytorchReplicaSpecs": {"Master": master}},
        },
    )
    assert code in (400, 403, 422), answer
    assert "validator.pytorchjob.training-operator.kubeflow.org" in json.dumps(answer)
    assert "must be 1" in answer["message"]
