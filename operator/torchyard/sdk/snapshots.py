"""Source snapshots: a folder of training code as one reproducible, content-addressed
archive (what ``torchyard submit --source DIR`` and ``Experiment.submit`` send).

- Which files: everything under the folder except what the first ignore file found says
  (``.torchyardignore``, else ``.amlignore``, else ``.gitignore``; gitignore syntax:
  ``#`` comments, ``!`` negation, ``/`` anchoring, trailing ``/`` for folders, ``*``,
  ``?``, ``**``), and never ``.git/``, ``__pycache__/``, ``.ipynb_checkpoints/``,
  ``.venv/``, ``.pytest_cache/``, nor the top-level ``outputs/`` and ``logs/`` (what a run
  writes: a stale copy would be archived as if this run had written it).
- A link to a file is archived as the file it points to (and checked for secrets by both
  names); links to folders, dangling links and devices are left out.
- Folders torchyard itself writes into are left out when they lie inside the folder
  (``exclude``: local mode's runs folder and registry), so a run never copies earlier runs.
- Size: at most ``TORCHYARD_SNAPSHOT_MAX_BYTES`` (1 GiB) in at most
  ``TORCHYARD_SNAPSHOT_MAX_FILES`` files (100000), the limits the registry service and the
  launcher that unpacks it hold to (``torchyard.launch.contract.snapshot_limits``); a bigger folder
  is refused before anything is read, naming its largest entries.
- Secrets are refused unless asked: ``.env`` files, private keys (by name and by a
  ``PRIVATE KEY`` header), ``.netrc``, ``.pypirc``, cloud credentials, kubeconfigs.
- The archive is a gzip'd tar with sorted entries, zero times and owners, so the same
  code always gives the same bytes and the same sha256: submitting it again creates
  nothing new.

``torchyard submit --source``, ``Experiment.submit`` and ``torchyard run --local`` (which
copies the files :func:`collect` selects into every node's folder) call this module;
tested in ``tests/unit/sdk/test_snapshots.py``.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import stat
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from torchyard import k8s
from torchyard.api import wire
from torchyard.launch import contract
from torchyard.sdk.progress import Progress, human
from torchyard.sdk.registry import RegistryClient

IGNORE_FILES = (".torchyardignore", ".amlignore", ".gitignore")
ALWAYS_IGNORED = (
    ".git/",
    "__pycache__/",
    ".ipynb_checkpoints/",
    "*.pyc",
    ".venv/",
    ".pytest_cache/",
    "/outputs/",
    "/logs/",
)
SECRET_NAMES = (
    ".env",
    ".env.*",
    "!.env.example",
    "!.env.sample",
    "!.env.template",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "id_rsa",
    "id_dsa",
    "id_ecdsa",
    "id_ed25519",
    ".netrc",
    ".pypirc",
    ".aws/credentials",
    ".docker/config.json",
    "kubeconfig",
    "*.kubeconfig",
    "credentials.json",
    "service-account*.json",
)
PRIVATE_KEY = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----")
# A ConfigMap holds at most 1 MiB; snapshots above this go to the registry service.
CONFIGMAP_LIMIT = 900 * 1024


class SnapshotError(Exception):
    """The folder cannot be snapshotted as asked; the message says what to do."""


@dataclass(frozen=True)
class Rule:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


def parse_ignore(lines: list[str]) -> list[Rule]:
    """gitignore patterns -> rules, in order (the last match decides)."""
    rules = []
    for raw in lines:
        line = raw.rstrip("\n").rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = "/" in line
        line = line.lstrip("/")
        rules.append(Rule(re.compile(_translate(line, anchored)), negate, dir_only))
    return rules


def _translate(pattern: str, anchored: bool) -> str:
    out = "" if anchored else "(?:.*/)?"
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
            continue
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out += re.escape(c)
            else:
                out += "[" + pattern[i + 1 : end].replace("!", "^", 1) + "]"
                i = end
        else:
            out += re.escape(c)
        i += 1
    return out + "$"


def ignored(rules: list[Rule], rel: str, is_dir: bool) -> bool:
    """Does the last rule that matches ``rel`` (a /-separated relative path) exclude it?"""
    verdict = False
    for rule in rules:
        if rule.dir_only and not is_dir:
            continue
        if rule.regex.match(rel):
            verdict = not rule.negate
    return verdict


@dataclass
class Snapshot:
    """A folder's files, archived. ``archive`` is a temporary file; ``close()`` (or the end
    of a ``with`` block) drops it."""

    root: Path
    files: list[str]
    size: int  # bytes of the files, uncompressed
    sha256: str
    archive: Path
    ignore_file: str | None
    skipped: int = 0
    excluded: tuple[str, ...] = ()  # torchyard's own folders inside root, left out

    @property
    def archive_size(self) -> int:
        return self.archive.stat().st_size

    @property
    def fits_configmap(self) -> bool:
        return self.archive_size <= CONFIGMAP_LIMIT

    @property
    def configmap_name(self) -> str:
        return f"torchyard-src-{self.sha256[:16]}"

    @property
    def source(self) -> dict[str, str]:
        """The TrainingRun's ``spec.source`` that names this snapshot."""
        if self.fits_configmap:
            return {"configMap": self.configmap_name}
        return {"snapshot": self.sha256}

    def data(self) -> bytes:
        return self.archive.read_bytes()

    def close(self) -> None:
        self.archive.unlink(missing_ok=True)

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def report(self) -> str:
        return (
            f"snapshot of {self.root}: {len(self.files)} files, {human(self.size)} "
            f"({human(self.archive_size)} compressed), sha256 {self.sha256[:12]}"
            + (f", {self.skipped} ignored by {self.ignore_file}" if self.ignore_file else "")
            + (f", left out {', '.join(self.excluded)}" if self.excluded else "")
        )


