"""The launcher in a working directory where it cannot create ./logs and ./outputs, as a
non-root user (``spec.runAsUser``) meets the root-owned working directory of an image
that holds the code (``source: {image: true}``): found on the real node
(tests/node/test_trainingruns.py). The ranks run, their logs and outputs go under the
temporary directory, and the launcher says why and what to do; only when that is not
writable either does it stop with a LaunchError that says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from torchyard.launch import main

LAUNCHER = Path(main.__file__)
CHILD = (
    "import os, pathlib\n"
    "out = pathlib.Path(os.environ['TORCHYARD_OUTPUTS'])\n"
    "(out / ('rank-' + os.environ['RANK'])).write_text('done')\n"
    "print('rank', os.environ['RANK'], 'wrote to', out)\n"
)


def launch(workdir: Path, tmpdir: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"],
        "TMPDIR": str(tmpdir),
        "TORCHYARD_NPROC_PER_NODE": "2",
        "NODE_RANK": "0",
        "WORLD_SIZE": "2",
        "TORCHYARD_TERMINATION_LOG": str(workdir.parent / "termination.json"),
    }
    return subprocess.run(
        [sys.executable, str(LAUNCHER), "--", sys.executable, "-c", CHILD],
        cwd=workdir,
        env=env,
        text=True,
        capture_output=True,
        timeout=60,
    )


def blocked_workdir(tmp_path: Path) -> Path:
    """A working directory where ./logs and ./outputs cannot be made folders (as any user,
    root included: the names are taken by files)."""
    workdir = tmp_path / "image-workdir"
    workdir.mkdir()
    for name in ("logs", "outputs"):
        (workdir / name).write_text("not a folder")
    return workdir


def test_logs_and_outputs_move_to_the_temporary_directory_and_the_launcher_says_why(
    tmp_path: Path,
) -> None:
    workdir = blocked_workdir(tmp_path)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    done = launch(workdir, tmpdir)
    assert done.returncode == 0, done.stderr
    moved = tmpdir / "torchyard"
    for rank in (0, 1):
        assert (moved / "outputs" / f"rank-{rank}").read_text() == "done"
        assert (
            f"rank {rank} wrote to {moved / 'outputs'}"
            in (moved / "logs" / f"rank-{rank}.txt").read_text()
        )
    for name in ("LOGS", "OUTPUTS"):
        assert f"TORCHYARD_{name}: cannot create {workdir / name.lower()}" in done.stderr
    assert f"using {moved / 'outputs'} instead" in done.stderr
    assert f"the working directory {workdir} is not writable by user {os.getuid()}" in (done.stderr)
    assert "write to $TORCHYARD_OUTPUTS" in done.stderr
    info = json.loads((tmp_path / "termination.json").read_text())
    assert (info["reason"], info["exitCode"]) == ("Completed", 0)


def test_with_no_writable_place_at_all_it_stops_with_a_clear_launch_error(
    tmp_path: Path,
) -> None:
    workdir = blocked_workdir(tmp_path)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    (tmpdir / "torchyard").write_text("taken as well")
    done = launch(workdir, tmpdir)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    info = json.loads((tmp_path / "termination.json").read_text())
    assert info["reason"] == "LaunchError"
    assert info["message"].startswith(f"cannot create TORCHYARD_LOGS {workdir / 'logs'} (")
    assert "spec.runAsUser" in info["message"]
    assert "source.configMap, source.git or a snapshot" in info["message"]
