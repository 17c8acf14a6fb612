"""Source snapshots: ignore files with gitignore rules, secrets refused, and the same code
always gives the same archive (so re-submitting creates nothing new)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from torchyard.sdk import snapshots


def members(archive: bytes) -> dict[str, bytes]:
    """The files of a snapshot archive."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    ("pattern", "path", "is_dir", "ignored"),
    [
        ("*.ckpt", "a/b/model.ckpt", False, True),
        ("/data", "data", True, True),
        ("/data", "src/data", True, False),
        ("data/", "data", False, False),  # folders only
        ("logs/*.txt", "logs/a.txt", False, True),
        ("logs/*.txt", "sub/logs/a.txt", False, False),  # a slash anchors it
        ("**/tmp", "a/b/tmp", True, True),
        ("a/**/z.py", "a/b/c/z.py", False, True),
        ("cache?", "cache1", False, True),
    ],
)
def test_gitignore_patterns(pattern: str, path: str, is_dir: bool, ignored: bool) -> None:
    assert snapshots.ignored(snapshots.parse_ignore([pattern]), path, is_dir) is ignored


def test_the_last_matching_rule_wins_so_negation_keeps_a_file() -> None:
    rules = snapshots.parse_ignore(["# comment", "*.csv", "!keep.csv", ""])
    assert snapshots.ignored(rules, "big.csv", False)
    assert not snapshots.ignored(rules, "keep.csv", False)


def test_torchyardignore_wins_over_amlignore_and_gitignore(tmp_path: Path) -> None:
    tree(
        tmp_path,
        {
            "train.py": "",
            "data/big.bin": "x",
            "notes.md": "",
            ".gitignore": "notes.md\n",
            ".amlignore": "data/\n",
            ".git/config": "",
            "pkg/__pycache__/m.pyc": "",
        },
    )
    files, used, _ = snapshots.collect(tmp_path)
    assert used == ".amlignore"
    assert "data/big.bin" not in files and "notes.md" in files
    assert not any(f.startswith(".git/") or "__pycache__" in f for f in files)
    (tmp_path / ".torchyardignore").write_text("*.md\n")
    files, used, _ = snapshots.collect(tmp_path)
    assert used == ".torchyardignore"
    assert "notes.md" not in files and "data/big.bin" in files


def test_secrets_are_refused_unless_asked(tmp_path: Path) -> None:
    tree(tmp_path, {"train.py": "", ".env": "TOKEN=x", ".env.example": "TOKEN="})
    with pytest.raises(snapshots.SnapshotError, match=r"\.env.*--include-secrets"):
        snapshots.collect(tmp_path)
    files, _, _ = snapshots.collect(tmp_path, include_secrets=True)
    assert ".env" in files and ".env.example" in files


def test_a_private_key_is_found_by_its_content_too(tmp_path: Path) -> None:
    tree(tmp_path, {"train.py": "", "deploy/cert.txt": "-----BEGIN OPENSSH PRIVATE KEY-----\n"})
    with pytest.raises(snapshots.SnapshotError, match=r"deploy/cert\.txt"):
        snapshots.collect(tmp_path)
    (tmp_path / ".torchyardignore").write_text("deploy/\n")
    assert snapshots.collect(tmp_path)[0] == [".torchyardignore", "train.py"]


def test_the_same_code_gives_the_same_archive(tmp_path: Path) -> None:
    src = tree(tmp_path / "src", {"train.py": "print(1)\n", "lib/util.py": "X = 1\n"})
    with snapshots.snapshot(src) as first:
        os.utime(src / "train.py", (1, 1))  # only times change
        with snapshots.snapshot(src) as second:
            assert first.sha256 == second.sha256
            assert first.configmap_name == second.configmap_name
            assert members(second.data()) == {
                "lib/util.py": b"X = 1\n",
                "train.py": b"print(1)\n",
            }
        (src / "train.py").write_text("print(2)\n")
        with snapshots.snapshot(src) as changed:
            assert changed.sha256 != first.sha256
        assert first.fits_configmap
        assert "2 files" in first.report()


def test_the_temporary_archive_is_gone_after_use_or_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(snapshots.tempfile, "tempdir", str(tmp_path / "tmp"))
    src = tree(tmp_path / "src", {"train.py": "print(1)\n", "b.py": ""})
    with snapshots.snapshot(src) as snap:
        assert snap.archive.parent == tmp_path / "tmp"
        assert snap.archive.exists()
    assert not snap.archive.exists()
    # a file collected, then gone before it is archived
    monkeypatch.setattr(snapshots, "collect", lambda *a: (["b.py", "gone.py"], None, 0))
    with pytest.raises(FileNotFoundError):
        snapshots.snapshot(src)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_an_empty_or_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(snapshots.SnapshotError, match="does not exist"):
        snapshots.snapshot(tmp_path / "nope")
    tree(tmp_path / "ignored", {".torchyardignore": "*\n"})
    with pytest.raises(snapshots.SnapshotError, match="nothing to snapshot"):
        snapshots.snapshot(tmp_path / "ignored")


def test_what_runs_write_is_never_snapshotted(tmp_path: Path) -> None:
    """The top-level outputs/ and logs/ (a stale copy would be archived as the run's own),
    virtual environments and test caches; an outputs/ deeper down is code like any other."""
    tree(
        tmp_path,
        {
            "train.py": "",
            "outputs/model.pt": "stale",
            "logs/rank-0.txt": "old",
            ".venv/lib/site.py": "",
            "sub/.venv/x.py": "",
            ".pytest_cache/v": "",
            "pkg/outputs/format.py": "",
            "pkg/logs/__init__.py": "",
        },
    )
    assert snapshots.collect(tmp_path)[0] == [
        "pkg/logs/__init__.py",
        "pkg/outputs/format.py",
        "train.py",
    ]
    (tmp_path / ".torchyardignore").write_text("!/outputs/\n")  # the ignore file may keep it
    assert "outputs/model.pt" in snapshots.collect(tmp_path)[0]


