"""``torchyard tensorboard RUN --local`` as a user runs it beside ``torchyard run --local``:
a real TensorBoard (PyPI's, installed by ``make tensorboard``) shows the scalars a running
run wrote to ``$TORCHYARD_TENSORBOARD_DIR``, its new ones within 10 s, and after the run
ended the archived ones; asked over TensorBoard's HTTP API.

The script writes event files with TensorBoard's own writer (it runs on the TensorBoard
venv's Python) and waits for the test's go-ahead files between its steps, so that the test
waits for what it expects instead of racing the run."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import Local
from tests.integration.helpers import wait_for

LOCK = Path(__file__).parents[1] / "integration" / "tracking" / "tensorboard.lock"
SCALARS = """\
import os, pathlib, sys, time
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
ctl = pathlib.Path(sys.argv[1])
writer = EventFileWriter(os.environ["TORCHYARD_TENSORBOARD_DIR"])
def log(step):
    value = summary_pb2.Summary.Value(tag="loss", simple_value=1.0 / (step + 1))
    writer.add_event(event_pb2.Event(wall_time=time.time(), step=step,
                                     summary=summary_pb2.Summary(value=[value])))
def after(name):
    writer.flush()
    while not (ctl / name).exists():
        time.sleep(0.05)
for step in range(3):
    log(step)
after("more")
for step in range(3, 6):
    log(step)
after("end")
writer.close()
"""


def venv() -> Path:
    """The venv ``make tensorboard`` installed (keyed by the lock's hash, as the Makefile)."""
    if os.environ.get("TORCHYARD_TENSORBOARD_VENV"):
        return Path(os.environ["TORCHYARD_TENSORBOARD_VENV"])
    cache = Path(os.environ.get("TORCHYARD_CACHE") or Path.home() / ".cache" / "torchyard")
    key = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]
    return cache / f"tensorboard-venv-py{sys.version_info[0]}.{sys.version_info[1]}-{key}"


@pytest.fixture
def tensorboard_venv() -> Path:
    found = venv()
    assert (found / ".complete").exists(), f"no TensorBoard at {found}: run 'make tensorboard'"
    return found


def write_run(local: Local, python: Path, ctl: Path, name: str = "scalars") -> Path:
    (local.tmp / "scalars.py").write_text(SCALARS)
    body = {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": name},
        "spec": {"environment": "local", "command": [str(python), "scalars.py", str(ctl)]},
    }
    path = local.tmp / "run.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


class Served:
    """``torchyard tensorboard`` running: its output as it comes, and its URL."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self) -> str:
        return "".join(self.lines)

    def url(self) -> str:
        def served() -> str | None:
            for line in self.lines:
                if "serving http://" in line:
                    return line.split("serving ", 1)[1].split()[0]
            assert self.proc.poll() is None, self.output()
            return None

        found: str = wait_for("TensorBoard to serve", served, timeout=120)
        return found

    def steps(self, run: str, tag: str = "loss") -> list[int]:
        """The steps of ``tag`` TensorBoard shows for ``run`` (its scalars API)."""
        query = urllib.parse.urlencode({"run": run, "tag": tag})
        try:
            with urllib.request.urlopen(
                f"{self.url()}/data/plugin/scalars/scalars?{query}", timeout=5
            ) as answer:
                return [int(point[1]) for point in json.loads(answer.read())]
        except urllib.error.HTTPError:  # not loaded yet: 400 (no such run or tag)
            return []


@contextmanager
def tensorboard(local: Local, venv_: Path, *args: str) -> Iterator[Served]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torchyard",
            "tensorboard",
            *args,
            "--local",
            *local.folders(),
            "--folder",
            str(local.tmp / "tensorboard"),
            "--tensorboard",
            str(venv_ / "bin" / "tensorboard"),
            "--interval",
            "0.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=local.tmp,
    )
    try:
        yield Served(proc)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


def test_a_running_runs_scalars_show_live_and_new_ones_within_10s_then_from_the_archive(
    local: Local, tensorboard_venv: Path
) -> None:
    ctl = local.tmp / "ctl"
    ctl.mkdir()
    path = write_run(local, tensorboard_venv / "bin" / "python", ctl)
    log = (local.tmp / "run.log").open("w")
    run = subprocess.Popen(
        [sys.executable, "-m", "torchyard", "run", str(path), "--local", *local.folders()],
        cwd=local.tmp,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for("the run's folder", lambda: list(local.workdir.glob("default-scalars-*")))
        with tensorboard(local, tensorboard_venv, "scalars") as served:
            wait_for("the first scalars", lambda: served.steps("scalars") == [0, 1, 2], 60)
            assert "(running)" in served.output()
            (ctl / "more").touch()
            wait_for("the new scalars", lambda: served.steps("scalars") == list(range(6)), 10)
        (ctl / "end").touch()
        assert run.wait(300) == 0, (local.tmp / "run.log").read_text()
    finally:
        (ctl / "end").touch()
        if run.poll() is None:
            run.kill()
    archived = local.registry / "default" / "runs" / "scalars" / "outputs" / "tensorboard"
    assert list(archived.glob("events.out.tfevents.*"))
    with tensorboard(local, tensorboard_venv, "scalars") as served:
        wait_for("the archived scalars", lambda: served.steps("scalars") == list(range(6)), 60)
        assert "the local archive" in served.output()
