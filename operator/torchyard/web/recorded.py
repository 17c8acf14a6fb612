"""The records of runs, sweeps and Environment builds that are gone (deleted, or collected
by their TTL) as the objects the pages show: a record's summary as a row of a list, a
whole record as the TrainingRun (Sweep, Environment) it describes, marked under
:data:`MARK` (``{"uid": ..., "deleted": ...}``) so a page can say it is a record.

The merge of live objects with records is ``sdk.records``' (a live object that is also
recorded is listed once, live); a list's filters go to the registry's query and then to
the same filter as the live objects' (``queries.select_runs``). Pure; called by
``torchyard.web.views``; tested in tests/unit/web/test_records.py and in a browser in
tests/integration/web/test_records_in_browser.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchyard.records import BadQuery, Page, Query, Record, Summary
from torchyard.records.reader import MAX_LIMIT
from torchyard.sdk import records as history
from torchyard.web import queries

Obj = dict[str, Any]
MARK = "torchyardRecord"  # (not a field of any Kubernetes object)
KIND_OF = {"runs": "TrainingRun", "sweeps": "Sweep", "environments": "Environment"}


def query(kind: str, filt: queries.RunFilter | None = None) -> Query:
    """The registry's query for a list's records: the filter's phase, experiment, label
    and time when the registry can ask them (else every record: the list filters them)."""
    if filt is not None:
        try:
            return Query.of(
                kind,
                phase=filt.phase or None,
                experiment=filt.experiment or None,
                label_selector=filt.label or None,
                since=filt.cutoff(),
                limit=MAX_LIMIT,
            )
        except BadQuery:
            pass
    return Query.of(kind, limit=MAX_LIMIT)


def with_records(live: Sequence[Obj], page: Page) -> list[Obj]:
    """The live objects (those recorded marked) and, after them, the page's records of
    objects that are gone, as objects (``sdk.records.merged`` tells which is which)."""
    rows = history.merged(live, page)
    recorded = {r.uid for r in rows if r.recorded and not r.deleted}
    gone = {r.uid for r in rows if r.deleted}
    shown = [_marked(o, False) if _uid(o) in recorded else o for o in live]
    return shown + [summary_object(s) for s in page.items if str(s.get("uid") or "") in gone]


def summary_object(summary: Summary) -> Obj:
    """A record's summary as the object it describes: name, labels, creation, phase,
    finish and the failure's class (what a list shows and filters on)."""
    obj = history.as_run(summary)  # type: ignore[arg-type]  # (a summary's fields are a record's)
    failure = {"class": summary.get("failureClass"), "reason": summary.get("failureReason")}
    obj["status"] = {
        "phase": summary.get("phase") or "Unknown",
        "completionTime": summary.get("finished"),
        **({"failure": failure} if any(failure.values()) else {}),
        **({"model": summary["model"]} if summary.get("model") else {}),
    }
    obj[MARK] = {"uid": summary.get("uid"), "deleted": True}
    return obj


def record_object(record: Record, live: bool = False) -> Obj:
    """A whole record as the object it describes (``sdk.records.as_run``), marked."""
    return _marked(history.as_run(record), not live)


def mark(obj: Obj) -> dict[str, Any] | None:
    """The object's record mark, None for a live object that is not recorded."""
    found = obj.get(MARK)
    return found if isinstance(found, dict) else None


def events(record: Record) -> list[Obj]:
    """The record's Events as the Event objects the pages show."""
    return [
        {
            "lastTimestamp": ev.get("time") or "",
            "type": ev.get("type", ""),
            "reason": ev.get("reason", ""),
            "message": ev.get("message", ""),
        }
        for ev in record.get("events") or []
    ]


def archive_elsewhere(record: Record, live_uid: str | None, newest_uid: str | None) -> str:
    """Why the archive kept under the record's name is not its run's ('' when it is): a
    live run of that name with another uid, or (none live) a newer record of that name.
    The registry keeps a run's archive by name, so a later run of the name writes there."""
    uid, name = str(record.get("uid")), str(record.get("name"))
    other = live_uid if live_uid else newest_uid
    if other is None or other == uid:
        return ""
    which = "the live run" if live_uid else "a later run"
    return f"the archive of {name} holds {which} of that name (uid {other}), not this one's files"


def _marked(obj: Obj, deleted: bool) -> Obj:
    return {**obj, MARK: {"uid": _uid(obj), "deleted": deleted}}


def _uid(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")
