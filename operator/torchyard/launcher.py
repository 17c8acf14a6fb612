"""The torchyard launcher: starts the ranks of one node and reports exactly which failed.

Standard library only, Python >= 3.8, one file: it reaches any training image as a
read-only ConfigMap volume (a ``torchyard/`` package folder with the other shipped
modules) and the node Pod runs ``python .../torchyard/launcher.py [--copy SRC DIR |
--fetch SHA256 DIR] -- <command...>`` (or ``python -m torchyard.launcher -- <command...>``
where torchyard is installed): ``--copy``/``--fetch`` put the source into the working
folder first (:func:`prepare`).
Local mode runs the very same file once per node.
It is one module, about a thousand lines, because it travels as one file: splitting it
would mean copying a package into every image.

It reads its configuration from variables that ``torchyard.planning`` sets:

    TORCHYARD_LAUNCH           process | node
    TORCHYARD_NPROC_PER_NODE   processes on this node
    NODE_RANK, MASTER_ADDR, MASTER_PORT, WORLD_SIZE, ...   the rank contract
    TORCHYARD_LOGS             folder for logs/rank-<r>.txt (default ./logs)
    TORCHYARD_OUTPUTS          folder the ranks write their outputs to (default ./outputs);
                               either one that cannot be created (a working directory
                               this user may not write) moves under the temporary
                               directory, and the launcher says so
    TORCHYARD_TERMINATION_LOG  JSON termination message (default /dev/termination-log)
    TORCHYARD_DNS_TIMEOUT      seconds to wait for MASTER_ADDR to resolve (default 300)
    TORCHYARD_GRACE_PERIOD     seconds between SIGTERM and SIGKILL of the others (default 10)
    TORCHYARD_REGISTRY_URL, TORCHYARD_REGISTRY_TOKEN_FILE
                               where to archive ./logs and ./outputs, and the token to show
    TORCHYARD_OUTPUTS_OPTIONAL "1": a failed archive upload does not fail the node
    TORCHYARD_SNAPSHOT_MAX_BYTES, TORCHYARD_SNAPSHOT_MAX_FILES
                               what ``--copy``/``--fetch`` may unpack (default 1 GiB,
                               100000 entries)
    TORCHYARD_SHIPPED_PATH     the folder holding the shipped ``torchyard`` package: put
                               first on the ranks' PYTHONPATH
    TORCHYARD_MPI_END_WAIT     MPI runs: seconds a worker node waits, after its orted ended,
                               for node 0 to say how mpirun ended (default 30)
    TORCHYARD_CGROUP_ROOT      where the container's cgroups are mounted (default
                               /sys/fs/cgroup): the OOM killer's count and the memory limit
    TORCHYARD_PROGRESS_INTERVAL  seconds between the node's ``[torchyard] progress`` lines
                               (default 5), from the ranks' ``@@torchyard`` lines
    TORCHYARD_STALL_TIMEOUT    seconds without progress that fail a rank (default adaptive:
                               max(TORCHYARD_STALL_FLOOR (300), 5 x the slowest step))
    TORCHYARD_STALL_BUDGETS    JSON ``{"initializing"|"saving"|"evaluating": seconds}``: the
                               stall timeout while a rank says it is in that phase
                               (``progress.report(phase=...)``; defaults STALL_BUDGETS)
    TORCHYARD_LOG_RULES        JSON ``[{"pattern", "action"}]``: policy.logRules
    TORCHYARD_LOG_LIMIT_BYTES  the most each rank's ``logs/rank-<r>.txt`` holds (default
                               64 MiB; 0: no limit): policy.logLimitBytes; more keeps its
                               first and last half and says what was dropped between
    TORCHYARD_PROGRESS_FILE    local mode: the node's progress summaries go to this file,
                               one JSON a line, instead of ``[torchyard] progress`` lines,
                               and the ranks' ``@@torchyard`` lines are not shown
    TORCHYARD_NODE_COOKIE      marks every process the ranks start (default: a random
                               value; local mode sets its own): once the ranks ended, what
                               carries it, or still holds their output pipes, is ended
    TORCHYARD_GPUS_PER_NODE    > 0: PyTorch's NCCL flight recorder is switched on
    TORCHYARD_CHECKPOINT_DIR   the run's shared checkpoint folder (``torchyard.checkpoint``):
                               the ranks get TORCHYARD_RESUME_FROM/STEP of the newest
                               complete checkpoint; node 0 writes COMPLETE.json, keeps the
                               newest TORCHYARD_CHECKPOINT_KEEP and, after a failure with
                               no progress, quarantines the checkpoint it resumed from
                               (TORCHYARD_CHECKPOINT_MAX_STALLS of them: reason NoProgress);
                               on SIGTERM the ranks first save at one agreed step, for at
                               most TORCHYARD_CHECKPOINT_SAVE_SECONDS

and then:
- waits until MASTER_ADDR resolves (headless-Service DNS appears a moment after the Pod);
- ``launch: process`` starts TORCHYARD_NPROC_PER_NODE children with RANK, LOCAL_RANK,
  ...; ``launch: node`` starts the command once (e.g. ``torchrun``, which reads PET_*);
- tees every line of every rank to ``logs/rank-<r>.txt`` (within TORCHYARD_LOG_LIMIT_BYTES)
  and to its own output with a ``[rank r]`` prefix, whole lines, from one writer thread
  that never makes a rank wait: a reader slower than the ranks write loses rank lines
  from this output (a line says how many), never the launcher's own;
- once the ranks ended, ends whatever they started that still runs (a helper in a
  session of its own, a daemon: TORCHYARD_NODE_COOKIE), so that it neither outlives the
  node nor holds it;
- fails fast: the first rank to exit non-zero decides; the others get SIGTERM, then
  SIGKILL after the grace period; the launcher exits with that rank's code;
- forwards SIGTERM/SIGINT to the ranks;
- writes a JSON termination message (at most 4 KiB): rank, exit code or signal, the
  tail of that rank's traceback, and when it exited (``exitedAt``, Unix time), so that
  the operator can name the rank that failed first when its peers on other nodes fail
  a moment later because they lost it. A rank SIGKILLed while the kernel's OOM killer
  struck in this container's memory cgroup (its ``oom_kill`` count went up) is reported
  with reason ``OOMKilled``, the container's memory limit and what to do;
- archives the logs (and node 0's outputs) to the registry service; when that fails
  after the ranks succeeded, the termination message says ArchiveFailed with the HTTP
  status and what to fix, and the launcher exits with ARCHIVE_FAILED_EXIT (3), unless
  the outputs are optional.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import hmac
import json
import os
import re
import select
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any

TERMINATION_MESSAGE_LIMIT = 4096
TAIL_LINES = 120  # launch: node: torchrun's 35-line summary comes after the rank's error
_TORCHRUN_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank", re.MULTILINE)


# The variables of the rank contract: torchyard sets them (a TrainingRun's env may not),
# and a command's arguments may name them, as in the Azure ML guide's tip
# (``arguments=['--local_rank', '$LOCAL_RANK']``): expanded per process.
RANK_CONTRACT_VARIABLES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "TORCHYARD_OUTPUTS",
    "TORCHYARD_LOGS",
)
_NAMES = "|".join(RANK_CONTRACT_VARIABLES)
_CONTRACT_VAR = re.compile(r"\$(?:\{(" + _NAMES + r")\}|(" + _NAMES + r")\b)")


def expand_arguments(command: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``$RANK``/``${LOCAL_RANK}``... in arguments, replaced by this process's values.
    Only the rank contract's names are touched; any other ``$`` stays as it is."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return env.get(name, match.group(0))

    return [_CONTRACT_VAR.sub(value, arg) for arg in command]


def torchrun_root_cause(tail: Sequence[str]) -> int | None:
    """The rank torchrun's failure summary names as the root cause (its "Root Cause (first
    observed failure)" section; "Failures:" before it lists the others), None for none."""
    text = "".join(tail)
    root = text.rfind("Root Cause")
    found = _TORCHRUN_RANK.findall(text[root:] if root >= 0 else text)
    return int(found[0]) if found else None


class LaunchError(Exception):
    """The launcher cannot start the ranks (bad configuration, DNS never resolved)."""


def process_env(node_env: Mapping[str, str], local_rank: int) -> dict[str, str]:
    """The rank contract of one process: the node's variables plus RANK and LOCAL_RANK.

    Pure; shared with ``torchyard.planning`` (which computes ``node_env``).
    """
    nproc = int(node_env["TORCHYARD_NPROC_PER_NODE"])
    node_rank = int(node_env["NODE_RANK"])
    env = dict(node_env)
    env["LOCAL_RANK"] = str(local_rank)
    env["RANK"] = str(node_rank * nproc + local_rank)
    return env


def _int_env(env: Mapping[str, str], name: str, default: int | None) -> int:
    raw = env.get(name, "")
    if raw == "":
        if default is None:
            raise LaunchError(f"{name} is not set: is this running under torchyard?")
        return default
    try:
        return int(raw)
    except ValueError:
        raise LaunchError(f"{name} must be an integer, got {raw!r}") from None


# How long apart MASTER_ADDR is looked up while it does not resolve: the headless
# Service's record appears a moment after node 0 has its IP, and every rank waits for it,
# so a lookup (cheap: the cluster's DNS) is made often rather than backing off for seconds.
DNS_POLL_SECONDS = 0.2


