"""What a request may ask: every name that cannot be a Kubernetes name, every filter out of
its range and every unknown parameter is refused with a message (400)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from torchyard.web import queries
from torchyard.web.queries import Refusal

HOSTILE_NAMES = [
    "..",
    "../kube-system",
    "a/../b",
    "a/b",
    "%2e%2e",
    "..%2F..%2Fetc",
    "/etc/passwd",
    "a..b",
    "<script>alert(1)</script>",
    "Run",
    "a b",
    "",
    "-a",
    "a-",
    "a" * 254,
    "\x00",
    "ünïcode",
]


@pytest.mark.parametrize("value", HOSTILE_NAMES)
def test_a_name_that_cannot_be_a_kubernetes_name_is_refused(value: str) -> None:
    with pytest.raises(Refusal) as err:
        queries.name(value)
    assert err.value.status == 400 and "DNS-1123" in err.value.message
    with pytest.raises(Refusal):
        queries.namespace(value)


@pytest.mark.parametrize("value", ["a", "run-1", "run.v2", "a" * 253])
def test_kubernetes_names_pass(value: str) -> None:
    assert queries.name(value) == value


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ({"size": "100000"}, "size must be a whole number from 1 to 200"),
        ({"size": "0"}, "size must be"),
        ({"size": "-1"}, "size must be"),
        ({"size": "1e9"}, "size must be"),
        ({"page": "0"}, "page must be"),
        ({"page": "99999999999999999999"}, "page must be"),
        ({"phase": "<b>"}, "phase must be one of"),
        ({"since": "1y"}, "since must be"),
        ({"since": "999999h"}, "since must be"),
        ({"label": "a=b=c"}, "label must be"),
        ({"label": "<script>"}, "label must be"),
        ({"experiment": "x" * 64}, "not an experiment"),
        ({"namespace": "kube-system"}, "unknown parameter(s) namespace"),
        ({"sort": "x"}, "unknown parameter(s) sort"),
    ],
)
def test_bad_filters_are_refused_with_what_is_allowed(query: dict[str, str], said: str) -> None:
    with pytest.raises(Refusal) as err:
        queries.run_filter(query)
    assert said in err.value.message
    assert err.value.status == 400


def test_a_parameter_given_twice_is_refused() -> None:
    with pytest.raises(Refusal, match="more than once"):
        queries.run_filter({"page": "1"}, lambda key: ["1", "2"])


def test_filters_and_pages() -> None:
    def run(name: str, phase: str, created: str, **labels: str) -> dict[str, object]:
        meta = {"name": name, "labels": labels, "creationTimestamp": created}
        return {"metadata": meta, "status": {"phase": phase}}

    now = datetime.now(timezone.utc)
    items = [
        run(
            f"r{i}",
            "Failed" if i % 3 == 0 else "Running",
            stamp(now - timedelta(hours=10 - i)),
            team="a",
        )
        for i in range(10)
    ]
    items.append(run("old", "Failed", "2020-01-01T00:00:00Z", **{"torchyard.dev/experiment": "e1"}))
    failed, total = queries.select_runs(items, queries.RunFilter(phase="Failed", size=2))
    assert total == 5 and [r["metadata"]["name"] for r in failed] == ["r9", "r6"]
    second, _ = queries.select_runs(items, queries.RunFilter(phase="Failed", size=2, page=2))
    assert [r["metadata"]["name"] for r in second] == ["r3", "r0"]
    assert queries.select_runs(items, queries.RunFilter(experiment="e1"))[1] == 1
    assert queries.select_runs(items, queries.RunFilter(label="team=a"))[1] == 10
    assert queries.select_runs(items, queries.RunFilter(label="team"))[1] == 10
    assert queries.select_runs(items, queries.RunFilter(since="7d"))[1] == 10
    assert queries.select_runs(items, queries.RunFilter(since="150m"))[1] == 2  # r8, r9


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")
