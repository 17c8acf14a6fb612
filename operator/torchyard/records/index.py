"""The listing index of one kind's records in a namespace: ``.index.jsonl`` beside their
folders, one summary a line, appended when a record is written (a uid written again: its
last line wins), so that a listing reads one file instead of a file per record.

:func:`read` keeps what it parsed, per index file, and reads only the lines appended
since (a file replaced or cut short is read again whole); a last line without its newline
(a writer that stopped mid-line) waits for the rest. A symbolic link is never an index.
Used by ``reader.FolderRecords``; tested in tests/unit/records/test_reader.py.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

from torchyard.records.schema import Summary

INDEX = ".index.jsonl"  # (no object name starts with a dot: it collides with none)
_LOCK = threading.Lock()
# index path -> (device, inode, bytes parsed, summaries by uid)
_PARSED: dict[str, tuple[int, int, int, dict[str, Summary]]] = {}


def append(folder: Path, summary: Summary) -> None:
    """Add ``summary`` to the index of ``folder`` (one write of one line, then fsync; a
    line a stopped writer left unfinished is ended first, and then skipped as not JSON)."""
    line = (json.dumps(summary, sort_keys=True) + "\n").encode()
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
    with _LOCK:
        fd = os.open(folder / INDEX, flags, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # after a writer that stopped mid-line
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)


def _parse(data: bytes, by_uid: dict[str, Summary]) -> None:
    for line in data.splitlines():
        try:
            found: Any = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and isinstance(found.get("uid"), str):
            by_uid[found["uid"]] = found  # type: ignore[assignment]


def read(folder: Path) -> list[Summary] | None:
    """Every summary of the index of ``folder``; None when there is no index."""
    path = folder / INDEX
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    with _LOCK:
        dev, ino, done, by_uid = _PARSED.get(str(path), (st.st_dev, st.st_ino, 0, {}))
        if (dev, ino) != (st.st_dev, st.st_ino) or st.st_size < done:
            done, by_uid = 0, {}
        if st.st_size > done:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                f.seek(done)
                data = f.read(st.st_size - done)
            whole = data.rfind(b"\n") + 1
            _parse(data[:whole], by_uid)
            done += whole
        _PARSED[str(path)] = (st.st_dev, st.st_ino, done, by_uid)
        return list(by_uid.values())
