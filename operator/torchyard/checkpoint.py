"""Checkpoints a run can trust: the completeness contract, resume, and the just-in-time save.

Standard library only, Python >= 3.8: it is shipped to every node Pod beside the launcher
(``SHIPPED_MODULES`` in ``torchyard.planning.pods``), so a training script in any image can
``from torchyard import checkpoint``. Called by training scripts (``save_dir``, ``done``,
``should_save``, ``latest``) and by the launcher (``finalize``, ``quarantine``, ``keep``,
``request_save``). Tested in tests/unit/checkpoint/test_checkpoint.py.

The folder's layout and what makes a checkpoint complete (``COMPLETE.json``, ``latest``,
``quarantine``, ``keep``) are in ``torchyard.checkpoint_store``, whose public names this
module re-exports; here: what a rank does (``save_dir``, ``done``, ``should_save``), the
just-in-time checkpoint, the step and save timings, and the launcher's ``NodeCheckpoints``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from typing import Any

from torchyard.checkpoint_store import (
    COMPLETE,
    DCP_METADATA,
    DIR_VARIABLE,
    QUARANTINE_PREFIX,
    CheckpointError,
    _fsync_dir,
    _regular,
    _write_atomic,
    _write_temp,
    complete_steps,
    finalize,
    is_complete,
    keep,
    latest,
    manifest,
    quarantine,
    quarantined,
    ranks_done,
    root,
    step_of,
    step_path,
    steps,
)
from torchyard.launch.contract import (
    NO_PROGRESS_REASON,
    RANK,
    TORCHYARD_CHECKPOINT_INTERVAL,
    TORCHYARD_RESUME_FROM,
    TORCHYARD_RESUME_STEP,
)

__all__ = [
    "ATTEMPT",
    "COMPLETE",
    "DCP_METADATA",
    "DIR_VARIABLE",
    "INTERVAL_VARIABLE",
    "NO_PROGRESS_REASON",
    "QUARANTINE_PREFIX",
    "RESUME_FROM_VARIABLE",
    "RESUME_STEP_VARIABLE",
    "SAVE_AT",
    "STATE_DIR",
    "TIMING_SUFFIX",
    "CheckpointError",
    "NodeCheckpoints",
    "clear_requests",
    "complete_steps",
    "done",
    "finalize",
    "is_complete",
    "keep",
    "latest",
    "manifest",
    "quarantine",
    "quarantined",
    "ranks_done",
    "report",
    "reported",
    "request_save",
    "resume_step",
    "root",
    "save_dir",
    "save_target",
    "should_save",
    "step_of",
    "step_path",
    "steps",
    "timings",
]

INTERVAL_VARIABLE = TORCHYARD_CHECKPOINT_INTERVAL
RESUME_FROM_VARIABLE = TORCHYARD_RESUME_FROM
RESUME_STEP_VARIABLE = TORCHYARD_RESUME_STEP
STATE_DIR = ".torchyard"
SAVE_AT = "save-at"
ATTEMPT = "attempt"
_DONE = re.compile(r"^rank-(0|[1-9][0-9]{0,8})\.done$")


def _rank() -> int:
    # Under mpirun (distribution.type: mpi) a rank has OpenMPI's rank, not torchyard's RANK.
    return int(os.environ.get(RANK) or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)


def save_dir(step: int, directory: str | None = None) -> str:
    """The folder this rank writes checkpoint ``step``'s files into (created)."""
    path = step_path(step, directory)
    os.makedirs(path, exist_ok=True)
    return path


