"""``endpoints.reconcile`` against the in-memory fake of ``torchyard.k8s``: what an
endpoint waits for, the model fetched into the inputs cache before any Pod, the children
applied then, a canary's Deployment dropped when the split ends, the other backend's
children deleted, the status written once. The same story runs against a real control
plane in tests/integration/test_endpoints.py and on the real node."""

from __future__ import annotations

import logging
from typing import Any

from tests.builders import EndpointBuilder
from tests.unit.controller.fake_k8s import FakeK8s
from tests.unit.controller.world import NS, T0, env
from torchyard import api, k8s
from torchyard.controller import context, endpoints
from torchyard.planning import endpoints as plans
from torchyard.planning import inputs, names, pods

SETTINGS = pods.Settings(registry_url="https://registry:8443", init_image="torchyard:1")


def body(builder: EndpointBuilder | None = None) -> dict[str, Any]:
    obj = (builder or EndpointBuilder("birds", NS).model("pytorch-birds", 2)).obj()
    obj["metadata"].update(uid="uid-e", generation=1)
    return obj


def reconcile(fake: FakeK8s, settings: pods.Settings = SETTINGS) -> context.Result:
    obj = fake.get(k8s.ONLINEENDPOINTS, NS, "birds")
    ctx = context.Context(settings=settings, clock=lambda: T0, k8s=fake)
    return endpoints.reconcile(obj, logging.getLogger("test"), ctx)


def status(fake: FakeK8s) -> dict[str, Any]:
    found: dict[str, Any] = fake.get(k8s.ONLINEENDPOINTS, NS, "birds").get("status") or {}
    return found


def source_configmap() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "birds-score", "namespace": NS},
        "data": {"pytorch_score.py": "def init(): pass\ndef run(raw_data): return {}\n"},
    }


def cached(version: int, sa: str = "default") -> dict[str, Any]:
    ep = api.parse_endpoint(body())
    key = plans.model_source(ep, "pytorch-birds", version).key
    record = {
        "key": key,
        "uri": f"model://pytorch-birds/{version}",
        "revision": str(version),
        "digest": "sha256:d",
        "bytes": 100,
    }
    return inputs.entry_config_map(NS, record, 100, "2026-01-01T10:00:00Z")


def test_it_waits_for_its_environment_and_makes_nothing() -> None:
    fake = FakeK8s(body(), source_configmap())
    result = reconcile(fake)
    assert status(fake)["phase"] == "Pending" and "does not exist" in status(fake)["message"]
    assert fake.applied == [] and result.requeue_after == endpoints.WAIT_SECONDS


def test_a_private_endpoint_without_a_registry_fails_saying_how_to_serve() -> None:
    fake = FakeK8s(body(), env(), source_configmap())
    reconcile(fake, pods.Settings())
    assert status(fake)["phase"] == "Failed"
    assert "spec.public: true" in status(fake)["message"]
    assert fake.applied == []


def test_the_model_is_fetched_before_any_pod_then_served() -> None:
    fake = FakeK8s(body(), env(), source_configmap())
    reconcile(fake)
    assert status(fake)["phase"] == "Preparing"
    [job] = fake.list_(k8s.JOBS, NS)
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--uri") + 1] == "model://pytorch-birds/2"
    assert args[args.index("--reader") + 1] == "default"
    assert not fake.list_(k8s.DEPLOYMENTS, NS)

    fake.put(cached(2))
    fake.reset_writes()
    reconcile(fake)
    deployment = fake.get(k8s.DEPLOYMENTS, NS, "birds")
    template = deployment["spec"]["template"]
    assert template["metadata"]["annotations"]["torchyard.dev/source-sha256"]
    assert template["spec"]["containers"][0]["image"] == "img@sha256:" + "0" * 64
    assert fake.get(k8s.SERVICES, NS, "birds")["spec"]["selector"] == {
        names.LABEL_ENDPOINT: "birds"
    }
    assert status(fake)["phase"] == "Deploying"
    assert status(fake)["scoringUri"] == f"http://birds.{NS}.svc/score"

    deployment["status"] = {
        "observedGeneration": 1,
        "replicas": 1,
        "updatedReplicas": 1,
        "readyReplicas": 1,
    }
    fake.put(deployment)
    fake.reset_writes()
    reconcile(fake)
    assert status(fake)["phase"] == "Ready" and len(fake.statuses) == 1
    assert [(t, r) for t, r, _ in fake.events] == [("Normal", "Ready")]
    fake.reset_writes()
    reconcile(fake)
    assert fake.statuses == []  # nothing changed: no write


