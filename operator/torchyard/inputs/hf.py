"""The ``hf://[datasets/]<org>/<repo>[@revision]`` scheme: a repository of the Hugging Face Hub.

Read through ``huggingface_hub``, the Hub's own client (the one module of
``torchyard.inputs`` that needs a package beyond the standard library; the torchyard
image has it). The Hub and the token come from the environment, as the client reads
them: ``HF_ENDPOINT`` (default https://huggingface.co) and ``HF_TOKEN`` (none: the
repository is read anonymously). In the cluster they are the keys of the Secret the
input names (``secretRef``), given to the fetch Job only; in local mode, the shell's.

The fetch resolves the revision (default ``main``) to its commit (``HfApi.repo_info``),
lists the commit's files (``HfApi.list_repo_tree``), keeps the ones the patterns keep
(``torchyard.inputs.patterns``, as for every scheme), and hands exactly those to
``snapshot_download`` as its ``allow_patterns`` (the exclude patterns as its
``ignore_patterns``), pinned to the commit, into ``hf/`` of the staging folder. Each file
is checked against the tree (its size, and its LFS sha256 or its git blob id) and moved
into ``data/``; a killed fetch keeps the files it moved and the client's partial
downloads, which it resumes. The commit is written to ``revision`` for the cache entry.
Tested against a stand-in hub in tests/unit/inputs/test_hf.py.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchyard.inputs import archives, patterns
from torchyard.inputs.base import (
    DOT_SEGMENT,
    FetchPod,
    InputError,
    InputScheme,
    RegistryService,
    Source,
)
from torchyard.inputs.cache import DATA, prune, sha256_file
from torchyard.variants import Rule

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
# What CEL checks of an hf:// URI (RE2; the parser says more): the pattern, and what it
# may not hold after its scheme: '..', '--', an empty or '.'-led segment.
_CEL_PART = "[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9_])?"
_HUB_HOSTILE = r"^hf://.*(\.\.|--|[^:]//|/\.|@\.|\.lock$)"
HUB_RULE = (
    "an hf:// uri names a repository and a revision of the Hub: no '..', '--', empty or "
    "'.'-led segment, and a revision not ending in '.lock'"
)


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
        or DOT_SEGMENT.search(revision)
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


DEFAULT_ENDPOINT = "https://huggingface.co"
DOWNLOADS = "hf"
REVISION = "revision"
WORKERS = 8


@dataclass(frozen=True)
class File:
    path: str
    size: int
    blob_id: str
    sha256: str  # "" when the file is not an LFS file


def _endpoint(env: Mapping[str, str]) -> str:
    return (env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _token(env: Mapping[str, str]) -> str | bool:
    return env.get("HF_TOKEN") or False  # False: anonymous, never a token file on disk


def _api(env: Mapping[str, str]) -> Any:
    from huggingface_hub import HfApi
    from huggingface_hub.utils.tqdm import disable_progress_bars

    disable_progress_bars()
    return HfApi(endpoint=_endpoint(env), token=_token(env), library_name="torchyard")


def _failed(source: Source, err: Exception, env: Mapping[str, str]) -> InputError:
    """The client's error as an InputError that names the input and the fix."""
    import httpx2
    from huggingface_hub import errors

    hub = hub_repo_of(source.uri)
    if isinstance(err, errors.RevisionNotFoundError):
        fix = f"{hub.repo_id} has no revision {hub.revision!r}: check the branch, tag or commit"
    elif isinstance(err, errors.GatedRepoError):
        fix = f"{hub.repo_id} is gated: accept its conditions on the Hub with the token's account"
    elif isinstance(err, errors.RepositoryNotFoundError):
        fix = (
            f"the Hub has no {hub.kind} {hub.repo_id}, or it is private and the token "
            "(HF_TOKEN in the input's Secret) may not read it: check the name and the kind "
            "(hf://datasets/... for a data set)"
        )
    elif isinstance(err, errors.HfHubHTTPError):
        status = err.response.status_code if err.response is not None else 0
        fix = f"the Hub answered HTTP {status}: " + (
            "it does not take the token: check HF_TOKEN in the input's Secret"
            if status == 401
            else "submit the run again once it answers"
            if status >= 500
            else str(err).splitlines()[0]
        )
    elif isinstance(err, (httpx2.HTTPError, OSError)):
        fix = (
            f"cannot reach the Hub at {_endpoint(env)} ({type(err).__name__}: {err}): check "
            "HF_ENDPOINT, and that the fetch may reach it"
        )
    else:
        fix = f"the Hub client failed ({type(err).__name__}: {err})"
    return InputError(f"{source.uri}: {fix}")


def _tree(source: Source, env: Mapping[str, str]) -> tuple[str, list[File]]:
    """The commit the revision names, and its files."""
    from huggingface_hub.hf_api import RepoFile

    hub = hub_repo_of(source.uri)
    api = _api(env)
    try:
        info = api.repo_info(hub.repo_id, revision=hub.revision, repo_type=hub.kind)
        commit = str(info.sha or "")
        if not COMMIT.match(commit):
            raise InputError(f"{source.uri}: the Hub gives no commit for {hub.revision!r}")
        entries = api.list_repo_tree(
            hub.repo_id, recursive=True, revision=commit, repo_type=hub.kind
        )
        files = [
            File(e.path, int(e.size), str(e.blob_id), e.lfs.sha256 if e.lfs else "")
            for e in entries
            if isinstance(e, RepoFile)
        ]
    except InputError:
        raise
    except Exception as err:
        raise _failed(source, err, env) from None
    return commit, files


def revision(source: Source, env: Mapping[str, str]) -> str:
    """The commit the input's revision names now (a commit names itself)."""
    written = hub_repo_of(source.uri).revision
    if COMMIT.match(written):
        return written
    return _tree(source, env)[0]


