"""The ddp example with spec.checkpoints in local mode (real PyTorch, gloo on CPU): a second
execution of the run resumes every rank from the newest complete checkpoint and ends with
exactly the weights of a run that was never stopped."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from tests.e2e.conftest import EXAMPLES, Local
from tests.processes import as_from_a_terminal, working_in
from torchyard import checkpoint


def ddp_run(local: Local, name: str, steps: int, checkpoints: dict[str, Any] | None) -> Path:
    docs = list(yaml.safe_load_all((EXAMPLES / "ddp" / "trainingrun.yaml").read_text()))
    run = next(d for d in docs if d["kind"] == "TrainingRun")
    run["metadata"]["name"] = name
    run["spec"]["command"] = ["python", "train.py", "--steps", str(steps)]
    if checkpoints is not None:
        run["spec"]["checkpoints"] = checkpoints
    path = local.tmp / f"{name}-{steps}.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def model(local: Local, name: str) -> dict[str, torch.Tensor]:
    path = local.registry / "default" / "runs" / name / "outputs" / "model.pt"
    state: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return state


def test_ddp_resumes_from_its_checkpoint_and_matches_the_uninterrupted_run(local: Local) -> None:
    source = ("--source", str(EXAMPLES / "ddp"))
    spec = {"size": "1Gi", "interval": 10, "keep": 2}
    first = local.run(ddp_run(local, "resumed", 20, spec), *source)
    assert first.returncode == 0, first.stderr[-3000:]
    folder = local.workdir / "checkpoints" / "default" / "resumed"
    assert sorted(p.name for p in folder.glob("step-*")) == ["step-10", "step-20"]
    assert all((folder / "step-20" / f"rank-{r}.pt").is_file() for r in range(4))

    # the first ended well: its rerun goes on from its checkpoints only when asked to
    second = local.run(ddp_run(local, "resumed", 30, spec), *source, "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    logs = local.archived_logs("resumed")
    assert all(f"rank {r} resumed from step 20" in logs[r] for r in range(4)), logs

    reference = local.run(ddp_run(local, "straight", 30, None), *source)
    assert reference.returncode == 0, reference.stderr[-3000:]
    resumed, straight = model(local, "resumed"), model(local, "straight")
    assert resumed.keys() == straight.keys()
    for key in straight:
        assert torch.allclose(resumed[key], straight[key], atol=1e-6), key


def birds_run(local: Local, name: str, epochs: int, checkpoints: dict[str, Any] | None) -> Path:
    docs = list(yaml.safe_load_all((EXAMPLES / "birds" / "trainingrun.yaml").read_text()))
    run = next(d for d in docs if d["kind"] == "TrainingRun")
    run["metadata"]["name"] = name
    run["spec"]["command"] = [
        "python", "pytorch_train.py", "--num_epochs", str(epochs), "--pretrain_epochs", "1",
        "--images", "80",
    ]  # fmt: skip
    run["spec"]["distribution"] = {"nodeCount": 1, "processCountPerNode": 2}
    run["spec"].pop("outputs", None)
    if checkpoints is not None:
        run["spec"]["checkpoints"] = checkpoints
    path = local.tmp / f"{name}-{epochs}.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def test_birds_resumes_after_its_last_epoch_and_matches_the_uninterrupted_run(
    local: Local,
) -> None:
    source = ("--source", str(EXAMPLES / "birds"))
    spec = {"size": "1Gi", "interval": 1}
    first = local.run(birds_run(local, "birds-resumed", 2, spec), *source)
    assert first.returncode == 0, first.stderr[-3000:]
    second = local.run(birds_run(local, "birds-resumed", 3, spec), *source, "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    logs = local.archived_logs("birds-resumed")
    assert all("resumed after epoch 3" in logs[r] for r in (0, 1)), logs
    assert "finetune epoch 1/3" not in logs[0] and "finetune epoch 3/3" in logs[0]
    straight = local.run(birds_run(local, "birds-straight", 3, None), *source)
    assert straight.returncode == 0, straight.stderr[-3000:]
    checksums = [
        re.findall(r"param-checksum rank 0 (\w+)", local.archived_logs(name)[0])
        for name in ("birds-resumed", "birds-straight")
    ]
    assert checksums[0] and checksums[0] == checksums[1]


def test_ctrl_c_saves_the_ddp_run_just_in_time_and_the_next_execution_resumes_there(
    local: Local,
) -> None:
    """``torchyard run --local`` of the ddp example (2 nodes x 2 ranks, real PyTorch),
    interrupted by Ctrl-C (SIGINT): every rank saves at one step after the highest reported,
    and running the same spec again resumes every rank there and ends with exactly the
    weights of a run that was never stopped."""
    source = ("--source", str(EXAMPLES / "ddp"))
    spec = {"size": "1Gi", "interval": 1_000_000}  # only the just-in-time save
    path = ddp_run(local, "interrupted", 1_000_000, spec)
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchyard", "run", str(path), "--local", "--registry",
         str(local.registry), "--workdir", str(local.workdir), *source],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=local.tmp,
        preexec_fn=as_from_a_terminal,
    )  # fmt: skip
    folder = local.workdir / "checkpoints" / "default" / "interrupted"
    deadline = time.monotonic() + 300
    while True:
        reported = checkpoint.reported(str(folder)) if folder.is_dir() else {}
        if len(reported) == 4 and min(reported.values()) >= 20:
            break
        assert time.monotonic() < deadline and proc.poll() is None, "no step reported"
        time.sleep(0.05)
    at_interrupt = max(checkpoint.reported(str(folder)).values())
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGINT, stderr[-3000:]
    assert working_in(local.workdir) == []
    assert "every rank saves a checkpoint at step" in stderr, stderr[-3000:]
    saved = checkpoint.complete_steps(str(folder))
    assert len(saved) == 1 and saved[0] > at_interrupt, (saved, at_interrupt, stderr[-3000:])
    step = saved[0]

    time.sleep(1.1)  # the next execution's folder gets another timestamp
    again = local.run(ddp_run(local, "interrupted", step + 10, spec), *source)
    assert again.returncode == 0, again.stderr[-3000:]
    logs = local.archived_logs("interrupted")
    assert all(f"rank {r} resumed from step {step}" in logs[r] for r in range(4)), logs
    straight = local.run(ddp_run(local, "never-stopped", step + 10, None), *source)
    assert straight.returncode == 0, straight.stderr[-3000:]
    resumed, reference = model(local, "interrupted"), model(local, "never-stopped")
    assert resumed.keys() == reference.keys()
    for key in reference:
        assert torch.allclose(resumed[key], reference[key], atol=1e-6), key
