"""A TrainingRun as a Kueue ``Workload``, and what Kueue's admission of it means for its Pods.

With ``scheduling.queueName`` torchyard hands admission to Kueue as its own job type: it
creates the run's Workload (:func:`workload`), Kueue queues, accounts and admits it (or
evicts it: preemption, deactivation), and torchyard creates the node Pods only once the
Workload is admitted, each with what the admission says (:func:`placements`): the
assigned ResourceFlavors' node labels and tolerations, the admission checks' Pod set
updates and, under topology-aware scheduling (TAS), its domain of the
``topologyAssignment``, node ranks numbered domain by domain (``planning.topology``).

The Workload has one PodSet per role: node 0 (``node-0``, one Pod) and the other nodes
(``nodes``). A run with a placement is one PodSet of every node (``nodes``) with the
placement as its topology request: node 0's Pod is the same as the others', and Kueue
places one PodSet as a whole (and cuts it into slices, with ``sliceSize``); Kueue v0.17's
placement of a PodSet group (node 0 as a leader, the others as workers) fails when a gang
must span domains (an empty ``topologyAssignment`` its own apiserver refuses, retried
without end: kubernetes-sigs/kueue#10778), so torchyard does not ask for one. The builder
takes the node count apart from the run, so that a run of another size (an elastic one)
builds its Workload the same way.

The Workload's status is read here too: whether it is admitted, evicted or finished, why
it waits (Kueue's own words), and the status changes torchyard writes as the job's
controller, as Kueue's job framework does: ``Finished`` when the run ends, the admission
cleared once an evicted gang's Pods are gone (Kueue then queues it again), and
``spec.active`` false while the run is suspended.

Pure. Called by ``controller.workloads``; tested in tests/unit/planning/test_workloads.py
and against a real Kueue in tests/integration/test_kueue.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from torchyard.api import TrainingRun
from torchyard.planning import names, pods, topology

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
NODE0_PODSET = "node-0"
NODES_PODSET = "nodes"
# TAS: a PodSet's topology request, as Kueue's annotations name it on a job's Pods. A Pod
# with one of them is a TAS Pod (Kueue does not count it again as usage of others).
REQUIRED_ANNOTATION = f"{GROUP}/podset-required-topology"
PREFERRED_ANNOTATION = f"{GROUP}/podset-preferred-topology"
UNCONSTRAINED_ANNOTATION = f"{GROUP}/podset-unconstrained-topology"
SLICE_TOPOLOGY_ANNOTATION = f"{GROUP}/podset-slice-required-topology"
SLICE_SIZE_ANNOTATION = f"{GROUP}/podset-slice-size"
# What Kueue puts on the Pods of a Workload it admitted: the Workload and the PodSet.
WORKLOAD_ANNOTATION = f"{GROUP}/workload"
PODSET_LABEL = f"{GROUP}/podset"
# MultiKueue's copy of a run on a worker cluster names the Workload it made there.
PREBUILT_LABEL = f"{GROUP}/prebuilt-workload-name"
MULTIKUEUE_ORIGIN_LABEL = f"{GROUP}/multikueue-origin"
PRIORITY_GROUP = "scheduling.k8s.io"
# Evictions after which Kueue queues the Workload again at once (the job controller says
# so with ``Requeued`` True, as Kueue's job framework does).
REQUEUED_REASONS = ("Preempted", "NodeFailures")


def name(run: TrainingRun) -> str:
    """The run's Workload: MultiKueue's copy names the one made for it on the manager
    (``prebuilt-workload-name``); else ``names.workload``."""
    prebuilt = (run.metadata.get("labels") or {}).get(PREBUILT_LABEL)
    if prebuilt:
        return str(prebuilt)
    return names.workload(run.name, str(run.metadata.get("uid") or ""))


def prebuilt(run: TrainingRun) -> bool:
    """MultiKueue made this run's Workload (a copy on a worker cluster)."""
    return bool((run.metadata.get("labels") or {}).get(PREBUILT_LABEL))


