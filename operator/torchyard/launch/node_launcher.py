"""One node's launcher (:class:`Launcher`): starts its ranks, watches them (a failure, a
stall, a signal), stops the rest, and says what happened in the JSON termination message.

Standard library only, Python >= 3.8; shipped with the launcher, whose ``main`` runs it
(``mpi_launcher.MpiLauncher`` for MPI runs). What it reads from its environment is in
``torchyard.launch.main``'s docstring. Tested as real processes in tests/unit/launcher/.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from torchyard.launch.contract import (
    LOCAL_WORLD_SIZE,
    LOG_LIMIT_BYTES,
    MASTER_ADDR,
    NODE_RANK,
    RANK,
    STALLED_REASON,
    TENSORBOARD_DIR_NAME,
    TERMINATION_LOG,
    TORCHYARD_CGROUP_ROOT,
    TORCHYARD_CHECKPOINT_ATTEMPT,
    TORCHYARD_CHECKPOINT_DIR,
    TORCHYARD_CHECKPOINT_KEEP,
    TORCHYARD_CHECKPOINT_MAX_STALLS,
    TORCHYARD_CHECKPOINT_SAVE_SECONDS,
    TORCHYARD_DNS_TIMEOUT,
    TORCHYARD_GRACE_PERIOD,
    TORCHYARD_LAUNCH,
    TORCHYARD_LOG_RULES,
    TORCHYARD_LOGS,
    TORCHYARD_NODE_COOKIE,
    TORCHYARD_NPROC_PER_NODE,
    TORCHYARD_OUTPUTS,
    TORCHYARD_PROGRESS_FILE,
    TORCHYARD_PROGRESS_INTERVAL,
    TORCHYARD_RESUME_FROM,
    TORCHYARD_SHIPPED_PATH,
    TORCHYARD_TENSORBOARD_DIR,
    TORCHYARD_TERMINATION_LOG,
    WORLD_SIZE,
    LaunchError,
    expand_arguments,
    int_env,
    process_env,
    termination_message,
    traceback_tail,
    write_termination,
)
from torchyard.launch.in_place import InPlaceRestarts
from torchyard.launch.node_files import archive_node
from torchyard.launch.output import Echo, LogScanner, log_limit
from torchyard.launch.ranks import (
    Rank,
    alive,
    end_leftovers,
    memory_limit,
    oom_kills,
    oom_message,
    own_package_folder,
    wait_for_dns,
    writable_folder,
)
from torchyard.launch.stalls import (
    collect_stacks,
    culprit,
    describe_stall,
    install_stack_hook,
    prune_empty,
    rank_processes,
    stall_limits,
)
from torchyard.launch.torchrun import TORCHRUN_RANK, torchrun_root_cause, worker_traceback
from torchyard.launch.tracker import ProgressTracker, merge_metrics

# Ranks that exited with status 0 that a termination message names (``earlyExits``).
EARLY_EXITS_REPORTED = 4


def checkpoint_module(env: Mapping[str, str]) -> Any:
    """``torchyard.checkpoint`` (standard library only, shipped beside the launcher): from
    TORCHYARD_SHIPPED_PATH in a node Pod, else the installed package (local mode).
    Imported by name, only when the run has a checkpoint folder."""
    import importlib

    shipped = env.get(TORCHYARD_SHIPPED_PATH, "")
    if shipped and shipped not in sys.path:
        sys.path.insert(0, shipped)
    try:
        return importlib.import_module("torchyard.checkpoint")
    except ImportError as err:
        raise LaunchError(
            f"{TORCHYARD_CHECKPOINT_DIR} is set but torchyard.checkpoint cannot be imported "
            f"({err}): run the launcher from the torchyard package folder"
        ) from None


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class Launcher(InPlaceRestarts):
    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str] | None = None,
        out: IO[str] | None = None,
        err: IO[str] | None = None,
    ) -> None:
        if not command:
            raise LaunchError("no command given: usage: main.py -- <command> [args...]")
        self.command = list(command)
        self.env = dict(os.environ if env is None else env)
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.ranks: list[Rank] = []
        self.stopping: int | None = None  # the signal we were asked to stop with
        self._lock = threading.Lock()
        # The node's own output (ranks' lines and these messages), written by one thread
        # so that a slow reader never makes a rank wait (Echo).
        self.echo = Echo(self.err)
        # Carried by every process the ranks start (TORCHYARD_NODE_COOKIE): what is left of
        # them when they ended is found and ended (end_leftovers). Local mode gives its
        # own, to find them too should this launcher be killed.
        self.cookie = self.env.get(TORCHYARD_NODE_COOKIE) or os.urandom(8).hex()
        self.log_limit = LOG_LIMIT_BYTES  # TORCHYARD_LOG_LIMIT_BYTES, read by run()
        # Local mode: the node's progress summaries go to this file, one JSON a line, for
        # its one progress line (torchyard.local), instead of this output.
        self.progress_file = self.env.get(TORCHYARD_PROGRESS_FILE) or None
        self.cgroup = self.env.get(TORCHYARD_CGROUP_ROOT) or "/sys/fs/cgroup"
        self._oom_kills = oom_kills(self.cgroup)  # before any rank ran
        self.progress = ProgressTracker(".")  # replaced in run(), once logs/ is known
        self.scanner = LogScanner(self.env.get(TORCHYARD_LOG_RULES, ""))
        # a stalled rank, as found by _check_stall: (the Rank, what the status says of it)
        self.stall: tuple[Rank, dict[str, Any]] | None = None
        self._stall_check_at = 0.0
        self.stacks = ""
        # With TORCHYARD_CHECKPOINT_DIR: a torchyard.checkpoint.NodeCheckpoints (run()),
        # the deadline of a just-in-time save, and what the termination message adds.
        self.checkpoints: Any = None
        self._save_until: float | None = None
        self._asked_at = 0.0  # when this launcher last asked for the just-in-time save
        self.checkpoint_info: dict[str, Any] = {}
        # launch: node: the ranks the node command started ({rank: [pid, when it ended or
        # None]}), watched every half second (``_watch_node_ranks``)
        self._node_ranks: dict[int, list[Any]] = {}
        self._node_ranks_at = 0.0

    def say(self, text: str) -> None:
        self.echo.put(self.err, f"[torchyard] {text}\n".encode())

    def _end_leftovers(self) -> None:
        """Once every rank exited: end whatever they started that still runs (a helper in
        a session of its own would otherwise outlive the node, and hold its output
        threads while it holds their pipes)."""
        pipes = [inode for rank in self.ranks for inode in rank.pipes]
        ended = end_leftovers(self.cookie, [rank.proc.pid for rank in self.ranks], pipes)
        if ended:
            self.say(
                f"ended {len(ended)} process(es) the ranks left running "
                f"(pid {', '.join(map(str, ended[:10]))}{', ...' if len(ended) > 10 else ''})"
            )

    def _config(self) -> tuple[str, int, int, str]:
        env = self.env
        launch = env.get(TORCHYARD_LAUNCH, "process")
        if launch not in ("process", "node"):
            raise LaunchError(f"{TORCHYARD_LAUNCH} must be 'process' or 'node', got {launch!r}")
        nproc = int_env(env, TORCHYARD_NPROC_PER_NODE, 1)
        node_rank = int_env(env, NODE_RANK, 0)
        if nproc < 1:
            raise LaunchError(f"{TORCHYARD_NPROC_PER_NODE} must be >= 1")
        env.setdefault(TORCHYARD_NPROC_PER_NODE, str(nproc))
        env.setdefault(NODE_RANK, str(node_rank))
        env.setdefault(LOCAL_WORLD_SIZE, str(nproc))
        env.setdefault(WORLD_SIZE, str(nproc))
        # As torchrun: one intra-op thread per process unless told otherwise, so that
        # N ranks on a node do not each start one thread per core.
        if nproc > 1:
            env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("PYTHONUNBUFFERED", "1")
        # The ranks import torchyard (``from torchyard import progress``) from the shipped
        # package, ahead of the image's PYTHONPATH: in a node Pod a ConfigMap volume,
        # elsewhere a link to the launcher's own package (``run``).
        shipped = env.get(TORCHYARD_SHIPPED_PATH)
        if shipped:
            paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
            env["PYTHONPATH"] = os.pathsep.join([shipped, *(p for p in paths if p != shipped)])
        for name, default in ((TORCHYARD_LOGS, "logs"), (TORCHYARD_OUTPUTS, "outputs")):
            env[name] = writable_folder(name, env.get(name) or os.path.abspath(default), self.say)
        env[TORCHYARD_TENSORBOARD_DIR] = os.path.join(env[TORCHYARD_OUTPUTS], TENSORBOARD_DIR_NAME)
        return launch, nproc, node_rank, env[TORCHYARD_LOGS]

    def _handle_signals(self) -> None:
        """SIGTERM and SIGINT stop the ranks (``_on_signal``); only in the main thread."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)

    def _start_publisher(self, logs: str) -> None:
        """A fresh progress tracker over ``logs``, and the thread that publishes its
        summary every TORCHYARD_PROGRESS_INTERVAL seconds (``_publish_progress``)."""
        self.progress = ProgressTracker(logs)
        interval = max(1, int_env(self.env, TORCHYARD_PROGRESS_INTERVAL, 5))
        threading.Thread(target=self._publish_progress, args=(interval,), daemon=True).start()

    def _publish_progress(self, interval: int) -> None:
        """Every TORCHYARD_PROGRESS_INTERVAL seconds (default 5) that progress was made,
        one ``[torchyard] progress {...}`` line on stderr: the operator reads the latest
        from this Pod's log into ``status.progress``."""
        shown: Any = (0, None)
        while True:
            time.sleep(interval)
            now = (self.progress.version, self._checkpoint_seconds())
            if now != shown:
                shown = now
                self._say_progress()

    def _say_progress(self) -> None:
        summary = self.progress.summary()
        seconds = self._checkpoint_seconds()
        if seconds is not None:
            # With torchyard.checkpoint: the slowest step and save its ranks timed (the
            # operator's CheckpointAtRisk), and their step for a script that says no more.
            if summary is None and self.checkpoints.reported_step() is not None:
                summary = {"step": self.checkpoints.reported_step()}
            if summary is not None:
                summary["checkpointSeconds"] = seconds
        if summary is not None:
            summary.update(self._in_place_info())
        if summary is not None and self.progress_file is not None:
            with contextlib.suppress(OSError), open(self.progress_file, "a") as f:
                f.write(json.dumps(summary, sort_keys=True) + "\n")
        elif summary is not None:
            self.say("progress " + json.dumps(summary, sort_keys=True))

    def _checkpoint_seconds(self) -> Any:
        """The slowest step and save the ranks timed (``torchyard.checkpoint.timings``)."""
        if self.checkpoints is None:
            return None
        try:
            return self.checkpoints.timings()
        except OSError:
            return None

    def _progress_done(self) -> None:
        """The last progress line, and the last metric values into outputs/metrics.json."""
        self.progress.close()
        self._say_progress()
        merge_metrics(self.env[TORCHYARD_OUTPUTS], self.progress.metrics())

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stopping is None:
            self.stopping = signum
            if self._save_first(signum):
                return  # the ranks get SIGTERM once the checkpoint is complete (_wait)
            self.say(f"received signal {signum}: stopping the ranks")
        self._save_until = None
        for rank in self.ranks:
            rank.signal(signal.SIGTERM)

    def _start_checkpoints(self, node_rank: int) -> None:
        """With TORCHYARD_CHECKPOINT_DIR: export the newest complete checkpoint to the
        ranks (TORCHYARD_RESUME_FROM/STEP; every node finds the same one in the shared
        folder) and, on node 0, write COMPLETE.json as the ranks finish their saves."""
        folder = self.env.get(TORCHYARD_CHECKPOINT_DIR, "")
        if not folder:
            return
        module = checkpoint_module(self.env)
        self.checkpoints = module.NodeCheckpoints(
            folder,
            node_rank,
            int_env(self.env, WORLD_SIZE, 1),
            keep_newest=int_env(self.env, TORCHYARD_CHECKPOINT_KEEP, 0),
            max_without_progress=int_env(self.env, TORCHYARD_CHECKPOINT_MAX_STALLS, 3),
            attempt=self.env.get(TORCHYARD_CHECKPOINT_ATTEMPT, ""),
            wait_seconds=int_env(self.env, TORCHYARD_DNS_TIMEOUT, 300),
        )
        try:
            self.env.update(self.checkpoints.start())
        except module.CheckpointError as err:
            raise LaunchError(str(err)) from None
        if TORCHYARD_RESUME_FROM in self.env:
            self.say(f"resuming from checkpoint {self.env[TORCHYARD_RESUME_FROM]}")

    def _save_first(self, signum: int) -> bool:
        """SIGTERM/SIGINT with a checkpoint folder whose ranks report their steps: ask
        every rank to save at the highest reported step + 1 and let them run until that
        checkpoint is complete or TORCHYARD_CHECKPOINT_SAVE_SECONDS pass."""
        if self.checkpoints is None:
            return False
        try:
            target = self.checkpoints.request()
        except OSError as err:
            self.say(f"cannot ask for a just-in-time checkpoint: {err}")
            return False
        if target is None:
            return False
        wait = int_env(self.env, TORCHYARD_CHECKPOINT_SAVE_SECONDS, 20)
        self._save_until = time.monotonic() + wait
        self._asked_at = time.monotonic()
        self.say(
            f"received signal {signum}: every rank saves a checkpoint at step {target}, "
            f"then stops (at most {wait}s)"
        )
        return True

    def _saved_or_late(self) -> None:
        """In _wait: stop the ranks once the just-in-time checkpoint is complete, or late."""
        if self._save_until is None:
            return
        if time.monotonic() >= self._asked_at + 1.0:  # a rank that missed the target moves it
            self._asked_at = time.monotonic()
            with contextlib.suppress(OSError):
                self.checkpoints.request()
        saved = self.checkpoints.saved()
        if saved or time.monotonic() >= self._save_until:
            self.say(
                f"checkpoint at step {self.checkpoints.target} complete: stopping the ranks"
                if saved
                else "the just-in-time checkpoint did not complete in time: stopping the ranks"
            )
            self._save_until = None
            for rank in self.ranks:
                rank.signal(signal.SIGTERM)

    def _start_ranks(self, launch: str, nproc: int, node_rank: int, logs: str) -> None:
        """One process per rank (launch: process), or the node command (launch: node);
        those already started are killed when one cannot start (LaunchError)."""
        try:
            if launch == "process":
                for local in range(nproc):
                    env = process_env(self.env, local)
                    number = int(env[RANK])
                    self._start_rank(number, local, f"rank {number}", env, logs)
            else:
                self._start_rank(None, None, f"node {node_rank}", dict(self.env), logs)
        except LaunchError:
            for started_rank in self.ranks:
                started_rank.signal(signal.SIGKILL)
                started_rank.proc.wait()
            self._end_leftovers()
            for started_rank in self.ranks:
                started_rank.finish()
            raise

    def _start_rank(
        self, rank: int | None, local: int | None, label: str, env: dict[str, str], logs: str
    ) -> None:
        self.ranks.append(
            Rank(
                rank,
                local,
                label,
                expand_arguments(self.command, env),
                env,
                logs,
                self.out,
                self.err,
                self.echo,
                self.progress,
                self.scanner,
                log_limit=self.log_limit,
                show_progress=self.progress_file is None,
            )
        )

    def run(self) -> int:
        """Run the node; its output written (ECHO_DRAIN_SECONDS at most) when it returns."""
        own = "" if self.env.get(TORCHYARD_SHIPPED_PATH) else own_package_folder()
        if own:  # no shipped package: the ranks import the one this launcher runs from
            self.env[TORCHYARD_SHIPPED_PATH] = own
        try:
            return self._run()
        finally:
            if own:
                shutil.rmtree(own, ignore_errors=True)
            self.echo.drain()

    def _run(self) -> int:
        launch, nproc, node_rank, logs = self._config()
        self.log_limit = log_limit(self.env)
        self.env[TORCHYARD_NODE_COOKIE] = self.cookie
        if self.env.get(MASTER_ADDR):
            wait_for_dns(
                self.env[MASTER_ADDR], int_env(self.env, TORCHYARD_DNS_TIMEOUT, 300), self.err
            )
        grace = int_env(self.env, TORCHYARD_GRACE_PERIOD, 10)
        self._handle_signals()
        started = time.monotonic()
        self._start_checkpoints(node_rank)
        # launch: node: torchrun's workers inherit the hook (they have RANK; torchrun has
        # not) and say their rank in their progress lines (TORCHYARD_LAUNCH=node)
        self.stacks, hook = install_stack_hook(self.env, logs)
        self._start_publisher(logs)
        self._join(node_rank, grace)
        try:
            self._start_ranks(launch, nproc, node_rank, logs)
            while True:
                failed = self._wait(grace)
                self._end_leftovers()
                for rank in self.ranks:
                    rank.finish()
                if not self._in_place(failed, node_rank):
                    failed = None if self.restart_answered else failed
                    break
                self._next_generation(launch, nproc, node_rank, logs)
        finally:
            shutil.rmtree(hook, ignore_errors=True)
            self._leave()
        if self.checkpoints is not None and not self._checkpoints_stopped:
            self.checkpoint_info = self.checkpoints.stop(rank_failed=failed is not None)
        self._progress_done()
        code = self._report(failed, node_rank, time.monotonic() - started)
        if self.stacks:
            prune_empty(self.stacks)
        return archive_node(self.env, node_rank, logs, code, self.say)

    def _check_stall(self) -> Rank | None:
        """The rank that made no progress for longer than the stall timeout (once a second;
        ``ProgressTracker.stalled``): every live rank's stacks are collected, the stuck
        rank's file:line said, and the ranks stopped. None while nothing stalled."""
        now = time.monotonic()
        if not self.stacks or now < self._stall_check_at:
            return None
        self._stall_check_at = now + 1.0
        fixed, floor, budgets = stall_limits(self.env)
        live = [r for r in self.ranks if r.exit_code() is None]
        if not live:
            return None
        node = live[0] if live[0].rank is None else None  # launch: node (torchrun, ...)
        watched: list[int | None] = [r.rank for r in live]
        if node is not None:
            watched = list(self.progress.reported_ranks())
        found = self.progress.stalled(watched, time.time(), fixed, floor, budgets)
        if found is None:
            return None
        number, seconds, _, timeout = found
        detected = time.time()
        if node is None:
            stacks = collect_stacks(self.stacks, [(r.rank, r.proc.pid) for r in live])
        else:  # the node command's ranks: the processes that opened a stack file
            stacks = collect_stacks(self.stacks, rank_processes(self.stacks, node.proc.pid))
        # The signal that takes the stacks ends a blocking call (a C sleep, a read without
        # SA_RESTART): a gang that made progress since was slow, not stuck for good.
        idle_now = self.progress.idle_seconds(number, time.time())
        if idle_now is not None and idle_now < seconds:
            self.say(
                f"rank {number} made no progress for {seconds:.0f}s, then went on when its "
                "stacks were taken (in logs/stacks/ of this node): not stopped"
            )
            return None
        # The rank idle longest may only wait for the guilty one in a collective: the
        # stacks of those stalled too tell (``culprit``).
        suspects = self.progress.idle_ranks(watched, time.time(), timeout / 2)
        first = number
        number = culprit(stacks, suspects, number, self.progress.step_of)
        stuck = node if node is not None else next(r for r in live if r.rank == number)
        label = stuck.label if node is None else f"rank {number}"
        at, stall = describe_stall(
            self.progress,
            stacks,
            (number, label, stuck.rank),
            first,
            suspects,
            (seconds, timeout, detected),
        )
        self.stall = (stuck, stall)
        self.say(f"{label} stalled at {at}: stopping the ranks")
        for rank in self.ranks:
            rank.signal(signal.SIGTERM)
        return stuck

    def _wait(self, grace: int) -> Rank | None:
        """Wait for every rank; on the first failure stop the rest. Returns the failed Rank."""
        failed: Rank | None = None
        kill_at: float | None = None
        while True:
            if failed is None and self.stopping is None and not self._restarting:
                if self.peer is not None and self.peer.restart_asked is not None:
                    # another node's rank failed: stop these for the in-place restart
                    self._restarting = True
                    self.say("stopping the ranks for an in-place restart")
                    for rank in self.ranks:
                        rank.signal(signal.SIGTERM)
                    kill_at = time.monotonic() + grace
                    continue
                self._watch_node_ranks()
                failed = self._check_stall()  # a stalled rank fails the node
                if failed is not None:
                    kill_at = time.monotonic() + grace
            codes = [(rank, rank.exit_code()) for rank in self.ranks]
            running = sum(1 for _, code in codes if code is None)
            failing = [rank for rank, code in codes if code not in (None, 0)]
            if failing and failed is None and self.stopping is None and not self._restarting:
                # The one that exited first: the others may only have lost it (a
                # collective's "Connection closed by peer").
                failed = min(failing, key=lambda rank: rank.exited_at or 0.0)
                self.say(
                    f"{failed.label} exited with {_describe(failed.proc.returncode)}: "
                    "stopping the other ranks"
                )
                for other in self.ranks:
                    other.signal(signal.SIGTERM)
                kill_at = time.monotonic() + grace
            if running == 0:
                return failed
            self._saved_or_late()
            if self.stopping is not None and kill_at is None and self._save_until is None:
                kill_at = time.monotonic() + grace
            if kill_at is not None and time.monotonic() >= kill_at:
                for rank in self.ranks:
                    rank.signal(signal.SIGKILL)
                kill_at = float("inf")
            time.sleep(0.05)

    def _watch_node_ranks(self) -> None:
        """launch: node: when each rank the node command (torchrun) started ended. The
        launcher is not their parent and gets no exit code: torchrun names those that
        failed, and one that ended before them and is not named exited with status 0."""
        now = time.monotonic()
        if not self.ranks or self.ranks[0].rank is not None or now < self._node_ranks_at:
            return
        self._node_ranks_at = now + 0.5
        if self.stacks:
            for number, pid in rank_processes(self.stacks, self.ranks[0].proc.pid):
                if number is None:
                    continue
                if number not in self._node_ranks or self._node_ranks[number][0] != pid:
                    self._node_ranks[number] = [pid, None]
        # One time for the poll: ranks seen gone together are not ordered by the loop.
        ended_at = time.time()
        for seen in self._node_ranks.values():
            if seen[1] is None and not alive(seen[0]):
                seen[1] = ended_at

    def _failed_at(self, failed: Rank) -> float | None:
        """When ``failed`` failed (Unix time): when its stall was found, else when it exited."""
        if self.stall is not None and self.stall[0] is failed:
            return float(self.stall[1]["detectedAt"])
        return round(failed.exited_at, 6) if failed.exited_at is not None else None

    def _early_exits(self, before: float | None) -> list[dict[str, Any]] | None:
        """The ranks of this node that exited with status 0 (before ``before``, when given),
        first first: a rank that leaves early while its peers train is what they fail of
        (``status.failures.early_exit`` decides). None for none."""
        ended = [(r.rank, r.exited_at or 0.0) for r in self.ranks if r.exit_code() == 0]
        # launch: node: ends seen by a poll (``_watch_node_ranks``), one poll's at one time
        polled = bool(self.ranks) and self.ranks[0].rank is None
        if polled:
            failed = set(map(int, TORCHRUN_RANK.findall("".join(self.ranks[0].tail))))
            ended = [(r, seen[1]) for r, seen in self._node_ranks.items() if seen[1] is not None]
            ended = [(r, at) for r, at in ended if r not in failed]
            if failed:  # not after the first of those torchrun names as failed
                gone = [s[1] for r, s in self._node_ranks.items() if r in failed and s[1]]
                before = min([before, *gone]) if before is not None and gone else before
        found = [
            {"rank": r, "exitedAt": round(at, 6), "step": self.progress.step_of(r)}
            for r, at in sorted(ended, key=lambda item: item[1])
            if r is not None and (before is None or at < before or (polled and at == before))
        ]
        return found[:EARLY_EXITS_REPORTED] or None

    def _write_message(self, info: Mapping[str, Any], keep_none: bool = False) -> None:
        """The termination message: ``info``, without its None values unless ``keep_none``."""
        if not keep_none:
            info = {k: v for k, v in info.items() if v is not None}
        path = self.env.get(TORCHYARD_TERMINATION_LOG, TERMINATION_LOG)
        write_termination(path, termination_message(info))

    def _report(self, failed: Rank | None, node_rank: int, elapsed: float) -> int:
        """The termination message of the node; its exit code."""
        if failed is None and self.abandoned is not None:
            self._write_message(self._abandoned_info(node_rank))
            return 128 + signal.SIGTERM
        if failed is None and self.stopping is not None:
            self._write_message(
                {
                    "nodeRank": node_rank,
                    "reason": "Terminated",
                    "signal": self.stopping,
                    "exitCode": 128 + self.stopping,
                    "message": "stopped by signal",
                    # the node may have been stopped because another failed of losing these
                    "earlyExits": self._early_exits(None),
                    **self.checkpoint_info,
                    **self._in_place_info(),
                }
            )
            return 128 + self.stopping
        if failed is None:
            self._write_message(
                {
                    "nodeRank": node_rank,
                    "exitCode": 0,
                    "reason": "Completed",
                    "progress": self.progress.summary(),
                    "earlyExits": self._early_exits(None),
                    **self.checkpoint_info,
                    **self._in_place_info(),
                },
                keep_none=True,
            )
            what = (
                f"all {len(self.ranks)} ranks" if self.ranks[0].rank is not None else "the command"
            )
            self.say(f"{what} of node {node_rank} succeeded in {elapsed:.1f}s")
            return 0
        return self._report_failure(failed, node_rank)

    def _failure_cause(self, failed: Rank) -> tuple[int | None, str, str]:
        """(the rank, the reason, the message) of the termination message of ``failed``:
        its traceback, else an OOM kill or its stall."""
        code = failed.proc.returncode
        message = traceback_tail(failed.tail)
        rank = failed.rank
        if rank is None:  # launch: node; torchrun names the failing rank in its summary
            rank = torchrun_root_cause(failed.tail)
            # torch >= 2.2 prefixes an uncaught error's lines with its rank: that rank's
            # own traceback says more than torchrun's ChildFailedError after it
            prefix = f"[rank{rank}]: "
            own = [line[len(prefix) :] for line in failed.tail if line.startswith(prefix)]
            message = traceback_tail(own) if own else (worker_traceback(failed.tail) or message)
        reason = "Error"
        if code == -signal.SIGKILL and self._oom_kills is not None:
            now = oom_kills(self.cgroup)
            if now is not None and now > self._oom_kills:
                reason, message = "OOMKilled", oom_message(failed.label, memory_limit(self.cgroup))
        if self.stall is not None and self.stall[0] is failed:
            reason, message = STALLED_REASON, self.stall[1]["message"]
            rank = self.stall[1]["rank"]  # launch: node: the rank torchrun started
        return rank, reason, message

    def _report_failure(self, failed: Rank, node_rank: int) -> int:
        info = self._failure_info(failed, node_rank)
        self._write_message(info)
        return int(info["exitCode"])

    def _failure_info(self, failed: Rank, node_rank: int) -> dict[str, Any]:
        """The termination message of ``failed``'s failure (what the coordinator is sent)."""
        code = failed.proc.returncode
        exit_code = code if code >= 0 else 128 - code
        rank, reason, message = self._failure_cause(failed)
        return dict(
            {
                # (its message is the termination message's: not twice in 4 KiB)
                "stall": (
                    {k: v for k, v in self.stall[1].items() if k != "message"}
                    if self.stall is not None
                    else None
                ),
                "rank": rank,
                "localRank": failed.local_rank,
                "nodeRank": node_rank,
                "exitCode": exit_code,
                "signal": -code if code < 0 else None,
                "reason": reason,
                "message": message,
                # Unix time the rank exited: the operator names the rank that failed first
                # when peers on other nodes fail a moment later because they lost it.
                "exitedAt": self._failed_at(failed),
                # The failing rank's last reported step: the same error at the same step
                # twice stops the retries (``launch.classes``).
                # (a rank that failed before reporting since it resumed: the step it
                # resumed from, so that the same error twice is the same signature)
                "step": self._step_of(rank if failed.rank is None else failed.rank),
                "progress": self.progress.summary(),
                "evidence": self.scanner.evidence or None,
                "logRule": self.scanner.hit,
                "earlyExits": self._early_exits(self._failed_at(failed)),
                # resumedFrom, checkpointStep, quarantined; reason NoProgress (and why) when
                # too many attempts failed before getting past their checkpoint.
                **self.checkpoint_info,
                **self._in_place_info(),
            }
        )
