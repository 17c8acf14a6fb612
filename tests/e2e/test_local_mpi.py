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
