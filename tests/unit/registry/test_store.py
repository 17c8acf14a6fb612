"""The registry store: numbered, immutable, verified versions published atomically."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from torchyard.registry import Store, sha256_file
from torchyard.registry.store import (
    METADATA_KEYS,
    RUN_KEYS,
    OutsideNamespace,
    check_metadata,
    human_size,
)


def model_folder(tmp_path: Path, content: bytes = b"weights") -> Path:
    src = tmp_path / "outputs"
    (src / "sub").mkdir(parents=True)
    (src / "model.pt").write_bytes(content)
    (src / "sub" / "notes.txt").write_text("hi")
    return src


def test_versions_count_up_with_a_manifest(tmp_path: Path) -> None:
    store = Store(tmp_path / "reg")
    src = model_folder(tmp_path)
    v1 = store.publish("ns", "birds", src, metadata={"run": {"name": "r1"}})
    v2 = store.publish("ns", "birds", src / "model.pt")
    assert (v1.version, v2.version) == (1, 2)
    assert v1.path == tmp_path / "reg" / "ns" / "models" / "birds" / "1"
    files = {f["path"]: f for f in v1.manifest["files"]}
    assert set(files) == {"model.pt", "sub/notes.txt"}
    assert files["model.pt"]["sha256"] == sha256_file(src / "model.pt")
    assert files["model.pt"]["size"] == 7
    assert v1.manifest["run"] == {"name": "r1"}
    assert store.get("ns", "birds").version == 2
    assert store.verify(store.get("ns", "birds", 1)) == []


def test_verify_finds_tampered_files(tmp_path: Path) -> None:
    store = Store(tmp_path / "reg")
    version = store.publish("ns", "m", model_folder(tmp_path))
    (version.path / "model.pt").write_bytes(b"evil!!!")
    assert store.verify(version) == ["model.pt"]


def test_concurrent_promotions_get_distinct_numbers(tmp_path: Path) -> None:
    store = Store(tmp_path / "reg")
    src = model_folder(tmp_path)
    numbers: list[int] = []
    lock = threading.Lock()

    def publish() -> None:
        v = Store(tmp_path / "reg").publish("ns", "m", src)
        with lock:
            numbers.append(v.version)

    threads = [threading.Thread(target=publish) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(numbers) == list(range(1, 9))
    assert store.versions("ns", "m") == list(range(1, 9))


def test_stale_temporaries_are_removed_at_start(tmp_path: Path) -> None:
    stale = tmp_path / "reg" / "ns" / "models" / "m" / ".tmp-deadbeef"
    stale.mkdir(parents=True)
    (stale / "half-written").write_text("x")
    fresh = stale.parent / ".tmp-inuse"
    fresh.mkdir()
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    Store(tmp_path / "reg")
    assert not stale.exists()
    assert fresh.exists(), "a young temporary may belong to a writer at work"


def test_run_archive_holds_outputs_and_every_nodes_logs(tmp_path: Path) -> None:
    store = Store(tmp_path / "reg")
    outputs = model_folder(tmp_path)
    logs = {}
    for node in (0, 1):
        folder = tmp_path / f"logs{node}"
        folder.mkdir()
        (folder / f"rank-{node}.txt").write_text(f"node {node}\n")
        logs[node] = folder
    dest = store.archive_run("ns", "run", outputs=outputs, logs=logs)
    assert (dest / "outputs" / "model.pt").read_bytes() == b"weights"
    assert (dest / "logs" / "node-1" / "rank-1.txt").read_text() == "node 1\n"
    # A second archive of the same run name replaces the first.
    dest = store.archive_run("ns", "run", outputs=None, logs={})
    assert not (dest / "outputs" / "model.pt").exists()


def test_the_stores_own_keys_win_over_metadata(tmp_path: Path) -> None:
    store = Store(tmp_path / "reg")
    src = model_folder(tmp_path)
    with pytest.raises(ValueError, match="'files' is the registry's own key"):
        store.publish("ns", "m", src, metadata={"files": []})
    with pytest.raises(ValueError, match="'evil' is not an allowed key"):
        store.publish("ns", "m", src, metadata={"evil": 1})
    with pytest.raises(ValueError, match=r"run\.path is not allowed"):
        store.publish("ns", "m", src, metadata={"run": {"path": "x"}})
    version = store.publish("ns", "m", src, metadata={"run": {"name": "r"}, "mode": "local"})
    assert {f["path"] for f in version.manifest["files"]} == {"model.pt", "sub/notes.txt"}
    assert (version.manifest["model"], version.manifest["mode"]) == ("m", "local")
    assert store.versions("ns", "m") == [1]  # the refused ones left nothing behind


def test_one_run_promoted_at_once_from_many_threads_is_one_version(tmp_path: Path) -> None:
    src = model_folder(tmp_path)
    results: list[tuple[int, bool]] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def promote() -> None:
        start.wait()
        version, created = Store(tmp_path / "reg").publish_run(
            "ns", "m", src, run="r", run_uid="uid-1", metadata={"run": {"uid": "uid-1"}}
        )
        with lock:
            results.append((version.version, created))

    threads = [threading.Thread(target=promote) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [(1, False)] * 7 + [(1, True)]
    store = Store(tmp_path / "reg")
    assert store.get("ns", "m").manifest["run"] == {"name": "r", "uid": "uid-1"}
    # Another run, or the same name with another uid (a new run of that name), publishes.
    assert store.publish_run("ns", "m", src, run="r", run_uid="uid-2")[0].version == 2
    assert store.publish_run("ns", "m", src, run="s", run_uid="uid-1")[0].version == 3


def test_paths_and_links_out_of_a_namespace_are_refused(tmp_path: Path) -> None:
    store = Store(tmp_path / "reg")
    secret = tmp_path / "reg" / "b" / "runs" / "s" / "outputs" / "model.pt"
    secret.parent.mkdir(parents=True)
    secret.write_bytes(b"b's")
    outputs = tmp_path / "reg" / "a" / "runs" / "r" / "outputs"
    outputs.mkdir(parents=True)
    (outputs / "model.pt").write_bytes(b"a's")
    assert store.inside("a", outputs / "model.pt") == (outputs / "model.pt").resolve()
    with pytest.raises(OutsideNamespace):
        store.inside("a", store.run_dir("a", "r") / "../../../b/runs/s/outputs/model.pt")
    (outputs / "link.pt").symlink_to(secret)
    with pytest.raises(OutsideNamespace):
        store.inside("a", outputs / "link.pt")
    (tmp_path / "reg" / "c").symlink_to(tmp_path / "reg" / "b")  # a namespace that is a link
    with pytest.raises(OutsideNamespace):
        store.inside("c", store.run_dir("c", "s") / "outputs" / "model.pt")
    with pytest.raises(OutsideNamespace, match=r"link\.pt is a link"):
        store.publish("a", "m", outputs, within=tmp_path / "reg" / "a")
    assert store.versions("a", "m") == []
    # Local mode (no ``within``) follows links as before.
    assert store.publish("a", "m", outputs).manifest["totalBytes"] == 6


def test_a_link_that_stays_in_the_namespace_is_published_and_one_out_is_named(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "reg")
    outputs = tmp_path / "reg" / "a" / "runs" / "r" / "outputs"
    outputs.mkdir(parents=True)
    (outputs / "model.pt").write_bytes(b"a's")
    (outputs / "latest.pt").symlink_to(outputs / "model.pt")
    within = tmp_path / "reg" / "a"
    assert store.publish("a", "m", outputs, within=within).manifest["totalBytes"] == 6
    with pytest.raises(OutsideNamespace) as refused:
        store.inside("a", outputs / "../../../../elsewhere")
    assert str(refused.value) == f"{outputs / '../../../../elsewhere'} leads out of namespace a"


@pytest.mark.parametrize(
    ("n", "said"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (5 << 20, "5.0 MiB"),
        (3 << 30, "3.0 GiB"),
        (2048 << 40, "2048.0 TiB"),
    ],
)
def test_sizes_are_said_in_binary_units(n: int, said: str) -> None:
    assert human_size(n) == said


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        (
            {"model": "x"},
            "metadata key 'model' is the registry's own key; allowed: "
            + ", ".join(sorted(METADATA_KEYS)),
        ),
        (
            {"color": "x"},
            "metadata key 'color' is not an allowed key; allowed: "
            + ", ".join(sorted(METADATA_KEYS)),
        ),
        ({"run": "r"}, 'metadata "run" must be an object {"name", "uid"}'),
        (
            {"run": {"name": 1}},
            "metadata run.name is not allowed: run holds the strings "
            + ", ".join(sorted(RUN_KEYS)),
        ),
    ],
)
def test_caller_metadata_that_is_not_allowed_is_refused_saying_what_is(
    metadata: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError) as refused:
        check_metadata(metadata)
    assert str(refused.value) == message


def test_the_layout_is_namespace_then_runs_snapshots_and_models(tmp_path: Path) -> None:
    store = Store(tmp_path / "reg")
    root = tmp_path / "reg"
    assert store.run_dir("a", "r") == root / "a" / "runs" / "r"
    assert store.snapshot_path("a", "f00d") == root / "a" / "snapshots" / "f00d.tar.gz"
    assert store.model_dir("a", "m") == root / "a" / "models" / "m"


def test_a_versions_metrics_come_from_its_metrics_json_unless_the_caller_gives_them(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "reg")
    src = tmp_path / "out"
    src.mkdir()
    (src / "model.pt").write_bytes(b"w")
    (src / "metrics.json").write_text('{"acc": 0.9, "epoch": 3, "note": "best"}')
    first = store.publish("a", "m", src)
    assert first.model == "m" and first.version == 1
    assert first.manifest["metrics"] == {"acc": 0.9, "epoch": 3.0}  # numbers only
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", first.manifest["created"])
    given = store.publish("a", "m", src, metadata={"metrics": {"loss": 0.1}})
    assert given.manifest["metrics"] == {"loss": 0.1}
    (src / "metrics.json").write_text("[not an object")
    assert "metrics" not in store.publish("a", "m", src).manifest
    # each version by its number, the newest without one; the manifest as written
    assert store.get("a", "m", 1).manifest == first.manifest
    assert store.get("a", "m", 2).manifest["metrics"] == {"loss": 0.1}
    assert store.get("a", "m").version == 3 and store.get("a", "m").model == "m"
    text = (store.model_dir("a", "m") / "1" / "manifest.json").read_text()
    assert text == json.dumps(first.manifest, indent=2, sort_keys=True)


def test_a_missing_model_or_version_is_a_key_error_saying_which(tmp_path: Path) -> None:
    store = Store(tmp_path / "reg")
    with pytest.raises(KeyError, match="model a/m has no versions"):
        store.get("a", "m")
    src = tmp_path / "out"
    src.mkdir()
    (src / "model.pt").write_bytes(b"w")
    store.publish("a", "m", src)
    with pytest.raises(KeyError, match="model a/m has no version 7"):
        store.get("a", "m", 7)
    with pytest.raises(FileNotFoundError, match=f"nothing to register: {tmp_path / 'none'}"):
        store.publish("a", "m", tmp_path / "none")


def test_a_run_archive_has_outputs_and_logs_and_replaces_the_one_before(tmp_path: Path) -> None:
    store = Store(tmp_path / "reg")
    dest = store.archive_run("a", "r", outputs=None, logs={})
    assert sorted(p.name for p in dest.iterdir()) == ["logs", "outputs"]
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.pt").write_bytes(b"w")
    store.archive_run("a", "r", outputs=out, logs={})
    assert (dest / "outputs" / "model.pt").read_bytes() == b"w"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["r"]  # no old one left beside


def test_an_archive_copies_a_single_file_and_the_files_links_point_at(tmp_path: Path) -> None:
    store = Store(tmp_path / "reg")
    single = tmp_path / "model.pt"
    single.write_bytes(b"w")
    dest = store.archive_run("a", "one", outputs=single, logs={})
    assert (dest / "outputs" / "model.pt").read_bytes() == b"w"
    out = tmp_path / "out"
    out.mkdir()
    (out / "real.pt").write_bytes(b"r")
    (out / "latest.pt").symlink_to(out / "real.pt")
    dest = store.archive_run("a", "two", outputs=out, logs={})
    copied = dest / "outputs" / "latest.pt"
    assert not copied.is_symlink() and copied.read_bytes() == b"r"


def test_a_run_is_published_once_even_beside_a_damaged_version(tmp_path: Path) -> None:
    store = Store(tmp_path / "reg")
    src = tmp_path / "out"
    src.mkdir()
    (src / "model.pt").write_bytes(b"w")
    store.publish("a", "m", src)
    (store.model_dir("a", "m") / "1" / "manifest.json").write_text("{damaged")
    meta = {"run": {"namespace": "a"}}
    made, new = store.publish_run("a", "m", src, run="r", run_uid="u1", metadata=meta)
    assert new and made.version == 2
    assert made.manifest["run"] == {"namespace": "a", "name": "r", "uid": "u1"}
    again, new = store.publish_run("a", "m", src, run="r", run_uid="u1")
    assert not new and again.version == 2


def test_a_store_makes_its_root_with_the_folders_above_it(tmp_path: Path) -> None:
    Store(tmp_path / "a" / "b" / "registry")
    assert (tmp_path / "a" / "b" / "registry").is_dir()
    Store(tmp_path / "a" / "b" / "registry")  # and opens it again
