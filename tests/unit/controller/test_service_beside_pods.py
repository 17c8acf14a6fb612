"""A gang's headless Service is applied beside its Pods, not before them: the first Pod
does not wait for the Service's round trip, and a Service that failed is applied by the
run's next reconcile even though every Pod exists by then."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from tests.unit.controller.fake_k8s import FakeK8s
from tests.unit.controller.world import NS, env, gpu_node, run, status
from torchyard import k8s
from torchyard.controller import admission, context, trainingruns


class ServiceAfterAPod(FakeK8s):
    """The apiserver answers the Service's apply only once a Pod of the gang was applied
    (it gives up after 5 s): a reconcile that waits for the Service before its first Pod
    fails here."""

    def __init__(self, *objects: dict[str, Any]) -> None:
        super().__init__(*objects)
        self.a_pod = threading.Event()

    def apply(self, manifest: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if manifest["kind"] == "Service" and not self.a_pod.wait(5):
            raise k8s.ApiError(504, "Timeout", "the Service waited for a Pod that never came")
        answer = super().apply(manifest, **kw)
        if manifest["kind"] == "Pod":
            self.a_pod.set()
        return answer


class ServiceFailsOnce(FakeK8s):
    def __init__(self, *objects: dict[str, Any]) -> None:
        super().__init__(*objects)
        self.failures = 1

    def apply(self, manifest: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if manifest["kind"] == "Service" and self.failures:
            self.failures -= 1
            raise k8s.ApiError(500, "InternalError", "etcd hiccup")
        return super().apply(manifest, **kw)


def two_nodes() -> list[dict[str, Any]]:
    return [gpu_node("gpu-0"), gpu_node("gpu-1")]


def reconcile(ctx: context.Context) -> context.Result:
    admission.run_pass(ctx)
    body = ctx.k8s.get(k8s.TRAININGRUNS, NS, "r")
    return trainingruns.reconcile(body, logging.getLogger("test"), ctx)


def test_the_first_pod_does_not_wait_for_the_service() -> None:
    fake = ServiceAfterAPod(run(), env(), *two_nodes())
    ctx = context.Context(k8s=fake)
    admission.prime(ctx)
    reconcile(ctx)
    kinds = [o["kind"] for o in fake.applied]
    assert kinds.count("Service") == 1 and kinds.count("Pod") == 2
    assert kinds.index("Pod") < kinds.index("Service")
    assert fake.get(k8s.SERVICES, NS, "r")["spec"]["clusterIP"] == "None"
    assert status(fake)["phase"] != "Failed"
    assert not ctx.services_owed


def test_a_service_that_failed_beside_the_pods_is_applied_by_the_next_reconcile() -> None:
    fake = ServiceFailsOnce(run(), env(), *two_nodes())
    ctx = context.Context(k8s=fake)
    admission.prime(ctx)
    with pytest.raises(k8s.ApiError, match="etcd hiccup"):  # the work queue retries it
        reconcile(ctx)
    assert fake.pod_names() == ["r-0", "r-1"]  # the Pods were made meanwhile
    assert fake.get_or_none(k8s.SERVICES, NS, "r") is None
    assert ctx.services_owed == {(NS, "r")}
    for pod in fake.pods():  # the watch brings the created Pods into the cache
        ctx.cache.feed("Pod", "ADDED", pod)
    fake.reset_writes()
    reconcile(ctx)  # every Pod exists: only the owed Service is applied
    assert [o["kind"] for o in fake.applied] == ["Service"]
    assert fake.get(k8s.SERVICES, NS, "r")["spec"]["clusterIP"] == "None"
    assert not ctx.services_owed
    fake.reset_writes()
    reconcile(ctx)  # nothing owed any more: no write at all
    assert fake.applied == []
