"""Reads a reconcile makes, answered from what the watches delivered: fewer round trips
per run.

A new run's reconcile used to read the run (GET), its Pods (LIST) and its Environment
(GET) from the apiserver before it wrote anything; with a queue of thousands those reads
were a third of the apiserver's work. :class:`WatchedReads` wraps ``torchyard.k8s`` (the
``context.K8s`` calls) and answers

- ``get`` of a TrainingRun or an Environment from the last copy the operator saw: its
  Kopf watch event (``handlers`` calls :meth:`WatchedReads.seen`), or the apiserver's
  answer to this operator's own write or read of it;
- ``list_`` of a run's Pods (``labelSelector=torchyard.dev/run=<run>`` in a watched
  namespace) from the Pods the operator's own Pod watch delivered (``pod_watch``, which
  hands them here on its thread before their run is queued) and this operator's writes,
  once that watch has listed every namespace (:attr:`WatchedReads.pods_listed`);
- ``list_`` of a Sweep's trials (TrainingRuns, ``labelSelector=torchyard.dev/sweep=<sweep>``
  in a watched namespace) from the held TrainingRuns, once Kopf's TrainingRun watch has
  listed them all (:attr:`WatchedReads.runs_listed`, set by ``handlers``): a Sweep of
  hundreds of trials does not list and parse them all from the apiserver each reconcile.
  Once a minute (:data:`VERIFY_SECONDS`) a Sweep's list goes to the apiserver and the held
  trials are set right by it: a trial deleted while a watch re-listed (whose DELETED event
  never came) is dropped, so it cannot count as running for ever.

Everything else goes to the apiserver. A copy is replaced only by a newer one (by
``resourceVersion``), so a watch event that was on its way while this operator wrote
never hides the write's answer; a delete marks the Pod as being deleted at once (an event
of it that was on its way keeps that mark), and the watch's ``DELETED`` removes it.
Before a copy is held (an object not seen yet), the read goes to the apiserver, and its
answer is held. A copy is held as compact JSON text (a fifth of the memory of the parsed
object: thousands of runs and Pods are held), and each read parses its own.

Built by ``handlers`` at start-up as the ``Context``'s ``k8s``; tested in
tests/unit/controller/test_reads.py and, through the operator, by the integration tests.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timezone
from typing import Any, NamedTuple

from torchyard import k8s
from torchyard.api import wire
from torchyard.controller import context
from torchyard.planning import names

_HELD = {k8s.TRAININGRUNS.plural: k8s.TRAININGRUNS, k8s.ENVIRONMENTS.plural: k8s.ENVIRONMENTS}
_Key = tuple[str, str, str]  # (plural, namespace, name)
_TOMBSTONES = 10_000
VERIFY_SECONDS = 60.0  # how often a held group of trials is checked against the apiserver
# The label that groups the held objects of a kind for ``list_``: a Pod by its run, a
# TrainingRun by its Sweep (a trial).
_GROUPED_BY = {k8s.PODS.plural: names.LABEL_RUN, k8s.TRAININGRUNS.plural: wire.LABEL_SWEEP}


def _version(obj: Mapping[str, Any]) -> int | None:
    text = (obj.get("metadata") or {}).get("resourceVersion")
    return int(text) if isinstance(text, str) and text.isdigit() else None


def _key(plural: str, obj: Mapping[str, Any]) -> _Key:
    meta = obj.get("metadata") or {}
    return plural, str(meta.get("namespace") or ""), str(meta.get("name") or "")


class _Held(NamedTuple):
    version: int | None
    group: str | None  # a Pod's run label, a trial's Sweep label (``_GROUPED_BY``)
    text: str  # the object (less its managedFields) as compact JSON
    at: float = 0.0  # when it was held (the reads' clock)

    def parse(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.text)
        return parsed


def _slim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object without its managedFields (nothing a reconcile reads; most of its size)."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {**obj, "metadata": meta}


class WatchedReads:
    """``context.K8s`` over ``inner``, with the reads above answered from held copies."""

    def __init__(
        self,
        inner: context.K8s,
        namespaces: tuple[str, ...] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.clock = clock
        self.namespaces = frozenset(namespaces)  # empty: every namespace is watched
        self.pods_listed = threading.Event()  # set by ``handlers`` once pod_watch listed
        # set by ``handlers`` once Kopf's TrainingRun watch listed every run (and each
        # listed run was handed here)
        self.runs_listed = threading.Event()
        self._lock = threading.Lock()
        self._objects: dict[_Key, _Held] = {}
        self._gone: dict[_Key, int | None] = {}  # deleted: the version it was deleted at
        # (plural, namespace, group label) -> names: a run's Pods, a Sweep's trials
        self._groups: dict[_Key, set[str]] = {}
        # Pods this operator asked to delete, by key: their uid (a namesake is another Pod)
        self._deleting: dict[_Key, str] = {}
        # (plural, namespace, group) of trials -> when the apiserver last listed them
        self._verified: dict[_Key, float] = {}

    # -- fed by the watches -------------------------------------------------------------

    def seen(self, res: k8s.Resource, type_: str | None, obj: Mapping[str, Any]) -> None:
        """A watch event of ``obj`` (a TrainingRun, an Environment or a Pod)."""
        with self._lock:
            if type_ == "DELETED":
                self._remove(res.plural, obj)
            else:
                self._put(res.plural, obj)

    def pods_seen(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        """A chunk of the Pod watch's events (on its thread)."""
        with self._lock:
            for type_, pod in events:
                if names.LABEL_RUN not in ((pod.get("metadata") or {}).get("labels") or {}):
                    continue
                if type_ == "DELETED":
                    self._remove(k8s.PODS.plural, pod)
                else:
                    self._put(k8s.PODS.plural, pod)

    def names(self, res: k8s.Resource, namespace: str) -> list[str]:
        """The names of the held objects of ``res`` (a TrainingRun or an Environment) in
        ``namespace``: those the watch delivered, for a handler that queues them."""
        with self._lock:
            return sorted(
                name
                for plural, ns, name in self._objects
                if plural == res.plural and ns == namespace
            )

    def held(self, res: k8s.Resource, namespace: str) -> list[dict[str, Any]]:
        """The held objects of ``res`` in ``namespace``, parsed, for a handler that picks
        which of them to queue."""
        with self._lock:
            return [
                obj.parse()
                for (plural, ns, _), obj in sorted(self._objects.items())
                if plural == res.plural and ns == namespace
            ]

    # -- context.K8s --------------------------------------------------------------------

    def get(self, res: k8s.Resource, namespace: str | None, name: str) -> dict[str, Any]:
        held = self._held(res, namespace, name)
        if held is not None:
            return held
        found = self.inner.get(res, namespace, name)
        self._answer(res, found)
        return found

    def get_or_none(
        self, res: k8s.Resource, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        held = self._held(res, namespace, name)
        if held is not None:
            return held
        found = self.inner.get_or_none(res, namespace, name)
        if found is not None:
            self._answer(res, found)
        return found

    def list_(
        self, res: k8s.Resource, namespace: str | None = None, **selectors: str | None
    ) -> list[dict[str, Any]]:
        """``k8s.list_`` (``label_selector``, ``field_selector``, passed on as they are): a
        run's Pods or a Sweep's trials from the held ones when they can answer, else the
        API's answer."""
        group = self._group_of(
            res, namespace, selectors.get("label_selector"), selectors.get("field_selector")
        )
        if group is None or namespace is None:
            return self.inner.list_(res, namespace, **selectors)
        key = (res.plural, namespace, group)
        if res.plural == k8s.TRAININGRUNS.plural and self._due(key):
            asked = self.clock()
            self._verify(res, key, asked, self.inner.list_(res, namespace, **selectors))
        with self._lock:
            members = sorted(self._groups.get(key, ()))
            return [self._objects[(res.plural, namespace, n)].parse() for n in members]

    def _due(self, key: _Key) -> bool:
        """Whether the held group ``key`` is to be checked against the apiserver now (a
        group first asked for counts as checked: the watch has just listed it)."""
        now = self.clock()
        with self._lock:
            last = self._verified.setdefault(key, now)
        return now - last >= VERIFY_SECONDS

    def _verify(
        self, res: k8s.Resource, key: _Key, asked: float, found: list[dict[str, Any]]
    ) -> None:
        """Set the held group ``key`` right by the apiserver's list of it, ``found`` (asked
        for at ``asked``): its objects held (newer copies win), and a member held since
        before the list was asked for that is not in it dropped, as a delete."""
        listed = {str((obj.get("metadata") or {}).get("name")) for obj in found}
        with self._lock:
            for obj in found:
                self._put(res.plural, obj)
            for name in sorted(self._groups.get(key, ())):
                held = self._objects[(res.plural, key[1], name)]
                if name not in listed and held.at < asked:
                    self._remove(res.plural, {"metadata": {"namespace": key[1], "name": name}})
            self._verified[key] = asked

    def apply(
        self, manifest: dict[str, Any], *, field_manager: str = k8s.FIELD_MANAGER, **kw: Any
    ) -> dict[str, Any]:
        answer = self.inner.apply(manifest, field_manager=field_manager, **kw)
        self._answer(k8s.resource_of(manifest), answer)
        return answer

    def apply_status(
        self, manifest: dict[str, Any], *, field_manager: str = k8s.FIELD_MANAGER
    ) -> dict[str, Any]:
        answer = self.inner.apply_status(manifest, field_manager=field_manager)
        self._answer(k8s.resource_of(manifest), answer)
        return answer

    def create(
        self, manifest: dict[str, Any], *, field_manager: str | None = None
    ) -> dict[str, Any]:
        answer = self.inner.create(manifest, field_manager=field_manager)
        self._answer(k8s.resource_of(manifest), answer)
        return answer

    def merge_patch(
        self, res: k8s.Resource, namespace: str | None, name: str, patch: dict[str, Any], **kw: Any
    ) -> dict[str, Any]:
        answer = self.inner.merge_patch(res, namespace, name, patch, **kw)
        self._answer(res, answer)
        return answer

    def delete(self, res: k8s.Resource, namespace: str | None, name: str, **kw: Any) -> bool:
        deleted = self.inner.delete(res, namespace, name, **kw)
        with self._lock:
            key = (res.plural, namespace or "", name)
            held = self._objects.get(key)
            if held is not None and res.plural == k8s.PODS.plural and deleted:
                # Being deleted (a grace period), as the apiserver holds it now; the
                # watch's DELETED removes it.
                obj = held.parse()
                obj["metadata"].setdefault("deletionTimestamp", _now())
                self._objects[key] = held._replace(text=_text(obj))
                if len(self._deleting) >= _TOMBSTONES:
                    for old in list(self._deleting)[: _TOMBSTONES // 2]:
                        del self._deleting[old]
                self._deleting[key] = str(obj["metadata"].get("uid") or "")
            elif held is not None:
                self._remove(res.plural, held.parse())
        return deleted

    def record_event(
        self, obj: dict[str, Any], type_: str, reason: str, message: str, *, now: str
    ) -> dict[str, Any] | None:
        return self.inner.record_event(obj, type_, reason, message, now=now)

    def pod_log_lines(self, namespace: str, pod: str, **kw: Any) -> Iterator[str]:
        return self.inner.pod_log_lines(namespace, pod, **kw)

    # -- inside -------------------------------------------------------------------------

    def _held(self, res: k8s.Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        if res.plural not in _HELD or not self._watches(namespace):
            return None
        with self._lock:
            held = self._objects.get((res.plural, namespace or "", name))
            return held.parse() if held is not None else None

    def _answer(self, res: k8s.Resource, answer: Mapping[str, Any] | None) -> None:
        """The apiserver's answer to a write or read: the object as it is now."""
        if not answer or (res.plural not in _HELD and res.plural != k8s.PODS.plural):
            return
        if res.plural == k8s.PODS.plural:
            labels = (answer.get("metadata") or {}).get("labels") or {}
            if names.LABEL_RUN not in labels:
                return
        if not self._watches((answer.get("metadata") or {}).get("namespace")):
            return
        with self._lock:
            self._put(res.plural, answer)

    def _watches(self, namespace: str | None) -> bool:
        return bool(namespace) and (not self.namespaces or namespace in self.namespaces)

    def _group_of(
        self,
        res: k8s.Resource,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None,
    ) -> str | None:
        """The run whose Pods, or the Sweep whose trials, ``list_`` asks for, when the
        held objects can answer it: the selector is that one label, and the watch that
        feeds them has listed them all."""
        label = _GROUPED_BY.get(res.plural)
        if label is None or field_selector or not label_selector:
            return None
        return _selected(label, label_selector) if self._listed(res, namespace) else None

    def _listed(self, res: k8s.Resource, namespace: str | None) -> bool:
        listed = self.pods_listed if res.plural == k8s.PODS.plural else self.runs_listed
        return listed.is_set() and self._watches(namespace)

    def _put(self, plural: str, obj: Mapping[str, Any]) -> None:
        key = _key(plural, obj)
        new = _version(obj)
        held = self._objects.get(key)
        if held is not None:
            old = held.version
            if new is None or old is None or new < old:
                return  # older than what is held (or not comparable: keep the held one)
        if key in self._gone:
            gone = self._gone[key]
            if gone is not None and (new is None or new <= gone):
                return  # a late event of an object already deleted
            del self._gone[key]
        if key in self._deleting:
            meta = obj.get("metadata") or {}
            if self._deleting[key] != str(meta.get("uid") or ""):
                del self._deleting[key]  # a new Pod of that name
            elif not meta.get("deletionTimestamp"):
                # An event that was on its way when this operator deleted the Pod: it
                # is still being deleted (its delete is not sent again).
                obj = {**obj, "metadata": {**meta, "deletionTimestamp": _now()}}
        group = _group(plural, obj)
        if held is not None and held.group != group:
            self._ungroup(plural, key, held.group)
        if group:
            self._groups.setdefault((plural, key[1], group), set()).add(key[2])
        self._objects[key] = _Held(new, group, _text(_slim(obj)), self.clock())

    def _remove(self, plural: str, obj: Mapping[str, Any]) -> None:
        key = _key(plural, obj)
        if len(self._gone) >= _TOMBSTONES:
            for old in list(self._gone)[: _TOMBSTONES // 2]:
                del self._gone[old]
        held = self._objects.get(key)
        deleted, kept = _version(obj), held.version if held is not None else None
        if deleted is not None and kept is not None and kept > deleted:
            # A namesake made after this one was deleted (a restarted gang's Pod the
            # operator's own write put here before the watch told of the old one's end)
            return
        self._objects.pop(key, None)
        self._deleting.pop(key, None)
        versions = [v for v in (_version(obj), held.version if held else None) if v is not None]
        self._gone[key] = max(versions) if versions else None
        if held is not None:
            self._ungroup(plural, key, held.group)

    def _ungroup(self, plural: str, key: _Key, group: str | None) -> None:
        if not group:
            return
        members = self._groups.get((plural, key[1], group), set())
        members.discard(key[2])
        if not members:
            self._groups.pop((plural, key[1], group), None)


def _group(plural: str, obj: Mapping[str, Any]) -> str | None:
    """The value of the label ``list_`` groups ``obj``'s kind by (None: none)."""
    label = _GROUPED_BY.get(plural)
    labels = (obj.get("metadata") or {}).get("labels") or {}
    value = labels.get(label) if label else None
    return str(value) if value else None


def _selected(label: str, selector: str) -> str | None:
    """The value ``selector`` asks ``label`` to have, when it asks only that
    (``label=value``); None for any other selector."""
    if not selector.startswith(f"{label}=") or "," in selector:
        return None
    value = selector[len(label) + 1 :]
    return value if value and not value.startswith("=") else None


def _text(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
