"""``make test``: its steps, each started as soon as the steps it needs have ended, side by
side on two cores, every line of output labelled with its step, and at the end how each
ended, with its wall time and CPU.

What waits on a control plane, a kubelet or a container (the integration and node tiers;
on two cores the machine is mostly idle while either runs) runs beside what keeps a core
busy (the builds, the checks, the unit and e2e tiers), so the cores stay busy and the
suite ends sooner than with one step after another:

- ``tools`` then ``node-tools`` then ``later-tools``: what the tests need made
  (``tests/cluster/needs.py``; a warm machine has it all cached, and these end at once);
- ``venvs``: the browser tests' Playwright, MLflow's and TensorBoard's venvs (make);
- ``checks``: lint, types, import layers and the documentation site (make);
- the pytest runs (:data:`RUNS`, every test in exactly one): ``unit`` after ``checks``;
  ``integration`` once the control plane's tools and the venvs are made; ``node`` (the
  real kubelet node: one per machine) once the real node's are made too; ``e2e`` (real
  training in local mode) after ``unit``. Each run starts the control plane it needs;
  a test that needs a later build (Kueue, SeaweedFS, ...) waits for it before its
  timeout starts, and such modules run last (``tests/conftest.py``).

Each pytest run writes each test file's wall time and CPU to ``build/timings/<run>.json``
(``tests/timing.py``), and the runner writes every step's to ``build/timings/steps.json``
(``benchmarks/suite.py`` keeps them). A step that fails ends the steps that need it
unstarted; the others go on. Ctrl-C or SIGTERM stops every step (pytest's fixtures stop
their clusters) and starts no other.

    python -m tests.tiers [--tier NAME]... [--no-setup] [--timings DIR] [pytest arguments]

``--tier`` (``make test TIER=...``) runs only that run (``unit``, ``integration``, ``node``,
``e2e``) and what it needs made, no checks; ``--no-setup`` runs only the pytest runs;
``--timings`` names another folder for the figures.
Pytest arguments go to every run (``make test K=...`` gives ``-k``; a run that selects
nothing is no failure); with a ``-m`` of their own, or ``TORCHYARD_TEST_SERIAL=1``,
pytest runs once over everything, after the setup, as asked.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMINGS = ROOT / "build" / "timings"
NO_TESTS_COLLECTED = 5  # pytest's exit code when a selection is empty
NOT_STARTED = -1  # a step whose needs failed, or that came after Ctrl-C
MAKE = ("make", "--no-print-directory")
NEEDS = (sys.executable, "-m", "tests.cluster.needs")


@dataclass(frozen=True)
class Step:
    label: str
    command: tuple[str, ...]
    after: tuple[str, ...] = ()  # the steps that must have ended well before it starts
    markers: str | None = None  # a pytest run's -m ("": none, the caller's)
    # made in the same go when this step is, but not waited for (its tests wait for what
    # they need: tests/conftest.py)
    also: tuple[str, ...] = ()
    # a pytest run's own arguments, and the folders it collects when the caller names none
    options: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()

    @property
    def pytest(self) -> bool:
        return self.markers is not None


# Every test is in exactly one run (tests/unit/test_tiers.py).
LATER = ("later-tools",)
RUNS: tuple[Step, ...] = (
    # two workers: the unit tier waits on its own processes about half the time
    Step("unit", (), ("checks",), "unit", options=("-n", "2"), paths=("tests/unit",)),
    Step(
        "integration",
        (),
        ("tools", "venvs"),
        "integration and not node",
        LATER,
        paths=("tests/integration",),
    ),
    Step(
        "node",
        (),
        ("tools", "node-tools", "venvs"),
        "node",
        LATER,
        paths=("tests/integration", "tests/node"),  # test_harness.py has one node test
    ),
    Step(
        "e2e",
        (),
        ("unit", "venvs"),
        "e2e and not node and not unit and not integration",
        paths=("tests/e2e",),
    ),
)
SETUP: tuple[Step, ...] = (
    Step("tools", (*NEEDS, "control-plane")),
    Step("node-tools", (*NEEDS, "real-node"), ("tools",)),
    Step("later-tools", (*NEEDS, "seaweedfs", "kueue", "syft", "horovod"), ("node-tools",)),
    Step("venvs", (*MAKE, "browser", "mlflow", "tensorboard")),
    Step("checks", (*MAKE, "lint", "typecheck", "layers", "site")),
)


@dataclass
class Ended:
    step: Step
    code: int
    began: float  # seconds after the first step started
    seconds: float
    cpu: float
    summary: str
    failures: tuple[str, ...] = ()
    timings: dict[str, object] = field(default_factory=dict)

    @property
    def well(self) -> bool:
        """It ended as a step its followers may build on (a run that selects nothing too)."""
        return self.code == 0 or (self.step.pytest and self.code == NO_TESTS_COLLECTED)


class Stopping:
    """SIGINT or SIGTERM to this process: SIGINT, once, to every step (each in a session of
    its own, so that a terminal's Ctrl-C reaches them only this way, once)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.running: list[subprocess.Popen[bytes]] = []
        self.lock = threading.Lock()

    def __call__(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum = signum
            print(f"[tiers] {signal.Signals(signum).name}: stopping every step", flush=True)
            for proc in list(self.running):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)


# pytest's last line: "3 passed, 1 skipped in 12.34s" (or "no tests ran in 0.01s")
SUMMARY = re.compile(rb"\b(passed|failed|errors?|skipped|deselected|no tests ran)\b.* in [\d.]+s")
# its short summary's lines for what failed: "FAILED tests/x.py::test_y - AssertionError: ..."
FAILURE = re.compile(rb"^(FAILED|ERROR) \S+")
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped)\b")
FAILURE_CHARS = 240  # of each, in the closing table: the test and the start of its reason


