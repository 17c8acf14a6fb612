"""spec.checkpoints in local mode (``torchyard run --local``): the same contract as in a
cluster, with the run's checkpoint folder under the working root, so that the next
execution of the run resumes: after a crash, and after Ctrl-C or SIGTERM (every node's
ranks save one just-in-time checkpoint at the same step first, and no process is left).
Real CLI and launcher processes over a deterministic standard-library toy that uses
``torchyard.checkpoint``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import torchyard
from tests.builders import TrainingRunBuilder
from tests.processes import as_from_a_terminal, working_in
from tests.unit.launcher.test_checkpoint_launcher import reference
from torchyard import checkpoint

# The CLI subprocesses import this checkout's torchyard.
SOURCE_ROOT = str(Path(torchyard.__file__).resolve().parents[1])
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([SOURCE_ROOT, os.environ.get("PYTHONPATH", "")])}

TOY = """
import json, os, sys, time
from torchyard import checkpoint

rank = int(os.environ["RANK"])
steps, crash_at = int(os.environ["STEPS"]), int(os.environ.get("CRASH_AT", "0"))
state, start = float(rank), 0
resume = os.environ.get("TORCHYARD_RESUME_FROM")
if resume:
    with open(os.path.join(resume, f"state-{rank}.json")) as f:
        saved = json.load(f)
    state, start = saved["state"], saved["step"]
print(f"start {start} resume {resume}", flush=True)
for step in range(start + 1, steps + 1):
    state = state * 0.5 + step
    if step == crash_at and not resume:
        # As a collective would: both ranks got this far before either fails.
        while min(checkpoint.reported().values()) < step - 1 or len(checkpoint.reported()) < 2:
            time.sleep(0.01)
        sys.exit(5)
    if checkpoint.should_save(step):
        with open(os.path.join(checkpoint.save_dir(step), f"state-{rank}.json"), "w") as f:
            json.dump({"step": step, "state": state}, f)
        checkpoint.done(step)
    time.sleep(float(os.environ.get("STEP_SECONDS", "0")))
os.makedirs("outputs", exist_ok=True)
with open(f"outputs/final-{rank}.json", "w") as f:
    json.dump({"state": state, "start": start}, f)
"""


def write(tmp_path: Path, interval: int = 5, **env: str) -> Path:
    body = (
        TrainingRunBuilder("toy")
        .nodes(2)
        .procs(1)
        .with_("spec.command", ["python", "toy.py"])
        .with_("spec.checkpoints", {"size": "1Gi", "interval": interval, "keep": 2})
        .with_("spec.policy.terminationGracePeriodSeconds", 60)
        .with_("spec.env", [{"name": k, "value": v} for k, v in env.items()])
        .obj()
    )
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "toy.py").write_text(TOY)
    (src / "run.yaml").write_text(yaml.safe_dump(body))
    return src


def argv(tmp_path: Path, src: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torchyard",
        "run",
        str(src / "run.yaml"),
        "--local",
        "--source",
        str(src),
        "--workdir",
        str(tmp_path / "runs"),
        "--registry",
        str(tmp_path / "registry"),
    ]


def folder(tmp_path: Path) -> Path:
    return tmp_path / "runs" / "checkpoints" / "default" / "toy"


def finals(tmp_path: Path) -> dict[int, dict[str, float]]:
    """The newest execution's final states, by rank (node n runs rank n)."""
    newest = max((p for p in (tmp_path / "runs").iterdir() if p.name != "checkpoints"), key=str)
    return {
        r: json.loads((newest / f"node-{r}" / "outputs" / f"final-{r}.json").read_text())
        for r in (0, 1)
    }


def test_a_crashed_local_run_resumes_from_its_newest_complete_checkpoint(tmp_path: Path) -> None:
    src = write(tmp_path, STEPS="30", CRASH_AT="17")
    crashed = subprocess.run(
        argv(tmp_path, src), capture_output=True, text=True, timeout=300, env=ENV
    )
    assert crashed.returncode != 0
    assert checkpoint.complete_steps(str(folder(tmp_path))) == [10, 15], crashed.stderr[-4000:]
    time.sleep(1.1)  # the next execution's folder gets another timestamp
    resumed = subprocess.run(
        argv(tmp_path, src), capture_output=True, text=True, timeout=300, env=ENV
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for rank, final in finals(tmp_path).items():
        assert final["start"] == 15
        assert abs(final["state"] - reference(rank, 30)) < 1e-9


@pytest.mark.parametrize(
    "signum",
    [
        pytest.param(signal.SIGINT, id="ctrl-c"),
        # a kill, a process manager, `timeout`: the nodes run in sessions of their own, and
        # the CLI ended alone, leaving them training
        pytest.param(signal.SIGTERM, id="sigterm"),
    ],
)
def test_ctrl_c_saves_every_node_at_one_step_and_the_next_execution_resumes_there(
    tmp_path: Path, signum: signal.Signals
) -> None:
    # No interval saves here: a checkpoint after the interrupt can only be the just-in-time one.
    src = write(tmp_path, interval=100000, STEPS="100000", STEP_SECONDS="0.05")
    proc = subprocess.Popen(
        argv(tmp_path, src),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        preexec_fn=as_from_a_terminal,
    )
    ckpt = folder(tmp_path)
    deadline = time.monotonic() + 120
    while True:
        reported = checkpoint.reported(str(ckpt)) if ckpt.is_dir() else {}
        if len(reported) == 2 and min(reported.values()) >= 12:
            break
        assert time.monotonic() < deadline and proc.poll() is None, "no progress reported"
        time.sleep(0.05)
    at_interrupt = max(checkpoint.reported(str(ckpt)).values())
    proc.send_signal(signum)  # SIGINT: what Ctrl-C sends the CLI
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, stderr[-3000:]
    assert working_in(tmp_path / "runs") == []
    saved = checkpoint.complete_steps(str(ckpt))
    assert len(saved) == 1 and saved[0] > at_interrupt, (saved, stderr[-3000:])
    step = saved[0]
    assert "every rank saves a checkpoint at step" in stderr
    # The next execution of the same run resumes from that step and ends as if never stopped.
    time.sleep(1.1)
    src = write(tmp_path, STEPS=str(step + 7))
    resumed = subprocess.run(
        argv(tmp_path, src), capture_output=True, text=True, timeout=300, env=ENV
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for rank, final in finals(tmp_path).items():
        assert final["start"] == step
        assert abs(final["state"] - reference(rank, step + 7)) < 1e-9
    assert os.path.isdir(ckpt)