def wait_for_dns(host: str, timeout: int, out: IO[str] = sys.stderr) -> None:
    """Block until ``host`` resolves; LaunchError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay, said = 0.05, False
    while True:
        try:
            socket.getaddrinfo(host, None)
            return
        except socket.gaierror as err:
            if time.monotonic() >= deadline:
                raise LaunchError(
                    f"MASTER_ADDR {host} did not resolve within {timeout}s ({err}): is the "
                    "run's headless Service there and node 0 scheduled?"
                ) from None
            if not said:
                out.write(f"[torchyard] waiting for {host} to resolve ...\n")
                out.flush()
                said = True
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, DNS_POLL_SECONDS)


def writable_folder(name: str, folder: str, say: Callable[[str], None]) -> str:
    """``folder`` (the value of variable ``name``), created; where it cannot be (a non-root
    user in an image whose working directory belongs to root, e.g. ``source: {image:
    true}`` with ``spec.runAsUser``), a folder of the same name under the temporary
    directory instead, said on stderr; LaunchError with what to do when neither can be."""
    try:
        os.makedirs(folder, exist_ok=True)
        if os.access(folder, os.W_OK | os.X_OK):
            return folder
        reason = "not writable"
    except OSError as err:
        reason = err.strerror or str(err)
    import tempfile

    where = os.path.abspath(folder)
    fallback = os.path.join(tempfile.gettempdir(), "torchyard", os.path.basename(where))
    advice = (
        f"the working directory {os.getcwd()} is not writable by user {os.getuid()}: write "
        f"to ${name}, or run as a user who may write there (spec.runAsUser), or ship the "
        "code with source.configMap, source.git or a snapshot (they run in a writable "
        "/workspace)"
    )
    try:
        os.makedirs(fallback, exist_ok=True)
    except OSError as err:
        raise LaunchError(
            f"cannot create {name} {where} ({reason}) nor {fallback} ({err.strerror}): " + advice
        ) from None
    say(f"{name}: cannot create {where} ({reason}); using {fallback} instead ({advice})")
    return fallback


def oom_kills(root: str) -> int | None:
    """How many processes the kernel's OOM killer has killed in the memory cgroup mounted
    at ``root`` (cgroup v2 ``memory.events``, v1 ``memory/memory.oom_control``, whose
    ``oom_kill`` line needs Linux 4.13); None where neither says."""
    for name in ("memory.events", os.path.join("memory", "memory.oom_control")):
        try:
            with open(os.path.join(root, name)) as f:
                text = f.read()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def memory_limit(root: str) -> int | None:
    """The memory limit of the cgroup mounted at ``root`` in bytes (v2 ``memory.max``,
    v1 ``memory/memory.limit_in_bytes``); None when there is none."""
    for name in ("memory.max", os.path.join("memory", "memory.limit_in_bytes")):
        try:
            with open(os.path.join(root, name)) as f:
                value = f.read().strip()
        except OSError:
            continue
        # cgroup v1 says "no limit" with a huge number (a page-aligned LONG_MAX)
        if value.isdigit() and int(value) < 1 << 62:
            return int(value)
        return None
    return None


def _quantity(size: int) -> str:
    """Bytes as Kubernetes writes memory (``200Mi``, ``4Gi``), exact or else in bytes."""
    for unit, suffix in ((1 << 30, "Gi"), (1 << 20, "Mi"), (1 << 10, "Ki")):
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def oom_message(label: str, limit: int | None) -> str:
    """What a termination message says of a rank the OOM killer ended."""
    over = f"its memory limit ({_quantity(limit)})" if limit else "the memory it may use"
    return (
        f"{label} was killed by the kernel's OOM killer: this node Pod's processes went over "
        f"{over}. Give the run more memory (spec.resources.memory, which is per node Pod "
        "and shared by its ranks) or make each rank use less (a smaller batch, fewer "
        "DataLoader workers, fewer processCountPerNode)"
    )


def traceback_tail(lines: Sequence[str]) -> str:
    """The last Python traceback in ``lines`` (or the last lines when there is none)."""
    lines = list(lines)
    start = None
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last)"):
            start = i
            break
    tail = lines[start:] if start is not None else lines[-20:]
    return "\n".join(line.rstrip("\n") for line in tail).strip()


def termination_message(info: Mapping[str, Any], limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
    """``info`` as JSON of at most ``limit`` bytes, cutting the message from the front."""
    info = dict(info)
    message = str(info.get("message") or "")
    while True:
        text = json.dumps(info, sort_keys=True)
        size = len(text.encode("utf-8"))
        if size <= limit or not message:
            return text
        # Cut in proportion to the escaped size (newlines and quotes count double).
        escaped = len(json.dumps(message).encode("utf-8"))
        message = message[len(message) * (size - limit) // max(escaped, 1) + 4 :]
        info["message"] = "..." + message


PROGRESS_PREFIX = b"@@torchyard "  # torchyard.progress.PREFIX: the format's one home
PROGRESS_LINE = "[torchyard] progress "  # what the operator looks for in this Pod's log
PROGRESS_METRICS_MAX = 32  # metric names kept for the summary (all go to metrics.jsonl)
# What a rank may say it is doing besides training (``torchyard.progress.PHASES``), each
# with its own stall budget: a checkpoint save or an evaluation may take far longer than
# a step. "training" (or a higher step without a phase) ends the phase.
PHASE_NAMES = {
    "initializing": "initializing",
    "initialising": "initializing",
    "saving": "saving",
    "evaluating": "evaluating",
    "training": None,
}
STALL_BUDGETS = {"initializing": 1800.0, "saving": 1800.0, "evaluating": 3600.0}


def parse_progress(line: bytes) -> dict[str, Any] | None:
    """The record of a rank's ``@@torchyard {...}`` line (``torchyard.progress.parse``),
    or None when ``line`` is not one."""
    if not line.startswith(PROGRESS_PREFIX):
        return None
    try:
        record = json.loads(line[len(PROGRESS_PREFIX) :].decode("utf-8", "replace"))
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None
    return record


class ProgressTracker:
    """What the ranks of this node said of their progress (``@@torchyard`` lines).

    Every record goes to ``logs/metrics.jsonl`` with its rank and time; :meth:`summary`
    is the node's progress: the leading and the slowest rank's step, the total, steps per
    second (of the leading rank, from its second report on: the first one includes the
    warm-up), when progress was last made, and the last metric values (rank 0's win).
    Thread-safe: the ranks' output threads call :meth:`record`.
    """

    def __init__(self, log_dir: str, clock: Callable[[], float] = time.time) -> None:
        self.path = os.path.join(log_dir, "metrics.jsonl")
        self.clock = clock
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        # rank -> [first point after warm-up (t, step) or None, last (t, step)]
        self._ranks: dict[int | None, list[tuple[float, int] | None]] = {}
        self._metrics: dict[int | None, dict[str, Any]] = {}
        self.total: int | None = None
        self.last_time: float | None = None
        self.slowest_step = 0.0  # seconds, of the slowest step after the warm-up
        self.version = 0  # bumped by every record: has anything changed?
        # rank -> (phase, since when) while it says it is not training (PHASE_NAMES)
        self._phases: dict[int | None, tuple[str, float]] = {}

    def record(self, rank: int | None, record: Mapping[str, Any]) -> None:
        now = self.clock()
        step = int(record["step"])
        said_rank = record.get("rank")
        if rank is None and isinstance(said_rank, int) and not isinstance(said_rank, bool):
            rank = said_rank  # launch: node: the rank says who it is (``progress.report``)
        with self._lock:
            if self._file is None:
                self._file = open(self.path, "a")  # noqa: SIM115
            self._file.write(json.dumps(dict(record, rank=rank, time=round(now, 3))) + "\n")
            self._file.flush()
            points = self._ranks.setdefault(rank, [None, None])
            last = points[1]
            in_phase = rank in self._phases
            if last is not None and step > last[1]:
                if points[0] is None:
                    points[0] = (now, step)  # the first step after the warm-up one
                elif not in_phase:  # the slowest step since the warm-up (a save or an
                    # evaluation in between is no step): the adaptive stall timeout
                    self.slowest_step = max(self.slowest_step, (now - last[0]) / (step - last[1]))
                self.last_time = now
            elif last is None:
                self.last_time = now
            said = record.get("phase")
            phase = PHASE_NAMES.get(said.lower(), "") if isinstance(said, str) else ""
            if phase is None or (not phase and last is not None and step > last[1]):
                self._phases.pop(rank, None)  # training (again)
                if in_phase and last is not None and step <= last[1]:
                    points[1] = (now, last[1])  # the phase ended: the step clock restarts
            elif phase and self._phases.get(rank, ("",))[0] != phase:
                self._phases[rank] = (phase, now)
            if last is None or step > last[1]:
                points[1] = (now, step)  # when this rank last made progress
            if isinstance(record.get("total"), int) and not isinstance(record["total"], bool):
                self.total = int(record["total"])
            metrics = self._metrics.setdefault(rank, {})
            for name, value in record.items():
                if name not in ("step", "total", "phase", "rank") and (
                    name in metrics or len(metrics) < PROGRESS_METRICS_MAX
                ):
                    metrics[name] = value
            self.version += 1

    def stalled(
        self,
        ranks: Sequence[int | None],
        now: float,
        fixed: float | None,
        floor: float,
        budgets: Mapping[str, float] | None = None,
    ) -> tuple[int | None, float, int, float] | None:
        """(rank, seconds without progress, its last step, the timeout) of the rank of
        ``ranks`` that made no progress for longest of those past their stall timeout:
        ``fixed``, else max(``floor``, 5 x the slowest step) once a step after the warm-up
        was timed (before that, and for ranks that never reported, there is no timeout).
        While a rank says it is initializing, saving or evaluating (:meth:`phase_of`), its
        timeout is that phase's budget (``budgets``, else ``STALL_BUDGETS``), counted from
        when it said so; the node's other ranks (which may wait for it in a collective)
        get the largest budget of the phases under way, counted from the earliest."""
        budget = dict(STALL_BUDGETS, **(budgets or {}))
        with self._lock:
            timeout = fixed if fixed is not None else None
            if timeout is None and self.slowest_step > 0:
                timeout = max(floor, 5 * self.slowest_step)
            phases = {r: p for r, p in self._phases.items() if r in ranks}
            shared = (
                (max(budget[p] for p, _ in phases.values()), min(t for _, t in phases.values()))
                if phases
                else None
            )
            # (seconds idle, in a phase itself, minus its last step, rank, its limit): the
            # rank idle longest, the one that said the phase before those waiting for it
            idle: list[tuple[float, bool, int, int | None, float]] = []
            for rank in ranks:
                last = self._ranks.get(rank, [None, None])[1]
                if last is None:
                    continue
                limit, since = timeout, last[0]
                if rank in phases:
                    limit, since = budget[phases[rank][0]], max(last[0], phases[rank][1])
                elif shared is not None:
                    limit = max(shared[0], timeout or 0.0)
                    since = max(last[0], shared[1])
                if limit is not None and now - since > limit:
                    idle.append((now - since, rank in phases, -last[1], rank, limit))
        if not idle:
            return None
        seconds, _, minus_step, rank, limit = max(idle, key=lambda item: item[:3])
        return rank, seconds, -minus_step, limit

    def idle_seconds(self, rank: int | None, now: float) -> float | None:
        """Seconds since ``rank`` last made progress, None if it never reported."""
        with self._lock:
            last = self._ranks.get(rank, [None, None])[1]
            return now - last[0] if last is not None else None

    def idle_ranks(
        self, ranks: Sequence[int | None], now: float, seconds: float
    ) -> list[int | None]:
        """Those of ``ranks`` that made no progress for ``seconds`` or longer, in order."""
        return [
            r
            for r in ranks
            for idle in [self.idle_seconds(r, now)]
            if idle is not None and idle >= seconds
        ]

    def phase_of(self, rank: int | None) -> str | None:
        """What ``rank`` said it is doing besides training, None while it trains."""
        with self._lock:
            held = self._phases.get(rank)
            return held[0] if held is not None else None

    def reported_ranks(self) -> list[int]:
        """The ranks that said who they are (all of them with ``launch: process``)."""
        with self._lock:
            return sorted(r for r in self._ranks if r is not None)

    def step_of(self, rank: int | None) -> int | None:
        """The last step ``rank`` reported, None if it reported none."""
        with self._lock:
            last = self._ranks.get(rank, [None, None])[1]
            return last[1] if last is not None else None

    def metrics(self) -> dict[str, Any]:
        """The last value of every metric, rank 0's (the lowest rank's) winning."""
        with self._lock:
            merged: dict[str, Any] = {}
            for rank in sorted(self._metrics, key=lambda r: -1 if r is None else r, reverse=True):
                merged.update(self._metrics[rank])
            return merged

    def summary(self) -> dict[str, Any] | None:
        """This node's progress (see the class docstring), None before any report."""
        with self._lock:
            lasts = {r: p[1] for r, p in self._ranks.items() if p[1] is not None}
            if not lasts:
                return None
            lead = max(lasts, key=lambda r: (lasts[r][1], -(r or 0)))
            lead_last = lasts[lead]
            first = self._ranks[lead][0]
            steps = [p[1] for p in lasts.values() if p is not None]
        summary: dict[str, Any] = {"step": max(steps), "minStep": min(steps)}
        if self.total is not None:
            summary["total"] = self.total
        if first is not None and lead_last is not None and lead_last[0] > first[0]:
            rate = (lead_last[1] - first[1]) / (lead_last[0] - first[0])
            summary["stepsPerSecond"] = round(rate, 6)
        if self.last_time is not None:
            summary["time"] = round(self.last_time, 3)
        metrics = self.metrics()
        if metrics:
            summary["metrics"] = metrics
        return summary

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


# Lines that say more than a traceback, for the operator's failure classes
# (``status.classes``): a GPU's Xid/ECC error, CUDA out of memory, NCCL's watchdog or gloo's
# transport timing out a collective, the rendezvous store, a segfault. Kept in the
# termination message as ``evidence``.
EVIDENCE = re.compile(
    r"NVRM: Xid|\bXid[: ]+\d+|ECC error|CUDA out of memory|OutOfMemoryError|Watchdog caught "
    r"collective|Timed out waiting \d+ms for (recv|send) operation|DistStoreError|"
    r"DistNetworkError|Rendezvous\w*Error|TCPStore|Segmentation fault"
)
EVIDENCE_MAX = 4  # lines, of at most EVIDENCE_CHARS each: the message is 4 KiB in all
EVIDENCE_CHARS = 200


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
            raise LaunchError(f"TORCHYARD_LOG_RULES is not valid: {err}") from None
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


# Installed as ``sitecustomize`` in a folder first on the ranks' PYTHONPATH: every rank
# registers faulthandler on SIGUSR1, writing all its threads' stacks to a file of its own
# (no ptrace: works under Pod Security "restricted"), then runs any other sitecustomize.
STACK_HOOK = """\"\"\"torchyard: SIGUSR1 writes this rank's stacks to a file (faulthandler).\"\"\"
import os
import sys


def _torchyard_stacks():
    try:
        import faulthandler
        import signal

        folder = os.environ.get("TORCHYARD_STACKS_DIR", "")
        rank = os.environ.get("RANK", "")
        if folder and rank and hasattr(signal, "SIGUSR1"):
            name = "rank-%s.pid-%d.txt" % (rank, os.getpid())
            out = open(os.path.join(folder, name), "w")
            faulthandler.register(signal.SIGUSR1, file=out, all_threads=True, chain=False)
            sys._torchyard_stacks = out
    except Exception:
        pass


def _torchyard_chain():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_torchyard_stacks()
_torchyard_chain()
"""
_FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in (.*)$')
STALL_FLOOR_SECONDS = 300  # the adaptive stall timeout's floor (TORCHYARD_STALL_FLOOR)


def stall_budgets(text: str) -> dict[str, float]:
    """TORCHYARD_STALL_BUDGETS (JSON ``{phase: seconds}``, policy.stallBudgets) as a dict;
    names other than those of STALL_BUDGETS and values that are not positive numbers are
    dropped (the operator's schema refuses them before they get here)."""
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in data.items()
        if k in STALL_BUDGETS and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
    }


STACKS_WAIT_SECONDS = 5.0


def prune_empty(folder: str) -> None:
    """Remove the empty files of ``folder`` (each rank's stack file stays empty unless its
    stacks were asked for), then the folder if nothing is left: the archived logs keep
    only stacks that were written."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        path = os.path.join(folder, name)
        try:
            if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) == 0:
                os.unlink(path)
        except OSError:
            pass
    with contextlib.suppress(OSError):
        os.rmdir(folder)  # only when empty


def install_stack_hook(env: dict[str, str], logs: str) -> tuple[str, str]:
    """Make every rank write its stacks on SIGUSR1 to ``logs/stacks/`` (``STACK_HOOK``), and
    for GPU runs enable PyTorch's NCCL flight recorder, dumped there on a timeout. Returns
    the stacks folder and the hook's own temporary folder, which the caller removes once
    the ranks are gone (read only as an interpreter starts)."""
    import tempfile

    stacks = os.path.join(logs, "stacks")
    os.makedirs(stacks, exist_ok=True)
    hook = tempfile.mkdtemp(prefix="torchyard-hook-")
    with open(os.path.join(hook, "sitecustomize.py"), "w") as f:
        f.write(STACK_HOOK)
    # Last: before the interpreter's own folders (where a distribution's sitecustomize is,
    # run after ours), after the image's (a sitecustomize there wins, and no stacks come).
    env["PYTHONPATH"] = (env["PYTHONPATH"] + os.pathsep if env.get("PYTHONPATH") else "") + hook
    env["TORCHYARD_STACKS_DIR"] = stacks
    if _int_env(env, "TORCHYARD_GPUS_PER_NODE", 0) > 0:
        env.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
        env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
        env.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", os.path.join(stacks, "nccl-trace-rank-"))
    return stacks, hook


_STACK_FILE = re.compile(r"^rank-(\d+)\.pid-(\d+)\.txt$")


def _parent(pid: int) -> int | None:
    """The parent of a process (Linux: /proc), None when it is gone or unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def rank_processes(stacks: str, root: int) -> list[tuple[int | None, int]]:
    """(rank, pid) of the live processes under ``root`` (the node command: torchrun, ...)
    that opened a stack file in ``stacks`` (``STACK_HOOK``: the file names say both), so
    that only the node command's own ranks are signalled."""
    found: list[tuple[int | None, int]] = []
    for name in sorted(os.listdir(stacks)) if os.path.isdir(stacks) else []:
        match = _STACK_FILE.match(name)
        if not match:
            continue
        pid, hops = int(match.group(2)), 0
        parent: int | None = pid
        while parent not in (None, 0, 1, root) and hops < 32:
            parent, hops = _parent(int(parent or 0)), hops + 1
        if parent == root and pid != root:
            found.append((int(match.group(1)), pid))
    return found


