"""The terminal of a local run (:class:`Console`): the node launchers' output, relayed as
it comes, and one progress line for the whole run that a person reads, updated in place
on a terminal (``\\r``), or a plain line at most every PLAIN_EVERY_SECONDS elsewhere (a
CI log, a file). Made by ``local.runs.LocalRun``, fed the launchers' summaries
(TORCHYARD_PROGRESS_FILE) and merged by ``status.steps.run_progress``, as the operator
merges them into ``status.progress``. Tested in tests/unit/local/test_console.py.

The relay never makes a launcher wait long: a slow terminal fills the launcher's own
buffer, and the launcher drops rank lines from its output, not from the rank's log
(``launch.output.Echo``). A ``label`` (a sweep's trial, when several run at once) starts
every line it writes.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import IO, Any

from torchyard.launch.contract import write_bytes
from torchyard.status import steps

PLAIN_EVERY_SECONDS = 10.0
READ_BYTES = 1 << 16
CLEAR = "\r\x1b[K"  # to the line's start, and erase it


def progress_line(progress: Mapping[str, Any] | None) -> str:
    """``step 120/3000 4% | 2.5 steps/s | ETA 19m12s | loss=0.0417`` from a run's
    progress (``status.steps.run_progress``); "" without one."""
    if not progress or not isinstance(progress.get("step"), int):
        return ""
    parts = [f"step {progress['step']}"]
    if isinstance(progress.get("total"), int):
        parts[0] += f"/{progress['total']} {progress.get('percent', 0)}%"
    if isinstance(progress.get("stepsPerSecond"), (int, float)):
        parts.append(f"{progress['stepsPerSecond']:.3g} steps/s")
    if progress.get("eta"):
        parts.append(f"ETA {progress['eta']}")
    metrics = progress.get("metrics") or {}
    if metrics:
        parts.append(" ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())))
    return " | ".join(parts)


class Console:
    """One terminal shared by the nodes' output and the run's progress line (on
    ``status``, normally standard error)."""

    def __init__(
        self,
        status: IO[str],
        *,
        tty: bool | None = None,
        width: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        label: str = "",
    ) -> None:
        self.out = status
        # Put before every line (a sweep's trials running side by side: ``[sweep-t1] ``)
        self.label = f"[{label}] " if label else ""
        self.tty = bool(getattr(status, "isatty", lambda: False)()) if tty is None else tty
        self.width = width
        self.clock = clock
        self.line = ""  # the progress line now on the terminal (tty only)
        self.plain_at: float | None = None  # when the last plain line was written
        self._lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def _columns(self) -> int:
        if self.width is not None:
            return self.width
        try:
            return os.get_terminal_size(self.out.fileno()).columns
        except (OSError, ValueError, AttributeError):
            return 80

    def write(self, sink: IO[str], data: bytes) -> None:
        """Lines of a node's output: above the progress line, which is drawn again."""
        if self.label:
            tag = self.label.encode()
            data = b"".join(tag + line for line in data.splitlines(keepends=True))
        with self._lock:
            if self.tty and self.line:
                self.out.write(CLEAR)
            write_bytes(sink, data)
            if self.tty and self.line:
                self.out.write(self.line)
                self.out.flush()

    def show(self, text: str) -> None:
        """The run's progress line is now ``text``."""
        if not text:
            return
        with self._lock:
            if self.tty:
                line = f"{self.label}[torchyard] {text}"[: max(self._columns() - 1, 20)]
                if line != self.line:
                    self.line = line
                    self.out.write(CLEAR + line)
                    self.out.flush()
            elif self.plain_at is None or self.clock() - self.plain_at >= PLAIN_EVERY_SECONDS:
                self.plain_at = self.clock()
                self.out.write(f"{self.label}[torchyard] {text}\n")
                self.out.flush()

    def relay(self, pipe: IO[bytes], sink: IO[str]) -> None:
        """Relay ``pipe`` (a launcher's stdout or stderr) to ``sink``, whole lines at a
        time, from a thread of its own until the pipe ends (:meth:`join`)."""

        def run() -> None:
            rest = b""
            fd = pipe.fileno()
            while True:
                try:
                    data = os.read(fd, READ_BYTES)
                except OSError:
                    data = b""
                if not data:
                    break
                data = rest + data
                end = data.rfind(b"\n") + 1
                if end:
                    self.write(sink, data[:end])
                rest = data[end:]
            if rest:
                self.write(sink, rest + b"\n")
            pipe.close()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)

    def join(self, timeout: float = 5.0) -> None:
        """Wait for the relays (their launchers ended), and leave the progress line on
        its own line."""
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            if self.tty and self.line:
                self.out.write("\n")
                self.out.flush()
                self.line = ""


class Progress:
    """The nodes' summaries, read as their launchers append them (one JSON a line, in
    each node's TORCHYARD_PROGRESS_FILE), merged into the run's progress."""

    def __init__(self, paths: Mapping[int, str]) -> None:
        self.paths = dict(paths)
        self.offsets = dict.fromkeys(self.paths, 0)
        self.latest: dict[int, dict[str, Any]] = {}

    def read(self) -> None:
        for node, path in self.paths.items():
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[node])
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1  # whole lines only: the launcher may be writing
            self.offsets[node] += end
            for line in data[:end].splitlines():
                try:
                    summary = json.loads(line)
                except ValueError:
                    continue
                if isinstance(summary, dict):
                    self.latest[node] = summary

    def run(self, now: float | None = None) -> dict[str, Any] | None:
        """The run's progress as ``status.progress`` would say it."""
        if not self.latest:
            return None
        when = datetime.fromtimestamp(time.time() if now is None else now, timezone.utc)
        nodes = [self.latest.get(i) for i in range(max(self.latest) + 1)]
        return steps.run_progress(nodes, when)
