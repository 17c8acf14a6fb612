"""Where records live and how they are read: the :class:`Records` protocol (the seam the
CLI and the web view read through), its query (:class:`Query`: filters and paging, pure),
and :class:`FolderRecords`, the registry's folder tree.

Layout, beside the run archives under the registry's root (a PVC in the cluster,
``~/.torchyard/registry`` in local mode)::

    <namespace>/records/<kinds>/<name>/<uid>/record.json    the whole record
    <namespace>/records/<kinds>/<name>/<uid>/summary.json   what listings read
    <namespace>/records/<kinds>/<name>/<uid>/metrics.jsonl  every metric report
    <namespace>/records/<kinds>/.index.jsonl                the summaries, for listings

``<kinds>`` is ``trainingruns``, ``sweeps`` or ``environments``. A record is keyed by its
object's uid, so writing it again (an operator restart) replaces it with the same, and a
name used again after a deletion gets a folder of its own; the newest by creation time is
the name's default. A record folder is written beside its destination and renamed into
place, so a reader never sees half of one.

Two implementations of :class:`Records` (an abstract class: its ``list_records`` is the
one signature, each implementation reads a :class:`Query`'s page): :class:`FolderRecords`
(local mode, and the registry service's own routes, ``registry.records``) and the registry
service's HTTP client (``registry.client.RegistryClient``). Tested in tests/unit/records/.
"""

from __future__ import annotations

import abc
import base64
import binascii
import contextlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from torchyard.api import times
from torchyard.launch.contract import PROGRESS_TEXT
from torchyard.records import build, index
from torchyard.records.schema import KINDS, Kind, Record, Summary, summary_of

RECORD = "record.json"
SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
DEFAULT_LIMIT = 50
MAX_LIMIT = 500  # the largest page
MAX_RECORD_BYTES = 4 << 20  # a record's JSON (the builder keeps it far smaller)
MAX_METRICS_BYTES = 64 << 20  # metric reports kept per run (the first ones, past it)
TMP_PREFIX = ".tmp-"  # (the registry store's own: its start-up sweeps them)
NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a DNS-1123 subdomain
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
PHASE = re.compile(r"[A-Z][A-Za-z]{0,31}")
_LABEL_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_./]{0,315}[A-Za-z0-9])?")
_REQUIREMENT = re.compile(r"\s*(!?)\s*([^=!\s]+)\s*(?:(==|=|!=)\s*([^=!,\s]*))?\s*")


