"""``make test``'s pytest runs: the tiers that mostly wait side by side, then the one that
times itself alone.

The integration tier (KWOK nodes) and the node tier (the real kubelet node) spend most of
their time waiting on a control plane, a kubelet or a container; on two cores the machine
is about 70 % idle while either runs. So they run as two pytest processes at once, each
with its control plane of its own:

1. side by side: ``unit`` then ``integration`` (what is not ``node``), and ``node`` (the
   node tier, after the integration tier's one real-node test: one real node per machine);
2. then ``e2e`` alone: real training in local mode, whose progress, ETA and stall tests
   time the ranks' steps.

Every line says which run it came from; the end says how each ended. Arguments are given
to every run (a run that selects nothing is not a failure); with a ``-m`` of their own,
or ``TORCHYARD_TEST_SERIAL=1``, pytest runs once instead, as asked. Ctrl-C or SIGTERM
stops every run as Ctrl-C stops pytest (its fixtures stop their clusters), and no later
stage starts.

    python -m tests.tiers [pytest arguments]
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

NO_TESTS_COLLECTED = 5  # pytest's exit code when a selection is empty


@dataclass(frozen=True)
class Run:
    label: str
    markers: str  # pytest -m


# Each stage's runs side by side; the stages one after the other. Every test is in exactly
# one run (tests/unit/test_tiers.py).
STAGES: tuple[tuple[Run, ...], ...] = (
    (
        Run("unit+integration", "(unit or integration) and not node"),
        Run("node", "node"),
    ),
    (Run("e2e", "e2e and not node and not unit and not integration"),),
)


@dataclass
class Ended:
    run: Run
    code: int
    seconds: float
    summary: str
    failures: tuple[str, ...] = ()


class Stopping:
    """SIGINT or SIGTERM to this process: SIGINT, once, to every run (each in a session of
    its own, so that a terminal's Ctrl-C reaches them only this way, once)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.running: list[subprocess.Popen[bytes]] = []

    def __call__(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum = signum
            print(f"[tiers] {signal.Signals(signum).name}: stopping every run", flush=True)
            for proc in self.running:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)


def start(run: Run, args: Sequence[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-m", run.markers, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


# pytest's last line: "3 passed, 1 skipped in 12.34s" (or "no tests ran in 0.01s")
SUMMARY = re.compile(rb"\b(passed|failed|errors?|skipped|deselected|no tests ran)\b.* in [\d.]+s")
# its short summary's lines for what failed: "FAILED tests/x.py::test_y - AssertionError: ..."
FAILURE = re.compile(rb"^(FAILED|ERROR) \S+")
FAILURE_CHARS = 240  # of each, in the closing table: the test and the start of its reason


def relay(
    run: Run, proc: subprocess.Popen[bytes], lock: threading.Lock
) -> tuple[str, tuple[str, ...]]:
    """Each line of ``run``'s output, prefixed with its label, to this process's stdout,
    until it ends; returns pytest's summary line (else its last non-empty line): what the
    interpreter writes after it at exit (a library's warning) does not take its place; and
    the short summary's FAILED and ERROR lines, so that the end of a long log names them."""
    prefix, last, summary = f"[{run.label}] ".encode(), b"", b""
    failures: list[bytes] = []
    assert proc.stdout is not None
    for line in iter(proc.stdout.readline, b""):
        if line.strip():
            last = line.strip()
            if SUMMARY.search(last):
                summary = last
            elif FAILURE.match(last):
                failures.append(last)
        with lock:
            sys.stdout.buffer.write(prefix + line)
            sys.stdout.buffer.flush()
    proc.wait()
    text = (summary or last).decode("utf-8", "replace").strip("= ")
    return text, tuple(f.decode("utf-8", "replace")[:FAILURE_CHARS] for f in failures)


def stage(
    runs: Sequence[Run], args: Sequence[str], lock: threading.Lock, stopping: Stopping
) -> list[Ended]:
    began = time.monotonic()
    procs = [start(run, args) for run in runs]
    stopping.running = procs
    if stopping.signum is not None:  # came while they started
        for proc in procs:
            proc.send_signal(signal.SIGINT)
    ended: list[Ended | None] = [None] * len(runs)

    def follow(i: int) -> None:
        summary, failures = relay(runs[i], procs[i], lock)
        seconds = time.monotonic() - began
        ended[i] = Ended(runs[i], procs[i].returncode, seconds, summary, failures)

    threads = [threading.Thread(target=follow, args=(i,), daemon=True) for i in range(len(runs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [e for e in ended if e is not None]


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    # a marker expression of the caller's would replace each run's: one run then
    if os.environ.get("TORCHYARD_TEST_SERIAL") == "1" or any(a.startswith("-m") for a in args):
        return subprocess.call([sys.executable, "-m", "pytest", *args])
    lock, stopping = threading.Lock(), Stopping()
    signal.signal(signal.SIGINT, stopping)
    signal.signal(signal.SIGTERM, stopping)
    ended: list[Ended] = []
    for runs in STAGES:
        if stopping.signum is not None:
            break
        if len(runs) > 1:
            names = " and ".join(r.label for r in runs)
            print(f"[tiers] {names}, side by side", flush=True)
        ended += stage(runs, args, lock, stopping)
    print("[tiers] how each run ended:", flush=True)
    for e in ended:
        print(f"  {e.run.label:18s} exit {e.code}  {e.seconds:6.0f}s  {e.summary}", flush=True)
    for e in ended:
        for failure in e.failures:
            print(f"  [{e.run.label}] {failure}", flush=True)
    if stopping.signum is not None:
        return 128 + stopping.signum
    failed = [e.code for e in ended if e.code not in (0, NO_TESTS_COLLECTED)]
    if failed:
        return failed[0]
    if all(e.code == NO_TESTS_COLLECTED for e in ended):
        return NO_TESTS_COLLECTED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
