"""The SDK's side of progress: Azure ML's ``Run.get_context().log`` writes a progress line,
and ``torchyard get runs`` / ``wait`` show ``status.progress``."""

from __future__ import annotations

import io
import sys

import pytest

from torchyard import progress
from torchyard.cli import inspect
from torchyard.sdk import runs
from torchyard.sdk.azureml import Run


def test_run_log_is_a_metric_at_the_last_step(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    progress.report(7)
    Run.get_context().log("loss", 0.5)
    Run.get_context().log("loss", 0.25, step=8)
    lines = out.getvalue().splitlines()
    assert [progress.parse(x) for x in lines[1:]] == [
        {"step": 7, "loss": 0.5},
        {"step": 8, "loss": 0.25},
    ]


@pytest.mark.parametrize(
    ("status", "short", "bar"),
    [
        (None, "", ""),
        ({"step": 12}, "step 12", "step 12"),
        (
            {"step": 120, "total": 3000, "eta": "4m10s"},
            "120/3000 4%",
            "[....................] 120/3000 4% ETA 4m10s",
        ),
        ({"step": 1500, "total": 3000}, "1500/3000 50%", "[##########..........] 1500/3000 50%"),
    ],
)
def test_progress_reads_short_and_as_a_bar(status: object, short: str, bar: str) -> None:
    assert runs.progress_text(status) == short
    assert runs.progress_text(status, bar=True) == bar


def test_get_runs_shows_progress_and_eta() -> None:
    body = {
        "metadata": {"name": "going", "creationTimestamp": "2026-01-01T12:00:00Z"},
        "spec": {"distribution": {"nodeCount": 1}},
        "status": {"phase": "Running", "progress": {"step": 30, "total": 60, "eta": "1m"}},
    }
    header, row = inspect._run_rows([body], wide=False)
    shown = dict(zip(header, row, strict=True))
    assert (shown["PROGRESS"], shown["ETA"]) == ("30/60 50%", "1m")


def test_the_wait_line_draws_the_bar() -> None:
    body = {
        "metadata": {"name": "going", "creationTimestamp": "2026-01-01T12:00:00Z"},
        "status": {"phase": "Running", "progress": {"step": 30, "total": 60, "eta": "1m"}},
    }
    assert runs.summary_line(body, []).endswith("[##########..........] 30/60 50% ETA 1m")


@pytest.mark.parametrize(
    ("status", "text"),
    [
        (None, "0"),
        ({}, "0"),
        ({"restarts": 2, "failedAttempts": 1}, "2"),
        (
            {"restarts": 1, "inPlaceRestarts": 3, "failedAttempts": 4},
            "1 gang, 3 in place (4 of backoffLimit used)",
        ),
    ],
)
def test_restarts_say_gang_and_in_place_apart(status: object, text: str) -> None:
    assert runs.restarts_text(status) == text
