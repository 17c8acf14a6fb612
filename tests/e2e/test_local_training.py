"""Real PyTorch training (CPU, gloo) through the launcher and local mode, exactly as
`make demo` runs it: the same TrainingRun YAML a cluster gets."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import torch

from tests.e2e.conftest import EXAMPLES, Local
from torchyard.registry import Store


def test_birds_trains_on_two_nodes_of_two_processes(local: Local) -> None:
    done = local.run(EXAMPLES / "birds" / "trainingrun.yaml")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TrainingRun pytorch-birds succeeded" in done.stdout

    # Every one of the 4 ranks trained and they ended with identical parameters.
    logs = local.archived_logs("pytorch-birds")
    assert sorted(logs) == [0, 1, 2, 3]
    sums = {
        r: re.findall(r"param-checksum rank \d+ ([0-9a-f]{64})", text) for r, text in logs.items()
    }
    assert all(len(s) == 1 for s in sums.values()), sums
    assert len({s[0] for s in sums.values()}) == 1, f"ranks diverged: {sums}"

    # The loss fell and the classifier learned something.
    archive = local.registry / "default" / "runs" / "pytorch-birds" / "outputs"
    history = json.loads((archive / "history.json").read_text())
    assert history[-1]["loss"] < 0.85 * history[0]["loss"], history
    assert history[-1]["val_accuracy"] > 0.7

    # The model was registered as version 1, verified, and loads.
    version = Store(local.registry).get("default", "pytorch-birds")
    assert version.version == 1
    assert Store(local.registry).verify(version) == []
    assert {f["path"] for f in version.manifest["files"]} >= {
        "model.pt",
        "model.onnx",
        "metrics.json",
    }
    assert version.manifest["run"]["name"] == "pytorch-birds"
    assert version.manifest["nodeCount"] == 2
    assert version.manifest["metrics"]["world_size"] == 4
    checkpoint = torch.load(version.path / "model.pt", weights_only=True)
    assert checkpoint["classes"] == ["chicken", "turkey"]
    assert checkpoint["state_dict"]["head.weight"].shape == (2, 64)


def test_failing_rank_fails_the_run_naming_rank_and_exception(local: Local) -> None:
    path = local.write_run(
        EXAMPLES / "ddp" / "trainingrun.yaml", command=["python", "train.py", "--fail_rank", "3"]
    )
    done = local.run(path, "--source", str(EXAMPLES / "ddp"))
    assert done.returncode != 0
    assert "TrainingRun ddp failed" in done.stderr
    assert "rank 3 (node 1) failed (Error, exit code 1):" in done.stderr
    assert "RuntimeError: rank 3 failed on purpose: loss became NaN at step 10" in done.stderr
    # Logs of failed runs are archived too.
    assert "failed on purpose" in local.archived_logs("ddp")[3]


def test_every_rank_sees_the_documented_contract(local: Local) -> None:
    done = local.run(EXAMPLES / "ddp" / "trainingrun.yaml")
    assert done.returncode == 0, done.stderr[-3000:]
    contracts = sorted(local.contracts("ddp"), key=lambda c: int(c["RANK"]))
    assert [int(c["RANK"]) for c in contracts] == [0, 1, 2, 3]
    port = contracts[0]["MASTER_PORT"]
    for rank, c in enumerate(contracts):
        node = rank // 2
        assert c["MASTER_ADDR"] == c["PET_MASTER_ADDR"] == "127.0.0.1"
        assert c["MASTER_PORT"] == c["PET_MASTER_PORT"] == port
        assert c["WORLD_SIZE"] == "4"
        assert c["LOCAL_RANK"] == str(rank % 2)
        assert c["NODE_RANK"] == c["GROUP_RANK"] == c["PET_NODE_RANK"] == str(node)
        assert c["LOCAL_WORLD_SIZE"] == c["PET_NPROC_PER_NODE"] == "2"
        assert c["PET_NNODES"] == "2"
        assert c["TORCHYARD_OUTPUTS"].endswith(f"node-{node}/outputs")
        assert c["TORCHYARD_LOGS"].endswith(f"node-{node}/logs")


def test_torchrun_per_node_launch(local: Local) -> None:
    done = local.run(EXAMPLES / "torchrun" / "trainingrun.yaml")
    assert done.returncode == 0, done.stderr[-3000:]
    contracts = local.contracts("torchrun")
    # torchrun started 2 workers per node and gave them ranks 0..3 from PET_*.
    assert sorted(int(c["RANK"]) for c in contracts) == [0, 1, 2, 3]
    assert {c["PET_NNODES"] for c in contracts} == {"2"}
    assert sorted(c["NODE_RANK"] for c in contracts) == ["0", "0", "1", "1"]


def test_source_dot_beside_workdir_runs_twice_without_copying_itself(local: Local) -> None:
    """As a new user would: the ddp example in a folder of its own, ``--source .`` and
    ``--workdir ./runs`` (and the registry) inside it. The second run copies the code only,
    not the first run, and a relative --workdir works (node folders are absolute)."""
    project = local.tmp / "project"
    shutil.copytree(EXAMPLES / "ddp", project)
    argv = [sys.executable, "-m", "torchyard", "run", "trainingrun.yaml", "--local"]
    argv += ["--source", ".", "--workdir", "./runs", "--registry", "./registry"]
    for _ in range(2):  # each within half of pytest's 600 s per test
        done = subprocess.run(argv, cwd=project, capture_output=True, text=True, timeout=270)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "left out registry/, runs/" in done.stderr
    runs = sorted((project / "runs").iterdir())
    assert len(runs) == 2
    for run in runs:
        for node in ("node-0", "node-1"):
            code = sorted(
                p.relative_to(run / node).as_posix()
                for p in (run / node).rglob("*")
                if p.is_file() and p.parts[len((run / node).parts)] not in ("outputs", "logs")
            )
            assert code == ["termination-log.json", "train.py", "trainingrun.yaml"], run
            assert len(list((run / node / "logs").glob("rank-*.txt"))) == 2
