"""One local execution of a TrainingRun (:class:`LocalRun`, started by :func:`run_local`):
a working folder per node holding a copy of the selected source files, one launcher
process per node with the variables of a node Pod's launcher
(``planning.pods.launcher_env``) and MASTER_ADDR 127.0.0.1 on a free port, a progress
line per node, and a failing node stopping the others (as the operator deletes sibling
Pods). Then ``local.finalize`` archives and
registers. Called through ``torchyard.local`` by the SDK's ``local_runs``; tested in
tests/unit/local/test_mode.py and tests/e2e/.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import IO, Any

import torchyard.launch.main
from torchyard import distributions
from torchyard.api import Environment, TrainingRun
from torchyard.launch import coordination
from torchyard.launch.contract import (
    TORCHYARD_CHECKPOINT_DIR,
    TORCHYARD_GRACE_PERIOD,
    TORCHYARD_LOCAL_RUNS,
    TORCHYARD_NODE_COOKIE,
    TORCHYARD_PROGRESS_FILE,
    TORCHYARD_REGISTRY,
    TORCHYARD_TERMINATION_LOG,
)
from torchyard.launch.ranks import end_leftovers
from torchyard.local import attempts
from torchyard.local import inputs as local_inputs
from torchyard.local.checks import missing_packages
from torchyard.local.console import Console, Progress, progress_line
from torchyard.local.finalize import INTERRUPTED, archive_and_register, record
from torchyard.local.results import LocalResult, NodeResult, first_failure, settle_seconds
from torchyard.planning import checkpoints, pods
from torchyard.planning import inputs as run_inputs
from torchyard.records.build import timestamp as build_timestamp
from torchyard.registry import Store

LAUNCHER_FILE = Path(torchyard.launch.main.__file__)
PROGRESS_EVERY_SECONDS = 0.5  # how often the progress line is read and drawn again


def default_registry() -> Path:
    return Path(os.environ.get(TORCHYARD_REGISTRY, "~/.torchyard/registry")).expanduser()


def default_workroot() -> Path:
    return Path(os.environ.get(TORCHYARD_LOCAL_RUNS, "~/.torchyard/runs")).expanduser()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalRun:
    """One local execution of a TrainingRun (see the module docstring); made by
    :func:`run_local`, which fills in the defaults."""

    def __init__(
        self,
        run: TrainingRun,
        source: Path,
        files: Sequence[str],
        environment: Environment | None,
        *,
        store_root: Path,
        workroot: Path,
        out: IO[str],
        grace: int,
        resume: attempts.Resume = "auto",
        stdout: IO[str] | None = None,
        label: str = "",
    ) -> None:
        """``label``: put before each line of its output (a sweep's trial name, when several
        trials run at once)."""
        self.run = run
        self.source = source.resolve()
        # Relative /-separated paths under source; nothing else is copied.
        self.files = list(files)
        self.store_root = store_root.expanduser().resolve()
        # Absolute: the launchers run in the node folders, and their TORCHYARD_OUTPUTS
        # and TORCHYARD_LOGS are paths under it (a relative --workdir nested them).
        self.workroot = workroot.expanduser().resolve()
        self.environment = environment
        self.out = out
        # where the nodes' standard output goes (the CLI's own; the SDK's transcript)
        self.stdout = stdout
        self.grace = grace
        self.resume = resume
        self.started_at: dict[int, datetime] = {}  # when each node's launcher started
        self.interrupted: KeyboardInterrupt | None = None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.workdir = self.workroot / f"{run.namespace}-{run.name}-{stamp}-{os.getpid()}"
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        # Each node's launcher marks what its ranks start with this (TORCHYARD_NODE_COOKIE): what
        # is left of them when the node ended is ended, even should its launcher be killed.
        self.cookies: dict[int, str] = {}
        self.coordinator_port = 0  # node 0's coordinator (in-place restarts), set by _start
        self.console = Console(out, label=label)
        self.progress = Progress({})
        self.ended = threading.Event()  # every node ended: no more progress to show
        self.input_paths: dict[str, str] = {}  # each input's folder (local.inputs)
        self.attempt: attempts.Attempt | None = None  # with checkpoints: this attempt
        self.warnings: list[str] = []
        # this execution's uid (its record's), the run's own when it has one
        self.uid = str(run.metadata.get("uid") or uuid.uuid4())

    def say(self, text: str) -> None:
        self.console.write(self.out, f"[torchyard] {text}\n".encode())

    def node_dir(self, node: int) -> Path:
        return self.workdir / f"node-{node}"

    def _check_source(self) -> None:
        """Every file to copy is a regular file (or a link to one) under the source folder."""
        if not self.source.is_dir():
            raise FileNotFoundError(f"source folder {self.source} does not exist")
        for rel in self.files:
            parts = PurePosixPath(rel).parts
            if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
                raise ValueError(f"source file {rel!r} is not a path inside {self.source}")
            if not (self.source / rel).is_file():  # a link to a file is copied as the file
                raise FileNotFoundError(f"source file {self.source / rel} is not a regular file")

    def _claim_workdir(self) -> None:
        """Create this run's folder; '-2', '-3'... when a run of the same second has it."""
        self.workroot.mkdir(parents=True, exist_ok=True)
        base, n = self.workdir, 1
        while True:
            try:
                self.workdir.mkdir()
                return
            except FileExistsError:
                n += 1
                self.workdir = base.with_name(f"{base.name}-{n}")

    def _prepare(self) -> list[str]:
        warnings = []
        missing = missing_packages(self.environment)
        if missing:
            warnings.append(
                f"Environment {self.run.spec.environment}: not installed in this Python "
                f"({sys.executable}): {', '.join(missing)}; the run may fail to import them"
            )
        for node in range(self.run.spec.distribution.node_count):
            self.node_dir(node).mkdir()
            for rel in self.files:
                target = self.node_dir(node) / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(self.source / rel, target)
        return warnings

    def _env(self, node: int, port: int) -> dict[str, str]:
        env = dict(os.environ)
        # The same variables as a node Pod's launcher; MPI: one launcher runs the local
        # mpirun with every slot on this machine (no agent); checkpoints: the same
        # contract as in a cluster, in a folder of this machine (checkpoint_dir)
        env.update(
            pods.launcher_env(
                self.run,
                node,
                workdir=str(self.node_dir(node)),
                grace_period=self.grace,
                attempt=self.workdir.name,
                master_addr="127.0.0.1",
                master_port=port,
                local=True,
            )
        )
        env.update(run_inputs.env(self.run, self.input_paths))
        # backoffLimit: the launchers restart their ranks in place, as in a cluster (the
        # coordinator on a free port of this machine); there is no gang to restart here
        limit = self.run.spec.policy.backoff_limit
        budget = coordination.Budget(limit, 0) if limit > 0 else None
        env.update(pods.in_place_env(self.run, budget, f"127.0.0.1:{self.coordinator_port}"))
        env[TORCHYARD_TERMINATION_LOG] = str(self.node_dir(node) / "termination-log.json")
        # its summaries for the run's one progress line (not as JSON on the terminal)
        env[TORCHYARD_PROGRESS_FILE] = str(self.progress_file(node))
        cookie = self.cookies.setdefault(node, os.urandom(8).hex())
        env[TORCHYARD_NODE_COOKIE] = cookie
        env[TORCHYARD_GRACE_PERIOD] = str(self.grace)
        if self.run.spec.checkpoints is not None:
            # the folder outlives this execution: the next `torchyard run --local` of the
            # run resumes from it
            env[TORCHYARD_CHECKPOINT_DIR] = str(self.checkpoint_dir())
        # The current interpreter's scripts (torchrun, ...) come first, as in its venv.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        return env

    def progress_file(self, node: int) -> Path:
        """The node's progress summaries, one JSON a line (``launch.tracker.ProgressTracker``)."""
        return self.node_dir(node) / "progress.jsonl"

    def checkpoint_dir(self) -> Path:
        """The run's checkpoint folder here: per namespace and claim (or run) name."""
        spec = self.run.spec.checkpoints
        key = (spec.claim_name if spec is not None else None) or self.run.name
        return self.workroot / "checkpoints" / self.run.namespace / key

    def _stop_seconds(self) -> int:
        """How long a stopped node may take: with checkpoints, the just-in-time save too."""
        if self.run.spec.checkpoints is None:
            return self.grace + 5
        return checkpoints.save_seconds(self.run, self.grace) + self.grace + 5

    def _start(self) -> None:
        port = free_port()
        self.coordinator_port = free_port()
        dist = self.run.spec.distribution
        nodes, note = distributions.of(dist).local_launchers(dist, self._env(0, port)["PATH"])
        if note:
            self.say(note)
        self.progress = Progress({node: str(self.progress_file(node)) for node in range(nodes)})
        threading.Thread(target=self._show_progress, daemon=True).start()
        for node in range(nodes):
            self.procs[node] = subprocess.Popen(
                [sys.executable, str(LAUNCHER_FILE), "--", *self.run.spec.command],
                cwd=self.node_dir(node),
                env=self._env(node, port),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            # relayed, so that the progress line stays below the nodes' output
            stdout, stderr = self.procs[node].stdout, self.procs[node].stderr
            assert stdout is not None and stderr is not None
            self.started_at[node] = datetime.now(timezone.utc)
            self.console.relay(stdout, self.stdout or sys.stdout)
            self.console.relay(stderr, self.out)
            nproc = self.run.spec.distribution.process_count_per_node
            what = (
                f"{nproc} process(es)"
                if self.run.spec.distribution.launch == "process"
                else "the command once (launch: node)"
            )
            self.say(f"node {node} started: {what}, pid {self.procs[node].pid}")

    def _show_progress(self) -> None:
        """The run's one progress line, from the nodes' summaries, until every node ended."""
        while not self.ended.wait(PROGRESS_EVERY_SECONDS):
            self.progress.read()
            self.console.show(progress_line(self.progress.run()))

    def _end_leftovers(self) -> None:
        """Once the launchers ended: what their ranks started that still runs (a killed
        launcher could not end it itself), and the relays of their output."""
        self.ended.set()
        for cookie in self.cookies.values():
            end_leftovers(cookie)
        self.console.join()

    def _stop_all(self, signum: int = signal.SIGTERM) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signum)

    def _wait(self, started: float) -> list[NodeResult]:
        done: dict[int, NodeResult] = {}
        settle_until: float | None = None  # when to stop the others after a failure
        stop_deadline: float | None = None
        while len(done) < len(self.procs):
            for node, proc in self.procs.items():
                code = proc.poll()
                if code is None or node in done:
                    continue
                result = self._node_result(node, code, started)
                done[node] = result
                if code != 0:  # (the launcher itself says when all its ranks succeeded)
                    self.say(f"node {node} failed (exit code {code}) after {result.seconds:.1f}s")
                if code != 0 and stop_deadline is None:
                    # as the operator does on each report: a failure that may be what its
                    # ranks saw of another node's (a lost peer, a stall) waits for the
                    # others to report
                    running = len(done) < len(self.procs)
                    wait = settle_seconds(list(done.values()), running, time.time())
                    settle_until = time.monotonic() + (wait or 0.0)
                    if wait:
                        self.say(f"waiting up to {wait:.0f}s for the other nodes to report")
            settled = settle_until is not None and (
                time.monotonic() >= settle_until or len(done) == len(self.procs)
            )
            if settled and stop_deadline is None:
                self.say("stopping the other nodes")
                self._stop_all()
                stop_deadline = time.monotonic() + self.grace + 5
            if stop_deadline is not None and time.monotonic() > stop_deadline:
                self._stop_all(signal.SIGKILL)
            time.sleep(0.05)
        return [done[n] for n in sorted(done)]

    def _node_result(self, node: int, code: int, started: float) -> NodeResult:
        return NodeResult(
            node,
            code,
            time.monotonic() - started,
            self._termination(node),
            started_at=self.started_at.get(node),
            finished_at=datetime.now(timezone.utc),
        )

    def _termination(self, node: int) -> dict[str, Any]:
        path = self.node_dir(node) / "termination-log.json"
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return data

    def _checkpoints_first(self, started_at: datetime) -> None:
        """With checkpoints: resume from them or start fresh (``local.attempts``), said
        before anything starts, and this attempt marked as running."""
        if self.run.spec.checkpoints is None:
            return
        folder = self.checkpoint_dir()
        world = self.run.spec.distribution.world_size
        decision = attempts.decide(
            attempts.read(folder), attempts.newest_step(folder, world), self.resume, folder
        )
        if decision.set_aside:
            attempts.set_aside(folder)
        self.say(decision.message)
        self.attempt = attempts.Attempt(self.run.name, build_timestamp(started_at), "Running")
        attempts.write(folder, self.attempt)

    def _attempt_ended(self, outcome: str) -> int | None:
        """Mark this attempt's outcome beside the checkpoints; the newest step kept."""
        if self.run.spec.checkpoints is None or self.attempt is None:
            return None
        folder = self.checkpoint_dir()
        step = attempts.newest_step(folder, self.run.spec.distribution.world_size)
        ended = build_timestamp(datetime.now(timezone.utc))
        attempts.write(
            folder,
            attempts.Attempt(self.run.name, self.attempt.started, outcome, ended, step),
        )
        return step

    def interrupt(self) -> None:
        """From another thread (the SDK's Ctrl-C or ``cancel()``): stop every node as
        Ctrl-C does here; :meth:`execute` then ends as an interrupted run."""
        self.interrupted = KeyboardInterrupt()
        self._stop_all()

    def _interrupt(self, err: KeyboardInterrupt, started: float) -> list[NodeResult]:
        """Ctrl-C, SIGTERM or SIGHUP: every node asked to stop (a just-in-time checkpoint
        saved where the run has checkpoints), then killed after its time."""
        self.interrupted = err
        self.say(f"{interruption(err)}: stopping every node")
        self._stop_all()
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(self._stop_seconds())
        self._stop_all(signal.SIGKILL)
        self._end_leftovers()
        return [
            self._node_result(node, proc.wait(), started)
            for node, proc in sorted(self.procs.items())
        ]

    def execute(self) -> LocalResult:
        """Run it to its end. Interrupted (Ctrl-C, SIGTERM, SIGHUP), it stops every node,
        archives and records what there is, says how to go on, and raises the
        KeyboardInterrupt again."""
        dist = self.run.spec.distribution
        self._check_source()
        self._claim_workdir()
        self.say(
            f"TrainingRun {self.run.namespace}/{self.run.name}: {dist.node_count} node(s) x "
            f"{dist.process_count_per_node} process(es) = world size {dist.world_size}, "
            f"launch: {dist.launch}, locally in {self.workdir}"
        )
        started = time.monotonic()
        started_at = datetime.now(timezone.utc)
        self._checkpoints_first(started_at)
        self.input_paths = local_inputs.fetch_all(
            self.run, self.workdir, Store(self.store_root), self.say
        )
        self.warnings = warnings = self._prepare()
        for warning in warnings:
            self.say(f"warning: {warning}")
        with stopped_by_signals():  # held while stopping too: a second signal is ignored
            try:
                self._start()
                nodes = self._wait(started)
            except KeyboardInterrupt as err:
                nodes = self._interrupt(err, started)
            else:
                self._end_leftovers()
            result = self._finish(nodes, started, started_at)
        if self.interrupted is not None:
            raise self.interrupted
        return result

    def _finish(self, nodes: list[NodeResult], started: float, started_at: datetime) -> LocalResult:
        """Archive, register, record; and say how an interrupted run goes on."""
        failure = first_failure(nodes, self.run.spec.distribution.process_count_per_node)
        if self.interrupted is not None:
            failure = {
                "reason": INTERRUPTED,
                "message": f"{interruption(self.interrupted)}: every node was stopped",
                "exitCode": 128 + getattr(self.interrupted, "signum", signal.SIGINT),
            }
        exit_code = 0 if failure is None else int(failure.get("exitCode") or 1)
        result = LocalResult(
            exit_code, self.workdir, nodes, failure=failure, warnings=self.warnings
        )
        folders = [self.node_dir(n) for n in range(len(self.procs))]
        try:
            store = Store(self.store_root)
            archive_and_register(self.run, self.environment, store, folders, result, self.say)
        except (OSError, RuntimeError) as err:
            self.say(f"finalizing failed: {err}")
            result.exit_code = result.exit_code or 1
            result.failure = result.failure or {"reason": "FinalizeFailed", "message": str(err)}
        result.seconds = time.monotonic() - started
        if result.in_place:
            self.say(
                f"the ranks were restarted in place {result.in_place['inPlace']} time(s); the "
                f"last: {result.in_place.get('message')}"
            )
        outcome = "Succeeded" if result.succeeded else "Failed"
        step = self._attempt_ended(INTERRUPTED if self.interrupted is not None else outcome)
        try:
            record(self.run, result, folders, self.store_root, started_at, self.say, self.uid)
        except (OSError, ValueError) as err:
            self.say(f"the run's record was not written: {err}")
        if self.interrupted is not None:
            self.say(self._how_to_go_on(step))
        return result

    def _how_to_go_on(self, step: int | None) -> str:
        """What an interrupted run says last."""
        if self.run.spec.checkpoints is None:
            return "run it again to start it over (it has no spec.checkpoints to resume from)"
        where = f"checkpoints in {self.checkpoint_dir()}"
        if step is None:
            return f"run it again to start it over: no checkpoint was complete yet ({where})"
        return f"run it again to resume from step {step} ({where}; --fresh starts over)"


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached a local run: it stops as on Ctrl-C (every node asked to
    stop, the just-in-time checkpoint saved, no process left behind)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# What a local run turns into :class:`Stopped`, as torchrun's agent does; a signal the
