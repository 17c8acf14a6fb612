"""Progress on standard error for long transfers: a redrawn bar on a terminal, a line
per quarter otherwise (so CI logs stay readable)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Progress:
    def __init__(self, label: str, total: int, out: TextIO | None = None) -> None:
        self.label = label
        self.total = max(total, 1)
        self.out = out or sys.stderr
        self.count = 0
        self.started = time.monotonic()
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        self._shown = -1

    def update(self, n: int) -> None:
        self.count += n
        fraction = min(self.count / self.total, 1.0)
        if self.tty:
            width = 30
            bar = "#" * int(fraction * width)
            self.out.write(f"\r{self.label} [{bar:<{width}}] {fraction:4.0%} {self._rate()}")
            self.out.flush()
        elif int(fraction * 4) > self._shown:
            self._shown = int(fraction * 4)
            self.out.write(f"{self.label}: {fraction:4.0%} {self._rate()}\n")

    def _rate(self) -> str:
        seconds = max(time.monotonic() - self.started, 1e-6)
        return f"{human(self.count)}/{human(self.total)} {human(self.count / seconds)}/s"

    def done(self) -> None:
        if self.tty:
            self.out.write("\n")
        self.out.flush()