def done(step: int, directory: str | None = None, rank: int | None = None) -> str:
    """Say that this rank (``$RANK``; under mpirun ``$OMPI_COMM_WORLD_RANK``) wrote all
    its files of checkpoint ``step``: its files and the folder are fsynced, then
    ``rank-R.done`` is written and fsynced. Node 0's launcher writes ``COMPLETE.json``
    once every rank's ``.done`` is there."""
    path = step_path(step, directory)
    if not os.path.isdir(path):
        raise CheckpointError(f"{path} does not exist: write the files into save_dir({step})")
    # equivalent mutants (the lines marked): which files get fsynced shows only after a
    # power loss, not in a test
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)  # pragma: no mutate
            if os.path.islink(full) or name == COMPLETE or _DONE.match(name):  # pragma: no mutate
                continue  # pragma: no mutate
            try:
                fd = os.open(full, os.O_RDONLY)
            except OSError:
                continue  # another rank's temporary file, gone meanwhile  # pragma: no mutate
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(dirpath)
    marker = os.path.join(path, f"rank-{_rank() if rank is None else rank}.done")
    _write_atomic(marker, b"")
    _TIMER.saved(step)
    return marker


def resume_step() -> int | None:
    """The step the launcher resumed this attempt from (``$TORCHYARD_RESUME_STEP``)."""
    raw = os.environ.get(RESUME_STEP_VARIABLE, "")
    return int(raw) if raw.isdigit() else None


# The just-in-time checkpoint: ranks report the step they finished; on SIGTERM a launcher
# asks every rank to save at one step after the highest reported, through a small file.


def _state(directory: str | None = None) -> str:
    return os.path.join(root(directory), STATE_DIR)


def report(step: int, directory: str | None = None, rank: int | None = None) -> None:
    """Record that this rank finished ``step`` (a tiny file per rank, no fsync)."""
    state = _state(directory)
    os.makedirs(state, exist_ok=True)
    path = os.path.join(state, f"rank-{_rank() if rank is None else rank}.step")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(str(step))
    os.replace(tmp, path)


def reported(directory: str | None = None) -> dict[int, int]:
    """Each rank's last reported step."""
    out: dict[int, int] = {}
    try:
        names = os.listdir(_state(directory))
    except OSError:
        return out
    for name in names:
        match = re.match(r"^rank-(\d+)\.step$", name)
        if not match:
            continue
        try:
            with open(os.path.join(_state(directory), name)) as f:
                out[int(match.group(1))] = int(f.read().strip())
        except (OSError, ValueError):
            continue
    return out


