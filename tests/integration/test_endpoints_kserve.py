"""The KServe hand-off on the real control plane: with KServe's InferenceService CRD
installed (from KServe's Go module: tests/cluster/kserve.py), the InferenceService that
``planning.endpoints`` generates for ``backend: KServe`` passes ``kubectl apply
--dry-run=server`` against that CRD's schema, and the operator applies it for an
OnlineEndpoint (and takes torchyard's own Deployment and Service away); without the CRD
the endpoint waits saying so. No KServe controller runs here, so nothing serves: the
serving Pod itself is the one tested on the real node."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.builders import EndpointBuilder
from tests.cluster import kserve
from tests.cluster.harness import Cluster
from tests.integration import test_endpoints as endpoints
from tests.integration.helpers import wait_for, wait_status
from torchyard import api, k8s
from torchyard.planning import endpoints as plans
from torchyard.planning.pods import Settings

prepared = endpoints.prepared


@pytest.fixture
def with_kserve(cluster: Cluster) -> Iterator[None]:
    kserve.install(cluster)
    yield
    kserve.uninstall(cluster)


def generated(namespace: str, **settings: str) -> dict[str, object]:
    body = EndpointBuilder("birds", namespace).model("pytorch-birds", 2).replicas(2)
    body.set("spec.backend", "KServe").set("spec.resources", {"cpu": "500m", "memory": "1Gi"})
    # the uid the apiserver gave the endpoint (the InferenceService's owner reference needs one)
    body.set("metadata.uid", "0c5f3bd4-6a3e-4c3b-9d3e-6b1f2a9e7c10")
    ep = api.parse_endpoint(body.obj())
    parts = plans.PodInputs(
        "pytorch-birds",
        "ghcr.io/acme/pytorch@sha256:" + "1" * 64,
        plans.model_source(ep, "pytorch-birds", 2).key,
        Settings(registry_url="https://registry.torchyard-system.svc:8443", **settings),
        source_sha256="ab" * 16,
    )
    return plans.inference_service(ep, plans.tracks(ep, 2)[0], parts)


def test_the_generated_inference_service_passes_a_server_side_dry_run(
    cluster: Cluster, namespace: str, with_kserve: None
) -> None:
    isvc = generated(namespace)
    out = cluster.kubectl(
        "apply", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(isvc)
    )
    accepted = json.loads(out)
    predictor = accepted["spec"]["predictor"]
    assert predictor["containers"][0]["name"] == "kserve-container"
    assert predictor["initContainers"][-1]["name"] == "prepare"
    assert predictor["automountServiceAccountToken"] is False
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (2, 2)
    # the schema is enforced: a field KServe does not know is refused
    broken = json.loads(json.dumps(isvc))
    broken["spec"]["predictor"]["notAField"] = True
    refused = cluster.kubectl(
        "apply",
        "--dry-run=server",
        "--validate=strict",
        "-f",
        "-",
        input=json.dumps(broken),
        check=False,
    )
    assert "notAField" in refused or "unknown field" in refused


def test_the_operator_hands_the_endpoint_to_kserve(
    cluster: Cluster,
    prepared: str,
    with_kserve: None,
) -> None:
    ns = prepared
    body = EndpointBuilder("birds", ns).model("pytorch-birds", 1).public()
    k8s.apply(body.obj(), field_manager="test")
    endpoints.fetched(cluster, ns, endpoints.fetch_job(ns, "model://pytorch-birds/1"), 1)
    wait_for(
        "torchyard's own Deployment",
        lambda: k8s.get_or_none(k8s.DEPLOYMENTS, ns, "birds"),
        timeout=60,
    )
    k8s.apply(body.set("spec.backend", "KServe").obj(), field_manager="test")
    isvc = wait_for(
        "the InferenceService",
        lambda: k8s.get_or_none(k8s.INFERENCESERVICES, ns, "birds"),
        timeout=60,
    )
    assert isvc["spec"]["predictor"]["containers"][0]["command"][-2:] == ["-m", "torchyard.serving"]
    assert isvc["metadata"]["ownerReferences"][0]["kind"] == "OnlineEndpoint"
    wait_for(
        "the Deployment gone",
        lambda: k8s.get_or_none(k8s.DEPLOYMENTS, ns, "birds") is None,
        timeout=60,
    )
    assert k8s.get_or_none(k8s.SERVICES, ns, "birds") is None
    status = wait_status(
        k8s.ONLINEENDPOINTS,
        ns,
        "birds",
        lambda s: "predictor" in str(s.get("scoringUri")),
        timeout=60,
    )
    assert status["status"]["scoringUri"] == f"http://birds-predictor.{ns}.svc/score"


def test_without_kserve_the_endpoint_waits_saying_so(prepared: str) -> None:
    ns = prepared
    body = (
        EndpointBuilder("birds", ns)
        .model("pytorch-birds", 1)
        .public()
        .set("spec.backend", "KServe")
    )
    k8s.apply(body.obj(), field_manager="test")
    waiting = wait_status(
        k8s.ONLINEENDPOINTS, ns, "birds", lambda s: s.get("phase") == "Pending", timeout=60
    )
    assert "install KServe" in waiting["status"]["message"]
