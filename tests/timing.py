"""Where a pytest run's time goes: each test file's wall time and CPU, each session, package
and module fixture's setup and teardown, the slowest tests, and how busy the machine was,
written as JSON to ``--timings FILE``.

Loaded by every run (``-p tests.timing`` in pyproject.toml's addopts), it does nothing
unless ``--timings`` names a file. ``tests/tiers.py`` gives each of ``make test``'s runs
one (``build/timings/<run>.json``) and prints their summary; ``benchmarks/suite.py``
keeps them with its figures.

CPU is counted where it is spent, so that two runs on a machine others share compare by
CPU seconds as well as by wall time:

- ``cgroup``: as root, on a machine with the cgroup v1 ``cpuacct`` hierarchy, the run
  moves itself into a cgroup of its own at the start, so that every process it starts
  (the control plane, the real node's containerd and kubelet, the in-process operator's
  children) counts, and nothing the machine's other work does; the real node's Pods
  (the kubelet's ``kubepods`` cgroup) count for the run that started the node. The cgroup
  is removed at the end (a later run removes one its processes kept).
- ``process``: elsewhere (or in a pytest-xdist worker), this process and the children it
  has waited for; a process that lives through the run (a control plane) is counted only
  once it ends.

A file's figures are its tests' setup, call and teardown, less the setup and teardown of
session and package fixtures, which are listed by name (the first test to need the
cluster does not pay for starting it). With pytest-xdist each worker measures its tests
and the figures travel with the reports.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
GROUP = "torchyard-timings"  # this plugin's cgroups: CPUACCT / GROUP / <pid>
KUBEPODS = "kubepods"  # the real node's Pods (tests/cluster/realnode.py, cgroupfs driver)
SLOWEST = 30  # tests listed by wall time
SHARED_SCOPES = ("session", "package")  # fixtures whose cost is not one file's
# The clocks as they are now: tests replace time.monotonic (the launcher's DNS wait).
_monotonic, _process_time = time.monotonic, time.process_time


def _process_cpu() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return _process_time() + children.ru_utime + children.ru_stime


def _busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class CpuClock:
    """CPU seconds of this run (see the module docstring), read in microseconds."""

    def __init__(self) -> None:
        self.source = "process"
        self.group: Path | None = None
        self.home: Path | None = None
        self.pods_from: float | None = None  # kubepods usage when the real node started
        self.pods_gone = 0.0  # of real nodes this run stopped

    def enter_cgroup(self) -> None:
        """Move this process into a cgroup of its own, where that is possible."""
        if os.geteuid() != 0 or not (CPUACCT / "cpuacct.usage").exists():
            return
        home = next(
            (
                line.split(":", 2)[2]
                for line in Path("/proc/self/cgroup").read_text().splitlines()
                if "cpuacct" in line.split(":", 2)[1].split(",")
            ),
            None,
        )
        if home is None:
            return
        parent = CPUACCT / GROUP
        try:
            parent.mkdir(exist_ok=True)
            for stale in parent.iterdir():  # of runs whose processes have all ended
                if stale.is_dir() and not (stale / "cgroup.procs").read_text().strip():
                    stale.rmdir()
            group = parent / str(os.getpid())
            group.mkdir(exist_ok=True)
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            return
        self.group, self.home, self.source = group, CPUACCT / home.lstrip("/"), "cgroup"

    def leave_cgroup(self) -> None:
        if self.group is None or self.home is None:
            return
        try:
            (self.home / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()  # refused while a process it started still runs
        except OSError:
            pass

    def _pods(self) -> float:
        try:
            return int((CPUACCT / KUBEPODS / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return 0.0

    def node_started(self) -> None:
        if self.group is not None and self.pods_from is None:
            self.pods_from = self._pods()

    def node_stopped(self) -> None:
        if self.pods_from is not None:
            self.pods_gone += max(0.0, self._pods() - self.pods_from)
            self.pods_from = None

    def seconds(self) -> float:
        if self.group is None:
            return _process_cpu()
        try:
            own = int((self.group / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return _process_cpu()
        pods = self.pods_gone
        if self.pods_from is not None:
            pods += max(0.0, self._pods() - self.pods_from)
        return own + pods


@dataclass
class Spent:
    wall: float = 0.0
    cpu: float = 0.0

    def add(self, wall: float, cpu: float) -> None:
        self.wall += wall
        self.cpu += cpu

    def as_json(self) -> dict[str, float]:
        return {"wall_s": round(self.wall, 3), "cpu_s": round(self.cpu, 3)}


@dataclass
class FileSpent(Spent):
    tests: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {**super().as_json(), "tests": self.tests, "outcomes": self.outcomes}


class Timings:
    """The plugin's state in one pytest process (the controller, with pytest-xdist)."""

    def __init__(self, path: Path | None, worker: bool) -> None:
        self.path = path
        self.worker = worker
        self.clock = CpuClock()
        self.files: dict[str, FileSpent] = {}
        self.fixtures: dict[str, Spent] = {}
        self.tests: list[tuple[float, float, str]] = []
        # exclusive (wall, cpu) of shared fixtures set up or torn down in the current phase
        self.shared_now = Spent()
        self.stack: list[list[float]] = []  # nested fixture setups: time spent by inner ones
        self.begin_wall = _monotonic()
        self.begin_cpu = 0.0
        self.begin_busy = _busy_seconds()
        self.load_before = list(os.getloadavg())
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S%z")

    def now(self) -> tuple[float, float]:
        return _monotonic(), self.clock.seconds()

    # -- fixtures ---------------------------------------------------------------------------
    def fixture_setup(self, fixturedef: pytest.FixtureDef[Any]) -> Iterator[None]:
        shared = fixturedef.scope in SHARED_SCOPES
        wall0, cpu0 = self.now()
        self.stack.append([0.0, 0.0])
        try:
            yield
        finally:
            inner_wall, inner_cpu = self.stack.pop()
            wall1, cpu1 = self.now()
            wall, cpu = wall1 - wall0, cpu1 - cpu0
            if self.stack:  # an outer fixture's time does not include this one's
                self.stack[-1][0] += wall
                self.stack[-1][1] += cpu
            if shared:
                own_wall, own_cpu = wall - inner_wall, cpu - inner_cpu
                self.fixtures.setdefault(f"{fixturedef.argname} (setup)", Spent()).add(
                    own_wall, own_cpu
                )
                self.shared_now.add(own_wall, own_cpu)
                if fixturedef.argname == "real_node":
                    self.clock.node_started()
            if shared and fixturedef.cached_result is not None:
                started: list[tuple[float, float]] = []
                # finalizers run last-in first-out: this one runs just before the
                # fixture's own teardown, pytest_fixture_post_finalizer just after
                fixturedef.addfinalizer(lambda: started.append(self.now()))
                self.teardowns[id(fixturedef)] = started

    teardowns: dict[int, list[tuple[float, float]]]

    def fixture_finalized(self, fixturedef: pytest.FixtureDef[Any]) -> None:
        started = self.teardowns.pop(id(fixturedef), None)
        if not started:
            return
        if fixturedef.argname == "real_node":
            self.clock.node_stopped()
        wall1, cpu1 = self.now()
        wall, cpu = wall1 - started[0][0], cpu1 - started[0][1]
        self.fixtures.setdefault(f"{fixturedef.argname} (teardown)", Spent()).add(wall, cpu)
        self.shared_now.add(wall, cpu)

    # -- tests ------------------------------------------------------------------------------
    def phase(self, item: pytest.Item) -> Iterator[None]:
        """Around one phase of one test: its wall and CPU less the shared fixtures'."""
        self.shared_now = Spent()
        wall0, cpu0 = self.now()
        yield
        wall1, cpu1 = self.now()
        wall = max(0.0, wall1 - wall0 - self.shared_now.wall)
        cpu = max(0.0, cpu1 - cpu0 - self.shared_now.cpu)
        spent = item.stash.setdefault(_SPENT, Spent())
        spent.add(wall, cpu)

    def report(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        if "timing_wall_s" not in props:
            return
        wall, cpu = float(props["timing_wall_s"]), float(props["timing_cpu_s"])
        path = report.nodeid.split("::", 1)[0]
        spent = self.files.setdefault(path, FileSpent())
        spent.add(wall, cpu)
        spent.tests += 1
        outcome = props.get("timing_outcome", report.outcome)
        spent.outcomes[outcome] = spent.outcomes.get(outcome, 0) + 1
        self.tests.append((wall, cpu, report.nodeid))

    def data(self, session: pytest.Session) -> dict[str, Any]:
        wall_s = _monotonic() - self.begin_wall
        files = sorted(self.files.items(), key=lambda kv: -kv[1].wall)
        self.tests.sort(reverse=True)
        return {
            "started": self.started,
            "args": list(session.config.invocation_params.args),
            "exit_status": int(session.exitstatus),
            "wall_s": round(wall_s, 3),
            "cpu_s": round(self.clock.seconds() - self.begin_cpu, 3),
            "cpu_source": self.clock.source,
            "machine": {
                "cpus": os.cpu_count(),
                "busy_cpu_s": round(_busy_seconds() - self.begin_busy, 3),
                "load_before": [round(x, 2) for x in self.load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()],
            },
            "fixtures": {name: s.as_json() for name, s in sorted(self.fixtures.items())},
            "files": {name: s.as_json() for name, s in files},
            "slowest": [
                {"test": nodeid, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3)}
                for wall, cpu, nodeid in self.tests[:SLOWEST]
            ],
        }


