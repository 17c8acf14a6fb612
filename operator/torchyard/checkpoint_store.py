"""The checkpoint folder's layout and the completeness contract: which checkpoints are
complete, the newest one, ``COMPLETE.json``, the quarantine and ``keep``. Part of
``torchyard.checkpoint`` (which re-exports its public names: import that one), split off to
keep each module readable; standard library only, Python >= 3.8, and shipped beside it to
every node Pod (``SHIPPED_MODULES`` in ``torchyard.planning.pods``).

The layout under ``TORCHYARD_CHECKPOINT_DIR`` (one folder the operator mounts in every node
Pod; shared by all nodes of a run)::

    step-<N>/              one checkpoint: whatever files the ranks write
        rank-<R>.done      rank R wrote all its files (fsynced, with the folder)
        COMPLETE.json      written last, by node 0's launcher, when every rank's .done is
                           there: {"step", "worldSize", "files": [{"name", "size", "sha256"}]}
        .metadata          or: a PyTorch Distributed Checkpoint (its coordinator writes it
                           last), which counts as complete as it is
    quarantine-step-<N>/   a checkpoint a resumed attempt failed from before making progress
    .torchyard/            the launchers' bookkeeping: each rank's reported step, the
                           just-in-time target step

A checkpoint is complete only when its ``COMPLETE.json`` is a regular file naming exactly the
step of its folder, every file it lists is a regular file (no symlink) inside the folder with
that size and sha256, and nothing is judged by names or modification times.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from typing import Any

from torchyard.launch.contract import TORCHYARD_CHECKPOINT_DIR

DIR_VARIABLE = TORCHYARD_CHECKPOINT_DIR
COMPLETE = "COMPLETE.json"
DCP_METADATA = ".metadata"
QUARANTINE_PREFIX = "quarantine-"
_STEP = re.compile(r"^step-(0|[1-9][0-9]{0,17})$")
_CHUNK = 1 << 20


class CheckpointError(Exception):
    """The checkpoint folder is not configured or not usable; the message says what to do."""


def root(directory: str | None = None) -> str:
    """The checkpoint folder: ``directory``, else ``$TORCHYARD_CHECKPOINT_DIR``."""
    # equivalent mutants: an unset variable read as None instead of "" is refused the same
    found = directory or os.environ.get(DIR_VARIABLE, "")  # pragma: no mutate
    if not found:
        raise CheckpointError(
            f"{DIR_VARIABLE} is not set: give the TrainingRun spec.checkpoints (a claimName, "
            "or a size for a volume the operator creates), or set it to a folder yourself"
        )
    return found


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(folder: str, data: bytes) -> str:
    """A temp file in ``folder`` holding ``data``, fsynced; its path."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def _write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` by temp file, fsync and rename (and fsync the folder)."""
    folder = os.path.dirname(path) or "."
    tmp = _write_temp(folder, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)


def step_of(name: str) -> int | None:
    """N for a folder named ``step-N`` (canonical decimal), else None."""
    match = _STEP.match(name)
    return int(match.group(1)) if match else None


def step_path(step: int, directory: str | None = None) -> str:
    if step < 0:
        raise ValueError(f"a checkpoint step must be >= 0, got {step}")
    return os.path.join(root(directory), f"step-{step}")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        # equivalent mutants: reading all at once (read(None)) gives the same digest
        for chunk in iter(lambda: f.read(_CHUNK), b""):  # pragma: no mutate
            digest.update(chunk)
    return digest.hexdigest()


def _regular(path: str) -> os.stat_result | None:
    """The stat of ``path`` if it is a regular file and no symlink, else None."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info if stat.S_ISREG(info.st_mode) else None


def _files(path: str) -> list[str]:
    """Every regular file under ``path`` (relative, /-separated), but COMPLETE.json and
    temporary files; None-safe against symlinks (they are not followed nor listed)."""
    found = []
    for dirpath, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(dirpath, d)))
        rel = os.path.relpath(dirpath, path)
        for name in sorted(files):
            if rel == "." and (name == COMPLETE or name.startswith(".tmp-")):
                continue
            if _regular(os.path.join(dirpath, name)) is None:
                continue
            found.append(name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}")
    return found


def ranks_done(step: int, world_size: int, directory: str | None = None) -> bool:
    path = step_path(step, directory)
    return all(
        _regular(os.path.join(path, f"rank-{r}.done")) is not None for r in range(world_size)
    )


def finalize(step: int, world_size: int, directory: str | None = None) -> bool:
    """Write ``step-N/COMPLETE.json`` (temp file, fsync, rename) if every rank's ``.done``
    is there; True when the checkpoint is complete afterwards. Node 0's launcher calls it."""
    path = step_path(step, directory)
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    if is_complete(path, verify=False):
        return True
    if _regular(os.path.join(path, DCP_METADATA)) is not None:
        return True
    if not ranks_done(step, world_size, directory):
        return False
    entries = []
    for name in _files(path):
        full = os.path.join(path, *name.split("/"))
        entries.append({"name": name, "size": os.lstat(full).st_size, "sha256": _sha256(full)})
    body = {"step": step, "worldSize": world_size, "files": entries}
    _write_atomic(os.path.join(path, COMPLETE), json.dumps(body, indent=1).encode())
    return True


