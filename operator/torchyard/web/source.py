"""Where the web view reads what it shows: one seam, :class:`RunSource`, and the source
over the live resources, :class:`LiveSource` (the caller's own kubeconfig, so the caller's
own RBAC; the run's archive in the registry service for metrics history and hang stacks).
A namespace's TrainingRuns come from an informer (``web.informers``: one list, then a
watch), so the runs list pages from memory.

Every page goes through a ``RunSource`` and nothing else; the run records that outlive
their TrainingRun, Sweep or Environment (``torchyard.records``) come through it too
(``record_page``, ``record``, ``record_metrics``): the registry service's records, read
with the same client (and so the same identity) as the run archives. Reads are synchronous (the
``torchyard.k8s`` client); the app runs them in its thread pool. Called by
``torchyard.web.views``; tested through the app in tests/unit/web/ (a source of test
data) and on the real control plane in tests/integration/web/.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar

from torchyard import k8s
from torchyard.launch.contract import NOT_METRICS, rank0_records
from torchyard.planning import admission
from torchyard.planning.pods import POOL_LABEL
from torchyard.records import BadQuery, Page, Query, Record
from torchyard.sdk import endpoints as endpoint_sdk
from torchyard.sdk import runs, suspension
from torchyard.sdk import sweeps as sweep_sdk
from torchyard.sdk.registry import RegistryClient, RegistryError
from torchyard.web import informers

Obj = dict[str, Any]
T = TypeVar("T")
# The archived files of a run the view reads: logs/node-N/metrics.jsonl and
# logs/node-N/stacks/rank-R.pid-P.txt (``launch.tracker``, ``launch.stalls``).
METRICS_FILE = "metrics.jsonl"
STACKS_FOLDER = "stacks"
ARCHIVE_BYTES = 32 << 20  # at most this much of one archived file is read
ARCHIVE_TTL = 30.0  # seconds a run's archive, read and parsed, is reused (charts, reloads)


class Unavailable(Exception):
    """What the source could not read, and why (shown on the page, never a crash)."""


NO_REGISTRY = "no registry service configured"


class ArchivedFile(NamedTuple):
    """A file of a run's archive: its path there (``outputs/...``, ``logs/node-N/...``)
    and its size in bytes (None when the registry lists no sizes)."""

    path: str
    size: int | None


@dataclass
class Archive:
    """What a run's archive in the registry holds for the view."""

    metrics: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    stacks: dict[str, str] = field(default_factory=dict)  # "node-0/rank-1.pid-7.txt" -> text
    files: list[ArchivedFile] = field(default_factory=list)  # outputs first, then logs
    note: str = ""  # why there is none (no registry, refused, not archived yet)
    owner: str = ""  # the uid of the run the files are of ('' when the registry cannot tell)


@dataclass
class Download:
    """An archived file being read from the registry: ``read(n)`` until ``b""``, then
    ``close()``."""

    size: int | None
    read: Callable[[int], bytes]
    close: Callable[[], None]


@dataclass
class Queue:
    """The pools, their room and the gangs that wait in them."""

    pools: list[dict[str, Any]]
    waiting: list[Obj]  # Queued runs, by pool then place
    note: str = ""  # what could not be read (nodes, other namespaces' Pods)


