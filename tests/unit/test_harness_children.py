"""The test harness's processes (etcd, kube-apiserver, ..., the real node's kubelet) die
with the harness, however it dies: a harness killed by pytest-timeout or by a test's
``process.kill()`` left its whole control plane running, orphans of PID 1."""

from __future__ import annotations

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
child = subprocess.Popen(["sleep", "600"], preexec_fn=dies_with_us(), start_new_session=True)
print(child.pid, flush=True)
sys.stdin.read()
"""


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
        harness.send_signal(signum)
        harness.wait(10)
        deadline = time.monotonic() + 5
        while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{child}").exists(), "the harness's child outlived it"
    finally:
        if Path(f"/proc/{child}").exists():
            os.kill(child, signal.SIGKILL)
        harness.kill()
        harness.wait()
