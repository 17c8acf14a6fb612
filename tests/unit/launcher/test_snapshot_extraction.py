"""Unpacking a source snapshot in the node Pod (``launcher --copy``/``--fetch``): only files
and folders inside the working folder, and at most the snapshot limits, read as a stream.

Every hostile archive here is refused with a LaunchError that names the entry, and leaves
nothing of itself behind."""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest

from torchyard.launch import contract, main, node_files


class Zeros(io.RawIOBase):
    """``size`` zero bytes, made as they are read (a gzip bomb is built without memory)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


Member = tuple[tarfile.TarInfo, IO[bytes] | None]


def file(name: str, data: bytes = b"x") -> Member:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, io.BytesIO(data)


def pax_named(name: str) -> Member:
    """A file whose PAX ``path`` record says ``name`` (a ustar name field ends at a NUL)."""
    info, data = file("placeholder")
    info.pax_headers = {"path": name}
    return info, data


def special(name: str, kind: bytes, linkname: str = "") -> Member:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    return info, None


def folder(name: str) -> Member:
    return special(name, tarfile.DIRTYPE)


def zeros(name: str, size: int) -> Member:
    info = tarfile.TarInfo(name)
    info.size = size
    return info, io.BufferedReader(Zeros(size))


def archive(path: Path, members: list[Member]) -> Path:
    """A .tar.gz of ``members``, written as a stream (PAX, so any name survives)."""
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT, compresslevel=9) as tar:
        for info, data in members:
            if isinstance(data, io.BytesIO):
                data.seek(0)  # the tables' members are made once and may be archived again
            tar.addfile(info, data)
    return path


def files_under(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


# Each: the members (a harmless file first, so that cleaning up is tested too), the
# entry the error must name, and what it must say.
HOSTILE: dict[str, tuple[list[Member], str]] = {
    "dot-dot": ([file("ok.py"), file("../escaped.py")], r"outside the folder.*\.\./escaped"),
    "dot-dot-inside-a-path": (
        [file("ok.py"), file("pkg/../../escaped.py")],
        r"outside the folder.*pkg/\.\./\.\./escaped",
    ),
    "dot-dot-that-stays-inside": (  # '..' is refused by name, even where it lands inside
        [file("ok.py"), folder("pkg"), file("pkg/../inside.py")],
        r"outside the folder \('\.\.'\): 'pkg/\.\./inside\.py'",
    ),
    "absolute-path": ([file("ok.py"), file("/tmp/escaped.py")], r"absolute path.*/tmp/escaped"),
    "symlink-to-a-file-outside": (
        [file("ok.py"), special("passwd", tarfile.SYMTYPE, "/etc/passwd")],
        r"'passwd' is a symbolic link \(to '/etc/passwd'\)",
    ),
    "symlink-to-a-folder-then-a-file-through-it": (
        [file("ok.py"), special("etc", tarfile.SYMTYPE, "/etc"), file("etc/cron.d/evil")],
        r"'etc' is a symbolic link",
    ),
    "relative-symlink": (
        [file("ok.py"), special("up", tarfile.SYMTYPE, "..")],
        r"'up' is a symbolic link",
    ),
    "hardlink": (
        [file("ok.py"), special("shadow", tarfile.LNKTYPE, "/etc/shadow")],
        r"'shadow' is a hard link \(to '/etc/shadow'\)",
    ),
    "hardlink-to-a-member": (
        [file("ok.py"), special("again.py", tarfile.LNKTYPE, "ok.py")],
        r"'again.py' is a hard link",
    ),
    "character-device": (
        [file("ok.py"), special("null", tarfile.CHRTYPE)],
        r"'null' is a device",
    ),
    "block-device": ([file("ok.py"), special("sda", tarfile.BLKTYPE)], r"'sda' is a device"),
    "fifo": ([file("ok.py"), special("pipe", tarfile.FIFOTYPE)], r"'pipe' is a FIFO"),
    "nul-in-a-name": (
        [file("ok.py"), pax_named("train.py\x00.txt")],
        r"NUL byte.*train\.py\\x00\.txt",
    ),
    "a-file-named-dot": ([file("ok.py"), file(".")], r"file without a name"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_members_are_refused_naming_them_and_nothing_stays(
    tmp_path: Path, case: str
) -> None:
    members, message = HOSTILE[case]
    tar = archive(tmp_path / "evil.tar.gz", members)
    work = tmp_path / "sandbox" / "work"
    with pytest.raises(contract.LaunchError, match=message):
        node_files.extract_snapshot(str(tar), str(work))
    assert files_under(work) == []  # ok.py was unpacked first, then taken back
    assert files_under(tmp_path / "sandbox") == ["work"]
    assert not (tmp_path / "escaped.py").exists()


def test_an_encoded_traversal_is_only_a_strange_name_inside_the_folder(tmp_path: Path) -> None:
    tar = archive(tmp_path / "s.tar.gz", [file("%2e%2e/%2e%2e/x.py", b"1"), file("..a", b"2")])
    work = tmp_path / "work"
    assert node_files.extract_snapshot(str(tar), str(work)) == 2
    assert (work / "%2e%2e" / "%2e%2e" / "x.py").read_bytes() == b"1"
    assert (work / "..a").read_bytes() == b"2"


@pytest.mark.parametrize("link_to_folder", [True, False], ids=["folder-link", "file-link"])
def test_a_link_already_in_the_working_folder_is_not_written_through(
    tmp_path: Path, link_to_folder: bool
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.py").write_text("original")
    work = tmp_path / "work"
    work.mkdir()
    if link_to_folder:
        (work / "lib").symlink_to(outside)
        name = "lib/victim.py"
    else:
        (work / "train.py").symlink_to(outside / "victim.py")
        name = "train.py"
    tar = archive(tmp_path / "s.tar.gz", [file(name, b"overwritten")])
    with pytest.raises(contract.LaunchError, match="outside the folder"):
        node_files.extract_snapshot(str(tar), str(work))
    assert (outside / "victim.py").read_text() == "original"


def test_a_file_already_there_is_replaced_whole(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("a longer file that was there before")
    tar = archive(tmp_path / "s.tar.gz", [file("train.py", b"new")])
    assert node_files.extract_snapshot(str(tar), str(work)) == 1
    assert (work / "train.py").read_bytes() == b"new"


def test_a_refused_snapshot_takes_back_only_what_it_made(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("there before")
    members = [file("train.py", b"new"), file("made.py"), file("../escaped.py")]
    with pytest.raises(contract.LaunchError, match="outside the folder"):
        node_files.extract_snapshot(str(archive(tmp_path / "s.tar.gz", members)), str(work))
    assert files_under(work) == ["train.py"]


@pytest.mark.parametrize(
    ("mode", "unpacked"),
    [(0o755, 0o755), (0o700, 0o755), (0o100, 0o755), (0o600, 0o644), (0o666, 0o644)],
)
def test_a_file_is_executable_when_any_of_its_execute_bits_was_set(
    tmp_path: Path, mode: int, unpacked: int
) -> None:
    info, data = file("run.sh")
    info.mode = mode
    node_files.extract_snapshot(
        str(archive(tmp_path / "s.tar.gz", [(info, data)])), str(tmp_path / "w")
    )
    assert (tmp_path / "w" / "run.sh").stat().st_mode & 0o777 == unpacked


def test_a_gzip_bomb_at_the_default_limit_stops_before_inflating(tmp_path: Path) -> None:
    """1 GiB + 1 byte of zeros: about 1 MiB compressed, refused from its header alone."""
    size = (1 << 30) + 1  # the default limit, as the registry service's
    tar = archive(tmp_path / "bomb.tar.gz", [file("train.py", b"print(1)\n"), zeros("z", size)])
    assert tar.stat().st_size < 8 << 20
    work = tmp_path / "work"
    started = time.process_time()
    with pytest.raises(contract.LaunchError, match=r"more than 1073741824 bytes \(at 'z'"):
        node_files.extract_snapshot(str(tar), str(work))
    assert time.process_time() - started < 1.0  # inflating 1 GiB takes seconds
    assert files_under(work) == []


def test_many_small_files_add_up_to_the_limit(tmp_path: Path) -> None:
    tar = archive(tmp_path / "s.tar.gz", [zeros(f"part-{i}.bin", 400) for i in range(5)])
    with pytest.raises(
        contract.LaunchError,
        match=r"more than 1000 bytes \(at 'part-2.bin', 400 bytes\); leave large files out of "
        r"the snapshot \(.torchyardignore\) or raise TORCHYARD_SNAPSHOT_MAX_BYTES",
    ):
        node_files.extract_snapshot(str(tar), str(tmp_path / "w"), max_bytes=1000)
    assert files_under(tmp_path / "w") == []
    assert node_files.extract_snapshot(str(tar), str(tmp_path / "w2"), max_bytes=2000) == 5


def test_the_number_of_entries_is_limited_too(tmp_path: Path) -> None:
    members: list[Member] = [folder("d")] + [file(f"d/{i}.py", b"") for i in range(20)]
    tar = archive(tmp_path / "s.tar.gz", members)
    said = (
        r"more than 10 entries \(at 'd/9.py'\); leave files out of the snapshot "
        r"\(.torchyardignore\) or raise TORCHYARD_SNAPSHOT_MAX_FILES"
    )
    with pytest.raises(contract.LaunchError, match=said):
        node_files.extract_snapshot(str(tar), str(tmp_path / "w"), max_files=10)
    assert files_under(tmp_path / "w") == []


def test_the_limits_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tar = archive(tmp_path / "s.tar.gz", [zeros("data.bin", 5000), file("b.py"), file("c.py")])
    monkeypatch.setenv("TORCHYARD_SNAPSHOT_MAX_BYTES", "4096")
    with pytest.raises(contract.LaunchError, match="TORCHYARD_SNAPSHOT_MAX_BYTES"):
        node_files.extract_snapshot(str(tar), str(tmp_path / "w"))
    monkeypatch.setenv("TORCHYARD_SNAPSHOT_MAX_BYTES", "8192")
    monkeypatch.setenv("TORCHYARD_SNAPSHOT_MAX_FILES", "2")
    with pytest.raises(contract.LaunchError, match="TORCHYARD_SNAPSHOT_MAX_FILES"):
        node_files.extract_snapshot(str(tar), str(tmp_path / "w"))
    monkeypatch.setenv("TORCHYARD_SNAPSHOT_MAX_FILES", "3")
    assert node_files.extract_snapshot(str(tar), str(tmp_path / "w")) == 3


@pytest.mark.parametrize(
    ("value", "message"),
    [("lots", "must be an integer, got 'lots'"), ("0", "must be a positive integer")],
)
def test_a_bad_limit_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.setenv("TORCHYARD_SNAPSHOT_MAX_BYTES", value)
    with pytest.raises(contract.LaunchError, match=f"TORCHYARD_SNAPSHOT_MAX_BYTES {message}"):
        contract.snapshot_limits()


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: b"not a gzip stream at all",
        lambda data: data[: len(data) // 2],  # cut short in the middle of a member
    ],
    ids=["not-gzip", "truncated"],
)
def test_a_damaged_archive_is_a_clear_error(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    good = archive(tmp_path / "s.tar.gz", [file("a.py", os.urandom(64 << 10))])
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(damage(good.read_bytes()))
    with pytest.raises(contract.LaunchError, match="cannot unpack the snapshot"):
        node_files.extract_snapshot(str(bad), str(tmp_path / "w"))
    assert files_under(tmp_path / "w") == []


def test_what_is_not_a_gzip_at_all_is_refused_before_any_entry(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a gzip stream")
    with pytest.raises(contract.LaunchError) as refused:
        node_files.extract_snapshot(str(bad), str(tmp_path / "w"))
    assert str(refused.value).startswith(f"cannot unpack the snapshot {bad}: ")


def test_the_launcher_reports_a_refused_snapshot_and_fails_before_any_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    volume = tmp_path / "configmap"
    volume.mkdir()
    archive(volume / contract.SNAPSHOT, [zeros("weights.bin", 1 << 20)])
    monkeypatch.setenv("TORCHYARD_SNAPSHOT_MAX_BYTES", str(1 << 19))
    termination = tmp_path / "termination-log"
    monkeypatch.setenv("TORCHYARD_TERMINATION_LOG", str(termination))
    work = tmp_path / "work"
    ran = tmp_path / "ran"
    command = [sys.executable, "-c", f"open({str(ran)!r}, 'w').close()"]
    code = main.main(["--copy", str(volume), str(work), "--", *command])
    assert code == 1
    err = capsys.readouterr().err
    assert "'weights.bin'" in err and "TORCHYARD_SNAPSHOT_MAX_BYTES" in err
    assert files_under(work) == []
    assert not ran.exists()  # no rank started
    message = json.loads(termination.read_text())
    assert message["reason"] == "LaunchError" and message["exitCode"] == 1
    assert "TORCHYARD_SNAPSHOT_MAX_BYTES" in message["message"]
