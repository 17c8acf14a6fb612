"""The launcher with a checkpoint folder, run as a real process from a shipped package folder
(as in a node Pod) over small Python ranks that use ``torchyard.checkpoint``: COMPLETE.json
written by node 0's launcher, resume from the newest complete checkpoint, the just-in-time
checkpoint on SIGTERM, and the quarantine of a checkpoint a failed attempt could not get
past."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.shipped import launcher, lay_out
from tests.unit.launcher.test_launcher import termination
from torchyard import checkpoint

# A deterministic toy: each rank's state after step n is a function of the state after
# step n-1 only, so a resumed run must reproduce the uninterrupted one exactly.
TRAIN = """
import json, os, sys, time
from torchyard import checkpoint

rank = int(os.environ["RANK"])
steps = int(os.environ.get("STEPS", "40"))
crash_at = int(os.environ.get("CRASH_AT", "0"))
delay = float(os.environ.get("STEP_SECONDS", "0"))
state, start = float(rank), 0
resume = os.environ.get("TORCHYARD_RESUME_FROM")
if resume:
    with open(os.path.join(resume, f"state-{rank}.json")) as f:
        saved = json.load(f)
    state, start = saved["state"], saved["step"]
    assert start == checkpoint.resume_step(), (start, checkpoint.resume_step())
for step in range(start + 1, steps + 1):
    state = state * 0.5 + step
    if step == crash_at and not resume:
        # As a collective would: both ranks got this far before either fails.
        while min(checkpoint.reported().values()) < step - 1 or len(checkpoint.reported()) < 2:
            time.sleep(0.01)
        sys.exit(7)
    if checkpoint.should_save(step):
        folder = checkpoint.save_dir(step)
        with open(os.path.join(folder, f"state-{rank}.json"), "w") as f:
            json.dump({"step": step, "state": state}, f)
        checkpoint.done(step)
    time.sleep(delay)
with open(os.path.join(os.environ["TORCHYARD_OUTPUTS"], f"final-{rank}.json"), "w") as f:
    json.dump({"state": state, "resumed": resume}, f)
