"""No command shows a Python traceback for a user's mistake: every command that talks to
the Kubernetes API, run with a kubeconfig that is not there or a server that does not
answer, ends with one line, ``torchyard: error: cannot reach the Kubernetes API ...``,
and exit code 1; errors are printed in one place (``cli.app``)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.builders import TrainingRunBuilder
from torchyard import cli, k8s

REPO = Path(__file__).resolve().parents[3]
CLI = REPO / "operator" / "torchyard" / "cli"

# Every command that talks to the API (the registry ones through its service proxy).
COMMANDS = [
    ["get", "runs"],
    ["get", "envs"],
    ["get", "models"],
    ["get", "runs", "bert", "-o", "yaml"],
    ["describe", "bert"],
    ["wait", "bert", "--timeout", "60"],
    ["logs", "bert"],
    ["submit", "{run}"],
    ["submit", "{run}", "--wait"],
    ["models", "list"],
    ["models", "show", "birds:1"],
    ["models", "verify", "birds"],
    ["models", "download", "birds", "-o", "{tmp}/got"],
    ["runs", "download", "bert", "outputs/model.pt", "-o", "{tmp}/model.pt"],
    ["runs", "list"],
    ["runs", "list", "--all"],
    ["runs", "describe", "bert"],
]

UNREACHABLE = {
    "apiVersion": "v1",
    "kind": "Config",
    # Port 1 on loopback: nothing listens there, the connection is refused at once.
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
    "users": [{"name": "u", "user": {"token": "t"}}],
    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "team"}}],
    "current-context": "x",
}


@pytest.fixture
def run_file(tmp_path: Path) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(TrainingRunBuilder("bert").obj()))
    return path


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No in-cluster config, no registry URL, and a client configured afresh."""
    for name in ("KUBERNETES_SERVICE_HOST", "TORCHYARD_REGISTRY_URL", "TORCHYARD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    k8s.reset()
    yield
    k8s.reset()


def _argv(command: list[str], tmp_path: Path, run_file: Path) -> list[str]:
    return [a.format(run=run_file, tmp=tmp_path) for a in command]


# What $KUBECONFIG names (None: nothing there), and how the one line after
# "torchyard: error: cannot reach the Kubernetes API" goes on ({path}: that file).
KUBECONFIGS = {
    "missing": (None, ": Invalid kube-config file"),
    "not a kubeconfig": ("just some text\n", ": {path} is not a kubeconfig: "),
    "a server that does not answer": (yaml.safe_dump(UNREACHABLE), " at https://127.0.0.1:1: "),
}


@pytest.mark.parametrize("kubeconfig", KUBECONFIGS)
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_cluster_that_cannot_be_reached_is_one_clear_line(
    command: list[str],
    kubeconfig: str,
    tmp_path: Path,
    run_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text, goes_on = KUBECONFIGS[kubeconfig]
    path = tmp_path / "kubeconfig"
    if text is not None:
        path.write_text(text)
    monkeypatch.setenv("KUBECONFIG", str(path))
    assert cli.main(_argv(command, tmp_path, run_file)) == 1
    err = capsys.readouterr().err
    said = "torchyard: error: cannot reach the Kubernetes API" + goes_on.format(path=path)
    assert err.startswith(said) and len(err.splitlines()) == 1, err
    # the same advice from every command, the registry's (models, runs download) included
    assert err.rstrip().endswith("; check --kubeconfig and --context (or $KUBECONFIG), and "
                                 "that the cluster is up"), err  # fmt: skip


def test_the_command_prints_no_traceback(tmp_path: Path) -> None:
    """As a user runs it: a process, its whole standard error."""
    done = subprocess.run(
        [sys.executable, "-m", "torchyard", "get", "runs"],
        env={
            **{k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"},
            "KUBECONFIG": str(tmp_path / "no-such-kubeconfig"),
            "PYTHONPATH": str(REPO / "operator"),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "torchyard: error: cannot reach the Kubernetes API"
    ), done.stderr


def test_user_errors_keep_their_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Usage and input mistakes: 2, with what to do."""
    bad = TrainingRunBuilder("bad").procs(8).gpus(1).obj()
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert cli.main(["submit", str(path), "--dry-run", "-n", "team"]) == 2
    assert "torchyard: error: invalid resource: " in capsys.readouterr().err
    assert cli.main(["submit", str(tmp_path / "missing.yaml"), "--dry-run"]) == 2
    assert "torchyard: error: [Errno 2]" in capsys.readouterr().err
    assert cli.main(["run", str(path)]) == 2
    assert "needs --local" in capsys.readouterr().err
    empty = tmp_path / "empty.yaml"
    env = {"apiVersion": "torchyard.dev/v1alpha1", "kind": "Environment"}
    empty.write_text(yaml.safe_dump({**env, "metadata": {"name": "e"}, "spec": {"image": "x"}}))
    assert cli.main(["submit", str(empty), "--dry-run"]) == 2
    assert f"torchyard: error: no TrainingRun in {empty}" in capsys.readouterr().err


def test_errors_are_printed_in_one_place() -> None:
    printed = [
        (path.name, line.strip())
        for path in sorted(CLI.glob("*.py"))
        for line in path.read_text().splitlines()
        if re.search(r"""["']torchyard: error""", line)
    ]
    assert printed == [("app.py", 'print(f"torchyard: error: {error.message}", file=sys.stderr)')]


def test_the_package_init_is_only_the_face() -> None:
    source = (CLI / "__init__.py").read_text()
    assert len(source.splitlines()) <= 40
    tree = ast.parse(source)
    kinds = {type(node).__name__ for node in tree.body}
    assert kinds <= {"Expr", "ImportFrom", "Assign"}  # docstring, imports, __all__
    assert sorted(cli.__all__) == ["CliError", "build_parser", "main"]
    assert all(len(p.read_text().splitlines()) <= 400 for p in CLI.glob("*.py"))