def topology_request(
    request: topology.Request | None,
) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """A PodSet's ``topologyRequest`` and the annotations that say the same on its Pods."""
    if request is None:
        return None, {}
    level = request.level
    req: dict[str, Any] = {}
    notes: dict[str, str] = {}
    if request.slice_size is not None:
        req = {
            "preferred": level,
            "podSetSliceRequiredTopology": level,
            "podSetSliceSize": request.slice_size,
        }
        notes = {
            PREFERRED_ANNOTATION: level,
            SLICE_TOPOLOGY_ANNOTATION: level,
            SLICE_SIZE_ANNOTATION: str(request.slice_size),
        }
    elif request.mode == "required":
        req, notes = {"required": level}, {REQUIRED_ANNOTATION: level}
    else:
        req, notes = {"preferred": level}, {PREFERRED_ANNOTATION: level}
    return req, notes


def template(run: TrainingRun, annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Pod template of a PodSet: what Kueue accounts (the requests) and matches
    flavors by (node selector, tolerations), the same as the node Pods'."""
    container: dict[str, Any] = {"name": "trainer"}
    resources = pods.resource_requirements(run)
    if resources:
        container["resources"] = resources
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    selector = pods.node_selector(run)
    if selector:
        spec["nodeSelector"] = selector
    tols = pods.tolerations(run)
    if tols:
        spec["tolerations"] = tols
    if run.spec.compute.priority_class_name:
        spec["priorityClassName"] = run.spec.compute.priority_class_name
    meta: dict[str, Any] = {"labels": {names.LABEL_RUN: run.name}}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"metadata": meta, "spec": spec}


def pod_sets(
    run: TrainingRun, node_count: int, request: topology.Request | None = None
) -> list[dict[str, Any]]:
    """The Workload's PodSets for a gang of ``node_count`` nodes (see the module
    docstring), with ``request`` (``topology.request`` of the run's placement)."""
    if node_count == 1 or request is not None:
        req, notes = topology_request(request)
        return [
            _pod_set(run, NODES_PODSET if node_count > 1 else NODE0_PODSET, node_count, req, notes)
        ]
    return [
        _pod_set(run, NODE0_PODSET, 1, None, {}),
        _pod_set(run, NODES_PODSET, node_count - 1, None, {}),
    ]


def _pod_set(
    run: TrainingRun,
    name_: str,
    count: int,
    request: Mapping[str, Any] | None,
    annotations: Mapping[str, str],
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name_, "count": count, "template": template(run, annotations)}
    if request:
        out["topologyRequest"] = dict(request)
    return out


def workload(
    run: TrainingRun,
    node_count: int,
    *,
    priority: int | None = None,
    request: topology.Request | None = None,
) -> dict[str, Any]:
    """The run's Workload for a gang of ``node_count`` nodes, owned by the run, in its
    LocalQueue; ``priority``: the value of its ``compute.priorityClassName`` (Kueue
    orders and preempts by it; None: the class is left out, the priority is Kueue's
    default); ``request``: its placement as ``topology.request`` made it."""
    spec: dict[str, Any] = {
        "queueName": run.spec.scheduling.queue_name,
        "podSets": pod_sets(run, node_count, request),
        "active": not run.spec.suspend,
    }
    if run.spec.compute.priority_class_name and priority is not None:
        spec["priorityClassRef"] = {
            "group": PRIORITY_GROUP,
            "kind": "PriorityClass",
            "name": run.spec.compute.priority_class_name,
        }
        spec["priority"] = priority
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": name(run),
            "namespace": run.namespace,
            "labels": {names.LABEL_RUN: run.name, "app.kubernetes.io/managed-by": "torchyard"},
            "ownerReferences": [pods.owner_reference(run)],
        },
        "spec": spec,
    }


# -- reading a Workload's status ----------------------------------------------------------


