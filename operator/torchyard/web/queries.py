"""What a request may ask, checked before anything is read: names (DNS-1123, as the API
has them), the runs list's filters and paging, a log tail's node/rank/lines, a metric's
name and points, a path of a run's archive. Anything else is a :class:`Refusal` (HTTP
400 with what was wrong and what is allowed): an unknown parameter, a value out of range,
a name that cannot be a Kubernetes name (so an encoded ``..``, a slash or a script never
reaches a path or a page), an archive path that is absolute or climbs out.

Pure; called by ``torchyard.web.views``. Tested in tests/unit/web/test_queries.py.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from torchyard.api.times import parse_time
from torchyard.api.trainingrun_status import Phase
from torchyard.api.wire import LABEL_EXPERIMENT
from torchyard.registry.variables import path_problem

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
# a label's key (an optional DNS prefix and a name) and value
LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
METRIC_NAME = re.compile(r"[A-Za-z0-9_.:/-]{1,128}")
SINCE = re.compile(r"([1-9][0-9]{0,4})([mhd])")
PHASES = tuple(p.value for p in Phase)
PAGE_SIZES = (1, 200)  # the smallest and the largest page of the runs list
DEFAULT_PAGE_SIZE = 50
MAX_PAGE = 1_000_000
LOG_LINES = (1, 2000)
DEFAULT_LOG_LINES = 200
POINTS = (3, 5000)  # a metric's points after downsampling
DEFAULT_POINTS = 2000
MAX_NODES = 100_000
ARCHIVE_FOLDERS = ("outputs", "logs")  # a run's archive (``registry.archives``)


class Refusal(Exception):
    """A request the view will not serve: ``status`` and a message saying why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def namespace(value: str) -> str:
    if not DNS_LABEL.fullmatch(value):
        raise Refusal(f"not a namespace name: {value[:80]!r} (DNS-1123 label)")
    return value


def name(value: str, what: str = "name") -> str:
    if not DNS_SUBDOMAIN.fullmatch(value) or ".." in value:
        raise Refusal(f"not a {what}: {value[:80]!r} (DNS-1123 subdomain)")
    return value


def uid(value: str) -> str:
    """A Kubernetes object's uid (the key of its record), lowercase as the API has it."""
    if not UID.fullmatch(value):
        raise Refusal(f"not a uid: {value[:80]!r} (8-4-4-4-12 lowercase hex digits)")
    return value


def archive_path(value: str) -> str:
    """A path of a run's archive (``outputs/...`` or ``logs/...``), by the registry's own
    rule of a file path (relative, no empty, ``.`` or ``..`` name, no control character,
    not too long)."""
    problem = path_problem(value)
    if problem is None and value.split("/")[0] not in ARCHIVE_FOLDERS:
        problem = f"it is in none of the archive's folders ({', '.join(ARCHIVE_FOLDERS)})"
    if problem:
        raise Refusal(f"not a file of a run's archive: {value[:80]!r}: {problem}")
    return value


def only(query: Mapping[str, str], allowed: Collection[str], getall: Any = None) -> None:
    """Refuse parameters not in ``allowed`` and any given twice."""
    unknown = sorted(set(query) - set(allowed))
    if unknown:
        known = ", ".join(sorted(allowed)) or "none"
        raise Refusal(f"unknown parameter(s) {', '.join(unknown)[:200]}; allowed: {known}")
    if getall is not None:
        for key in query:
            if len(getall(key)) > 1:
                raise Refusal(f"parameter {key} given more than once")


def integer(query: Mapping[str, str], key: str, default: int, bounds: tuple[int, int]) -> int:
    raw = query.get(key)
    if raw is None or raw == "":
        return default
    low, high = bounds
    if not re.fullmatch(r"[0-9]{1,9}", raw) or not low <= int(raw) <= high:
        raise Refusal(f"{key} must be a whole number from {low} to {high}; got {raw[:40]!r}")
    return int(raw)


