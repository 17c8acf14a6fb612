"""``torchyard tensorboard``'s mistakes as the user reads them: a run or a sweep (one of
them), a TensorBoard that is not there, a local run that is not there or left no event
files; each an error line and an exit code, before any TensorBoard starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from torchyard.cli import app


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = app.main(["tensorboard", *argv])
    return code, capsys.readouterr().err


@pytest.fixture
def fake_tensorboard(tmp_path: Path) -> str:
    """A file that is an executable ``tensorboard`` for PATH lookups; the errors below all
    come before it would be started."""
    path = tmp_path / "bin" / "tensorboard"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\nexit 9\n")
    path.chmod(0o755)
    return str(path)


def local(tmp_path: Path, *argv: str) -> list[str]:
    return [
        *argv,
        "--local",
        "--registry",
        str(tmp_path / "reg"),
        "--workdir",
        str(tmp_path / "runs"),
    ]


@pytest.mark.parametrize("argv", [[], ["r", "--sweep", "s"]])
def test_a_run_or_a_sweep_is_named(
    capsys: pytest.CaptureFixture[str], argv: list[str], fake_tensorboard: str
) -> None:
    code, err = run_cli(capsys, *argv, "--tensorboard", fake_tensorboard, "--local")
    assert code == 2 and "name a run (RUN) or a sweep (--sweep NAME)" in err


def test_a_tensorboard_that_is_not_there_says_how_to_install_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("TORCHYARD_TENSORBOARD", raising=False)
    code, err = run_cli(capsys, *local(tmp_path, "r"))
    assert code == 1 and "no TensorBoard on PATH" in err and "torchyard[tensorboard]" in err
    code, err = run_cli(capsys, *local(tmp_path, "r"), "--tensorboard", str(tmp_path / "nope"))
    assert code == 1 and "no TensorBoard at" in err


def test_a_local_run_that_is_not_there_is_not_found(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fake_tensorboard: str
) -> None:
    code, err = run_cli(capsys, *local(tmp_path, "ghost"), "--tensorboard", fake_tensorboard)
    assert code == 1 and "no local run default/ghost" in err
    code, err = run_cli(
        capsys, *local(tmp_path), "--sweep", "ghost", "--tensorboard", fake_tensorboard
    )
    assert code == 1 and "no trials of a local Sweep default/ghost" in err


def test_an_ended_local_run_without_event_files_says_where_a_script_writes_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fake_tensorboard: str
) -> None:
    (tmp_path / "reg" / "default" / "runs" / "quiet" / "outputs").mkdir(parents=True)
    code, err = run_cli(
        capsys,
        *local(tmp_path, "quiet"),
        "--tensorboard",
        fake_tensorboard,
        "--folder",
        str(tmp_path / "kept"),
    )
    assert code == 1
    assert "no TensorBoard event files" in err and "$TORCHYARD_TENSORBOARD_DIR" in err
    assert not os.path.exists(tmp_path / "kept")  # nothing started, nothing made


@pytest.mark.parametrize(("option", "value"), [("--port", "70000"), ("--interval", "0")])
def test_bad_numbers_are_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        app.main(["tensorboard", "r", option, value])
    assert exited.value.code == 2 and option in capsys.readouterr().err
