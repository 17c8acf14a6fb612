"""What a rank's output may cost its node: its log file keeps its head and tail within
TORCHYARD_LOG_LIMIT_BYTES and says what it dropped, and the evidence is looked for in
what it keeps; the node's own output never makes a rank wait (each rank shows its share,
a slow reader loses rank lines, with a line saying how many, never the launcher's own);
and what the ranks started is ended with the node (and with a local run), however it
left their session. The cost in steps per second: benchmarks/chatty_rank.py."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.launcher.test_launcher import launch, termination
from tests.unit.local.test_console import Clock
from tests.unit.local.test_mode import project
from torchyard import cli
from torchyard.launch import contract, output, ranks

NOTE = re.compile(
    rb"\[torchyard\] (\d+) bytes \((\d+) lines\) of this rank's output dropped here: .*\n"
)


def stream(seed: int, size: int) -> bytes:
    """``size`` bytes of lines of random lengths (some longer than a read)."""
    rng = random.Random(seed)
    parts, total, n = [], 0, 0
    while total < size:
        length = rng.choice([0, 5, 80, 300, 5000, output.READ_BYTES + 100])
        line = (b"%d:" % n + b"x" * length)[:length] + b"\n"
        parts.append(line)
        total += len(line)
        n += 1
    return b"".join(parts)[:size]


def written(path: Path, data: bytes, limit: int, seed: int) -> bytes:
    """``data`` through a CappedLog in reads of random sizes, as a rank's pipe gives it."""
    log = output.CappedLog(str(path), limit)
    rng, at = random.Random(seed), 0
    while at < len(data):
        size = rng.randint(1, output.READ_BYTES)
        log.write(data[at : at + size])
        at += size
    log.close()
    return path.read_bytes()


@pytest.mark.parametrize("limit", [4096, 10_000, 1 << 20])
@pytest.mark.parametrize("seed", range(4))
def test_a_capped_log_keeps_the_head_and_whole_lines_of_the_tail_within_its_limit(
    tmp_path: Path, limit: int, seed: int
) -> None:
    data = stream(seed, limit * 5)
    kept = written(tmp_path / "rank-0.txt", data, limit, seed)
    assert len(kept) <= limit
    note = NOTE.search(kept)
    assert note is not None, kept[:200]
    tail = kept[note.end() :]
    assert data.endswith(tail) and (tail == b"" or data[: len(data) - len(tail)].endswith(b"\n"))
    # the head, without the newline that ends it before the note when it ended in a line
    head = next(
        h
        for h in (kept[: note.start()], kept[: note.start()].removesuffix(b"\n"))
        if data.startswith(h) and len(h) + int(note.group(1)) + len(tail) == len(data)
    )
    assert len(head) <= limit // 2
    dropped = data[len(head) : len(data) - len(tail)]
    assert int(note.group(2)) == dropped.count(b"\n") + (not dropped.endswith(b"\n"))
    assert list(tmp_path.iterdir()) == [tmp_path / "rank-0.txt"]  # no segment file left


@pytest.mark.parametrize("limit", [0, 1 << 20])
def test_what_fits_the_limit_is_kept_as_written(tmp_path: Path, limit: int) -> None:
    data = stream(7, 900_000)
    assert written(tmp_path / "rank-0.txt", data, limit, 7) == data


def test_the_limit_comes_from_the_environment_and_refuses_a_useless_one() -> None:
    assert output.log_limit({}) == output.LOG_LIMIT_BYTES
    assert output.log_limit({"TORCHYARD_LOG_LIMIT_BYTES": "0"}) == 0
    with pytest.raises(contract.LaunchError, match="at least 4096"):
        output.log_limit({"TORCHYARD_LOG_LIMIT_BYTES": "100"})