def stack_top(text: str) -> tuple[str, int, str] | None:
    """(file, line, function) where a faulthandler dump's thread is: the innermost frame of
    the thread the signal interrupted ("Current thread"), else of the last thread listed
    (the main thread), None when the dump has no frame."""
    frames = _frames(text)
    return frames[0] if frames else None


def _frames(text: str) -> list[tuple[str, int, str]]:
    """The frames of a faulthandler dump's interrupted thread (else its last one), innermost
    first."""
    blocks: list[tuple[bool, list[tuple[str, int, str]]]] = []
    for line in text.splitlines():
        if line.startswith(("Current thread", "Thread ", "Stack (")):
            blocks.append((line.startswith("Current thread"), []))
            continue
        found = _FRAME.match(line)
        if found and blocks:
            blocks[-1][1].append((found.group(1), int(found.group(2)), found.group(3).strip()))
    with_frames = [b for b in blocks if b[1]]
    current = [frames for is_current, frames in with_frames if is_current]
    return current[0] if current else (with_frames[-1][1] if with_frames else [])


_LIBRARY = re.compile(r"[/\\](site|dist)-packages[/\\]|[/\\]lib[/\\]python\d")


# The autograd engine's entry points: a DDP or FSDP rank waits for its peers inside
# ``loss.backward()`` (the gradient all-reduce runs in the engine's C++ hooks), with no
# ``torch.distributed`` frame on its Python stack.
_BACKWARD = (
    ("torch/autograd/graph.py", "_engine_run_backward"),
    ("torch/autograd/__init__.py", "backward"),
)


def waiting_in(text: str) -> str | None:
    """What a rank's stack dump shows it waiting for the others in: the innermost
    ``torch.distributed`` function (a collective, a barrier, a store wait), or "backward"
    when its innermost frame is the autograd engine (DDP's and FSDP's gradient
    all-reduce); None when it is elsewhere (the one the others may wait for)."""
    frames = [(f.replace("\\", "/"), line, fn) for f, line, fn in _frames(text)]
    for file, _, function in frames:
        if "torch/distributed/" in file:
            return function
    if frames and any(frames[0][0].endswith(f) and frames[0][2] == fn for f, fn in _BACKWARD):
        return "backward"
    return None


def waiting_words(collective: str) -> str:
    """How a message says where a rank waits (``waiting_in``'s answer); the operator's
    ``status.culprits`` says it the same way."""
    if collective == "backward":
        return "waiting in backward: the gradient all-reduce"
    return f"in torch.distributed {collective}"


def in_collective(text: str) -> bool:
    """Whether a rank's stack dump shows it waiting for the others (``waiting_in``): in
    ``torch.distributed`` or in the autograd engine's ``backward``, not the one they wait
    for."""
    return waiting_in(text) is not None


def user_frame(text: str) -> tuple[str, int, str] | None:
    """The innermost frame of a dump outside the Python library and installed packages:
    where in the training script the rank is (relative to the working folder, when in it)."""
    here = os.path.join(os.getcwd(), "")
    for file, line, function in _frames(text):
        if not _LIBRARY.search(file):
            # relative to the node's working folder: the same script's place reads the
            # same on every node (local mode gives each node a folder of its own)
            return (file[len(here) :] if file.startswith(here) else file), line, function
    return None


def culprit(
    stacks: Mapping[int | None, str], suspects: Sequence[int | None], first: int | None
) -> int | None:
    """Which of ``suspects`` (ranks of this node that stalled too; ``first``: the one idle
    longest) the others wait for, by their stacks: the only ones outside
    ``torch.distributed`` while others are in it (a rank that sleeps, loops or blocks in
    a C call), else, of three or more in it, the one whose place in the script differs
    from where all the others are (it skipped a collective and waits in another one);
    else ``first``."""
    dumped = [r for r in suspects if stacks.get(r)]
    outside = [r for r in dumped if not in_collective(stacks[r])]
    if outside and len(outside) < len(dumped):
        return first if first in outside else outside[0]
    places = {r: user_frame(stacks[r]) for r in dumped}
    if len(dumped) >= 3:
        for rank in dumped:
            others = {places[r] for r in dumped if r != rank}
            if len(others) == 1 and places[rank] not in others and None not in others:
                return rank
    return first


# Stalled ranks of a node whose places the termination message carries (about 250 bytes
# each at most: the message's 4 KiB keeps room for the stuck rank's stack).
SUSPECTS_REPORTED = 8
# Ranks that exited with status 0 that a termination message names (``earlyExits``).
EARLY_EXITS_REPORTED = 4


def suspects_of(
    stacks: Mapping[int | None, str],
    suspects: Sequence[int | None],
    idle: Callable[[int | None], float | None],
    step: Callable[[int | None], int | None],
) -> list[dict[str, Any]]:
    """Where each of ``suspects`` (this node's stalled ranks) is, for the termination
    message: rank, seconds idle, last step, whether in ``torch.distributed`` and the
    script's place (``user_frame``). The operator applies ``culprit``'s rules to those of
    every node (``torchyard.status.culprits``): one node sees only its own ranks."""
    found: list[dict[str, Any]] = []
    for rank in suspects[:SUSPECTS_REPORTED]:
        text = stacks.get(rank) or ""
        if rank is None or not text:
            continue
        seconds = idle(rank)
        entry: dict[str, Any] = {
            "rank": rank,
            "idle": round(seconds, 1) if seconds is not None else None,
            "step": step(rank),
            "inCollective": in_collective(text),
        }
        where = user_frame(text)
        if where is not None:
            entry.update(file=where[0][-120:], line=where[1], function=where[2][:40])
        if entry["inCollective"]:
            entry["collective"] = str(waiting_in(text))[:40]
        found.append({k: v for k, v in entry.items() if v is not None})
    return found


def merge_metrics(outputs: str, metrics: Mapping[str, Any]) -> None:
    """Put the last metric values into ``outputs/metrics.json`` (what the ModelVersion
    records); a value the script wrote there itself wins."""
    numbers = {
        k: v
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "rank"
    }
    if not numbers:
        return
    path = os.path.join(outputs, "metrics.json")
    mine: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        with open(path) as f:
            loaded = json.load(f)
        if isinstance(loaded, dict):
            mine = loaded
    with contextlib.suppress(OSError), open(path, "w") as f:
        json.dump(dict(numbers, **mine), f, sort_keys=True)


# -- what a rank's output may cost: its log file, the node's own output ---------------

# TORCHYARD_LOG_LIMIT_BYTES: the most one rank's log file (logs/rank-<r>.txt) may hold,
# set from spec.policy.logLimitBytes. A rank that writes more keeps its first and its last
# half; a line between them says how much was dropped. 0: no limit.
LOG_LIMIT_BYTES = 64 << 20
LOG_LIMIT_MIN = 4096  # a smaller limit would hold little more than the dropped note
LOG_NOTE_BYTES = 256  # room kept for that note, so that the file stays within the limit
# One read of a rank's pipe, and the longest line shown as one: a longer one comes in
# pieces (as the launcher showed them before). Lines are handled a read at a time, not one
# by one, so that a rank writing tens of MB/s costs its node a fraction of a core.
READ_BYTES = 1 << 16
# The pipe's kernel buffer (Linux): a rank writing bursts waits less while the pumps are
# between two reads. The default is 64 KiB.
PIPE_BYTES = 1 << 20
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (named in Python >= 3.10 only)
# How long a rank's output threads go on reading once it and everything it started ended:
# a process that escaped (another user's, a setuid program) holding the pipe open cannot
# hold the node.
PUMP_DRAIN_SECONDS = 1.0
# The node's own output (the ranks' lines with their ``[rank r]`` prefix, the launcher's
# messages): what may wait for a slow reader (a terminal, a log collector) before rank
# lines are dropped from it. The ranks never wait for it; their log files keep everything.
ECHO_BUFFER_BYTES = 4 << 20
ECHO_DRAIN_SECONDS = 10.0  # at the end, how long the rest may take to be written
# Literal words every EVIDENCE match contains (test_log_scanner keeps them in step): a
# read of a rank's output that holds none of them holds no evidence, and is not searched
# line by line (the regular expression alone reads ~30 MB/s).
EVIDENCE_WORDS = (
    b"Xid",
    b"ECC error",
    b"CUDA out of memory",
    b"OutOfMemoryError",
    b"Watchdog caught",
    b"Timed out waiting",
    b"DistStoreError",
    b"DistNetworkError",
    b"Rendezvous",
    b"TCPStore",
    b"Segmentation fault",
)


