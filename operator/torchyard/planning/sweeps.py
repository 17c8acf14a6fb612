"""A Sweep's children as pure builders: each trial's TrainingRun, and the ConfigMap that
holds every trial.

:func:`trial` is the TrainingRun ``<sweep>-t<index>``: ``spec.trial`` with the trial's
parameters appended to its command (``--learning_rate 0.0031``, as HyperDrive passes
them) and set as ``TORCHYARD_PARAM_<NAME>`` variables (both formatted by the sweeps core,
``sweeps.sampling.arguments`` and ``environment``, which the caller passes in: this layer
does not import that one), labelled with the sweep and the index, its parameters in an
annotation, owned by the Sweep; :func:`pinned` gives every trial the same version of a
model:// input that names none (the one the Sweep took for its first trial).
:func:`decided` stops a trial the Sweep stopped or canceled: ``spec.suspend: true`` and
the decision in two annotations, so the one apply that stops it also records why (a
restarted operator reads the decision back from it).
:func:`ledger` is the ConfigMap ``<sweep>-trials`` with one key per trial. The same
inputs give the same manifests: an operator that restarts applies what it applied before.
Called by ``controller.sweeps``; tested as tables in tests/unit/planning/test_sweeps.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from torchyard.api import Sweep, wire
from torchyard.planning import inputs, names

# A parameter's value as the trial receives it (sweeps.space.Value).
Value = int | float | str | bool
What: TypeAlias = Literal["stopped", "canceled", "paused", "promoted"]
DECISIONS: tuple[What, ...] = ("stopped", "canceled", "paused", "promoted")
# The field manager of a decision (:func:`decided`): not the one that made the trial, so
# that applying a decision leaves the fields of the trial's making as they are.
DECISION_FIELD_MANAGER = "torchyard-sweeps"
# Kubernetes keeps an annotation value below 256 KiB in all; a reason is a line of words.
REASON_MAX = 1024


@dataclass(frozen=True)
class Decision:
    """What the Sweep decided for a trial: ``stopped`` by the early-termination policy,
    ``canceled`` because the sweep ended before it, ``paused`` (suspended with its
    checkpoint) or ``promoted`` (resumed from it) by ASHA; ``reason`` in words;
    ``promotions``: how many times it was promoted, this one included."""

    what: What
    reason: str
    promotions: int = 0


def owner_reference(sweep: Sweep) -> dict[str, Any]:
    return {
        "apiVersion": sweep.api_version,
        "kind": "Sweep",
        "name": sweep.name,
        "uid": sweep.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def labels(sweep: Sweep, index: int) -> dict[str, str]:
    """A trial's labels: its Sweep, its index, and its experiment (the Sweep's, else the
    Sweep's name), so that ``runs list --experiment`` finds the trials as Azure ML lists a
    HyperDrive run's children in its experiment."""
    return {
        wire.LABEL_SWEEP: sweep.name,
        wire.LABEL_TRIAL: str(index),
        wire.LABEL_EXPERIMENT: experiment(sweep),
        "app.kubernetes.io/managed-by": "torchyard",
    }


def experiment(sweep: Sweep) -> str:
    """The experiment of a Sweep's trials: its own experiment label, else its name."""
    own = (sweep.metadata.get("labels") or {}).get(wire.LABEL_EXPERIMENT)
    return str(own) if own else sweep.name


def selector(sweep: str) -> str:
    """The label selector of a Sweep's trials."""
    return f"{wire.LABEL_SWEEP}={sweep}"


def trial(
    sweep: Sweep,
    index: int,
    parameters: Mapping[str, Value],
    arguments: Sequence[str],
    environment: Mapping[str, str],
) -> dict[str, Any]:
    """The TrainingRun of trial ``index`` (see the module docstring)."""
    spec = sweep.spec.trial.to_dict()
    spec["command"] = [*spec["command"], *arguments]
    spec["env"] = [
        *spec.get("env", []),
        *({"name": name, "value": value} for name, value in environment.items()),
    ]
    metadata = {
        "labels": labels(sweep, index),
        "annotations": {wire.ANNOTATION_PARAMETERS: parameters_text(parameters)},
        "ownerReferences": [owner_reference(sweep)],
    }
    return _trial_run(sweep, index, metadata, spec)