def test_a_chatty_rank_succeeds_with_its_log_within_the_limit(tmp_path: Path) -> None:
    chatty = (
        "import sys\n"
        "for i in range(200000):\n"
        "    sys.stdout.write('line %d of a chatty rank\\n' % i)\n"
        "print('the last line')\n"
    )
    done = launch(tmp_path, chatty, nproc=1, extra={"TORCHYARD_LOG_LIMIT_BYTES": "65536"})
    assert done.returncode == 0, done.stderr[-2000:]
    log = (tmp_path / "logs" / "rank-0.txt").read_bytes()
    assert len(log) <= 65536
    assert log.startswith(b"line 0 of a chatty rank\n") and log.endswith(b"the last line\n")
    assert NOTE.search(log) is not None
    assert termination(tmp_path)["exitCode"] == 0


class Blocked(io.StringIO):
    """A reader that reads nothing until let go (a terminal scrolled back, a stuck log
    collector)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def write(self, text: str) -> int:
        self.go.wait()
        return super().write(text)


def test_a_reader_that_does_not_read_makes_no_rank_wait_and_loses_no_launcher_message() -> None:
    out, err = Blocked(), Blocked()
    echo = output.Echo(err, limit=1000)
    lines = [b"[rank 0] line %d\n" % i for i in range(1000)]
    for line in lines:
        echo.put(out, line, "rank 0")  # returns at once: the reader does not read
    echo.put(err, b"[torchyard] progress {}\n")
    out.go.set()
    err.go.set()
    echo.drain()
    shown = out.getvalue().splitlines()
    assert shown == [x.decode().rstrip("\n") for x in lines[: len(shown)]]  # in order
    # (a note each time the reader caught up: one or more)
    notes = re.findall(r"rank 0: (\d+) lines \(\d+ bytes\) not shown here", err.getvalue())
    assert notes, err.getvalue()
    assert len(shown) + sum(map(int, notes)) == len(lines)
    assert "[torchyard] progress {}" in err.getvalue()


def test_a_rank_shows_its_share_of_lines_and_the_rest_is_counted() -> None:
    out, err, clock = io.StringIO(), io.StringIO(), Clock()
    echo = output.Echo(err, rate=1000, burst=3000, clock=clock)
    lines = [b"line %04d of a chatty rank\n" % i for i in range(1000)]
    size = len(lines[0])  # 27 bytes, the prefix not counted
    shown_then = []
    for second in range(3):
        for at in range(0, 300, 30):  # 300 lines a second, 30 a read: 7500 bytes a second
            echo.put(out, b"".join(lines[second * 300 + at :][:30]), "rank 0", b"[rank 0] ")
        echo.put(err, b"[torchyard] progress {}\n")  # the launcher's own: never dropped
        clock.now += 1.0
        echo.drain()
        shown_then.append(len(out.getvalue().splitlines()))
    shown = out.getvalue().splitlines()
    # the burst at first, then a second's rate each second, in whole lines
    assert shown_then == [(3000 + 1000 * second) // size for second in range(3)]
    assert all(line.startswith("[rank 0] line ") for line in shown)
    assert shown == sorted(shown)  # in order
    notes = re.findall(r"rank 0: (\d+) lines \(\d+ bytes\) not shown here", err.getvalue())
    assert len(shown) + sum(map(int, notes)) == 900
    assert err.getvalue().count("[torchyard] progress {}") == 3


def test_a_rank_whose_lines_are_dropped_does_not_hide_another_ranks() -> None:
    out, err = io.StringIO(), io.StringIO()
    echo = output.Echo(err, rate=1000, burst=1000, clock=Clock())
    echo.put(out, b"x" * 99 + b"\n" * 100, "rank 0", b"[rank 0] ")  # its whole share
    echo.put(out, b"a line of rank 1\n", "rank 1", b"[rank 1] ")
    echo.drain()
    assert "[rank 1] a line of rank 1" in out.getvalue().splitlines()


def test_the_evidence_is_looked_for_in_what_the_log_keeps(tmp_path: Path) -> None:
    """The head as written, the tail when the log is closed; not the dropped middle."""
    scanner = output.LogScanner()
    log = output.CappedLog(
        str(tmp_path / "rank-0.txt"), 8192, functools.partial(scanner.scan_read, 0)
    )
    filler = b"".join(b"filler line %d\n" % i for i in range(100))  # about 1.5 KB
    log.write(b"NVRM: Xid 79 in the head\n" + filler * 3)  # more than the head's 4 KiB
    log.write(b"NVRM: Xid 48 in the middle\n" + filler * 8)
    log.write(b"NVRM: Xid 13 in the tail\n" + filler)
    assert [e["line"] for e in scanner.evidence] == ["NVRM: Xid 79 in the head"]
    log.close()
    kept = (tmp_path / "rank-0.txt").read_text()
    assert [e["line"] for e in scanner.evidence] == [
        "NVRM: Xid 79 in the head",
        "NVRM: Xid 13 in the tail",
    ]
    assert "Xid 48" not in kept and "Xid 13 in the tail" in kept


EVIDENCE_LINES = [
    "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "[E ProcessGroupNCCL.cpp:475] Watchdog caught collective operation timeout",
    "RuntimeError: [/pytorch/gloo/transport/tcp/pair.cc:598] Timed out waiting 1800000ms "
    "for recv operation to complete",
    "torch.distributed.DistStoreError: Timed out after 901 seconds",
    "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
    "Fatal Python error: Segmentation fault",
    "ECC error on device 0",
]


@pytest.mark.parametrize("line", EVIDENCE_LINES)
def test_every_evidence_line_holds_an_evidence_word(line: str) -> None:
    """The whole-read filter (EVIDENCE_WORDS) lets every EVIDENCE line through."""
    assert contract.EVIDENCE.search(line)
    assert any(word in line.encode() for word in contract.EVIDENCE_WORDS)


def test_every_evidence_alternative_names_an_evidence_word() -> None:
    depth, start, alternatives = 0, 0, []
    pattern = contract.EVIDENCE.pattern
    for i, char in enumerate(pattern):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "|" and depth == 0:
            alternatives.append(pattern[start:i])
            start = i + 1
    alternatives.append(pattern[start:])
    for alternative in alternatives:
        literal = re.sub(r"\\[bdws]\*?|\[[^]]*\][+*]?|\\", " ", alternative)
        assert any(w.decode() in literal for w in contract.EVIDENCE_WORDS), alternative


@pytest.mark.parametrize(
    "rules",
    [
        [],
        [{"pattern": "^boom$", "action": "cancelRetries"}, {"pattern": "Xid", "action": "ignore"}],
    ],
    ids=["evidence", "rules-with-anchors"],
)
def test_a_whole_read_flags_what_its_lines_one_by_one_flag(rules: list[dict[str, str]]) -> None:
    lines = [b"quiet\n", *(x.encode() + b"\r\n" for x in EVIDENCE_LINES), b"boom\r\n", b"x\n"]
    one_by_one, whole = (output.LogScanner(json.dumps(rules)) for _ in range(2))
    for line in lines:
        one_by_one.scan(3, line)
    for at in range(0, len(lines), 3):
        whole.scan_read(3, b"".join(lines[at : at + 3]))
    assert (whole.evidence, whole.hit) == (one_by_one.evidence, one_by_one.hit)


# -- what the ranks leave behind ------------------------------------------------------

HELPER = "import time; time.sleep(600)"
# How a rank's helper may leave the rank's session: each is found by a different trait.
LEAVING = {
    # setsid, still writing to the rank's stdout (the node waited for it: the pipe)
    "own-session-holding-the-pipe": "subprocess.Popen([sys.executable, '-c', HELPER], "
    "start_new_session=True)",
    # a daemon: its own session, its output elsewhere (found by the node's cookie)
    "daemon-with-the-pipes-closed": "subprocess.Popen([sys.executable, '-c', HELPER], "
    "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)",
    # a clean environment, still holding the pipe (found by the pipe)
    "clean-environment-holding-the-pipe": "subprocess.Popen([sys.executable, '-c', HELPER], "
    "start_new_session=True, env={})",
    # a clean environment and the pipes closed (``env -i``, a redirect): orphaned when the
    # rank ends, adopted by the node's launcher (a subreaper)
    "clean-environment-pipes-closed": "subprocess.Popen([sys.executable, '-c', HELPER], "
    "start_new_session=True, env={}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)",
}


def gone(pid: int) -> bool:
    """Ended (a zombie not yet waited for by its new parent counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


@contextlib.contextmanager
def ended_within_5s(pids: list[int], ended: float) -> Iterator[None]:
    """After the block's own checks: within 5 s of ``ended`` (the node's or the run's
    end), every process of ``pids`` is gone; any that is not is killed, pass or fail."""
    try:
        yield
        while not all(gone(pid) for pid in pids) and time.monotonic() < ended + 5:
            time.sleep(0.05)
        assert all(gone(pid) for pid in pids), [p for p in pids if not gone(p)]
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, 9)


