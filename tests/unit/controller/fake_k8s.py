"""An in-memory stand-in of ``torchyard.k8s``, the facade the reconcilers call.

It keeps objects by (resource, namespace, name) and records every write: status
applies, applied manifests, deletions and Events, in order, so that a test reads what
one reconcile did. Label selectors (``key=value`` or ``key``) and the field selectors
the controller uses (``status.phase!=...``, ``spec.nodeName=...``, ``metadata.name=...``)
are honoured.
An apply by another field manager than torchyard's own (a Sweep's decision on a trial) is
merged into the object, as server-side apply merges what two managers own.
``refuse`` makes the next applies of a kind answer with an :class:`k8s.ApiError`, as
the apiserver's admission would. Passed to the reconcilers as ``Context(k8s=fake)``
(kopf tests its handlers the same way, on the level of its own API wrappers).
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Iterator
from typing import Any

from torchyard import k8s

Stored = tuple[str, str | None, str]  # (plural, namespace, name)


class FakeK8s:
    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects: dict[Stored, dict[str, Any]] = {}
        self.statuses: list[dict[str, Any]] = []  # every status apply's manifest
        self.applied: list[dict[str, Any]] = []  # every (non-status) apply's manifest
        self.posted: list[str] = []  # the names created by POST (they are in applied too)
        self.deleted: list[tuple[str, str]] = []  # (kind plural, name)
        self.patched: list[tuple[str, str, dict[str, Any]]] = []  # merge patches
        self.events: list[tuple[str, str, str]] = []  # (type, reason, message)
        self.refusals: dict[str, k8s.ApiError] = {}  # kind -> the error its apply raises
        self.logs: dict[str, list[str]] = {}  # Pod name -> its log lines (pod_log_lines)
        self.log_reads: list[str] = []  # the Pods whose log was read, in order
        self.log_bytes = 0  # how much of them was read
        self.silent_kubelets: set[str] = set()  # Pods whose log read times out (Unreachable)
        self._lock = threading.Lock()
        self._uids = itertools.count(1)
        for obj in objects:
            self.put(obj)

    # -- test helpers -------------------------------------------------------------------

    def put(self, obj: dict[str, Any], res: k8s.Resource | None = None) -> dict[str, Any]:
        """Store ``obj`` as the apiserver would hold it (no writes recorded); ``res`` for a
        kind torchyard does not manage (a Kueue LocalQueue)."""
        if res is None and obj.get("kind") == "LocalQueue":
            res = k8s.local_queues(obj["apiVersion"].rpartition("/")[2])
        res = res or k8s.resource_of(obj)
        meta = obj["metadata"]
        self.objects[
            (res.plural, meta.get("namespace") if res.namespaced else None, meta["name"])
        ] = copy.deepcopy(obj)
        return obj

    def refuse(self, kind: str, status: int, reason: str, message: str) -> None:
        self.refusals[kind] = k8s.ApiError(status, reason, message)

    def pods(self) -> list[dict[str, Any]]:
        return [o for (plural, _, _), o in self.objects.items() if plural == "pods"]

    def pod_names(self) -> list[str]:
        return sorted(p["metadata"]["name"] for p in self.pods())

    def reset_writes(self) -> None:
        self.statuses.clear()
        self.applied.clear()
        self.posted.clear()
        self.deleted.clear()
        self.patched.clear()
        self.events.clear()

    # -- the facade ---------------------------------------------------------------------

    def _key(self, res: k8s.Resource, namespace: str | None, name: str) -> Stored:
        return (res.plural, namespace if res.namespaced else None, name)

    def get(self, res: k8s.Resource, namespace: str | None, name: str) -> dict[str, Any]:
        found = self.get_or_none(res, namespace, name)
        if found is None:
            raise k8s.ApiError(404, "NotFound", f'{res.plural} "{name}" not found')
        return found

    def get_or_none(
        self, res: k8s.Resource, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        with self._lock:
            found = self.objects.get(self._key(res, namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def list_(
        self,
        res: k8s.Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        with self._lock:
            items = [
                copy.deepcopy(o)
                for (plural, ns, _), o in self.objects.items()
                if plural == res.plural and (namespace is None or ns == namespace)
            ]
        return [
            o
            for o in items
            if _labels_match(o, label_selector) and _fields_match(o, field_selector)
        ]

    def apply(
        self, manifest: dict[str, Any], *, field_manager: str = "", subresource: str = ""
    ) -> dict[str, Any]:
        refusal = self.refusals.get(manifest["kind"])
        if refusal is not None:
            raise refusal
        res = k8s.resource_of(manifest)
        key = self._key(res, manifest["metadata"].get("namespace"), manifest["metadata"]["name"])
        with self._lock:
            self.applied.append(copy.deepcopy(manifest))
            old = self.objects.get(key)
            new = copy.deepcopy(manifest)
            if old is not None and field_manager not in ("", k8s.FIELD_MANAGER):
                # another field manager's apply: the fields it sets, merged into the rest
                new = _merged(old, new)
            elif old is not None:
                new["metadata"] = {**old["metadata"], **new["metadata"]}
                if old.get("status") is not None:
                    new.setdefault("status", old["status"])
            else:
                new["metadata"].setdefault("uid", f"uid-{next(self._uids)}")
                new["metadata"].setdefault("creationTimestamp", "2026-01-01T12:00:00Z")
                new["metadata"]["generation"] = 1
            if manifest["kind"] == "Pod":
                new.setdefault("status", {"phase": "Pending"})
            self.objects[key] = new
            return copy.deepcopy(new)

    def create(
        self, manifest: dict[str, Any], *, field_manager: str | None = None
    ) -> dict[str, Any]:
        res = k8s.resource_of(manifest)
        key = self._key(res, manifest["metadata"].get("namespace"), manifest["metadata"]["name"])
        if key in self.objects:
            raise k8s.ApiError(409, "AlreadyExists", f"{res.plural} already exists")
        self.posted.append(manifest["metadata"]["name"])
        return self.apply(manifest)

    def apply_status(self, manifest: dict[str, Any], *, field_manager: str = "") -> dict[str, Any]:
        res = k8s.resource_of(manifest)
        key = self._key(res, manifest["metadata"].get("namespace"), manifest["metadata"]["name"])
        with self._lock:
            self.statuses.append(copy.deepcopy(manifest))
            stored = self.objects.get(key)
            if stored is None:
                raise k8s.ApiError(404, "NotFound", f"{res.plural} not found")
            stored["status"] = copy.deepcopy(manifest["status"])
            return copy.deepcopy(stored)

    def merge_patch(
        self,
        res: k8s.Resource,
        namespace: str | None,
        name: str,
        patch: dict[str, Any],
        *,
        subresource: str = "",
    ) -> dict[str, Any]:
        """RFC 7386 over the stored object (recorded in ``patched``); a
        ``metadata.resourceVersion`` that is not the stored one answers 409."""
        key = self._key(res, namespace, name)
        with self._lock:
            self.patched.append((res.plural, name, copy.deepcopy(patch)))
            stored = self.objects.get(key)
            if stored is None:
                raise k8s.ApiError(404, "NotFound", f"{res.plural} not found")
            want = (patch.get("metadata") or {}).get("resourceVersion")
            have = stored["metadata"].get("resourceVersion")
            if want is not None and have is not None and want != have:
                raise k8s.ApiError(409, "Conflict", "the object has been modified")
            self.objects[key] = _merge_patched(stored, patch)
            return copy.deepcopy(self.objects[key])

    def delete(
        self,
        res: k8s.Resource,
        namespace: str | None,
        name: str,
        *,
        propagation: str = "Background",
        grace_period_seconds: int | None = None,
    ) -> bool:
        with self._lock:
            self.deleted.append((res.plural, name))
            return self.objects.pop(self._key(res, namespace, name), None) is not None

    def record_event(
        self, obj: dict[str, Any], type_: str, reason: str, message: str, *, now: str
    ) -> dict[str, Any] | None:
        with self._lock:
            self.events.append((type_, reason, message))
        return None

    def pod_log_lines(
        self,
        namespace: str,
        pod: str,
        *,
        container: str | None = None,
        follow: bool = False,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
        timeout: float = 60,
    ) -> Iterator[str]:
        """The lines set in ``logs[pod]`` (the last ``tail_lines``, then as many of
        those as fit ``limit_bytes``, as the kubelet counts them), counted in
        ``log_reads`` and ``log_bytes``; a Pod without any answers as a kubelet without
        the log would."""
        with self._lock:
            self.log_reads.append(pod)
            lines = self.logs.get(pod)
            silent = pod in self.silent_kubelets
        if silent:
            raise k8s.Unreachable(f"the kubelet of {pod} did not answer within {timeout}s")
        if lines is None:
            raise k8s.ApiError(400, "BadRequest", f"container {container} has no log")
        lines = lines[-tail_lines:] if tail_lines else lines
        text = "".join(f"{line}\n" for line in lines).encode()[:limit_bytes]
        with self._lock:
            self.log_bytes += len(text)
        yield from text.decode("utf-8", "replace").splitlines()


def _merge_patched(target: Any, patch: Any) -> Any:
    """RFC 7386: a mapping merges key by key, None removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge_patched(out.get(key), value)
    return out


def _merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(old)
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _labels_match(obj: dict[str, Any], selector: str | None) -> bool:
    labels = obj["metadata"].get("labels", {})
    for term in (selector or "").split(","):
        if not term:
            continue
        key, _, value = term.partition("=")
        if key not in labels or ("=" in term and labels[key] != value):
            return False
    return True


def _fields_match(obj: dict[str, Any], selector: str | None) -> bool:
    values = {
        "status.phase": obj.get("status", {}).get("phase"),
        "spec.nodeName": obj.get("spec", {}).get("nodeName"),
        "metadata.name": obj.get("metadata", {}).get("name"),
        "involvedObject.name": (obj.get("involvedObject") or {}).get("name"),
        "involvedObject.uid": (obj.get("involvedObject") or {}).get("uid"),
    }
    for term in (selector or "").split(","):
        if not term:
            continue
        if "!=" in term:
            key, value = term.split("!=", 1)
            if values[key] == value:
                return False
        else:
            key, value = term.split("=", 1)
            if values[key] != value:
                return False
    return True
