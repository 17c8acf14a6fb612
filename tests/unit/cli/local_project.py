"""A user's folder for the CLI tests of local mode: a TrainingRun of one node and one
process (or as asked) running a small standard-library script that reports its steps
(``torchyard.progress``), saves a checkpoint at each (``torchyard.checkpoint``), writes
outputs/model.bin and can fail or be slow on purpose, and ``torchyard`` run as a process,
as a user runs it, with its own HOME, registry and runs folders (no kubeconfig)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

from tests.builders import TrainingRunBuilder

REPO = Path(__file__).resolve().parents[3]

TRAIN = textwrap.dedent(
    """
    import os, sys, time
    from torchyard import checkpoint, progress

    steps, pause, fail_at = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    start = checkpoint.resume_step() or 0
    print(f"rank {os.environ['RANK']} starts at step {start}", flush=True)
    for step in range(start, steps):
        time.sleep(pause)
        if step + 1 == fail_at:
            raise RuntimeError(f"failed on purpose at step {step + 1}")
        progress.report(step + 1, total=steps, loss=1.0 / (step + 1))
        if checkpoint.should_save(step + 1):
            folder = checkpoint.save_dir(step + 1)
            with open(os.path.join(folder, f"rank-{os.environ['RANK']}.txt"), "w") as f:
                f.write(str(step + 1))
            checkpoint.done(step + 1)
    os.makedirs("outputs", exist_ok=True)
    with open("outputs/model.bin", "w") as f:
        f.write("weights")
    print(f"rank {os.environ['RANK']} done", flush=True)
    """
)


def run_file(
    folder: Path,
    name: str = "tiny",
    *,
    steps: int = 3,
    pause: float = 0.0,
    fail_at: int = 0,
    nodes: int = 1,
    checkpoints: bool = True,
    register: str | None = None,
) -> Path:
    """``folder/<name>.yaml`` (and train.py beside it)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(TRAIN)
    run = TrainingRunBuilder(name).nodes(nodes).procs(1)
    run.command("python", "train.py", str(steps), str(pause), str(fail_at))
    if checkpoints:
        run.with_("spec.checkpoints", {"size": "1Gi", "interval": 1})
    if register:
        run.register(register, path="outputs/model.bin")
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(run.obj()))
    return path


def user_env(home: Path) -> dict[str, str]:
    """A user without a kubeconfig whose local mode keeps everything under ``home``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "TORCHYARD_REGISTRY_URL")
    }
    return {
        **env,
        "HOME": str(home),
        "TORCHYARD_REGISTRY": str(home / "registry"),
        "TORCHYARD_LOCAL_RUNS": str(home / "runs"),
        "PYTHONPATH": str(REPO / "operator"),
    }


def torchyard(home: Path, *argv: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``torchyard ARGV`` as a user runs it (a process), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "torchyard", *argv],
        env=user_env(home),
        capture_output=True,
        text=True,
        timeout=kw.pop("timeout", 240),
        **kw,
    )


def checkpoint_folder(home: Path, name: str = "tiny") -> Path:
    return home / "runs" / "checkpoints" / "default" / name