class BadQuery(ValueError):
    """A query or a name a reader refuses; the message says which part and why."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "exists", "!exists"
    value: str = ""

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "=":
            return labels.get(self.key) == self.value
        return labels.get(self.key) != self.value


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """An equality-based label selector (``a=b,c!=d,e,!f``), as kubectl takes it."""
    if len(text) > 1024:
        raise BadQuery("labelSelector: longer than 1024 characters")
    out = []
    for part in (p for p in text.split(",") if p.strip()):
        m = _REQUIREMENT.fullmatch(part)
        if m is None:
            raise BadQuery(f"labelSelector: {part!r} is not key, !key, key=value or key!=value")
        bang, key, op, value = m.groups()
        if not _LABEL_PART.fullmatch(key) or (value and not _LABEL_PART.fullmatch(value)):
            raise BadQuery(f"labelSelector: {part!r} holds a character a label cannot")
        if bang and op:
            raise BadQuery(f"labelSelector: {part!r}: '!' goes with a bare key")
        kind = ("!exists" if bang else "exists") if not op else ("!=" if op == "!=" else "=")
        out.append(Requirement(key, kind, value or ""))
    return tuple(out)


def parse_time(text: str) -> datetime:
    """An RFC 3339 time (``2026-01-01T12:00:00Z``), aware."""
    try:
        when = times.parse_time(text)
    except ValueError:
        when = None
    if when is None:
        raise BadQuery(f"since: {text[:40]!r} is not a time such as 2026-01-01T12:00:00Z")
    return when


Key = tuple[str, str, str, str]


def _key(s: Mapping[str, Any]) -> Key:
    """Newest first: by creation time (whole seconds), then by when the record was written
    (microseconds: a name created again within the same second), then name and uid."""
    return tuple(str(s.get(k) or "") for k in ("created", "recorded", "name", "uid"))  # type: ignore[return-value]


def _token(key: Key) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def _untoken(token: str) -> Key:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        key = json.loads(raw)
    except (binascii.Error, ValueError):
        raise BadQuery("continue: not a token this reader gave") from None
    if not (isinstance(key, list) and len(key) == 4 and all(isinstance(k, str) for k in key)):
        raise BadQuery("continue: not a token this reader gave")
    return key[0], key[1], key[2], key[3]


@dataclass(frozen=True)
class Query:
    """Which records a listing wants, newest first, a page at a time."""

    kind: Kind = "TrainingRun"
    phase: str | None = None
    experiment: str | None = None
    selector: tuple[Requirement, ...] = ()
    since: datetime | None = None  # created at or after
    limit: int = DEFAULT_LIMIT
    after: Key | None = None  # the continue token's key
    label_selector: str = ""  # (as given: what :meth:`params` sends)
    continue_token: str | None = None

    @classmethod
    def of(
        cls,
        kind: str = "TrainingRun",
        *,
        phase: str | None = None,
        experiment: str | None = None,
        label_selector: str | None = None,
        since: datetime | str | None = None,
        limit: int | str | None = None,
        continue_token: str | None = None,
    ) -> Query:
        """A query from a caller's values (strings from a URL, or typed); BadQuery names
        the first that is not right."""
        if kind not in KINDS:
            raise BadQuery(f"kind: {kind[:40]!r} is not one of {', '.join(KINDS)}")
        if phase is not None and not PHASE.fullmatch(phase):
            raise BadQuery(f"phase: {phase[:40]!r} is not a phase such as Failed")
        if experiment is not None and not NAMESPACE.fullmatch(experiment):
            raise BadQuery(f"experiment: {experiment[:40]!r} is not a DNS-1123 label")
        try:
            size = DEFAULT_LIMIT if limit in (None, "") else int(limit)
        except ValueError:
            raise BadQuery(f"limit: {str(limit)[:40]!r} is not a number") from None
        if not 1 <= size <= MAX_LIMIT:
            raise BadQuery(f"limit: {size} is not between 1 and {MAX_LIMIT}")
        when = parse_time(since) if isinstance(since, str) else since
        return cls(
            cast(Kind, kind),
            phase,
            experiment,
            parse_selector(label_selector or ""),
            when,
            size,
            _untoken(continue_token) if continue_token else None,
            label_selector or "",
            continue_token or None,
        )

    def params(self) -> dict[str, str]:
        """The query as the registry's listing route takes it (``?phase=...``)."""
        given = {
            "phase": self.phase,
            "experiment": self.experiment,
            "labelSelector": self.label_selector or None,
            "since": self.since.strftime("%Y-%m-%dT%H:%M:%SZ") if self.since else None,
            "limit": str(self.limit),
            "continue": self.continue_token,
        }
        return {k: v for k, v in given.items() if v is not None}

    def wants(self, s: Mapping[str, Any]) -> bool:
        if self.phase is not None and s.get("phase") != self.phase:
            return False
        if self.experiment is not None and s.get("experiment") != self.experiment:
            return False
        labels = s.get("labels") or {}
        if not all(r.matches(labels) for r in self.selector):
            return False
        if self.since is not None:
            created = s.get("created")
            if not created or parse_time(str(created)) < self.since:
                return False
        return self.after is None or _key(s) < self.after


@dataclass
class Page:
    """One page of summaries, newest first; ``continue_token`` asks for the next."""

    items: list[Summary] = field(default_factory=list)
    continue_token: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"items": self.items, "continue": self.continue_token}


def select(summaries: Iterator[Summary] | list[Summary], query: Query) -> Page:
    """The page of ``summaries`` that ``query`` asks for."""
    wanted = sorted((s for s in summaries if query.wants(s)), key=_key, reverse=True)
    page = wanted[: query.limit]
    more = len(wanted) > query.limit
    return Page(page, _token(_key(page[-1])) if more and page else None)


