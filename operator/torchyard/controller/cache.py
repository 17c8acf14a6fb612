"""The watch-fed cache gang admission decides over: Nodes and the Pods that take their room.

:class:`Cache` keeps, in memory, what ``planning.admission`` needs and nothing more: the
Nodes (labels, taints, unschedulable, Ready, allocatable cpu, memory, ``nvidia.com/gpu``
and Pod slots), the unfinished Pods torchyard made (gates, node, selector, tolerations,
requests, priority) and the unfinished Pods of others that ask for GPUs (the same
fields). ``handlers`` hands it Kopf's watch events (:meth:`Cache.feed`, which never
waits for the lock, so the event loop never waits behind a decision; the next reader
takes them in, :meth:`Cache.drain`), after one list at start-up (:meth:`Cache.prime`):
until then it is not :attr:`~Cache.ready`, and nothing is admitted. The reconciles add the Pods they
just wrote (:meth:`Cache.assume`, as kube-scheduler assumes a binding), so the next
decision sees their claim before the watch delivers them; an event older than what is
held (by ``resourceVersion``) is ignored. An event that changes what admission sees marks
the cache :attr:`~Cache.dirty`, and the admission pass (``admission.run_pass``) runs.

Besides, the cache holds the admission state of the pools: the gangs a pass admitted
whose gates their run's reconcile has yet to lift (:attr:`Cache.admitted`, counted as
taking room, in the domains of their placement: :attr:`Cache.selectors`), each waiting
run's place in its pool's queue (:attr:`Cache.places`) and the pools whose head the last
pass found blocked (:attr:`Cache.blocked`), so that a gang created far back in a blocked
queue is placed without a pass.
The waiting gangs are worked out per run and kept until one of its Pods changes
(:meth:`Cache.waiting`), so a pass over thousands of waiting runs re-reads none of
their Pods. :meth:`Cache.echo` tells a Pod event that is this operator's own write
coming back (its run need not be reconciled for it). :meth:`Cache.node_gone` tells
whether a Pod's Node was deleted (``lost_nodes``).

Pure bookkeeping: no Kopf, no API calls. Tested in tests/unit/controller/test_cache.py.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from torchyard.planning import admission as gangs
from torchyard.planning import names, pods

RunKey = tuple[str, str]  # (namespace, name) of a TrainingRun
_PodKey = tuple[str, str]  # (namespace, name) of a Pod
_TOMBSTONES = 10_000  # deleted objects remembered (to ignore a late, older event)


@dataclass(frozen=True)
class Place:
    """A waiting run's place in its pool's queue, as the last admission pass saw it."""

    pool: str
    position: int
    message: str


def holds_gpus(pod: Mapping[str, Any]) -> bool:
    """The Pod asks for ``nvidia.com/gpu`` (a Pod of others admission must count)."""
    return gangs.pod_requests(pod).get(pods.GPU_RESOURCE, 0) > 0


def _finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _version(obj: Mapping[str, Any]) -> int | None:
    text = (obj.get("metadata") or {}).get("resourceVersion")
    return int(text) if isinstance(text, str) and text.isdigit() else None


def _older(new: Mapping[str, Any], held: Mapping[str, Any] | None) -> bool:
    if held is None:
        return False
    a, b = _version(new), _version(held)
    return a is not None and b is not None and a < b


def trim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a Pod that admission reads."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    out_meta: dict[str, Any] = {
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "labels": {k: labels[k] for k in (names.LABEL_RUN, names.LABEL_NODE_RANK) if k in labels},
        "annotations": {
            k: annotations[k]
            for k in (pods.QUEUED_AT_ANNOTATION, pods.PLACEMENT_ANNOTATION)
            if k in annotations
        },
        "creationTimestamp": meta.get("creationTimestamp", ""),
    }
    for key in ("deletionTimestamp", "resourceVersion"):
        if meta.get(key):
            out_meta[key] = meta[key]
    out_spec: dict[str, Any] = {
        "containers": [
            {"resources": dict(c.get("resources") or {})} for c in spec.get("containers") or []
        ]
    }
    # affinity: the nodes a run's Pods rule out (``planning.exclusions``)
    for key in (
        "nodeName",
        "nodeSelector",
        "tolerations",
        "schedulingGates",
        "priority",
        "affinity",
    ):
        if spec.get(key) is not None:
            out_spec[key] = spec[key]
    return {
        "metadata": out_meta,
        "spec": out_spec,
        "status": {"phase": (pod.get("status") or {}).get("phase", "Pending")},
    }


def trim_node(node: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a Node that admission reads."""
    meta, spec, st = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    alloc = st.get("allocatable") or {}
    out_meta: dict[str, Any] = {
        "name": meta.get("name", ""),
        "labels": dict(meta.get("labels") or {}),
    }
    if meta.get("resourceVersion"):
        out_meta["resourceVersion"] = meta["resourceVersion"]
    return {
        "metadata": out_meta,
        "spec": {
            "taints": list(spec.get("taints") or []),
            "unschedulable": bool(spec.get("unschedulable")),
        },
        "status": {
            "allocatable": {k: alloc[k] for k in gangs.TRACKED if k in alloc},
            "conditions": [
                {"type": "Ready", "status": c.get("status")}
                for c in st.get("conditions") or []
                if c.get("type") == "Ready"
            ],
        },
    }


