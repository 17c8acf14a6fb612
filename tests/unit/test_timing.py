"""The timings plugin (``tests/timing.py``): each test file's wall time and CPU, with the
set-up and tear-down of session fixtures apart (the first test to need the cluster does not
pay for starting it), the slowest tests, and the machine's load; nothing without
``--timings``. The tests' own clock may be replaced by a test (the launcher's DNS wait)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """
import time
import pytest

@pytest.fixture(scope="session")
def slow_to_start():
    time.sleep(0.6)
    yield
    time.sleep(0.4)
"""
FIRST = """
import time

def test_needs_it(slow_to_start):
    pass

def test_busy():
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass

def test_replaces_the_clock(monkeypatch):
    monkeypatch.setattr(time, "monotonic", lambda: 1e9)
"""
SECOND = """
import time

def test_waits(slow_to_start):
    time.sleep(0.3)
"""


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_first.py").write_text(FIRST)
    (tmp_path / "test_second.py").write_text(SECOND)
    return subprocess.run(
        # --rootdir: the files are named from it; without it pytest takes the common folder
        # of the clone and tmp_path (/tmp for a clone there), not tmp_path
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.timing",
            "-q",
            str(tmp_path),
            "--rootdir",
            str(tmp_path),
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_each_file_is_timed_without_the_session_fixtures(tmp_path: Path) -> None:
    out = tmp_path / "out" / "timings.json"
    done = run(tmp_path, "--timings", str(out), "-p", "no:cacheprovider")
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    first, second = data["files"]["test_first.py"], data["files"]["test_second.py"]
    assert (first["tests"], second["tests"]) == (3, 1)
    assert first["outcomes"] == {"passed": 3}
    assert first["cpu_s"] >= 0.3 and second["wall_s"] >= 0.3
    setup = data["fixtures"]["slow_to_start (setup)"]
    teardown = data["fixtures"]["slow_to_start (teardown)"]
    assert setup["wall_s"] >= 0.6 and teardown["wall_s"] >= 0.4
    # counted once: in the fixture's figures, not also in a file's (whatever the load)
    files = first["wall_s"] + second["wall_s"]
    assert files + setup["wall_s"] + teardown["wall_s"] <= data["wall_s"]
    assert data["cpu_s"] >= first["cpu_s"]
    assert data["machine"]["cpus"] and len(data["machine"]["load_before"]) == 3
    slowest = {t["test"]: t["wall_s"] for t in data["slowest"]}
    assert slowest["test_second.py::test_waits"] >= 0.3
    # the clock a test replaced is not the plugin's
    assert slowest["test_first.py::test_replaces_the_clock"] < 60, slowest


def test_without_the_option_it_writes_nothing(tmp_path: Path) -> None:
    done = run(tmp_path, "-p", "no:cacheprovider")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not list(tmp_path.rglob("*.json"))