class RunSource(Protocol):
    """What the pages read. Names are checked (``views.name``) before they get here."""

    def runs(self, namespace: str) -> list[Obj]: ...
    def run(self, namespace: str, name: str) -> Obj | None: ...
    def pods(self, namespace: str, name: str) -> list[Obj]: ...
    def events(self, run: Obj) -> list[Obj]: ...
    def log_tail(self, namespace: str, pod: str, lines: int) -> list[str]: ...
    def archive(self, namespace: str, name: str, uid: str | None = None) -> Archive: ...
    def archived_file(
        self, namespace: str, name: str, path: str, uid: str | None = None
    ) -> Download: ...
    def sweeps(self, namespace: str) -> list[Obj]: ...
    def sweep(self, namespace: str, name: str) -> tuple[Obj, list[sweep_sdk.Trial]] | None: ...
    def models(self, namespace: str) -> list[Obj]: ...
    def environments(self, namespace: str) -> list[Obj]: ...
    def environment(self, namespace: str, name: str) -> Obj | None: ...
    def endpoints(self, namespace: str) -> list[Obj]: ...
    def endpoint(self, namespace: str, name: str) -> tuple[Obj, list[Obj]] | None: ...
    def build_log(self, namespace: str, job: str, lines: int) -> list[str]: ...
    def queue(self, namespace: str) -> Queue: ...
    def act(self, namespace: str, kind: str, name: str, action: str) -> None: ...
    # the records of what ended (Unavailable: no registry, or it refused, and why)
    def record_page(self, namespace: str, query: Query) -> Page: ...
    def record(self, namespace: str, name: str, uid: str | None, kind: str) -> Record | None: ...
    def record_metrics(self, namespace: str, name: str, uid: str) -> list[str]: ...


