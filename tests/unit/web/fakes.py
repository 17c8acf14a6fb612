"""A :class:`~torchyard.web.source.RunSource` of test data for the web view's unit tests
(the seam is ours; the real source is tested on the real control plane in
tests/integration/web/)."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

from torchyard import k8s
from torchyard.records import FolderRecords, Page, Query, Record
from torchyard.sdk import sweeps as sweep_sdk
from torchyard.web import source

Obj = dict[str, Any]
SCRIPT = '<script>alert("x")</script>'
FAILURE = {  # a failed run's status.failure, its traceback with markup in it
    "rank": 3,
    "node": 1,
    "exitCode": 1,
    "class": "UserError",
    "advice": "fix the script",
    "message": f"Traceback ...\nValueError: {SCRIPT}",
}


def run(name: str, ns: str = "team-a", phase: str = "Running", **extra: Any) -> Obj:
    status = {"phase": phase, **extra.pop("status", {})}
    labels = extra.pop("labels", {})
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "labels": labels,
            "creationTimestamp": extra.pop("created", "2026-11-27T10:00:00Z"),
        },
        "spec": {"environment": "pytorch", "command": ["python", "train.py"], **extra},
        "status": status,
    }


def endpoint(name: str, ns: str = "team-a") -> Obj:
    """A Degraded endpoint: version 2 serves, version 3's init() raised (markup in it)."""
    return {
        "metadata": {"name": name, "namespace": ns},
        "spec": {"model": {"uri": "model://birds/3"}, "traffic": {"2": 90, "3": 10}},
        "status": {
            "phase": "Degraded",
            "model": {"name": "birds", "version": 3},
            "scoringUri": f"http://{name}.{ns}.svc/score",
            "replicas": 2,
            "readyReplicas": 1,
            "versions": [
                {
                    "version": 2,
                    "percent": 50,
                    "deployment": f"{name}-canary",
                    "replicas": 1,
                    "readyReplicas": 1,
                },
                {
                    "version": 3,
                    "percent": 50,
                    "deployment": name,
                    "replicas": 1,
                    "readyReplicas": 0,
                },
            ],
            "failure": {
                "class": "PythonException",
                "exception": "KeyError",
                "reason": "InitFailed",
                "advice": "fix the scoring script",
                "pod": f"{name}-7d-x",
                "version": 3,
                "restarts": 4,
                "message": f"Traceback ...\nKeyError: {SCRIPT}",
            },
        },
    }


def pod(run_name: str, node: int, ns: str = "team-a", state: str = "Running") -> Obj:
    done = {"terminated": {"exitCode": 1}} if state == "Failed" else {}
    return {
        "metadata": {
            "name": f"{run_name}-node-{node}",
            "namespace": ns,
            "labels": {"torchyard.dev/run": run_name, "torchyard.dev/node-rank": str(node)},
            "creationTimestamp": "2026-11-27T10:00:01Z",
        },
        "spec": {"nodeName": f"kwok-{node}"},
        "status": {"phase": state, "containerStatuses": [{"restartCount": 1, "state": done}]},
    }


