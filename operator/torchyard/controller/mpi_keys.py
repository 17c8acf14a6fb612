"""The per-run key of a distribution type that ``needs_key`` (``distributions``; type mpi:
the key of its launchers' channel).

Called by ``controller.trainingruns`` before it creates a run's node Pods (which mount the
key read-only, the type's ``pod_parts``); tested in tests/unit/controller/test_mpi_keys.py
and on the real node (tests/node/test_mpi.py).
"""

from __future__ import annotations

import secrets

from torchyard import api, distributions, k8s
from torchyard.controller.context import Context
from torchyard.planning import pods

KEY_BYTES = 32


def ensure(ctx: Context, run: api.TrainingRun) -> None:
    """Create the run's key Secret once. Created, not applied: a key must never change
    under running Pods, and creating needs no right to read the namespace's Secrets; an
    existing one (409) is the key this run already has. Owned by the run, so deleting the
    run deletes it."""
    if not distributions.of(run.spec.distribution).needs_key:
        return
    key = secrets.token_hex(KEY_BYTES)
    try:
        ctx.k8s.create(pods.key_secret(run, key))
    except k8s.ApiError as err:
        if not err.conflict:
            raise