def save_target(directory: str | None = None) -> int | None:
    """The step every rank saves at because a node Pod is being stopped, else None."""
    try:
        with open(os.path.join(_state(directory), SAVE_AT)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def request_save(directory: str | None = None) -> int | None:
    """Ask every rank to save at the highest reported step + 1 (called by every launcher
    on SIGTERM, and again while it waits for that save). The first launcher to ask sets
    the target (an exclusive create: the others find it and agree); it moves only when a
    rank missed it: it reported a later step with no ``rank-R.done`` for the target (it
    read the file just before it was written), and then past every rank. None when no
    rank reported a step (the script does not use this module)."""
    path = os.path.join(_state(directory), SAVE_AT)
    for _ in range(10):
        steps_now = reported(directory)
        if not steps_now:
            return None
        current = save_target(directory)
        if current is not None and not _missed(current, steps_now, directory):
            return current
        # one after the highest reported step: past every rank (and so past a missed target)
        target = max(steps_now.values()) + 1
        if current is None:
            # unless another launcher's target came first: the next pass judges that one
            _create_once(path, str(target).encode())
        else:
            _write_atomic(path, str(target).encode())
    return save_target(directory)


def _missed(target: int, steps_now: dict[int, int], directory: str | None) -> bool:
    """Whether a rank went past ``target`` without saving it: it reported a later step,
    and neither its ``rank-R.done`` nor a complete checkpoint is there. (A rank that
    reported the target itself may be saving it now.)"""
    path = step_path(target, directory)
    past = [r for r, s in steps_now.items() if s > target]
    if not past or is_complete(path, verify=False):
        return False
    return any(not os.path.isfile(os.path.join(path, f"rank-{r}.done")) for r in past)


def _create_once(path: str, data: bytes) -> None:
    """Create ``path`` holding ``data`` unless it exists (then leave it as it is): written
    to a temp file, fsynced and hard-linked into place, so no reader sees it half-written;
    on a file system without hard links, an exclusive create (a reader that finds it still
    empty takes it as no target yet, and a rank that misses it moves it on)."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    tmp = _write_temp(folder, data)
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            return
        except OSError:  # no hard links here (some SMB/FUSE volumes)
            try:
                out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return
            with os.fdopen(out, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
    finally:
        os.unlink(tmp)
    _fsync_dir(folder)


def clear_requests(directory: str | None = None) -> None:
    """Forget the previous attempt's reports and target (node 0's launcher, at start)."""
    shutil.rmtree(_state(directory), ignore_errors=True)


def should_save(step: int, directory: str | None = None) -> bool:
    """Call after finishing ``step``, on every rank: True when this step is to be saved:
    every ``$TORCHYARD_CHECKPOINT_INTERVAL`` steps, and at the just-in-time target step
    that a launcher set when its Pod got SIGTERM (the same step on every rank, with no
    collective). False without ``$TORCHYARD_CHECKPOINT_DIR``."""
    if directory is None and not os.environ.get(DIR_VARIABLE):
        return False
    # Report first, then read: a launcher that wrote the target after this read sees
    # this report when it checks again, and moves the target past this step.
    report(step, directory)
    _TIMER.stepped(step, directory)
    target = save_target(directory)
    if target is not None and step == target:
        return _TIMER.saving(step)
    interval = os.environ.get(INTERVAL_VARIABLE, "")
    due = interval.isdigit() and int(interval) > 0 and step > 0 and step % int(interval) == 0
    return _TIMER.saving(step) if due else False


# How long a step and a save take on this rank: ``should_save`` times the steps between
# two calls (less the saves in them), ``done`` the save since ``should_save`` said True.
# The slowest of each go to ``.torchyard/rank-R.timing`` when they grow; the launchers
# read them (``timings``) into their progress line, and the operator warns when the Pods'
# terminationGracePeriodSeconds is shorter than the slowest step plus the slowest save
# (the just-in-time checkpoint may need both).
TIMING_SUFFIX = ".timing"


class _Timer:
    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self.last: tuple[float, int] | None = None  # (time, step) of the last should_save
        # equivalent mutants (these two): the first ``stepped`` sets both before any read
        self.saved_since = 0.0  # seconds of saves since then  # pragma: no mutate
        self.save_started: tuple[float, int] | None = None
        self.slowest_step = 0.0
        self.slowest_save = 0.0
        self.directory: str | None = None  # pragma: no mutate

    def stepped(self, step: int, directory: str | None) -> None:
        now = self.clock()
        self.directory = directory
        if self.last is not None and step > self.last[1]:
            seconds = (now - self.last[0] - self.saved_since) / (step - self.last[1])
            if seconds > self.slowest_step:
                self.slowest_step = seconds
                self._write()
        self.last, self.saved_since = (now, step), 0.0

    def saving(self, step: int) -> bool:
        self.save_started = (self.clock(), step)
        return True

    def saved(self, step: int) -> None:
        if self.save_started is None or self.save_started[1] != step:
            return
        seconds = self.clock() - self.save_started[0]
        self.save_started = None
        # equivalent mutants ("=" for "+="): one save at most between two should_save
        self.saved_since += seconds  # pragma: no mutate
        if seconds > self.slowest_save:
            self.slowest_save = seconds
            self._write()

    def _write(self) -> None:
        try:
            state = _state(self.directory)
            os.makedirs(state, exist_ok=True)
            path = os.path.join(state, f"rank-{_rank()}{TIMING_SUFFIX}")
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump({"step": self.slowest_step, "save": self.slowest_save}, f)
            os.replace(tmp, path)
        except (OSError, CheckpointError):
            pass  # a timing is a hint for a warning: never a reason to stop training


_TIMER = _Timer()


def timings(directory: str | None = None) -> dict[str, float] | None:
    """The slowest step and the slowest save of any rank, in seconds (``{"step",
    "save"}``), None before any rank timed one."""
    found: dict[str, float] = {}
    try:
        names = os.listdir(_state(directory))
    except OSError:
        return None
    for name in names:
        if not (name.startswith("rank-") and name.endswith(TIMING_SUFFIX)):
            continue
        try:
            with open(os.path.join(_state(directory), name)) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        for key in ("step", "save"):
            value = data.get(key) if isinstance(data, dict) else None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                found[key] = max(found.get(key, 0.0), float(value))
    return {k: round(v, 3) for k, v in found.items()} if found else None


# The launcher's side: one NodeCheckpoints per node launcher, when the run has a checkpoint
# folder. Here rather than in the launcher so that the contract has one home.


class NodeCheckpoints:
    """What a node's launcher does with the checkpoint folder: at start, find the newest
    complete checkpoint (every launcher on its own: the same folder gives every node the
    same answer, and the operator needs no state) and export it to the ranks; on node 0,
    write ``COMPLETE.json`` for every step all ranks are done with and keep the newest
    ``keep``; on SIGTERM, set the just-in-time target step; at exit, quarantine the
    checkpoint this attempt resumed from when a rank failed before any progress."""

    def __init__(
        self,
        directory: str,
        node_rank: int,
        world_size: int,
        *,
        keep_newest: int = 0,
        max_without_progress: int = 3,
        # equivalent mutants (how often the finalizer looks, how long node 1 waits at most):
        # only a clock tells them apart
        poll_seconds: float = 0.5,  # pragma: no mutate
        attempt: str = "",
        wait_seconds: float = 600,  # pragma: no mutate
    ) -> None:
        self.directory = directory
        self.node_rank = node_rank
        self.world_size = world_size
        self.keep_newest = keep_newest
        self.max_without_progress = max_without_progress
        self.poll_seconds = poll_seconds
        # This attempt of the run (the same on every node): the other nodes' launchers
        # wait until node 0's has cleaned up after the previous one and says so.
        self.attempt = attempt
        self.wait_seconds = wait_seconds
        self.resumed_from: int | None = None
        self.target: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> dict[str, str]:
        """Prepare the folder; the variables that tell the ranks where to resume from."""
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as err:
            raise CheckpointError(
                f"cannot create the checkpoint folder {self.directory} ({err.strerror}): "
                "is spec.checkpoints' volume mounted and writable by the run's user?"
            ) from None
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise CheckpointError(
                f"the checkpoint folder {self.directory} is not writable by user "
                f"{os.getuid()}: give the volume an fsGroup (spec.runAsUser) or fix its owner"
            )
        if self.node_rank == 0:
            clear_requests(self.directory)
            self.finalize_all()
        elif self.attempt:
            self._wait_for_node_0()
        env = {DIR_VARIABLE: self.directory}
        found = latest(self.directory)
        if found is not None:
            self.resumed_from = step_of(os.path.basename(found))
            env[RESUME_FROM_VARIABLE] = found
            env[RESUME_STEP_VARIABLE] = str(self.resumed_from)
        if self.node_rank == 0:
            self.drop_unfinished()
            if self.attempt:
                os.makedirs(_state(self.directory), exist_ok=True)
                path = os.path.join(_state(self.directory), ATTEMPT)
                _write_atomic(path, self.attempt.encode())
        if self.node_rank == 0:
            self._thread = threading.Thread(target=self._finalizer, daemon=True)
            self._thread.start()
        return env

    def finalize_all(self) -> list[int]:
        """Write COMPLETE.json where every rank is done (node 0); the steps finalized."""
        made = []
        for step in steps(self.directory):
            path = step_path(step, self.directory)
            if manifest(path) is not None or _regular(os.path.join(path, DCP_METADATA)):
                continue
            if finalize(step, self.world_size, self.directory):  # once every rank is done
                made.append(step)
        if made and self.keep_newest > 0:
            keep(self.keep_newest, self.directory)
        return made

    def _wait_for_node_0(self) -> None:
        path = os.path.join(_state(self.directory), ATTEMPT)
        deadline = time.monotonic() + self.wait_seconds
        while True:
            try:
                with open(path) as f:
                    if f.read() == self.attempt:
                        return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise CheckpointError(
                    f"node 0's launcher did not prepare the checkpoint folder {self.directory} "
                    f"for attempt {self.attempt} within {self.wait_seconds:.0f}s: is node 0's "
                    "Pod running, and does every node mount the same (ReadWriteMany) volume?"
                )
            time.sleep(0.2)  # pragma: no mutate (how often it looks: only a clock can tell)

    def drop_unfinished(self) -> list[int]:
        """Delete the previous attempt's saves that never completed (node 0, at start,
        before any rank runs): this attempt would save those steps again, and a stale
        ``rank-R.done`` must not vouch for a file being rewritten."""
        newest = self.resumed_from if self.resumed_from is not None else -1
        dropped = []
        for step in steps(self.directory):
            path = step_path(step, self.directory)
            if step > newest:  # latest() found none of these complete (and intact)
                if os.path.islink(path):
                    os.unlink(path)
                else:
                    shutil.rmtree(path, ignore_errors=True)
                dropped.append(step)
        return dropped

    def _finalizer(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.finalize_all()
            except OSError:
                continue  # a rank's file vanished meanwhile (keep, quarantine): next pass

    def timings(self) -> dict[str, float] | None:
        """The slowest step and save any rank timed (``timings``)."""
        return timings(self.directory)

    def reported_step(self) -> int | None:
        """The highest step any rank reported, None before any."""
        steps_now = reported(self.directory).values()
        return max(steps_now) if steps_now else None

    def request(self) -> int | None:
        """SIGTERM: ask every rank to save at one step; that step, None when no rank
        reports steps (the script does not use ``should_save``)."""
        self.target = request_save(self.directory)
        return self.target

    def saved(self) -> bool:
        """A complete checkpoint at or after the just-in-time target exists."""
        if self.target is None:
            return True
        return any(s >= self.target for s in complete_steps(self.directory, verify=False))

    def progressed(self) -> bool:
        """This attempt got past the step it resumed from."""
        if self.resumed_from is None:
            return True
        done_steps = complete_steps(self.directory, verify=False)
        reports = reported(self.directory).values()
        return any(s > self.resumed_from for s in [*done_steps, *reports])

    def stop(self, rank_failed: bool) -> dict[str, Any]:
        """At the launcher's exit: the last COMPLETE.json (node 0), the quarantine of a
        checkpoint that a failed attempt resumed from without progress; what to add to
        the termination message."""
        self._stop.set()
        if self._thread is not None:
            # equivalent mutants: told to stop, the finalizer ends within one pass; the
            # timeout only bounds a file system that hangs
            self._thread.join(timeout=30)  # pragma: no mutate
            self.finalize_all()
        info: dict[str, Any] = {}
        if self.resumed_from is not None:
            info["resumedFrom"] = self.resumed_from
        newest = complete_steps(self.directory, verify=False)
        if newest:
            info["checkpointStep"] = newest[-1]
        if rank_failed and self.resumed_from is not None and not self.progressed():
            try:
                moved = quarantine(self.resumed_from, self.directory)
            except OSError:
                moved = None  # another node's launcher moved it first
            if moved is not None:
                info["quarantined"] = os.path.basename(moved)
            stalls = sum(
                1 for n in os.listdir(self.directory) if n.startswith(QUARANTINE_PREFIX + "step-")
            )
            if stalls >= self.max_without_progress:
                info["reason"] = NO_PROGRESS_REASON
                info["message"] = (
                    f"{stalls} attempts failed before making progress from their checkpoint "
                    f"(quarantined: {', '.join(sorted(quarantined(self.directory)))}): fix "
                    "the error in the logs, or delete the quarantine-step-* folders to "
                    "try them again"
                )
        return info