"""


def reference(rank: int, steps: int) -> float:
    state = float(rank)
    for step in range(1, steps + 1):
        state = state * 0.5 + step
    return state


def launch(
    tmp_path: Path, ckpt: Path, extra: dict[str, str], wait: bool = True, script: str = TRAIN
) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:
    lib = tmp_path / "lib"
    package = lay_out(lib)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "train.py").write_text(script)
    env = {
        "PATH": os.environ["PATH"],
        "TORCHYARD_NPROC_PER_NODE": "2",
        "NODE_RANK": "0",
        "WORLD_SIZE": "2",
        "TORCHYARD_TERMINATION_LOG": str(tmp_path / "termination.json"),
        "TORCHYARD_GRACE_PERIOD": "5",
        "TORCHYARD_SHIPPED_PATH": str(lib),
        "TORCHYARD_CHECKPOINT_DIR": str(ckpt),
        "TORCHYARD_CHECKPOINT_KEEP": "2",
        **extra,
    }
    # -I: isolated, so only the shipped folder can provide torchyard (as in a Pod).
    argv = [
        sys.executable,
        "-I",
        str(launcher(package)),
        "--",
        sys.executable,
        "train.py",
    ]
    if not wait:
        return subprocess.Popen(
            argv, cwd=work, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    return subprocess.run(argv, cwd=work, env=env, text=True, capture_output=True, timeout=120)


def finals(tmp_path: Path) -> dict[int, dict[str, object]]:
    out = tmp_path / "work" / "outputs"
    return {r: json.loads((out / f"final-{r}.json").read_text()) for r in (0, 1)}


def test_a_failed_attempt_resumes_from_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    first = launch(tmp_path, ckpt, {"TORCHYARD_CHECKPOINT_INTERVAL": "5", "CRASH_AT": "23"})
    assert isinstance(first, subprocess.CompletedProcess)
    assert first.returncode == 7, first.stderr
    # Node 0's launcher wrote COMPLETE.json for 5..20 and kept the newest two.
    assert checkpoint.complete_steps(str(ckpt)) == [15, 20]
    assert termination(tmp_path)["checkpointStep"] == 20

    second = launch(tmp_path, ckpt, {"TORCHYARD_CHECKPOINT_INTERVAL": "5", "CRASH_AT": "23"})
    assert isinstance(second, subprocess.CompletedProcess)
    assert second.returncode == 0, second.stderr
    assert f"resuming from checkpoint {ckpt / 'step-20'}" in second.stderr
    result = finals(tmp_path)
    for rank in (0, 1):
        assert result[rank]["resumed"] == str(ckpt / "step-20")
        assert abs(float(str(result[rank]["state"])) - reference(rank, 40)) < 1e-9
    assert termination(tmp_path)["resumedFrom"] == 20
    assert checkpoint.complete_steps(str(ckpt)) == [35, 40]


def test_a_half_written_newer_save_is_never_resumed_from(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    first = launch(tmp_path, ckpt, {"TORCHYARD_CHECKPOINT_INTERVAL": "10", "STEPS": "20"})
    assert isinstance(first, subprocess.CompletedProcess) and first.returncode == 0
    # A save of step 30 that only rank 0 finished, and a forged one without its files.
    partial = Path(checkpoint.save_dir(30, str(ckpt)))
    (partial / "state-0.json").write_text(json.dumps({"step": 30, "state": 1.0}))
    checkpoint.done(30, str(ckpt), rank=0)
    forged = Path(checkpoint.save_dir(40, str(ckpt)))
    (forged / "COMPLETE.json").write_text(
        json.dumps({"step": 40, "worldSize": 2, "files": [{"name": "x", "size": 1, "sha256": ""}]})
    )
    second = launch(tmp_path, ckpt, {"TORCHYARD_CHECKPOINT_INTERVAL": "10", "STEPS": "25"})
    assert isinstance(second, subprocess.CompletedProcess)
    assert second.returncode == 0, second.stderr
    assert finals(tmp_path)[1]["resumed"] == str(ckpt / "step-20")
    assert abs(float(str(finals(tmp_path)[1]["state"])) - reference(1, 25)) < 1e-9


def test_sigterm_saves_every_rank_at_one_step_after_the_highest_reported(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    proc = launch(
        tmp_path,
        ckpt,
        {"STEPS": "100000", "STEP_SECONDS": "0.02", "TORCHYARD_CHECKPOINT_SAVE_SECONDS": "60"},
        wait=False,
    )
    assert isinstance(proc, subprocess.Popen)
    deadline = time.monotonic() + 60
    while (
        len(checkpoint.reported(str(ckpt))) < 2 or min(checkpoint.reported(str(ckpt)).values()) < 20
    ):
        assert time.monotonic() < deadline and proc.poll() is None, "the ranks never reported"
        time.sleep(0.05)
    at_signal = max(checkpoint.reported(str(ckpt)).values())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=90) == 128 + signal.SIGTERM
    stderr = proc.stderr.read() if proc.stderr else ""
    saved = checkpoint.complete_steps(str(ckpt))
    assert len(saved) == 1 and saved[0] > at_signal, stderr
    step = saved[0]
    for rank in (0, 1):
        body = json.loads((ckpt / f"step-{step}" / f"state-{rank}.json").read_text())
        assert body["step"] == step
        assert abs(body["state"] - reference(rank, step)) < 1e-9
    message = termination(tmp_path)
    assert message["reason"] == "Terminated" and message["checkpointStep"] == step
    assert f"checkpoint at step {step} complete: stopping the ranks" in stderr


def test_without_step_reports_sigterm_stops_the_ranks_at_once(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    # The ranks of this run never call should_save: they only say they started and sleep.
    sleeper = "import time\nprint('started', flush=True)\ntime.sleep(120)\n"
    proc = launch(
        tmp_path, ckpt, {"TORCHYARD_CHECKPOINT_SAVE_SECONDS": "60"}, wait=False, script=sleeper
    )
    assert isinstance(proc, subprocess.Popen)
    logs = tmp_path / "work" / "logs"
    deadline = time.monotonic() + 60
    while not all(
        (logs / f"rank-{r}.txt").is_file() and "started" in (logs / f"rank-{r}.txt").read_text()
        for r in (0, 1)
    ):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert time.monotonic() - started < 30  # not the 60 s save wait
    assert checkpoint.complete_steps(str(ckpt)) == []


def test_a_resumed_attempt_failing_before_progress_quarantines_its_checkpoint(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt"
    first = launch(tmp_path, ckpt, {"TORCHYARD_CHECKPOINT_INTERVAL": "5", "STEPS": "10"})
    assert isinstance(first, subprocess.CompletedProcess) and first.returncode == 0
    # The checkpoint of step 10 is bad for the code: the state files are unreadable.
    for rank in (0, 1):
        (ckpt / "step-10" / f"state-{rank}.json").write_text("{}")
    assert not checkpoint.is_complete(str(ckpt / "step-10"))  # changed after COMPLETE.json
    # Sealed again with the bad content, as a buggy save would have written it.
    assert checkpoint.finalize(10, 2, str(ckpt))
    extra = {"TORCHYARD_CHECKPOINT_INTERVAL": "5", "TORCHYARD_CHECKPOINT_MAX_STALLS": "2"}
    failed = launch(tmp_path, ckpt, extra)
    assert isinstance(failed, subprocess.CompletedProcess) and failed.returncode == 1
    message = termination(tmp_path)
    assert message["resumedFrom"] == 10 and message["quarantined"] == "quarantine-step-10"
    assert message["reason"] == "Error"
    assert checkpoint.latest(str(ckpt)) == str(ckpt / "step-5")
    # The next attempt resumes from step 5; make that one bad too: the second stall stops.
    for rank in (0, 1):
        (ckpt / "step-5" / f"state-{rank}.json").write_text("{}")
    assert checkpoint.finalize(5, 2, str(ckpt))
    failed = launch(tmp_path, ckpt, extra)
    assert isinstance(failed, subprocess.CompletedProcess) and failed.returncode == 1
    message = termination(tmp_path)
    assert message["reason"] == checkpoint.NO_PROGRESS_REASON
    assert "quarantine-step-10" in str(message["message"])
    assert "quarantine-step-5" in str(message["message"])
    # With nothing left to resume from, the run starts over and finishes.
    fresh = launch(tmp_path, ckpt, {"TORCHYARD_CHECKPOINT_INTERVAL": "5", "STEPS": "12"})
    assert isinstance(fresh, subprocess.CompletedProcess) and fresh.returncode == 0
    assert finals(tmp_path)[0]["resumed"] is None
