"""``torchyard tensorboard RUN --local`` as a user runs it beside ``torchyard run --local``:
a real TensorBoard (PyPI's, installed by ``make tensorboard``) shows the scalars a running
run wrote to ``$TORCHYARD_TENSORBOARD_DIR``, its new ones as they come, and after the run
ended the archived ones; asked over TensorBoard's HTTP API.

The script writes event files with TensorBoard's own writer (it runs on the TensorBoard
venv's Python) and waits for the test's go-ahead files between its steps, so that the test
waits for what it expects instead of racing the run."""

from __future__ import annotations

import subprocess
import sys
from contextlib import AbstractContextManager
from pathlib import Path

import yaml

from tests.e2e.conftest import Local
from tests.integration.helpers import wait_for
from tests.tensorboards import SCALARS, Served, tensorboard
from tests.tensorboards import tensorboard_venv as tensorboard_venv  # (a fixture)


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


def local_tensorboard(local: Local, venv_: Path, run: str) -> AbstractContextManager[Served]:
    return tensorboard(venv_, local.tmp / "tensorboard", run, "--local", *local.folders())


def test_a_running_runs_scalars_show_live_and_new_ones_as_written_then_from_the_archive(
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
        with local_tensorboard(local, tensorboard_venv, "scalars") as served:
            wait_for("the first scalars", lambda: served.steps("scalars") == [0, 1, 2], 60)
            assert "(running)" in served.output()
            (ctl / "more").touch()
            # (how soon: benchmarks/tensorboard_live.py, against TensorBoard alone)
            wait_for("the new scalars", lambda: served.steps("scalars") == list(range(6)), 60)
        (ctl / "end").touch()
        assert run.wait(300) == 0, (local.tmp / "run.log").read_text()
    finally:
        (ctl / "end").touch()
        if run.poll() is None:
            run.kill()
    archived = local.registry / "default" / "runs" / "scalars" / "outputs" / "tensorboard"
    assert list(archived.glob("events.out.tfevents.*"))
    with local_tensorboard(local, tensorboard_venv, "scalars") as served:
        wait_for("the archived scalars", lambda: served.steps("scalars") == list(range(6)), 60)
        assert "the local archive" in served.output()


def test_a_sweeps_trials_are_shown_side_by_side(local: Local, tensorboard_venv: Path) -> None:
    ctl = local.tmp / "ctl"
    ctl.mkdir()
    (ctl / "more").touch()
    (ctl / "end").touch()
    (local.tmp / "scalars.py").write_text(SCALARS)
    python = str(tensorboard_venv / "bin" / "python")
    body = {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "Sweep",
        "metadata": {"name": "tiny"},
        "spec": {
            "objective": {"metric": "loss", "goal": "minimize"},
            "trial": {"environment": "local", "command": [python, "scalars.py", str(ctl)]},
            "parameters": {"learning_rate": {"type": "choice", "values": [0.1, 0.2]}},
            "sampling": "grid",
            "maxTotalTrials": 2,
        },
    }
    path = local.tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(body))
    # (the trials report no objective to torchyard: the Sweep fails, its trials ran)
    done = local.command(["sweep", "submit", str(path)])
    for trial in ("tiny-t0", "tiny-t1"):
        assert f"archived outputs and logs to {local.registry}/default/runs/{trial}" in done.stderr
    args = ("--sweep", "tiny", "--local", *local.folders())
    with tensorboard(tensorboard_venv, local.tmp / "tensorboard", *args) as served:
        for trial in ("tiny-t0", "tiny-t1"):
            wait_for(trial, lambda t=trial: served.steps(t) == list(range(6)), 60)  # type: ignore[misc]
