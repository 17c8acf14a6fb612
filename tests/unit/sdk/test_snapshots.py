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
    first = snapshots.snapshot(src)
    os.utime(src / "train.py", (1, 1))  # only times change
    second = snapshots.snapshot(src)
    assert first.sha256 == second.sha256
    assert first.configmap_name == second.configmap_name
    assert members(second.data()) == {
        "lib/util.py": b"X = 1\n",
        "train.py": b"print(1)\n",
    }
    (src / "train.py").write_text("print(2)\n")
    assert snapshots.snapshot(src).sha256 != first.sha256
    assert first.fits_configmap
    assert "2 files" in first.report()


def test_an_empty_or_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(snapshots.SnapshotError, match="does not exist"):
        snapshots.snapshot(tmp_path / "nope")
    tree(tmp_path / "ignored", {".torchyardignore": "*\n"})
    with pytest.raises(snapshots.SnapshotError, match="nothing to snapshot"):
        snapshots.snapshot(tmp_path / "ignored")
