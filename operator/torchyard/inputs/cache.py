"""The inputs cache on disk: verified entries, staging folders, and what to evict.

Layout under the cache's root (a namespace's cache claim in the cluster, a folder in
local mode)::

    entries/<key>/data/...        an input's files, as the run sees them (read-only)
    entries/<key>/entry.json      uri, revision, digest, bytes, files (path, size, sha256)
    partial/<key>/                a fetch in progress: kept when it is killed, so the
                                  next fetch of the key goes on from there
    partial/<key>.lock            held by the one fetch of the key (fcntl)

An entry is made only by :func:`commit`: its files are listed with their sha256 in the
staging folder, and the folder is renamed into ``entries/`` in one step, so a reader sees
a whole entry or none. ``digest`` is the sha256 of the file list, so two entries with the
same files have the same digest. :func:`evictions` is the one LRU rule, used by the
operator (over its index of entries) and by local mode (over the folders). Standard
library only; tested in tests/unit/inputs/test_cache.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from torchyard.inputs.base import InputError, Source

ENTRY = "entry.json"
DATA = "data"


@dataclass(frozen=True)
class Entry:
    """A committed cache entry, as ``entry.json`` records it."""

    key: str
    uri: str
    revision: str
    digest: str
    bytes: int
    files: tuple[dict[str, Any], ...] = ()

    def record(self) -> dict[str, Any]:
        """What the operator's index and a run's status keep of it (no file list)."""
        return {
            "key": self.key,
            "uri": self.uri,
            "revision": self.revision,
            "digest": self.digest,
            "bytes": self.bytes,
        }


def entry_dir(root: str, key: str) -> str:
    return os.path.join(root, "entries", key)


def data_dir(root: str, key: str) -> str:
    return os.path.join(entry_dir(root, key), DATA)


def staging_dir(root: str, key: str) -> str:
    return os.path.join(root, "partial", key)


@contextlib.contextmanager
def locked(root: str, key: str) -> Iterator[None]:
    """Hold the key's lock: one fetch of a key at a time (local mode's runs may race)."""
    os.makedirs(os.path.join(root, "partial"), exist_ok=True)
    with open(os.path.join(root, "partial", key + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _listing(data: str) -> list[dict[str, Any]]:
    files = []
    for folder, dirs, names in os.walk(data):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(folder, name)
            if os.path.islink(path) or not os.path.isfile(path):
                raise InputError(f"the input holds {path!r}, which is not a regular file")
            rel = os.path.relpath(path, data).replace(os.sep, "/")
            files.append({"path": rel, "size": os.path.getsize(path), "sha256": sha256_file(path)})
    return files


def prune(data: str, paths: set[str]) -> None:
    """Take away what an earlier try of a fetch left in ``data`` that this one keeps not
    (the listing or the commit changed in between)."""
    for folder, _, names in os.walk(data):
        for name in names:
            path = os.path.join(folder, name)
            if os.path.relpath(path, data).replace(os.sep, "/") not in paths:
                os.unlink(path)


def digest_of(files: Sequence[dict[str, Any]]) -> str:
    blob = json.dumps(
        [[f["path"], f["size"], f["sha256"]] for f in files], separators=(",", ":")
    ).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def commit(root: str, source: Source, revision: str = "") -> Entry:
    """Turn ``partial/<key>/data`` into the entry ``entries/<key>`` in one rename.

    InputError when the data holds no file (the include patterns matched nothing) or a
    file that is not a regular one."""
    key = source.key
    staging = staging_dir(root, key)
    files = _listing(os.path.join(staging, DATA))
    if not files:
        what = f" matching include {list(source.include)}" if source.include else ""
        raise InputError(
            f"{source.uri} holds no file{what}"
            + (f" (exclude {list(source.exclude)})" if source.exclude else "")
            + ": check the patterns against the input's paths"
        )
    entry = Entry(
        key,
        source.uri,
        revision or source.revision,
        digest_of(files),
        sum(int(f["size"]) for f in files),
        tuple(files),
    )
    record = {**entry.record(), "files": files, "format": "1"}
    with open(os.path.join(staging, ENTRY), "w") as f:
        json.dump(record, f, sort_keys=True)
    for name in os.listdir(staging):  # the fetcher's own progress files stay behind
        if name not in (DATA, ENTRY):
            _remove(os.path.join(staging, name))
    os.makedirs(os.path.join(root, "entries"), exist_ok=True)
    os.rename(staging, entry_dir(root, key))
    return entry


def read(root: str, key: str) -> Entry | None:
    """The committed entry of ``key`` (None: there is none)."""
    try:
        with open(os.path.join(entry_dir(root, key), ENTRY)) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return None
    return Entry(
        key,
        str(raw["uri"]),
        str(raw["revision"]),
        str(raw["digest"]),
        int(raw["bytes"]),
        tuple(raw.get("files") or ()),
    )


def verify(root: str, entry: Entry, *, hashes: bool = True) -> list[str]:
    """The files of ``entry`` that are missing or changed (empty: intact); ``hashes``:
    their sha256 too, else their sizes only."""
    bad = []
    data = data_dir(root, entry.key)
    for f in entry.files:
        path = os.path.join(data, f["path"])
        intact = (
            os.path.isfile(path)
            and not os.path.islink(path)
            and os.path.getsize(path) == f["size"]
            and (not hashes or sha256_file(path) == f["sha256"])
        )
        if not intact:
            bad.append(str(f["path"]))
    return bad


def touch(root: str, key: str) -> None:
    """Mark the entry used now (local mode's LRU reads the time)."""
    with contextlib.suppress(OSError):
        os.utime(os.path.join(entry_dir(root, key), ENTRY))


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def remove(root: str, key: str) -> None:
    """Take an entry away: renamed out of ``entries/`` first (no reader sees half of it)."""
    src = entry_dir(root, key)
    if not os.path.isdir(src):
        return
    trash = os.path.join(root, "partial", f"{key}.evicted.{os.getpid()}.{time.time_ns()}")
    os.makedirs(os.path.dirname(trash), exist_ok=True)
    os.rename(src, trash)
    _remove(trash)


def evictions(
    entries: Sequence[tuple[str, int, float]], limit: int, incoming: int, pinned: Sequence[str] = ()
) -> list[str]:
    """The keys to take away, least recently used first, so that ``incoming`` more bytes
    fit under ``limit`` with the entries ``(key, bytes, last used)``; pinned ones (used by
    a run that has not finished) stay. InputError when even that cannot make room."""
    if incoming > limit:
        raise InputError(
            f"the input is {incoming} bytes, over the inputs cache's limit of {limit} "
            "bytes: narrow it with include patterns or ask for a larger cache"
        )
    total = sum(size for _, size, _ in entries) + incoming
    chosen: list[str] = []
    for key, size, _ in sorted(entries, key=lambda e: (e[2], e[0])):
        if total <= limit:
            break
        if key in pinned:
            continue
        chosen.append(key)
        total -= size
    if total > limit:
        raise InputError(
            f"the inputs cache cannot make room for {incoming} more bytes: the entries "
            "of unfinished runs fill it; wait for them or ask for a larger cache"
        )
    return chosen


def local_evictions(root: str, limit: int, incoming: int, keep: Sequence[str]) -> list[str]:
    """:func:`evictions` over the entries on disk (last used: entry.json's time)."""
    found = []
    base = os.path.join(root, "entries")
    for key in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        entry = read(root, key)
        if entry is not None:
            used = os.path.getmtime(os.path.join(entry_dir(root, key), ENTRY))
            found.append((key, entry.bytes, used))
    return evictions(found, limit, incoming, keep)