def excluded_inside(root: Path, exclude: Iterable[Path]) -> list[str]:
    """The ``exclude`` folders that lie inside ``root``, as /-separated paths relative to it.

    A folder torchyard writes into (local runs, the local registry) cannot be ``root``
    itself: every run would copy the one before."""
    root = root.resolve()
    inside = []
    for path in exclude:
        path = path.expanduser().resolve()
        if path == root:
            raise SnapshotError(
                f"the source folder {root} is also where torchyard writes its runs or "
                "models: put the training code in its own folder, or pass another "
                "--workdir/--registry (e.g. a subfolder such as ./runs, which is left out)"
            )
        if path.is_relative_to(root):
            inside.append(path.relative_to(root).as_posix())
    return sorted(set(inside))


def collect(
    root: Path,
    include_secrets: bool = False,
    exclude: Iterable[Path] = (),
    *,
    max_bytes: int | None = None,
    max_files: int | None = None,
) -> tuple[list[str], str | None, int]:
    """(files to include, the ignore file used, how many were ignored); refuses secrets and
    a selection over the size limits (by default :func:`contract.snapshot_limits`).

    ``exclude``: folders left out wherever they are inside ``root`` (see
    :func:`excluded_inside`)."""
    if not root.is_dir():
        raise SnapshotError(f"the source folder {root} does not exist")
    try:
        default_bytes, default_files = contract.snapshot_limits()
    except contract.LaunchError as err:
        raise SnapshotError(str(err)) from None
    max_bytes = default_bytes if max_bytes is None else max_bytes
    max_files = default_files if max_files is None else max_files
    left_out = set(excluded_inside(root, exclude))
    ignore_file = next((n for n in IGNORE_FILES if (root / n).is_file()), None)
    rules = parse_ignore(list(ALWAYS_IGNORED))
    if ignore_file:
        rules += parse_ignore((root / ignore_file).read_text(errors="replace").splitlines())
    sizes, skipped = _selected(root, rules, left_out)
    files = sorted(sizes)
    where = ignore_file or ".torchyardignore"
    _refuse_over_limits(root, sizes, max_bytes, max_files, where)
    if not include_secrets:
        _refuse_secrets(root, files, where)
    return files, ignore_file, skipped


