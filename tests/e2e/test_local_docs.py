"""The first hour, as docs/getting-started/local.md and the how-to pages write it: every
shell block they show that runs on this machine alone (``tests.documented.is_local``:
``torchyard ... --local`` and ``validate``) runs here, in the pages' order, each command
as written (``.venv/bin/torchyard`` is this checkout's), in a copy of examples/ with a
home of its own (no kubeconfig: the read commands find the local registry themselves),
and each ends with exit code 0 and no traceback. That the commands and flags exist at all
is tests/unit/test_documented_commands.py; the SDK block (the guide's notebook with
``compute_target="local"``) runs in tests/e2e/test_guide_locally.py with fewer epochs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.documented import LOCAL_PAGES, ROOT, blocks, is_local

SDK_BLOCK = "train_locally.py"  # (tests/e2e/test_guide_locally.py runs it)


def test_every_local_block_of_the_first_hour_runs(tmp_path: Path) -> None:
    here = tmp_path / "checkout"
    shutil.copytree(ROOT / "examples", here / "examples", symlinks=True)
    (here / ".venv").mkdir()
    (here / ".venv" / "bin").symlink_to(Path(sys.executable).parent)
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
        },
        "HOME": str(tmp_path / "home"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    for name in ("TORCHYARD_REGISTRY", "TORCHYARD_LOCAL_RUNS", "TORCHYARD_REGISTRY_URL"):
        env.pop(name, None)
    ran = []
    for page in LOCAL_PAGES:
        for block in blocks(page):
            if not is_local(block) or any(SDK_BLOCK in line for line in block.lines):
                continue
            for line in block.lines:
                done = subprocess.run(
                    ["bash", "-c", line],
                    cwd=here,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=540,
                )
                said = f"{block.where}: `{line}` exit {done.returncode}\n{done.stderr[-3000:]}"
                assert done.returncode == 0, said
                assert "Traceback" not in done.stdout + done.stderr, said
                ran.append((block.where, line, done))
    pages = {where.split(":")[0] for where, _, _ in ran}
    assert pages == {
        "docs/getting-started/local.md",
        "docs/how-to/checkpoints.md",
        "docs/how-to/sweeps.md",
    }, pages
    said = {line: done for _, line, done in ran}
    # what the pages promise of these commands
    fresh = said[".venv/bin/torchyard run examples/linefit/trainingrun.yaml --local --fresh"]
    assert "--fresh: starting over at step 0" in fresh.stderr, fresh.stderr
    resumed = said[".venv/bin/torchyard run examples/linefit/trainingrun.yaml --local --resume"]
    assert "resuming from step 200 of the attempt at " in resumed.stderr, resumed.stderr
    listed = said[".venv/bin/torchyard runs list --local"]
    assert "linefit" in listed.stdout and "deleted" not in listed.stdout, listed.stdout
    best = said["torchyard sweep best linefit-lr --local"]
    assert best.stdout.startswith("linefit-lr-t2  loss "), best.stdout
    trials = said["torchyard runs list --local --experiment linefit-lr"].stdout
    assert "linefit-best:" in trials, trials
