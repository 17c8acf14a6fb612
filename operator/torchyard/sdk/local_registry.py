"""The local registry folder of ``torchyard run --local`` (``~/.torchyard/registry`` or
``$TORCHYARD_REGISTRY``), read as the registry service's client reads the service: models
and their versions, a version's files (copied and checked against their sha256), a run's
archived files, and the records of runs and sweeps (``torchyard.records.FolderRecords``).

:class:`LocalRegistry` has the methods of ``sdk.registry.RegistryClient`` that the read
commands and the SDK call, with its errors (:class:`RegistryError`), so that every read
command takes ``--local`` (``cli.options.registry``) and the SDK's local compute target
reads runs and registers models through the same calls. Every name from the command line
is checked to be one (no ``..``, no link out of the namespace) before it becomes a path.
Tested in tests/unit/sdk/test_local_registry.py and through the CLI in
tests/unit/cli/test_local_reads.py.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

from torchyard.local import default_registry
from torchyard.records import BadQuery, FolderRecords, Page, Query, Record, Records
from torchyard.records.reader import check_names
from torchyard.registry import Store, Version
from torchyard.registry.store import OutsideNamespace, sha256_file
from torchyard.sdk.registry import RegistryError

_MODEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class LocalRegistry(Records):
    """The local registry folder at ``root`` (default: local mode's)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or default_registry()).expanduser()
        self.records = FolderRecords(self.root)
        self.progress = False  # (the service's client draws download progress; not here)

    def __repr__(self) -> str:
        return f"LocalRegistry({str(self.root)!r})"

    @property
    def store(self) -> Store:
        return Store(self.root)

    # -- records ----------------------------------------------------------------------

    def page(self, namespace: str, query: Query) -> Page:
        return self.records.page(namespace, query)

    def get_record(
        self, namespace: str, name: str, uid: str | None = None, *, kind: str = "TrainingRun"
    ) -> Record | None:
        return self.records.get_record(namespace, name, uid, kind=kind)

    def metrics_lines(
        self, namespace: str, name: str, uid: str, *, kind: str = "TrainingRun"
    ) -> list[str]:
        return self.records.metrics_lines(namespace, name, uid, kind=kind)

    # -- models -----------------------------------------------------------------------

    def _check(self, namespace: str, name: str, what: str) -> None:
        try:
            check_names(namespace)
        except BadQuery as err:
            raise RegistryError(str(err), 400) from None
        if not _MODEL.fullmatch(name):
            raise RegistryError(f"{what} {name[:80]!r} is not a DNS-1123 label", 400)

    def models(self, namespace: str) -> dict[str, list[int]]:
        """Every model of the namespace and its versions, oldest first."""
        self._check(namespace, "x", "model")
        folder = self.root / namespace / "models"
        if not folder.is_dir():
            return {}
        store = self.store
        return {
            d.name: store.versions(namespace, d.name)
            for d in sorted(folder.iterdir())
            if d.is_dir() and not d.is_symlink() and _MODEL.fullmatch(d.name)
        }

    def version(self, namespace: str, model: str, version: int | None = None) -> Version:
        """A version of ``model`` (None: the latest), inside the namespace's folder."""
        self._check(namespace, model, "model")
        try:
            found = self.store.get(namespace, model, version)
            self.store.inside(namespace, found.path)
        except KeyError as err:
            raise RegistryError(
                f"{err.args[0]} in the local registry {self.root} (torchyard models list --local)",
                404,
            ) from None
        except (OSError, ValueError, OutsideNamespace) as err:
            raise RegistryError(f"model {namespace}/{model}: {err}") from None
        return found

    def manifest(self, namespace: str, model: str, version: int | None = None) -> dict[str, Any]:
        return self.version(namespace, model, version).manifest

    def _files(self, found: Version) -> list[tuple[str, str, Path]]:
        """(path, sha256, file) of each file of a version, each kept inside its folder."""
        top = found.path.resolve()
        out = []
        for entry in found.manifest.get("files") or []:
            rel = str(entry.get("path") or "")
            target = (found.path / rel).resolve()
            if not rel or not target.is_relative_to(top) or target == top:
                raise RegistryError(f"the manifest of {found.path} names {rel!r}: refused")
            out.append((rel, str(entry.get("sha256") or ""), target))
        return out

    def download(
        self, namespace: str, model: str, version: int | None, dest: Path
    ) -> dict[str, Any]:
        """Every file of a version copied into ``dest``, each checked against its sha256
        first (nothing is written when one does not match)."""
        found = self.version(namespace, model, version)
        files = self._files(found)
        bad = [rel for rel, sha, path in files if not path.is_file() or sha256_file(path) != sha]
        if bad:
            raise RegistryError(
                f"{found.path}: {', '.join(bad)} no longer match the manifest's sha256; "
                "nothing was downloaded"
            )
        top = dest.resolve()
        for rel, _sha, path in files:
            target = dest / rel
            if not target.resolve().is_relative_to(top):
                raise RegistryError(f"{rel!r} would land outside {dest}: refused")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        return found.manifest

    def verify(
        self, namespace: str, model: str, version: int | None = None
    ) -> tuple[dict[str, Any], list[str]]:
        found = self.version(namespace, model, version)
        return found.manifest, self.store.verify(found)

    # -- runs -------------------------------------------------------------------------

    def run_dir(self, namespace: str, run: str) -> Path:
        try:
            check_names(namespace, run)
        except BadQuery as err:
            raise RegistryError(str(err), 400) from None
        folder = self.store.run_dir(namespace, run)
        if not folder.is_dir():
            raise RegistryError(
                f"no archive of run {namespace}/{run} in the local registry {self.root} "
                "(torchyard runs list --local)",
                404,
            )
        return folder

    def run_files(self, namespace: str, run: str) -> list[str]:
        """Every archived file of a run (``outputs/...``, ``logs/node-N/...``)."""
        folder = self.run_dir(namespace, run)
        top = self.store.inside(namespace, folder)
        return sorted(
            p.relative_to(folder).as_posix()
            for p in folder.rglob("*")
            if p.is_file() and not p.is_symlink() and p.resolve().is_relative_to(top)
        )

    def run_file(self, namespace: str, run: str, path: str) -> Path:
        """The archived file ``path`` of a run (``outputs/...`` or ``logs/...``)."""
        parts = PurePosixPath(path).parts
        if not path.startswith(("outputs/", "logs/")) or ".." in parts or "\\" in path:
            raise RegistryError("the path starts with outputs/ or logs/ and has no '..'", 400)
        folder = self.run_dir(namespace, run)
        target = folder / path
        try:
            resolved = self.store.inside(namespace, target)
        except OutsideNamespace as err:
            raise RegistryError(str(err), 400) from None
        if not resolved.is_relative_to(folder.resolve()) or not resolved.is_file():
            raise RegistryError(f"run {namespace}/{run} has no archived file {path}", 404)
        return resolved

    def read_run_file(self, namespace: str, run: str, path: str, uid: str | None = None) -> str:
        return self.run_file(namespace, run, path).read_text(errors="replace")

    def download_run_file(
        self, namespace: str, run: str, path: str, dest: Path, sha256: str | None = None
    ) -> Path:
        source = self.run_file(namespace, run, path)
        if sha256 and sha256_file(source) != sha256:
            raise RegistryError(f"{path}: its sha256 does not match {sha256}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
        return dest


__all__ = ["LocalRegistry"]
