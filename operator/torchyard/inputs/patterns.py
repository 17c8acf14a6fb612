"""Which files of an input its include and exclude patterns keep.

A pattern is matched against a file's path relative to the input's folder, with
``fnmatch``'s rules on the whole path (``*`` also crosses '/'), and also against the
file's name alone: ``*.jpg`` keeps every JPEG at any depth, ``train/*`` a folder. No
include: every file. Standard library only; tested in tests/unit/inputs/test_fetch.py.
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Sequence


def _matches(path: str, patterns: Sequence[str]) -> bool:
    name = posixpath.basename(path)
    return any(fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(name, p) for p in patterns)


def included(path: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """Whether the file at ``path`` is kept."""
    if include and not _matches(path, include):
        return False
    return not _matches(path, exclude)