@dataclass(frozen=True)
class RunFilter:
    """The runs list's filters and page."""

    phase: str = ""
    experiment: str = ""
    label: str = ""  # key or key=value
    since: str = ""  # 30m, 6h, 7d: created within
    page: int = 1
    size: int = DEFAULT_PAGE_SIZE

    KEYS = ("phase", "experiment", "label", "since", "page", "size")

    def query(self, **change: object) -> dict[str, str | int]:
        values: dict[str, str | int] = {k: getattr(self, k) for k in self.KEYS}
        values.update(change)  # type: ignore[arg-type]
        if values["page"] == 1:
            values["page"] = ""
        if values["size"] == DEFAULT_PAGE_SIZE:
            values["size"] = ""
        return values

    def cutoff(self, now: datetime | None = None) -> datetime | None:
        match = SINCE.fullmatch(self.since)
        if not match:
            return None
        unit = {"m": "minutes", "h": "hours", "d": "days"}[match[2]]
        return (now or datetime.now(timezone.utc)) - timedelta(**{unit: int(match[1])})


def run_filter(query: Mapping[str, str], getall: Any = None) -> RunFilter:
    only(query, RunFilter.KEYS, getall)
    phase = query.get("phase", "")
    if phase and phase not in PHASES:
        raise Refusal(f"phase must be one of {', '.join(PHASES)}; got {phase[:40]!r}")
    experiment = query.get("experiment", "")
    if experiment and not (len(experiment) <= 63 and LABEL_VALUE.fullmatch(experiment)):
        raise Refusal(f"not an experiment (a label value): {experiment[:80]!r}")
    label = query.get("label", "")
    if label:
        key, _, value = label.partition("=")
        if not LABEL_KEY.fullmatch(key) or len(value) > 63 or not LABEL_VALUE.fullmatch(value):
            raise Refusal(f"label must be key or key=value (Kubernetes labels); got {label[:80]!r}")
    since = query.get("since", "")
    if since and not SINCE.fullmatch(since):
        raise Refusal(f"since must be minutes, hours or days, e.g. 30m, 6h, 7d; got {since[:40]!r}")
    return RunFilter(
        phase,
        experiment,
        label,
        since,
        integer(query, "page", 1, (1, MAX_PAGE)),
        integer(query, "size", DEFAULT_PAGE_SIZE, PAGE_SIZES),
    )


def metric_name(value: str) -> str:
    if not METRIC_NAME.fullmatch(value) or ".." in value:
        raise Refusal(f"not a metric name: {value[:80]!r}")
    return value


def select_runs(items: list[dict[str, Any]], filt: RunFilter) -> tuple[list[dict[str, Any]], int]:
    """The runs that pass ``filt``, newest first: (its page of them, how many passed)."""
    cutoff = filt.cutoff()
    key, _, value = filt.label.partition("=")
    kept = []
    for run in items:
        meta = run.get("metadata") or {}
        labels = meta.get("labels") or {}
        if filt.phase and ((run.get("status") or {}).get("phase") or "Pending") != filt.phase:
            continue
        if filt.experiment and labels.get(LABEL_EXPERIMENT) != filt.experiment:
            continue
        if key and (key not in labels or ("=" in filt.label and labels[key] != value)):
            continue
        if cutoff and _created(run) < cutoff:
            continue
        kept.append(run)
    kept.sort(
        key=lambda r: (str(r["metadata"].get("creationTimestamp", "")), r["metadata"]["name"]),
        reverse=True,
    )
    start = (filt.page - 1) * filt.size
    return kept[start : start + filt.size], len(kept)


def _created(run: dict[str, Any]) -> datetime:
    try:
        when = parse_time((run.get("metadata") or {}).get("creationTimestamp"))
    except ValueError:
        when = None
    return when or datetime.min.replace(tzinfo=timezone.utc)
