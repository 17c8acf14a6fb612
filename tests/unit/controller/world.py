"""Fixture builders for the reconcile tables: a run, its Environment, nodes of its pool
and its node Pods, stored in a :class:`FakeK8s`, and one reconcile at a given time."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Any

from tests.builders import TrainingRunBuilder, environment, pod
from tests.unit.controller.fake_k8s import FakeK8s
from torchyard import k8s
from torchyard.controller import admission, context, trainingruns
from torchyard.planning import pods

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
NS = "ns"
UID = "uid-r"
POOL = "a100"


def run(status: dict[str, Any] | None = None, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """TrainingRun ``r``: 2 node Pods of 2 processes and 4 GPUs in pool a100, with the
    ``status`` it had; ``spec`` sets more fields by dotted path (``{"policy.backoffLimit": 1}``)."""
    builder = TrainingRunBuilder("r", NS).nodes(2).procs(2).gpus(4).pool(POOL)
    for path, value in (spec or {}).items():
        builder = builder.with_(f"spec.{path}", value)
    body = builder.obj()
    body["metadata"].update(uid=UID, generation=1, creationTimestamp="2026-01-01T11:00:00Z")
    if status is not None:
        body["status"] = status
    return body


def env(phase: str | None = "Ready", message: str = "") -> dict[str, Any]:
    obj = environment("pytorch", NS, image="img@sha256:" + "0" * 64)
    if phase is not None:
        obj["status"] = {"phase": phase, "image": "img@sha256:" + "0" * 64, "message": message}
    return obj


def gpu_node(name: str, gpus: int = 8) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {pods.POOL_LABEL: POOL}},
        "spec": {},
        "status": {
            "allocatable": {
                "cpu": "64",
                "memory": "512Gi",
                "nvidia.com/gpu": str(gpus),
                "pods": "110",
            },
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def named(kind: str, name: str) -> dict[str, Any]:
    """A ConfigMap, PersistentVolumeClaim ... ``name`` in the run's namespace."""
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": NS}}


def priority_class(name: str, value: int = 1000) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }


def kueue_crd(name: str, versions: tuple[str, ...] = ("v1beta1", "v1beta2")) -> dict[str, Any]:
    """Kueue's CRD ``name`` serving ``versions``, the last one stored."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": k8s.KUEUE_GROUP,
            "versions": [
                {"name": v, "served": True, "storage": v == versions[-1]} for v in versions
            ],
        },
    }


def kueue(*queues: str, versions: tuple[str, ...] = ("v1beta1", "v1beta2")) -> list[dict[str, Any]]:
    """Kueue installed (its LocalQueue CRD serving ``versions``, the last one stored) with
    the LocalQueues ``queues`` in the run's namespace."""
    return [kueue_crd(k8s.LOCALQUEUES_CRD, versions)] + [
        {
            "apiVersion": f"{k8s.KUEUE_GROUP}/{versions[-1]}",
            "kind": "LocalQueue",
            "metadata": {"name": q, "namespace": NS},
            "spec": {"clusterQueue": "cq"},
        }
        for q in queues
    ]


def node_pod(node: int, *, attempt: int = 0, **state: Any) -> dict[str, Any]:
    """Node ``node``'s Pod of run ``r`` in the given state (``tests.builders.pod``)."""
    obj = pod("r", node, attempt=attempt, **state)
    obj["metadata"].update(namespace=NS, ownerReferences=[{"uid": UID, "controller": True}])
    return obj


def running(nodes: int = 2) -> list[dict[str, Any]]:
    return [node_pod(i, phase="Running", node_name=f"gpu-{i}") for i in range(nodes)]


def succeeded(nodes: int = 2, message: str = "") -> list[dict[str, Any]]:
    return [
        node_pod(i, phase="Succeeded", node_name=f"gpu-{i}", exit_code=0, message=message)
        for i in range(nodes)
    ]


def world(body: dict[str, Any], *objects: dict[str, Any]) -> FakeK8s:
    return FakeK8s(body, *objects)


def reconcile(
    fake: FakeK8s,
    at: float = 0.0,
    settings: pods.Settings | None = None,
    written_at: dict[context.Key, datetime] | None = None,
) -> context.Result:
    """One reconcile of run ``r`` as the work queue makes it, ``at`` seconds after T0,
    after the admission pass that the watches' events (the fake's objects) made; by a
    fresh operator unless ``written_at`` carries when the same operator last wrote."""
    body = fake.get(k8s.TRAININGRUNS, NS, "r")
    ctx = context.Context(
        settings=settings or pods.Settings(),
        clock=lambda: T0 + timedelta(seconds=at),
        k8s=fake,
        written_at=written_at if written_at is not None else {},
    )
    admission.prime(ctx)
    admission.run_pass(ctx)
    return trainingruns.reconcile(body, logging.getLogger("test"), ctx)


def status(fake: FakeK8s) -> dict[str, Any]:
    stored: dict[str, Any] = fake.get(k8s.TRAININGRUNS, NS, "r").get("status") or {}
    return stored


def conditions(fake: FakeK8s) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status(fake).get("conditions", [])}