class Records(abc.ABC):
    """The records of a namespace: listed a page at a time, one read whole. The seam every
    reader goes through; :class:`FolderRecords` and the registry service's client
    (``registry.client.RegistryClient``) implement :meth:`page`, :meth:`get_record` and
    :meth:`metrics_lines`."""

    def list_records(
        self,
        namespace: str,
        *,
        kind: str = "TrainingRun",
        phase: str | None = None,
        experiment: str | None = None,
        label_selector: str | None = None,
        since: datetime | str | None = None,
        limit: int = DEFAULT_LIMIT,
        continue_token: str | None = None,
    ) -> Page:
        """Summaries, newest first (BadQuery names a filter that is not right)."""
        query = Query.of(
            kind,
            phase=phase,
            experiment=experiment,
            label_selector=label_selector,
            since=since,
            limit=limit,
            continue_token=continue_token,
        )
        return self.page(namespace, query)

    @abc.abstractmethod
    def page(self, namespace: str, query: Query) -> Page:
        """The page of summaries ``query`` asks for."""

    @abc.abstractmethod
    def get_record(
        self, namespace: str, name: str, uid: str | None = None, *, kind: str = "TrainingRun"
    ) -> Record | None:
        """The record of ``name`` (with ``uid``, that object's; else the newest), or None."""

    @abc.abstractmethod
    def metrics_lines(
        self, namespace: str, name: str, uid: str, *, kind: str = "TrainingRun"
    ) -> list[str]:
        """The run's kept metric reports (``metrics.jsonl``), one JSON object a line."""


def check_names(namespace: str, name: str | None = None, uid: str | None = None) -> None:
    """BadQuery unless these are a namespace, an object name and a uid."""
    if not NAMESPACE.fullmatch(namespace):
        raise BadQuery(f"namespace: {namespace[:80]!r} is not a DNS-1123 label")
    if name is not None and not NAME.fullmatch(name):
        raise BadQuery(f"name: {name[:80]!r} is not a DNS-1123 subdomain")
    if uid is not None and not UID.fullmatch(uid):
        raise BadQuery(f"uid: {uid[:80]!r} is not a Kubernetes uid")


