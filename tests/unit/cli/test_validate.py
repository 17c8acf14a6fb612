"""``torchyard validate`` is strict and says what ``run --local``, ``submit --dry-run``
and ``sweep submit`` say of the same file, with the same exit code (2): a kind or version
of the torchyard.dev group that does not exist, a Sweep the sweeps core refuses, an empty
file, and a typo named with the nearest field. Documents of other groups are skipped."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import SweepBuilder, TrainingRunBuilder, environment
from torchyard import cli


def run() -> TrainingRunBuilder:
    return TrainingRunBuilder("ddp").nodes(2).procs(2)


def typo(body: dict[str, Any]) -> dict[str, Any]:
    dist = body["spec"]["distribution"]
    dist["processCountPerNod"] = dist.pop("processCountPerNode")
    return body


def sweep_typo(body: dict[str, Any]) -> dict[str, Any]:
    body["spec"]["trial"]["distribution"] = {"nodeCont": 2}
    return body


# (what is wrong, the documents, what the one error line says after "invalid resource: ")
BAD: list[tuple[str, Callable[[], list[Any]], str]] = [
    (
        "unknown kind",
        lambda: [{**run().obj(), "kind": "TrainRun"}],
        "TrainRun/ddp: kind: TrainRun is not a kind of torchyard.dev/v1alpha1 (did you mean "
        "TrainingRun?)",
    ),
    (
        "unknown version",
        lambda: [{**run().obj(), "apiVersion": "torchyard.dev/v1"}],
        "TrainingRun/ddp: apiVersion: torchyard.dev/v1 is not served: torchyard's resources "
        "are torchyard.dev/v1alpha1",
    ),
    (
        "a typo",
        lambda: [typo(run().obj())],
        "TrainingRun/ddp: spec.distribution.processCountPerNod: not a field of this object "
        "(did you mean processCountPerNode?)",
    ),
    (
        "a typo in a sweep's trial",
        lambda: [sweep_typo(SweepBuilder("hd").obj())],
        "Sweep/hd: spec.trial.distribution.nodeCont: not a field of this object (did you mean "
        "nodeCount?)",
    ),
    (
        "a sweep the sweeps core refuses",
        lambda: [SweepBuilder("hd").grid().obj()],
        "Sweep/hd: spec.parameters.learning_rate: grid sampling takes only choice expressions",
    ),
    (
        "a run that asks for more processes than GPUs",
        lambda: [run().gpus(1).obj()],
        "TrainingRun/ddp: spec: ",
    ),
]


def write(tmp_path: Path, docs: list[Any]) -> Path:
    path = tmp_path / "file.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if "error" in line]


@pytest.mark.parametrize(("what", "docs", "said"), BAD, ids=[b[0] for b in BAD])
def test_validate_refuses_what_the_run_path_refuses_with_the_same_words_and_code(
    what: str,
    docs: Callable[[], list[Any]],
    said: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write(tmp_path, docs())
    assert cli.main(["validate", str(path)]) == 2
    [line] = error_lines(capsys)
    assert line.startswith(f"torchyard: error: invalid resource: {said}"), line
    kind = docs()[0]["kind"]
    others = [["submit", str(path), "--dry-run", "-n", "team"], ["run", str(path), "--local"]]
    if kind == "Sweep":
        others = [["sweep", "submit", str(path), "--dry-run", "-n", "team"]]
        others.append(["sweep", "submit", str(path), "--local"])
    for argv in others:
        assert cli.main(argv) == 2, argv
        assert error_lines(capsys) == [line], argv


def test_every_invalid_document_is_named_and_the_valid_ones_and_others_are_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}
    docs = [
        namespace,
        run().obj(),
        environment("pytorch"),
        typo(run().obj()),
        SweepBuilder("hd").obj(),
    ]
    docs[3]["metadata"]["name"] = "other"
    path = write(tmp_path, docs)
    assert cli.main(["validate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "Namespace/team: skipped (v1: not a torchyard.dev resource)",
        "TrainingRun/ddp: valid",
        "Environment/pytorch: valid",
        "Sweep/hd: valid",
    ]
    assert err.splitlines() == [
        "torchyard: error: invalid resource: TrainingRun/other: spec.distribution."
        "processCountPerNod: not a field of this object (did you mean processCountPerNode?)"
    ]


@pytest.mark.parametrize("text", ["", "\n---\n", "# only a comment\n"])
def test_an_empty_file_is_an_error_for_every_command(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    for argv in (
        ["validate", str(path)],
        ["run", str(path), "--local"],
        ["submit", str(path), "--dry-run", "-n", "team"],
        ["sweep", "submit", str(path), "--dry-run", "-n", "team"],
    ):
        assert cli.main(argv) == 2, argv
        assert error_lines(capsys) == [
            f"torchyard: error: {path} holds no resource (no YAML document in it)"
        ], argv
