"""Hangs in real PyTorch (CPU, gloo), through ``torchyard run --local``: a rank that skips
an ``all_reduce`` runs one collective ahead and waits in the barrier after its loop while
the others block in their last ``all_reduce``; the stall names it (not a rank that only
waits for it) with its file:line, and every rank's stacks are archived. The naming rules
are tested in tests/unit/launcher/test_stalls.py."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.e2e.conftest import Local

SKIPS = """\
import os, time
from datetime import timedelta
import torch
import torch.distributed as dist
from torchyard import progress
dist.init_process_group("gloo", timeout=timedelta(seconds=600))
rank = dist.get_rank()
t = torch.ones(4)
for step in range(1, 9):
    if not (rank == 1 and step == 3):  # rank 1 skips one all_reduce
        dist.all_reduce(t)
    progress.report(step, total=8)
    time.sleep(0.3)
dist.barrier()
"""


def write(local: Local, script: str, procs: int) -> Path:
    source = local.tmp / "src"
    source.mkdir(exist_ok=True)
    (source / "train.py").write_text(script)
    run = {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "hangs"},
        "spec": {
            "environment": "pytorch-cpu",
            "source": {"configMap": "hangs-src"},
            "command": ["python", "train.py"],
            "distribution": {"nodeCount": 1, "processCountPerNode": procs, "launch": "process"},
            "policy": {"stallTimeoutSeconds": 8},
        },
    }
    path = local.tmp / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    return path


def test_a_rank_that_skips_an_all_reduce_is_named_where_it_waits(local: Local) -> None:
    done = local.run(write(local, SKIPS, 3), "--source", str(local.tmp / "src"))
    assert done.returncode != 0
    assert "rank 1 (node 0) failed (Stalled" in done.stderr, done.stderr
    # where in the script (dist.barrier()), and the collective it waits in
    assert "train.py:14 in <module> (in torch.distributed barrier)" in done.stderr, done.stderr
    stacks = local.registry / "default" / "runs" / "hangs" / "logs" / "node-0" / "stacks"
    dumped = sorted(p.name.split(".")[0] for p in stacks.glob("rank-*.txt"))
    assert dumped == ["rank-0", "rank-1", "rank-2"], dumped
    for rank in (0, 2):  # the others wait in their last all_reduce
        text = next(stacks.glob(f"rank-{rank}.*.txt")).read_text()
        assert 'train.py", line 11' in text, text


SLEEPS = """\
import os, time
from datetime import timedelta
import torch
import torch.distributed as dist
from torchyard import progress
dist.init_process_group("gloo", timeout=timedelta(seconds=600))
rank = dist.get_rank()
t = torch.ones(4)
for step in range(1, 9):
    if rank == 1 and step == 3:
        time.sleep(3600)
    dist.all_reduce(t)
    progress.report(step, total=8)
    time.sleep(0.3)
"""


def test_under_launch_node_the_launcher_finds_torchruns_ranks_and_names_the_stuck_one(
    local: Local,
) -> None:
    path = local.under_torchrun(write(local, SLEEPS, 3))
    done = local.run(path, "--source", str(local.tmp / "src"))
    assert done.returncode != 0
    assert "rank 1 (node 0) failed (Stalled" in done.stderr, done.stderr
    assert "train.py:11 in <module>" in done.stderr, done.stderr  # time.sleep(3600)
    stacks = local.registry / "default" / "runs" / "hangs" / "logs" / "node-0" / "stacks"
    dumped = sorted(p.name.split(".")[0] for p in stacks.glob("rank-*.txt"))
    assert dumped == ["rank-0", "rank-1", "rank-2"], dumped
    for rank in (0, 2):  # the others wait in the all_reduce
        text = next(stacks.glob(f"rank-{rank}.*.txt")).read_text()
        assert 'train.py", line 12' in text, text