class LiveSource:
    """The live resources through ``torchyard.k8s`` (the configured client: the caller's
    kubeconfig), and the run archives through ``registry(namespace)`` (None: no registry)."""

    def __init__(self, registry: Callable[[str], RegistryClient | None] | None = None) -> None:
        self.registry = registry
        self.informers = informers.Informers()
        self._archives: dict[tuple[str, str, str | None], tuple[float, Archive]] = {}
        self._lock = threading.Lock()

    def runs(self, namespace: str) -> list[Obj]:
        """From the namespace's informer (a list, then a watch): current within a moment."""
        return self.informers.runs(namespace)

    def run(self, namespace: str, name: str) -> Obj | None:
        return k8s.get_or_none(k8s.TRAININGRUNS, namespace, name)

    def pods(self, namespace: str, name: str) -> list[Obj]:
        return runs.node_pods(namespace, name)

    def events(self, run: Obj) -> list[Obj]:
        return runs.events(run)

    def log_tail(self, namespace: str, pod: str, lines: int) -> list[str]:
        return list(k8s.pod_log_lines(namespace, pod, container="trainer", tail_lines=lines))

    def archive(self, namespace: str, name: str, uid: str | None = None) -> Archive:
        """The run's archive (``uid``: of the run of that uid, wherever the registry keeps
        it), read (and its metrics parsed) once per :data:`ARCHIVE_TTL`."""
        key = (namespace, name, uid)
        with self._lock:
            cached = self._archives.get(key)
        if cached and time.monotonic() - cached[0] < ARCHIVE_TTL:
            return cached[1]
        found = self._read_archive(namespace, name, uid)
        with self._lock:
            if len(self._archives) > 256:
                self._archives.clear()
            self._archives[key] = (time.monotonic(), found)
        return found

    def _read_archive(self, namespace: str, name: str, uid: str | None) -> Archive:
        try:
            client = self.registry(namespace) if self.registry else None
            if client is None:
                return Archive(note=NO_REGISTRY)
            entries, owner = client.run_archive(namespace, name, uid)
            found = Archive(files=[ArchivedFile(*f) for f in entries], owner=owner)
            found.files.sort(key=lambda f: (not f.path.startswith("outputs/"), f.path))
            for path, _ in entries:
                parts = path.split("/")
                if parts[-1] == METRICS_FILE and parts[0] == "logs":
                    text = client.read_run_file(namespace, name, path, uid)
                    add_metrics(found.metrics, text)
                elif len(parts) == 4 and parts[0] == "logs" and parts[2] == STACKS_FOLDER:
                    text = client.read_run_file(namespace, name, path, uid)
                    found.stacks["/".join(parts[1:])] = text[:ARCHIVE_BYTES]
        except RegistryError as err:
            return Archive(note=f"the run's archive: {err}")
        except (k8s.ApiError, k8s.Unreachable) as err:
            return Archive(note=f"the run's archive: {_why(err)}")
        return found

    def archived_file(
        self, namespace: str, name: str, path: str, uid: str | None = None
    ) -> Download:
        """A file the run's archive lists (:meth:`archive`: nothing else is asked of the
        registry), to stream; Unavailable when it is not there or cannot be read."""
        if path not in {f.path for f in self.archive(namespace, name, uid).files}:
            raise Unavailable(f"the archive of run {name} has no file {path[:200]!r}")
        try:
            client = self.registry(namespace) if self.registry else None
            if client is None:
                raise Unavailable(NO_REGISTRY)
            answer = client.open_run_file(namespace, name, path, uid)
        except RegistryError as err:
            raise Unavailable(f"{path[:200]}: {str(err)[:300]}") from None
        except (k8s.ApiError, k8s.Unreachable) as err:
            raise Unavailable(f"{path[:200]}: {_why(err)[:300]}") from None
        length = answer.headers.get("Content-Length")
        size = int(length) if length and length.isdigit() else None
        return Download(size, answer.read, answer.close)

    def record_page(self, namespace: str, query: Query) -> Page:
        """A page of the namespace's records (``query``: its kind, filters and size)."""
        return self._records(namespace, lambda c: c.page(namespace, query))

    def record(self, namespace: str, name: str, uid: str | None, kind: str) -> Record | None:
        """The record of ``name`` (its newest, or the one of ``uid``), None when none."""
        return self._records(namespace, lambda c: c.get_record(namespace, name, uid, kind=kind))

    def record_metrics(self, namespace: str, name: str, uid: str) -> list[str]:
        return self._records(namespace, lambda c: c.metrics_lines(namespace, name, uid))

    def _records(self, namespace: str, fn: Callable[[RegistryClient], T]) -> T:
        """``fn`` of the namespace's registry client; what goes wrong is Unavailable."""
        try:
            client = self.registry(namespace) if self.registry else None
            if client is None:
                raise Unavailable(NO_REGISTRY)
            return fn(client)
        except (RegistryError, BadQuery) as err:
            raise Unavailable(str(err)[:300]) from None
        except (k8s.ApiError, k8s.Unreachable) as err:
            raise Unavailable(_why(err)[:300]) from None

    def sweeps(self, namespace: str) -> list[Obj]:
        return sweep_sdk.list_(namespace)

    def sweep(self, namespace: str, name: str) -> tuple[Obj, list[sweep_sdk.Trial]] | None:
        try:
            return sweep_sdk.trials(namespace, name)
        except sweep_sdk.SweepNotFound:
            return None

    def models(self, namespace: str) -> list[Obj]:
        return k8s.list_(k8s.MODELVERSIONS, namespace)

    def environments(self, namespace: str) -> list[Obj]:
        return k8s.list_(k8s.ENVIRONMENTS, namespace)

    def environment(self, namespace: str, name: str) -> Obj | None:
        return k8s.get_or_none(k8s.ENVIRONMENTS, namespace, name)

    def endpoints(self, namespace: str) -> list[Obj]:
        return endpoint_sdk.list_endpoints(namespace)

    def endpoint(self, namespace: str, name: str) -> tuple[Obj, list[Obj]] | None:
        """The OnlineEndpoint and its serving Pods, None when there is none."""
        try:
            return endpoint_sdk.get(namespace, name), endpoint_sdk.pods(namespace, name)
        except endpoint_sdk.EndpointNotFound:
            return None

    def build_log(self, namespace: str, job: str, lines: int) -> list[str]:
        """The tail of the newest Pod of an Environment's build Job ([] when none is left)."""
        pods = k8s.list_(k8s.PODS, namespace, label_selector=f"job-name={job}")
        if not pods:
            return []
        newest = max(pods, key=lambda p: str(p["metadata"].get("creationTimestamp", "")))
        name = newest["metadata"]["name"]
        return list(k8s.pod_log_lines(namespace, name, tail_lines=lines))

    def queue(self, namespace: str) -> Queue:
        waiting = [r for r in self.runs(namespace) if (r.get("status") or {}).get("queue")]
        notes = []
        try:
            nodes = k8s.list_(k8s.NODES)
        except k8s.ApiError as err:
            nodes, notes = [], [f"nodes: {_why(err)}"]
        try:
            pods = k8s.list_(k8s.PODS, None)
        except k8s.ApiError as err:  # the free room then counts this namespace's Pods only
            pods = k8s.list_(k8s.PODS, namespace)
            notes.append(f"Pods of other namespaces: {_why(err)}; free room counts {namespace}'s")
        return Queue(pools(nodes, pods, waiting), sorted(waiting, key=_place), "; ".join(notes))

    def act(self, namespace: str, kind: str, name: str, action: str) -> None:
        """suspend/resume a TrainingRun, cancel a Sweep: as the caller (the API says 403
        when the caller may not)."""
        if kind == "runs" and action in ("suspend", "resume"):
            suspension.set_suspend(namespace, name, action == "suspend")
        elif kind == "sweeps" and action == "cancel":
            sweep_sdk.cancel(namespace, name)
        else:
            raise ValueError(f"no action {action!r} on {kind}")


