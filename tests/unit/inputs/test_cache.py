"""The cache's LRU rule (one rule for the operator's index and local mode's folders):
least recently used first, entries of unfinished runs kept, and an input that cannot fit
is refused with what to do."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from torchyard.inputs import cache
from torchyard.inputs.uris import InputError, Source

ENTRIES = [("old", 40, 1.0), ("mid", 30, 2.0), ("new", 20, 3.0)]


@pytest.mark.parametrize(
    ("limit", "incoming", "pinned", "evicted"),
    [
        (200, 50, (), []),  # fits
        (100, 10, (), []),  # 90 + 10 fits exactly
        (100, 20, (), ["old"]),
        (100, 60, (), ["old", "mid"]),
        (100, 20, ("old",), ["mid"]),
        (100, 100, (), ["old", "mid", "new"]),
    ],
)
def test_least_recently_used_entries_go_first(
    limit: int, incoming: int, pinned: tuple[str, ...], evicted: list[str]
) -> None:
    assert cache.evictions(ENTRIES, limit, incoming, pinned) == evicted


def test_an_input_over_the_limit_is_refused() -> None:
    with pytest.raises(InputError, match="over the inputs cache's limit of 100 bytes"):
        cache.evictions(ENTRIES, 100, 101)


def test_pinned_entries_that_leave_no_room_are_an_error() -> None:
    with pytest.raises(InputError, match="entries of unfinished runs fill it"):
        cache.evictions(ENTRIES, 100, 60, ("old", "mid"))


def _entry(root: Path, uri: str, size: int, used: float) -> str:
    source = Source(uri, "0" * 64)
    data = Path(cache.staging_dir(str(root), source.key)) / "data"
    data.mkdir(parents=True)
    (data / "f").write_bytes(b"x" * size)
    cache.commit(str(root), source)
    os.utime(Path(cache.entry_dir(str(root), source.key)) / cache.ENTRY, (used, used))
    return source.key


def test_local_evictions_read_the_entries_on_disk(tmp_path: Path) -> None:
    old = _entry(tmp_path, "https://h/old", 40, 1000.0)
    new = _entry(tmp_path, "https://h/new", 40, 2000.0)
    assert cache.local_evictions(str(tmp_path), 100, 30, ()) == [old]
    assert cache.local_evictions(str(tmp_path), 100, 30, (old,)) == [new]
    cache.remove(str(tmp_path), old)
    assert cache.read(str(tmp_path), old) is None
    assert sorted(os.listdir(tmp_path / "entries")) == [new]
