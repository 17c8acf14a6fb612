"""The model registry's store: a folder tree with atomic, immutable, verified versions.

Layout under the root (a PVC in the cluster, ``~/.torchyard/registry`` in local mode):

    <namespace>/runs/<run>/outputs/...          what node 0 wrote to ./outputs
    <namespace>/runs/<run>/logs/node-<i>/...    every node's ./logs
    <namespace>/models/<model>/<version>/       files + manifest.json (sizes, sha256, ...)

Everything is written to a ``.tmp-*`` folder beside its destination, fsynced, and renamed
into place, so a crash never leaves a partial version visible; ``Store()`` removes stale
temporaries (older than an hour: younger ones may belong to a concurrent writer).
Versions are numbered 1, 2, 3 ... per model; two concurrent promotions get
distinct numbers because a rename onto an existing version fails and the next number is
tried. A manifest's own keys (files, sizes, digests, version ...) are the store's: the
caller's metadata is limited to :data:`METADATA_KEYS` and never overrides them.
:meth:`Store.publish_run` decides "this run already made a version" under the same lock
as the publish, so promoting one run twice at once yields one version.

Used by local mode (``torchyard.local``) and the registry service (its routes in
``registry.archives`` and ``registry.versions``); tested in ``tests/unit/registry/``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchyard.launch.contract import SNAPSHOT_MAX_BYTES
from torchyard.records.reader import replace_folder

MANIFEST = "manifest.json"
# The registry service's default body limits (`torchyard registry serve`, the chart): a run
# file, and a source snapshot (the same bound the launcher and `submit` apply unpacked).
MAX_UPLOAD_BYTES = 20 << 30
MAX_SNAPSHOT_BYTES = SNAPSHOT_MAX_BYTES
TMP_PREFIX = ".tmp-"
CHUNK = 1 << 20
STALE_SECONDS = 3600.0

# What the store writes into every manifest; caller metadata never overrides these.
SERVER_KEYS = frozenset({"model", "namespace", "version", "files", "totalBytes", "size", "created"})
# What callers may add: planning.models.promote_metadata, which the operator's promotion
# (controller.finalize), the SDK's register_model (sdk.azureml) and local mode all use.
METADATA_KEYS = frozenset(
    {
        "run",  # {"name", "uid", "namespace"}: the run the version came from
        "environment",
        "environmentImage",
        "command",
        "nodeCount",
        "processCountPerNode",
        "metrics",
        "tags",
        "properties",
        "description",
        "framework",  # {"name", "version"}: register_model(model_framework=...)
        "mode",
    }
)
RUN_KEYS = frozenset({"name", "uid", "namespace"})

# One lock per (root, namespace, model) for this process: a publish and the "did this run
# already publish?" question are answered together. (Other processes on the same volume
# still get distinct numbers through the rename; only the registry service writes there.)
_model_locks: dict[tuple[str, str, str], threading.Lock] = {}
_model_locks_guard = threading.Lock()


class OutsideNamespace(ValueError):
    """A path that resolves (through ``..`` or a symbolic link) out of its namespace."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        # equivalent mutants: reading all at once (read(None)) gives the same digest
        for chunk in iter(lambda: f.read(CHUNK), b""):  # pragma: no mutate
            digest.update(chunk)
    return digest.hexdigest()


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no mutate (the loop always returns)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_into(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True, symlinks=False)
    elif src.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def _links_leaving(source: Path, within: Path) -> list[str]:
    """Symbolic links under ``source`` (or ``source`` itself) that resolve out of ``within``."""
    top = within.resolve()
    found = [source, *source.rglob("*")] if source.is_dir() else [source]
    return [p.as_posix() for p in found if p.is_symlink() and not p.resolve().is_relative_to(top)]


def check_metadata(metadata: Mapping[str, Any]) -> None:
    """Caller metadata: only :data:`METADATA_KEYS`; ``run`` an object of :data:`RUN_KEYS`
    strings. Raises ValueError naming the first offending key."""
    for key in metadata:
        if key not in METADATA_KEYS:
            owner = "the registry's own" if key in SERVER_KEYS else "not an allowed"
            raise ValueError(
                f"metadata key {key!r} is {owner} key; allowed: {', '.join(sorted(METADATA_KEYS))}"
            )
    run = metadata.get("run")
    if run is None:
        return
    if not isinstance(run, Mapping):
        raise ValueError('metadata "run" must be an object {"name", "uid"}')
    for key, value in run.items():
        if key not in RUN_KEYS or not isinstance(value, str):
            raise ValueError(
                f"metadata run.{key} is not allowed: run holds the strings "
                f"{', '.join(sorted(RUN_KEYS))}"
            )


