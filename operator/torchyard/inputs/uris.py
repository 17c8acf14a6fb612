"""What an input's URI names, and the key of its cache entry.

One parser for every side that reads an input: the API (a spec's input is refused when
:func:`parse` refuses it), planning (the fetch Job, the mounts), the fetch Job itself and
local mode. The schemes: ``https://`` and ``http://`` (a file or an archive, pinned by
its sha256), ``model://<name>/<version>`` (a ModelVersion of the torchyard registry) and
``pvc://<claim>[/subpath]`` (a claim mounted read-only, nothing fetched),
``s3://<bucket>[/prefix]`` (the objects under a prefix of an S3-compatible store) and
``hf://[datasets/]<org>/<repo>[@revision]`` (a repository of the Hugging Face Hub).

The cache key is a sha256 of what decides an entry's content: the URI, the resolved
revision (an https input's sha256; a model's version, which the registry never changes,
and the ServiceAccount that reads it; an s3 input's Secret, which names the store and
the credentials; an hf input's revision as written, and its Secret), the include and
exclude patterns and the layout's
FORMAT. Standard library only; tested in tests/unit/inputs/test_uris.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

from torchyard.launch.contract import INPUT_VARIABLE_PREFIX

# Bump when an entry's layout changes: every key changes with it.
FORMAT = "1"
FETCHED_SCHEMES = ("https", "http", "model", "s3", "hf")
SCHEMES = (*FETCHED_SCHEMES, "pvc")
# An input's name: what TORCHYARD_INPUT_<NAME> is made of (upper-cased).
NAME = r"^[a-z][a-z0-9_]{0,31}$"
SHA256 = r"^[a-f0-9]{64}$"
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_MODEL = re.compile(r"^model://(" + _DNS1123_LABEL + r")(?:/([1-9][0-9]{0,8}))?$")
# A bucket name as S3 allows it (3-63 of a-z 0-9 . -), then an optional key prefix.
_BUCKET = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/(.*))?$")
_CLAIM = re.compile(r"^pvc://(" + _DNS1123_LABEL + r")(/(.*))?$")
# A Hub repository: [datasets/][<org>/]<name>, each part of letters, digits, '.', '_', '-'
# (not starting or ending with '.' or '-'), then an optional @revision: a branch, a tag
# or a commit, which may hold '/' (refs/pr/1) but no '.'-only or empty segment.
_HUB_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
_HUB = re.compile(
    r"^hf://(datasets/)?((?:" + _HUB_PART + r"/)?" + _HUB_PART + r")(?:@([A-Za-z0-9._/-]{1,200}))?$"
)
_HUB_REVISION = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9._/-]*[A-Za-z0-9_])?$")
DEFAULT_HUB_REVISION = "main"
COMMIT = re.compile(r"^[0-9a-f]{40}$")
# A path segment that is '.' or '..', written plainly or %-encoded, after either slash.
_DOT_SEGMENT = re.compile(r"(^|[/\\])(\.|%2[eE]){1,2}([/\\]|$)")
# An s3:// URI whose prefix could name a path outside the input's folder, or that a
# store would read otherwise than it is written: a '.' or '..' segment (plain or
# %-encoded), an empty segment (a leading '/' or '//'), a backslash (plain or %-encoded),
# a NUL or a control character. One rule for the CRD's CEL (RE2) and :func:`bucket_of`.
S3_PREFIX_REFUSED = (
    r"^s3://[^/]+/((.*/)?((\.|%2[eE]){1,2}(/.*)?|/.*)|.*(\\|%5[cC]|%00|[\x00-\x1f\x7f]).*)$"
)
# S3's longest key: a longer prefix names nothing.
S3_KEY_MAX_BYTES = 1024


class InputError(ValueError):
    """An input the fetcher cannot take; the message says which and what to do."""


@dataclass(frozen=True)
class Source:
    """One input, as the fetcher sees it."""

    uri: str
    sha256: str = ""
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    # Who reads a model:// input (its ServiceAccount): part of its key, so that a run
    # sees only what its own ServiceAccount may read.
    reader: str = ""
    # The Secret an s3:// input reads the store with: part of its key, as the reader is.
    secret: str = ""

    @property
    def scheme(self) -> str:
        return scheme_of(self.uri)

    @property
    def revision(self) -> str:
        """What pins the content: the sha256 (web), the model's version, or the Hub
        revision as written (a branch, a tag or a commit; the fetcher resolves it)."""
        if self.scheme == "model":
            return model_of(self.uri)[1]
        if self.scheme == "hf":
            return hub_repo_of(self.uri).revision
        return self.sha256

    @property
    def key(self) -> str:
        return cache_key(self)


def scheme_of(uri: str) -> str:
    return uri.split("://", 1)[0] if "://" in uri else ""


def env_name(name: str) -> str:
    """The variable that holds an input's folder: TORCHYARD_INPUT_<NAME>."""
    return INPUT_VARIABLE_PREFIX + name.upper()


def model_of(uri: str) -> tuple[str, str]:
    """(model, version) of a model:// URI, the version '' when it names none (the
    latest, which the operator or local mode pins before the fetch); InputError when it
    is not one."""
    match = _MODEL.match(uri)
    if match is None:
        raise InputError(
            f"{uri!r} is not a model input: write model://<model>[/<version>], the model's "
            "name as registered (a DNS-1123 label) and a version number (e.g. model://birds/3; "
            "none: the latest)"
        )
    return match.group(1), match.group(3) or ""