# process was started with ignored (``nohup`` ignores SIGHUP) stays ignored.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """Within: SIGTERM and SIGHUP raise :class:`Stopped` (once; a second one is ignored so
    that the stop runs to its end). The nodes run in sessions of their own, so without
    this a ``kill``, a process manager or a closed terminal ended the CLI alone and left
    every node training. Only in the main thread (where Python runs signal handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        if not raised:
            raised.append(signum)
            raise Stopped(signum)

    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig, handler in before.items():
        if handler == signal.SIG_DFL:
            signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler == signal.SIG_DFL:
                signal.signal(sig, handler)


def interruption(err: KeyboardInterrupt) -> str:
    """How a stopped run says what stopped it."""
    return f"{err} received" if isinstance(err, Stopped) else "interrupted"


def run_local(
    run: TrainingRun,
    source: Path,
    files: Sequence[str],
    *,
    registry: Path | None = None,
    workroot: Path | None = None,
    environment: Environment | None = None,
    out: IO[str] | None = None,
    grace_seconds: int = 10,
    resume: attempts.Resume = "auto",
) -> LocalResult:
    """Run ``run`` on this machine with ``files`` of ``source`` in every node's folder.

    ``registry``: the local registry folder (default :func:`default_registry`);
    ``workroot``: where each run's folder is made (default :func:`default_workroot`);
    ``environment``: the run's Environment, whose pip packages are checked in this Python
    and whose image is recorded with the model; ``out``: where progress lines go
    (standard error); ``grace_seconds``: how long a stopped node has to exit; ``resume``:
    with checkpoints, whether to resume from them (``local.attempts``)."""
    return LocalRun(
        run,
        source,
        files,
        environment,
        store_root=registry or default_registry(),
        workroot=workroot or default_workroot(),
        out=out or sys.stderr,
        grace=grace_seconds,
        resume=resume,
    ).execute()


__all__ = [
    "INTERRUPTED",
    "LAUNCHER_FILE",
    "LocalRun",
    "default_registry",
    "default_workroot",
    "free_port",
    "run_local",
]
