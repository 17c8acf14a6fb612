"""A node's ranks as processes: :class:`Rank` starts one and tees its output (its log file,
the node's output, the evidence scanner, the progress tracker); what the ranks need of
their node before they start (MASTER_ADDR resolving, writable folders, an importable
torchyard) and what is left
of them after (:func:`end_leftovers`; the OOM killer's count and the memory limit, to say
why a rank was SIGKILLed).

Standard library only, Python >= 3.8; shipped with the launcher (``node_launcher``), and
``end_leftovers`` is local mode's too. Tested in tests/unit/launcher/test_launcher.py,
tests/unit/launcher/test_output.py and tests/unit/launcher/test_dns_wait.py.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO

from torchyard.launch.contract import (
    LOG_LIMIT_BYTES,
    PROGRESS_PREFIX,
    TAIL_LINES,
    TORCHYARD_NODE_COOKIE,
    LaunchError,
    parse_progress,
)
from torchyard.launch.output import READ_BYTES, CappedLog, Echo, LogScanner
from torchyard.launch.tracker import ProgressTracker

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


def own_package_folder() -> str:
    """A new temporary folder holding only a link ``torchyard`` to the package this launcher
    runs from, for the ranks' PYTHONPATH where no package was shipped (local mode, an
    image with torchyard installed): every process the ranks start imports this
    torchyard, whatever Python runs it (``torchrun`` may be a script of another
    environment, whose workers run that environment's Python), and nothing else of this
    launcher's environment. The caller removes it once the ranks are gone."""
    import tempfile

    top = sys.modules[__name__.partition(".")[0]]
    folder = tempfile.mkdtemp(prefix="torchyard-lib-")
    os.symlink(next(iter(top.__path__)), os.path.join(folder, top.__name__))
    return folder


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


# -- what a rank's output may cost: its pipe -------------------------------------------

# The pipe's kernel buffer (Linux): a rank writing bursts waits less while the pumps are
# between two reads. The default is 64 KiB.
PIPE_BYTES = 1 << 20
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (named in Python >= 3.10 only)
# How long a rank's output threads go on reading once it and everything it started ended:
# a process that escaped (another user's, a setuid program) holding the pipe open cannot
# hold the node.
PUMP_DRAIN_SECONDS = 1.0


# -- what a node's ranks leave behind --------------------------------------------------

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


PR_SET_CHILD_SUBREAPER = 36  # prctl(2), Linux 3.4 and later
# Whether this process adopts orphaned descendants (become_subreaper): only then are its
# children other than the ranks leftovers. Never so where the launcher runs inside
# another program (tests, local mode's own process), whose children are its own.
_SUBREAPER = {"on": False}


def become_subreaper() -> bool:
    """Make this process the one that adopts its descendants whose parent ended (as the
    container's first process does in a Pod), so that what the ranks started is still
    found once it dropped the node's cookie and closed the ranks' pipes. False where the
    system has no such thing (not Linux, or no libc to call)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        _SUBREAPER["on"] = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    return _SUBREAPER["on"]


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def adopted(exclude: Sequence[int] = ()) -> list[int]:
    """This process's children (running, or ended and not waited for) other than
    ``exclude`` (its ranks): once the ranks ended, those it adopted as a subreaper.
    None unless it became one (:func:`become_subreaper`)."""
    if not _SUBREAPER["on"]:
        return []
    me = os.getpid()
    return [pid for pid in _pids() if pid not in exclude and _parent(pid) == me]


def leftovers(cookie: str, pipes: Sequence[int] = (), ranks: Sequence[int] = ()) -> list[int]:
    """The processes (not this one) that carry ``TORCHYARD_NODE_COOKIE=cookie`` in their
    environment, hold one of the pipes whose inode numbers are ``pipes``, or are this
    process's children other than its ``ranks`` (adopted: :func:`become_subreaper`)."""
    marker = f"\0{TORCHYARD_NODE_COOKIE}={cookie}\0".encode()
    links = {f"pipe:[{inode}]" for inode in pipes}
    me = os.getpid()
    found = [
        pid
        for pid in _pids()
        if pid != me and ((cookie and _carries(pid, marker)) or (links and _holds(pid, links)))
    ]
    return sorted(set(found) | {pid for pid in adopted(ranks) if alive(pid)})


def _reap(pids: Sequence[int]) -> None:
    """Wait for those of ``pids`` that are this process's ended children (adopted)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


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
    Elsewhere a launcher that became a subreaper adopts what outlived its parent, so one
    that both dropped the variable and closed the pipes (``env -i`` and a redirect) is
    found as its child. Returns the processes signalled."""
    # Without /proc (macOS) the ranks' process groups are all there is to end. With it,
    # their members carry the cookie: a group whose members all ended may have a new
    # owner by now (its number is a process number, free again), and is not signalled.
    if not _pids():
        for group in groups:
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)
        return []
    found = set(leftovers(cookie, pipes, groups))
    if os.getpid() == 1:
        found |= set(_pids()) - {1}
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    running = set(found)
    while running and time.monotonic() < deadline:
        running = {pid for pid in running if alive(pid)}
        if running:
            time.sleep(0.05)
    # and any started meanwhile, or adopted as their parent ended (a leftover's children)
    for _ in range(10):
        late = running | set(leftovers(cookie, pipes, groups))
        if not late:
            break
        for pid in late:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
        _reap(adopted(groups))
        running = set()
    _reap(adopted(groups))
    return sorted(found)


