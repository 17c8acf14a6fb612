"""What a rank's output may cost, and what is looked for in it: each rank's log file within
its limit (:class:`CappedLog`), the node's own output that never makes a rank wait
(:class:`Echo`), and the evidence and ``policy.logRules`` lines (:class:`LogScanner`).

Standard library only, Python >= 3.8; shipped with the launcher (``ranks.Rank``
and ``mpi_launcher`` write through them). Tested in tests/unit/launcher/test_output.py and
tests/unit/launcher/test_log_scanner.py.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any

from torchyard.launch.contract import (
    EVIDENCE,
    EVIDENCE_CHARS,
    EVIDENCE_MAX,
    EVIDENCE_WORDS,
    LOG_LIMIT_BYTES,
    LOG_LIMIT_MIN,
    TORCHYARD_LOG_LIMIT_BYTES,
    TORCHYARD_LOG_RULES,
    LaunchError,
    int_env,
    write_bytes,
)

# TORCHYARD_LOG_LIMIT_BYTES (``contract``: LOG_LIMIT_BYTES, LOG_LIMIT_MIN): a rank
# that writes more keeps its first and its last half; a line between them says how much was
# dropped. 0: no limit.
LOG_NOTE_BYTES = 256  # room kept for that note, so that the file stays within the limit
HEAD_SLACK_BYTES = 1 << 16  # how far short of its half the head may end, to end a line
# One read of a rank's pipe (its whole kernel buffer, ``ranks.PIPE_BYTES``), and
# the longest line shown as one: a longer one comes in pieces. Lines are handled a read at
# a time, not one by one, so that a rank writing tens of MB/s costs its node a few per cent
# of a core: big reads, whole-read operations, nothing copied that is not kept.
READ_BYTES = 1 << 20
# The node's own output (the ranks' lines with their ``[rank r]`` prefix, the launcher's
# messages): what may wait for a slow reader (a terminal, a log collector) before rank
# lines are dropped from it. The ranks never wait for it; their log files keep everything.
ECHO_BUFFER_BYTES = 4 << 20
# What each rank may show there, on average (bytes a second) and at once: a rank that
# writes more has the rest of its lines counted, not shown (its log file has them), so a
# chatty rank costs neither a terminal nor the node's log collector (the container runtime,
# whose CPU its neighbours share) more than this, and never hides the other ranks' lines.
ECHO_RATE_BYTES = 1 << 20
ECHO_BURST_BYTES = 1 << 20
ECHO_NOTE_SECONDS = 1.0  # at most one "not shown" line a rank this often
ECHO_DRAIN_SECONDS = 10.0  # at the end, how long the rest may take to be written


def log_limit(env: Mapping[str, str]) -> int:
    """TORCHYARD_LOG_LIMIT_BYTES (default LOG_LIMIT_BYTES; 0: none; at least LOG_LIMIT_MIN)."""
    limit = int_env(env, TORCHYARD_LOG_LIMIT_BYTES, LOG_LIMIT_BYTES)
    if limit < 0 or 0 < limit < LOG_LIMIT_MIN:
        raise LaunchError(
            f"{TORCHYARD_LOG_LIMIT_BYTES} must be 0 (no limit) or at least {LOG_LIMIT_MIN}, "
            f"got {limit}"
        )
    return limit


class CappedLog:
    """A rank's log file of at most ``limit`` bytes (0: no limit): its first half as
    written, then, once the rank wrote more, the last lines within the other half,
    after a line saying how many bytes and lines were dropped between them.

    The end is kept on disk while the rank runs, in at most two segment files beside the
    log (``<name>.tail0``, ``.tail1``) of a quarter of the limit each: the older one is
    dropped when the newer one is full. :meth:`close` appends what is left of them to the
    log. So neither the disk nor the launcher's memory holds more than ``limit`` per rank,
    however much it writes. A write is one system call on an unbuffered file; what one
    holds beyond a segment is counted, never written. Thread-safe: both output threads of
    a rank write to it.

    ``scan`` (the evidence and log-rule scanner, :meth:`LogScanner.scan_read`) is given
    what the log keeps, whole lines at a time: its head as it is written, its tail when
    it is closed. The lines dropped between them cost the node a count, not a search:
    looking for a dozen words in every line would cost a rank writing 50 MB/s a fifth of
    a core; and each line the termination message quotes is in the archived log."""

    def __init__(self, path: str, limit: int, scan: Callable[[bytes], None] | None = None) -> None:
        self.path = path
        self.scan = scan
        self.file: io.FileIO = open(path, "ab", buffering=0)  # noqa: SIM115 - closed by close()
        self.limit = limit
        written = self.file.tell()  # a launcher started again in the same folder
        self.head_left = max(0, limit // 2 - written)
        self.segment_limit = max(1, (limit - limit // 2 - LOG_NOTE_BYTES) // 2)
        self.segments: list[tuple[str, io.FileIO]] = []
        self.counts: list[list[int]] = []  # per segment: bytes, newlines, ends a line (1/0)
        self.segment_size = 0
        self.made = 0  # segments made so far (their names' numbers)
        self.dropped_bytes = 0
        self.dropped_lines = 0
        self.dropped_ends_line = True  # what was dropped ends with a whole line
        self.head_ends_line = True
        self._lock = threading.Lock()

    def write(self, data: bytes, lines: int | None = None) -> None:
        """``data`` as the rank wrote it; ``lines``: its newlines, when the caller
        counted them already."""
        with self._lock:
            if self.file.closed:
                return
            if not self.limit:
                self._head(data)
                return
            if self.head_left > 0:
                if len(data) <= self.head_left:
                    self._head(data)
                    return
                # the head ends at the end of a line when one ends in the last
                # HEAD_SLACK_BYTES of what fits, else within the line
                start = max(0, self.head_left - HEAD_SLACK_BYTES)
                cut = data.rfind(b"\n", start, self.head_left) + 1
                cut = cut or self.head_left
                self._head(data[:cut])
                data, lines = data[cut:], None
                self.head_left = 0
            self._tail(data, data.count(b"\n") if lines is None else lines)

    def _head(self, data: bytes) -> None:
        _write_all(self.file, data)
        if self.scan is not None:
            self.scan(data)
        self.head_left -= len(data)
        self.head_ends_line = data.endswith(b"\n")

    def _tail(self, data: bytes, lines: int) -> None:
        if len(data) > self.segment_limit:  # more than a segment: in segment-sized pieces
            cut = max(0, len(data) - 2 * self.segment_limit)
            if cut:  # what is kept of it fills both segments: all before it is dropped
                while self.segments:
                    self._drop_segment()
                kept = data.count(b"\n", cut)
                self._drop(cut, lines - kept, data[cut - 1] == 10)  # 10: b"\n"
            for at in range(cut, len(data), self.segment_limit):
                piece = data[at : at + self.segment_limit]
                self._tail(piece, piece.count(b"\n"))
            return
        if not self.segments or self.segment_size + len(data) > self.segment_limit:
            if len(self.segments) == 2:
                self._drop_segment()
            name = f"{self.path}.tail{self.made}"
            self.made += 1
            self.segments.append((name, open(name, "wb", buffering=0)))  # noqa: SIM115
            self.counts.append([0, 0, 1])
            self.segment_size = 0
        _write_all(self.segments[-1][1], data)
        self.segment_size += len(data)
        # counted as written, so that dropping a segment needs no reading it back
        counts = self.counts[-1]
        counts[0] += len(data)
        counts[1] += lines
        counts[2] = data.endswith(b"\n")

    def _scan_lines(self, data: bytes) -> bytes:
        """:attr:`scan` the whole lines of ``data`` (a line longer than READ_BYTES in
        pieces, as the rank's output threads hand it on); returns the rest."""
        assert self.scan is not None
        end = data.rfind(b"\n") + 1
        if not end and len(data) < READ_BYTES:
            return data
        end = end or len(data)
        self.scan(data[:end])
        return data[end:]

    def _drop_segment(self) -> None:
        """Drop the older segment, counting what it held."""
        name, old = self.segments.pop(0)
        old.close()
        os.unlink(name)
        size, lines, ends_line = self.counts.pop(0)
        self._drop(size, lines, bool(ends_line))

    def _drop(self, size: int, lines: int, ends_line: bool) -> None:
        self.dropped_bytes += size
        self.dropped_lines += lines
        self.dropped_ends_line = ends_line

    def close(self) -> None:
        """Append the note on what was dropped, then the kept end from its first whole
        line on, and remove the segment files."""
        with self._lock:
            if self.file.closed:
                return
            for _, segment in self.segments:
                segment.close()
            names = [name for name, _ in self.segments]
            self.segments, self.counts = [], []
            # the kept end may start within a line whose beginning was dropped: that line
            # is dropped too
            skip = 0 if self.dropped_ends_line else _first_line(names)
            if skip:
                self.dropped_bytes += skip
                self.dropped_lines += 1
            if self.dropped_bytes:
                note = (
                    f"[torchyard] {self.dropped_bytes} bytes ({self.dropped_lines} lines) of "
                    "this rank's output dropped here: its log keeps the first and the last "
                    f"{self.limit // 2} bytes (TORCHYARD_LOG_LIMIT_BYTES {self.limit}: "
                    "spec.policy.logLimitBytes)\n"
                )
                _write_all(self.file, (b"" if self.head_ends_line else b"\n") + note.encode())
            rest = b""
            for chunk in _chunks(names):
                if skip >= len(chunk):
                    skip -= len(chunk)
                    continue
                chunk, skip = chunk[skip:], 0
                _write_all(self.file, chunk)
                if self.scan is not None:
                    rest = self._scan_lines(rest + chunk)
            if rest and self.scan is not None:  # a last line without its newline
                self.scan(rest)
            for name in names:
                os.unlink(name)
            self.file.close()


def _write_all(file: io.FileIO, data: bytes) -> None:
    """All of ``data`` to the unbuffered ``file`` (a write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[file.write(view) or 0 :]


def _chunks(names: Sequence[str]) -> Iterator[bytes]:
    """The bytes of the files ``names``, one after the other, READ_BYTES at a time."""
    for name in names:
        with open(name, "rb") as f:
            yield from iter(lambda: f.read(READ_BYTES), b"")


def _first_line(names: Sequence[str]) -> int:
    """The size of the first line (with its newline) in the files ``names`` one after
    the other; their whole size when there is no newline."""
    size = 0
    for chunk in _chunks(names):
        end = chunk.find(b"\n")
        if end >= 0:
            return size + end + 1
        size += len(chunk)
    return size


class Echo:
    """The node's own output: its ranks' lines and its ``[torchyard]`` messages, written
    to the launcher's stdout/stderr by one thread, in the order they came.

    A rank's output thread only queues its lines (:meth:`put`), so a reader slower than
    the ranks write (a terminal, a container runtime's log) never makes a rank wait. Each
    rank shows at most ``rate`` bytes a second (``burst`` at once), and nothing more is
    queued once ``limit`` bytes wait: the rest of its lines is dropped from this output
    (its log file keeps them), and a line says how many, at most once in
    ECHO_NOTE_SECONDS. The launcher's own messages (``label`` None: its progress lines,
    which the operator reads) are never dropped."""

    def __init__(
        self,
        notes: IO[str],
        limit: int = ECHO_BUFFER_BYTES,
        *,
        rate: float = ECHO_RATE_BYTES,
        burst: int = ECHO_BURST_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.notes = notes
        self.limit = limit
        self.rate, self.burst, self.clock = rate, burst, clock
        # reentrant: a signal handler in the main thread may say something while that
        # thread is queueing
        self._cond = threading.Condition(threading.RLock())
        self._queue: collections.deque[tuple[IO[str], bytes]] = collections.deque()
        self._size = 0  # bytes queued or being written
        self._shares: dict[str, list[float]] = {}  # label -> [bytes it may show, when]
        self._dropped: dict[str, list[int]] = {}  # label -> [lines, bytes] not shown
        self._note_at = 0.0  # when the next "not shown" line may be written
        self._draining = False
        self._thread: threading.Thread | None = None

    def put(
        self,
        sink: IO[str],
        data: bytes,
        label: str | None = None,
        prefix: bytes = b"",
        lines: int | None = None,
    ) -> None:
        """Queue ``data`` (whole lines) for ``sink``, each line after ``prefix``; of a
        rank's (``label``), the whole lines its share and the buffer have room for, the
        rest counted (``lines``: the newlines in ``data``, when counted already)."""
        with self._cond:
            if label is not None:
                share = self._share(label)
                room = min(share[0], self.limit - self._size)
                if len(data) > room:
                    cut = data.rfind(b"\n", 0, max(0, int(room))) + 1
                    dropped = self._dropped.setdefault(label, [0, 0])
                    count = data.count(b"\n") if lines is None else lines
                    dropped[0] += count - data.count(b"\n", 0, cut)
                    dropped[1] += len(data) - cut
                    data = data[:cut]
                share[0] -= len(data)
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_all, daemon=True)
                self._thread.start()
            if not data:
                return
            if prefix:
                data = prefix + data[:-1].replace(b"\n", b"\n" + prefix) + data[-1:]
            self._queue.append((sink, data))
            self._size += len(data)
            self._cond.notify_all()

    def _share(self, label: str) -> list[float]:
        """What ``label`` may still show now (its bucket, refilled at ``rate``)."""
        now = self.clock()
        share = self._shares.setdefault(label, [float(self.burst), now])
        share[0] = min(float(self.burst), share[0] + (now - share[1]) * self.rate)
        share[1] = now
        return share

    def drain(self, timeout: float = ECHO_DRAIN_SECONDS) -> None:
        """Wait until everything queued was written, with the last "not shown" lines (at
        most ``timeout`` seconds: a reader that stopped reading cannot hold the
        launcher's exit)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._draining = True
            self._cond.notify_all()
            try:
                while (self._size or self._dropped) and self._thread is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self._cond.wait(min(left, 0.1))
            finally:
                self._draining = False

    def _notes_due(self) -> bool:
        return bool(self._dropped) and (self._draining or self.clock() >= self._note_at)

    def _write_all(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._notes_due():
                    # a "not shown" line waits for its time (or for drain)
                    self._cond.wait(ECHO_NOTE_SECONDS if self._dropped else None)
                batch, self._queue = self._queue, collections.deque()
                if self._notes_due():
                    for label, (lines, size) in self._dropped.items():
                        note = (
                            f"[torchyard] {label}: {lines} lines ({size} bytes) not shown "
                            f"here: written faster than this output shows ({self.rate:.0f} "
                            "bytes a second a rank) or is read; its log file in logs/ has "
                            "them\n"
                        )
                        batch.append((self.notes, note.encode()))
                    self._dropped.clear()
                    self._note_at = self.clock() + ECHO_NOTE_SECONDS
            size = 0
            # consecutive pieces for one sink in one write
            while batch:
                sink, data = batch.popleft()
                pieces = [data]
                while batch and batch[0][0] is sink:
                    pieces.append(batch.popleft()[1])
                joined = b"".join(pieces)
                with contextlib.suppress(OSError, ValueError):  # a closed or broken reader
                    write_bytes(sink, joined)
                size += len(joined)
            with self._cond:
                self._size = max(0, self._size - size)
                self._cond.notify_all()


class LogScanner:
    """Flags lines of any rank's output: the ``EVIDENCE`` lines (the first few), and the
    first that matches one of the run's ``policy.logRules`` (TORCHYARD_LOG_RULES, JSON
    ``[{"pattern", "action"}]``): ``cancelRetries`` says so in the termination message,
    ``ignore`` makes a matching line no evidence of anything."""

    def __init__(self, rules_json: str = "") -> None:
        self.rules: list[tuple[int, Any, str, str]] = []
        try:
            rules = json.loads(rules_json) if rules_json.strip() else []
            for index, rule in enumerate(rules):
                pattern, action = str(rule["pattern"]), str(rule["action"])
                self.rules.append((index, re.compile(pattern), pattern, action))
            # over a whole read: a read no rule finds anything in is not searched line by
            # line (MULTILINE: ^ and $ at each line's start and end, as for one line)
            self.read_rules = [re.compile(pattern, re.MULTILINE) for _, _, pattern, _ in self.rules]
        except (ValueError, TypeError, KeyError, re.error) as err:
            raise LaunchError(f"{TORCHYARD_LOG_RULES} is not valid: {err}") from None
        self.evidence: list[dict[str, Any]] = []
        self.hit: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def scan_read(self, rank: int | None, lines: bytes) -> None:
        """:meth:`scan` every line of one read of a rank's output (whole lines), when
        a line may matter: one holds an EVIDENCE word, or a rule finds something in it."""
        if not self.rules and len(self.evidence) >= EVIDENCE_MAX:
            return
        maybe = len(self.evidence) < EVIDENCE_MAX and any(w in lines for w in EVIDENCE_WORDS)
        if not maybe and self.rules:
            text = lines.decode("utf-8", "replace").replace("\r\n", "\n")
            maybe = any(regex.search(text) for regex in self.read_rules)
        if maybe:
            for line in lines.split(b"\n"):
                if line:
                    self.scan(rank, line)

    def scan(self, rank: int | None, raw: bytes) -> None:
        if not self.rules and len(self.evidence) >= EVIDENCE_MAX:
            return
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        for index, regex, pattern, action in self.rules:
            if regex.search(line):
                if action == "ignore":
                    return
                with self._lock:
                    if self.hit is None:
                        self.hit = {
                            "index": index,
                            "pattern": pattern,
                            "action": action,
                            "rank": rank,
                            "line": line[:EVIDENCE_CHARS],
                        }
                break
        if len(self.evidence) < EVIDENCE_MAX and EVIDENCE.search(line):
            with self._lock:
                if len(self.evidence) < EVIDENCE_MAX:
                    self.evidence.append({"rank": rank, "line": line[:EVIDENCE_CHARS]})
