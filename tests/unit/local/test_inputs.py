"""Local mode's inputs: ``torchyard run --local`` fetches each input into this machine's
cache under the cluster's keys before the launchers start, the script reads it through
``$TORCHYARD_INPUT_<NAME>`` in its arguments, a second run fetches nothing, a model://
input comes from the local registry (an s3:// input from a real S3 store:
tests/integration/test_s3_store.py), an hf:// input through huggingface_hub from a stand-in hub
(HF_ENDPOINT) with the shell's token, and a bad input stops the run naming it. The runs
are real launcher processes over tiny scripts; the web input is served by a local HTTP
server the test starts."""

from __future__ import annotations

import hashlib
import os
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.builders import TrainingRunBuilder
from tests.cluster import hub as hub_server
from tests.unit.inputs import server
from tests.unit.inputs.server import Files, serving
from torchyard import api, cli
from torchyard.inputs import archives, cache
from torchyard.planning import inputs as planned

READS_ITS_INPUTS = textwrap.dedent(
    """
    import os, sys
    os.makedirs("outputs", exist_ok=True)
    found = []
    for root in sys.argv[1:]:
        for folder, _, names in sorted(os.walk(root)):
            for name in sorted(names):
                path = os.path.join(folder, name)
                found.append(os.path.relpath(path, root) + "=" + open(path).read())
    with open("outputs/seen.txt", "w") as f:
        f.write("\\n".join(found))
    """
)


def web_input(name: str, uri: str, body: bytes, *include: str) -> dict[str, object]:
    """An https input of ``body`` at ``uri``, with its sha256 and ``include`` patterns."""
    spec: dict[str, object] = {"name": name, "uri": uri, "sha256": hashlib.sha256(body).hexdigest()}
    if include:
        spec["include"] = list(include)
    return spec


def project(root: Path, inputs: list[dict[str, object]], args: list[str]) -> Path:
    body = (
        TrainingRunBuilder("birds")
        .nodes(1)
        .procs(1)
        .with_("spec.command", ["python", "train.py", *args])
        .with_("spec.inputs", inputs)
        .obj()
    )
    (root / "run.yaml").write_text(yaml.safe_dump(body))
    (root / "train.py").write_text(READS_ITS_INPUTS)
    return root


def local_argv(tmp_path: Path) -> list[str]:
    """``torchyard run run.yaml --local`` with its runs and registry under ``tmp_path``."""
    runs, registry = str(tmp_path / "runs"), str(tmp_path / "registry")
    return ["run", "run.yaml", "--local", "--workdir", runs, "--registry", registry]


def seen(workroot: Path) -> list[str]:
    [run] = sorted(workroot.iterdir())[-1:]
    return (run / "node-0" / "outputs" / "seen.txt").read_text().splitlines()


def test_a_web_input_is_fetched_once_and_named_in_the_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    body = server.archive(".tgz", {"birds/a.jpg": b"A", "birds/notes.txt": b"N"})
    state = Files({"/birds.tgz": body})
    monkeypatch.setenv("TORCHYARD_INPUTS_CACHE", str(tmp_path / "cache"))
    with serving(state) as url:
        spec = web_input("birds", f"{url}/birds.tgz", body, "*.jpg")
        (tmp_path / "src").mkdir()
        src = project(tmp_path / "src", [spec], ["$TORCHYARD_INPUT_BIRDS"])
        argv = local_argv(tmp_path)
        monkeypatch.chdir(src)
        assert cli.main(argv) == 0
        assert seen(tmp_path / "runs") == ["birds/a.jpg=A"]
        sent = state.sent
        assert sent == len(body)
        assert cli.main(argv) == 0
        assert state.sent == sent, "the second run fetched nothing"
    assert "input birds: 1 bytes ready (0 fetched)" in capsys.readouterr().err
    run = api.parse_trainingrun(yaml.safe_load((src / "run.yaml").read_text()))
    key = planned.keys(run)["birds"]
    assert cache.read(str(tmp_path / "cache"), key) is not None, "the cluster's key"


@pytest.mark.parametrize("suffix", archives.SUFFIXES)
def test_an_archive_of_each_kind_the_docs_list_is_unpacked_for_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    """Through the fetcher's staging file (which has no suffix), as a user's run meets it."""
    body = server.archive(suffix, {"birds/a.jpg": b"A", "birds/b.jpg": b"B", "notes.txt": b"N"})
    monkeypatch.setenv("TORCHYARD_INPUTS_CACHE", str(tmp_path / "cache"))
    with serving(Files({f"/birds{suffix}": body})) as url:
        spec = web_input("birds", f"{url}/birds{suffix}", body, "*.jpg")
        (tmp_path / "src").mkdir()
        monkeypatch.chdir(project(tmp_path / "src", [spec], ["$TORCHYARD_INPUT_BIRDS"]))
        assert cli.main(local_argv(tmp_path)) == 0
    assert seen(tmp_path / "runs") == ["birds/a.jpg=A", "birds/b.jpg=B"]


