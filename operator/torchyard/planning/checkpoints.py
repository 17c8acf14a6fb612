"""The checkpoint folder of a TrainingRun: its claim, its volume and the ranks' variables.

Pure builders, called by ``planning.pods`` (the volume, the mount, the variables of every
node Pod) and by the controller (``claim``: the PersistentVolumeClaim it applies before a
gang's Pods, owned by the run). The folder is one volume shared by every node of a run:
each rank writes its files and ``rank-R.done`` there, node 0's launcher writes
``COMPLETE.json``, and the launchers agree on the just-in-time step through it, so a run
of several nodes needs a ReadWriteMany volume (the API refuses a created ReadWriteOnce
claim for several nodes). Tested in tests/unit/planning/test_checkpoints.py and
tests/integration/test_checkpoints.py.
"""

from __future__ import annotations

from typing import Any

from torchyard.api import TrainingRun
from torchyard.launch.contract import (
    TORCHYARD_CHECKPOINT_ATTEMPT,
    TORCHYARD_CHECKPOINT_DIR,
    TORCHYARD_CHECKPOINT_INTERVAL,
    TORCHYARD_CHECKPOINT_KEEP,
    TORCHYARD_CHECKPOINT_MAX_STALLS,
    TORCHYARD_CHECKPOINT_SAVE_SECONDS,
)
from torchyard.planning import names

MOUNT_PATH = "/var/run/torchyard/checkpoints"
VOLUME = "checkpoints"
# What the launcher leaves itself at the end of the grace period after the just-in-time
# save: TORCHYARD_GRACE_PERIOD (SIGTERM to SIGKILL of the ranks) and a margin to report.
_STOP_MARGIN_SECONDS = 2


def claim_name(run: TrainingRun) -> str | None:
    """The claim the node Pods mount: the named one, or the one created for the run."""
    spec = run.spec.checkpoints
    if spec is None:
        return None
    return spec.claim_name or names.checkpoints(run.name)


def claim_spec(access_mode: str, size: str, storage_class: str) -> dict[str, Any]:
    """A claim's spec: one access mode, its size, its storage class ("": the default)."""
    spec: dict[str, Any] = {
        "accessModes": [access_mode],
        "resources": {"requests": {"storage": size}},
    }
    if storage_class:
        spec["storageClassName"] = storage_class
    return spec


def claim(run: TrainingRun, owner: dict[str, Any]) -> dict[str, Any] | None:
    """The PersistentVolumeClaim the operator creates for the run (``size``), owned by the
    run (``owner``: its owner reference); None for a named claim or no checkpoints."""
    spec = run.spec.checkpoints
    if spec is None or spec.size is None:
        return None
    pvc_spec = claim_spec(
        spec.access_mode_for(run.spec.distribution.node_count),
        spec.size,
        spec.storage_class_name or "",
    )
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": names.checkpoints(run.name),
            "namespace": run.namespace,
            "labels": {names.LABEL_RUN: run.name, "app.kubernetes.io/managed-by": "torchyard"},
            "ownerReferences": [owner],
        },
        "spec": pvc_spec,
    }


def volumes(run: TrainingRun) -> list[dict[str, Any]]:
    name = claim_name(run)
    if name is None:
        return []
    return [{"name": VOLUME, "persistentVolumeClaim": {"claimName": name}}]


def mounts(run: TrainingRun) -> list[dict[str, Any]]:
    if run.spec.checkpoints is None:
        return []
    return [{"name": VOLUME, "mountPath": MOUNT_PATH}]


def env(run: TrainingRun, grace_period: int, attempt: str) -> dict[str, str]:
    """The launcher's checkpoint variables (it exports TORCHYARD_CHECKPOINT_DIR and the
    resume variables to the ranks); ``grace_period``: the launcher's SIGTERM-to-SIGKILL
    time for its ranks (TORCHYARD_GRACE_PERIOD); ``attempt``: names this attempt the same
    on every node (node 0's launcher prepares the folder for it, the others wait)."""
    spec = run.spec.checkpoints
    if spec is None:
        return {}
    out = {
        TORCHYARD_CHECKPOINT_DIR: MOUNT_PATH,
        TORCHYARD_CHECKPOINT_KEEP: str(spec.keep),
        TORCHYARD_CHECKPOINT_MAX_STALLS: str(spec.max_attempts_without_progress),
        TORCHYARD_CHECKPOINT_SAVE_SECONDS: str(save_seconds(run, grace_period)),
        TORCHYARD_CHECKPOINT_ATTEMPT: attempt,
    }
    if spec.interval is not None:
        out[TORCHYARD_CHECKPOINT_INTERVAL] = str(spec.interval)
    return out


def attempt_id(run: TrainingRun, attempt: int) -> str:
    """The run's identity (its uid: a run created again under the same name is another
    one) and the gang's attempt number."""
    return f"{run.metadata.get('uid') or run.name}-{attempt}"


def save_seconds(run: TrainingRun, grace_period: int) -> int:
    """How long a stopped node's launcher waits for the just-in-time checkpoint: the Pod's
    terminationGracePeriodSeconds less the ranks' own stop time and a margin (>= 1)."""
    total = run.spec.policy.termination_grace_period_seconds
    return max(1, total - grace_period - _STOP_MARGIN_SECONDS)