def pinned(sweep: Sweep, versions: Mapping[str, str]) -> Sweep:
    """``sweep`` whose trial template has each model:// input that names no version pinned
    to ``versions[name]``: every trial fetches the same version, whatever is registered
    while the sweep runs."""
    trial = inputs.pinned_spec(sweep.spec.trial, versions)
    if trial is sweep.spec.trial:
        return sweep
    return sweep.model_copy(update={"spec": sweep.spec.model_copy(update={"trial": trial})})


def trial_versions(trial_run: Mapping[str, Any], loose: Iterable[str]) -> dict[str, str]:
    """The versions a trial TrainingRun was made with for the inputs named ``loose`` (the
    trial template's model:// inputs that name none), by name."""
    wanted = set(loose)
    found = {}
    for entry in (trial_run.get("spec") or {}).get("inputs") or []:
        name, revision = entry.get("name"), entry.get("revision")
        if name in wanted and isinstance(revision, str) and revision:
            found[str(name)] = revision
    return found


def decided(sweep: Sweep, index: int, decision: Decision) -> dict[str, Any]:
    """What stops (pauses, resumes) trial ``index``, applied with
    :data:`DECISION_FIELD_MANAGER` (so it owns these fields only, and the trial's spec stays
    as it was made, whatever ``spec.trial`` says now): ``spec.suspend`` (true but for a
    promotion) and the decision's annotations.

    Suspending stops the trial's gang and frees its GPUs at once (the Pods are deleted
    with their grace period, in which a trial with ``spec.checkpoints`` saves one), while
    the TrainingRun, its status, progress and archived logs, stays to be read. Deleting
    its Pods instead would count as a lost node Pod and restart the gang; deleting the
    TrainingRun would lose its record."""
    annotations = {
        wire.ANNOTATION_DECISION: decision.what,
        wire.ANNOTATION_DECISION_REASON: decision.reason[:REASON_MAX],
    }
    if decision.promotions:
        annotations[wire.ANNOTATION_PROMOTIONS] = str(decision.promotions)
    # a promoted trial resumes (from its newest complete checkpoint)
    suspend = decision.what != "promoted"
    return _trial_run(sweep, index, {"annotations": annotations}, {"suspend": suspend})


def _trial_run(
    sweep: Sweep, index: int, metadata: Mapping[str, Any], spec: Mapping[str, Any]
) -> dict[str, Any]:
    """Trial ``index``'s TrainingRun object: its name and namespace, then ``metadata``."""
    return {
        "apiVersion": wire.API_VERSION,
        "kind": "TrainingRun",
        "metadata": {
            "name": names.trial(sweep.name, index),
            "namespace": sweep.namespace,
            **metadata,
        },
        "spec": dict(spec),
    }


def parameters_text(parameters: Mapping[str, Value]) -> str:
    """The parameters as the annotation holds them: JSON, by name."""
    return json.dumps({name: parameters[name] for name in sorted(parameters)})


def decision_of(trial_run: Mapping[str, Any]) -> Decision | None:
    """The decision a trial's annotations record (None: none, or one not made by a Sweep)."""
    annotations = (trial_run.get("metadata") or {}).get("annotations") or {}
    what = annotations.get(wire.ANNOTATION_DECISION)
    reason = str(annotations.get(wire.ANNOTATION_DECISION_REASON) or "")
    count = str(annotations.get(wire.ANNOTATION_PROMOTIONS) or "0")
    promotions = int(count) if count.isdigit() else 0
    for known in DECISIONS:
        if what == known:
            return Decision(known, reason, promotions)
    return None


def index_of(trial_run: Mapping[str, Any]) -> int | None:
    """A trial's index from its label (None when it has none that reads as one)."""
    value = ((trial_run.get("metadata") or {}).get("labels") or {}).get(wire.LABEL_TRIAL)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def ledger(sweep: Sweep, data: Mapping[str, str]) -> dict[str, Any]:
    """The ConfigMap ``<sweep>-trials`` holding ``data`` (one key per trial), owned by the
    Sweep, so it goes with it."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": names.sweep_trials(sweep.name),
            "namespace": sweep.namespace,
            "labels": {wire.LABEL_SWEEP: sweep.name, "app.kubernetes.io/managed-by": "torchyard"},
            "ownerReferences": [owner_reference(sweep)],
        },
        "data": dict(sorted(data.items())),
    }
