"""Resuming is explicit, through ``torchyard run --local`` as a user runs it: an attempt
that did not finish (interrupted, failed) is resumed from and says so first, with the
checkpoints' folder; after one that succeeded the run starts fresh (its checkpoints set
aside); ``--fresh`` and ``--resume`` say otherwise. Ctrl-C stops the run, exits 130, says
how to go on, and the interrupted run is in ``runs list --local``. The decision's table:
tests/unit/local/test_attempts.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.unit.cli.local_project import checkpoint_folder, run_file, torchyard, user_env


def test_a_run_that_succeeded_starts_fresh_and_resume_or_fresh_say_otherwise(
    tmp_path: Path,
) -> None:
    home, path = tmp_path / "home", run_file(tmp_path / "project")
    folder = checkpoint_folder(home)
    first = torchyard(home, "run", str(path), "--local")
    assert first.returncode == 0, first.stderr
    assert f"checkpoints in {folder}: none yet, starting at step 0" in first.stderr
    assert "rank 0 starts at step 0" in first.stdout
    # again: the attempt before succeeded, so it starts over (not at its last step)
    again = torchyard(home, "run", str(path), "--local")
    assert again.returncode == 0, again.stderr
    said = again.stderr.split("\n", 3)[2]  # the first thing said after the run's line
    assert " succeeded: starting fresh at step 0; its checkpoints in " in said, again.stderr
    assert f"(up to step 3) move to {folder}.previous (--resume continues" in said
    assert "rank 0 starts at step 0" in again.stdout
    assert (folder.parent / "tiny.previous" / "step-3" / "COMPLETE.json").is_file()
    # --resume: from the newest checkpoint all the same (the ranks have nothing left to do)
    resumed = torchyard(home, "run", str(path), "--local", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from step 3 of the attempt at " in resumed.stderr
    assert "(succeeded); --fresh starts over" in resumed.stderr
    assert "rank 0 starts at step 3" in resumed.stdout
    fresh = torchyard(home, "run", str(path), "--local", "--fresh")
    assert fresh.returncode == 0, fresh.stderr
    assert "--fresh: starting over at step 0" in fresh.stderr
    assert "rank 0 starts at step 0" in fresh.stdout
    both = torchyard(home, "run", str(path), "--local", "--fresh", "--resume")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    assert both.stderr.startswith("usage: torchyard run "), both.stderr  # the command's usage


def test_a_failed_attempt_is_resumed_from_and_the_cli_exits_1_not_the_ranks_code(
    tmp_path: Path,
) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    failing = torchyard(home, "run", str(run_file(project, steps=5, fail_at=3)), "--local")
    assert failing.returncode == 1, failing.stderr
    assert "RuntimeError: failed on purpose at step 3" in failing.stderr
    fixed = torchyard(home, "run", str(run_file(project, steps=5)), "--local")
    assert fixed.returncode == 0, fixed.stderr
    assert "resuming from step 2 of the attempt at " in fixed.stderr
    assert "(failed); --fresh starts over (checkpoints in " in fixed.stderr
    assert "rank 0 starts at step 2" in fixed.stdout


def test_ctrl_c_stops_the_run_says_how_to_go_on_and_lists_it_then_it_resumes(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    path = run_file(tmp_path / "project", steps=400, pause=0.05)
    folder = checkpoint_folder(home)
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchyard", "run", str(path), "--local"],
        env=user_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(folder.glob("step-*/COMPLETE.json")):  # it has saved a checkpoint
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        _out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "[torchyard] interrupted: stopping every node" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("[torchyard] run it again to resume from step "), err
    assert f"(checkpoints in {folder}; --fresh starts over)" in last
    step = int(last.split("from step ")[1].split()[0])
    assert 1 <= step < 400
    # the interrupted run is listed, as finished and interrupted
    listed = torchyard(home, "runs", "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert "no kubeconfig" in listed.stderr and "reading the local registry" in listed.stderr
    [row] = json.loads(listed.stdout)["items"]
    assert (row["name"], row["phase"], row["failure"]) == ("tiny", "Failed", "Interrupted")
    described = torchyard(home, "describe", "tiny", "--local")
    assert "Interrupted" in described.stdout.split("Attempts:")[1].splitlines()[1]
    # and the next run resumes from where it was stopped, saying so first
    again = torchyard(home, "run", str(run_file(tmp_path / "project", steps=step + 2)), "--local")
    assert again.returncode == 0, again.stderr
    assert f"resuming from step {step} of the attempt at " in again.stderr
    assert "(interrupted); --fresh starts over" in again.stderr
    assert f"rank 0 starts at step {step}" in again.stdout