def command(step: Step, args: Sequence[str]) -> list[str]:
    """A step's command; a pytest run's with its marker expression, its timings file and
    the caller's arguments."""
    if not step.pytest:
        return list(step.command)
    markers = ["-m", step.markers] if step.markers else []
    timings = ["-p", "tests.timing", "--timings", str(TIMINGS / f"{step.label}.json")]
    named = any(Path(ROOT, a.split("::")[0]).exists() for a in args if not a.startswith("-"))
    paths = [] if named else list(step.paths)
    return [sys.executable, "-m", "pytest", *markers, *step.options, *timings, *args, *paths]


def environment() -> dict[str, str]:
    """This process's, with Python's bytecode kept: an inherited PYTHONDONTWRITEBYTECODE
    would compile every module again in each of the suite's processes, and pytest would
    rewrite every test module's asserts in each run."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def relay(step: Step, proc: subprocess.Popen[bytes], lock: threading.Lock) -> Ended:
    """Each line of ``step``'s output, prefixed with its label, to this process's stdout,
    until it ends; then how it ended: pytest's summary line (else the last non-empty
    line; what the interpreter writes after it at exit does not take its place), and the
    short summary's FAILED and ERROR lines, so that the end of a long log names them."""
    prefix, last, summary = f"[{step.label}] ".encode(), b"", b""
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
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = (summary or last).decode("utf-8", "replace").strip("= ")
    return Ended(
        step,
        proc.returncode,
        0.0,
        0.0,
        usage.ru_utime + usage.ru_stime,
        text,
        tuple(f.decode("utf-8", "replace")[:FAILURE_CHARS] for f in failures),
    )


def run_steps(steps: Sequence[Step], args: Sequence[str], stopping: Stopping) -> list[Ended]:
    """Every step, each once the steps it needs have ended well (one whose needs failed
    does not start), side by side; how each ended, in the order they ended."""
    lock, done = threading.Lock(), threading.Condition()
    ended: dict[str, Ended] = {}
    began = time.monotonic()
    names = {s.label for s in steps}
    waiting = list(steps)
    threads: list[threading.Thread] = []

    def follow(step: Step, proc: subprocess.Popen[bytes], start: float) -> None:
        result = relay(step, proc, lock)
        result.began, result.seconds = start - began, time.monotonic() - start
        if step.pytest:
            result.timings = _read(TIMINGS / f"{step.label}.json")
            if isinstance(result.timings.get("cpu_s"), float):
                result.cpu = float(result.timings["cpu_s"])  # type: ignore[arg-type]
        with done:
            ended[step.label] = result
            stopping.running.remove(proc)
            done.notify_all()

    with done:
        while True:
            for step in list(waiting):
                needs = [n for n in step.after if n in names]
                failed = [n for n in needs if n in ended and not ended[n].well]
                if failed or stopping.signum is not None:
                    waiting.remove(step)
                    why = f"{', '.join(failed)} failed" if failed else "stopped"
                    ended[step.label] = Ended(
                        step, NOT_STARTED, 0.0, 0.0, 0.0, f"not started: {why}"
                    )
                    continue
                if all(n in ended for n in needs):
                    waiting.remove(step)
                    start = time.monotonic()
                    (TIMINGS / f"{step.label}.json").unlink(missing_ok=True)
                    print(f"[tiers] {step.label}: started", flush=True)
                    proc = subprocess.Popen(
                        command(step, args),
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        cwd=ROOT,
                        env=environment(),
                    )
                    stopping.running.append(proc)
                    thread = threading.Thread(target=follow, args=(step, proc, start), daemon=True)
                    threads.append(thread)
                    thread.start()
            if not waiting and all(not t.is_alive() for t in threads):
                break
            done.wait(1.0)
    for thread in threads:
        thread.join()
    return sorted(ended.values(), key=lambda e: e.began + e.seconds)


