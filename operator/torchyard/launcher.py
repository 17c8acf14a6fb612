"""The torchyard launcher: starts the ranks of one node and reports exactly which failed.

Standard library only, Python >= 3.8, one file: an init container copies this file into
any training image and the node Pod runs ``python launcher.py -- <command...>``
(or ``python -m torchyard.launcher -- <command...>`` where torchyard is installed).
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
                               what ``--install`` may unpack (default 1 GiB, 100000 entries)
    TORCHYARD_CGROUP_ROOT      where the container's cgroups are mounted (default
                               /sys/fs/cgroup): the OOM killer's count and the memory limit

and then:
- waits until MASTER_ADDR resolves (headless-Service DNS appears a moment after the Pod);
- ``launch: process`` starts TORCHYARD_NPROC_PER_NODE children with RANK, LOCAL_RANK,
  ...; ``launch: node`` starts the command once (e.g. ``torchrun``, which reads PET_*);
- tees every line of every rank to ``logs/rank-<r>.txt`` and to its own output with a
  ``[rank r]`` prefix, line by line;
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
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

TERMINATION_MESSAGE_LIMIT = 4096
TAIL_LINES = 60
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


def wait_for_dns(host: str, timeout: int, out: IO[str] = sys.stderr) -> None:
    """Block until ``host`` resolves; LaunchError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay, said = 0.1, False
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
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


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


