"""Hostile archives: every member that is not a plain file or folder inside the input's
folder is refused with its name, in tar (any compression) and zip alike, and the fetch
that met it leaves no entry (the whole archive is refused, nothing of it is used)."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.unit.inputs import server
from tests.unit.inputs.server import Files, serving
from torchyard.inputs import archives, fetch
from torchyard.inputs.uris import InputError, Source


def tar_with(*members: tarfile.TarInfo, mode: str = "w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for info in members:
            data = b"x" * info.size if info.isfile() else None
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def member(
    name: str, kind: bytes = tarfile.REGTYPE, size: int = 1, link: str = ""
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size if kind == tarfile.REGTYPE else 0
    info.linkname = link
    return info


HOSTILE_TAR = {
    "parent": (member("../evil.txt"), "outside its folder"),
    "nested parent": (member("data/../../evil.txt"), "outside its folder"),
    "encoded parent": (member("%2e%2e/evil.txt"), "outside its folder"),
    "half-encoded parent": (member("data/.%2e/evil.txt"), "outside its folder"),
    "absolute": (member("/etc/evil.txt"), "absolute path"),
    "backslash": (member("..\\evil.txt"), "backslash"),
    "symbolic link": (member("link", tarfile.SYMTYPE, link="/etc/passwd"), "is a link"),
    "relative symbolic link": (member("link", tarfile.SYMTYPE, link="../x"), "is a link"),
    "hard link": (member("hard", tarfile.LNKTYPE, link="/etc/passwd"), "is a link"),
    "device": (member("dev", tarfile.CHRTYPE), "not a regular file"),
    "block device": (member("blk", tarfile.BLKTYPE), "not a regular file"),
    "fifo": (member("fifo", tarfile.FIFOTYPE), "not a regular file"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_TAR))
def test_a_hostile_tar_member_is_refused_by_name(tmp_path: Path, case: str) -> None:
    info, words = HOSTILE_TAR[case]
    path = tmp_path / "a.tar.gz"
    path.write_bytes(tar_with(member("ok.txt"), info))
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(InputError, match=words):
        archives.unpack(str(path), str(dest), (), (), 1 << 20)
    assert not (tmp_path / "evil.txt").exists()


def test_a_member_written_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    path.write_bytes(tar_with(member("same.txt"), member("same.txt"), mode="w"))
    (tmp_path / "out").mkdir()
    with pytest.raises(InputError, match=r"holds 'same\.txt' twice"):
        archives.unpack(str(path), str(tmp_path / "out"), (), (), 1 << 20)


def zip_with(entries: dict[str, tuple[bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, (data, mode) in entries.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            archive.writestr(info, data)
    return buf.getvalue()


HOSTILE_ZIP = {
    "parent": ({"../evil.txt": (b"x", stat.S_IFREG | 0o644)}, "outside its folder"),
    "absolute": ({"/evil.txt": (b"x", stat.S_IFREG | 0o644)}, "absolute path"),
    "drive": ({"C:/evil.txt": (b"x", stat.S_IFREG | 0o644)}, "absolute path"),
    "symbolic link": ({"link": (b"/etc/passwd", stat.S_IFLNK | 0o777)}, "a link"),
    "bomb": ({"zeros": (bytes(2_000_000), stat.S_IFREG | 0o644)}, "more than 100000 bytes"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_ZIP))
def test_a_hostile_zip_member_is_refused(tmp_path: Path, case: str) -> None:
    entries, words = HOSTILE_ZIP[case]
    path = tmp_path / "a.zip"
    path.write_bytes(zip_with(entries))
    (tmp_path / "out").mkdir()
    with pytest.raises(InputError, match=words):
        archives.unpack(str(path), str(tmp_path / "out"), (), (), 100_000)


def test_a_zip_of_files_and_folders_unpacks(tmp_path: Path) -> None:
    path = tmp_path / "a.zip"
    path.write_bytes(zip_with({"d/": (b"", stat.S_IFDIR | 0o755), "d/f.txt": (b"hi", 0)}))
    (tmp_path / "out").mkdir()
    assert archives.unpack(str(path), str(tmp_path / "out"), (), (), 100) == 2
    assert (tmp_path / "out" / "d" / "f.txt").read_bytes() == b"hi"


@pytest.mark.parametrize("suffix", archives.SUFFIXES)
def test_the_format_is_read_from_the_files_first_bytes_not_its_name(
    tmp_path: Path, suffix: str
) -> None:
    path = tmp_path / "download.ok"  # the fetcher's staging file: no suffix
    path.write_bytes(server.archive(suffix, {"d/f.txt": b"hi"}))
    (tmp_path / "out").mkdir()
    assert archives.unpack(str(path), str(tmp_path / "out"), (), (), 100) == 2
    assert (tmp_path / "out" / "d" / "f.txt").read_bytes() == b"hi"


def test_a_file_that_is_no_archive_is_refused_saying_what_it_starts_with(tmp_path: Path) -> None:
    path = tmp_path / "download.ok"
    path.write_bytes(b"<!DOCTYPE html><html>sign in</html>")
    (tmp_path / "out").mkdir()
    with pytest.raises(InputError, match=r"not a zip or tar archive .*b.<!DOCTYPE html><.: check"):
        archives.unpack(str(path), str(tmp_path / "out"), (), (), 100)


def test_a_corrupt_archive_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.tar.gz"
    path.write_bytes(b"\x1f\x8b not really gzip")
    (tmp_path / "out").mkdir()
    with pytest.raises(InputError, match="cannot unpack the archive"):
        archives.unpack(str(path), str(tmp_path / "out"), (), (), 100)


HOSTILE_FETCHES = {
    **{
        case: (".tgz", tar_with(member("ok.txt"), HOSTILE_TAR[case][0]), HOSTILE_TAR[case][1])
        for case in ("parent", "symbolic link", "hard link", "device")
    },
    **{
        f"zip {case}": (".zip", zip_with(HOSTILE_ZIP[case][0]), HOSTILE_ZIP[case][1])
        for case in ("parent", "absolute", "symbolic link")
    },
}


@pytest.mark.parametrize("case", sorted(HOSTILE_FETCHES))
def test_a_fetch_of_a_hostile_archive_leaves_no_entry(tmp_path: Path, case: str) -> None:
    suffix, body, words = HOSTILE_FETCHES[case]
    with serving(Files({f"/x{suffix}": body})) as url:
        source = Source(f"{url}/x{suffix}", hashlib.sha256(body).hexdigest())
        with pytest.raises(InputError, match=words):
            fetch.fetch(source, str(tmp_path / "cache"), 100_000)
    assert not os.path.isdir(tmp_path / "cache" / "entries") or not os.listdir(
        tmp_path / "cache" / "entries"
    )
