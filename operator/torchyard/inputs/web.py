"""The ``https://`` (and ``http://``) scheme: one file, pinned by its sha256; an archive
(by its name's suffix: .tar, .tar.gz, .tgz, .zip ...) is unpacked, read as the format its
first bytes say (``archives.format_of``), any other file is kept under its name.

The download goes to ``download.part`` in the staging folder (resumed with a Range
request when a killed fetch left one), is checked against the sha256 and renamed to
``download.ok``: a fetch killed while it unpacks does not download again. Standard
library only; tested against a local server in tests/unit/inputs/test_fetch.py.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import urllib.parse
from collections.abc import Mapping

from torchyard.inputs import archives, patterns, transfer
from torchyard.inputs.base import SHA256, InputError, InputScheme, Source
from torchyard.inputs.cache import DATA, sha256_file

PART = "download.part"
DONE = "download.ok"


def file_name(uri: str) -> str:
    """The name the file is kept under: the URL path's last segment, else 'download'."""
    name = urllib.parse.unquote(posixpath.basename(urllib.parse.urlsplit(uri).path))
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
        return "download"
    return name


def fetch(source: Source, staging: str, env: Mapping[str, str], max_bytes: int) -> int:
    """Fill ``staging/data``; the bytes received over the network."""
    done = os.path.join(staging, DONE)
    received = 0
    if not os.path.isfile(done):
        part = os.path.join(staging, PART)
        received = transfer.download(source.uri, part, max_bytes)
        got = sha256_file(part)
        if got != source.sha256:
            os.unlink(part)  # a wrong file is never resumed
            raise InputError(
                f"{source.uri}: its sha256 is {got}, the input says {source.sha256}: the "
                "file changed at its source, or the sha256 in the spec is wrong"
            )
        os.rename(part, done)
    data = os.path.join(staging, DATA)
    shutil.rmtree(data, ignore_errors=True)  # what a killed unpacking left
    os.makedirs(data)
    name = file_name(source.uri)
    if archives.is_archive(name):
        archives.unpack(done, data, source.include, source.exclude, max_bytes)
    elif patterns.included(name, source.include, source.exclude):
        try:
            os.link(done, os.path.join(data, name))
        except OSError:  # a volume without hard links
            shutil.copyfile(done, os.path.join(data, name))
    return received


def check(uri: str, sha256: str) -> None:
    """InputError unless ``uri`` names a host, holds no credentials, and ``sha256`` pins it."""
    parts = urllib.parse.urlsplit(uri)
    if not parts.hostname:
        raise InputError(f"{uri!r} names no host: write https://host/path")
    if parts.username or parts.password:
        raise InputError(
            f"{uri!r} holds credentials: a spec is readable by everyone who can read "
            "the run; serve the file without them"
        )
    if not re.match(SHA256, sha256 or ""):
        raise InputError(
            f"{uri!r} needs sha256 (64 lower-case hex digits, e.g. the output of "
            "`sha256sum FILE`): a web input is pinned and checked by its digest"
        )


class Web(InputScheme):
    """``https://``: a file (or an archive, unpacked), pinned by its sha256."""

    TYPE = "https"
    SUMMARY = (
        "https://host/path (a file, or an archive .tar, .tar.gz, .tgz, .zip unpacked; needs sha256)"
    )
    FORM = "https://host/path (with sha256)"
    PATTERN = r"https?://[^/@\s]+(/\S*)?"
    PINNED_BY_SHA256 = True

    def check(self, uri: str, sha256: str) -> None:
        check(uri, sha256)

    def fetch(self, source: Source, staging: str, env: Mapping[str, str], max_bytes: int) -> int:
        return fetch(source, staging, env, max_bytes)


class PlainWeb(Web):
    """``http://``: as https, in the clear (the sha256 still pins the content)."""

    TYPE = "http"
    SUMMARY = "http://host/path (as https://)"
    FORM = ""
    PATTERN = ""  # https's covers it
