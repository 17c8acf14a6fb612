"""In the cluster every read is authorized for the caller first: a method whose
SubjectAccessReview says no refuses (403) and reads nothing; the reviews' answers are
cached by the token's hash, never the token."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.web.fakes import FakeSource, run
from torchyard.records import Query
from torchyard.web import access
from torchyard.web.queries import Refusal
from torchyard.web.source import Unavailable

ALICE = {"username": "system:serviceaccount:team-a:alice", "uid": "u1"}
CALLS: list[tuple[str, tuple[Any, ...]]] = [
    ("runs", ("team-b",)),
    ("run", ("team-b", "x")),
    ("pods", ("team-b", "x")),
    ("events", (run("x", ns="team-b"),)),
    ("log_tail", ("team-b", "x-node-0", 10)),
    ("sweeps", ("team-b",)),
    ("sweep", ("team-b", "x")),
    ("models", ("team-b",)),
    ("environments", ("team-b",)),
    ("environment", ("team-b", "x")),
    ("build_log", ("team-b", "job", 10)),
    ("queue", ("team-b",)),
    ("act", ("team-b", "runs", "x", "suspend")),
    ("archived_file", ("team-b", "x", "outputs/model.pt")),
]


class Counting(FakeSource):
    def __getattribute__(self, name: str) -> Any:
        if name in dict(CALLS) or name in ("archive", "record_page", "record", "record_metrics"):
            object.__getattribute__(self, "read").append(name)
        return object.__getattribute__(self, name)


def source(asked: list[tuple[str, ...]]) -> tuple[access.AuthorizedSource, Counting]:
    def allowed(user: Any, verb: str, ns: str, resource: str, group: str, sub: str) -> bool:
        asked.append((verb, ns, resource, sub))
        return ns == "team-a"

    inner = Counting(objects={"team-a": [run("mine")]})
    inner.read = []  # type: ignore[attr-defined]
    reviews = access.Reviews(lambda token: ALICE if token == "good" else None, allowed)
    return access.AuthorizedSource(inner, ALICE, reviews), inner


@pytest.mark.parametrize(("method", "args"), CALLS, ids=[c[0] for c in CALLS])
def test_what_the_caller_may_not_read_is_refused_before_it_is_read(
    method: str, args: tuple[Any, ...]
) -> None:
    asked: list[tuple[str, ...]] = []
    authorized, inner = source(asked)
    with pytest.raises(Refusal) as err:
        getattr(authorized, method)(*args)
    assert err.value.status == 403 and "may not" in err.value.message
    assert inner.read == []  # type: ignore[attr-defined]
    assert asked and all(a[1] == "team-b" for a in asked)


def test_an_archive_the_caller_may_not_read_is_not_read() -> None:
    authorized, inner = source([])
    assert "not allowed" in authorized.archive("team-b", "x").note
    assert inner.read == []  # type: ignore[attr-defined]


def test_the_callers_own_namespace_is_read() -> None:
    authorized, _ = source([])
    assert [r["metadata"]["name"] for r in authorized.runs("team-a")] == ["mine"]
    assert access.home_namespace(ALICE) == "team-a"
    assert access.home_namespace({"username": "alice@example.com"}) is None


def test_reviews_are_cached_by_the_tokens_hash() -> None:
    seen: list[str] = []

    def review(token: str) -> dict[str, str] | None:
        seen.append(token)
        return ALICE if token == "good" else None

    reviews = access.Reviews(review, lambda *a: True)
    assert reviews.user("good") == ALICE and reviews.user("good") == ALICE
    assert reviews.user("bad") is None and reviews.user("bad") is None
    assert seen == ["good", "bad"]
    keys = list(reviews._users._items)
    assert len(keys) == 2 and all(len(k) == 64 and "good" not in k for k in keys)
    assert reviews.user("") is None and reviews.user("x" * (access.MAX_TOKEN + 1)) is None


@pytest.mark.parametrize(
    ("method", "args", "refused"),
    [
        ("record_page", ("team-b", Query.of()), Unavailable),  # (a note beside a list)
        ("record", ("team-b", "x", None, "TrainingRun"), Refusal),
        ("record_metrics", ("team-b", "x", "0b0b0b0b-0000-4000-8000-000000000001"), Refusal),
    ],
)
def test_records_the_caller_may_not_read_are_not_read(
    method: str, args: tuple[Any, ...], refused: type[Exception]
) -> None:
    asked: list[tuple[str, ...]] = []
    authorized, inner = source(asked)
    with pytest.raises(refused, match="not"):
        getattr(authorized, method)(*args)
    assert inner.read == []  # type: ignore[attr-defined]
    assert asked == [("get", "team-b", "modelversions", "")]
