"""The Environment builder is ONE module (``torchyard/envbuild.py``): the build Job's init
container runs ``python -m torchyard.envbuild --install <path>``, which copies that one
file, and the build container runs the copy alone, in a base image without torchyard."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torchyard.envbuild as envbuild
from tests.builders import environment
from torchyard import api
from torchyard.planning import environments

OPERATOR = Path(__file__).resolve().parents[3] / "operator"


def test_the_builder_is_a_single_module_not_a_package() -> None:
    assert not hasattr(envbuild, "__path__")
    assert Path(envbuild.__file__) == OPERATOR / "torchyard" / "envbuild.py"
    assert not (OPERATOR / "torchyard" / "envbuild").exists()


def test_the_planned_init_container_installs_the_file_the_build_container_runs(
    tmp_path: Path,
) -> None:
    env = api.parse_environment(
        environment(
            "e", baseImage="python:3.11-slim", pip=["six"], registry={"repository": "reg/envs"}
        )
    )
    pod = environments.build_job(env, environments.content_hash(env))["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    [build] = pod["containers"]
    copied = tmp_path / "torchyard" / "envbuild.py"
    # the init container's command, on this machine: torchyard importable, python -m
    init_cmd = [sys.executable, *init["command"][1:]]
    assert init_cmd[1:4] == ["-m", "torchyard.envbuild", "--install"]
    init_cmd = [str(copied) if a == build["command"][1] else a for a in init_cmd]
    done = subprocess.run(
        init_cmd,
        env={**os.environ, "PYTHONPATH": str(OPERATOR)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert copied.read_bytes() == Path(envbuild.__file__).read_bytes()
    # the build container's: the copy alone (-I: no PYTHONPATH, no site-packages)
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    alone = subprocess.run(
        [sys.executable, "-I", str(copied), "--help"],
        cwd=empty,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert alone.returncode == 0, alone.stderr
    assert "--base" in alone.stdout and "--target" in alone.stdout
