"""The torchyard launcher: starts the ranks of one node and reports exactly which failed.

Standard library only, Python >= 3.8, one file: an init container copies this file into
any training image and the node Pod runs ``python launcher.py -- <command...>``
(or ``python -m torchyard.launcher -- <command...>`` where torchyard is installed).
Local mode runs the very same file once per node.

It reads its configuration from variables that ``torchyard.planning`` sets:

    TORCHYARD_LAUNCH           process | node
    TORCHYARD_NPROC_PER_NODE   processes on this node
    NODE_RANK, MASTER_ADDR, MASTER_PORT, WORLD_SIZE, ...   the rank contract
    TORCHYARD_LOGS             folder for logs/rank-<r>.txt (default ./logs)
    TORCHYARD_OUTPUTS          folder the ranks write their outputs to (default ./outputs)
    TORCHYARD_TERMINATION_LOG  JSON termination message (default /dev/termination-log)
    TORCHYARD_DNS_TIMEOUT      seconds to wait for MASTER_ADDR to resolve (default 300)
    TORCHYARD_GRACE_PERIOD     seconds between SIGTERM and SIGKILL of the others (default 10)

and then:
- waits until MASTER_ADDR resolves (headless-Service DNS appears a moment after the Pod);
- ``launch: process`` starts TORCHYARD_NPROC_PER_NODE children with RANK, LOCAL_RANK,
  ...; ``launch: node`` starts the command once (e.g. ``torchrun``, which reads PET_*);
- tees every line of every rank to ``logs/rank-<r>.txt`` and to its own output with a
  ``[rank r]`` prefix, line by line;
- fails fast: the first rank to exit non-zero decides; the others get SIGTERM, then
  SIGKILL after the grace period; the launcher exits with that rank's code;
- forwards SIGTERM/SIGINT to the ranks;
- writes a JSON termination message (at most 4 KiB): rank, exit code or signal, and the
  tail of that rank's traceback.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
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
        self.threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, out, False), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, err, True), daemon=True),
        ]
        for t in self.threads:
            t.start()

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
        logs = env.setdefault("TORCHYARD_LOGS", os.path.abspath("logs"))
        outputs = env.setdefault("TORCHYARD_OUTPUTS", os.path.abspath("outputs"))
        for folder in (logs, outputs):
            os.makedirs(folder, exist_ok=True)
        return launch, nproc, node_rank, logs

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
            self.archive(node_rank, logs)
        return code

    def archive(self, node_rank: int, logs: str) -> None:
        """Upload this node's logs (and node 0's outputs) to the registry service.

        Runs whether the ranks succeeded or not; a failed upload is reported, and the
        launcher still exits with the command's exit code.
        """
        url = self.env["TORCHYARD_REGISTRY_URL"].rstrip("/")
        base = (
            f"{url}/v1/namespaces/{self.env.get('TORCHYARD_NAMESPACE', 'default')}"
            f"/runs/{self.env.get('TORCHYARD_RUN', 'run')}"
        )
        try:
            with open(self.env.get("TORCHYARD_REGISTRY_TOKEN_FILE", "")) as f:
                token = f.read().strip()
        except OSError as err:
            self.say(f"cannot archive: no registry token ({err})")
            return
        folders = [(logs, f"logs/node-{node_rank}")]
        if node_rank == 0:
            folders.append((self.env["TORCHYARD_OUTPUTS"], "outputs"))
        sent, failed = 0, []
        for folder, prefix in folders:
            for dirpath, _, files in os.walk(folder):
                for name in sorted(files):
                    path = os.path.join(dirpath, name)
                    rel = os.path.relpath(path, folder).replace(os.sep, "/")
                    try:
                        upload_file(f"{base}/{prefix}/{rel}", path, token)
                        sent += 1
                    except OSError as err:
                        failed.append(f"{prefix}/{rel}: {err}")
        self.say(
            f"archived {sent} file(s) to the registry"
            + (f"; {len(failed)} failed: {failed[0]}" if failed else "")
        )

    def _wait(self, grace: int) -> Rank | None:
        """Wait for every rank; on the first failure stop the rest. Returns the failed Rank."""
        failed: Rank | None = None
        kill_at: float | None = None
        while True:
            alive = 0
            for rank in self.ranks:
                code = rank.proc.poll()
                if code is None:
                    alive += 1
                elif code != 0 and failed is None and self.stopping is None:
                    failed = rank
                    self.say(
                        f"{rank.label} exited with {_describe(code)}: stopping the other ranks"
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
        info: dict[str, Any] = {
            "rank": rank,
            "localRank": failed.local_rank,
            "nodeRank": node_rank,
            "exitCode": exit_code,
            "signal": -code if code < 0 else None,
            "reason": "Error",
            "message": message,
        }
        _write(path, termination_message({k: v for k, v in info.items() if v is not None}))
        return exit_code


def upload_file(url: str, path: str, token: str) -> None:
    """PUT one file in one pass: read in 4 MiB blocks, hashed while they are sent. The
    service answers with the sha256 it computed and keeps the file out of sight until a
    second request confirms that digest (``?commit=later``), so nothing is read twice."""
    import hashlib
    import http.client
    import json
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.netloc, timeout=300)
    auth = {"Authorization": "Bearer " + token}

    def answer() -> dict[str, str]:
        resp = conn.getresponse()
        body = resp.read()
        if resp.status >= 300:
            raise OSError(f"{resp.status} {body[:200].decode('utf-8', 'replace')}")
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


def extract_snapshot(archive: str, workdir: str) -> int:
    """Unpack a ``torchyard submit`` snapshot: regular files and folders only, every path
    inside ``workdir`` (no absolute paths, no ``..``, no links). The number of files."""
    import tarfile

    root = os.path.realpath(workdir)
    count = 0
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            target = os.path.realpath(os.path.join(root, member.name))
            if not (target == root or target.startswith(root + os.sep)):
                raise LaunchError(f"the snapshot has a path outside the folder: {member.name}")
            if member.isdir():
                os.makedirs(target, exist_ok=True)
            elif member.isfile():
                os.makedirs(os.path.dirname(target), exist_ok=True)
                source = tar.extractfile(member)
                if source is None:
                    continue
                with source, open(target, "wb") as out:
                    while True:
                        block = source.read(1 << 20)
                        if not block:
                            break
                        out.write(block)
                os.chmod(target, 0o755 if member.mode & 0o111 else 0o644)
                count += 1
            else:
                raise LaunchError(f"the snapshot may hold only files and folders: {member.name}")
    return count


def fetch_snapshot(url: str, sha256: str, workdir: str, token: str) -> int:
    """Download a snapshot from the registry service, check its sha256, unpack it."""
    import hashlib
    import tempfile
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(suffix=".tar.gz") as tmp:
        try:
            with urllib.request.urlopen(request, timeout=300) as resp:
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
    SHA256 from the registry service (TORCHYARD_REGISTRY_URL, TORCHYARD_NAMESPACE and
    TORCHYARD_REGISTRY_TOKEN_FILE) and unpacks it into DIR.
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
            count = fetch_snapshot(url, sha256, workdir, token)
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
