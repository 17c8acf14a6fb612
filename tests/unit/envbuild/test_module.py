"""The Environment builder is ONE module (``torchyard/envbuild.py``): the build Job's init
container runs ``python -m torchyard.envbuild --install <path>``, which copies that one
file and the launch contract it reads its variables' names from beside it, and the build
container runs the copy, in a base image without torchyard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torchyard.envbuild as envbuild
from tests.builders import environment
from torchyard import api
from torchyard.launch import contract
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
    beside = copied.parent / envbuild.CONTRACT_COPY
    assert beside.read_bytes() == Path(contract.__file__).read_bytes()
    assert sorted(p.name for p in copied.parent.iterdir()) == sorted([copied.name, beside.name])
    # the build container's: the copies alone (-I: no PYTHONPATH, no site-packages), its
    # variables read by the contract's names: a termination log named by the variable
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
    log = tmp_path / "termination.json"
    failed = subprocess.run(
        [sys.executable, "-I", str(copied), "--base", "b", "--target", "t", "--env", "NOEQUALS"],
        cwd=empty,
        env={"PATH": os.environ["PATH"], contract.TORCHYARD_TERMINATION_LOG: str(log)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert failed.returncode == 1, failed.stderr
    assert "--env must be KEY=VALUE" in json.loads(log.read_text())["error"]


def test_without_its_copy_the_builder_reads_the_installed_contract() -> None:
    assert not (Path(envbuild.__file__).parent / envbuild.CONTRACT_COPY).exists()
    assert envbuild.names is contract
