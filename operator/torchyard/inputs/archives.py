"""Unpacking an archive input (tar in any compression, or zip) into a staging folder.

Whether a file is an archive is its name's business (:func:`is_archive`, the suffixes the
docs list); which reader opens it is the file's: :func:`format_of` reads its first bytes
(``FORMATS``), so the staging file, which has no suffix, is read the same in local mode
and in the fetch Job, and an archive whose suffix lies is read as what it is. Only
regular files and folders, every path inside the folder: absolute names, ``..`` (plain
or %-encoded), backslashes, NUL bytes, symbolic and hard links, devices and FIFOs are
refused with the member's name, and the archive as a whole is refused (nothing of it is
used: the caller throws the staging folder away). Sizes are checked from each member's
header before a byte is inflated, so an archive that unpacks to more than the cache
allows (a "zip bomb") costs neither the disk nor minutes. Members that the input's
include and exclude patterns leave out are skipped unread. Standard library only; tested
with hostile archives in tests/unit/inputs/test_archives.py.
"""

from __future__ import annotations

import os
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Literal

from torchyard.inputs import patterns
from torchyard.inputs.base import InputError

SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".zip")
MAX_MEMBERS = 1_000_000


def is_archive(name: str) -> bool:
    return name.lower().endswith(SUFFIXES)


def member_path(name: str) -> str:
    """The member's relative path; InputError when it could land outside the folder."""
    if "\x00" in name or "\\" in name:
        raise InputError(f"the archive has a name with a NUL byte or backslash: {name!r}")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise InputError(f"the archive has an absolute path: {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." or p.lower() in ("%2e%2e", ".%2e", "%2e.") for p in parts):
        raise InputError(f"the archive has a path outside its folder ('..'): {name!r}")
    return "/".join(parts)


class _Budget:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.total = 0
        self.members = 0

    def take(self, name: str, size: int) -> None:
        self.members += 1
        if self.members > MAX_MEMBERS:
            raise InputError(f"the archive holds more than {MAX_MEMBERS} members")
        self.total += size
        if self.total > self.max_bytes:
            raise InputError(
                f"the archive unpacks to more than {self.max_bytes} bytes (at {name!r}): "
                "over the inputs cache's limit; narrow it with include patterns or ask "
                "for a larger cache (the operator's inputs cache size)"
            )


Member = tuple[str, int, bool, "IO[bytes] | None"]  # name, size, is a folder, its bytes


def _tar_members(path: str, mode: Literal["r:", "r:gz", "r:bz2", "r:xz"]) -> Iterator[Member]:
    with tarfile.open(path, mode) as tar:
        for member in tar:
            if member.isdir():
                yield member.name, 0, True, None
                continue
            if not member.isfile():
                kind = "a link" if member.issym() or member.islnk() else "not a regular file"
                raise InputError(
                    f"the archive may hold only files and folders: {member.name!r} is {kind}"
                )
            yield member.name, member.size, False, tar.extractfile(member)


def _zip_members(path: str) -> Iterator[Member]:
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            mode = (info.external_attr >> 16) & 0o170000
            if mode and mode not in (0o100000, 0o040000):
                raise InputError(
                    f"the archive may hold only files and folders: {info.filename!r} is not "
                    "a regular file (a link?)"
                )
            if info.is_dir():
                yield info.filename, 0, True, None
                continue
            with archive.open(info) as source:
                yield info.filename, info.file_size, False, source


@dataclass(frozen=True)
class Format:
    """One archive format: the bytes at ``offset`` that mark it, and its reader."""

    name: str
    magic: bytes
    offset: int
    members: Callable[[str], Iterator[Member]]


FORMATS = (
    Format("zip", b"PK\x03\x04", 0, _zip_members),
    Format("zip", b"PK\x05\x06", 0, _zip_members),  # an empty zip
    Format("tar.gz", b"\x1f\x8b", 0, lambda path: _tar_members(path, "r:gz")),
    Format("tar.bz2", b"BZh", 0, lambda path: _tar_members(path, "r:bz2")),
    Format("tar.xz", b"\xfd7zXZ\x00", 0, lambda path: _tar_members(path, "r:xz")),
    Format("tar", b"ustar", 257, lambda path: _tar_members(path, "r:")),
)


def format_of(path: str) -> Format:
    """The format of the archive at ``path``, by its first bytes; InputError for a file
    that is none of ``FORMATS``."""
    with open(path, "rb") as file:
        head = file.read(max(each.offset + len(each.magic) for each in FORMATS))
    for candidate in FORMATS:
        if head[candidate.offset : candidate.offset + len(candidate.magic)] == candidate.magic:
            return candidate
    raise InputError(
        "cannot unpack the archive: it is not a zip or tar archive (plain, gzip, bzip2 or "
        f"xz); its first bytes are {head[:16]!r}: check that the URL serves the archive "
        "itself (not a web page)"
    )


def unpack(
    path: str, dest: str, include: tuple[str, ...], exclude: tuple[str, ...], max_bytes: int
) -> int:
    """Unpack the archive at ``path`` into ``dest`` (a fresh folder); the bytes written.
    Members whose paths the patterns leave out are skipped; InputError for a hostile
    member, a member over ``max_bytes`` or an archive that cannot be read."""
    budget = _Budget(max_bytes)
    members = format_of(path).members(path)
    try:
        for name, size, is_dir, source in members:
            rel = member_path(name)
            if is_dir or not rel or not patterns.included(rel, include, exclude):
                continue
            budget.take(name, size)
            _write(source, os.path.join(dest, rel), size, name)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as err:
        raise InputError(f"cannot unpack the archive: {err}") from None
    return budget.total


def _write(source: IO[bytes] | None, target: str, size: int, name: str) -> None:
    if source is None:
        raise InputError(f"cannot read {name!r} from the archive")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    # O_EXCL and O_NOFOLLOW: a second member of the same name is refused, and nothing is
    # ever written through a link.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(target, flags, 0o644)
    except FileExistsError:
        raise InputError(f"the archive holds {name!r} twice") from None
    written = 0
    with os.fdopen(fd, "wb") as out:
        for block in iter(lambda: source.read(1 << 20), b""):
            written += len(block)
            if written > size:
                raise InputError(f"{name!r} is longer than its archive header says")
            out.write(block)