_SPENT = pytest.StashKey[Spent]()
_TIMINGS = pytest.StashKey[Timings]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--timings",
        metavar="FILE",
        default=None,
        help="write each test file's wall time and CPU, and each shared fixture's, as JSON "
        "to FILE (tests/timing.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    option = config.getoption("--timings")
    worker = hasattr(config, "workerinput")
    if option is None:
        return
    timings = Timings(None if worker else Path(option), worker)
    timings.teardowns = {}
    if not worker:
        timings.clock.enter_cgroup()
    timings.begin_cpu = timings.clock.seconds()
    config.stash[_TIMINGS] = timings


def _timings(config: pytest.Config) -> Timings | None:
    return config.stash.get(_TIMINGS, None)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    timings = _timings(request.config)
    if timings is None:
        return (yield)
    gen = timings.fixture_setup(fixturedef)
    next(gen)
    try:
        return (yield)
    finally:
        next(gen, None)


def pytest_fixture_post_finalizer(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> None:
    timings = _timings(request.config)
    if timings is not None:
        timings.fixture_finalized(fixturedef)


def _phase(item: pytest.Item) -> Iterator[None]:
    timings = _timings(item.config)
    if timings is None:
        yield
        return
    yield from timings.phase(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):  # type: ignore[no-untyped-def]
    with _around(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):  # type: ignore[no-untyped-def]
    with _around(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    with _around(item):
        return (yield)


class _around:
    def __init__(self, item: pytest.Item) -> None:
        self.gen = _phase(item)

    def __enter__(self) -> None:
        next(self.gen)

    def __exit__(self, *exc: object) -> None:
        next(self.gen, None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report: pytest.TestReport = yield
    if _timings(item.config) is not None and call.when == "teardown":
        spent = item.stash.get(_SPENT, Spent())
        report.user_properties += [
            ("timing_wall_s", round(spent.wall, 4)),
            ("timing_cpu_s", round(spent.cpu, 4)),
        ]
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "teardown":
        return
    # the controller's plugin (or this process's, without xdist) adds it up
    config = getattr(report, "config", None) or _CONFIG.get("config")
    if config is None:
        return
    timings = _timings(config)
    if timings is not None and not timings.worker:
        timings.report(report)


_CONFIG: dict[str, pytest.Config] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _CONFIG["config"] = session.config


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    timings = _timings(session.config)
    if timings is None or timings.path is None:
        return
    timings.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = timings.path.with_name(timings.path.name + ".tmp")
    tmp.write_text(json.dumps(timings.data(session), indent=1) + "\n")
    tmp.replace(timings.path)


def pytest_unconfigure(config: pytest.Config) -> None:
    timings = _timings(config)
    if timings is not None:
        timings.clock.leave_cgroup()