def test_torchyards_own_folders_inside_the_source_are_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tree(
        tmp_path / "project",
        {
            "train.py": "print(1)\n",
            "runs/default-r-1/node-0/train.py": "print(1)\n",
            "runs/default-r-1/node-0/outputs/big.bin": "x" * 1000,
            "state/registry/default/models/m/1/model.pt": "w",
            "state/notes.md": "",
        },
    )
    outside = tmp_path / "elsewhere"
    exclude = [src / "runs", src / "state" / "registry", outside]
    files, _, skipped = snapshots.collect(src, exclude=exclude)
    assert files == ["state/notes.md", "train.py"]
    assert skipped == 0  # left out, not counted as ignored by an ignore file
    with snapshots.snapshot(src, exclude=iter(exclude)) as snap:  # any iterable, read once
        assert sorted(members(snap.data())) == ["state/notes.md", "train.py"]
        assert snap.excluded == ("runs/", "state/registry/")
        assert "left out runs/, state/registry/" in snap.report()
    # A relative path or one with '..' names the same folder.
    monkeypatch.chdir(src)
    assert snapshots.collect(Path("."), exclude=[Path("runs"), Path("x/../state")])[0] == [
        "train.py"
    ]


def test_the_source_folder_itself_cannot_be_where_runs_go(tmp_path: Path) -> None:
    tree(tmp_path, {"train.py": ""})
    with pytest.raises(snapshots.SnapshotError, match="also where torchyard writes"):
        snapshots.collect(tmp_path, exclude=[tmp_path / "sub" / ".."])


def test_a_source_over_the_default_limit_is_refused_naming_its_largest_entries(
    tmp_path: Path,
) -> None:
    """1 GiB + 1 byte in a sparse file (no disk used): refused before anything is read."""
    src = tree(tmp_path, {"train.py": "print(1)\n", "data/small.csv": "a,b\n"})
    with (src / "data" / "big.bin").open("wb") as f:
        f.truncate((1 << 30) + 1)
    (src / "model.ckpt").write_bytes(b"x" * 4096)
    with pytest.raises(snapshots.SnapshotError) as refused:
        snapshots.snapshot(src)
    message = str(refused.value)
    assert "holds 1073745934 bytes, over the 1073741824 bytes a snapshot may hold" in message
    assert "TORCHYARD_SNAPSHOT_MAX_BYTES" in message
    assert "Largest: data/ 1.0 GiB (2 files), model.ckpt 4.0 KiB, train.py 9 B" in message
    assert "largest files: data/big.bin 1.0 GiB" in message
    assert "Leave them out in .torchyardignore" in message


def test_the_size_limits_are_configurable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tree(tmp_path, {"a.py": "x" * 600, "b.py": "x" * 600, "c/d.py": ""})
    monkeypatch.setenv("TORCHYARD_SNAPSHOT_MAX_BYTES", "1000")
    with pytest.raises(snapshots.SnapshotError, match=r"holds 1\.2 KiB, over the 1000 B"):
        snapshots.collect(src)
    (src / ".gitignore").write_text("b.py\n")
    assert snapshots.collect(src)[0] == [".gitignore", "a.py", "c/d.py"]
    monkeypatch.setenv("TORCHYARD_SNAPSHOT_MAX_FILES", "2")
    with pytest.raises(snapshots.SnapshotError, match=r"holds 3 files, over the 2 .*\.gitignore"):
        snapshots.collect(src)
    monkeypatch.setenv("TORCHYARD_SNAPSHOT_MAX_FILES", "none")
    with pytest.raises(snapshots.SnapshotError, match="must be an integer"):
        snapshots.collect(src)


def test_a_link_to_a_file_is_archived_as_the_file_and_other_links_are_left_out(
    tmp_path: Path,
) -> None:
    """As examples/torchrun/train.py -> ../ddp/train.py: the code must arrive."""
    shared = tree(tmp_path / "shared", {"train.py": "print('shared')\n", "lib/m.py": ""})
    src = tree(tmp_path / "src", {"run.yaml": ""})
    (src / "train.py").symlink_to("../shared/train.py")
    (src / "lib").symlink_to(shared / "lib")  # a folder: left out (no loops)
    (src / "gone.py").symlink_to(tmp_path / "missing.py")  # dangling
    (src / "null").symlink_to("/dev/null")  # not a regular file
    files, _, skipped = snapshots.collect(src)
    assert files == ["run.yaml", "train.py"]
    assert skipped == 3
    with snapshots.snapshot(src) as snap:
        assert members(snap.data()) == {"run.yaml": b"", "train.py": b"print('shared')\n"}


@pytest.mark.parametrize(
    ("target", "text"),
    [
        (".ssh/id_rsa", "key"),
        (".aws/credentials", "[default]"),
        ("notes/deploy.txt", "-----BEGIN RSA PRIVATE KEY-----\n"),
    ],
)
def test_a_link_to_a_secret_is_a_secret_whatever_its_own_name(
    tmp_path: Path, target: str, text: str
) -> None:
    tree(tmp_path / "home", {target: text})
    src = tree(tmp_path / "src", {"train.py": ""})
    (src / "config.txt").symlink_to(tmp_path / "home" / target)
    with pytest.raises(snapshots.SnapshotError, match=r"secrets: config\.txt"):
        snapshots.collect(src)
