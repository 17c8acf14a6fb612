"""Source snapshots: a folder of training code as one reproducible, content-addressed
archive (what ``torchyard submit --source DIR`` and ``Experiment.submit`` send).

- Which files: everything under the folder except what the first ignore file found says
  (``.torchyardignore``, else ``.amlignore``, else ``.gitignore``; gitignore syntax:
  ``#`` comments, ``!`` negation, ``/`` anchoring, trailing ``/`` for folders, ``*``,
  ``?``, ``**``), and never ``.git/``, ``__pycache__/`` or ``.ipynb_checkpoints/``.
- Secrets are refused unless asked: ``.env`` files, private keys (by name and by a
  ``PRIVATE KEY`` header), ``.netrc``, ``.pypirc``, cloud credentials, kubeconfigs.
- The archive is a gzip'd tar with sorted entries, zero times and owners, so the same
  code always gives the same bytes and the same sha256: submitting it again creates
  nothing new.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import stat
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torchyard import k8s
from torchyard.sdk.progress import Progress, human
from torchyard.sdk.registry import RegistryClient

IGNORE_FILES = (".torchyardignore", ".amlignore", ".gitignore")
ALWAYS_IGNORED = (".git/", "__pycache__/", ".ipynb_checkpoints/", "*.pyc")
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
    """A folder's files, archived. ``archive`` is a temporary file; ``close()`` drops it."""

    root: Path
    files: list[str]
    size: int  # bytes of the files, uncompressed
    sha256: str
    archive: Path
    ignore_file: str | None
    skipped: int = 0

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

    def report(self) -> str:
        return (
            f"snapshot of {self.root}: {len(self.files)} files, {human(self.size)} "
            f"({human(self.archive_size)} compressed), sha256 {self.sha256[:12]}"
            + (f", {self.skipped} ignored by {self.ignore_file}" if self.ignore_file else "")
        )


def collect(root: Path, include_secrets: bool = False) -> tuple[list[str], str | None, int]:
    """(files to include, the ignore file used, how many were ignored); refuses secrets."""
    if not root.is_dir():
        raise SnapshotError(f"the source folder {root} does not exist")
    ignore_file = next((n for n in IGNORE_FILES if (root / n).is_file()), None)
    rules = parse_ignore(list(ALWAYS_IGNORED))
    if ignore_file:
        rules += parse_ignore((root / ignore_file).read_text(errors="replace").splitlines())
    secret_rules = parse_ignore(list(SECRET_NAMES))
    files, secrets, skipped = [], [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if base == "." else base + "/"
        kept = []
        for d in sorted(dirnames):
            if ignored(rules, prefix + d, True) or os.path.islink(os.path.join(dirpath, d)):
                skipped += 1
            else:
                kept.append(d)
        dirnames[:] = kept
        for name in sorted(filenames):
            rel = prefix + name
            path = Path(dirpath) / name
            if ignored(rules, rel, False) or not stat.S_ISREG(path.lstat().st_mode):
                skipped += 1
                continue
            if ignored(secret_rules, rel, False) or _has_private_key(path):
                secrets.append(rel)
            files.append(rel)
    if secrets and not include_secrets:
        shown = ", ".join(secrets[:5]) + (
            f" and {len(secrets) - 5} more" if len(secrets) > 5 else ""
        )
        where = ignore_file or ".torchyardignore"
        raise SnapshotError(
            f"{root} holds what looks like secrets: {shown}. They would be readable by "
            f"anyone who can read the run's namespace. Add them to {where} (or delete "
            "them), or pass --include-secrets if they really belong in the code"
        )
    return sorted(files), ignore_file, skipped


def _has_private_key(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return bool(PRIVATE_KEY.search(f.read(8192)))
    except OSError:
        return False


def snapshot(root: Path, include_secrets: bool = False) -> Snapshot:
    """Archive ``root`` reproducibly (see the module docstring)."""
    root = root.resolve()
    files, ignore_file, skipped = collect(root, include_secrets)
    if not files:
        raise SnapshotError(f"nothing to snapshot in {root} (everything is ignored?)")
    fd, name = tempfile.mkstemp(prefix="torchyard-snapshot-", suffix=".tar.gz")
    os.close(fd)
    archive = Path(name)
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
    digest = hashlib.sha256()
    with archive.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return Snapshot(root, files, size, digest.hexdigest(), archive, ignore_file, skipped)


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
                "torchyard.dev/snapshot": snap.sha256[:63],
            },
            "annotations": {
                "torchyard.dev/sha256": snap.sha256,
                "torchyard.dev/files": str(len(snap.files)),
                "torchyard.dev/size": str(snap.size),
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
