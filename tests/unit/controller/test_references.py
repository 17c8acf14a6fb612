"""``references``: the objects a run's spec names are looked up before its Pods, and a
missing one is said by field, kind, name and what to do (the reconcile rows that wait for
them are in test_reconcile.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from tests.unit.controller.fake_k8s import FakeK8s
from tests.unit.controller.world import NS, kueue, named, priority_class
from torchyard import api, k8s
from torchyard.controller import context, references


def parse(**spec: Any) -> api.TrainingRun:
    builder = TrainingRunBuilder("r", NS)
    for path, value in spec.items():
        builder = builder.with_(f"spec.{path}", value)
    return api.parse_trainingrun(builder.obj())


def missing(run: api.TrainingRun, *objects: dict[str, Any]) -> tuple[str, str] | None:
    return references.missing(context.Context(k8s=FakeK8s(*objects)), run)


SOURCE = {"source": {"configMap": "src"}}
CLAIM = {"checkpoints": {"claimName": "ckpt"}}
PRIORITY = {"compute": {"priorityClassName": "high"}}
QUEUE = {"scheduling": {"queueName": "team"}}

# (what, spec, objects there, reason, the message names)
MISSING: list[tuple[str, dict[str, Any], list[dict[str, Any]], str, list[str]]] = [
    (
        "the ConfigMap of its code",
        SOURCE,
        [],
        "ConfigMapNotFound",
        ["spec.source.configMap: ConfigMap src does not exist in namespace ns", "submit"],
    ),
    (
        "a ConfigMap of that name elsewhere is not it",
        SOURCE,
        [{**named("ConfigMap", "src"), "metadata": {"name": "src", "namespace": "other"}}],
        "ConfigMapNotFound",
        ["spec.source.configMap"],
    ),
    (
        "its checkpoint claim",
        CLAIM,
        [],
        "PersistentVolumeClaimNotFound",
        ["spec.checkpoints.claimName: PersistentVolumeClaim ckpt", "checkpoints.size"],
    ),
    (
        "its PriorityClass",
        PRIORITY,
        [],
        "PriorityClassNotFound",
        ["spec.compute.priorityClassName: PriorityClass high does not exist in the cluster"],
    ),
    (
        "Kueue itself",
        QUEUE,
        [],
        "KueueNotInstalled",
        ["spec.scheduling.queueName", "no CustomResourceDefinition localqueues.kueue.x-k8s.io"],
    ),
    (
        "its LocalQueue",
        QUEUE,
        kueue("other"),
        "LocalQueueNotFound",
        ["spec.scheduling.queueName: LocalQueue team does not exist in namespace ns"],
    ),
    (
        "its LocalQueue in another namespace is not it",
        QUEUE,
        [*kueue(), {**kueue("team")[1], "metadata": {"name": "team", "namespace": "other"}}],
        "LocalQueueNotFound",
        ["spec.scheduling.queueName"],
    ),
    (
        "all of them: the first one's reason, every one said",
        {**SOURCE, **CLAIM, **PRIORITY, **QUEUE},
        [],
        "ConfigMapNotFound",
        [
            "spec.source.configMap",
            "spec.checkpoints.claimName",
            "spec.compute.priorityClassName",
            "spec.scheduling.queueName",
        ],
    ),
    (
        "the one of several that is missing",
        {**SOURCE, **CLAIM, **PRIORITY},
        [named("ConfigMap", "src"), priority_class("high")],
        "PersistentVolumeClaimNotFound",
        ["spec.checkpoints.claimName"],
    ),
]


@pytest.mark.parametrize(
    ("what", "spec", "objects", "reason", "names"), MISSING, ids=[m[0] for m in MISSING]
)
def test_a_missing_object_the_spec_names_is_said_by_field(
    what: str, spec: dict[str, Any], objects: list[dict[str, Any]], reason: str, names: list[str]
) -> None:
    found = missing(parse(**spec), *objects)
    assert found is not None
    assert found[0] == reason
    for name in names:
        assert name in found[1]
    assert found[1].endswith("the run waits for it")


@pytest.mark.parametrize(
    ("spec", "objects"),
    [
        ({}, []),
        (SOURCE, [named("ConfigMap", "src")]),
        (CLAIM, [named("PersistentVolumeClaim", "ckpt")]),
        (PRIORITY, [priority_class("high")]),
        (QUEUE, kueue("team")),
        (QUEUE, kueue("team", versions=("v1beta1",))),
        ({"checkpoints": {"size": "10Gi"}}, []),  # the run makes that claim itself
        ({"source": {"git": {"url": "https://git.example/x.git"}}}, []),
    ],
)
def test_a_run_whose_objects_exist_waits_for_nothing(
    spec: dict[str, Any], objects: list[dict[str, Any]]
) -> None:
    assert missing(parse(**spec), *objects) is None


def test_nothing_is_read_for_a_run_that_names_nothing() -> None:
    fake = FakeK8s()
    reads: list[str] = []
    get = fake.get_or_none

    def counted(res: k8s.Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        reads.append(res.plural)
        return get(res, namespace, name)

    fake.get_or_none = counted  # type: ignore[method-assign]
    assert references.missing(context.Context(k8s=fake), parse()) is None
    assert reads == []


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        ([("v1beta1", True, True)], "v1beta1"),
        ([("v1beta1", True, False), ("v1beta2", True, True)], "v1beta2"),
        ([("v1beta1", True, True), ("v1beta2", False, False)], "v1beta1"),
        ([("v1", True, True), ("v1beta2", True, False)], "v1beta2"),  # a known one first
        ([("v1", True, True)], "v1"),  # a newer Kueue: its storage version
        ([("v1beta1", False, True)], None),
        ([], None),
    ],
)
def test_kueue_queues_are_read_in_a_version_the_crd_serves(
    versions: list[tuple[str, bool, bool]], expected: str | None
) -> None:
    crd = {"spec": {"versions": [{"name": n, "served": s, "storage": t} for n, s, t in versions]}}
    assert references.served_version(crd) == expected
