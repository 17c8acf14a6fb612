"""Run records: what is known of a TrainingRun, a Sweep or an Environment build once it
ended (or was deleted), kept in the registry beside the run's archive so that it outlives
the object. ``schema`` is the record's shape, ``build`` makes one from the objects (pure),
``reader`` is where records live and the :class:`Records` seam every reader goes through.
"""

from __future__ import annotations

from torchyard.records.build import (
    as_object,
    environment_record,
    sweep_record,
    trainingrun_record,
)
from torchyard.records.reader import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    BadQuery,
    FolderRecords,
    Page,
    Query,
    Records,
)
from torchyard.records.schema import KINDS, Record, Summary

__all__ = [
    "DEFAULT_LIMIT",
    "KINDS",
    "MAX_LIMIT",
    "BadQuery",
    "FolderRecords",
    "Page",
    "Query",
    "Record",
    "Records",
    "Summary",
    "as_object",
    "environment_record",
    "sweep_record",
    "trainingrun_record",
]