@pytest.mark.parametrize("how", list(LEAVING), ids=list(LEAVING))
@pytest.mark.parametrize("code", [0, 3], ids=["ranks-succeed", "a-rank-fails"])
def test_what_a_rank_started_ends_with_the_node_and_does_not_hold_it(
    tmp_path: Path, how: str, code: int
) -> None:
    script = (
        "import os, subprocess, sys, time\n"
        f"HELPER = {HELPER!r}\n"
        f"helper = {LEAVING[how]}\n"
        "with open(f'helper-{os.environ[\"RANK\"]}.tmp', 'w') as f:\n"
        "    f.write(str(helper.pid))\n"
        "os.rename(f'helper-{os.environ[\"RANK\"]}.tmp', f'helper-{os.environ[\"RANK\"]}.pid')\n"
        "while not all(os.path.exists(f'helper-{r}.pid') for r in (0, 1)):  # both started\n"
        "    time.sleep(0.01)\n"
        f"sys.exit({code})\n"
    )
    done = launch(tmp_path, script, nproc=2)
    ended = time.monotonic()
    pids = [int((tmp_path / f"helper-{r}.pid").read_text()) for r in (0, 1)]
    with ended_within_5s(pids, ended):
        assert done.returncode == code, done.stderr
        assert "ended 2 process(es) the ranks left running" in done.stderr


