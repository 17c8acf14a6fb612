"""Whose a run's archive is: ``runs/<name>`` belongs to one TrainingRun (uid) at a time.

A TrainingRun deleted and created again under its name (another uid) must not write into
the earlier run's archive (a ModelVersion of the new run would take the old one's
outputs): :func:`claim` moves the earlier archive whole to ``runs/<name>@<its uid>``, so
nothing is lost either. The owner is kept in ``runs/<name>@owner`` ('@' is in no
Kubernetes name). Called by ``Access.archive_writer`` before every upload; readers ask for
one run's archive by its uid (:func:`archive_of`), wherever it is. Tested in
``tests/unit/registry/test_service.py``.
"""

from __future__ import annotations

import os
import re
import threading
import uuid
from pathlib import Path

from torchyard.registry.store import TMP_PREFIX, OutsideNamespace, Store

# A uid as a reader may name it (Kubernetes gives 8-4-4-4-12 hex digits): a name part, no
# '.', '/' or '@', and never the owner file's own suffix.
UID = re.compile(r"[0-9A-Za-z][0-9A-Za-z-]{0,62}")

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


def archive_of(store: Store, namespace: str, run: str, uid: str) -> tuple[Path | None, str]:
    """Where the archive of the run of this ``uid`` is, with the owner recorded for
    ``runs/<run>``: ``runs/<run>`` while it is that run's, or when no owner is recorded
    (then the owner is '': the caller cannot tell whose it is); ``runs/<run>@<uid>`` once
    a later run of the name moved it aside; None when it is in neither (the run uploaded
    nothing, or its archive is gone). A link is never taken for a moved archive."""
    dest = store.run_dir(namespace, run)
    current = owner(store, namespace, run)
    if current in ("", uid):
        return dest, current
    aside = dest.with_name(f"{run}@{uid}")
    if uid != "owner" and aside.is_dir() and not aside.is_symlink():
        return aside, uid
    return None, current