@dataclass(frozen=True)
class Version:
    model: str
    version: int
    path: Path
    manifest: dict[str, Any]


class Store:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).expanduser()
        self.root.mkdir(parents=True, exist_ok=True)
        self.remove_stale_temporaries()

    # -- paths ----------------------------------------------------------------------

    def run_dir(self, namespace: str, run: str) -> Path:
        return self.root / namespace / "runs" / run

    def snapshot_path(self, namespace: str, sha256: str) -> Path:
        """A source snapshot (``torchyard submit``), named by its content's sha256."""
        return self.root / namespace / "snapshots" / f"{sha256}.tar.gz"

    def model_dir(self, namespace: str, model: str) -> Path:
        return self.root / namespace / "models" / model

    def inside(self, namespace: str, path: Path) -> Path:
        """``path`` resolved (``..`` and symbolic links followed), if it stays under
        ``<root>/<namespace>/``; else :class:`OutsideNamespace`."""
        top = self.root.resolve() / namespace  # not resolved: <ns> itself may not be a link
        resolved = path.resolve()
        if resolved != top and not resolved.is_relative_to(top):
            raise OutsideNamespace(f"{path} leads out of namespace {namespace}")
        return resolved

    def remove_stale_temporaries(self, older_than: float = STALE_SECONDS) -> None:
        """Remove what crashed writers left; younger temporaries may be in use."""
        cutoff = time.time() - older_than
        patterns = (f"*/*/*/{TMP_PREFIX}*", f"*/*/{TMP_PREFIX}*", f"*/records/*/*/{TMP_PREFIX}*")
        for pattern in patterns:
            for tmp in self.root.glob(pattern):
                with contextlib.suppress(OSError):
                    if tmp.stat().st_mtime < cutoff:
                        shutil.rmtree(tmp, ignore_errors=True)

    def remove_all_temporaries(self) -> None:
        """At the start of the one process that owns the volume: every temporary is stale."""
        self.remove_stale_temporaries(older_than=0)
        for tmp in self.root.rglob(f"{TMP_PREFIX}upload-*"):
            with contextlib.suppress(OSError):
                tmp.unlink()

    def _tmp_beside(self, dest: Path) -> Path:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}"
        tmp.mkdir()
        return tmp

    # -- runs -----------------------------------------------------------------------

    def archive_run(
        self,
        namespace: str,
        run: str,
        *,
        outputs: Path | None,
        logs: Mapping[int, Path],
    ) -> Path:
        """Archive a run's outputs (node 0) and every node's logs, replacing an older archive."""
        dest = self.run_dir(namespace, run)
        tmp = self._tmp_beside(dest)
        try:
            (tmp / "outputs").mkdir()
            (tmp / "logs").mkdir()
            if outputs is not None and outputs.exists():
                _copy_into(outputs, tmp / "outputs")
            for node, folder in sorted(logs.items()):
                if folder.exists():
                    _copy_into(folder, tmp / "logs" / f"node-{node}")
            _fsync_tree(tmp)
            replace_folder(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return dest

    # -- models ---------------------------------------------------------------------

    def versions(self, namespace: str, model: str) -> list[int]:
        folder = self.model_dir(namespace, model)
        if not folder.is_dir():
            return []
        return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())

    def get(self, namespace: str, model: str, version: int | None = None) -> Version:
        numbers = self.versions(namespace, model)
        if not numbers:
            raise KeyError(f"model {namespace}/{model} has no versions")
        number = numbers[-1] if version is None else version
        path = self.model_dir(namespace, model) / str(number)
        if not path.is_dir():
            raise KeyError(f"model {namespace}/{model} has no version {number}")
        return Version(model, number, path, json.loads((path / MANIFEST).read_text()))

    def _model_lock(self, namespace: str, model: str) -> threading.Lock:
        key = (str(self.root.resolve()), namespace, model)
        with _model_locks_guard:
            return _model_locks.setdefault(key, threading.Lock())

    def version_of_run(self, namespace: str, model: str, run: str, run_uid: str) -> Version | None:
        """The version of ``model`` published from run ``run`` with this uid, if any."""
        for number in self.versions(namespace, model):
            with contextlib.suppress(KeyError, OSError, ValueError):
                earlier = self.get(namespace, model, number)
                made_by = earlier.manifest.get("run") or {}
                if (made_by.get("name"), made_by.get("uid")) == (run, run_uid):
                    return earlier
        return None

    def publish_run(
        self,
        namespace: str,
        model: str,
        source: Path,
        *,
        run: str,
        run_uid: str,
        metadata: Mapping[str, Any] | None = None,
        within: Path | None = None,
    ) -> tuple[Version, bool]:
        """(the version, True) after publishing ``source`` (from run ``run``) as the next
        version, recording ``run`` and ``run_uid`` in its manifest; or (the version that run
        already made, False). Both are decided under the model's lock, so promoting one run
        twice at once yields one version. An empty ``run_uid`` always publishes."""
        check_metadata(metadata or {})
        made_by = {**dict((metadata or {}).get("run") or {}), "name": run}
        if run_uid:
            made_by["uid"] = run_uid
        with self._model_lock(namespace, model):
            earlier = self.version_of_run(namespace, model, run, run_uid) if run_uid else None
            if earlier is not None:
                return earlier, False
            meta = {**(metadata or {}), "run": made_by}
            return self._publish(namespace, model, source, meta, within), True

    def publish(
        self,
        namespace: str,
        model: str,
        source: Path,
        *,
        metadata: Mapping[str, Any] | None = None,
        within: Path | None = None,
    ) -> Version:
        """Copy ``source`` (a file or folder) in as version N+1, atomically; immutable after.
        ``metadata`` keys: :data:`METADATA_KEYS` (ValueError otherwise). With ``within``,
        a symbolic link under ``source`` that leads out of that folder is refused."""
        with self._model_lock(namespace, model):
            return self._publish(namespace, model, source, metadata, within)

    def _publish(
        self,
        namespace: str,
        model: str,
        source: Path,
        metadata: Mapping[str, Any] | None,
        within: Path | None,
    ) -> Version:
        check_metadata(metadata or {})
        if not source.exists():
            raise FileNotFoundError(f"nothing to register: {source} does not exist")
        if within is not None and (leaving := _links_leaving(source, within)):
            raise OutsideNamespace(f"{leaving[0]} is a link that leads out of {within}")
        folder = self.model_dir(namespace, model)
        tmp = self._tmp_beside(folder / "0")
        try:
            if source.is_dir():
                _copy_into(source, tmp)
            else:
                shutil.copy2(source, tmp / source.name)
            files: list[dict[str, Any]] = [
                {
                    "path": p.relative_to(tmp).as_posix(),
                    "size": p.stat().st_size,
                    "sha256": sha256_file(p),
                }
                for p in sorted(tmp.rglob("*"))
                if p.is_file()
            ]
            total = sum(int(f["size"]) for f in files)
            extra = dict(metadata or {})
            if "metrics" not in extra and (tmp / "metrics.json").is_file():
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    raw = json.loads((tmp / "metrics.json").read_text())
                    extra["metrics"] = {
                        k: float(v) for k, v in raw.items() if isinstance(v, (int, float))
                    }
            manifest: dict[str, Any] = {
                **extra,  # first: the store's own keys below always win
                "model": model,
                "namespace": namespace,
                "files": files,
                "totalBytes": total,
                "size": human_size(total),
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            for _attempt in range(1000):
                number = (self.versions(namespace, model) or [0])[-1] + 1
                manifest["version"] = number
                (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
                _fsync_tree(tmp)
                try:
                    os.rename(tmp, folder / str(number))  # fails if that version exists
                except OSError:
                    continue
                with contextlib.suppress(OSError):
                    _fsync_dir(folder)
                return Version(model, number, folder / str(number), manifest)
            raise RuntimeError(f"could not allocate a version of {model}")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def verify(self, version: Version) -> list[str]:
        """Files whose size or sha256 no longer match the manifest (empty: intact)."""
        bad = []
        for entry in version.manifest["files"]:
            path = version.path / entry["path"]
            intact = (
                path.is_file()
                and path.stat().st_size == entry["size"]
                and sha256_file(path) == entry["sha256"]
            )
            if not intact:
                bad.append(entry["path"])
        return bad
