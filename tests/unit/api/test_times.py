"""The one parser of a Kubernetes timestamp (torchyard.api.times), and that no other module
parses one on its own."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from torchyard.api.times import parse_time

PACKAGE = Path(__file__).resolve().parents[3] / "operator" / "torchyard"
NOON = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-01T12:00:00Z", NOON),
        ("2026-01-01T12:00:00.250000Z", NOON + timedelta(milliseconds=250)),
        ("2026-01-01T13:00:00+01:00", NOON),
        ("2026-01-01T12:00:00", NOON),  # no zone: UTC, never a naive datetime
    ],
)
def test_a_time_on_the_wire_is_an_aware_datetime(text: str, expected: datetime) -> None:
    when = parse_time(text)
    assert when == expected
    assert when is not None and when.tzinfo is not None


@pytest.mark.parametrize("empty", [None, ""])
def test_no_time_is_none(empty: object) -> None:
    assert parse_time(empty) is None


@pytest.mark.parametrize("hostile", ["yesterday", "2026-13-01T00:00:00Z", "12:00", "2026-01-01T"])
def test_a_value_that_is_not_a_time_is_a_value_error(hostile: str) -> None:
    with pytest.raises(ValueError):
        parse_time(hostile)


def test_no_other_module_parses_a_timestamp() -> None:
    parsing = re.compile(r"\b(fromisoformat|strptime)\(")
    found = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if parsing.search(path.read_text(encoding="utf-8"))
    ]
    assert found == ["api/times.py"]
