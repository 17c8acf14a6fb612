"""Run history: the live TrainingRuns of a namespace side by side with the records of
runs that ended (``torchyard.records``), those whose TrainingRun was deleted (by hand or
by its TTL) marked, and one run's record when its TrainingRun is gone.

Records are read through the ``torchyard.records.Records`` seam: the registry service's
client in a cluster (``sdk.registry.RegistryClient``), the local registry folder in local
mode (:func:`local`). Called by ``torchyard runs list|describe`` and ``torchyard describe``
(``cli.history``); tested in tests/unit/sdk/test_records.py and
tests/integration/test_run_records.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchyard.api import wire
from torchyard.local import default_registry
from torchyard.records import (
    BadQuery,
    FolderRecords,
    Page,
    Query,
    Record,
    Records,
    Summary,
    as_object,
)


def local(registry: Path | None = None) -> FolderRecords:
    """The records of local runs (``torchyard run --local``), in its registry folder."""
    return FolderRecords(registry or default_registry())


@dataclass(frozen=True)
class Row:
    """One run of a listing: live, or only its record (``deleted``)."""

    name: str
    uid: str
    phase: str
    created: str | None
    finished: str | None
    failure: str  # the class (or reason) of its failure, "" when none
    model: str  # NAME:VERSION, "" when none
    recorded: bool  # a record of it is in the registry
    deleted: bool  # its TrainingRun is gone: only the record is left
    experiment: str | None = None


def _failure(st: Mapping[str, Any]) -> str:
    failure = st.get("failure") or {}
    return str(failure.get("class") or failure.get("reason") or "")


def _model(model: Any) -> str:
    return f"{model['name']}:{model['version']}" if isinstance(model, dict) and model else ""


def live_row(run: Mapping[str, Any], recorded: bool) -> Row:
    meta, st = run["metadata"], run.get("status") or {}
    labels = meta.get("labels") or {}
    return Row(
        name=str(meta["name"]),
        uid=str(meta.get("uid") or ""),
        phase=str(st.get("phase") or "Pending"),
        created=meta.get("creationTimestamp"),
        finished=st.get("completionTime"),
        failure=_failure(st),
        model=_model(st.get("model")),
        recorded=recorded,
        deleted=False,
        experiment=labels.get(wire.LABEL_EXPERIMENT),
    )


def record_row(summary: Summary) -> Row:
    return Row(
        name=str(summary.get("name") or ""),
        uid=str(summary.get("uid") or ""),
        phase=str(summary.get("phase") or ""),
        created=summary.get("created"),
        finished=summary.get("finished"),
        failure=str(summary.get("failureClass") or summary.get("failureReason") or ""),
        model=_model(summary.get("model")),
        recorded=True,
        deleted=True,
        experiment=summary.get("experiment"),
    )


def merged(live: Sequence[Mapping[str, Any]], page: Page) -> list[Row]:
    """The live runs and the page's records of runs that are gone, newest first; a run
    that is both live and recorded is listed once, live."""
    uids = {str(r["metadata"].get("uid") or "") for r in live}
    recorded = {str(s.get("uid") or "") for s in page.items}
    rows = [live_row(r, str(r["metadata"].get("uid") or "") in recorded) for r in live]
    rows += [record_row(s) for s in page.items if str(s.get("uid") or "") not in uids]
    return sorted(rows, key=lambda r: (r.created or "", r.name, r.uid), reverse=True)


def history(
    records: Records, namespace: str, live: Sequence[Mapping[str, Any]], query: Query
) -> tuple[list[Row], str | None]:
    """Live runs merged with the page of records ``query`` asks for (its filters on both),
    and the token of the next page of records; the live runs go with the first page."""
    page = records.page(namespace, query)
    first = query.continue_token is None
    wanted = [r for r in live if first and query.wants(_summary(r))]
    return merged(wanted, page), page.continue_token


def _summary(run: Mapping[str, Any]) -> dict[str, Any]:
    """What a query looks at, of a live run."""
    row = live_row(run, False)
    labels = run["metadata"].get("labels") or {}
    return {
        "phase": row.phase,
        "experiment": row.experiment,
        "labels": labels,
        "created": row.created,
    }


def as_run(record: Record) -> dict[str, Any]:
    """The record as the TrainingRun it describes (metadata, spec, status as they were),
    for what shows a TrainingRun."""
    return as_object(record, record.get("kind", "TrainingRun"))


__all__ = [
    "BadQuery",
    "Page",
    "Query",
    "Row",
    "as_run",
    "history",
    "live_row",
    "local",
    "merged",
    "record_row",
]
