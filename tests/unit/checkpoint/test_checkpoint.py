"""torchyard.checkpoint: the completeness contract, latest(), quarantine, keep, and the
just-in-time target step, on real folders."""

from __future__ import annotations

import ast
import hashlib
import json
import os
from pathlib import Path
from types import ModuleType

import pytest

from torchyard import checkpoint, checkpoint_store


def save(root: Path, step: int, world: int, payload: bytes = b"weights") -> Path:
    """Every rank of a ``world``-rank run writes its shard and its .done for ``step``."""
    for rank in range(world):
        folder = Path(checkpoint.save_dir(step, str(root)))
        (folder / f"shard-{rank}.pt").write_bytes(payload + bytes([rank]))
        checkpoint.done(step, str(root), rank=rank)
    return root / f"step-{step}"


def complete(root: Path, step: int, world: int = 2, payload: bytes = b"weights") -> Path:
    path = save(root, step, world, payload)
    assert checkpoint.finalize(step, world, str(root))
    return path


def rewrite_manifest(path: Path, change: dict[str, object]) -> None:
    body = json.loads((path / checkpoint.COMPLETE).read_text())
    body.update(change)
    (path / checkpoint.COMPLETE).write_text(json.dumps(body))


@pytest.mark.parametrize("module", [checkpoint, checkpoint_store], ids=lambda m: m.__name__)
def test_the_module_parses_as_python_3_8_and_imports_only_the_standard_library(
    module: ModuleType,
) -> None:
    """Standard library only (and, for ``checkpoint``, the ``checkpoint_store`` it
    re-exports, shipped beside it)."""
    tree = ast.parse(Path(str(module.__file__)).read_text(), feature_version=(3, 8))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert imported <= {
        "__future__",
        "hashlib",
        "json",
        "os",
        "re",
        "shutil",
        "stat",
        "tempfile",
        "threading",
        "time",
        "torchyard",
        "typing",
    }


def test_complete_json_lists_every_file_with_size_and_sha256(tmp_path: Path) -> None:
    path = complete(tmp_path, 10)
    body = json.loads((path / "COMPLETE.json").read_text())
    assert body["step"] == 10 and body["worldSize"] == 2
    names = {f["name"]: f for f in body["files"]}
    assert set(names) == {"shard-0.pt", "shard-1.pt", "rank-0.done", "rank-1.done"}
    assert names["shard-1.pt"]["size"] == len(b"weights\x01")
    assert names["shard-1.pt"]["sha256"] == hashlib.sha256(b"weights\x01").hexdigest()
    assert checkpoint.is_complete(str(path))


def test_no_complete_json_until_every_rank_is_done(tmp_path: Path) -> None:
    folder = Path(checkpoint.save_dir(5, str(tmp_path)))
    (folder / "shard-0.pt").write_bytes(b"x")
    checkpoint.done(5, str(tmp_path), rank=0)
    assert not checkpoint.finalize(5, 2, str(tmp_path))
    assert not (folder / "COMPLETE.json").exists()
    assert checkpoint.latest(str(tmp_path)) is None
    (folder / "shard-1.pt").write_bytes(b"y")
    checkpoint.done(5, str(tmp_path), rank=1)
    assert checkpoint.finalize(5, 2, str(tmp_path))
    assert checkpoint.latest(str(tmp_path)) == str(folder)


def test_latest_is_the_highest_complete_step_not_the_newest_name_or_mtime(tmp_path: Path) -> None:
    complete(tmp_path, 9)
    complete(tmp_path, 100)
    save(tmp_path, 200, 1)  # a save in progress: one of two ranks done
    os.utime(tmp_path / "step-9", (4e9, 4e9))  # the most recently touched
    assert checkpoint.latest(str(tmp_path)) == str(tmp_path / "step-100")
    assert checkpoint.complete_steps(str(tmp_path)) == [9, 100]


def test_a_folder_copied_without_complete_json_or_with_another_step_is_not_complete(
    tmp_path: Path,
) -> None:
    path = complete(tmp_path, 3)
    os.rename(path, tmp_path / "step-4")  # COMPLETE.json says step 3
    assert not checkpoint.is_complete(str(tmp_path / "step-4"))
    assert not checkpoint.is_complete(str(tmp_path / "step-04"))
    assert checkpoint.step_of("step-04") is None and checkpoint.step_of("step-7") == 7


