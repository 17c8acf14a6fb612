"""Registering a succeeded Sweep's best trial as a model version (``spec.registerBest``).

:func:`candidate` (pure) picks the trial: the best by the objective among the trials that
completed (a stopped or canceled trial ended without its outputs archived).
:func:`register_best` promotes that trial's archived ``registerBest.path`` through the one
register path of a TrainingRun's outputs (``finalize.register``, the trial read with
``outputs.register`` set to ``registerBest``): the registry returns the version it made
when the same trial (its uid) is promoted again, and the ModelVersion is applied
server-side, so an operator that restarts between the promotion and the status write
finds the same version rather than making a second. What it did is a status change
(``status.sweeps.with_model``): ``status.model`` and the condition ``ModelRegistered``.
Called by ``controller.sweeps``; tested in tests/unit/controller/test_sweeps.py and on a
real control plane in tests/integration/test_sweeps.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchyard import api, k8s
from torchyard.controller import finalize
from torchyard.controller.context import Context, Log
from torchyard.planning import names
from torchyard.sweeps import trials

# How soon a sweep whose best trial could not be registered yet tries again.
RETRY_SECONDS = 5.0


@dataclass(frozen=True)
class Registered:
    """What registering did, as the condition ``ModelRegistered`` says it (``status``:
    True, "Unknown" while it waits and is tried again, False when there is nothing to
    register) and, once done, ``status.model``."""

    status: bool | str
    reason: str
    message: str
    model: Mapping[str, Any] | None = None

    @property
    def waiting(self) -> bool:
        return self.status == "Unknown"


def candidate(book: trials.Book) -> trials.TrialRecord | None:
    """The best trial (by the objective) among those that completed; None when none did
    with the metric."""
    return trials.best_completed(book)


def register_best(ctx: Context, sweep: api.Sweep, book: trials.Book, logger: Log) -> Registered:
    """Promote the best completed trial's outputs as ``registerBest.model``'s next version."""
    wanted = sweep.spec.register_best
    assert wanted is not None
    best = candidate(book)
    metric = sweep.spec.objective.metric
    if best is None:
        return Registered(
            False, "NoCompletedTrial", f"no trial completed with {metric}: nothing to register"
        )
    trial = names.trial(sweep.name, best.index)
    body = ctx.k8s.get_or_none(k8s.TRAININGRUNS, sweep.namespace, trial)
    if body is None:
        return Registered(False, "TrialDeleted", f"the best trial {trial} was deleted")
    run = api.parse_trainingrun(body)
    register = api.Register(model=wanted.model, path=wanted.path)
    outputs = run.spec.outputs.model_copy(update={"register_": register})
    run = run.model_copy(update={"spec": run.spec.model_copy(update={"outputs": outputs})})
    environment = ctx.k8s.get_or_none(k8s.ENVIRONMENTS, sweep.namespace, run.spec.environment)
    done = finalize.register(run, environment, ctx, logger)
    if done.model is not None:
        model = {"name": done.model["name"], "version": done.model["version"], "trial": trial}
        message = (
            f"{wanted.model} version {done.model['version']} from trial {trial} "
            f"({metric} {best.best})"
        )
        return Registered(True, "Registered", message, model)
    if done.waiting:
        return Registered("Unknown", "Waiting", f"registering trial {trial}: {done.waiting}")
    return Registered(
        False,
        "NoRegistry",
        "registerBest is set but this operator has no registry service (TORCHYARD_REGISTRY_URL)",
    )