@pytest.mark.parametrize("how", list(LEAVING), ids=list(LEAVING))
def test_in_local_mode_what_a_rank_started_ends_with_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """``torchyard run --local`` (2 nodes of 1 rank): each rank leaves a helper behind."""
    folder = tmp_path / "helpers"
    folder.mkdir()
    script = (
        "import os, subprocess, sys\n"
        f"HELPER = {HELPER!r}\n"
        f"helper = {LEAVING[how]}\n"
        f"with open(os.path.join({str(folder)!r}, os.environ['RANK']), 'w') as f:\n"
        "    f.write(str(helper.pid))\n"
    )
    monkeypatch.chdir(project(tmp_path / "src", {"train.py": script}))
    code = cli.main(["run", "run.yaml", "--local", "--source", ".", "--workdir", "./runs"])
    ended = time.monotonic()
    pids = [int(path.read_text()) for path in folder.iterdir()]
    with ended_within_5s(pids, ended):
        assert code == 0 and len(pids) == 2


def test_leftovers_are_found_by_the_cookie_and_by_the_pipes_and_nothing_else() -> None:
    cookie = os.urandom(8).hex()
    marked = subprocess.Popen(
        [sys.executable, "-c", HELPER],
        env={**os.environ, contract.TORCHYARD_NODE_COOKIE: cookie},
        start_new_session=True,
    )
    read, write = os.pipe()
    holding = subprocess.Popen(
        [sys.executable, "-c", HELPER], stdout=write, env={}, start_new_session=True
    )
    os.close(write)
    other = subprocess.Popen(
        [sys.executable, "-c", HELPER],
        env={**os.environ, contract.TORCHYARD_NODE_COOKIE: cookie + "0"},  # another node's
        start_new_session=True,
    )
    try:
        inode = os.fstat(read).st_ino
        found = ranks.leftovers(cookie, [inode])
        assert marked.pid in found and holding.pid in found and other.pid not in found
        assert os.getpid() not in found  # it holds the pipe too: never itself
        assert ranks.end_leftovers(cookie, pipes=[inode]) == sorted([marked.pid, holding.pid])
        assert marked.wait(5) and holding.wait(5)  # ended by a signal (non-zero)
        assert other.poll() is None
    finally:
        os.close(read)
        for proc in (marked, holding, other):
            proc.kill()
            proc.wait()
