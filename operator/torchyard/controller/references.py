"""The objects a run's spec names, looked up before its node Pods are created.

A run names objects that are not its own: the ConfigMap of its code
(``source.configMap``), a checkpoint claim (``checkpoints.claimName``), the claims of its
``pvc://`` inputs, a PriorityClass
(``compute.priorityClassName``) and Kueue's LocalQueue (``scheduling.queueName``). The
apiserver creates Pods that mount a missing ConfigMap or claim (they never start, and say
so only in their own Events), a cluster without Kueue ignores the queue's label, and the
Priority plugin refuses a Pod of a missing PriorityClass only when it is created. So
before a gang's Pods are created, :func:`missing` looks each one up; while any is
missing the run is Pending, with ``Admitted`` False, a reason (``ConfigMapNotFound``,
``PersistentVolumeClaimNotFound``, ``PriorityClassNotFound``, ``KueueNotInstalled``,
``LocalQueueNotFound``) and a message naming the field and what to do. Each may appear
later: the run is looked at again every ``refusals.WAIT_SECONDS`` and goes on once all
are there.

:func:`named_references` and :func:`served_version` are pure; :func:`missing` reads through
``Context.k8s``. Called by ``trainingruns`` ("apply children"); tested in
tests/unit/controller/test_references.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchyard import api, k8s
from torchyard.controller.context import Context
from torchyard.planning import inputs as run_inputs

# Kueue's versions of LocalQueue this operator reads, newest first (the CRD says which
# of them the cluster serves).
KUEUE_VERSIONS = ("v1beta2", "v1beta1")


@dataclass(frozen=True)
class Reference:
    """An object the spec names at ``field``, which must exist before the Pods do."""

    field: str  # the spec's field, as a user writes it: spec.source.configMap
    kind: str  # ConfigMap
    resource: k8s.Resource
    namespace: str | None  # None: cluster-scoped
    name: str
    advice: str  # what to do when it is missing

    @property
    def reason(self) -> str:
        return f"{self.kind}NotFound"

    @property
    def message(self) -> str:
        where = f"namespace {self.namespace}" if self.namespace else "the cluster"
        return (
            f"{self.field}: {self.kind} {self.name} does not exist in {where}: "
            f"{self.advice}; the run waits for it"
        )


def named_references(run: api.TrainingRun) -> list[Reference]:
    """The objects ``run`` names whose place is known without asking the cluster (all but
    Kueue's LocalQueue, whose version its CRD tells: :func:`missing`)."""
    spec, ns = run.spec, run.namespace
    refs = []
    if spec.source.config_map is not None:
        refs.append(
            Reference(
                "spec.source.configMap",
                "ConfigMap",
                k8s.CONFIGMAPS,
                ns,
                spec.source.config_map,
                "create it (`torchyard submit --source DIR` makes one of a folder) or name "
                "one that exists",
            )
        )
    if spec.checkpoints is not None and spec.checkpoints.claim_name is not None:
        refs.append(
            Reference(
                "spec.checkpoints.claimName",
                "PersistentVolumeClaim",
                k8s.PERSISTENTVOLUMECLAIMS,
                ns,
                spec.checkpoints.claim_name,
                "create it (ReadWriteMany for a run of several nodes), name one that "
                "exists, or set checkpoints.size instead for a claim the run makes itself",
            )
        )
    for claim in run_inputs.claims(run):
        refs.append(
            Reference(
                "spec.inputs",
                "PersistentVolumeClaim",
                k8s.PERSISTENTVOLUMECLAIMS,
                ns,
                claim,
                "create it, or name one that exists in a pvc:// input",
            )
        )
    if spec.compute.priority_class_name is not None:
        refs.append(
            Reference(
                "spec.compute.priorityClassName",
                "PriorityClass",
                k8s.PRIORITYCLASSES,
                None,
                spec.compute.priority_class_name,
                "create it or name one that exists (kubectl get priorityclasses)",
            )
        )
    return refs


def served_version(crd: Mapping[str, Any]) -> str | None:
    """The version of Kueue's LocalQueue CRD to read it in: the newest of
    ``KUEUE_VERSIONS`` the CRD serves, else its storage version; None if it serves none."""
    served = [
        str(v.get("name")) for v in (crd.get("spec") or {}).get("versions") or [] if v.get("served")
    ]
    known = [v for v in KUEUE_VERSIONS if v in served]
    if known:
        return known[0]
    storage = [
        str(v.get("name"))
        for v in (crd.get("spec") or {}).get("versions") or []
        if v.get("served") and v.get("storage")
    ]
    chosen = storage or served
    return chosen[0] if chosen else None


def kueue_missing(queue: str) -> tuple[str, str]:
    return (
        "KueueNotInstalled",
        f"spec.scheduling.queueName: the run is handed to Kueue's LocalQueue {queue}, and "
        f"this cluster has no Kueue (no CustomResourceDefinition {k8s.LOCALQUEUES_CRD}): "
        "install Kueue, or leave queueName out for torchyard's own gang admission; the "
        "run waits for it",
    )


def local_queue(run: api.TrainingRun, version: str) -> Reference:
    queue = run.spec.scheduling.queue_name or ""
    return Reference(
        "spec.scheduling.queueName",
        "LocalQueue",
        k8s.local_queues(version),
        run.namespace,
        queue,
        "create it (a Kueue LocalQueue pointing at a ClusterQueue) or name one that exists "
        f"(kubectl get localqueues -n {run.namespace})",
    )


def missing(ctx: Context, run: api.TrainingRun) -> tuple[str, str] | None:
    """(reason, message) when an object ``run`` names is missing (the first one's reason;
    the message names every missing one), else None."""
    found: list[tuple[str, str]] = [
        (ref.reason, ref.message)
        for ref in named_references(run)
        if ctx.k8s.get_or_none(ref.resource, ref.namespace, ref.name) is None
    ]
    queue = run.spec.scheduling.queue_name
    if queue:
        crd = ctx.k8s.get_or_none(k8s.CRDS, None, k8s.LOCALQUEUES_CRD)
        version = served_version(crd) if crd is not None else None
        if version is None:
            found.append(kueue_missing(queue))
        else:
            ref = local_queue(run, version)
            if ctx.k8s.get_or_none(ref.resource, ref.namespace, ref.name) is None:
                found.append((ref.reason, ref.message))
    if not found:
        return None
    return found[0][0], "; ".join(message for _, message in found)