def _kept(source: Source, files: list[File]) -> list[File]:
    for f in files:
        try:
            safe = archives.member_path(f.path) == f.path and f.path.split("/")[0] != ".cache"
        except InputError:
            safe = False
        if not safe:
            raise InputError(
                f"{source.uri}: the repository holds {f.path!r}, a path that would not stay "
                "inside the input's folder"
            )
    return [f for f in files if patterns.included(f.path, source.include, source.exclude)]


def _intact(path: str, f: File) -> bool:
    if not os.path.isfile(path) or os.path.islink(path) or os.path.getsize(path) != f.size:
        return False
    if f.sha256:
        return sha256_file(path) == f.sha256
    digest = hashlib.sha1(b"blob %d\0" % f.size)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest() == f.blob_id


def _download(
    source: Source, commit: str, pending: list[File], staging: str, env: Mapping[str, str]
) -> None:
    from huggingface_hub import snapshot_download

    hub = hub_repo_of(source.uri)
    try:
        snapshot_download(
            hub.repo_id,
            repo_type=hub.kind,
            revision=commit,
            local_dir=os.path.join(staging, DOWNLOADS),
            allow_patterns=[glob.escape(f.path) for f in pending],
            ignore_patterns=list(source.exclude) or None,
            endpoint=_endpoint(env),
            token=_token(env),
            max_workers=WORKERS,
            library_name="torchyard",
        )
    except Exception as err:
        raise _failed(source, err, env) from None


def _partial_bytes(downloads: str) -> int:
    """What the client's partial downloads of a killed fetch hold (it resumes them)."""
    held = 0
    for folder, _, names in os.walk(os.path.join(downloads, ".cache")):
        held += sum(
            os.path.getsize(os.path.join(folder, n)) for n in names if n.endswith(".incomplete")
        )
    return held


def fetch(source: Source, staging: str, env: Mapping[str, str], max_bytes: int) -> int:
    """Fill ``staging/data`` with the repository's kept files at the revision's commit;
    the bytes of the files downloaded this time."""
    commit, files = _tree(source, env)
    kept = _kept(source, files)
    if not kept:
        return 0  # cache.commit names the input and its patterns
    total = sum(f.size for f in kept)
    if total > max_bytes:
        raise InputError(
            f"{source.uri} is {total} bytes, over the inputs cache's limit of {max_bytes} "
            "bytes: narrow it with include patterns or ask for a larger cache"
        )
    data = os.path.join(staging, DATA)
    prune(data, {f.path for f in kept})
    pending = [f for f in kept if not _intact(os.path.join(data, f.path), f)]
    downloads = os.path.join(staging, DOWNLOADS)
    received = sum(f.size for f in pending if not _intact(os.path.join(downloads, f.path), f))
    received = max(0, received - _partial_bytes(downloads))
    if pending:
        _download(source, commit, pending, staging, env)
    for f in pending:
        got = os.path.join(downloads, f.path)
        if not _intact(got, f):
            if os.path.isfile(got):
                os.unlink(got)
            raise InputError(
                f"{source.uri} ({f.path}): the file does not match the Hub's tree at "
                f"{commit} (size {f.size}, {f.sha256 or f.blob_id}): the download was "
                "damaged; submit the run again"
            )
        os.makedirs(os.path.dirname(os.path.join(data, f.path)) or data, exist_ok=True)
        os.replace(got, os.path.join(data, f.path))
    with open(os.path.join(staging, REVISION), "w") as out:
        out.write(commit)
    return received


class HubScheme(InputScheme):
    """``hf://``: a repository of the Hugging Face Hub at a revision (as written: part of
    the key; the commit it resolves to now is its current revision), read with the
    input's Secret (part of the key)."""

    TYPE = "hf"
    SUMMARY = (
        "hf://[datasets/]<org>/<repo>[@revision] (a repository of the Hugging Face Hub at a "
        "branch, tag or commit, default main; see secretRef)"
    )
    FORM = "hf://[datasets/]<org>/<repo>[@revision]"
    PATTERN = (
        r"hf://(datasets/)?("
        + _CEL_PART
        + "/)?"
        + _CEL_PART
        + r"(@[A-Za-z0-9_]([A-Za-z0-9._/-]*[A-Za-z0-9_])?)?"
    )
    TAKES_SECRET = True
    RULES = (
        Rule(
            {
                "rule": f"!self.uri.matches(r'{_HUB_HOSTILE}')",
                "message": HUB_RULE,
                "fieldPath": ".uri",
                "reason": "FieldValueInvalid",
            },
            lambda i: not re.search(_HUB_HOSTILE, i.uri),
        ),
    )

    def check(self, uri: str, sha256: str) -> None:
        hub_repo_of(uri)

    def fetch(self, source: Source, staging: str, env: Mapping[str, str], max_bytes: int) -> int:
        return fetch(source, staging, env, max_bytes)

    def revision(self, source: Source) -> str:
        return hub_repo_of(source.uri).revision

    def current(self, source: Source, env: Mapping[str, str]) -> str:
        return revision(source, env)

    def key_parts(self, source: Source) -> dict[str, str]:
        return {"secret": source.secret}

    def fetch_pod(self, source: Source, namespace: str, registry: RegistryService) -> FetchPod:
        """The client's own cache and settings in the Pod's /tmp, and the Hub's token from
        the input's Secret, in this Pod only."""
        env = (
            {"name": "HF_HOME", "value": "/tmp/huggingface"},
            {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
        )
        secret = ({"secretRef": {"name": source.secret}},) if source.secret else ()
        return FetchPod(env=env, env_from=secret)