def _without_version(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    return {**obj, "metadata": meta}


def _same_for_admission(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Equal but for the resourceVersion."""
    if a is None or b is None:
        return a is b
    return _without_version(a) == _without_version(b)


class Cache:
    """Nodes and the Pods that take their room, kept by watch events (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # also held by a whole admission decision
        self.ready = False  # primed: the start-up listing is in
        self.dirty = False  # something admission sees changed since the last pass
        self.admitted: set[RunKey] = set()  # admitted by a pass; gates not lifted yet
        # an admitted gang with a placement: node rank i's node selector (its domain)
        self.selectors: dict[RunKey, tuple[Mapping[str, str], ...]] = {}
        self.places: dict[RunKey, Place] = {}  # waiting runs' places in their pool's queue
        self.blocked: set[tuple[tuple[str, str], ...]] = set()  # pools whose head waits
        self._by_run: dict[RunKey, set[_PodKey]] = {}  # torchyard's Pods, per run
        self._gangs: dict[RunKey, gangs.Gang | None] = {}  # a run's waiting gang, worked out
        self._written: dict[_PodKey, str] = {}  # resourceVersion of the Pods this operator wrote
        self._nodes: dict[str, dict[str, Any]] = {}
        self._pods: dict[_PodKey, dict[str, Any]] = {}
        self._gone: dict[tuple[str, str, str], int | None] = {}  # tombstones
        # Watch events handed over by the event loop, taken in by the next reader.
        self._inbox: deque[tuple[str, str | None, Mapping[str, Any]]] = deque()

    # -- feeding ------------------------------------------------------------------------

    def prime(
        self, nodes: Iterable[Mapping[str, Any]], pod_list: Iterable[Mapping[str, Any]]
    ) -> None:
        """The start-up listing (events that came meanwhile and are newer are kept)."""
        with self.lock:
            for node in nodes:
                self._put_node(node)
            for pod in pod_list:
                self._put_pod(pod)
            self.ready = True
            self.dirty = True

    def node_event(self, type_: str | None, node: Mapping[str, Any]) -> bool:
        """A Node's watch event; True when admission sees a change."""
        with self.lock:
            changed = self._remove_node(node) if type_ == "DELETED" else self._put_node(node)
            self.dirty |= changed
            return changed

    def pod_event(self, type_: str | None, pod: Mapping[str, Any]) -> bool:
        """A Pod's watch event (torchyard's, or another that holds GPUs); True when
        admission sees a change."""
        with self.lock:
            changed = self._remove_pod(pod) if type_ == "DELETED" else self._put_pod(pod)
            self.dirty |= changed
            return changed

    def feed(self, kind: str, type_: str | None, obj: Mapping[str, Any]) -> None:
        """A watch event (``kind`` "Pod" or "Node"), handed over without waiting for the
        lock: the event loop never waits behind a decision. Taken in by :meth:`drain`."""
        self._inbox.append((kind, type_, obj))

    def drain(self) -> bool:
        """Take in the fed events; True when admission sees a change (also ``dirty``)."""
        changed = False
        with self.lock:
            while self._inbox:
                kind, type_, obj = self._inbox.popleft()
                if kind == "Node":
                    changed |= self.node_event(type_, obj)
                else:
                    changed |= self.pod_event(type_, obj)
        return changed

    def replace_outside(
        self, namespaces: Iterable[str], pod_list: Iterable[Mapping[str, Any]]
    ) -> bool:
        """A namespaced operator's fresh list of the Pods outside its ``namespaces``
        (which its watches do not see) replaces those held; True when that changed."""
        inside = frozenset(namespaces)
        with self.lock:
            before = {k: _without_version(p) for k, p in self._pods.items() if k[0] not in inside}
            for key in [k for k in self._pods if k[0] not in inside]:
                self._drop_pod(key)
            for pod in pod_list:
                if (pod.get("metadata") or {}).get("namespace") not in inside:
                    self._put_pod(pod)
            after = {k: _without_version(p) for k, p in self._pods.items() if k[0] not in inside}
            changed = before != after
            self.dirty |= changed
            return changed

    def assume(self, pod: Mapping[str, Any], *, quiet: bool = False) -> None:
        """A Pod this operator just wrote (the apiserver's answer). ``quiet``: the caller
        has already placed it (a gang created far back in a blocked queue), so it does
        not call for an admission pass."""
        with self.lock:
            dirty = self.dirty
            self.pod_event("MODIFIED", pod)
            if quiet:
                self.dirty = dirty
            meta = pod.get("metadata") or {}
            if meta.get("resourceVersion"):
                key = (meta.get("namespace", ""), meta.get("name", ""))
                self._written[key] = str(meta["resourceVersion"])

    def echo(self, pod: Mapping[str, Any]) -> bool:
        """The watch event of a Pod is this operator's own write coming back (the same
        resourceVersion): its run has seen it already. Forgets it once seen."""
        meta = pod.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        version = meta.get("resourceVersion")
        if version and self._written.get(key) == version:
            self._written.pop(key, None)
            return True
        return False

    def forget_run(self, run: RunKey) -> None:
        """The run's queue place and admission are gone (its gang left the queue)."""
        with self.lock:
            self.admitted.discard(run)
            self.selectors.pop(run, None)
            self.places.pop(run, None)

    # -- reading ------------------------------------------------------------------------

    def nodes(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self._nodes.values())

    def node_gone(self, name: str) -> bool | None:
        """Whether Node ``name`` is gone, as the watches tell (the fed events taken in
        first): True when its deletion was seen (a tombstone, and no Node of that name
        since), False while it is held or before the start-up listing (nothing is known
        then), None when the cache never saw it: its events are late, or it went while no
        watch ran (the operator was down); only the apiserver can tell then."""
        with self.lock:
            self.drain()
            if not self.ready or name in self._nodes:
                return False
            return True if ("Node", "", name) in self._gone else None

    def pods(self) -> list[dict[str, Any]]:
        """The unfinished Pods held, those of admitted gangs as if their gates were lifted."""
        with self.lock:
            out = []
            for p in self._pods.values():
                run = (p["metadata"]["namespace"], p["metadata"]["labels"].get(names.LABEL_RUN))
                if run in self.admitted and gangs.is_gated(p):
                    spec = {k: v for k, v in p["spec"].items() if k != "schedulingGates"}
                    chosen = self.selectors.get(run, ())
                    rank = int(p["metadata"]["labels"].get(names.LABEL_NODE_RANK, "-1"))
                    if 0 <= rank < len(chosen):  # its domain: it takes room there
                        spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **chosen[rank]}
                    p = {**p, "spec": spec}
                out.append(p)
            return out

    def run_size(self, run: RunKey) -> int:
        """How many Pods of ``run`` are held (those fed but not yet taken in aside)."""
        with self.lock:
            return len(self._by_run.get(run, ()))

    def run_pods(self, run: RunKey) -> list[dict[str, Any]]:
        with self.lock:
            return [self._pods[k] for k in self._by_run.get(run, ()) if k in self._pods]

    def waiting(self) -> list[gangs.Gang]:
        """The waiting gangs (all Pods gated, not admitted by a pass): each worked out
        once from its Pods and kept until one of them changes."""
        with self.lock:
            return list(self.iter_waiting())

    def iter_waiting(self) -> Iterator[gangs.Gang]:
        """:meth:`waiting`, one at a time, oldest Pods first (hold :attr:`lock`)."""
        for run in self._by_run:
            if run in self.admitted:
                continue
            if run not in self._gangs:
                found = gangs.waiting_gangs(self.run_pods(run))
                self._gangs[run] = found[0] if found else None
            gang = self._gangs[run]
            if gang is not None:
                yield gang

    # -- inside -------------------------------------------------------------------------

    def _bury(self, kind: str, ns: str, name: str, version: int | None) -> None:
        if len(self._gone) >= _TOMBSTONES:
            for key in list(self._gone)[: _TOMBSTONES // 2]:
                del self._gone[key]
        self._gone[(kind, ns, name)] = version

    def _buried(self, kind: str, ns: str, name: str, obj: Mapping[str, Any]) -> bool:
        if (kind, ns, name) not in self._gone:
            return False
        gone, new = self._gone[(kind, ns, name)], _version(obj)
        if gone is None or new is None or new > gone:
            del self._gone[(kind, ns, name)]  # a newer object of that name
            return False
        return True

    def _put_node(self, node: Mapping[str, Any]) -> bool:
        name = (node.get("metadata") or {}).get("name", "")
        held = self._nodes.get(name)
        if _older(node, held) or self._buried("Node", "", name, node):
            return False
        new = trim_node(node)
        self._nodes[name] = new
        return not _same_for_admission(held, new)

    def _remove_node(self, node: Mapping[str, Any]) -> bool:
        name = (node.get("metadata") or {}).get("name", "")
        self._bury("Node", "", name, _version(node))
        return self._nodes.pop(name, None) is not None

    def _put_pod(self, pod: Mapping[str, Any]) -> bool:
        meta = pod.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        held = self._pods.get(key)
        if _older(pod, held) or self._buried("Pod", *key, pod):
            return False
        ours = names.LABEL_RUN in (meta.get("labels") or {})
        if _finished(pod) or not (ours or holds_gpus(pod)):
            if _finished(pod):
                self._bury("Pod", *key, _version(pod))
            return self._drop_pod(key)
        new = trim_pod(pod)
        self._pods[key] = new
        run = new["metadata"]["labels"].get(names.LABEL_RUN)
        if run:
            self._by_run.setdefault((key[0], run), set()).add(key)
            self._gangs.pop((key[0], run), None)
        if held is not None and "resourceVersion" not in held["metadata"]:
            # The apiserver's copy of a Pod this operator assumed before writing it: what
            # differs is the apiserver's defaults; the decision that wrote it counted it.
            return False
        return not _same_for_admission(held, new)

    def _remove_pod(self, pod: Mapping[str, Any]) -> bool:
        meta = pod.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        self._bury("Pod", *key, _version(pod))
        return self._drop_pod(key)

    def _drop_pod(self, key: _PodKey) -> bool:
        held = self._pods.pop(key, None)
        self._written.pop(key, None)
        if held is None:
            return False
        run = held["metadata"]["labels"].get(names.LABEL_RUN)
        if run:
            members = self._by_run.get((key[0], run), set())
            members.discard(key)
            if not members:
                self._by_run.pop((key[0], run), None)
            self._gangs.pop((key[0], run), None)
        return True