def add_metrics(into: dict[str, list[tuple[float, float]]], text: str) -> None:
    """The numeric values of every ``metrics.jsonl`` record of ``text`` (one node's),
    by metric name: (step, value); rank 0's (or the rank-less records) only, as the
    status's progress keeps them."""
    for record in rank0_records(text):
        step = record.get("step")
        if not isinstance(step, (int, float)) or isinstance(step, bool):
            continue
        for key, value in record.items():
            if key in NOT_METRICS:
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                into.setdefault(key, []).append((float(step), float(value)))
    for points in into.values():
        points.sort()


def pools(nodes: list[Obj], pods: list[Obj], waiting: list[Obj]) -> list[dict[str, Any]]:
    """Each pool (the nodes' pool label; "" for unlabelled nodes): its Ready nodes, their
    allocatable and free room (``planning.admission.free_nodes``), and the runs waiting."""
    label = POOL_LABEL
    capacity = {n.name: n.free for n in admission.free_nodes(nodes, [])}
    free = {n.name: n.free for n in admission.free_nodes(nodes, pods)}
    out: dict[str, dict[str, Any]] = {}
    for node in nodes:
        name = node["metadata"]["name"]
        pool = (node["metadata"].get("labels") or {}).get(label, "")
        row = out.setdefault(pool, {"pool": pool, "nodes": 0, "ready": 0, "total": {}, "free": {}})
        row["nodes"] += 1
        if name in capacity:
            row["ready"] += 1
            for key, value in capacity[name].items():
                row["total"][key] = row["total"].get(key, 0) + value
            for key, value in free[name].items():
                row["free"][key] = row["free"].get(key, 0) + value
    for run in waiting:
        pool = (run.get("status") or {}).get("queue", {}).get("pool", "")
        out.setdefault(pool, {"pool": pool, "nodes": 0, "ready": 0, "total": {}, "free": {}})
        out[pool]["waiting"] = out[pool].get("waiting", 0) + 1
    return [out[k] for k in sorted(out)]


def waiting_reason(run: Obj) -> str:
    """Why a Queued run waits: its Admitted condition's message (the admission pass's
    numbers: what it needs, how many fit now, whom it waits behind)."""
    for cond in (run.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Admitted" and cond.get("status") != "True":
            return str(cond.get("message") or cond.get("reason") or "")
    return ""


def _place(run: Obj) -> tuple[str, int, str]:
    queue = (run.get("status") or {}).get("queue") or {}
    return (str(queue.get("pool", "")), int(queue.get("position") or 1 << 30), _name(run))


def _name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def _why(err: Exception) -> str:
    return err.message if isinstance(err, k8s.ApiError) else str(err)