@pytest.mark.parametrize(
    "damage",
    ["truncate", "flip", "remove", "symlink", "done-missing", "garbage-json", "wrong-type"],
)
def test_damaged_checkpoints_are_not_complete(tmp_path: Path, damage: str) -> None:
    complete(tmp_path, 1)
    path = complete(tmp_path, 2)
    shard = path / "shard-0.pt"
    if damage == "truncate":
        shard.write_bytes(b"we")
    elif damage == "flip":
        shard.write_bytes(b"WEIGHTS\x00")  # same size, other bytes
    elif damage == "remove":
        shard.unlink()
    elif damage == "symlink":
        outside = tmp_path / "elsewhere"
        outside.write_bytes(shard.read_bytes())
        shard.unlink()
        shard.symlink_to(outside)
    elif damage == "done-missing":
        (path / "rank-1.done").unlink()
    elif damage == "garbage-json":
        (path / "COMPLETE.json").write_text("{not json")
    elif damage == "wrong-type":
        rewrite_manifest(path, {"files": "everything"})
    assert not checkpoint.is_complete(str(path))
    assert checkpoint.latest(str(tmp_path)) == str(tmp_path / "step-1")


def test_size_checks_without_hashing_still_catch_truncation(tmp_path: Path) -> None:
    path = complete(tmp_path, 2)
    (path / "shard-0.pt").write_bytes(b"w")
    assert not checkpoint.is_complete(str(path), verify=False)


