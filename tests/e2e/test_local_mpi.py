"""``torchyard run --local`` of an MPI TrainingRun (examples/mpi): the local mpirun starts
every rank on this machine; the ranks are Debian's python3 with python3-mpi4py (installed
by the harness, tests/cluster/debian.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster import debian
from tests.e2e.conftest import EXAMPLES, Local
from tests.shipped import lay_out

COMMAND = ["/usr/bin/python3", "-m", "mpi4py", "train.py", "--no_torch"]


@pytest.fixture(autouse=True)
def openmpi() -> None:
    debian.ensure_packages(debian.MPI_HOST_PACKAGES, log=False)


def test_every_mpi_rank_reports_its_rank_and_the_all_reduce_agrees(local: Local) -> None:
    path = local.write_run(EXAMPLES / "mpi" / "trainingrun.yaml", command=COMMAND)
    done = local.run(path, "--source", str(EXAMPLES / "mpi"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TrainingRun mpi succeeded" in done.stdout
    logs = local.archived_logs("mpi")
    assert sorted(logs) == [0, 1, 2, 3]  # logs/rank-<r>.txt, one per MPI rank
    for rank, text in logs.items():
        seen = json.loads(re.findall(r"^mpi-rank (.*)$", text, re.MULTILINE)[0])
        assert (seen["rank"], seen["size"]) == (rank, 4)
        assert seen["OMPI_COMM_WORLD_RANK"] == str(rank)
        assert seen["OMPI_COMM_WORLD_SIZE"] == "4"
        assert seen["TORCHYARD_OUTPUTS"].endswith("/outputs")
        assert f"allreduce rank {rank} of 4: 10" in text


def test_a_failing_mpi_rank_fails_the_run_naming_it(local: Local) -> None:
    path = local.write_run(
        EXAMPLES / "mpi" / "trainingrun.yaml", command=[*COMMAND, "--fail_rank", "3"]
    )
    done = local.run(path, "--source", str(EXAMPLES / "mpi"))
    assert done.returncode != 0
    assert "TrainingRun mpi failed" in done.stderr
    assert "rank 3 (node 1) failed (Error, exit code 1):" in done.stderr
    assert "RuntimeError: rank 3 failed on purpose" in done.stderr
    assert "failed on purpose" in local.archived_logs("mpi")[3]


def test_without_mpirun_local_mode_says_how_to_install_it(local: Local) -> None:
    path = local.write_run(EXAMPLES / "mpi" / "trainingrun.yaml", command=COMMAND)
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # no /usr/bin: no mpirun
    argv = [sys.executable, "-m", "torchyard", "run", str(path), "--local", "--source"]
    argv += [str(EXAMPLES / "mpi"), "--registry", str(local.registry)]
    argv += ["--workdir", str(local.workdir)]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=local.tmp,
    )
    assert done.returncode != 0
    assert "runs the local mpirun, and none is installed: apt-get install openmpi-bin" in (
        done.stderr
    )


# mpi4py ranks that use torchyard's helpers as a training script would: progress from every
# rank, each rank's state saved every 5 steps with torchyard.checkpoint (its rank comes from
# OMPI_COMM_WORLD_RANK), and resumed from the newest complete checkpoint.
STEPS = '''"""Every rank adds the all-reduce of the step to its total; progress and checkpoints."""
import json, os, sys
from mpi4py import MPI
from torchyard import checkpoint, progress

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
steps = int(sys.argv[1])
start, total = 0, 0
if checkpoint.resume_step() is not None:
    start = checkpoint.resume_step()
    with open(os.path.join(os.environ["TORCHYARD_RESUME_FROM"], f"rank-{rank}.json")) as f:
        total = json.load(f)["total"]
    print(f"rank {rank} resumed from step {start} with total {total}", flush=True)
for step in range(start + 1, steps + 1):
    total += comm.allreduce(step, op=MPI.SUM)
    progress.report(step, total=steps, value=total + rank)
    if step % 5 == 0:
        with open(os.path.join(checkpoint.save_dir(step), f"rank-{rank}.json"), "w") as f:
            json.dump({"total": total}, f)
        checkpoint.done(step)
print(f"rank {rank} total {total}", flush=True)
'''


def test_mpi_ranks_report_progress_and_checkpoint_and_a_rerun_resumes(local: Local) -> None:
    source = local.tmp / "steps"
    source.mkdir()
    (source / "steps.py").write_text(STEPS)
    # The shipped torchyard package, as a node Pod mounts it (the ranks are Debian's
    # python3, which has no torchyard installed): the launcher puts it on their PYTHONPATH.
    shipped = lay_out(local.tmp / "shipped")
    env = {**os.environ, "TORCHYARD_SHIPPED_PATH": str(shipped.parent)}
    folder = local.workdir / "checkpoints" / "default" / "mpi"

    def run(steps: int, *extra: str) -> subprocess.CompletedProcess[str]:
        command = ["/usr/bin/python3", "-m", "mpi4py", "steps.py", str(steps)]
        path = local.write_run(
            EXAMPLES / "mpi" / "trainingrun.yaml", command=command, checkpoints={"size": "1Gi"}
        )
        argv = [sys.executable, "-m", "torchyard", "run", str(path), "--local", "--source"]
        argv += [str(source), "--registry", str(local.registry), "--workdir", str(local.workdir)]
        argv += extra
        # Two runs (a first and a resumed one) within pytest's 600 s per test.
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=270, env=env, cwd=local.tmp
        )

    first = run(10)
    assert first.returncode == 0, first.stderr[-3000:]
    # every rank's total: 4 ranks x (1 + ... + 10); rank 0's last report wins the metrics
    assert "  progress: 10/10 100% (value=220)" in first.stdout, first.stdout
    records = local.registry / "default" / "runs" / "mpi" / "logs" / "node-0" / "metrics.jsonl"
    reported = [json.loads(line) for line in records.read_text().splitlines()]
    assert sorted({(r["rank"], r["step"]) for r in reported}) == [
        (rank, step) for rank in range(4) for step in range(1, 11)
    ]
    for step in (5, 10):  # node 0's launcher completed both: all four ranks said done
        complete = json.loads((folder / f"step-{step}" / "COMPLETE.json").read_text())
        assert (complete["step"], complete["worldSize"]) == (step, 4)
        assert sorted(f["name"] for f in complete["files"] if f["name"].endswith(".json")) == [
            f"rank-{r}.json" for r in range(4)
        ]

    # the first ended well: its rerun goes on from its checkpoints only when asked to
    second = run(15, "--resume")
    assert "resuming from step 10" in second.stdout + second.stderr
    assert second.returncode == 0, second.stderr[-3000:]
    # every rank went on from step 10 (OpenMPI 4.1 may put a line of one rank into the
    # tagged write of another, so the lines are looked for in all the ranks' logs)
    text = "".join(local.archived_logs("mpi").values())
    for rank in range(4):
        assert f"rank {rank} resumed from step 10 with total 220" in text, text
        assert f"rank {rank} total 480" in text  # 4 x (1 + ... + 15)
    reported = [json.loads(line) for line in records.read_text().splitlines()]
    assert sorted({(r["rank"], r["step"]) for r in reported}) == [
        (rank, step) for rank in range(4) for step in range(11, 16)
    ]
    assert "  progress: 15/15 100% (value=480)" in second.stdout, second.stdout