def alive(pid: int) -> bool:
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


def _progress_lines(text: bytes) -> list[tuple[int, int]]:
    """Where the lines of ``text`` (whole lines) that start with PROGRESS_PREFIX are
    (start, end without the newline), found without splitting the rest."""
    found = []
    at = text.find(PROGRESS_PREFIX)
    while at >= 0:
        end = text.find(b"\n", at)
        if at == 0 or text[at - 1] == 10:  # 10: b"\n", the start of a line
            found.append((at, end))
        at = text.find(PROGRESS_PREFIX, end)
    return found


def _without(text: bytes, lines: Sequence[tuple[int, int]]) -> bytes:
    """``text`` without ``lines`` (from :func:`_progress_lines`) and their newlines."""
    pieces, at = [], 0
    for start, end in lines:
        pieces.append(text[at:start])
        at = end + 1
    pieces.append(text[at:])
    return b"".join(pieces)


def _last_lines(text: bytes, n: int) -> list[bytes]:
    """The last ``n`` lines of ``text`` (whole lines), without their newlines."""
    start = len(text) - 1
    for _ in range(n):
        if start < 0:
            break
        start = text.rfind(b"\n", 0, start)
    return text[start + 1 : -1].split(b"\n")


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
        # the scanner reads what the log keeps (CappedLog), not what it drops
        scan = functools.partial(scanner.scan_read, rank) if scanner is not None else None
        self.log = CappedLog(os.path.join(log_dir, name), log_limit, scan)
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
        """Read the pipe a read at a time (whatever it holds, at most READ_BYTES) and hand
        its whole lines on; a line longer than READ_BYTES goes on in pieces. Ends at the
        end of the pipe, or PUMP_DRAIN_SECONDS after :meth:`finish` (a process nobody
        could end holds it)."""
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
            if rest:
                data = rest + data
            end = data.rfind(b"\n") + 1
            if not end and len(data) < READ_BYTES:
                rest = data
                continue
            if end and end < len(data):
                data, rest = data[:end], data[end:]
            else:
                rest = b""
            text = data if data.endswith(b"\n") else data + b"\n"  # a piece of a long line
            self._lines(data, text, sink, prefix, keep_tail)
        if rest:  # a last line without its newline
            self._lines(rest, rest + b"\n", sink, prefix, keep_tail)
        pipe.close()

    def _lines(
        self, raw: bytes, text: bytes, sink: IO[str], prefix: bytes, keep_tail: bool
    ) -> None:
        """One read's whole lines (``text``, each ending with a newline; ``raw`` as the
        rank wrote them): its log (and through it the evidence scanner), the node's
        output, the traceback tail and the progress records. Whole-read operations only
        (the newlines counted once), no loop over the lines unless one of them matters."""
        count = text.count(b"\n")
        self.log.write(raw, count if raw is text else None)
        # its first byte (b"@") first: one byte is looked for by memchr, 30 times faster
        first = PROGRESS_PREFIX[:1] in text
        progress = _progress_lines(text) if first and PROGRESS_PREFIX in text else []
        if progress and not self.show_progress:
            shown = _without(text, progress)
            self.echo.put(sink, shown, self.label, prefix)
        else:
            self.echo.put(sink, text, self.label, prefix, count)
        if keep_tail:
            self.tail.extend(
                line.decode("utf-8", "replace") + "\n" for line in _last_lines(text, TAIL_LINES)
            )
        if self.progress is not None:
            for start, end in progress:
                record = parse_progress(text[start:end].rstrip(b"\r"))
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
