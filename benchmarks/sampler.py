"""A sampling profiler for the operator subprocess of ``benchmarks/scale.py --profile``.

``python benchmarks/sampler.py OUT -m MODULE [ARGS...]`` runs ``MODULE`` as ``__main__``
while a thread reads every other thread's stack (``sys._current_frames``) every
``SAMPLER_INTERVAL`` seconds (default 0.005) and counts, per function, the samples in
which it was on a busy stack (leaf not a known wait: select, lock, socket read, sleep).
SIGUSR1 writes the window so far to ``OUT.N`` and starts
a new one. Every 5 s (and at exit) it writes ``OUT``: the busy samples, then the top functions by
inclusive and by self samples. Standard library only; no py-spy needed. A sampled thread
that holds no GIL but runs C code (a socket read) is counted as waiting.

A busy sample is not CPU: a thread that waits for the GIL (or for a socket send) is on a
busy stack too. So each sample also reads every thread's CPU time so far
(``/proc/self/task/TID/schedstat``, nanoseconds on a CPU, Linux) and charges what the
thread used since the previous sample to the stack it is on now: the ``-- CPU`` sections
(milliseconds, by inclusive and by self), whatever the leaf (TLS and JSON run under
``read``), which add up to the process's CPU time.
"""

from __future__ import annotations

import atexit
import collections
import os
import runpy
import signal
import sys
import threading
import time
from types import FrameType

_IDLE_LEAVES = {
    "select",
    "wait",
    "acquire",
    "_wait_for_tstate_lock",
    "read",
    "recv_into",
    "readinto",
    "readline",
    "sleep",
    "_worker",
    "accept",
    "get",
    "_recv_into",
    "recv",
    "do_handshake",
    "_run_once",
    "run_forever",
}


class Sampler:
    def __init__(self, out: str, interval: float) -> None:
        self.out, self.interval = out, interval
        self.inclusive: collections.Counter[str] = collections.Counter()
        self.self_: collections.Counter[str] = collections.Counter()
        self.busy = 0
        self.total = 0
        self.lock = threading.Lock()
        self.cpu_inclusive: collections.Counter[str] = collections.Counter()  # ns
        self.cpu_self: collections.Counter[str] = collections.Counter()  # ns
        self.cpu_total = 0  # ns charged in this window
        self._cpu_seen: dict[int, int] = {}  # native thread id -> its CPU ns so far
        self._own_start = 0  # the sampler thread's CPU ns at the window's start
        self._native = 0  # the sampler thread's native id

    def _cpu_used(self, ident: int, natives: dict[int, int]) -> int:
        """Nanoseconds the thread ``ident`` ran since the last sample (0 if unknown)."""
        native = natives.get(ident)
        if native is None:
            return 0
        try:
            with open(f"/proc/self/task/{native}/schedstat") as f:
                now = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return 0
        before = self._cpu_seen.get(native, now)
        self._cpu_seen[native] = now
        return max(0, now - before)

    @staticmethod
    def _name(frame: FrameType) -> str:
        code = frame.f_code
        return f"{os.path.basename(code.co_filename)}:{code.co_name}"

    def sample(self) -> None:
        me = threading.get_ident()
        natives = {t.ident: t.native_id for t in threading.enumerate() if t.native_id}
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            used = self._cpu_used(ident, natives)
            if used:
                self.cpu_total += used
                self.cpu_self[self._name(frame)] += used
                charged = set()
                g: FrameType | None = frame
                while g is not None:
                    name = self._name(g)
                    if name not in charged:
                        charged.add(name)
                        self.cpu_inclusive[name] += used
                    g = g.f_back
            self.total += 1
            if frame.f_code.co_name in _IDLE_LEAVES:
                continue
            self.busy += 1
            seen = set()
            self.self_[self._name(frame)] += 1
            f: FrameType | None = frame
            while f is not None:
                name = self._name(f)
                if name not in seen:
                    seen.add(name)
                    self.inclusive[name] += 1
                f = f.f_back

    def dump(self) -> None:
        with self.lock:
            lines = [f"busy samples {self.busy} of {self.total} (interval {self.interval}s)"]
            lines.append("-- inclusive")
            lines += [f"{n:7d} {k}" for k, n in self.inclusive.most_common(80)]
            lines.append("-- self")
            lines += [f"{n:7d} {k}" for k, n in self.self_.most_common(40)]
            own = self._cpu_seen.get(self._native, 0) - self._own_start
            lines.append(
                f"-- CPU inclusive (ms; {self.cpu_total / 1e6:.0f} ms charged; the sampler's "
                f"own thread used {own / 1e6:.0f} ms, not charged)"
            )
            lines += [f"{n / 1e6:7.0f} {k}" for k, n in self.cpu_inclusive.most_common(100)]
            lines.append("-- CPU self (ms)")
            lines += [f"{n / 1e6:7.0f} {k}" for k, n in self.cpu_self.most_common(50)]
        with open(self.out + ".tmp", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(self.out + ".tmp", self.out)

    def cut(self, *_: object) -> None:
        """SIGUSR1: write the window so far to OUT.N (N = 1, 2, ...) and start afresh."""
        self.windows = getattr(self, "windows", 0) + 1
        out, self.out = self.out, f"{self.out}.{self.windows}"
        try:
            self.dump()
        finally:
            self.out = out
        with self.lock:
            self.inclusive.clear()
            self.self_.clear()
            self.cpu_inclusive.clear()
            self.cpu_self.clear()
            self.busy = self.total = self.cpu_total = 0
            self._own_start = self._cpu_seen.get(self._native, self._own_start)

    def loop(self) -> None:
        last = time.monotonic()
        me = self._native = threading.get_native_id()
        self._cpu_used(threading.get_ident(), {threading.get_ident(): me})
        self._own_start = self._cpu_seen.get(me, 0)
        while True:
            time.sleep(self.interval)
            with self.lock:
                self.sample()
                self._cpu_used(threading.get_ident(), {threading.get_ident(): me})
            if time.monotonic() - last > 5:
                last = time.monotonic()
                self.dump()


def main() -> None:
    out, flag, module, *rest = sys.argv[1:]
    assert flag == "-m", "usage: sampler.py OUT -m MODULE [ARGS...]"
    sampler = Sampler(out, float(os.environ.get("SAMPLER_INTERVAL", "0.005")))
    threading.Thread(target=sampler.loop, daemon=True).start()
    atexit.register(sampler.dump)
    signal.signal(signal.SIGUSR1, sampler.cut)
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