def log_limit(env: Mapping[str, str]) -> int:
    """TORCHYARD_LOG_LIMIT_BYTES (default LOG_LIMIT_BYTES; 0: none; at least LOG_LIMIT_MIN)."""
    limit = _int_env(env, "TORCHYARD_LOG_LIMIT_BYTES", LOG_LIMIT_BYTES)
    if limit < 0 or 0 < limit < LOG_LIMIT_MIN:
        raise LaunchError(
            f"TORCHYARD_LOG_LIMIT_BYTES must be 0 (no limit) or at least {LOG_LIMIT_MIN}, "
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
    however much it writes. Thread-safe: both output threads of a rank write to it."""

    def __init__(self, path: str, limit: int) -> None:
        self.path = path
        self.file: IO[bytes] = open(path, "ab")  # noqa: SIM115 - closed by close()
        self.limit = limit
        written = self.file.tell()  # a launcher started again in the same folder
        self.head_left = max(0, limit // 2 - written)
        self.segment_limit = max(1, (limit - limit // 2 - LOG_NOTE_BYTES) // 2)
        self.segments: list[tuple[str, IO[bytes]]] = []
        self.counts: list[list[int]] = []  # per segment: bytes, newlines, ends a line (1/0)
        self.segment_size = 0
        self.made = 0  # segments made so far (their names' numbers)
        self.dropped_bytes = 0
        self.dropped_lines = 0
        self.dropped_ends_line = True  # what was dropped ends with a whole line
        self.head_ends_line = True
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            if self.file.closed:
                return
            if not self.limit:
                self.file.write(data)
                self.file.flush()
                return
            if self.head_left > 0:
                if len(data) <= self.head_left:
                    self._head(data)
                    return
                # the head ends at the end of a line when one ends in what fits
                cut = data.rfind(b"\n", 0, self.head_left) + 1
                if cut:
                    self._head(data[:cut])
                    data = data[cut:]
                self.head_left = 0
            self._tail(data)

    def _head(self, data: bytes) -> None:
        self.file.write(data)
        self.file.flush()
        self.head_left -= len(data)
        self.head_ends_line = data.endswith(b"\n")

    def _tail(self, data: bytes) -> None:
        if len(data) > self.segment_limit:  # one read bigger than a segment: its end only
            self._drop(data[: len(data) - self.segment_limit])
            data = data[len(data) - self.segment_limit :]
        if not self.segments or self.segment_size + len(data) > self.segment_limit:
            if len(self.segments) == 2:
                name, old = self.segments.pop(0)
                old.close()
                os.unlink(name)
                size, lines, ends_line = self.counts.pop(0)
                self.dropped_bytes += size
                self.dropped_lines += lines
                self.dropped_ends_line = bool(ends_line)
            name = f"{self.path}.tail{self.made}"
            self.made += 1
            self.segments.append((name, open(name, "wb")))  # noqa: SIM115 - closed by close()
            self.counts.append([0, 0, 1])
            self.segment_size = 0
        self.segments[-1][1].write(data)
        self.segments[-1][1].flush()
        self.segment_size += len(data)
        # counted as written, so that dropping a segment needs no reading it back
        counts = self.counts[-1]
        counts[0] += len(data)
        counts[1] += data.count(b"\n")
        counts[2] = data.endswith(b"\n")

    def _drop(self, data: bytes) -> None:
        self.dropped_bytes += len(data)
        self.dropped_lines += data.count(b"\n")
        self.dropped_ends_line = data.endswith(b"\n")

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
                self.file.write((b"" if self.head_ends_line else b"\n") + note.encode())
            for chunk in _chunks(names):
                if skip >= len(chunk):
                    skip -= len(chunk)
                    continue
                self.file.write(chunk[skip:])
                skip = 0
            for name in names:
                os.unlink(name)
            self.file.close()


def write_bytes(sink: IO[str], data: bytes) -> None:
    """``data`` to a text stream: to its binary buffer when it has one (bytes as they
    came), else decoded; then flushed. Local mode's console writes the same way."""
    buffer = getattr(sink, "buffer", None)
    if buffer is not None:
        buffer.write(data)
    else:
        sink.write(data.decode("utf-8", "replace"))
    sink.flush()


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
    the ranks write (a terminal, a container runtime's log) never makes a rank wait:
    once ``limit`` bytes wait, rank lines are dropped from this output (their log files
    keep them), and a line says how many, when the reader caught up. The launcher's own
    messages (``label`` None: its progress lines, which the operator reads) are never
    dropped."""

    def __init__(self, notes: IO[str], limit: int = ECHO_BUFFER_BYTES) -> None:
        self.notes = notes
        self.limit = limit
        # reentrant: a signal handler in the main thread may say something while that
        # thread is queueing
        self._cond = threading.Condition(threading.RLock())
        self._queue: collections.deque[tuple[IO[str], bytes]] = collections.deque()
        self._size = 0  # bytes queued or being written
        self._dropped: dict[str, list[int]] = {}  # label -> [lines, bytes] not shown
        self._thread: threading.Thread | None = None

    def put(self, sink: IO[str], data: bytes, label: str | None = None) -> None:
        with self._cond:
            if label is not None and self._size + len(data) > self.limit:
                dropped = self._dropped.setdefault(label, [0, 0])
                dropped[0] += data.count(b"\n")
                dropped[1] += len(data)
                return
            self._queue.append((sink, data))
            self._size += len(data)
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_all, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def drain(self, timeout: float = ECHO_DRAIN_SECONDS) -> None:
        """Wait until everything queued was written (at most ``timeout`` seconds: a
        reader that stopped reading cannot hold the launcher's exit)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._size or self._dropped) and self._thread is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(min(left, 0.1))

    def _write_all(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._dropped:
                    self._cond.wait()
                batch, self._queue = self._queue, collections.deque()
                if self._dropped:
                    for label, (lines, size) in self._dropped.items():
                        note = (
                            f"[torchyard] {label}: {lines} lines ({size} bytes) not shown "
                            "here: written faster than this output is read; its log file "
                            "in logs/ has them\n"
                        )
                        batch.append((self.notes, note.encode()))
                    self._dropped.clear()
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


# -- what a node's ranks leave behind --------------------------------------------------

# Every process a node's ranks start inherits this variable (the launcher sets it to a
# random value of its own, or keeps the one local mode gave it): when the ranks ended,
# whatever still carries it is theirs (a helper in a session of its own, a daemon) and is
# ended, as is whatever still holds their output pipes open.
COOKIE_VARIABLE = "TORCHYARD_NODE_COOKIE"
LEFTOVER_GRACE_SECONDS = 2.0  # between SIGTERM and SIGKILL of what the ranks left


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:  # no /proc (macOS): the process groups are all there is
        return []


def _carries(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in b"\0" + f.read()
    except OSError:  # gone, or another user's
        return False


def _holds(pid: int, pipes: set[str]) -> bool:
    folder = f"/proc/{pid}/fd"
    try:
        for fd in os.listdir(folder):
            with contextlib.suppress(OSError):
                if os.readlink(f"{folder}/{fd}") in pipes:
                    return True
    except OSError:
        pass
    return False


def leftovers(cookie: str, pipes: Sequence[int] = ()) -> list[int]:
    """The processes (not this one) that carry ``COOKIE_VARIABLE=cookie`` in their
    environment or hold one of the pipes whose inode numbers are ``pipes``."""
    marker = f"\0{COOKIE_VARIABLE}={cookie}\0".encode()
    links = {f"pipe:[{inode}]" for inode in pipes}
    me = os.getpid()
    return [
        pid
        for pid in _pids()
        if pid != me and ((cookie and _carries(pid, marker)) or (links and _holds(pid, links)))
    ]


def end_leftovers(
    cookie: str,
    groups: Sequence[int] = (),
    pipes: Sequence[int] = (),
    grace: float = LEFTOVER_GRACE_SECONDS,
) -> list[int]:
    """End what a node's ranks left running once they exited: every process that carries
    the node's cookie or holds a rank's output pipe (``pipes``: inode numbers), which
    finds their process groups (DataLoader workers) and those that moved to a session of
    their own (``setsid``, daemons); without /proc, the ranks' process ``groups``.
    SIGTERM, then SIGKILL after ``grace`` seconds. In a node Pod the launcher is the
    container's first process: every other process there is also ended (the kernel ends
    them anyway when it exits, but only after the archive, which would wait for them).
    A process that both dropped the variable and closed the pipes (``env -i`` and a
    redirect) is not found outside a Pod. Returns the processes signalled."""
    # Without /proc (macOS) the ranks' process groups are all there is to end. With it,
    # their members carry the cookie: a group whose members all ended may have a new
    # owner by now (its number is a process number, free again), and is not signalled.
    if not _pids():
        for group in groups:
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)
        return []
    found = set(leftovers(cookie, pipes))
    if os.getpid() == 1:
        found |= set(_pids()) - {1}
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    alive = set(found)
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if _alive(pid)}
        if alive:
            time.sleep(0.05)
    for pid in alive | set(leftovers(cookie, pipes)):  # and any started meanwhile
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return sorted(found)


def _alive(pid: int) -> bool:
    """Still running (a zombie, ended but not yet waited for by its parent, is not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True


class Rank:
    """One child process and the threads that tee its output: to its log file (at most
    ``log_limit`` bytes, :class:`CappedLog`) and, with its ``[rank r]`` prefix, to the
    node's own output (``echo``, which never makes it wait)."""

    def __init__(
        self,
        rank: int | None,
        local_rank: int | None,
        label: str,
        command: list[str],
        env: dict[str, str],
        log_dir: str,
        out: IO[str],
        err: IO[str],
        echo: Echo,
        progress: ProgressTracker | None = None,
        scanner: LogScanner | None = None,
        *,
        log_limit: int = LOG_LIMIT_BYTES,
        show_progress: bool = True,
    ) -> None:
        self.rank = rank
        self.progress = progress
        self.scanner = scanner
        self.local_rank = local_rank
        self.label = label
        self.echo = echo
        # False (local mode): its ``@@torchyard`` lines are not shown (the node's progress
        # line says what they said; they stay in its log and metrics.jsonl)
        self.show_progress = show_progress
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        name = f"rank-{rank}.txt" if rank is not None else label.replace(" ", "-") + ".txt"
        self.log = CappedLog(os.path.join(log_dir, name), log_limit)
        # set by finish(): until when the output threads go on reading
        self._read_until: float | None = None
        try:
            self.proc = subprocess.Popen(
                command,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: its DataLoader workers too
            )
        except OSError as err:
            self.log.close()
            raise LaunchError(f"cannot start {command[0]!r}: {err.strerror}") from None
        assert self.proc.stdout is not None and self.proc.stderr is not None
        # the pipes' inode numbers: whoever holds one when the rank ended is its leftover
        self.pipes = [os.fstat(p.fileno()).st_ino for p in (self.proc.stdout, self.proc.stderr)]
        # When it exited (time.time(), set by a thread that waits for it): which rank
        # failed first, here and across nodes (``exitedAt`` in the termination message).
        self.exited_at: float | None = None
        self.threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, out, False), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, err, True), daemon=True),
            threading.Thread(target=self._wait_exit, daemon=True),
        ]
        for t in self.threads:
            t.start()

    def _wait_exit(self) -> None:
        self.proc.wait()
        self.exited_at = time.time()

    def exit_code(self) -> int | None:
        """The exit code once it exited (and ``exited_at`` says when), else None."""
        return self.proc.returncode if self.exited_at is not None else None

    def _pump(self, pipe: IO[bytes], sink: IO[str], keep_tail: bool) -> None:
        """Read the pipe a read at a time (at most READ_BYTES) and hand its whole lines
        on; a line longer than READ_BYTES goes on in pieces. Ends at the end of the pipe,
        or PUMP_DRAIN_SECONDS after :meth:`finish` (a process nobody could end holds it)."""
        fd = pipe.fileno()
        with contextlib.suppress(OSError):  # Linux only; a bigger buffer, fewer waits
            import fcntl

            fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
        prefix = f"[{self.label}] ".encode()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        rest = b""
        while self._read_until is None or time.monotonic() < self._read_until:
            if not poller.poll(200):
                continue
            try:
                data = os.read(fd, READ_BYTES)
            except OSError:
                break
            if not data:
                break
            data = rest + data
            end = data.rfind(b"\n") + 1
            if not end and len(data) < READ_BYTES:
                rest = data
                continue
            end = end or len(data)
            rest = data[end:]
            self._lines(data[:end], data[:end], sink, prefix, keep_tail)
        if rest:  # a last line without its newline
            self._lines(rest, rest + b"\n", sink, prefix, keep_tail)
        pipe.close()

    def _lines(
        self, raw: bytes, text: bytes, sink: IO[str], prefix: bytes, keep_tail: bool
    ) -> None:
        """One read's whole lines (``text``, each ending with a newline; ``raw`` as the
        rank wrote them): its log, the node's output, the traceback tail, the evidence
        scanner and the progress records. Whole-read operations only, no loop over the
        lines unless one of them matters."""
        self.log.write(raw)
        progress = PROGRESS_PREFIX in text
        shown = text
        if progress and not self.show_progress:
            shown = b"".join(
                line + b"\n"
                for line in text[:-1].split(b"\n")
                if not line.startswith(PROGRESS_PREFIX)
            )
        if shown:
            self.echo.put(
                sink, prefix + shown[:-1].replace(b"\n", b"\n" + prefix) + b"\n", self.label
            )
        if keep_tail:
            self.tail.extend(
                line.decode("utf-8", "replace") + "\n"
                for line in text[:-1].split(b"\n")[-TAIL_LINES:]
            )
        if self.scanner is not None:
            self.scanner.scan_read(self.rank, text)
        if progress and self.progress is not None:
            for line in text.split(b"\n"):
                if line.startswith(PROGRESS_PREFIX):
                    record = parse_progress(line.rstrip(b"\r"))
                    if record is not None:
                        self.progress.record(self.rank, record)

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signum)

    def finish(self) -> None:
        """Once the rank exited and what it left was ended (:func:`end_leftovers`): read
        what its pipes still hold, at most PUMP_DRAIN_SECONDS, and close its log."""
        self._read_until = time.monotonic() + PUMP_DRAIN_SECONDS
        for t in self.threads:
            t.join(timeout=PUMP_DRAIN_SECONDS + 1)
        self.log.close()