def _safe_name(name: Any) -> bool:
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name:
        return False
    # equivalent mutants: an absolute name also has an empty first part, refused below
    if name.startswith("/"):  # pragma: no mutate
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def _inside(folder: str, name: str) -> bool:
    """No component of ``name`` under ``folder`` is a symlink, and it stays inside."""
    current = folder
    for part in name.split("/")[:-1]:
        current = os.path.join(current, part)
        if os.path.islink(current) or not os.path.isdir(current):
            return False
    real_folder = os.path.realpath(folder)
    real = os.path.realpath(os.path.join(folder, *name.split("/")))
    return real.startswith(real_folder + os.sep)


def manifest(path: str) -> dict[str, Any] | None:
    """The parsed ``COMPLETE.json`` of checkpoint folder ``path`` if it is well formed
    (a regular file, the folder's step, a world size, a list of files), else None."""
    step = step_of(os.path.basename(os.path.normpath(path)))
    if step is None or os.path.islink(path):
        return None
    marker = os.path.join(path, COMPLETE)
    if _regular(marker) is None:
        return None
    try:
        with open(marker, "rb") as f:
            body = json.loads(f.read(16 << 20).decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(body, dict) or body.get("step") != step:
        return None
    world = body.get("worldSize")
    files = body.get("files")
    if not isinstance(world, int) or world < 1 or not isinstance(files, list):
        return None
    for entry in files:
        if not isinstance(entry, dict) or not _safe_name(entry.get("name")):
            return None
        if not isinstance(entry.get("size"), int) or not isinstance(entry.get("sha256"), str):
            return None
    return body


def is_complete(path: str, verify: bool = True) -> bool:
    """Checkpoint folder ``path`` is complete (see the module docstring). ``verify``: also
    check every file's sha256 (sizes are always checked)."""
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    if step_of(os.path.basename(os.path.normpath(path))) is None:
        return False
    body = manifest(path)
    if body is None:
        dcp = _regular(os.path.join(path, DCP_METADATA))
        return dcp is not None and dcp.st_size > 0
    for r in range(body["worldSize"]):
        if _regular(os.path.join(path, f"rank-{r}.done")) is None:
            return False
    for entry in body["files"]:
        name = entry["name"]
        if not _inside(path, name):
            return False
        full = os.path.join(path, *name.split("/"))
        info = _regular(full)
        if info is None or info.st_size != entry["size"]:
            return False
        if verify and _sha256(full) != entry["sha256"]:
            return False
    return True


def steps(directory: str | None = None) -> list[int]:
    """Every ``step-N`` folder's N (complete or not), in ascending order."""
    try:
        names = os.listdir(root(directory))
    except FileNotFoundError:
        return []
    return sorted(n for n in (step_of(name) for name in names) if n is not None)


def complete_steps(directory: str | None = None, verify: bool = True) -> list[int]:
    """The steps whose checkpoint is complete, ascending."""
    return [s for s in steps(directory) if is_complete(step_path(s, directory), verify)]


def latest(directory: str | None = None, verify: bool = True) -> str | None:
    """The folder of the newest complete checkpoint (by its step, never by names' order or
    modification times), else None. Where ``$TORCHYARD_CHECKPOINT_DIR`` is not set: None."""
    if directory is None and not os.environ.get(DIR_VARIABLE):
        return None
    for step in reversed(steps(directory)):
        path = step_path(step, directory)
        if is_complete(path, verify):
            return path
    return None


def quarantine(step: int, directory: str | None = None) -> str | None:
    """Move checkpoint ``step`` aside (``quarantine-step-N``, then ``-2``, ...) so that
    :func:`latest` passes it over; the new path, or None when it was not there."""
    path = step_path(step, directory)
    if not os.path.lexists(path):
        return None
    base = os.path.join(root(directory), f"{QUARANTINE_PREFIX}step-{step}")
    target, n = base, 1
    while os.path.lexists(target):
        n += 1
        target = f"{base}-{n}"
    os.rename(path, target)
    _fsync_dir(root(directory))
    return target


def keep(newest: int, directory: str | None = None) -> list[int]:
    """Delete all but the ``newest`` complete checkpoints, and the incomplete ones older
    than the newest complete one (a save that never finished); the steps deleted."""
    if newest < 1:
        raise ValueError(f"keep must be >= 1, got {newest}")
    complete = complete_steps(directory, verify=False)
    if not complete:
        return []
    kept = set(complete[-newest:])
    gone = []
    for step in steps(directory):
        if step in kept or step > complete[-1]:
            continue
        path = step_path(step, directory)
        if os.path.islink(path):
            os.unlink(path)
        else:
            shutil.rmtree(path, ignore_errors=True)
        gone.append(step)
    return gone


def quarantined(directory: str | None = None) -> list[str]:
    """The folders of quarantined checkpoints."""
    try:
        return [n for n in os.listdir(root(directory)) if n.startswith(QUARANTINE_PREFIX)]
    except FileNotFoundError:
        return []
