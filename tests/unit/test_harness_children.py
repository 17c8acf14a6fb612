"""The test harness's processes (etcd, kube-apiserver, ..., the real node's kubelet) die
with the harness, however it dies: a harness killed by pytest-timeout or by a test's
``process.kill()`` left its whole control plane running, orphans of PID 1."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# A harness started from a terminal: SIGHUP at its default (a suite run under nohup, as a
# CI may be, starts it with SIGHUP ignored, and the signal would then end nothing).
HARNESS = """
import signal, subprocess, sys
signal.signal(signal.SIGHUP, signal.SIG_DFL)
from tests.cluster.harness import dies_with_us
child = subprocess.Popen([*dies_with_us(), "sleep", "600"], start_new_session=True)
print(child.pid, flush=True)
sys.stdin.read()
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie has died (it stays in /proc until reaped, and the
    process reaping it may be this one, where a test made it a subreaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _runs(pid: int, program: bytes) -> bool:
    """Whether ``pid`` runs ``program`` (it has exec'd it)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == program
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
def test_a_process_the_harness_started_dies_with_it(signum: int) -> None:
    harness = subprocess.Popen(
        [sys.executable, "-c", HARNESS],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert harness.stdout is not None
    child = int(harness.stdout.readline())
    try:
        # setpriv asks for the parent-death signal, then runs the program: until the
        # program runs, a harness that dies first leaves nothing to send it
        deadline = time.monotonic() + 10
        while not _runs(child, b"sleep") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _runs(child, b"sleep"), "the harness's child never ran its program"
        harness.send_signal(signum)
        harness.wait(10)
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the harness's child outlived it"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child, os.WNOHANG)  # reaped here when this process adopted it
        harness.kill()
        harness.wait()


# A test process with gRPC's threads busy (the GPU device plugin's server and a client
# waiting on it) starts the harness's children: each must get to run its program. With a
# preexec_fn (a fork()), gRPC's fork handlers aborted about one child in twenty.
WHILE_GRPC_RUNS = """
import subprocess, sys
from concurrent import futures
import grpc
from tests.cluster.harness import dies_with_us
server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
channel = grpc.insecure_channel(f"127.0.0.1:{port}")
codes = []
for _ in range(int(sys.argv[1])):
    try:
        grpc.channel_ready_future(channel).result(timeout=0.01)
    except grpc.FutureTimeoutError:
        pass
    codes.append(subprocess.Popen([*dies_with_us(), "true"], start_new_session=True).wait())
print(sorted(set(codes)))
"""


def test_children_start_while_grpc_threads_run_in_the_harness() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WHILE_GRPC_RUNS, "200"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == "[0]", done.stderr[-2000:]