def _read(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def report(ended: Sequence[Ended]) -> None:
    print("[tiers] how each step ended:", flush=True)
    for e in ended:
        print(
            f"  {e.step.label:12s} exit {e.code:<3d} {e.seconds:6.0f}s  cpu {e.cpu:6.0f}s  "
            f"from {e.began:5.0f}s  {e.summary}",
            flush=True,
        )
    for e in ended:
        for failure in e.failures:
            print(f"  [{e.step.label}] {failure}", flush=True)
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for e in ended:
        for number, word in COUNT.findall(e.summary if e.step.pytest else ""):
            key = "failed" if word.startswith("error") else word
            if key in counts:
                counts[key] += int(number)
    # every run's tests in one plain line, the suite's last
    passed, failed, skipped = counts["passed"], counts["failed"], counts["skipped"]
    print(f"total: {passed} passed, {failed} failed, {skipped} skipped", flush=True)


def record(ended: Sequence[Ended], started: float) -> None:
    """Every step's figures (``build/timings/steps.json``), for benchmarks/suite.py."""
    TIMINGS.mkdir(parents=True, exist_ok=True)
    data = {
        "wall_s": round(time.monotonic() - started, 3),
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "steps": [
            {
                "step": e.step.label,
                "exit": e.code,
                "began_s": round(e.began, 3),
                "wall_s": round(e.seconds, 3),
                "cpu_s": round(e.cpu, 3),
                "summary": e.summary,
            }
            for e in ended
        ],
    }
    (TIMINGS / "steps.json").write_text(json.dumps(data, indent=1) + "\n")


def plan(tiers: Sequence[str], setup: bool, serial: bool) -> list[Step]:
    """The steps to run: every pytest run (those of ``tiers``; or, ``serial``, one over
    everything with the caller's markers) and, with ``setup``, the steps they need (and
    the checks, unless tiers are named)."""
    if serial:
        everything = tuple(s.label for s in SETUP)
        runs = [Step("pytest", (), everything, "")]
    else:
        runs = [r for r in RUNS if not tiers or r.label in tiers]
    if not setup:
        return runs
    wanted: set[str] = {n for r in runs for n in r.also}
    todo = [n for r in runs for n in r.after if n != "checks"] + ([] if tiers else ["checks"])
    setup_steps = {s.label: s for s in SETUP}
    while todo:
        name = todo.pop()
        if name in setup_steps and name not in wanted:
            wanted.add(name)
            todo += setup_steps[name].after
    # a step waits for the steps it comes after only where the plan has them
    return [s for s in SETUP if s.label in wanted] + runs


def main(argv: Sequence[str]) -> int:
    global TIMINGS
    args, tiers, setup = list(argv), [], True
    while args and args[0] in ("--tier", "--no-setup", "--timings"):
        option = args.pop(0)
        if option == "--no-setup":
            setup = False
        elif args and option == "--tier":
            tiers.append(args.pop(0))
        elif args:
            TIMINGS = Path(args.pop(0)).resolve()
    known = [r.label for r in RUNS]
    if any(t not in known for t in tiers):
        print(f"[tiers] --tier takes one of {', '.join(known)}, not {', '.join(tiers)}")
        return 2
    # a marker expression of the caller's would replace each run's: one run then
    serial = os.environ.get("TORCHYARD_TEST_SERIAL") == "1" or any(a.startswith("-m") for a in args)
    steps = plan(tiers, setup, serial)
    stopping = Stopping()
    signal.signal(signal.SIGINT, stopping)
    signal.signal(signal.SIGTERM, stopping)
    started = time.monotonic()
    ended = run_steps(steps, args, stopping)
    report(ended)
    record(ended, started)
    if stopping.signum is not None:
        return 128 + stopping.signum
    failed = [e.code for e in ended if not e.well]
    if failed:
        return next((c for c in failed if c > 0), 1)
    runs = [e.code for e in ended if e.step.pytest]
    if runs and all(c == NO_TESTS_COLLECTED for c in runs):
        return NO_TESTS_COLLECTED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
