"""The key of an MPI run's launcher channel (``distribution.type: mpi``).

Called by ``controller.trainingruns`` before it creates a run's node Pods (which mount the
key read-only, ``planning.mpi``); tested in tests/unit/controller/test_mpi_keys.py and on
the real node (tests/node/test_mpi.py).
"""

from __future__ import annotations

import secrets

from torchyard import api, k8s
from torchyard.controller.context import Context
from torchyard.planning import mpi, pods

KEY_BYTES = 32


def ensure(ctx: Context, run: api.TrainingRun) -> None:
    """Create the run's key Secret once. Created, not applied: a key must never change
    under running Pods, and creating needs no right to read the namespace's Secrets; an
    existing one (409) is the key this run already has. Owned by the run, so deleting the
    run deletes it."""
    if run.spec.distribution.type != "mpi":
        return
    key = secrets.token_hex(KEY_BYTES)
    try:
        ctx.k8s.create(mpi.secret(run, key, pods.owner_reference(run)))
    except k8s.ApiError as err:
        if not err.conflict:
            raise
