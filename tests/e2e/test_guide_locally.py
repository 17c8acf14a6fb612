"""The guide's notebook on this machine: examples/azureml/train_locally.py (the Azure ML
guide with ``compute_target="local"``, only its imports changed) run as a user runs it,
with no config.json and no kubeconfig, through local mode: 2 nodes x 2 processes of the
real birds training (CPU, gloo), ``wait_for_completion(show_output=True)``,
``get_metrics()``, ``register_model`` into the local registry, ``download_file``; and the
CLI's read commands see the run and the model. Kept CPU-light: the copy the test runs
trains 2 epochs on fewer images instead of 30 epochs (its one change)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from tests.e2e.conftest import EXAMPLES

GUIDE = EXAMPLES / "azureml" / "train_locally.py"
EPOCHS = '"--num_epochs", 30'
FEWER = '"--num_epochs", 2, "--pretrain_epochs", 1, "--images", 96'


def test_the_guides_notebook_runs_locally_with_only_its_imports_changed(tmp_path: Path) -> None:
    text = GUIDE.read_text()
    imports = [n for n in ast.parse(text).body if isinstance(n, ast.ImportFrom)]
    assert {n.module for n in imports} == {"torchyard.sdk"}
    assert text.count(EPOCHS) == 1
    project = tmp_path / "project"
    shutil.copytree(EXAMPLES / "azureml" / "pytorch-birds", project / "pytorch-birds")
    shutil.copy(EXAMPLES / "azureml" / "conda_dependencies.yml", project)
    (project / "train_locally.py").write_text(text.replace(EPOCHS, FEWER))
    home = tmp_path / "home"
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
        },
        "HOME": str(home),
    }
    for name in ("TORCHYARD_REGISTRY", "TORCHYARD_LOCAL_RUNS", "TORCHYARD_REGISTRY_URL"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "train_locally.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "no .torchyard/config.json or config.json in " in done.stderr
    # show_output: every rank's lines, then the outcome
    for rank in range(4):
        assert f"[rank {rank}] param-checksum rank {rank} " in done.stdout, done.stdout[-3000:]
    assert "succeeded on this machine" in done.stdout
    # get_metrics(): what rank 0 reported, epoch by epoch
    metrics = ast.literal_eval(done.stdout.split("succeeded on this machine\n")[1].splitlines()[0])
    assert len(metrics["loss"]) == 2 and len(metrics["val_accuracy"]) == 2, metrics
    assert "pytorch-birds\tpytorch-birds:1\t1" in done.stdout
    # register_model made version 1 in the local registry; download_file fetched it
    registry = home / ".torchyard" / "registry" / "default"
    [version] = (registry / "models" / "pytorch-birds").iterdir()
    assert (version / "model.pt").read_bytes() == (project / "model.pt").read_bytes()
    saved = torch.load(project / "model.pt", map_location="cpu")
    assert saved["classes"] and saved["state_dict"]
    # and the CLI sees the run and the model, with nothing but the defaults
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchyard",
            "runs",
            "list",
            "--experiment",
            "tutorial-pytorch-birds",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    row = listed.stdout.splitlines()[1].split()
    assert row[1:3] == ["Succeeded", "-"] and row[6] == "finished", listed.stdout
