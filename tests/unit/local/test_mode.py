"""Local mode's confinement: what it copies into the node folders (the files ``submit``
would snapshot, never its own runs or registry) and what it may register (only what lies
inside node 0's working folder). The runs are real launcher processes over tiny scripts."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.builders import TrainingRunBuilder
from torchyard import api, cli, local
from torchyard.registry import Store
from torchyard.sdk.progress import human

WRITES_A_MODEL = textwrap.dedent(
    """
    import os
    os.makedirs("outputs", exist_ok=True)
    with open("outputs/model.bin", "wb") as f:
        f.write(b"w" * 200_000)
    """
)


def files_under(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def size_of(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def project(root: Path, files: dict[str, str]) -> Path:
    """A user's folder: run.yaml (2 nodes of 1 process running train.py) and ``files``."""
    body = TrainingRunBuilder("tiny").nodes(2).procs(1).register("tiny").obj()
    for rel, text in {
        "run.yaml": yaml.safe_dump(body),
        "train.py": WRITES_A_MODEL,
        **files,
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_runs_and_registry_inside_the_source_are_not_copied_and_runs_do_not_grow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a new user would: ``--source .`` beside ``--workdir ./runs``, several times."""
    src = project(tmp_path, {".gitignore": "data/\n", "data/big.csv": "x" * 300_000})
    monkeypatch.chdir(src)
    argv = ["run", "run.yaml", "--local", "--source", ".", "--workdir", "./runs"]
    for _ in range(3):
        assert cli.main([*argv, "--registry", "./registry"]) == 0
    runs = sorted((src / "runs").iterdir())
    assert len(runs) == 3
    for run in runs:
        for node in (0, 1):
            copied = [
                f
                for f in files_under(run / f"node-{node}")
                if not f.startswith(("outputs/", "logs/")) and f != "termination-log.json"
            ]
            assert copied == [".gitignore", "run.yaml", "train.py"], run
    # the same size but for the timestamps of logs and termination messages (whose
    # decimals vary in length); a run holding an earlier one would be 300 KB bigger
    sizes = [size_of(run) for run in runs]
    assert max(sizes) - min(sizes) < 1024, sizes
    assert Store(src / "registry").versions("default", "tiny") == [1, 2, 3]


def test_a_source_over_the_submit_limit_is_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = project(tmp_path / "src", {"data/big.csv": "x" * 300_000, "notes.md": "x" * 5000})
    monkeypatch.setenv("TORCHYARD_SNAPSHOT_MAX_BYTES", "100000")
    code = cli.main(
        [
            *("run", str(src / "run.yaml"), "--local"),
            *("--workdir", str(tmp_path / "runs"), "--registry", str(tmp_path / "registry")),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    assert f"holds {human(total)}, over the 97.7 KiB a snapshot may hold" in err
    assert "Largest: data/ 293.0 KiB (1 files), notes.md 4.9 KiB" in err
    assert not (tmp_path / "runs").exists()


def test_the_runs_folder_cannot_be_the_source_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = project(tmp_path, {})
    monkeypatch.chdir(src)
    assert cli.main(["run", "run.yaml", "--local", "--workdir", ".", "--registry", "reg"]) == 2
    assert "also where torchyard writes" in capsys.readouterr().err


def escaping_run(path: str) -> api.TrainingRun:
    """A run whose register path skipped validation (as a spec built in Python can)."""
    body = TrainingRunBuilder("tiny").nodes(1).procs(1).register("tiny").obj()
    run = api.parse_trainingrun(body)
    reg = run.spec.outputs.register_
    assert reg is not None
    outputs = run.spec.outputs.model_copy(
        update={"register_": reg.model_copy(update={"path": path})}
    )
    return run.model_copy(update={"spec": run.spec.model_copy(update={"outputs": outputs})})


LINKS = textwrap.dedent(
    """
    import os
    os.makedirs("outputs", exist_ok=True)
    with open("outputs/model.bin", "w") as f:
        f.write("model")
    os.symlink("/etc/passwd", "outputs/passwd")
    """
)


@pytest.mark.parametrize(
    "path",
    ["../" * 40 + "etc/passwd", "/etc/passwd", "outputs/passwd"],
    ids=["dot-dot", "absolute", "a-link-the-run-made"],
)
def test_a_register_path_outside_node_0s_folder_registers_nothing(
    tmp_path: Path, path: str
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(LINKS)
    registry = tmp_path / "registry"
    out = io.StringIO()
    result = local.run_local(
        escaping_run(path),
        src,
        ["train.py"],
        registry=registry,
        workroot=tmp_path / "runs",
        out=out,
    )
    assert result.exit_code == 1
    assert result.failure is not None and result.failure["reason"] == "FinalizeFailed"
    message = result.failure["message"]
    assert f"outputs.register.path {path!r}: it resolves to /etc/passwd" in message
    assert "outside node 0's working folder" in message and "nothing was registered" in message
    assert Store(registry).versions("default", "tiny") == []
    assert not (registry / "default" / "models").exists()
    # The run's outputs and logs were archived all the same; only the model was refused.
    assert (registry / "default" / "runs" / "tiny" / "outputs" / "model.bin").is_file()


@pytest.mark.parametrize(
    ("path", "what"),
    [
        ("../etc/passwd", "it resolves to {tmp}/etc/passwd"),
        ("outputs/passwd", "it resolves to {tmp}/etc/passwd"),
        ("outputs/dir", "the link outputs/dir/etc resolves to {tmp}/etc"),
        ("outputs/dir/etc/passwd", "it resolves to {tmp}/etc/passwd"),
        ("outputs/../../node-0-other/model.pt", "it resolves to {tmp}/node-0-other/model.pt"),
    ],
)
def test_register_source_refuses_what_resolves_outside(
    tmp_path: Path, path: str, what: str
) -> None:
    node0 = tmp_path / "node-0"
    (node0 / "outputs" / "dir").mkdir(parents=True)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text("root:x:0:0")
    (tmp_path / "node-0-other").mkdir()  # a sibling whose name starts the same
    (tmp_path / "node-0-other" / "model.pt").write_text("")
    (node0 / "outputs" / "passwd").symlink_to(tmp_path / "etc" / "passwd")
    (node0 / "outputs" / "dir" / "etc").symlink_to(tmp_path / "etc")
    with pytest.raises(RuntimeError) as refused:
        local.register_source(node0, path)
    assert what.format(tmp=tmp_path.resolve()) in str(refused.value)
    assert "nothing was registered" in str(refused.value)


def test_register_source_accepts_what_lies_inside(tmp_path: Path) -> None:
    node0 = tmp_path / "node-0"
    (node0 / "outputs" / "sub").mkdir(parents=True)
    (node0 / "outputs" / "model.pt").write_text("m")
    (node0 / "outputs" / "latest.pt").symlink_to(node0 / "outputs" / "model.pt")
    (node0 / "outputs" / "sub" / "up").symlink_to("..")
    assert local.register_source(node0, "outputs/model.pt") == (node0 / "outputs/model.pt")
    assert local.register_source(node0, "outputs/latest.pt") == (node0 / "outputs/model.pt")
    assert local.register_source(node0, "outputs") == node0 / "outputs"
    assert local.register_source(node0, "./outputs/../outputs/model.pt") == (
        node0 / "outputs/model.pt"
    )


@pytest.mark.parametrize(
    ("files", "error"),
    [
        (["../outside.py"], "not a path inside"),
        (["/etc/passwd"], "not a path inside"),
        (["linked-folder"], "not a regular file"),
        (["missing.py"], "not a regular file"),
    ],
)
def test_only_files_under_the_source_are_copied(
    tmp_path: Path, files: list[str], error: str
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (tmp_path / "outside.py").write_text("")
    (src / "linked-folder").symlink_to(tmp_path)
    run = api.parse_trainingrun(TrainingRunBuilder("tiny").obj())
    with pytest.raises((ValueError, FileNotFoundError), match=error):
        local.run_local(run, src, files, registry=tmp_path / "r", workroot=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_the_rank_that_failed_first_is_blamed_not_its_peers_that_died_of_it() -> None:
    """Node 1's rank raised; node 0's ranks then died of "Connection closed by peer" and
    node 0 happens to have run for less time. The launcher's exitedAt decides."""
    peer = local.NodeResult(
        0, 1, 4.0, {"reason": "Error", "rank": 0, "nodeRank": 0, "exitedAt": 1000.20}
    )
    culprit = local.NodeResult(
        1, 1, 4.5, {"reason": "Error", "rank": 3, "nodeRank": 1, "exitedAt": 1000.05}
    )
    stopped = local.NodeResult(2, 143, 3.0, {"reason": "Terminated", "nodeRank": 2})
    failure = local.first_failure([peer, culprit, stopped])
    assert failure is not None and (failure["rank"], failure["node"]) == (3, 1)
    # Without exitedAt (an older launcher) the shorter run time still decides.
    unknown = [
        local.NodeResult(0, 1, 4.0, {"rank": 0, "nodeRank": 0, "exitedAt": "soon"}),
        local.NodeResult(1, 1, 4.5, {"rank": 3, "nodeRank": 1}),
    ]
    failure = local.first_failure(unknown)
    assert failure is not None and failure["rank"] == 0


def test_a_local_failure_gets_the_same_class_and_advice_as_in_a_cluster() -> None:
    """The CUDA out-of-memory traceback a GPU check printed: local mode names the class
    (launch.classes' table, as ``status.failure.class`` does) and its advice."""
    oom = (
        "Traceback (most recent call last):\n"
        '  File "cuda_oom.py", line 7, in <module>\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 34.95 GiB."
    )
    node = local.NodeResult(
        0, 1, 4.3, {"reason": "Error", "rank": 0, "nodeRank": 0, "message": oom}
    )
    failure = local.first_failure([node])
    assert failure is not None
    assert (failure["failureClass"], failure["retryable"]) == ("CudaOOM", False)
    text = local.describe_failure(failure)
    assert text.splitlines()[-1].startswith("class: CudaOOM (not retryable): a rank ran out")
    assert "matched: torch.OutOfMemoryError: CUDA out of memory" in text
    # Local mode's own faults (a node it stopped, a finalize error) are not classified.
    stopped = local.NodeResult(0, 143, 1.0, {"reason": "Terminated", "nodeRank": 0})
    assert "failureClass" not in (local.first_failure([stopped]) or {})


def test_the_package_is_a_face_and_run_local_names_its_options() -> None:
    """``torchyard.local``'s code lives in modules by concern; ``__init__`` re-exports."""
    import ast
    import inspect

    source = Path(local.__file__).read_text()
    assert len(source.splitlines()) <= 40
    assert all(isinstance(n, ast.ImportFrom | ast.Expr) for n in ast.parse(source).body)
    for name in (
        "LocalResult",
        "LocalRun",
        "NodeResult",
        "describe_failure",
        "first_failure",
        "register_source",
        "run_local",
        "default_registry",
        "default_workroot",
    ):
        assert hasattr(local, name), name
    params = inspect.signature(local.run_local).parameters
    assert inspect.Parameter.VAR_KEYWORD not in {p.kind for p in params.values()}
    assert list(params) == [
        "run", "source", "files", "registry", "workroot", "environment", "out", "grace_seconds",
        "resume",
    ]  # fmt: skip
    with pytest.raises(TypeError, match="unexpected keyword argument 'workdir'"):
        local.run_local(None, Path("."), [], workdir=Path("."))  # type: ignore[arg-type, call-arg]


def test_sigterm_and_sighup_stop_a_local_run_once_and_an_ignored_one_stays_ignored() -> None:
    """Within ``stopped_by_signals`` SIGTERM raises ``Stopped`` (a KeyboardInterrupt, so
    the run stops as on Ctrl-C), a second signal while stopping is swallowed, and the
    handlers are put back after; SIGHUP that the process was started with ignored
    (``nohup``) stays ignored. The whole CLI under SIGTERM: test_local_checkpoints.py."""
    import os
    import signal
    import time

    from torchyard.local import runs

    def deliver(signum: int) -> None:
        os.kill(os.getpid(), signum)
        time.sleep(0.05)  # the handler runs between bytecodes of the main thread

    before = {
        signal.SIGHUP: signal.signal(signal.SIGHUP, signal.SIG_IGN),
        signal.SIGTERM: signal.signal(signal.SIGTERM, signal.SIG_DFL),  # whatever we got
    }
    try:
        with pytest.raises(runs.Stopped) as stopped, runs.stopped_by_signals():
            deliver(signal.SIGHUP)  # ignored, as under nohup: nothing happens
            try:
                deliver(signal.SIGTERM)
            finally:
                deliver(signal.SIGTERM)  # while stopping: swallowed
        assert stopped.value.signum == signal.SIGTERM
        assert runs.interruption(stopped.value) == "SIGTERM received"
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
