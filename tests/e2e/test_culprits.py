"""Who broke a DDP run in local mode (2 nodes x 2 processes, real torch, gloo), decided as
the operator decides for node Pods: a rank that leaves with status 0 while the others
train is named (EarlyExit), not the rank that lost it; a rank stuck in C while holding the
GIL is named with its line, not a rank that waits for it inside ``loss.backward()``, under
``launch: process`` and under a bare ``torchrun`` (``launch: node``: the dependency
environment's script, whose workers import torchyard from the launcher). The scripts are
tests/faults.py's; benchmarks/why_matrix.py runs every fault and shape."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import Local
from tests.faults import AT, script


def write(local: Local, fault: str, victim: int) -> Path:
    source = local.tmp / "src"
    source.mkdir(exist_ok=True)
    (source / "train.py").write_text(script(fault, "ddp", victim))
    run = {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "culprits"},
        "spec": {
            "environment": "pytorch-cpu",
            "source": {"configMap": "culprits-src"},
            "command": ["python", "train.py"],
            "distribution": {"nodeCount": 2, "processCountPerNode": 2, "launch": "process"},
            "policy": {"stallTimeoutSeconds": 10},
        },
    }
    path = local.tmp / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    return path


@pytest.mark.parametrize("victim", [1, 3])  # on node 0, or on node 1
def test_a_rank_that_exits_0_while_the_others_train_is_named(local: Local, victim: int) -> None:
    done = local.run(write(local, "exit0", victim), "--source", str(local.tmp / "src"))
    assert done.returncode != 0
    node = victim // 2
    assert (
        f"rank {victim} (node {node}) failed (EarlyExit, exit code 0):\n"
        f"rank {victim} (node {node}) exited with status 0 at step {AT - 1} while the other "
        "ranks still trained; " in done.stderr
    ), done.stderr
    assert "class: EarlyExit (not retryable)" in done.stderr, done.stderr


def test_a_rank_stuck_in_c_holding_the_gil_is_named_not_a_rank_in_backward(local: Local) -> None:
    done = local.run(write(local, "gil", 1), "--source", str(local.tmp / "src"))
    assert done.returncode != 0
    lines = script("gil", "ddp", 1).splitlines()
    line = next(n for n, text in enumerate(lines, 1) if "ctypes.PyDLL(None).sleep" in text)
    assert "rank 1 (node 0) failed (Stalled" in done.stderr, done.stderr
    assert f"stuck at train.py:{line} in <module>" in done.stderr, done.stderr
    assert "made no progress for 0s" not in done.stderr, done.stderr
    # the others were seen waiting in backward: the gradient all-reduce
    assert "(waiting in backward: the gradient all-reduce)" in done.stderr, done.stderr


def test_under_a_bare_torchrun_a_rank_stuck_holding_the_gil_is_named_in_time(
    local: Local,
) -> None:
    path = local.under_torchrun(write(local, "gil", 1))
    done = local.run(path, "--source", str(local.tmp / "src"))
    assert done.returncode != 0
    assert "ModuleNotFoundError" not in done.stderr, done.stderr
    assert "rank 1 (node 0) failed (Stalled" in done.stderr, done.stderr
    lines = script("gil", "torchrun", 1).splitlines()
    line = next(n for n, text in enumerate(lines, 1) if "ctypes.PyDLL(None).sleep" in text)
    assert f"stuck at train.py:{line} in <module>" in done.stderr, done.stderr
    # found stallTimeoutSeconds (10) after its last progress, give or take the checks' pace
    quiet = re.search(r"rank 1 made no progress for (\d+)s", done.stderr)
    assert quiet and 10 <= int(quiet.group(1)) <= 10 + 30, done.stderr
