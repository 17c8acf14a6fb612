"""MPI runs (``distribution.type: mpi``; ``torchyard.distributions.mpi`` sets the TORCHYARD_MPI_*
variables): node 0's launcher runs ``mpirun`` (:class:`MpiLauncher`) with the launcher
itself as OpenMPI's ``plm_rsh_agent`` (``main.py --rsh``, :func:`rsh_agent`): no sshd.
The launchers of nodes >= 1 serve that agent (:class:`MpiWorker`).

Standard library only, Python >= 3.8; shipped with the launcher. Tested in
tests/unit/launcher/test_mpi.py, with OpenMPI in tests/e2e/test_local_mpi.py.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from torchyard.launch.contract import (
    PROGRESS_PREFIX,
    TAIL_LINES,
    TERMINATION_LOG,
    TORCHYARD_DNS_TIMEOUT,
    TORCHYARD_MPI_DOMAIN,
    TORCHYARD_MPI_END_WAIT,
    TORCHYARD_MPI_HOSTFILE,
    TORCHYARD_MPI_KEY_FILE,
    TORCHYARD_MPI_PORT,
    TORCHYARD_MPIRUN_ARGS,
    TORCHYARD_TERMINATION_LOG,
    LaunchError,
    int_env,
    parse_progress,
    termination_message,
    traceback_tail,
    write_termination,
)
from torchyard.launch.node_files import archive_node
from torchyard.launch.node_launcher import Launcher
from torchyard.launch.output import CappedLog, log_limit

# The file mpirun runs as its agent: the launcher, beside this module.
LAUNCHER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "main.py")


# ---------------------------------------------------------------------------------------
# The launchers of nodes >= 1 listen on TORCHYARD_MPI_PORT and run what the
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


def _spawn(command: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """``command`` in a session of its own (its process group is signalled as one), no
    standard input, its output and errors piped."""
    return subprocess.Popen(
        list(command),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def mpi_key(env: Mapping[str, str]) -> bytes:
    path = env.get(TORCHYARD_MPI_KEY_FILE, "")
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
    domain = env.get(TORCHYARD_MPI_DOMAIN, "")
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
    """``main.py --rsh HOST COMMAND...``: what mpirun calls instead of ssh. Streams the
    remote command's output here and exits with its status (255: not reached, as ssh)."""
    env = os.environ if env is None else env
    if len(args) < 2:
        sys.stderr.write("[torchyard] usage: main.py --rsh HOST COMMAND...\n")
        return 255
    host = mpi_host(args[0], env)
    try:
        port = int_env(env, TORCHYARD_MPI_PORT, None)
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
        self.server = socket.create_server(("", int_env(env, TORCHYARD_MPI_PORT, None)))
        self.done = threading.Event()
        self.ended: int | None = None
        self.procs: list[subprocess.Popen[bytes]] = []
        # When this node's orted ended (monotonic): node 0 says "end" a moment later with
        # mpirun's exit code; the launcher waits for it at most TORCHYARD_MPI_END_WAIT s.
        self.session_ended: float | None = None
        self.end_wait = int_env(env, TORCHYARD_MPI_END_WAIT, 30)

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
            except socket.timeout:  # an alias of TimeoutError from Python 3.10 only
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
        try:
            conn.sendall(MPI_PROTOCOL + b" " + nonce + b"\n")
            line = conn.makefile("rb").readline(1 << 20)
        except (BrokenPipeError, ConnectionResetError):
            line = b""  # closed before our greeting reached it: a check that we listen
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
        proc = _spawn(["/bin/sh", "-c", command], self.env)
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
        self._handle_signals()
        started = time.monotonic()
        # As for PyTorch runs: the checkpoint folder (resume variables for the ranks, node
        # 0 writes COMPLETE.json) and, on node 0, whose mpirun sees every rank's output,
        # the ranks' progress (``@@torchyard`` lines) for status.progress.
        self._start_checkpoints(node_rank)
        if node_rank == 0:
            self._start_publisher(logs)
        code = self._serve(node_rank) if node_rank > 0 else self._mpirun(nproc, logs, started)
        return archive_node(self.env, node_rank, logs, code, self.say)

    def _serve(self, node_rank: int) -> int:
        self.worker = MpiWorker(self.env, mpi_key(self.env), self.say)
        self.say(f"node {node_rank}: waiting for mpirun on port {self.worker.port}")
        self.worker.serve()
        if self.checkpoints is not None:
            failed = self.stopping is not None or self.worker.ended not in (None, 0)
            self.checkpoint_info = self.checkpoints.stop(rank_failed=failed)
        path = self.env.get(TORCHYARD_TERMINATION_LOG, TERMINATION_LOG)
        if self.stopping is not None:
            info = {"nodeRank": node_rank, "reason": "Terminated", "signal": self.stopping}
            info.update(self.checkpoint_info)
            write_termination(path, termination_message(dict(info, exitCode=128 + self.stopping)))
            return 128 + self.stopping
        # mpirun on node 0 reports a failing rank (with its node); this node only served.
        if self.worker.ended is not None:
            self.say(f"node {node_rank}: mpirun ended (exit code {self.worker.ended})")
        else:
            self.say(f"node {node_rank}: its orted ended; node 0 did not say how mpirun did")
        done = {"nodeRank": node_rank, "exitCode": 0, "reason": "Completed", **self.checkpoint_info}
        write_termination(path, termination_message(done))
        return 0

    def _workers(self) -> list[tuple[int, str]]:
        lines = self.env.get(TORCHYARD_MPI_HOSTFILE, "").splitlines()
        return [(i, line.split()[0]) for i, line in enumerate(lines) if i > 0 and line.split()]

    def _wait_for_workers(self, timeout: int) -> None:
        """Every worker's port accepts before mpirun starts (no race at start-up)."""
        port = int_env(self.env, TORCHYARD_MPI_PORT, None)
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
        agent = TORCHYARD_MPI_PORT in self.env
        if agent:
            self._wait_for_workers(int_env(self.env, TORCHYARD_DNS_TIMEOUT, 300))
        # mpirun writes orted's command for the shell it finds here (the agent's worker
        # runs it with /bin/sh); a Pod often has no SHELL, and then mpirun warns.
        self.env.setdefault("SHELL", "/bin/sh")
        try:
            args = [str(a) for a in json.loads(self.env.get(TORCHYARD_MPIRUN_ARGS, "[]"))]
        except ValueError:
            raise LaunchError(f"{TORCHYARD_MPIRUN_ARGS} must be a JSON list of strings") from None
        folder = tempfile.mkdtemp(prefix="torchyard-mpi-")  # for the hostfile; removed below
        try:
            return self._run_mpirun(mpirun, args, folder, nproc, logs, started)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _run_mpirun(
        self, mpirun: str, args: list[str], folder: str, nproc: int, logs: str, started: float
    ) -> int:
        agent = TORCHYARD_MPI_PORT in self.env
        hostfile = os.path.join(folder, "hostfile")
        write_termination(
            hostfile, self.env.get(TORCHYARD_MPI_HOSTFILE, f"localhost slots={nproc}\n")
        )
        command = [mpirun, "--hostfile", hostfile, *args]
        if agent:
            command += ["--mca", "plm_rsh_agent", f"{sys.executable} {LAUNCHER_FILE} --rsh"]
        if os.geteuid() == 0:  # the image's user may be root; mpirun refuses that unless told
            command.append("--allow-run-as-root")
        command += self.command
        self.say("starting " + " ".join(command[:1] + command[3:]))
        log = CappedLog(os.path.join(logs, "mpirun.txt"), self.log_limit)
        files: dict[int, CappedLog] = {}
        try:
            self.mpirun = _spawn(command, self.env)
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
        port = int_env(self.env, TORCHYARD_MPI_PORT, None)
        for _, host in self._workers():
            # OSError: it ended already (its orted's connection closed).
            with contextlib.suppress(OSError):
                mpi_request(mpi_host(host, self.env), port, key, {"end": code}, timeout=10).close()

    def _mpi_report(self, code: int, nproc: int, exited_at: float, elapsed: float) -> int:
        path = self.env.get(TORCHYARD_TERMINATION_LOG, TERMINATION_LOG)
        # (the progress summary and checkpoint_info as in Launcher._report)
        summary = {"progress": self.progress.summary(), **self.checkpoint_info}
        summary = {k: v for k, v in summary.items() if v is not None}
        if code == 0:
            done = {"nodeRank": 0, "exitCode": 0, "reason": "Completed", **summary}
            write_termination(path, termination_message(done))
            self.say(f"mpirun: all ranks succeeded in {elapsed:.1f}s")
            return 0
        if self.stopping is not None:
            stopped = {"nodeRank": 0, "reason": "Terminated", "signal": self.stopping, **summary}
            write_termination(
                path, termination_message(dict(stopped, exitCode=128 + self.stopping))
            )
            return 128 + self.stopping
        text = "".join(self.output)
        rank: int | None = None
        exit_code, sig = (code if code > 0 else 128 - code), None
        # A rank that called MPI_Abort failed on purpose and first: the others were torn
        # down by it, and one that crashed then may be the exit mpirun reports first.
        first = _MPI_ABORT.search(text) or _MPI_FIRST.search(text)
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
            # map-by slot: rank r runs on node r // processCountPerNode (distributions/mpi.py).
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
        write_termination(
            path, termination_message({k: v for k, v in info.items() if v is not None})
        )
        return exit_code