def listing(file: Path, name: str) -> dict[str, object]:
    """A COMPLETE.json entry naming ``file`` as ``name``, with its true size and sha256."""
    data = file.read_bytes()
    return {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


# Names of a real file outside the step folder (outside.pt beside it, or step-1's shard):
# "{root}" is the checkpoint folder (an absolute path), "{name}" its own name.
LEAVING = [
    "../outside.pt",
    "../step-1/shard-0.pt",
    "sub/../../outside.pt",
    "sub/../../../{name}/outside.pt",
    "{root}/outside.pt",
    "/{root}/outside.pt",
]


@pytest.mark.parametrize("name", LEAVING)
def test_file_names_that_leave_the_folder_are_refused(tmp_path: Path, name: str) -> None:
    """Every other check passes (the file exists with the listed size and sha256): only
    where the name leads decides."""
    complete(tmp_path, 1)
    path = complete(tmp_path, 2)
    (path / "sub").mkdir()
    outside = tmp_path / "outside.pt"
    outside.write_bytes(b"not this checkpoint's")
    name = name.format(root=tmp_path, name=tmp_path.name)
    target = (path / name).resolve()
    assert target.is_file() and not target.is_relative_to(path)
    rewrite_manifest(path, {"files": [listing(target, name)]})
    assert not checkpoint.is_complete(str(path))
    assert checkpoint.latest(str(tmp_path)) == str(tmp_path / "step-1")
    rewrite_manifest(path, {"files": [listing(path / "shard-0.pt", "sub/../shard-0.pt")]})
    assert not checkpoint.is_complete(str(path))  # a '..' that stays inside: refused too
    rewrite_manifest(path, {"files": [listing(path / "shard-0.pt", "shard-0.pt")]})
    assert checkpoint.is_complete(str(path))  # the same manifest naming it inside: complete


@pytest.mark.parametrize(
    "name",
    [
        "../outside.pt",
        "/outside.pt",
        "a/../../x",
        "a/../x",
        "./x",
        "a/./x",
        "a//x",
        "x/",
        "",
        "a\\..\\b",
        "x\x00y",
        7,
        None,
    ],
)
def test_a_manifest_listing_a_name_that_is_not_a_plain_relative_path_is_not_well_formed(
    tmp_path: Path, name: object
) -> None:
    path = complete(tmp_path, 2)
    entry = {**listing(path / "shard-0.pt", "shard-0.pt"), "name": name}
    rewrite_manifest(path, {"files": [entry]})
    assert checkpoint.manifest(str(path)) is None
    assert not checkpoint.is_complete(str(path))
    rewrite_manifest(path, {"files": [{**entry, "name": "shard-0.pt"}]})
    assert checkpoint.manifest(str(path)) is not None


@pytest.mark.parametrize("link", ["sub", "deep/sub"])
@pytest.mark.parametrize("to", ["outside", "another-step", "inside"])
def test_a_file_reached_through_a_linked_folder_is_refused(
    tmp_path: Path, link: str, to: str
) -> None:
    """The name is plain and the file it reaches has the listed size and sha256: only
    the link on the way decides, wherever it points (even back into the folder)."""
    step_1 = complete(tmp_path, 1)
    path = complete(tmp_path, 2)
    real = {"outside": tmp_path / "real", "another-step": step_1, "inside": path / "real"}[to]
    real.mkdir(exist_ok=True)
    (real / "w.pt").write_bytes(b"abc")
    (path / link).parent.mkdir(parents=True, exist_ok=True)
    (path / link).symlink_to(real)
    rewrite_manifest(path, {"files": [listing(real / "w.pt", f"{link}/w.pt")]})
    assert not checkpoint.is_complete(str(path))
    rewrite_manifest(path, {"files": [listing(path / "shard-0.pt", "shard-0.pt")]})
    assert checkpoint.is_complete(str(path))


def test_a_symlinked_sub_folder_or_complete_json_is_refused(tmp_path: Path) -> None:
    path = complete(tmp_path, 2)
    real = tmp_path / "real"
    real.mkdir()
    (real / "w.pt").write_bytes(b"abc")
    (path / "sub").symlink_to(real)
    digest = hashlib.sha256(b"abc").hexdigest()
    rewrite_manifest(path, {"files": [{"name": "sub/w.pt", "size": 3, "sha256": digest}]})
    assert not checkpoint.is_complete(str(path))
    other = complete(tmp_path, 3)
    (tmp_path / "stolen.json").write_text((other / "COMPLETE.json").read_text())
    (other / "COMPLETE.json").unlink()
    (other / "COMPLETE.json").symlink_to(tmp_path / "stolen.json")
    assert not checkpoint.is_complete(str(other))
    os.symlink(tmp_path / "step-2", tmp_path / "step-9")
    assert not checkpoint.is_complete(str(tmp_path / "step-9"))


def test_a_symlink_in_the_folder_is_neither_hashed_nor_listed(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"secret")
    folder = Path(checkpoint.save_dir(1, str(tmp_path)))
    (folder / "link").symlink_to(tmp_path / "secret")
    checkpoint.done(1, str(tmp_path), rank=0)
    assert checkpoint.finalize(1, 1, str(tmp_path))
    body = json.loads((folder / "COMPLETE.json").read_text())
    assert [f["name"] for f in body["files"]] == ["rank-0.done"]


def test_a_pytorch_distributed_checkpoint_metadata_counts_as_complete(tmp_path: Path) -> None:
    folder = Path(checkpoint.save_dir(7, str(tmp_path)))
    (folder / "__0_0.distcp").write_bytes(b"tensor")
    assert checkpoint.latest(str(tmp_path)) is None
    (folder / ".metadata").write_bytes(b"")  # being written
    assert checkpoint.latest(str(tmp_path)) is None
    (folder / ".metadata").write_bytes(b"pickled metadata")
    assert checkpoint.latest(str(tmp_path)) == str(folder)
    assert checkpoint.finalize(7, 4, str(tmp_path))  # nothing to add
    assert not (folder / "COMPLETE.json").exists()


def test_quarantine_moves_a_checkpoint_aside_and_latest_falls_back(tmp_path: Path) -> None:
    complete(tmp_path, 10)
    complete(tmp_path, 20)
    moved = checkpoint.quarantine(20, str(tmp_path))
    assert moved == str(tmp_path / "quarantine-step-20")
    assert checkpoint.latest(str(tmp_path)) == str(tmp_path / "step-10")
    complete(tmp_path, 20)
    assert checkpoint.quarantine(20, str(tmp_path)) == str(tmp_path / "quarantine-step-20-2")
    assert checkpoint.quarantine(99, str(tmp_path)) is None


def test_keep_deletes_all_but_the_newest_complete_and_stale_partial_saves(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        complete(tmp_path, step)
    save(tmp_path, 9, 1)  # in progress, newer than every complete one: kept
    Path(checkpoint.save_dir(0, str(tmp_path)))  # a save that never finished: older
    assert checkpoint.keep(2, str(tmp_path)) == [0, 1, 2]
    assert checkpoint.steps(str(tmp_path)) == [3, 4, 9]
    assert checkpoint.latest(str(tmp_path)) == str(tmp_path / "step-4")
    with pytest.raises(ValueError, match="keep must be >= 1"):
        checkpoint.keep(0, str(tmp_path))


def test_without_a_checkpoint_folder_scripts_get_none_and_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(checkpoint.DIR_VARIABLE, raising=False)
    assert checkpoint.latest() is None
    assert checkpoint.should_save(5) is False
    said = r"spec\.checkpoints.*set it to a folder yourself"
    with pytest.raises(checkpoint.CheckpointError, match=said):
        checkpoint.save_dir(1)


def test_environment_variables_drive_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(checkpoint.DIR_VARIABLE, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv(checkpoint.INTERVAL_VARIABLE, "5")
    monkeypatch.setenv(checkpoint.RESUME_STEP_VARIABLE, "40")
    assert [s for s in range(1, 16) if checkpoint.should_save(s)] == [5, 10, 15]
    folder = checkpoint.save_dir(15)
    Path(folder, "model.pt").write_bytes(b"m")
    checkpoint.done(15)
    assert Path(folder, "rank-0.done").is_file()
    assert checkpoint.finalize(15, 1)
    assert checkpoint.latest() == folder
    assert checkpoint.resume_step() == 40


def test_just_in_time_target_is_one_after_the_highest_reported_step(tmp_path: Path) -> None:
    d = str(tmp_path)
    assert checkpoint.request_save(d) is None  # no rank reported: nothing to ask
    checkpoint.report(41, d, rank=0)
    checkpoint.report(42, d, rank=1)
    assert checkpoint.request_save(d) == 43
    assert checkpoint.save_target(d) == 43
    # Every rank turns true at that same step, without talking to the others.
    for rank in (0, 1):
        os.environ["RANK"] = str(rank)
        try:
            hits = [s for s in range(40, 50) if checkpoint.should_save(s, d)]
        finally:
            del os.environ["RANK"]
        assert hits == [43]


def test_the_target_only_moves_forward_and_past_a_rank_that_already_passed_it(
    tmp_path: Path,
) -> None:
    d = str(tmp_path)
    checkpoint.report(10, d, rank=0)
    checkpoint.report(9, d, rank=1)
    assert checkpoint.request_save(d) == 11
    checkpoint.report(11, d, rank=0)  # rank 0 reported 11: it may be saving it now
    assert checkpoint.request_save(d) == 11
    checkpoint.report(12, d, rank=0)  # ... but it went on without rank-0.done: it missed 11
    assert checkpoint.request_save(d) == 13
    checkpoint.clear_requests(d)
    assert checkpoint.save_target(d) is None and checkpoint.reported(d) == {}


def test_launchers_stopped_at_once_agree_on_one_target_while_ranks_move_on(
    tmp_path: Path,
) -> None:
    """Every node's launcher gets SIGTERM at about the same time: the first sets the
    target, the ones after it find it, even when ranks have saved it and gone on meanwhile
    (a later launcher computing its own target would ask for a second checkpoint)."""
    d = str(tmp_path)
    for rank in range(4):
        checkpoint.report(21, d, rank=rank)
    assert checkpoint.request_save(d) == 22  # node 0's launcher
    for rank in (0, 1):  # node 0's ranks save step 22 and go on
        os.environ["RANK"] = str(rank)
        try:
            assert checkpoint.should_save(22, d)
            checkpoint.save_dir(22, d)
            checkpoint.done(22, d)
            assert not checkpoint.should_save(23, d)
        finally:
            del os.environ["RANK"]
    assert checkpoint.request_save(d) == 22  # node 1's launcher, later: the same step
    assert checkpoint.save_target(d) == 22


def test_a_target_that_a_saved_checkpoint_completes_never_moves(tmp_path: Path) -> None:
    d = str(tmp_path)
    checkpoint.report(4, d, rank=0)
    assert checkpoint.request_save(d) == 5
    (tmp_path / "step-5").mkdir()
    (tmp_path / "step-5" / ".metadata").write_bytes(b"dcp")  # a PyTorch DCP save, no .done
    checkpoint.report(7, d, rank=0)
    assert checkpoint.request_save(d) == 5


def test_node_0_drops_unfinished_and_damaged_saves_newer_than_the_one_it_resumes(
    tmp_path: Path,
) -> None:
    complete(tmp_path, 10)
    complete(tmp_path, 20)
    save(tmp_path, 25, 1)  # only rank 0 of 2 finished before the gang stopped
    damaged = complete(tmp_path, 30)
    (damaged / "shard-1.pt").write_bytes(b"XXXXXXXX")  # same size, other bytes
    node0 = checkpoint.NodeCheckpoints(str(tmp_path), 0, 2)
    env = node0.start()
    try:
        assert env[checkpoint.RESUME_FROM_VARIABLE] == str(tmp_path / "step-20")
        assert env[checkpoint.RESUME_STEP_VARIABLE] == "20"
        assert checkpoint.steps(str(tmp_path)) == [10, 20]
    finally:
        node0.stop(rank_failed=False)
    # Another node's launcher only reads: it resumes from the same step, deletes nothing.
    save(tmp_path, 25, 1)
    other = checkpoint.NodeCheckpoints(str(tmp_path), 1, 2)
    assert other.start()[checkpoint.RESUME_STEP_VARIABLE] == "20"
    other.stop(rank_failed=False)
    assert checkpoint.steps(str(tmp_path)) == [10, 20, 25]


def test_other_nodes_wait_until_node_0_has_prepared_this_attempt(tmp_path: Path) -> None:
    import threading

    save(tmp_path, 5, 1)  # the previous attempt's unfinished save, which node 0 drops
    node1 = checkpoint.NodeCheckpoints(str(tmp_path), 1, 2, attempt="uid-1", wait_seconds=60)
    got: dict[str, str] = {}
    waiter = threading.Thread(target=lambda: got.update(node1.start()))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()  # node 0 has not said "uid-1" yet
    node0 = checkpoint.NodeCheckpoints(str(tmp_path), 0, 2, attempt="uid-1")
    node0.start()
    waiter.join(30)
    assert not waiter.is_alive() and got[checkpoint.DIR_VARIABLE] == str(tmp_path)
    assert checkpoint.steps(str(tmp_path)) == []
    node0.stop(rank_failed=False)
    late = checkpoint.NodeCheckpoints(str(tmp_path), 1, 2, attempt="uid-2", wait_seconds=0.3)
    with pytest.raises(checkpoint.CheckpointError, match="node 0's launcher did not prepare"):
        late.start()


def test_files_in_sub_folders_are_listed_by_their_relative_path_and_checked(
    tmp_path: Path,
) -> None:
    folder = Path(checkpoint.save_dir(3, str(tmp_path)))
    (folder / "model" / "layers").mkdir(parents=True)
    (folder / "model" / "layers" / "w.pt").write_bytes(b"layer weights")
    (folder / "opt.pt").write_bytes(b"optimizer")
    (folder / ".tmp-half-written").write_bytes(b"a temporary file of the store's")
    (folder / "model" / ".tmp-notes").write_bytes(b"the script's own file")
    checkpoint.done(3, str(tmp_path), rank=0)
    assert checkpoint.finalize(3, 1, str(tmp_path))
    body = checkpoint.manifest(str(folder))
    assert body is not None
    assert sorted(f["name"] for f in body["files"]) == [
        "model/.tmp-notes",
        "model/layers/w.pt",
        "opt.pt",
        "rank-0.done",
    ]
    assert checkpoint.is_complete(str(folder))
    (folder / "model" / "layers" / "w.pt").write_bytes(b"LAYER WEIGHTS")  # same size
    assert not checkpoint.is_complete(str(folder))
    assert checkpoint.is_complete(str(folder), verify=False)


def test_what_counts_as_complete_hashes_unless_told_not_to(tmp_path: Path) -> None:
    complete(tmp_path, 1)
    path = complete(tmp_path, 2)
    (path / "shard-0.pt").write_bytes(b"WEIGHTS\x00")  # same size, other bytes
    assert checkpoint.complete_steps(str(tmp_path)) == [1]
    assert checkpoint.complete_steps(str(tmp_path), verify=False) == [1, 2]
    assert checkpoint.latest(str(tmp_path)) == str(tmp_path / "step-1")
    assert checkpoint.latest(str(tmp_path), verify=False) == str(path)
    # finalizing again keeps the digests it listed: the damage is still seen
    assert checkpoint.finalize(2, 2, str(tmp_path))
    assert not checkpoint.is_complete(str(path))


def test_a_linked_or_misnamed_step_folder_is_never_complete_nor_finalized(tmp_path: Path) -> None:
    real = save(tmp_path / "elsewhere", 4, 1)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "step-4").symlink_to(real)
    assert not checkpoint.finalize(4, 1, str(tmp_path / "run"))
    assert not (real / "COMPLETE.json").exists()
    assert checkpoint.manifest(str(tmp_path / "run" / "step-4")) is None
    assert not checkpoint.finalize(5, 1, str(tmp_path / "run"))  # no folder at all
    path = complete(tmp_path, 6)
    os.rename(path, tmp_path / "backup")
    assert not checkpoint.is_complete(str(tmp_path / "backup"))


@pytest.mark.parametrize(
    "change",
    [
        {"worldSize": 0},
        {"worldSize": -1},
        {"worldSize": "2"},
        {"files": [{"name": "shard-0.pt", "size": 8, "sha256": None}]},
        {"files": [{"name": "shard-0.pt", "size": "8", "sha256": "0" * 64}]},
    ],
)
def test_a_manifest_with_a_field_of_the_wrong_kind_is_not_well_formed(
    tmp_path: Path, change: dict[str, object]
) -> None:
    path = complete(tmp_path, 2)
    rewrite_manifest(path, change)
    assert checkpoint.manifest(str(path)) is None
    assert not checkpoint.is_complete(str(path))


def test_a_manifest_over_16_mib_is_not_read(tmp_path: Path) -> None:
    path = complete(tmp_path, 2)
    body = (path / "COMPLETE.json").read_text()
    (path / "COMPLETE.json").write_text(" " * (16 << 20) + body)  # valid JSON, too long
    assert checkpoint.manifest(str(path)) is None
    (path / "COMPLETE.json").write_text(" " * ((16 << 20) - len(body)) + body)
    assert checkpoint.manifest(str(path)) is not None


def test_a_distributed_checkpoint_of_one_byte_of_metadata_is_complete(tmp_path: Path) -> None:
    folder = Path(checkpoint.save_dir(7, str(tmp_path)))
    (folder / ".metadata").write_bytes(b"x")
    assert checkpoint.is_complete(str(folder))


def test_keep_counts_checkpoints_complete_by_size_and_keeps_saves_in_progress(
    tmp_path: Path,
) -> None:
    for step in (1, 2, 6):
        complete(tmp_path, step)
    save(tmp_path, 4, 1)  # unfinished, older than the newest complete one: deleted
    save(tmp_path, 9, 1)  # in progress, newer: kept
    (tmp_path / "step-6" / "shard-0.pt").write_bytes(b"WEIGHTS\x00")  # no hashing in keep
    outside = tmp_path.parent / f"{tmp_path.name}-target"
    outside.mkdir()
    (tmp_path / "step-0").symlink_to(outside)
    assert checkpoint.keep(1, str(tmp_path)) == [0, 1, 2, 4]
    assert checkpoint.steps(str(tmp_path)) == [6, 9]
    assert outside.is_dir()  # the link went, not what it pointed to


def test_keep_deletes_an_unfinished_save_between_two_it_keeps(tmp_path: Path) -> None:
    for step in (1, 3, 6):
        complete(tmp_path, step)
    save(tmp_path, 4, 1)
    assert checkpoint.keep(2, str(tmp_path)) == [1, 4]
    assert checkpoint.steps(str(tmp_path)) == [3, 6]


def test_quarantined_lists_the_folders_moved_aside(tmp_path: Path) -> None:
    assert checkpoint.quarantined(str(tmp_path / "missing")) == []
    complete(tmp_path, 20)
    checkpoint.quarantine(20, str(tmp_path))
    complete(tmp_path, 20)
    checkpoint.quarantine(20, str(tmp_path))
    assert sorted(checkpoint.quarantined(str(tmp_path))) == [
        "quarantine-step-20",
        "quarantine-step-20-2",
    ]


def test_a_negative_step_is_refused_saying_so(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="a checkpoint step must be >= 0, got -1"):
        checkpoint.step_path(-1, str(tmp_path))