class Launcher:
    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str] | None = None,
        out: IO[str] | None = None,
        err: IO[str] | None = None,
    ) -> None:
        if not command:
            raise LaunchError("no command given: usage: launcher.py -- <command> [args...]")
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
        # Carried by every process the ranks start (COOKIE_VARIABLE): what is left of
        # them when they ended is found and ended (end_leftovers). Local mode gives its
        # own, to find them too should this launcher be killed.
        self.cookie = self.env.get(COOKIE_VARIABLE) or os.urandom(8).hex()
        self.log_limit = LOG_LIMIT_BYTES  # TORCHYARD_LOG_LIMIT_BYTES, read by run()
        # Local mode: the node's progress summaries go to this file, one JSON a line, for
        # its one progress line (torchyard.local), instead of this output.
        self.progress_file = self.env.get("TORCHYARD_PROGRESS_FILE") or None
        self.cgroup = self.env.get("TORCHYARD_CGROUP_ROOT") or "/sys/fs/cgroup"
        self._oom_kills = oom_kills(self.cgroup)  # before any rank ran
        self.progress = ProgressTracker(".")  # replaced in run(), once logs/ is known
        self.scanner = LogScanner(self.env.get("TORCHYARD_LOG_RULES", ""))
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
        launch = env.get("TORCHYARD_LAUNCH", "process")
        if launch not in ("process", "node"):
            raise LaunchError(f"TORCHYARD_LAUNCH must be 'process' or 'node', got {launch!r}")
        nproc = _int_env(env, "TORCHYARD_NPROC_PER_NODE", 1)
        node_rank = _int_env(env, "NODE_RANK", 0)
        if nproc < 1:
            raise LaunchError("TORCHYARD_NPROC_PER_NODE must be >= 1")
        env.setdefault("TORCHYARD_NPROC_PER_NODE", str(nproc))
        env.setdefault("NODE_RANK", str(node_rank))
        env.setdefault("LOCAL_WORLD_SIZE", str(nproc))
        env.setdefault("WORLD_SIZE", str(nproc))
        # As torchrun: one intra-op thread per process unless told otherwise, so that
        # N ranks on a node do not each start one thread per core.
        if nproc > 1:
            env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("PYTHONUNBUFFERED", "1")
        # In a node Pod the shipped torchyard package (a ConfigMap volume) is importable
        # by the ranks (``from torchyard import ...``), ahead of the image's PYTHONPATH.
        shipped = env.get("TORCHYARD_SHIPPED_PATH")
        if shipped:
            paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
            env["PYTHONPATH"] = os.pathsep.join([shipped, *(p for p in paths if p != shipped)])
        for name, default in (("TORCHYARD_LOGS", "logs"), ("TORCHYARD_OUTPUTS", "outputs")):
            env[name] = writable_folder(name, env.get(name) or os.path.abspath(default), self.say)
        return launch, nproc, node_rank, env["TORCHYARD_LOGS"]

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
        merge_metrics(self.env["TORCHYARD_OUTPUTS"], self.progress.metrics())

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
        folder = self.env.get("TORCHYARD_CHECKPOINT_DIR", "")
        if not folder:
            return
        module = checkpoint_module(self.env)
        self.checkpoints = module.NodeCheckpoints(
            folder,
            node_rank,
            _int_env(self.env, "WORLD_SIZE", 1),
            keep_newest=_int_env(self.env, "TORCHYARD_CHECKPOINT_KEEP", 0),
            max_without_progress=_int_env(self.env, "TORCHYARD_CHECKPOINT_MAX_STALLS", 3),
            attempt=self.env.get("TORCHYARD_CHECKPOINT_ATTEMPT", ""),
            wait_seconds=_int_env(self.env, "TORCHYARD_DNS_TIMEOUT", 300),
        )
        try:
            self.env.update(self.checkpoints.start())
        except module.CheckpointError as err:
            raise LaunchError(str(err)) from None
        if "TORCHYARD_RESUME_FROM" in self.env:
            self.say(f"resuming from checkpoint {self.env['TORCHYARD_RESUME_FROM']}")

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
        wait = _int_env(self.env, "TORCHYARD_CHECKPOINT_SAVE_SECONDS", 20)
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
                    number = int(env["RANK"])
                    self.ranks.append(
                        Rank(
                            number,
                            local,
                            f"rank {number}",
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
            else:
                self.ranks.append(
                    Rank(
                        None,
                        None,
                        f"node {node_rank}",
                        expand_arguments(self.command, self.env),
                        dict(self.env),
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
        except LaunchError:
            for started_rank in self.ranks:
                started_rank.signal(signal.SIGKILL)
                started_rank.proc.wait()
            self._end_leftovers()
            for started_rank in self.ranks:
                started_rank.finish()
            raise

    def run(self) -> int:
        """Run the node; its output written (ECHO_DRAIN_SECONDS at most) when it returns."""
        try:
            return self._run()
        finally:
            self.echo.drain()

    def _run(self) -> int:
        launch, nproc, node_rank, logs = self._config()
        self.log_limit = log_limit(self.env)
        self.env[COOKIE_VARIABLE] = self.cookie
        if self.env.get("MASTER_ADDR"):
            wait_for_dns(
                self.env["MASTER_ADDR"], _int_env(self.env, "TORCHYARD_DNS_TIMEOUT", 300), self.err
            )
        grace = _int_env(self.env, "TORCHYARD_GRACE_PERIOD", 10)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        started = time.monotonic()
        self._start_checkpoints(node_rank)
        self.progress = ProgressTracker(logs)
        # launch: node: torchrun's workers inherit the hook (they have RANK; torchrun has
        # not) and say their rank in their progress lines (TORCHYARD_LAUNCH=node)
        self.stacks, hook = install_stack_hook(self.env, logs)
        interval = max(1, _int_env(self.env, "TORCHYARD_PROGRESS_INTERVAL", 5))
        publisher = threading.Thread(target=self._publish_progress, args=(interval,), daemon=True)
        publisher.start()
        try:
            self._start_ranks(launch, nproc, node_rank, logs)
            failed = self._wait(grace)
            self._end_leftovers()
            for rank in self.ranks:
                rank.finish()
        finally:
            shutil.rmtree(hook, ignore_errors=True)
        if self.checkpoints is not None:
            self.checkpoint_info = self.checkpoints.stop(rank_failed=failed is not None)
        self._progress_done()
        code = self._report(failed, node_rank, time.monotonic() - started)
        if self.stacks:
            prune_empty(self.stacks)
        if self.env.get("TORCHYARD_REGISTRY_URL"):
            problem = self.archive(node_rank, logs)
            if problem is not None and code == 0:
                code = self._archive_failed(problem, node_rank)
        return code

    def archive(self, node_rank: int, logs: str) -> str | None:
        """Upload this node's logs (and node 0's outputs) to the registry service.

        Runs whether the ranks succeeded or not. Returns None when every file arrived,
        else what went wrong and what to fix (:func:`archive_advice`). A connection error
        or a 5xx is tried again; one that persists, or a refused token (401/403), stops
        the uploads at once.
        """
        url = self.env["TORCHYARD_REGISTRY_URL"].rstrip("/")
        namespace = self.env.get("TORCHYARD_NAMESPACE", "default")
        run = self.env.get("TORCHYARD_RUN", "run")
        base = f"{url}/v1/namespaces/{namespace}/runs/{run}"
        token_file = self.env.get("TORCHYARD_REGISTRY_TOKEN_FILE", "")
        try:
            with open(token_file) as f:
                token = f.read().strip()
        except OSError as err:
            return self._say_problem(
                f"cannot archive to the model registry: no registry token at {token_file!r} "
                f"({err.strerror}); node Pods get one (audience torchyard-registry) when the "
                "operator archives to a registry: run this through a TrainingRun"
            )
        try:
            context = registry_context(self.env)
        except (OSError, ValueError) as err:  # ssl.SSLError is an OSError
            return self._say_problem(
                f"cannot archive: TORCHYARD_REGISTRY_CA is not a PEM certificate ({err})"
            )
        folders = [(logs, f"logs/node-{node_rank}")]
        if node_rank == 0:
            folders.append((self.env["TORCHYARD_OUTPUTS"], "outputs"))
        files = [
            (os.path.join(dirpath, name), f"{prefix}/{_relative_dir(dirpath, folder)}{name}")
            for folder, prefix in folders
            for dirpath, _, names in os.walk(folder)
            for name in sorted(names)
        ]
        attempts = max(1, _int_env(self.env, "TORCHYARD_ARCHIVE_ATTEMPTS", ARCHIVE_ATTEMPTS))
        sent, failed = 0, []
        first: OSError | None = None
        for path, target in files:
            try:
                _upload_retrying(f"{base}/{target}", path, token, context, attempts=attempts)
                sent += 1
            except OSError as err:
                failed.append(target)
                first = first or err
                if not isinstance(err, UploadError) or err.status in (401, 403):
                    break  # unreachable, or the token refused: so would every other file be
        if first is None:
            self.say(f"archived {sent} file(s) to the registry")
            return None
        return self._say_problem(
            f"archiving to the model registry failed: {len(files) - sent} of {len(files)} "
            f"file(s) not uploaded (first: {failed[0]}): "
            + archive_advice(first, url=url, namespace=namespace, run=run)
        )

    def _say_problem(self, problem: str) -> str:
        self.say(problem)
        return problem

    def _archive_failed(self, problem: str, node_rank: int) -> int:
        """The ranks succeeded but the archive did not: say so in the termination message
        (reason ArchiveFailed). With TORCHYARD_OUTPUTS_OPTIONAL the node still succeeds
        (the operator turns the message into a warning); otherwise it fails."""
        optional = self.env.get("TORCHYARD_OUTPUTS_OPTIONAL", "") not in ("", "0", "false")
        code = 0 if optional else ARCHIVE_FAILED_EXIT
        path = self.env.get("TORCHYARD_TERMINATION_LOG", "/dev/termination-log")
        info = {"nodeRank": node_rank, "exitCode": code, "reason": "ArchiveFailed"}
        _write(path, termination_message(dict(info, message=problem)))
        return code

    def _check_stall(self) -> Rank | None:
        """The rank that made no progress for longer than the stall timeout (once a second;
        ``ProgressTracker.stalled``): every live rank's stacks are collected, the stuck
        rank's file:line said, and the ranks stopped. None while nothing stalled."""
        now = time.monotonic()
        if not self.stacks or now < self._stall_check_at:
            return None
        self._stall_check_at = now + 1.0
        fixed = _int_env(self.env, "TORCHYARD_STALL_TIMEOUT", 0)
        floor = _int_env(self.env, "TORCHYARD_STALL_FLOOR", STALL_FLOOR_SECONDS)
        live = [r for r in self.ranks if r.exit_code() is None]
        if not live:
            return None
        node = live[0] if live[0].rank is None else None  # launch: node (torchrun, ...)
        watched: list[int | None] = [r.rank for r in live]
        if node is not None:
            watched = list(self.progress.reported_ranks())
        found = self.progress.stalled(
            watched,
            time.time(),
            float(fixed) if fixed > 0 else None,
            floor,
            stall_budgets(self.env.get("TORCHYARD_STALL_BUDGETS", "")),
        )
        if found is None:
            return None
        number, seconds, step, timeout = found
        detected = time.time()
        if node is None:
            stacks = self._collect_stacks([(r.rank, r.proc.pid) for r in live])
        else:  # the node command's ranks: the processes that opened a stack file
            stacks = self._collect_stacks(rank_processes(self.stacks, node.proc.pid))
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
        number = culprit(stacks, suspects, number)
        stuck = node if node is not None else next(r for r in live if r.rank == number)
        label = stuck.label if node is None else f"rank {number}"
        step = self.progress.step_of(number) or 0
        seconds = self.progress.idle_seconds(number, time.time()) or seconds
        text = stacks.get(number, "")
        inner = stack_top(text)
        where = user_frame(text) or inner  # the script's line, not torch's
        at = f"{where[0]}:{where[1]} in {where[2]}" if where else "(no Python stack)"
        collective = waiting_in(text)
        if collective:
            at += f" ({waiting_words(collective)})"
        phase = self.progress.phase_of(stuck.rank)
        budget = f"stall budget while {phase}" if phase else "stall timeout"
        message = (
            f"{label} made no progress for {seconds:.0f}s (last step {step}; {budget} "
            f"{timeout:.0f}s): stuck at {at}. Every rank's stacks are in "
            f"logs/stacks/ of this node.\n{text.strip()}"
        )
        stall: dict[str, Any] = {"rank": number, "seconds": round(seconds), "step": step}
        if phase:
            stall["phase"] = phase
        if where:
            stall.update(file=where[0], line=where[1], function=where[2])
        if collective:
            stall["collective"] = collective
        # This node's stalled ranks, idle longest first: the operator names the culprit
        # across every node's (``suspects_of``).
        order = [first] + [r for r in suspects if r != first]
        stall["suspects"] = suspects_of(
            stacks,
            order,
            lambda r: self.progress.idle_seconds(r, time.time()),
            self.progress.step_of,
        )
        stall["message"] = message
        # when the stall was found: the stuck rank itself may take the grace period to end
        # (it ignores SIGTERM), while its peers on other nodes end at once
        stall["detectedAt"] = round(detected, 6)
        self.stall = (stuck, stall)
        self.say(f"{label} stalled at {at}: stopping the ranks")
        for rank in self.ranks:
            rank.signal(signal.SIGTERM)
        return stuck

    def _collect_stacks(self, live: Sequence[tuple[int | None, int]]) -> dict[int | None, str]:
        """SIGUSR1 to every live rank (rank, pid): its faulthandler writes its stacks
        (``STACK_HOOK``); then what each wrote, once every file stopped growing (at most a
        few seconds)."""
        import glob

        for _, pid in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGUSR1)
        numbers = sorted({rank for rank, _ in live}, key=lambda r: -1 if r is None else r)

        def read() -> dict[int | None, str]:
            texts: dict[int | None, str] = {}
            for number in numbers:
                parts = []
                for path in sorted(glob.glob(os.path.join(self.stacks, f"rank-{number}.pid-*"))):
                    with contextlib.suppress(OSError), open(path, errors="replace") as f:
                        parts.append(f.read())
                texts[number] = "".join(parts)
            return texts

        deadline = time.monotonic() + STACKS_WAIT_SECONDS
        texts = read()
        while time.monotonic() < deadline:
            time.sleep(0.5)
            again = read()
            if again == texts and all(again.values()):
                break
            texts = again
        return texts

    def _wait(self, grace: int) -> Rank | None:
        """Wait for every rank; on the first failure stop the rest. Returns the failed Rank."""
        failed: Rank | None = None
        kill_at: float | None = None
        while True:
            if failed is None and self.stopping is None:
                self._watch_node_ranks()
                failed = self._check_stall()  # a stalled rank fails the node
                if failed is not None:
                    kill_at = time.monotonic() + grace
            codes = [(rank, rank.exit_code()) for rank in self.ranks]
            alive = sum(1 for _, code in codes if code is None)
            failing = [rank for rank, code in codes if code not in (None, 0)]
            if failing and failed is None and self.stopping is None:
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
            if alive == 0:
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
        for seen in self._node_ranks.values():
            if seen[1] is None and not _alive(seen[0]):
                seen[1] = time.time()

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
        if self.ranks and self.ranks[0].rank is None:  # launch: node (``_watch_node_ranks``)
            failed = set(map(int, _TORCHRUN_RANK.findall("".join(self.ranks[0].tail))))
            ended = [(r, seen[1]) for r, seen in self._node_ranks.items() if seen[1] is not None]
            ended = [(r, at) for r, at in ended if r not in failed]
            if failed:  # not after the first of those torchrun names as failed
                gone = [s[1] for r, s in self._node_ranks.items() if r in failed and s[1]]
                before = min([before, *gone]) if before is not None and gone else before
        found = [
            {"rank": r, "exitedAt": round(at, 6), "step": self.progress.step_of(r)}
            for r, at in sorted(ended, key=lambda item: item[1])
            if r is not None and (before is None or at < before)
        ]
        return found[:EARLY_EXITS_REPORTED] or None

    def _report(self, failed: Rank | None, node_rank: int, elapsed: float) -> int:
        path = self.env.get("TORCHYARD_TERMINATION_LOG", "/dev/termination-log")
        if failed is None and self.stopping is not None:
            stopped = {
                "nodeRank": node_rank,
                "reason": "Terminated",
                "signal": self.stopping,
                "exitCode": 128 + self.stopping,
                "message": "stopped by signal",
                # the node may have been stopped because another failed of losing these
                "earlyExits": self._early_exits(None),
                **self.checkpoint_info,
            }
            _write(path, termination_message({k: v for k, v in stopped.items() if v is not None}))
            return 128 + self.stopping
        if failed is None:
            _write(
                path,
                termination_message(
                    {
                        "nodeRank": node_rank,
                        "exitCode": 0,
                        "reason": "Completed",
                        "progress": self.progress.summary(),
                        "earlyExits": self._early_exits(None),
                        **self.checkpoint_info,
                    }
                ),
            )
            what = (
                f"all {len(self.ranks)} ranks" if self.ranks[0].rank is not None else "the command"
            )
            self.say(f"{what} of node {node_rank} succeeded in {elapsed:.1f}s")
            return 0
        code = failed.proc.returncode
        message = traceback_tail(failed.tail)
        rank = failed.rank
        if rank is None:  # launch: node; torchrun names the failing rank in its summary
            rank = torchrun_root_cause(failed.tail)
            # torch >= 2.2 prefixes an uncaught error's lines with its rank: that rank's
            # own traceback says more than torchrun's ChildFailedError after it
            prefix = f"[rank{rank}]: "
            own = [line[len(prefix) :] for line in failed.tail if line.startswith(prefix)]
            message = traceback_tail(own) if own else message
        exit_code = code if code >= 0 else 128 - code
        reason = "Error"
        if code == -signal.SIGKILL and self._oom_kills is not None:
            now = oom_kills(self.cgroup)
            if now is not None and now > self._oom_kills:
                reason, message = "OOMKilled", oom_message(failed.label, memory_limit(self.cgroup))
        if self.stall is not None and self.stall[0] is failed:
            reason, message = "Stalled", self.stall[1]["message"]
            rank = self.stall[1]["rank"]  # launch: node: the rank torchrun started
        info: dict[str, Any] = {
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
            # twice stops the retries (``status.classes``).
            "step": self.progress.step_of(rank if failed.rank is None else failed.rank),
            "progress": self.progress.summary(),
            "evidence": self.scanner.evidence or None,
            "logRule": self.scanner.hit,
            "earlyExits": self._early_exits(self._failed_at(failed)),
            # resumedFrom, checkpointStep, quarantined; reason NoProgress (and why) when
            # too many attempts failed before getting past their checkpoint.
            **self.checkpoint_info,
        }
        _write(path, termination_message({k: v for k, v in info.items() if v is not None}))
        return exit_code


def checkpoint_module(env: Mapping[str, str]) -> Any:
    """``torchyard.checkpoint`` (standard library only, shipped beside this file): from
    TORCHYARD_SHIPPED_PATH in a node Pod, else the installed package (local mode).
    Imported by name so that the launcher's own imports stay the standard library's."""
    import importlib

    shipped = env.get("TORCHYARD_SHIPPED_PATH", "")
    if shipped and shipped not in sys.path:
        sys.path.insert(0, shipped)
    try:
        return importlib.import_module("torchyard.checkpoint")
    except ImportError as err:
        raise LaunchError(
            f"TORCHYARD_CHECKPOINT_DIR is set but torchyard.checkpoint cannot be imported "
            f"({err}): run the launcher from the torchyard package folder"
        ) from None


def registry_context(env: Mapping[str, str]) -> ssl.SSLContext | None:
    """What verifies the registry service's certificate: the CA in TORCHYARD_REGISTRY_CA
    (PEM, which the operator passes to node Pods), else None (the system's CAs)."""
    pem = env.get("TORCHYARD_REGISTRY_CA", "")
    return ssl.create_default_context(cadata=pem) if pem.strip() else None


# The exit code of a node whose ranks succeeded but whose archive upload failed.
ARCHIVE_FAILED_EXIT = 3
# A registry that is still starting (a run submitted right after `helm install`) or
# restarting answers with a refused connection or a 5xx: retry for about a minute
# (0.5, 1, 2, 4, 8, 8, 8, 8, 8, 8 s), then fail with advice. TORCHYARD_ARCHIVE_ATTEMPTS
# sets another number of attempts.
ARCHIVE_ATTEMPTS = 11
ARCHIVE_BACKOFF_SECONDS = 0.5
ARCHIVE_BACKOFF_MAX = 8.0


class UploadError(OSError):
    """The registry service answered an upload with HTTP error ``status``."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text}" if text else f"HTTP {status}")
        self.status = status


def _relative_dir(dirpath: str, folder: str) -> str:
    rel = os.path.relpath(dirpath, folder).replace(os.sep, "/")
    return "" if rel == "." else rel + "/"


def _upload_retrying(
    url: str,
    path: str,
    token: str,
    context: ssl.SSLContext | None = None,
    attempts: int = ARCHIVE_ATTEMPTS,
) -> None:
    """:func:`upload_file`, again after a connection error or a 5xx (the service may be
    restarting); any other answer is final."""
    for attempt in range(1, attempts + 1):
        try:
            upload_file(url, path, token, context)
            return
        except UploadError as err:
            if err.status < 500 or attempt == attempts:
                raise
        except OSError:
            if attempt == attempts:
                raise
        time.sleep(min(ARCHIVE_BACKOFF_SECONDS * 2 ** (attempt - 1), ARCHIVE_BACKOFF_MAX))


def archive_advice(err: OSError, *, url: str, namespace: str, run: str) -> str:
    """What an upload error means and what to fix (for the termination message)."""
    if not isinstance(err, UploadError):
        return (
            f"the registry service at {url} is not reachable ({err}): check "
            "TORCHYARD_REGISTRY_URL, that the service runs, and that no NetworkPolicy "
            "blocks the node Pods"
        )
    if err.status == 401:
        fix = (
            "the registry did not accept the Pod's token (audience torchyard-registry): "
            "check that the registry service may create TokenReviews"
        )
    elif err.status == 403:
        fix = (
            f"the registry refused this Pod's ServiceAccount writing run {run} in namespace "
            f"{namespace}: set spec.serviceAccountName to the ServiceAccount the run may "
            "archive as, and grant that one create on modelversions in the namespace"
        )
    elif err.status == 413:
        fix = "a file is larger than the registry service accepts: write smaller outputs"
    elif err.status >= 500:
        fix = "the registry service kept failing (retried for about a minute): see its log"
    else:
        fix = "the registry service refused the upload"
    return f"{err}; {fix}"


def upload_file(url: str, path: str, token: str, context: ssl.SSLContext | None = None) -> None:
    """PUT one file in one pass: read in 4 MiB blocks, hashed while they are sent. The
    service answers with the sha256 it computed and keeps the file out of sight until a
    second request confirms that digest (``?commit=later``), so nothing is read twice.
    An https URL is verified with ``context`` (:func:`registry_context`)."""
    import hashlib
    import http.client
    import json
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    conn = (
        http.client.HTTPSConnection(parts.netloc, timeout=300, context=context)
        if parts.scheme == "https"
        else http.client.HTTPConnection(parts.netloc, timeout=300)
    )
    auth = {"Authorization": "Bearer " + token}

    def answer() -> dict[str, str]:
        resp = conn.getresponse()
        body = resp.read()
        if resp.status >= 300:
            raise UploadError(resp.status, body[:200].decode("utf-8", "replace").strip())
        return dict(json.loads(body or b"{}"))

    try:
        digest = hashlib.sha256()
        conn.putrequest("PUT", parts.path + "?commit=later")
        conn.putheader("Content-Length", str(os.path.getsize(path)))
        for key, value in auth.items():
            conn.putheader(key, value)
        conn.endheaders()

        # The kernel sends the file (sendfile) while a thread hashes it: two cores, one
        # pass each, and the digest is confirmed before the file becomes visible. The
        # hash reads into one reused buffer (no 4 MiB allocation faulted in per block).
        def hash_file() -> None:
            view = memoryview(bytearray(4 << 20))
            with open(path, "rb", buffering=0) as h:
                while True:
                    n = h.readinto(view)
                    if not n:
                        break
                    digest.update(view[:n])

        hasher = threading.Thread(target=hash_file, daemon=True)
        hasher.start()
        with open(path, "rb", buffering=0) as f:
            if conn.sock is None:
                raise OSError("not connected")
            if isinstance(conn.sock, ssl.SSLSocket):
                # No sendfile through TLS, and SSLSocket.sendfile's fallback sends 8 KiB
                # at a time: 1 MiB blocks (OpenSSL cuts them into records in C).
                block = memoryview(bytearray(1 << 20))
                while True:
                    n = f.readinto(block)
                    if not n:
                        break
                    conn.sock.sendall(block[:n])
            else:
                conn.sock.sendfile(f)
        hasher.join()
        sent = answer()
        if sent.get("sha256") != digest.hexdigest():
            raise OSError(
                f"sha256 mismatch: sent {digest.hexdigest()}, the service got {sent['sha256']}"
            )
        conn.request(
            "POST",
            parts.path + "?upload=" + urllib.parse.quote(sent["upload"]),
            headers=dict(auth, **{"X-Content-SHA256": digest.hexdigest(), "Content-Length": "0"}),
        )
        answer()
    finally:
        conn.close()


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as err:
        sys.stderr.write(f"[torchyard] cannot write the termination message to {path}: {err}\n")


SNAPSHOT = "source.tar.gz"
# What one source snapshot may hold once unpacked, as the registry service's snapshot limit
# (1 GiB) and ``torchyard.sdk.snapshots`` (which refuses a bigger folder before sending it).
SNAPSHOT_MAX_BYTES = 1 << 30
SNAPSHOT_MAX_FILES = 100000


def snapshot_limits(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(bytes, entries) one snapshot may unpack to: ``TORCHYARD_SNAPSHOT_MAX_BYTES`` and
    ``TORCHYARD_SNAPSHOT_MAX_FILES``, else the defaults above."""
    env = os.environ if env is None else env
    limits = []
    for name, default in (
        ("TORCHYARD_SNAPSHOT_MAX_BYTES", SNAPSHOT_MAX_BYTES),
        ("TORCHYARD_SNAPSHOT_MAX_FILES", SNAPSHOT_MAX_FILES),
    ):
        value = _int_env(env, name, default)
        if value < 1:
            raise LaunchError(f"{name} must be a positive integer, got {value}")
        limits.append(value)
    return limits[0], limits[1]


def _member_kind(member: Any) -> str:
    """What a tar member is, in words, when it is neither a file nor a folder."""
    if member.issym():
        return f"a symbolic link (to {member.linkname!r})"
    if member.islnk():
        return f"a hard link (to {member.linkname!r})"
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a FIFO"
    return f"an entry of tar type {member.type!r}"


def _snapshot_target(root: str, name: str) -> str:
    """Where member ``name`` goes under ``root``; LaunchError if it could land elsewhere."""
    if "\x00" in name:
        raise LaunchError(f"the snapshot has a name with a NUL byte: {name!r}")
    if name.startswith("/") or os.path.isabs(name):
        raise LaunchError(f"the snapshot has an absolute path: {name!r}")
    if ".." in name.split("/"):
        raise LaunchError(f"the snapshot has a path outside the folder ('..'): {name!r}")
    target = os.path.realpath(os.path.join(root, name))
    if not (target == root or target.startswith(root + os.sep)):
        raise LaunchError(f"the snapshot has a path outside the folder: {name!r}")
    return target


def extract_snapshot(
    archive: str,
    workdir: str,
    max_bytes: int | None = None,
    max_files: int | None = None,
) -> int:
    """Unpack a ``torchyard submit`` snapshot into ``workdir``; the number of files.

    Only regular files and folders, every path inside ``workdir``: absolute names, ``..``,
    NUL bytes, symbolic and hard links, devices and FIFOs are refused. The archive is read
    as a stream and stops at ``max_bytes`` unpacked bytes or ``max_files`` entries (by
    default :func:`snapshot_limits`), so a small archive that unpacks to a huge one (a
    "gzip bomb") costs neither the disk nor minutes. On any refusal LaunchError names the
    entry, and what was unpacked so far is removed again.
    """
    import tarfile
    import zlib

    default_bytes, default_files = snapshot_limits()
    max_bytes = default_bytes if max_bytes is None else max_bytes
    max_files = default_files if max_files is None else max_files
    os.makedirs(workdir, exist_ok=True)
    root = os.path.realpath(workdir)
    created: list[str] = []  # what this call made, to take back on failure
    count = entries = total = 0
    name = ""

    def mkdirs(path: str) -> None:
        missing = []
        while not os.path.isdir(path):
            missing.append(path)
            path = os.path.dirname(path)
        for folder in reversed(missing):
            os.mkdir(folder)
            created.append(folder)

    try:
        with tarfile.open(archive, "r|gz") as tar:
            for member in tar:
                name = member.name
                entries += 1
                if entries > max_files:
                    raise LaunchError(
                        f"the snapshot holds more than {max_files} entries (at {name!r}); "
                        "leave files out of the snapshot (.torchyardignore) or raise "
                        "TORCHYARD_SNAPSHOT_MAX_FILES"
                    )
                target = _snapshot_target(root, name)
                if member.isdir():
                    mkdirs(target)
                    continue
                if not member.isfile():
                    raise LaunchError(
                        f"the snapshot may hold only files and folders: {name!r} is "
                        + _member_kind(member)
                    )
                if target == root:
                    raise LaunchError(f"the snapshot has a file without a name: {name!r}")
                # A stream member is exactly as long as its header says: checked before
                # a byte of it is inflated.
                total += member.size
                if total > max_bytes:
                    raise LaunchError(
                        f"the snapshot unpacks to more than {max_bytes} bytes (at {name!r}, "
                        f"{member.size} bytes); leave large files out of the snapshot "
                        "(.torchyardignore) or raise TORCHYARD_SNAPSHOT_MAX_BYTES"
                    )
                mkdirs(os.path.dirname(target))
                source = tar.extractfile(member)
                if source is None:
                    raise LaunchError(f"cannot read {name!r} from the snapshot")
                existed = os.path.lexists(target)
                # O_NOFOLLOW: never write through a link that is already there.
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
                fd = os.open(target, flags, 0o600)
                if not existed:
                    created.append(target)
                with source, os.fdopen(fd, "wb") as out:
                    while True:
                        block = source.read(1 << 20)
                        if not block:
                            break
                        out.write(block)
                os.chmod(target, 0o755 if member.mode & 0o111 else 0o644)
                count += 1
    except BaseException as err:
        for path in reversed(created):
            with contextlib.suppress(OSError):
                if os.path.isdir(path) and not os.path.islink(path):
                    os.rmdir(path)
                else:
                    os.unlink(path)
        if isinstance(err, (tarfile.TarError, EOFError, zlib.error, OSError)):
            where = f" (at {name!r})" if name else ""
            raise LaunchError(f"cannot unpack the snapshot {archive}{where}: {err}") from None
        raise
    return count


def fetch_snapshot(
    url: str, sha256: str, workdir: str, token: str, context: ssl.SSLContext | None = None
) -> int:
    """Download a snapshot from the registry service (an https URL verified with
    ``context``), check its sha256, unpack it."""
    import hashlib
    import tempfile
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(suffix=".tar.gz") as tmp:
        try:
            with urllib.request.urlopen(request, timeout=300, context=context) as resp:
                for block in iter(lambda: resp.read(1 << 20), b""):
                    digest.update(block)
                    tmp.write(block)
        except OSError as err:
            raise LaunchError(f"cannot download the source snapshot {url}: {err}") from None
        tmp.flush()
        if digest.hexdigest() != sha256:
            raise LaunchError(
                f"the source snapshot's sha256 is {digest.hexdigest()}, expected {sha256}"
            )
        return extract_snapshot(tmp.name, workdir)


SOURCE_OPTIONS = ("--copy", "--fetch")


def prepare(args: Sequence[str], termination_log: str | None = None) -> int:
    """``--copy SRC DIR | --fetch SHA256 DIR``: the source, before the ranks start.

    With ``--copy`` the code of a ConfigMap volume SRC goes into the writable working
    folder DIR (unpacking a ``torchyard submit`` snapshot); with ``--fetch`` the snapshot
    SHA256 is downloaded from the registry service (TORCHYARD_REGISTRY_URL,
    TORCHYARD_NAMESPACE, TORCHYARD_REGISTRY_TOKEN_FILE and, over https,
    TORCHYARD_REGISTRY_CA), checked and unpacked into DIR. 0 when done, 1 when the source
    was refused or unreachable (said on stderr, and in ``termination_log`` as a
    LaunchError), 2 for other arguments.
    """
    import shutil

    rest = list(args)
    try:
        if rest[:1] == ["--copy"] and len(rest) == 3:
            src, workdir = rest[1], rest[2]
            os.makedirs(workdir, exist_ok=True)
            if os.path.isfile(os.path.join(src, SNAPSHOT)):
                count = extract_snapshot(os.path.join(src, SNAPSHOT), workdir)
                sys.stderr.write(f"[torchyard] unpacked the source snapshot: {count} files\n")
                return 0
            for entry in os.listdir(src):
                if entry.startswith(".."):  # a ConfigMap volume's own bookkeeping links
                    continue
                path = os.path.join(src, entry)
                target = os.path.join(workdir, entry)
                if os.path.isdir(path):
                    shutil.copytree(path, target, dirs_exist_ok=True)
                else:
                    shutil.copyfile(path, target)
        elif rest[:1] == ["--fetch"] and len(rest) == 3:
            sha256, workdir = rest[1], rest[2]
            env = os.environ
            with open(env.get("TORCHYARD_REGISTRY_TOKEN_FILE", "")) as f:
                token = f.read().strip()
            url = (
                f"{env['TORCHYARD_REGISTRY_URL'].rstrip('/')}/v1/namespaces/"
                f"{env.get('TORCHYARD_NAMESPACE', 'default')}/snapshots/{sha256}"
            )
            count = fetch_snapshot(url, sha256, workdir, token, registry_context(env))
            sys.stderr.write(f"[torchyard] fetched the source snapshot: {count} files\n")
        else:
            sys.stderr.write(f"[torchyard] error: unexpected arguments {rest}\n")
            return 2
    except (LaunchError, OSError, KeyError) as err:
        sys.stderr.write(f"[torchyard] error: {err}\n")
        if termination_log:
            _write(
                termination_log,
                termination_message(
                    {"reason": "LaunchError", "exitCode": 1, "message": f"the source: {err}"}
                ),
            )
        return 1
    return 0


# ---------------------------------------------------------------------------------------
# MPI runs (distribution.type: mpi; torchyard.planning.mpi sets the TORCHYARD_MPI_*
# variables). Node 0 runs mpirun with this file as OpenMPI's plm_rsh_agent (``--rsh``):
# no sshd. The launchers of nodes >= 1 listen on TORCHYARD_MPI_PORT and run what the
# agent asks for (OpenMPI's orted) after an HMAC-SHA256 challenge with the run's key
# (TORCHYARD_MPI_KEY_FILE, a read-only Secret file: never in the environment or a log).
# Wire: the worker sends "torchyard-mpi 1 <nonce>\n"; the client one JSON line
# {"request": {...}, "mac": hex(HMAC(key, nonce + "\n" + request as JSON))}; requests are
# {"run": "<shell command>"} (answered by frames: 1 byte o|e|x, 4 bytes length, data;
# x carries the exit status) and {"end": <mpirun's exit code>} (the worker ends).
# ---------------------------------------------------------------------------------------

MPI_PROTOCOL = b"torchyard-mpi 1"
# How long mpirun may take to stop every rank after it reported an MPI_Abort.
MPI_ABORT_GRACE_SECONDS = 20.0
# OpenMPI 4.1's show_help race: the abort report is lost ("Data unpack would read past
# end of buffer" / "had inadequate space"); mpirun then exits, or stays with every rank
# gone. Either way the job is ending, as after an MPI_Abort report.
_MPI_REPORT_LOST = re.compile(rb"ORTE_ERROR_LOG: .*/show_help\.c")
_MPI_TAG = re.compile(rb"^\[(\d+),(\d+)\]<(stdout|stderr)>:(.*)$", re.DOTALL)
# OpenMPI 4.1 tags every write of a rank, so one line may carry tags again inside, of the
# same rank ('    [1,3]<stderr>:raise ...', 'text[1,3]<stdout>:\n') or of another.
_MPI_ANY_TAG = re.compile(rb"\[\d+,(\d+)\]<(stdout|stderr)>:")


def mpi_segments(line: bytes) -> list[tuple[int, bytes, bytes]]:
    """(rank, stream, text) of each tagged write in one line of mpirun's --tag-output
    (which starts with a tag); the text keeps its newline if it has one."""
    tags = list(_MPI_ANY_TAG.finditer(line))
    return [
        (int(tag.group(1)), tag.group(2), line[tag.end() : nxt.start() if nxt else len(line)])
        for tag, nxt in zip(tags, [*tags[1:], None])
    ]


_MPI_FIRST = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]\s*\n\s*Exit code:\s*(\d+)")
# A rank that called MPI_Abort (``python -m mpi4py script.py`` does on an exception).
_MPI_ABORT = re.compile(
    r"MPI_ABORT was invoked on rank (\d+) in communicator \S+\s+with errorcode (\d+)"
)
_MPI_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)")


def mpi_key(env: Mapping[str, str]) -> bytes:
    path = env.get("TORCHYARD_MPI_KEY_FILE", "")
    try:
        with open(path, "rb") as f:
            key = f.read().strip()
    except OSError as err:
        raise LaunchError(
            f"no MPI key at {path!r} ({err.strerror}): MPI runs need the key Secret the "
            "operator creates for the run; run this through a TrainingRun"
        ) from None
    if not key:
        raise LaunchError(f"the MPI key file {path!r} is empty")
    return key


def mpi_mac(key: bytes, nonce: bytes, request: bytes) -> str:
    return hmac.new(key, nonce + b"\n" + request, hashlib.sha256).hexdigest()


def _frame(kind: bytes, data: bytes) -> bytes:
    return kind + struct.pack("!I", len(data)) + data


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("connection closed")
        data += chunk
    return data


def mpi_host(host: str, env: Mapping[str, str]) -> str:
    """mpirun shortens hostfile names to the Pod's hostname; add the Service back."""
    domain = env.get("TORCHYARD_MPI_DOMAIN", "")
    return f"{host}.{domain}" if domain and "." not in host else host


def mpi_request(
    host: str, port: int, key: bytes, request: Mapping[str, Any], timeout: float = 30
) -> socket.socket:
    """Connect to a worker launcher, answer its challenge and send ``request``."""
    conn = socket.create_connection((host, port), timeout=timeout)
    try:
        reader = conn.makefile("rb")
        hello = reader.readline(256).split()
        if len(hello) != 3 or b" ".join(hello[:2]) != MPI_PROTOCOL:
            raise ConnectionError(f"{host}:{port} is not a torchyard MPI launcher")
        body = json.dumps(dict(request), sort_keys=True).encode()
        line = json.dumps({"request": dict(request), "mac": mpi_mac(key, hello[2], body)})
        conn.sendall(line.encode() + b"\n")
        conn.settimeout(None)
        return conn
    except BaseException:
        conn.close()
        raise


def rsh_agent(args: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """``launcher.py --rsh HOST COMMAND...``: what mpirun calls instead of ssh. Streams the
    remote command's output here and exits with its status (255: not reached, as ssh)."""
    env = os.environ if env is None else env
    if len(args) < 2:
        sys.stderr.write("[torchyard] usage: launcher.py --rsh HOST COMMAND...\n")
        return 255
    host = mpi_host(args[0], env)
    try:
        port = _int_env(env, "TORCHYARD_MPI_PORT", None)
        conn = mpi_request(host, port, mpi_key(env), {"run": " ".join(args[1:])})
    except (LaunchError, OSError) as err:
        sys.stderr.write(f"[torchyard] MPI agent: cannot reach node {host}: {err}\n")
        return 255
    with conn:
        try:
            while True:
                kind, size = struct.unpack("!cI", _recv_exact(conn, 5))
                data = _recv_exact(conn, size)
                if kind == b"x":
                    return int(data.decode())
                sink = sys.stdout if kind == b"o" else sys.stderr
                sink.buffer.write(data)
                sink.flush()
        except (OSError, ValueError) as err:
            sys.stderr.write(f"[torchyard] MPI agent: lost node {host}: {err}\n")
            return 255


class MpiWorker:
    """The server of a node >= 1: runs the agent's commands until mpirun says it ended."""

    def __init__(self, env: Mapping[str, str], key: bytes, say: Callable[[str], None]) -> None:
        self.env = dict(env)
        self.key = key
        self.say = say
        self.server = socket.create_server(("", _int_env(env, "TORCHYARD_MPI_PORT", None)))
        self.done = threading.Event()
        self.ended: int | None = None
        self.procs: list[subprocess.Popen[bytes]] = []
        # When this node's orted ended (monotonic): node 0 says "end" a moment later with
        # mpirun's exit code; the launcher waits for it at most TORCHYARD_MPI_END_WAIT s.
        self.session_ended: float | None = None
        self.end_wait = _int_env(env, "TORCHYARD_MPI_END_WAIT", 30)

    @property
    def port(self) -> int:
        return int(self.server.getsockname()[1])

    def serve(self) -> None:
        """Accept connections (a thread each) until told to end."""
        self.server.settimeout(0.2)
        while not self.done.is_set():
            ended = self.session_ended
            if ended is not None and time.monotonic() > ended + self.end_wait:
                break  # node 0 never said: its Pod's status tells the operator
            try:
                conn, _ = self.server.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()
        self.server.close()

    def stop(self, signum: int) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signum)
        self.done.set()

    def _session(self, conn: socket.socket) -> None:
        with conn:
            try:
                request = self._authenticate(conn)
            except EOFError:
                return  # node 0 checking that this port accepts, before mpirun starts
            except (OSError, ValueError, KeyError) as err:
                self.say(f"MPI channel: refused a connection ({err})")
                return
            if "end" in request:
                self.ended = int(request["end"])
                self.done.set()
                return
            self._run(conn, str(request["run"]))

    def _authenticate(self, conn: socket.socket) -> dict[str, Any]:
        nonce = os.urandom(16).hex().encode()
        conn.settimeout(30)
        conn.sendall(MPI_PROTOCOL + b" " + nonce + b"\n")
        line = conn.makefile("rb").readline(1 << 20)
        if not line:
            raise EOFError("closed without a request")
        message = json.loads(line)
        request = message["request"]
        body = json.dumps(request, sort_keys=True).encode()
        if not hmac.compare_digest(str(message["mac"]), mpi_mac(self.key, nonce, body)):
            raise ValueError("wrong MPI key")
        conn.settimeout(None)
        return dict(request)

    def _run(self, conn: socket.socket, command: str) -> None:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.procs.append(proc)
        send = threading.Lock()

        def pump(pipe: IO[bytes], kind: bytes) -> None:
            for chunk in iter(lambda: pipe.read1(65536), b""):  # type: ignore[attr-defined]
                with send, contextlib.suppress(OSError):
                    conn.sendall(_frame(kind, chunk))

        def watch() -> None:  # the agent (mpirun) went away: its command goes too
            with contextlib.suppress(OSError):
                while conn.recv(1024):
                    pass
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)

        threads = [
            threading.Thread(target=pump, args=(proc.stdout, b"o"), daemon=True),
            threading.Thread(target=pump, args=(proc.stderr, b"e"), daemon=True),
        ]
        for t in threads:
            t.start()
        threading.Thread(target=watch, daemon=True).start()
        code = proc.wait()
        for t in threads:
            t.join(timeout=5)
        with send, contextlib.suppress(OSError):
            conn.sendall(_frame(b"x", str(code if code >= 0 else 128 - code).encode()))
        # mpirun starts one orted per node (no tree spawn): once it is gone, so is the job.
        self.session_ended = time.monotonic()