def bucket_of(uri: str) -> tuple[str, str]:
    """(bucket, key prefix) of an s3:// URI, the prefix '' or ending in '/'; InputError
    when it is not one or the prefix has a '.', '..' or empty segment."""
    match = _BUCKET.match(uri)
    if match is None:
        raise InputError(
            f"{uri!r} is not an s3 input: write s3://<bucket>[/prefix], the bucket's name "
            "3 to 63 of a-z, 0-9, '.' and '-'"
        )
    prefix = match.group(3) or ""
    if re.match(S3_PREFIX_REFUSED, uri, re.DOTALL):
        raise InputError(
            f"{uri!r}: the prefix may not hold a '.', '..' or empty segment (nor start "
            "with '/'), plain or %-encoded, a backslash, a NUL or a control character"
        )
    if len(prefix.encode()) > S3_KEY_MAX_BYTES:
        raise InputError(
            f"{uri[:80]!r}...: the prefix is {len(prefix.encode())} bytes; an S3 key is at "
            f"most {S3_KEY_MAX_BYTES}"
        )
    return match.group(1), prefix.rstrip("/") + "/" if prefix.strip("/") else ""


@dataclass(frozen=True)
class HubRepo:
    """What an hf:// URI names: a repository of the Hub at a revision."""

    kind: str  # "model" or "dataset", as huggingface_hub's repo_type
    repo_id: str
    revision: str


def hub_repo_of(uri: str) -> HubRepo:
    """The repository and revision of an hf:// URI; InputError when it is not one or a
    part would not stay a name on the Hub ('..', '--', '%', an empty segment)."""
    match = _HUB.match(uri)
    if match is None or "--" in match.group(2) or ".." in match.group(2):
        raise InputError(
            f"{uri!r} is not a Hub input: write hf://<org>/<repo>[@revision] (a model) or "
            "hf://datasets/<org>/<repo>[@revision], the names of letters, digits, '.', '_' "
            "and '-' (no '..' nor '--')"
        )
    revision = match.group(3)
    if revision is not None and (
        not _HUB_REVISION.match(revision)
        or _DOT_SEGMENT.search(revision)
        or ".." in revision
        or "//" in revision
        or revision.endswith(".lock")
        or any(part.startswith(".") for part in revision.split("/"))
    ):
        raise InputError(
            f"{uri!r}: the revision must be a branch, a tag or a commit (letters, digits, "
            "'.', '_', '-' and '/' between names; no '..', empty or '.'-led segment)"
        )
    kind = "dataset" if match.group(1) else "model"
    return HubRepo(kind, match.group(2), revision or DEFAULT_HUB_REVISION)


def claim_of(uri: str) -> tuple[str, str]:
    """(claim, subpath) of a pvc:// URI; InputError when it is not one or the subpath
    leaves the claim."""
    match = _CLAIM.match(uri)
    if match is None:
        raise InputError(
            f"{uri!r} is not a claim input: write pvc://<claim>[/subpath], the claim's "
            "name a DNS-1123 label"
        )
    sub = (match.group(4) or "").strip("/")
    if _DOT_SEGMENT.search(sub) or "\\" in sub or "//" in sub or "\x00" in sub:
        raise InputError(
            f"{uri!r}: the subpath must stay inside the claim (no '.', '..', "
            "backslash or empty segment, plain or %-encoded)"
        )
    return match.group(1), sub


def _web(uri: str, sha256: str) -> None:
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


def parse(uri: str, sha256: str = "") -> str:
    """The URI's scheme once it is one the fetcher takes; InputError otherwise."""
    scheme = scheme_of(uri)
    if "\x00" in uri or any(c.isspace() for c in uri):
        raise InputError(f"{uri!r}: a URI may not hold a NUL byte or white space")
    if scheme in ("https", "http"):
        _web(uri, sha256)
    elif scheme == "model":
        model_of(uri)
    elif scheme == "pvc":
        claim_of(uri)
    elif scheme == "s3":
        bucket_of(uri)
    elif scheme == "hf":
        hub_repo_of(uri)
    else:
        raise InputError(
            f"{uri!r}: unknown scheme {scheme + '://' if scheme else '(none)'}; an input is "
            "https:// (with sha256), model://<model>/<version>, pvc://<claim>[/subpath], "
            "s3://<bucket>[/prefix] or hf://<org>/<repo>[@revision]"
        )
    if sha256 and scheme not in ("https", "http"):
        raise InputError(f"{uri!r}: sha256 is for https:// inputs only")
    return scheme


def cache_key(source: Source) -> str:
    """The hex sha256 that names the source's cache entry (see the module docstring)."""
    parts = {
        "format": FORMAT,
        "uri": source.uri,
        "revision": source.revision,
        "include": sorted(source.include),
        "exclude": sorted(source.exclude),
    }
    if source.scheme == "model":
        parts["reader"] = source.reader
    if source.scheme in ("s3", "hf"):
        parts["secret"] = source.secret
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def patterns_valid(patterns: Sequence[str]) -> None:
    """InputError for a pattern that could never name a file inside the input."""
    for pattern in patterns:
        if not pattern or pattern.startswith("/") or "\x00" in pattern:
            raise InputError(
                f"pattern {pattern!r}: a pattern is relative to the input's folder "
                "(e.g. 'images/*.jpg'), not empty nor absolute"
            )