def _condition(wl: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for cond in (wl.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def _true(wl: Mapping[str, Any], type_: str) -> bool:
    cond = _condition(wl, type_)
    return cond is not None and cond.get("status") == "True"


def admitted(wl: Mapping[str, Any]) -> bool:
    """Kueue admitted it (quota reserved, every admission check ready) and did not evict
    it since."""
    return _true(wl, "Admitted") and not evicted(wl) and bool(_admission(wl))


def finished(wl: Mapping[str, Any]) -> bool:
    return _true(wl, "Finished")


def evicted(wl: Mapping[str, Any]) -> bool:
    return _true(wl, "Evicted")


def reserved(wl: Mapping[str, Any]) -> bool:
    """It holds quota (``status.admission`` set): what an evicted Workload keeps until the
    job's controller clears it."""
    return bool(_admission(wl))


def active(wl: Mapping[str, Any]) -> bool:
    return bool((wl.get("spec") or {}).get("active", True))


def cluster_queue(wl: Mapping[str, Any]) -> str:
    return str(_admission(wl).get("clusterQueue") or "")


def _admission(wl: Mapping[str, Any]) -> Mapping[str, Any]:
    adm = (wl.get("status") or {}).get("admission")
    return adm if isinstance(adm, Mapping) else {}


def eviction(wl: Mapping[str, Any]) -> str:
    """Why Kueue evicted it, in Kueue's words: 'Preempted: Preempted to accommodate ...'."""
    cond = _condition(wl, "Evicted") or {}
    reason, message = str(cond.get("reason") or ""), str(cond.get("message") or "").strip()
    return f"{reason}: {message}" if message else reason


def waiting_message(wl: Mapping[str, Any], queue: str) -> str:
    """Why it is not admitted yet, with Kueue's own message when it gave one."""
    said = ""
    for type_ in ("QuotaReserved", "Admitted"):
        cond = _condition(wl, type_)
        if cond is not None and cond.get("status") != "True" and cond.get("message"):
            said = str(cond["message"]).strip()
            break
    if not said and reserved(wl):
        checks = [
            f"{c.get('name')} {c.get('state')}"
            for c in (wl.get("status") or {}).get("admissionChecks") or []
            if c.get("state") != "Ready"
        ]
        said = (
            "quota reserved; waiting for admission checks: " + ", ".join(checks) if checks else ""
        )
    name_ = (wl.get("metadata") or {}).get("name", "")
    where = f"Kueue's LocalQueue {queue} (Workload {name_})"
    return f"waiting in {where}: {said}" if said else f"waiting in {where}"


# -- what an admission means for the node Pods --------------------------------------------


@dataclass(frozen=True)
class Placement:
    """What node rank *i*'s Pod gets from the admission besides its spec."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


def decode(assignment: Mapping[str, Any]) -> list[tuple[dict[str, str], int]]:
    """A ``topologyAssignment`` as (node selector, Pod count) per domain, in Kueue's order:
    its slices' prefixes, suffixes and universal values expanded."""
    levels = [str(level) for level in assignment.get("levels") or []]
    out: list[tuple[dict[str, str], int]] = []
    for piece in assignment.get("slices") or []:
        count = int(piece.get("domainCount") or 0)
        values: list[list[str]] = []
        for per_level in piece.get("valuesPerLevel") or []:
            if per_level.get("universal") is not None:
                values.append([str(per_level["universal"])] * count)
                continue
            each = per_level.get("individual") or {}
            prefix, suffix = str(each.get("prefix") or ""), str(each.get("suffix") or "")
            values.append([f"{prefix}{root}{suffix}" for root in each.get("roots") or []])
        counts = piece.get("podCounts") or {}
        if counts.get("universal") is not None:
            pods_per = [int(counts["universal"])] * count
        else:
            pods_per = [int(c) for c in counts.get("individual") or []]
        for i in range(count):
            out.append(({lv: values[j][i] for j, lv in enumerate(levels)}, pods_per[i]))
    return out


def _flavor_parts(
    flavor_names: Sequence[str], flavors: Mapping[str, Mapping[str, Any]]
) -> tuple[dict[str, str], list[Mapping[str, Any]]]:
    """The node labels and tolerations of the assigned ResourceFlavors."""
    selector: dict[str, str] = {}
    tolerations: list[Mapping[str, Any]] = []
    for flavor in dict.fromkeys(flavor_names):
        spec = (flavors.get(flavor) or {}).get("spec") or {}
        selector.update({str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()})
        tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
    return selector, tolerations


def flavors_of(wl: Mapping[str, Any]) -> list[str]:
    """The names of the ResourceFlavors its admission assigned (to read them)."""
    out: list[str] = []
    for psa in _admission(wl).get("podSetAssignments") or []:
        out += [str(f) for f in (psa.get("flavors") or {}).values()]
    return sorted(set(out))


def placements(
    wl: Mapping[str, Any],
    node_count: int,
    flavors: Mapping[str, Mapping[str, Any]],
    node_labels: Mapping[str, Mapping[str, str]],
    request: topology.Request | None = None,
) -> list[Placement]:
    """Node rank *i*'s :class:`Placement` under the Workload's admission (``flavors``: the
    assigned ResourceFlavors by name; ``node_labels``: the Nodes' labels by name, to read
    a hostname domain's rack; ``request``: the run's placement). Node 0 gets its PodSet's
    domain; the other nodes fill the domains in order, node 0's domain first, then the
    domains sorted by the request's levels (block, then rack), so that the nodes of one
    domain have consecutive node ranks."""
    spec_sets = {ps.get("name"): ps for ps in (wl.get("spec") or {}).get("podSets") or []}
    updates = _updates(wl)
    per_set: dict[str, tuple[Placement, list[tuple[dict[str, str], int]]]] = {}
    for psa in _admission(wl).get("podSetAssignments") or []:
        ps_name = str(psa.get("name"))
        selector, tols = _flavor_parts(list((psa.get("flavors") or {}).values()), flavors)
        upd = updates.get(ps_name, {})
        selector.update(upd.get("nodeSelector") or {})
        tols += [t for t in upd.get("tolerations") or [] if t not in tols]
        labels = {**(upd.get("labels") or {}), PODSET_LABEL: ps_name}
        notes = {**(upd.get("annotations") or {}), WORKLOAD_ANNOTATION: _name(wl)}
        domains: list[tuple[dict[str, str], int]] = []
        if psa.get("topologyAssignment"):
            domains = decode(psa["topologyAssignment"])
            tas = (spec_sets.get(ps_name) or {}).get("template", {}).get("metadata", {})
            notes.update(tas.get("annotations") or {})
            if not any(a in notes for a in (REQUIRED_ANNOTATION, PREFERRED_ANNOTATION)):
                notes[UNCONSTRAINED_ANNOTATION] = "true"
        per_set[ps_name] = (Placement(selector, tuple(tols), labels, notes), domains)
    order = _rank_order(per_set, node_labels, request)
    out: list[Placement] = []
    for ps_name, domain in order:
        base = per_set[ps_name][0]
        out.append(
            Placement(
                {**base.node_selector, **domain}, base.tolerations, base.labels, base.annotations
            )
        )
    return out[:node_count] if len(out) >= node_count else _padded(out, per_set, node_count)


def _padded(
    out: list[Placement],
    per_set: Mapping[str, tuple[Placement, list[tuple[dict[str, str], int]]]],
    node_count: int,
) -> list[Placement]:
    """Node ranks no domain was assigned to (a PodSet admitted without a topology): its
    PodSet's flavors alone."""
    order = [NODE0_PODSET] + [NODES_PODSET] * (node_count - 1)
    if NODE0_PODSET not in per_set:  # one PodSet of every node
        order = [NODES_PODSET] * node_count
    return out + [per_set[s][0] for s in order[len(out) :] if s in per_set]


def _rank_order(
    per_set: Mapping[str, tuple[Placement, list[tuple[dict[str, str], int]]]],
    node_labels: Mapping[str, Mapping[str, str]],
    request: topology.Request | None,
) -> list[tuple[str, dict[str, str]]]:
    """(PodSet, domain selector) per node rank, for the PodSets admitted with a topology."""

    def key(selector: Mapping[str, str]) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
        labels = dict(selector)
        host = selector.get(topology.HOSTNAME_LEVEL)
        if host is not None:
            labels = {**node_labels.get(host, {}), **labels}
        levels = request.levels if request is not None else ()
        domain = tuple(labels.get(level, "") for level in levels)
        return domain, tuple(sorted(selector.items()))

    out: list[tuple[str, dict[str, str]]] = []
    first: tuple[str, ...] | None = None
    if NODE0_PODSET in per_set:
        for selector, _count in per_set[NODE0_PODSET][1][:1]:
            out.append((NODE0_PODSET, selector))
            first = key(selector)[0]
    if NODES_PODSET in per_set:
        domains = sorted(
            per_set[NODES_PODSET][1], key=lambda dc: (key(dc[0])[0] != first, key(dc[0]))
        )
        for selector, count in domains:
            out += [(NODES_PODSET, selector)] * count
    return out


def _updates(wl: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The admission checks' Pod set updates, merged per PodSet."""
    out: dict[str, dict[str, Any]] = {}
    for check in (wl.get("status") or {}).get("admissionChecks") or []:
        for upd in check.get("podSetUpdates") or []:
            have = out.setdefault(str(upd.get("name")), {})
            for part in ("nodeSelector", "labels", "annotations"):
                have[part] = {**have.get(part, {}), **(upd.get(part) or {})}
            have["tolerations"] = list(have.get("tolerations", [])) + list(
                upd.get("tolerations") or []
            )
    return out


def _name(wl: Mapping[str, Any]) -> str:
    return str((wl.get("metadata") or {}).get("name", ""))


# -- what torchyard writes on it as the job's controller ----------------------------------


def _timestamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def _status_condition(
    wl: Mapping[str, Any], type_: str, status: bool, reason: str, message: str, now: datetime
) -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": _timestamp(now),
        "observedGeneration": int((wl.get("metadata") or {}).get("generation") or 0),
    }


def _replace(
    conditions: Sequence[Mapping[str, Any]], new: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """``conditions`` with ``new`` set by type; its transition time kept when the status
    stays (as metav1's SetStatusCondition)."""
    out: list[dict[str, Any]] = []
    found = False
    for cond in conditions:
        if cond.get("type") == new["type"]:
            found = True
            if cond.get("status") == new["status"]:
                out.append({**new, "lastTransitionTime": cond.get("lastTransitionTime")})
            else:
                out.append(dict(new))
        else:
            out.append(dict(cond))
    if not found:
        out.append(dict(new))
    return out


def requeue_patch(wl: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The merge patch that clears an evicted Workload's admission once its Pods are gone,
    as Kueue's job framework does: ``QuotaReserved`` False (Pending), ``Admitted`` False,
    ``Requeued`` True after a preemption or a node failure (Kueue queues it again at
    once); with the Workload's resourceVersion, so a change meanwhile makes it conflict."""
    evicted_ = _condition(wl, "Evicted") or {}
    reason = str(evicted_.get("reason") or "")
    message = str(evicted_.get("message") or "")
    conds = list((wl.get("status") or {}).get("conditions") or [])
    conds = _replace(
        conds,
        _status_condition(
            wl, "Requeued", reason in REQUEUED_REASONS, reason or "Evicted", message, now
        ),
    )
    conds = _replace(conds, _status_condition(wl, "QuotaReserved", False, "Pending", message, now))
    if _true(wl, "Admitted"):
        conds = _replace(
            conds,
            _status_condition(
                wl, "Admitted", False, "NoReservation", "The workload has no reservation", now
            ),
        )
    meta = wl.get("metadata") or {}
    return {
        "metadata": {"resourceVersion": meta.get("resourceVersion")},
        "status": {"admission": None, "conditions": conds},
    }


def finished_status(
    wl: Mapping[str, Any], succeeded: bool, message: str, now: datetime
) -> dict[str, Any]:
    """The status apply that marks the Workload ``Finished`` (its quota released), as
    Kueue's job framework does when a job ends."""
    reason = "Succeeded" if succeeded else "Failed"
    meta = wl.get("metadata") or {}
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
        "status": {"conditions": [_status_condition(wl, "Finished", True, reason, message, now)]},
    }


def activation(wl: Mapping[str, Any], active_: bool) -> dict[str, Any]:
    """The apply that sets ``spec.active``: false evicts an admitted Workload and keeps it
    out of its queue (a suspended run), true queues it again."""
    meta = wl.get("metadata") or {}
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
        "spec": {"active": active_},
    }


def adoption(wl: Mapping[str, Any], run: TrainingRun) -> dict[str, Any] | None:
    """The merge patch that makes ``run`` the owner of the Workload MultiKueue built for
    its copy on a worker cluster (deleting the run deletes it); None when it is already."""
    meta = wl.get("metadata") or {}
    owners = list(meta.get("ownerReferences") or [])
    uid = str(run.metadata.get("uid") or "")
    if any(o.get("uid") == uid for o in owners):
        return None
    ref = {**pods.owner_reference(run), "controller": not any(o.get("controller") for o in owners)}
    return {
        "metadata": {
            "resourceVersion": meta.get("resourceVersion"),
            "ownerReferences": [*owners, ref],
        }
    }
