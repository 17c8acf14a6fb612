"""One exit-code scheme and clean output, through the CLI as a user calls it: a run that
failed exits 1 whatever its rank's own code (2 would say bad input); a flag a command
does not have is refused with that command's usage; ``--phase`` in any case; a reader
that goes away (``| head``) gets no "Broken pipe"; every command says what it does
(``--help``); the scheme is the one the generated CLI reference shows."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.builders import TrainingRunBuilder
from tests.unit.cli.local_project import REPO, run_file, torchyard, user_env
from torchyard import cli
from torchyard.cli import errors


def test_a_failed_run_exits_1_and_its_ranks_own_code_is_in_the_output(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    body = TrainingRunBuilder("missing").procs(1).command("python", "no_such_file.py").obj()
    (project / "run.yaml").write_text(yaml.safe_dump(body))
    done = torchyard(tmp_path / "home", "run", str(project / "run.yaml"), "--local")
    assert done.returncode == errors.FAILED, done.stderr  # python's own code is 2
    assert "can't open file" in done.stderr
    assert "exit code 2" in done.stderr  # the rank's code, said


def test_a_reader_that_goes_away_gets_no_broken_pipe(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert (
        torchyard(
            home, "run", str(run_file(tmp_path / "p", checkpoints=False)), "--local"
        ).returncode
        == 0
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchyard", "runs", "list", "--local", "-o", "json"],
        env=user_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # as `| head` does once it has what it wants
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == errors.BROKEN_PIPE
    assert err == "", err


def test_phase_in_any_case_and_a_bad_flag_with_the_commands_usage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TORCHYARD_REGISTRY", str(tmp_path / "registry"))
    for phase in ("failed", "FAILED", "Failed"):
        assert cli.main(["runs", "list", "--local", "--phase", phase]) == 0
        assert "No runs found" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["runs", "list", "--local", "--phase", "done"])
    assert exit_.value.code == errors.BAD_INPUT
    assert "'done' is not a phase: Pending, Preparing" in capsys.readouterr().err
    for argv, usage in (
        (["models", "list", "--bogus"], "usage: torchyard models list "),
        (["run", "x.yaml", "--local", "--fast"], "usage: torchyard run "),
        (["sweep", "best", "hd", "--top", "3"], "usage: torchyard sweep best "),
    ):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == errors.BAD_INPUT
        err = capsys.readouterr().err
        assert err.startswith(usage), err
        assert "error: unrecognized arguments: " in err


def _commands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += [sub, *_commands(sub)]
    return found


def test_every_command_says_what_it_does_and_names_its_arguments() -> None:
    commands = _commands(cli.build_parser())
    assert len(commands) >= 30
    for command in commands:
        assert command.description, command.prog
        for action in command._actions:
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"{command.prog} {action.dest}"
    help_text = subprocess.run(
        [sys.executable, "-m", "torchyard", "logs", "--help"],
        env={"PYTHONPATH": str(REPO / "operator"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "A TrainingRun's logs, node by node" in help_text
    assert "--local" in help_text


def test_the_cli_reference_shows_the_exit_codes() -> None:
    page = (REPO / "docs" / "reference" / "cli.md").read_text()
    for code, meaning in errors.EXIT_CODES:
        assert f"| {code} | {meaning} |" in page