@dataclass
class FakeSource:
    """Objects by namespace; ``forbidden`` namespaces answer as the apiserver does to a
    caller without RBAC there (403)."""

    objects: dict[str, list[Obj]] = field(default_factory=dict)
    pods_of: dict[str, list[Obj]] = field(default_factory=dict)
    logs: dict[str, list[str]] = field(default_factory=dict)
    archives: dict[Any, source.Archive] = field(default_factory=dict)  # name, or (name, uid)
    archive_uids: list[str | None] = field(default_factory=list)  # the uids asked for
    contents: dict[tuple[str, str], bytes] = field(default_factory=dict)  # (run, path) -> bytes
    forbidden: set[str] = field(default_factory=set)
    acted: list[tuple[str, str, str, str]] = field(default_factory=list)
    records: FolderRecords | None = None  # (the real folder reader; None: no registry)
    endpoints_of: dict[str, list[Obj]] = field(default_factory=dict)  # namespace -> them

    def _check(self, ns: str) -> None:
        if ns in self.forbidden:
            raise k8s.ApiError(
                403, "Forbidden", f'trainingruns is forbidden: cannot list in namespace "{ns}"'
            )

    def runs(self, namespace: str) -> list[Obj]:
        self._check(namespace)
        return [
            o
            for o in self.objects.get(namespace, [])
            if "spec" in o and "objective" not in o["spec"]
        ]

    def run(self, namespace: str, name: str) -> Obj | None:
        return next((r for r in self.runs(namespace) if r["metadata"]["name"] == name), None)

    def pods(self, namespace: str, name: str) -> list[Obj]:
        self._check(namespace)
        return self.pods_of.get(name, [])

    def events(self, run: Obj) -> list[Obj]:
        return [
            {"type": "Normal", "reason": "Created", "message": f"made {run['metadata']['name']}"}
        ]

    def log_tail(self, namespace: str, pod: str, lines: int) -> list[str]:
        self._check(namespace)
        return self.logs.get(pod, [])[-lines:]

    def archive(self, namespace: str, name: str, uid: str | None = None) -> source.Archive:
        """``archives`` by (name, uid) for an archive of one run, else by name."""
        self._check(namespace)
        self.archive_uids.append(uid)
        kept = self.archives.get((name, uid)) if uid else None
        return kept or self.archives.get(name, source.Archive(note=source.NO_REGISTRY))

    def archived_file(
        self, namespace: str, name: str, path: str, uid: str | None = None
    ) -> source.Download:
        """As the live source: only a file the archive lists, its bytes from
        ``contents``."""
        self._check(namespace)
        if path not in {f.path for f in self.archive(namespace, name, uid).files}:
            raise source.Unavailable(f"the archive of run {name} has no file {path[:200]!r}")
        data = io.BytesIO(self.contents[(name, path)])
        return source.Download(len(data.getvalue()), data.read, data.close)

    def sweeps(self, namespace: str) -> list[Obj]:
        self._check(namespace)
        return [o for o in self.objects.get(namespace, []) if "objective" in o.get("spec", {})]

    def sweep(self, namespace: str, name: str) -> tuple[Obj, list[sweep_sdk.Trial]] | None:
        found = [s for s in self.sweeps(namespace) if s["metadata"]["name"] == name]
        return (found[0], sweep_sdk.trials_of(found[0], None)) if found else None

    def models(self, namespace: str) -> list[Obj]:
        self._check(namespace)
        return []

    def environments(self, namespace: str) -> list[Obj]:
        self._check(namespace)
        return []

    def environment(self, namespace: str, name: str) -> Obj | None:
        self._check(namespace)
        return None

    def endpoints(self, namespace: str) -> list[Obj]:
        self._check(namespace)
        return self.endpoints_of.get(namespace, [])

    def endpoint(self, namespace: str, name: str) -> tuple[Obj, list[Obj]] | None:
        found = [e for e in self.endpoints(namespace) if e["metadata"]["name"] == name]
        return (found[0], self.pods_of.get(name, [])) if found else None

    def build_log(self, namespace: str, job: str, lines: int) -> list[str]:
        return []

    def queue(self, namespace: str) -> source.Queue:
        waiting = [r for r in self.runs(namespace) if r["status"].get("queue")]
        return source.Queue([], waiting, "")

    def act(self, namespace: str, kind: str, name: str, action: str) -> None:
        self._check(namespace)
        self.acted.append((namespace, kind, name, action))

    def _records(self, namespace: str) -> FolderRecords:
        self._check(namespace)
        if self.records is None:
            raise source.Unavailable(source.NO_REGISTRY)
        return self.records

    def record_page(self, namespace: str, query: Query) -> Page:
        return self._records(namespace).page(namespace, query)

    def record(self, namespace: str, name: str, uid: str | None, kind: str) -> Record | None:
        return self._records(namespace).get_record(namespace, name, uid, kind=kind)

    def record_metrics(self, namespace: str, name: str, uid: str) -> list[str]:
        return self._records(namespace).metrics_lines(namespace, name, uid)