def _selected(root: Path, rules: list[Rule], left_out: set[str]) -> tuple[dict[str, int], int]:
    """(size of each regular file under ``root`` that no rule ignores, how many files and
    folders the rules, or being a link or no regular file, left out); the ``left_out``
    paths are skipped without being counted."""
    sizes: dict[str, int] = {}
    skipped = 0
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if base == "." else base + "/"
        kept = []
        for d in sorted(dirnames):
            if prefix + d in left_out:
                continue
            if ignored(rules, prefix + d, True) or os.path.islink(os.path.join(dirpath, d)):
                skipped += 1
            else:
                kept.append(d)
        dirnames[:] = kept
        for name in sorted(filenames):
            rel = prefix + name
            if rel in left_out:
                continue
            try:
                # A link to a file is archived as that file (as cp -r and tar -h do);
                # links to folders (above), dangling links and devices are left out.
                st = (Path(dirpath) / name).stat()
            except OSError:
                st = None
            if st is None or ignored(rules, rel, False) or not stat.S_ISREG(st.st_mode):
                skipped += 1
                continue
            sizes[rel] = st.st_size
    return sizes, skipped


def _refuse_over_limits(
    root: Path, sizes: Mapping[str, int], max_bytes: int, max_files: int, where: str
) -> None:
    """Raise SnapshotError, naming the largest entries, when the selection holds more files
    or bytes than a snapshot may (``where``: the ignore file to leave them out in)."""
    files = len(sizes)
    total = sum(sizes.values())
    if files > max_files or total > max_bytes:
        over = (
            f"{files} files, over the {max_files} a snapshot may hold "
            "(TORCHYARD_SNAPSHOT_MAX_FILES)"
            if files > max_files
            else f"{_sizes(total, max_bytes)} a snapshot may hold (TORCHYARD_SNAPSHOT_MAX_BYTES)"
        )
        raise SnapshotError(
            f"the source folder {root} holds {over}. {largest_entries(sizes)}. Leave them "
            f"out in {where} (gitignore syntax, e.g. data/ or *.ckpt) or move them out of "
            "the folder: the snapshot is for code; data belongs in a volume or storage"
        )


def _refuse_secrets(root: Path, files: list[str], where: str) -> None:
    """Raise SnapshotError when any of ``files`` looks like a secret (by its name or a
    private key inside)."""
    secret_rules = parse_ignore(list(SECRET_NAMES))
    secrets = [
        rel
        for rel in files
        if any(ignored(secret_rules, name, False) for name in _names(root, rel))
        or _has_private_key(root / rel)
    ]
    if secrets:
        shown = ", ".join(secrets[:5]) + (
            f" and {len(secrets) - 5} more" if len(secrets) > 5 else ""
        )
        raise SnapshotError(
            f"{root} holds what looks like secrets: {shown}. They would be readable by "
            f"anyone who can read the run's namespace. Add them to {where} (or delete "
            "them), or pass --include-secrets if they really belong in the code"
        )


def _sizes(total: int, limit: int) -> str:
    """'1.2 GiB, over the 1.0 GiB', in bytes where the rounded sizes would read the same."""
    if human(total) == human(limit):
        return f"{total} bytes, over the {limit} bytes"
    return f"{human(total)}, over the {human(limit)}"


def largest_entries(sizes: Mapping[str, int], shown: int = 5) -> str:
    """'Largest: runs/ 34.0 GiB (7 files), ...; largest files: ...' for an error message."""
    top: dict[str, tuple[int, int]] = {}
    for rel, size in sizes.items():
        head, slash, _ = rel.partition("/")
        total, count = top.get(head + slash, (0, 0))
        top[head + slash] = (total + size, count + 1)
    entries = sorted(top.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0]))[:shown]
    text = "Largest: " + ", ".join(
        f"{name} {human(size)}" + (f" ({count} files)" if name.endswith("/") else "")
        for name, (size, count) in entries
    )
    biggest = sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    if any("/" in rel for rel, _ in biggest):
        text += "; largest files: " + ", ".join(f"{rel} {human(n)}" for rel, n in biggest)
    return text


