"""Whose a run's archive is: ``runs/<name>`` belongs to one TrainingRun (uid) at a time.

A TrainingRun deleted and created again under its name (another uid) must not write into
the earlier run's archive (a ModelVersion of the new run would take the old one's
outputs): :func:`claim` moves the earlier archive whole to ``runs/<name>@<its uid>``, so
nothing is lost either. The owner is kept in ``runs/<name>@owner`` ('@' is in no
Kubernetes name). Called by ``Access.archive_writer`` before every upload; tested in
``tests/unit/registry/test_service.py``.
"""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

from torchyard.registry.store import TMP_PREFIX, OutsideNamespace, Store

_locks: dict[tuple[str, str, str], threading.Lock] = {}
_guard = threading.Lock()


def _lock(store: Store, namespace: str, run: str) -> threading.Lock:
    with _guard:
        return _locks.setdefault((str(store.root.resolve()), namespace, run), threading.Lock())


def owner(store: Store, namespace: str, run: str) -> str:
    """The uid of the run ``runs/<run>`` belongs to ('' when none was recorded)."""
    try:
        return (store.run_dir(namespace, run).with_name(f"{run}@owner")).read_text().strip()
    except OSError:
        return ""


def claim(store: Store, namespace: str, run: str, uid: str) -> Path | None:
    """Make ``runs/<run>`` the archive of the run with this ``uid``; returns where an
    earlier run's archive of the name went, None when there was none to move."""
    dest = store.run_dir(namespace, run)
    try:  # a link, or a path out of the namespace, is never moved: the upload refuses it
        if dest.is_symlink() or store.inside(namespace, dest) != dest.absolute():
            return None
    except OutsideNamespace:
        return None
    with _lock(store, namespace, run):
        earlier = owner(store, namespace, run)
        if earlier == uid:
            return None
        moved = None
        if dest.exists():
            earlier = earlier or f"unknown-{int(dest.stat().st_mtime)}"
            moved = dest.with_name(f"{run}@{earlier}")
            if moved.exists():
                moved = dest.with_name(f"{run}@{earlier}-{uuid.uuid4().hex[:8]}")
            os.rename(dest, moved)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f"{TMP_PREFIX}{uuid.uuid4().hex}")
        tmp.write_text(uid)
        os.replace(tmp, dest.with_name(f"{run}@owner"))
        return moved
