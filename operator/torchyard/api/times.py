"""Times on the wire: the one parser of a Kubernetes timestamp (``2026-01-01T12:00:00Z``,
a fraction of a second and an offset too), for every layer that reads one (status,
controller, tuning, records, the SDK and the web view). Pure; tested in
tests/unit/api/test_times.py.
"""

from __future__ import annotations

from datetime import datetime, timezone


def parse_time(value: object) -> datetime | None:
    """``value`` (an RFC 3339 time) as an aware datetime, UTC when it names no zone; None
    when it is empty. ValueError when it is not a time."""
    if not value:
        return None
    when = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)