def _names(root: Path, rel: str) -> list[str]:
    """``rel``, and for a link also what it points to (its last two path components)."""
    path = root / rel
    if not path.is_symlink():
        return [rel]
    target = path.resolve()
    return [rel, target.name, f"{target.parent.name}/{target.name}"]


def _has_private_key(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return bool(PRIVATE_KEY.search(f.read(8192)))
    except OSError:
        return False


def _write_archive(archive: Path, root: Path, files: list[str]) -> int:
    """The reproducible .tar.gz of ``files`` (no times, owners or modes beyond +x); returns
    the bytes archived, uncompressed."""
    size = 0
    with (
        archive.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for rel in files:
            path = root / rel
            info = tarfile.TarInfo(rel)
            st = path.stat()
            info.size = st.st_size
            info.mode = 0o755 if st.st_mode & 0o111 else 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with path.open("rb") as f:
                tar.addfile(info, f)
            size += st.st_size
    return size


def snapshot(root: Path, include_secrets: bool = False, exclude: Iterable[Path] = ()) -> Snapshot:
    """Archive ``root`` reproducibly (see the module docstring)."""
    root, exclude = root.resolve(), list(exclude)
    files, ignore_file, skipped = collect(root, include_secrets, exclude)
    if not files:
        raise SnapshotError(f"nothing to snapshot in {root} (everything is ignored?)")
    fd, name = tempfile.mkstemp(prefix="torchyard-snapshot-", suffix=".tar.gz")
    os.close(fd)
    archive = Path(name)
    try:
        size = _write_archive(archive, root, files)
    except BaseException:
        archive.unlink(missing_ok=True)  # a file that vanished or could not be read
        raise
    digest = hashlib.sha256()
    with archive.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return Snapshot(
        root,
        files,
        size,
        digest.hexdigest(),
        archive,
        ignore_file,
        skipped,
        tuple(f"{rel}/" for rel in excluded_inside(root, exclude)),
    )


def configmap(snap: Snapshot, namespace: str) -> dict[str, object]:
    """The immutable, content-addressed ConfigMap of a small snapshot."""
    import base64

    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": snap.configmap_name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/managed-by": "torchyard",
                wire.LABEL_SNAPSHOT: snap.sha256[:63],
            },
            "annotations": {
                wire.ANNOTATION_SNAPSHOT_SHA256: snap.sha256,
                wire.ANNOTATION_SNAPSHOT_FILES: str(len(snap.files)),
                wire.ANNOTATION_SNAPSHOT_SIZE: str(snap.size),
            },
        },
        "immutable": True,
        "binaryData": {"source.tar.gz": base64.b64encode(snap.data()).decode()},
    }


def store(
    snap: Snapshot,
    namespace: str,
    registry: Callable[[], RegistryClient],
    progress: bool = False,
) -> str:
    """Put the snapshot where its ``source`` says: its ConfigMap, or the registry service
    (``registry()`` is only called then). Nothing is written twice. Returns what happened."""
    if snap.fits_configmap:
        try:
            k8s.create(configmap(snap, namespace))
            return f"configmap/{snap.configmap_name} created"
        except k8s.ApiError as err:
            if not err.conflict:
                raise
            return f"configmap/{snap.configmap_name} unchanged (the same code was submitted before)"
    short = snap.sha256[:12]
    bar = Progress(f"uploading snapshot {short}", snap.archive_size) if progress else None
    if registry().put_snapshot(namespace, snap.archive, snap.sha256, bar):
        return f"snapshot {short} uploaded to the registry service"
    return f"snapshot {short} unchanged (the registry service has it)"