@pytest.mark.parametrize(
    ("suffix", "body", "words"),
    [
        (".zip", server.archive(".zip", {"../evil.txt": b"x"}), "outside its folder"),
        (".tar.xz", server.archive(".tar.xz", {"/etc/evil": b"x"}), "absolute path"),
        (".zip", b"<html>not found</html>", "it is not a zip or tar archive"),
    ],
)
def test_a_hostile_or_false_archive_stops_the_run_naming_the_input(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    suffix: str,
    body: bytes,
    words: str,
) -> None:
    monkeypatch.setenv("TORCHYARD_INPUTS_CACHE", str(tmp_path / "cache"))
    with serving(Files({f"/x{suffix}": body})) as url:
        spec = web_input("x", f"{url}/x{suffix}", body)
        (tmp_path / "src").mkdir()
        monkeypatch.chdir(project(tmp_path / "src", [spec], []))
        assert cli.main(local_argv(tmp_path)) == 1
    err = capsys.readouterr().err
    assert f"input x ({url}/x{suffix}): " in err and words in err, err
    entries = tmp_path / "cache" / "entries"
    assert not (tmp_path / "evil.txt").exists()
    assert not entries.is_dir() or not os.listdir(entries), "nothing of it is in the cache"


def test_a_model_input_comes_from_the_local_registry_as_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchyard.registry import Store

    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.pt").write_text("W")
    Store(tmp_path / "registry").publish("default", "birds", model)
    monkeypatch.setenv("TORCHYARD_INPUTS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "src").mkdir()
    spec = {"name": "base", "uri": "model://birds/1", "mode": "download"}
    src = project(tmp_path / "src", [spec], ["${TORCHYARD_INPUT_BASE}"])
    monkeypatch.chdir(src)
    argv = local_argv(tmp_path)
    assert cli.main(argv) == 0
    assert seen(tmp_path / "runs") == ["weights.pt=W"]
    [run] = sorted((tmp_path / "runs").iterdir())
    assert (run / "inputs" / "base" / "weights.pt").read_text() == "W", "a writable copy"


def test_a_model_input_without_a_version_is_the_latest_in_the_local_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchyard.registry import Store

    monkeypatch.setenv("TORCHYARD_INPUTS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "src").mkdir()
    src = project(
        tmp_path / "src", [{"name": "base", "uri": "model://birds"}], ["$TORCHYARD_INPUT_BASE"]
    )
    monkeypatch.chdir(src)
    assert cli.main(local_argv(tmp_path)) == 1, "no version yet"
    for text in ("one", "two"):
        model = tmp_path / f"model-{text}"
        model.mkdir()
        (model / "weights.pt").write_text(text)
        Store(tmp_path / "registry").publish("default", "birds", model)
        assert cli.main(local_argv(tmp_path)) == 0
        assert seen(tmp_path / "runs") == [f"weights.pt={text}"]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"name": "base", "uri": "model://nothing/1"}, "input base (model://nothing/1): "),
        ({"name": "base", "uri": "model://nothing"}, "input base (model://nothing): "),
        ({"name": "data", "uri": "pvc://datasets"}, "local mode cannot mount"),
    ],
)
def test_an_input_it_cannot_have_stops_the_run_naming_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    spec: dict[str, object],
    words: str,
) -> None:
    monkeypatch.setenv("TORCHYARD_INPUTS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "src").mkdir()
    src = project(tmp_path / "src", [spec], [])
    monkeypatch.chdir(src)
    argv = local_argv(tmp_path)
    assert cli.main(argv) == 1
    assert words in capsys.readouterr().err


def test_an_hf_input_is_read_through_the_hub_client_with_the_shells_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TORCHYARD_INPUTS_CACHE", str(tmp_path / "cache"))
    hub = hub_server.Hub()
    commit = hub.repo("acme/tiny", token="hf_local").push(
        {"config.json": b"{}", "model.bin": b"W" * 2048, "README.md": b"r"}
    )
    spec = {"name": "base", "uri": "hf://acme/tiny@main", "exclude": ["*.md"]}
    (tmp_path / "src").mkdir()
    src = project(tmp_path / "src", [spec], ["$TORCHYARD_INPUT_BASE"])
    monkeypatch.chdir(src)
    with hub_server.serving(hub) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        monkeypatch.setenv("HF_TOKEN", "hf_local")
        assert cli.main(local_argv(tmp_path)) == 0
        assert seen(tmp_path / "runs") == ["config.json={}", "model.bin=" + "W" * 2048]
        assert cli.main(local_argv(tmp_path)) == 0
        assert "input base: 2050 bytes ready (0 fetched)" in capsys.readouterr().err
        run = api.parse_trainingrun(yaml.safe_load((src / "run.yaml").read_text()))
        entry = cache.read(str(tmp_path / "cache"), planned.keys(run)["base"])
        assert entry is not None and entry.revision == commit
        monkeypatch.setenv("HF_TOKEN", "hf_wrong")
        hub.repos[("models", "acme/tiny")].push({"config.json": b"{1}"})  # main moved
        assert cli.main(local_argv(tmp_path)) != 0
    err = capsys.readouterr().err
    assert "input base (hf://acme/tiny@main): hf://acme/tiny@main: the Hub answered HTTP 401" in err
