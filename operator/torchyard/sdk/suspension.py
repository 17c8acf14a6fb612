"""Suspending and resuming a TrainingRun from a laptop: ``spec.suspend`` true or false.

Each call server-side applies only ``spec.suspend`` with its own field manager
(``torchyard-suspend``), so whoever owns the rest of the spec (kubectl, Helm, a GitOps
tool) keeps it; the operator does the rest (``torchyard.controller.suspension``): the
gang saves a just-in-time checkpoint and stops, its capacity is freed, and a resumed run
is admitted in its queue order and continues from the newest complete checkpoint. Called
by ``torchyard suspend|resume NAME`` (``torchyard.cli.suspension``) and the Azure ML-style
``Run.suspend()``/``Run.resume()``; tested in tests/integration/test_suspend.py.
"""

from __future__ import annotations

from typing import Any

from torchyard import api, k8s
from torchyard.sdk import runs

FIELD_MANAGER = "torchyard-suspend"


def set_suspend(namespace: str, name: str, suspend: bool) -> dict[str, Any]:
    """Set the run's ``spec.suspend``; the run as the apiserver answered. A finished run is
    refused (``ValueError``): nothing of it runs any more."""
    run = runs.get(namespace, name)
    phase = (run.get("status") or {}).get("phase")
    if phase in runs.TERMINAL:
        raise ValueError(
            f"TrainingRun {namespace}/{name} is {phase}: only a run that has not finished can "
            "be suspended or resumed (submit it again to train more; with the same "
            "spec.checkpoints claimName it resumes from its newest complete checkpoint)"
        )
    patch = {
        "apiVersion": api.API_VERSION,
        "kind": "TrainingRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"suspend": suspend},
    }
    return k8s.apply(patch, field_manager=FIELD_MANAGER)


def suspend(namespace: str, name: str) -> dict[str, Any]:
    """``spec.suspend: true``: checkpoint now, stop the gang, free its capacity."""
    return set_suspend(namespace, name, True)


def resume(namespace: str, name: str) -> dict[str, Any]:
    """``spec.suspend: false``: admit the gang again, resume from the newest checkpoint."""
    return set_suspend(namespace, name, False)