class MpiLauncher(Launcher):
    """Node 0 runs mpirun over every node; the others serve its agent (``MpiWorker``)."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        super().__init__(command, env)
        self.mpirun: subprocess.Popen[bytes] | None = None
        self.worker: MpiWorker | None = None
        self.rank_tails: dict[int, collections.deque[str]] = {}
        self.output: collections.deque[str] = collections.deque(maxlen=200)
        # The first rank whose stderr showed a Python traceback: named when mpirun's own
        # report of the failing rank is lost (OpenMPI 4.1's show_help can drop it with
        # "ORTE_ERROR_LOG: Data unpack would read past end of buffer" after an MPI_Abort).
        self.first_traceback: int | None = None
        self.aborted_at: float | None = None  # when mpirun reported an MPI_Abort (or lost it)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stopping is None:
            self.stopping = signum
            self.say(f"received signal {signum}: stopping MPI")
        if self.mpirun is not None and self.mpirun.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.mpirun.pid, signal.SIGTERM)
        if self.worker is not None:
            self.worker.stop(signal.SIGTERM)

    def _run(self) -> int:
        _, nproc, node_rank, logs = self._config()
        self.log_limit = log_limit(self.env)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        started = time.monotonic()
        # As for PyTorch runs: the checkpoint folder (resume variables for the ranks, node
        # 0 writes COMPLETE.json) and, on node 0, whose mpirun sees every rank's output,
        # the ranks' progress (``@@torchyard`` lines) for status.progress.
        self._start_checkpoints(node_rank)
        if node_rank == 0:
            self.progress = ProgressTracker(logs)
            interval = max(1, _int_env(self.env, "TORCHYARD_PROGRESS_INTERVAL", 5))
            threading.Thread(target=self._publish_progress, args=(interval,), daemon=True).start()
        code = self._serve(node_rank) if node_rank > 0 else self._mpirun(nproc, logs, started)
        if self.env.get("TORCHYARD_REGISTRY_URL"):
            problem = self.archive(node_rank, logs)
            if problem is not None and code == 0:
                code = self._archive_failed(problem, node_rank)
        return code

    def _serve(self, node_rank: int) -> int:
        self.worker = MpiWorker(self.env, mpi_key(self.env), self.say)
        self.say(f"node {node_rank}: waiting for mpirun on port {self.worker.port}")
        self.worker.serve()
        if self.checkpoints is not None:
            failed = self.stopping is not None or self.worker.ended not in (None, 0)
            self.checkpoint_info = self.checkpoints.stop(rank_failed=failed)
        path = self.env.get("TORCHYARD_TERMINATION_LOG", "/dev/termination-log")
        if self.stopping is not None:
            info = {"nodeRank": node_rank, "reason": "Terminated", "signal": self.stopping}
            info.update(self.checkpoint_info)
            _write(path, termination_message(dict(info, exitCode=128 + self.stopping)))
            return 128 + self.stopping
        # mpirun on node 0 reports a failing rank (with its node); this node only served.
        if self.worker.ended is not None:
            self.say(f"node {node_rank}: mpirun ended (exit code {self.worker.ended})")
        else:
            self.say(f"node {node_rank}: its orted ended; node 0 did not say how mpirun did")
        done = {"nodeRank": node_rank, "exitCode": 0, "reason": "Completed", **self.checkpoint_info}
        _write(path, termination_message(done))
        return 0

    def _workers(self) -> list[tuple[int, str]]:
        lines = self.env.get("TORCHYARD_MPI_HOSTFILE", "").splitlines()
        return [(i, line.split()[0]) for i, line in enumerate(lines) if i > 0 and line.split()]

    def _wait_for_workers(self, timeout: int) -> None:
        """Every worker's port accepts before mpirun starts (no race at start-up)."""
        port = _int_env(self.env, "TORCHYARD_MPI_PORT", None)
        deadline = time.monotonic() + timeout
        for node, host in self._workers():
            address = mpi_host(host, self.env)
            while True:
                try:
                    socket.create_connection((address, port), timeout=5).close()
                    break
                except OSError as err:
                    if time.monotonic() > deadline:
                        raise LaunchError(
                            f"MPI: node {node} ({address}:{port}) did not accept connections "
                            f"within {timeout}s ({err}): is its Pod running? see its logs "
                            "(kubectl logs) and events"
                        ) from None
                    time.sleep(0.5)

    def _mpirun(self, nproc: int, logs: str, started: float) -> int:
        mpirun = shutil.which("mpirun", path=self.env.get("PATH"))
        if mpirun is None:
            raise LaunchError(
                "distribution.type mpi needs OpenMPI's mpirun in the image (or, in local "
                "mode, on this machine): apt-get install openmpi-bin (python3-mpi4py for "
                "mpi4py scripts)"
            )
        agent = "TORCHYARD_MPI_PORT" in self.env
        if agent:
            self._wait_for_workers(_int_env(self.env, "TORCHYARD_DNS_TIMEOUT", 300))
        # mpirun writes orted's command for the shell it finds here (the agent's worker
        # runs it with /bin/sh); a Pod often has no SHELL, and then mpirun warns.
        self.env.setdefault("SHELL", "/bin/sh")
        try:
            args = [str(a) for a in json.loads(self.env.get("TORCHYARD_MPIRUN_ARGS", "[]"))]
        except ValueError:
            raise LaunchError("TORCHYARD_MPIRUN_ARGS must be a JSON list of strings") from None
        folder = tempfile.mkdtemp(prefix="torchyard-mpi-")  # for the hostfile; removed below
        try:
            return self._run_mpirun(mpirun, args, folder, nproc, logs, started)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _run_mpirun(
        self, mpirun: str, args: list[str], folder: str, nproc: int, logs: str, started: float
    ) -> int:
        agent = "TORCHYARD_MPI_PORT" in self.env
        hostfile = os.path.join(folder, "hostfile")
        _write(hostfile, self.env.get("TORCHYARD_MPI_HOSTFILE", f"localhost slots={nproc}\n"))
        command = [mpirun, "--hostfile", hostfile, *args]
        if agent:
            this = os.path.abspath(__file__)
            command += ["--mca", "plm_rsh_agent", f"{sys.executable} {this} --rsh"]
        if os.geteuid() == 0:  # the image's user may be root; mpirun refuses that unless told
            command.append("--allow-run-as-root")
        command += self.command
        self.say("starting " + " ".join(command[:1] + command[3:]))
        log = CappedLog(os.path.join(logs, "mpirun.txt"), self.log_limit)
        files: dict[int, CappedLog] = {}
        try:
            self.mpirun = subprocess.Popen(
                command,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as err:
            raise LaunchError(f"cannot start mpirun: {err.strerror}") from None
        pumps = [
            threading.Thread(target=self._pump, args=(pipe, log, files, logs), daemon=True)
            for pipe in (self.mpirun.stdout, self.mpirun.stderr)
        ]
        for t in pumps:
            t.start()
        code = self._wait_mpirun(self.mpirun)
        exited_at = time.time()
        for t in pumps:
            t.join(timeout=10)
        log.close()
        for f in files.values():
            f.close()
        if self.checkpoints is not None:
            self.checkpoint_info = self.checkpoints.stop(rank_failed=code != 0)
        self._progress_done()
        if agent:
            self._end_workers(code)
        return self._mpi_report(code, nproc, exited_at, time.monotonic() - started)

    def _wait_mpirun(self, mpirun: subprocess.Popen[bytes]) -> int:
        """mpirun's exit code. Once it reported an MPI_Abort, or lost that report
        (``_MPI_REPORT_LOST``; the job is to end), it gets MPI_ABORT_GRACE_SECONDS to stop
        the ranks and exit; OpenMPI 4.1 sometimes stays behind with every rank gone, and
        is then stopped (its process group)."""
        while True:
            try:
                return mpirun.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
            if (
                self.aborted_at is not None
                and time.monotonic() - self.aborted_at > MPI_ABORT_GRACE_SECONDS
            ):
                self.say(
                    f"mpirun still running {MPI_ABORT_GRACE_SECONDS:.0f}s after an MPI_Abort "
                    "(or the loss of its report): stopping it"
                )
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    with contextlib.suppress(OSError):
                        os.killpg(mpirun.pid, sig)
                    try:
                        mpirun.wait(timeout=5)
                        break
                    except subprocess.TimeoutExpired:
                        continue
                code = mpirun.returncode
                return code if code is not None and code > 0 else 1

    def _pump(
        self, pipe: IO[bytes], log: CappedLog, files: dict[int, CappedLog], logs: str
    ) -> None:
        """mpirun's output: tagged lines go to logs/rank-<r>.txt (and keep a tail per rank).
        OpenMPI tags every write, so one line of mpirun's may hold the writes of several
        ranks ('[1,0]<stdout>:text[1,1]<stdout>:other' when two ranks print their text and
        newline apart): each rank's text is put back together per rank and stream
        (``mpi_segments``) and shown when its own newline comes."""
        partial: dict[tuple[int, bytes], bytes] = {}
        for line in iter(lambda: pipe.readline(65536), b""):
            with self._lock:
                log.write(line)
                if _MPI_TAG.match(line) is None:
                    self.output.append(line.decode("utf-8", "replace"))
                    ending = b"MPI_ABORT was invoked" in line or _MPI_REPORT_LOST.search(line)
                    if self.aborted_at is None and ending:
                        self.aborted_at = time.monotonic()
                    self._show(self.err, b"[mpirun] " + line, None)
                    continue
                for rank, stream, text in mpi_segments(line):
                    text = partial.pop((rank, stream), b"") + text
                    *whole, rest = text.split(b"\n")
                    if rest:
                        partial[(rank, stream)] = rest
                    for piece in whole:
                        self._rank_line(rank, stream, piece + b"\n", files, logs)
        for (rank, stream), rest in partial.items():  # a last line without its newline
            with self._lock:
                self._rank_line(rank, stream, rest + b"\n", files, logs)
        pipe.close()

    def _rank_line(
        self, rank: int, stream: bytes, text: bytes, files: dict[int, CappedLog], logs: str
    ) -> None:
        """One whole line of one rank: its log file, its tail, progress, the console."""
        if rank not in files:
            files[rank] = CappedLog(os.path.join(logs, f"rank-{rank}.txt"), self.log_limit)
        files[rank].write(text)
        tail = self.rank_tails.setdefault(rank, collections.deque(maxlen=TAIL_LINES))
        if stream == b"stdout" and text.startswith(PROGRESS_PREFIX):
            record = parse_progress(text.rstrip(b"\r\n"))
            if record is not None:
                self.progress.record(rank, record)
        if stream == b"stderr":
            tail.append(text.decode("utf-8", "replace"))
            if self.first_traceback is None and text.startswith(b"Traceback ("):
                self.first_traceback = rank
        label = f"rank {rank}"
        sink = self.out if stream == b"stdout" else self.err
        self._show(sink, f"[{label}] ".encode() + text, label)

    def _show(self, sink: IO[str], shown: bytes, label: str | None) -> None:
        """To the node's output (``label`` None: never dropped, see Echo)."""
        self.echo.put(sink, shown if shown.endswith(b"\n") else shown + b"\n", label)

    def _end_workers(self, code: int) -> None:
        """Tell every worker launcher that mpirun ended, so that its node ends with it."""
        key = mpi_key(self.env)
        port = _int_env(self.env, "TORCHYARD_MPI_PORT", None)
        for _, host in self._workers():
            # OSError: it ended already (its orted's connection closed).
            with contextlib.suppress(OSError):
                mpi_request(mpi_host(host, self.env), port, key, {"end": code}, timeout=10).close()

    def _mpi_report(self, code: int, nproc: int, exited_at: float, elapsed: float) -> int:
        path = self.env.get("TORCHYARD_TERMINATION_LOG", "/dev/termination-log")
        # (the progress summary and checkpoint_info as in Launcher._report)
        summary = {"progress": self.progress.summary(), **self.checkpoint_info}
        summary = {k: v for k, v in summary.items() if v is not None}
        if code == 0:
            done = {"nodeRank": 0, "exitCode": 0, "reason": "Completed", **summary}
            _write(path, termination_message(done))
            self.say(f"mpirun: all ranks succeeded in {elapsed:.1f}s")
            return 0
        if self.stopping is not None:
            stopped = {"nodeRank": 0, "reason": "Terminated", "signal": self.stopping, **summary}
            _write(path, termination_message(dict(stopped, exitCode=128 + self.stopping)))
            return 128 + self.stopping
        text = "".join(self.output)
        rank: int | None = None
        exit_code, sig = (code if code > 0 else 128 - code), None
        first = _MPI_FIRST.search(text) or _MPI_ABORT.search(text)
        killed = _MPI_SIGNAL.search(text)
        if first is not None:
            rank, exit_code = int(first.group(1)), int(first.group(2))
        elif killed is not None:
            rank, sig = int(killed.group(1)), int(killed.group(2))
            exit_code = 128 + sig
        elif self.first_traceback is not None:
            rank = self.first_traceback
        if rank is not None:
            message = traceback_tail(list(self.rank_tails.get(rank, ())))
        else:
            message = traceback_tail(list(self.output))
        info: dict[str, Any] = {
            "rank": rank,
            "nodeRank": 0,
            # map-by slot: rank r runs on node r // processCountPerNode (planning/mpi.py).
            "rankNode": rank // nproc if rank is not None else None,
            "exitCode": exit_code,
            "signal": sig,
            "reason": "Error",
            "message": message,
            "exitedAt": round(exited_at, 6),
            "step": self.progress.step_of(rank) if rank is not None else None,
            **summary,
        }
        who = f"rank {rank}" if rank is not None else "mpirun"
        self.say(f"{who} failed (exit code {exit_code})")
        _write(path, termination_message({k: v for k, v in info.items() if v is not None}))
        return exit_code


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        sys.stdout.write(__doc__ or "")
        return 0
    if args and args[0] in SOURCE_OPTIONS:
        if args[3:4] != ["--"]:
            sys.stderr.write(
                "[torchyard] error: usage: launcher.py [--copy SRC DIR | --fetch SHA256 DIR]"
                " -- <command> [args...]\n"
            )
            return 2
        code = prepare(
            args[:3], os.environ.get("TORCHYARD_TERMINATION_LOG", "/dev/termination-log")
        )
        if code:
            return code
        args = args[3:]
    if args and args[0] == "--rsh":
        return rsh_agent(args[1:])
    if args and args[0] == "--":
        args = args[1:]
    try:
        if os.environ.get("TORCHYARD_DISTRIBUTION") == "mpi":
            return MpiLauncher(args).run()
        return Launcher(args).run()
    except LaunchError as err:
        sys.stderr.write(f"[torchyard] error: {err}\n")
        _write(
            os.environ.get("TORCHYARD_TERMINATION_LOG", "/dev/termination-log"),
            termination_message({"reason": "LaunchError", "exitCode": 2, "message": str(err)}),
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