def _read_json(path: Path) -> Any:
    if path.is_symlink() or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class FolderRecords(Records):
    """:class:`Records` over the registry's folder tree at ``root`` (see the layout)."""

    root: Path

    def folder(self, namespace: str, kind: str, name: str | None = None) -> Path:
        """``<root>/<ns>/records/<kinds>[/<name>]``; BadQuery for a name that is not one,
        or a folder that leads (through a symbolic link) out of the namespace."""
        if kind not in KINDS:
            raise BadQuery(f"kind: {kind[:40]!r} is not one of {', '.join(KINDS)}")
        check_names(namespace, name)
        path = self.root / namespace / "records" / KINDS[kind]
        path = path / name if name is not None else path
        top = self.root.resolve() / namespace
        if not path.resolve().is_relative_to(top):
            raise BadQuery(f"the records of {namespace} lead out of the namespace: refused")
        return path

    def _dirs(self, base: Path) -> Iterator[Path]:
        with contextlib.suppress(OSError):
            for d in base.iterdir():
                if d.is_dir() and not d.is_symlink() and not d.name.startswith(TMP_PREFIX):
                    yield d

    def summaries(self, namespace: str, kind: str) -> Iterator[Summary]:
        """The summaries of ``kind`` in ``namespace``: from its index, else (a folder
        written without one) from each record's ``summary.json``."""
        indexed = index.read(self.folder(namespace, kind))
        if indexed is not None:
            yield from indexed
            return
        for name in self._dirs(self.folder(namespace, kind)):
            for rec in self._dirs(name):
                found = _read_json(rec / SUMMARY)
                if isinstance(found, dict):
                    yield cast(Summary, found)

    def page(self, namespace: str, query: Query) -> Page:
        return select(self.summaries(namespace, query.kind), query)

    def record_folder(
        self, namespace: str, name: str, uid: str | None = None, *, kind: str = "TrainingRun"
    ) -> Path | None:
        """The folder of that record (``uid`` None: the name's newest), None if none."""
        base = self.folder(namespace, kind, name)
        if uid is not None:
            check_names(namespace, name, uid)
            found = base / uid
            return found if (found / RECORD).is_file() and not found.is_symlink() else None
        newest = [
            (_key(s), d)
            for d in self._dirs(base)
            if isinstance(s := _read_json(d / SUMMARY), dict) and (d / RECORD).is_file()
        ]
        return max(newest, key=lambda kd: kd[0])[1] if newest else None

    def get_record(
        self, namespace: str, name: str, uid: str | None = None, *, kind: str = "TrainingRun"
    ) -> Record | None:
        folder = self.record_folder(namespace, name, uid, kind=kind)
        found = _read_json(folder / RECORD) if folder is not None else None
        return cast(Record, found) if isinstance(found, dict) else None

    def metrics_lines(
        self, namespace: str, name: str, uid: str, *, kind: str = "TrainingRun"
    ) -> list[str]:
        folder = self.record_folder(namespace, name, uid, kind=kind)
        path = folder / METRICS if folder is not None else None
        if path is None or path.is_symlink() or not path.is_file():
            return []
        return path.read_text(errors="replace").splitlines()

    def write(self, record: Record, archive: Path | None = None) -> Path:
        """Put ``record`` in place (replacing that uid's), with the metric reports of the
        run's archive (``archive/logs/node-*/metrics.jsonl``, up to MAX_METRICS_BYTES) and,
        for each node whose log the operator could not read (its Pod gone, its kubelet
        silent), the tail of the node's archived rank logs."""
        namespace, name, uid = record["namespace"], record["name"], record["uid"]
        check_names(namespace, name, uid)
        base = self.folder(namespace, record["kind"], name)
        base.mkdir(parents=True, exist_ok=True)
        dest = base / uid
        tmp = base / f"{TMP_PREFIX}{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            top = self.root.resolve() / namespace
            inside = archive is not None and archive.resolve().is_relative_to(top)
            _copy_metrics(archive if inside else None, tmp / METRICS)
            record = _with_archived_tails(record, archive if inside else None)
            (tmp / RECORD).write_text(json.dumps(record, sort_keys=True))
            (tmp / SUMMARY).write_text(json.dumps(summary_of(record), sort_keys=True))
            for path in tmp.iterdir():
                with path.open("rb") as f:
                    os.fsync(f.fileno())
            replace_folder(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        index.append(base.parent, summary_of(record))
        return dest


def replace_folder(tmp: Path, dest: Path) -> None:
    """``tmp`` renamed to ``dest``; an older ``dest`` is renamed aside first and removed
    after, so that ``dest`` is always one whole folder or the other."""
    if dest.exists():
        old = dest.parent / f"{TMP_PREFIX}old-{uuid.uuid4().hex}"
        dest.rename(old)
        tmp.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(dest)


def _node_folders(archive: Path | None) -> list[tuple[int, Path]]:
    """(node rank, folder) of an archive's ``logs/node-N`` folders (no links)."""
    logs = archive / "logs" if archive is not None else None
    if logs is None or logs.is_symlink() or not logs.is_dir():
        return []
    found = []
    for folder in logs.glob("node-*"):
        rank = folder.name[5:]
        if rank.isdigit() and folder.is_dir() and not folder.is_symlink():
            found.append((int(rank), folder))
    return sorted(found)


def _with_archived_tails(record: Record, archive: Path | None) -> Record:
    """``record`` with the tails of the archived rank logs of the nodes it has none of."""
    tails = dict(record.get("logTails") or {})
    for rank, folder in _node_folders(archive)[: build.MAX_TAIL_NODES]:
        if str(rank) in tails:
            continue
        lines: list[str] = []
        for log in sorted(folder.glob("rank-*.txt")):
            if log.is_file() and not log.is_symlink():
                said = log.stem.replace("-", " ")
                text = _tail_of(log)
                lines += [
                    f"[{said}] {line}"
                    for line in text.splitlines()
                    if not line.startswith(PROGRESS_TEXT)  # a progress report, not output
                ]
        if lines:
            tails[str(rank)] = [build.cut(x) for x in lines[-build.TAIL_LINES :]]
    return cast(Record, {**record, "logTails": tails}) if tails else record


def _tail_of(path: Path, limit: int = 256 << 10) -> str:
    """The last ``limit`` bytes of a file, from its first whole line."""
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - limit))
        data = f.read()
    if size > limit:
        data = data.partition(b"\n")[2]
    return data.decode("utf-8", "replace")


def _copy_metrics(archive: Path | None, dest: Path) -> None:
    """Every node's ``logs/node-N/metrics.jsonl`` of ``archive``, node by node, into
    ``dest`` (plain files only: a symbolic link is not followed)."""
    left = MAX_METRICS_BYTES
    with dest.open("wb") as out:
        for _, folder in _node_folders(archive):
            path = folder / METRICS
            if path.is_symlink() or not path.is_file():
                continue
            with path.open("rb") as f:
                for line in f:
                    if len(line) > left:
                        return
                    out.write(line if line.endswith(b"\n") else line + b"\n")
                    left -= len(line)