class Rank:
    """One child process and the threads that tee its output."""

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
        lock: threading.Lock,
    ) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.label = label
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        name = f"rank-{rank}.txt" if rank is not None else label.replace(" ", "-") + ".txt"
        self.log = open(os.path.join(log_dir, name), "ab")  # noqa: SIM115
        self._lock = lock
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
        prefix = (f"[{self.label}] ").encode()
        sink_buffer = getattr(sink, "buffer", None)
        for line in iter(lambda: pipe.readline(65536), b""):
            shown = prefix + (line if line.endswith(b"\n") else line + b"\n")
            with self._lock:
                self.log.write(line)
                self.log.flush()
                if sink_buffer is not None:
                    sink_buffer.write(shown)
                else:
                    sink.write(shown.decode("utf-8", "replace"))
                sink.flush()
            if keep_tail:
                self.tail.append(line.decode("utf-8", "replace"))
        pipe.close()

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signum)

    def finish(self) -> None:
        for t in self.threads:
            t.join(timeout=5)
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
        self.cgroup = self.env.get("TORCHYARD_CGROUP_ROOT") or "/sys/fs/cgroup"
        self._oom_kills = oom_kills(self.cgroup)  # before any rank ran

    def say(self, text: str) -> None:
        with self._lock:
            self.err.write(f"[torchyard] {text}\n")
            self.err.flush()

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
        for name, default in (("TORCHYARD_LOGS", "logs"), ("TORCHYARD_OUTPUTS", "outputs")):
            env[name] = writable_folder(name, env.get(name) or os.path.abspath(default), self.say)
        return launch, nproc, node_rank, env["TORCHYARD_LOGS"]

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stopping is None:
            self.stopping = signum
            self.say(f"received signal {signum}: stopping the ranks")
        for rank in self.ranks:
            rank.signal(signal.SIGTERM)

    def run(self) -> int:
        launch, nproc, node_rank, logs = self._config()
        if self.env.get("MASTER_ADDR"):
            wait_for_dns(
                self.env["MASTER_ADDR"], _int_env(self.env, "TORCHYARD_DNS_TIMEOUT", 300), self.err
            )
        grace = _int_env(self.env, "TORCHYARD_GRACE_PERIOD", 10)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        started = time.monotonic()
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
                            self._lock,
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
                        self._lock,
                    )
                )
        except LaunchError:
            for started_rank in self.ranks:
                started_rank.signal(signal.SIGKILL)
                started_rank.proc.wait()
                started_rank.finish()
            raise
        failed = self._wait(grace)
        for rank in self.ranks:
            rank.finish()
        code = self._report(failed, node_rank, time.monotonic() - started)
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
        sent, failed = 0, []
        first: OSError | None = None
        for path, target in files:
            try:
                _upload_retrying(f"{base}/{target}", path, token, context)
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

    def _wait(self, grace: int) -> Rank | None:
        """Wait for every rank; on the first failure stop the rest. Returns the failed Rank."""
        failed: Rank | None = None
        kill_at: float | None = None
        while True:
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
            if self.stopping is not None and kill_at is None:
                kill_at = time.monotonic() + grace
            if kill_at is not None and time.monotonic() >= kill_at:
                for rank in self.ranks:
                    rank.signal(signal.SIGKILL)
                kill_at = float("inf")
            time.sleep(0.05)

    def _report(self, failed: Rank | None, node_rank: int, elapsed: float) -> int:
        path = self.env.get("TORCHYARD_TERMINATION_LOG", "/dev/termination-log")
        if failed is None and self.stopping is not None:
            stopped = {
                "nodeRank": node_rank,
                "reason": "Terminated",
                "signal": self.stopping,
                "exitCode": 128 + self.stopping,
                "message": "stopped by signal",
            }
            _write(path, termination_message(stopped))
            return 128 + self.stopping
        if failed is None:
            _write(
                path,
                termination_message({"nodeRank": node_rank, "exitCode": 0, "reason": "Completed"}),
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
            found = _TORCHRUN_RANK.findall("".join(failed.tail))
            rank = int(found[0]) if found else None
        exit_code = code if code >= 0 else 128 - code
        reason = "Error"
        if code == -signal.SIGKILL and self._oom_kills is not None:
            now = oom_kills(self.cgroup)
            if now is not None and now > self._oom_kills:
                reason, message = "OOMKilled", oom_message(failed.label, memory_limit(self.cgroup))
        info: dict[str, Any] = {
            "rank": rank,
            "localRank": failed.local_rank,
            "nodeRank": node_rank,
            "exitCode": exit_code,
            "signal": -code if code < 0 else None,
            "reason": reason,
            "message": message,
            # Unix time the rank exited: the operator names the rank that failed first
            # when peers on other nodes fail a moment later because they lost it.
            "exitedAt": round(failed.exited_at, 6) if failed.exited_at is not None else None,
        }
        _write(path, termination_message({k: v for k, v in info.items() if v is not None}))
        return exit_code


def registry_context(env: Mapping[str, str]) -> ssl.SSLContext | None:
    """What verifies the registry service's certificate: the CA in TORCHYARD_REGISTRY_CA
    (PEM, which the operator passes to node Pods), else None (the system's CAs)."""
    pem = env.get("TORCHYARD_REGISTRY_CA", "")
    return ssl.create_default_context(cadata=pem) if pem.strip() else None


# The exit code of a node whose ranks succeeded but whose archive upload failed.
ARCHIVE_FAILED_EXIT = 3
ARCHIVE_ATTEMPTS = 3


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
        time.sleep(0.5 * attempt)


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
        fix = f"the registry service failed {ARCHIVE_ATTEMPTS} times: see its log"
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
        # pass each, and the digest is confirmed before the file becomes visible.
        def hash_file() -> None:
            with open(path, "rb") as h:
                for block in iter(lambda: h.read(4 << 20), b""):
                    digest.update(block)

        hasher = threading.Thread(target=hash_file, daemon=True)
        hasher.start()
        with open(path, "rb") as f:
            if conn.sock is None:
                raise OSError("not connected")
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


def install(args: Sequence[str]) -> int:
    """``--install DEST [--copy SRC DIR | --fetch SHA256 DIR]``: the init container.

    Copies this very file to DEST (a volume the training container mounts), and with
    ``--copy`` the code of a ConfigMap volume SRC into the writable working folder DIR
    (unpacking a ``torchyard submit`` snapshot); with ``--fetch`` downloads the snapshot
    SHA256 from the registry service (TORCHYARD_REGISTRY_URL, TORCHYARD_NAMESPACE,
    TORCHYARD_REGISTRY_TOKEN_FILE and, over https, TORCHYARD_REGISTRY_CA) and unpacks it
    into DIR.
    """
    import shutil

    if not args:
        sys.stderr.write("[torchyard] error: --install needs a destination path\n")
        return 2
    dest = args[0]
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    shutil.copyfile(os.path.abspath(__file__), dest)
    rest = list(args[1:])
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
        elif rest:
            sys.stderr.write(f"[torchyard] error: unexpected arguments {rest}\n")
            return 2
    except (LaunchError, OSError, KeyError) as err:
        sys.stderr.write(f"[torchyard] error: {err}\n")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        sys.stdout.write(__doc__ or "")
        return 0
    if args and args[0] == "--install":
        return install(args[1:])
    if args and args[0] == "--":
        args = args[1:]
    try:
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