def test_a_sweeps_model_is_served_once_registered() -> None:
    sweep = {
        "apiVersion": api.API_VERSION,
        "kind": "Sweep",
        "metadata": {"name": "tune", "namespace": NS},
        "spec": {},
        "status": {"phase": "Running"},
    }
    fake = FakeK8s(
        body(EndpointBuilder("birds", NS).sweep("tune")), env(), source_configmap(), sweep
    )
    reconcile(fake)
    assert status(fake)["phase"] == "Pending" and "has not registered" in status(fake)["message"]
    sweep["status"] = {
        "phase": "Succeeded",
        "model": {"name": "pytorch-birds", "version": 3, "trial": "t1"},
    }
    fake.put(sweep)
    reconcile(fake)
    assert status(fake)["model"] == {"name": "pytorch-birds", "version": 3}
    assert status(fake)["phase"] == "Preparing"


def test_the_canary_deployment_goes_when_the_split_ends() -> None:
    canary = (
        EndpointBuilder("birds", NS).model("pytorch-birds", 2).replicas(2).traffic(v1=50, v2=50)
    )
    fake = FakeK8s(body(canary), env(), source_configmap(), cached(1), cached(2))
    reconcile(fake)
    assert sorted(d["metadata"]["name"] for d in fake.list_(k8s.DEPLOYMENTS, NS)) == [
        "birds",
        "birds-canary",
    ]
    assert [v["version"] for v in status(fake)["versions"]] == [2, 1]
    fake.put(body())  # promoted: version 2 alone
    fake.reset_writes()
    reconcile(fake)
    assert [d["metadata"]["name"] for d in fake.list_(k8s.DEPLOYMENTS, NS)] == ["birds"]
    assert ("deployments", "birds-canary") in fake.deleted


def test_kserve_replaces_the_deployments_where_its_crd_is_installed() -> None:
    kserve = EndpointBuilder("birds", NS).model("pytorch-birds", 2).set("spec.backend", "KServe")
    fake = FakeK8s(body(kserve), env(), source_configmap(), cached(2))
    reconcile(fake)
    assert status(fake)["phase"] == "Pending" and "install KServe" in status(fake)["message"]
    fake.put(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": k8s.INFERENCESERVICES_CRD},
        }
    )
    fake.put(body())  # first as Deployments
    reconcile(fake)
    assert fake.get_or_none(k8s.DEPLOYMENTS, NS, "birds") is not None
    fake.put(body(kserve))
    reconcile(fake)
    isvc = fake.get(k8s.INFERENCESERVICES, NS, "birds")
    assert isvc["spec"]["predictor"]["containers"][0]["name"] == "kserve-container"
    assert fake.get_or_none(k8s.DEPLOYMENTS, NS, "birds") is None
    assert fake.get_or_none(k8s.SERVICES, NS, "birds") is None
    assert status(fake)["scoringUri"] == f"http://birds-predictor.{NS}.svc/score"


def test_an_invalid_endpoint_is_failed_without_children() -> None:
    bad = body()
    bad["spec"]["model"] = {"uri": "model://../x/1"}
    fake = FakeK8s(bad)
    reconcile(fake)
    assert (
        status(fake)["phase"] == "Failed" and "model://<model>/<version>" in status(fake)["message"]
    )
    assert fake.applied == []


def test_a_service_of_its_name_that_is_not_its_own_keeps_it_waiting_saying_whose() -> None:
    # a TrainingRun of the same name made its headless Service first
    theirs = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "birds",
            "namespace": NS,
            "ownerReferences": [{"kind": "TrainingRun", "name": "birds", "uid": "uid-t"}],
        },
        "spec": {"clusterIP": "None", "selector": {"torchyard.dev/run": "birds"}},
    }
    fake = FakeK8s(body(), env(), source_configmap(), cached(2), theirs)
    result = reconcile(fake)
    st = status(fake)
    assert st["phase"] == "Pending" and result.requeue_after == endpoints.WAIT_SECONDS
    assert (
        "Service birds (the scoring URI's host) already exists and belongs to " in (st["message"])
    )
    assert "TrainingRun birds" in st["message"] and "rename the endpoint" in st["message"]
    assert fake.get(k8s.SERVICES, NS, "birds") == theirs  # not taken over
    assert not fake.list_(k8s.DEPLOYMENTS, NS)

    fake.delete(k8s.SERVICES, NS, "birds")  # the run is gone: the name is free again
    fake.reset_writes()
    reconcile(fake)
    assert fake.get(k8s.SERVICES, NS, "birds")["spec"]["selector"] == {
        names.LABEL_ENDPOINT: "birds"
    }
    assert status(fake)["phase"] == "Deploying"
