"""A run's inputs in its status: what the controller observed of their cache entries and
fetch Jobs, and the ``InputsReady`` condition it makes, as pure functions.

``controller.inputs`` fills :class:`InputsObserved`; ``status.trainingruns`` asks
:func:`decide` after the Environment: a failed fetch fails the run (reason
``InputFetchFailed``, the input, its URI and the fetcher's error with its fix), a fetch
in progress keeps it ``Preparing`` (no Pod, so no GPU, is held), and once every input is
ready the run goes on to admission. A fetch Pod the kubelet holds back until someone
fixes something (an s3:// or hf:// input's Secret missing or without its credentials; its
image), or that no node takes, keeps the run ``Preparing`` with the reason and the fix
(``InputSecretNotReady``, ``FetchPodNotStarting``, ``FetchPodNotScheduled``), as a Pod
waits for its Secret. Tested as tables in
tests/unit/status/test_inputs.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchyard.inputs import s3
from torchyard.status.conditions import condition
from torchyard.status.failures import STUCK_REASONS

INPUT_FETCH_FAILED = "InputFetchFailed"
SECRET_NOT_READY = "InputSecretNotReady"
POD_NOT_STARTING = "FetchPodNotStarting"
POD_NOT_SCHEDULED = "FetchPodNotScheduled"


@dataclass(frozen=True)
class InputsObserved:
    """The run's fetched inputs this time: their status entries (``status.inputs``), the
    ones still being fetched (name -> what is going on), the ones whose fetch cannot
    start until something is fixed (name -> (reason, what and the fix)) and the first
    failure."""

    entries: Sequence[Mapping[str, Any]] = ()
    waiting: Mapping[str, str] = field(default_factory=dict)
    failure: Mapping[str, Any] | None = None
    blocked: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return not self.waiting and not self.blocked and self.failure is None


@dataclass(frozen=True)
class Decision:
    """The InputsReady condition and whether the run fails (``failure``) or waits."""

    condition: dict[str, Any]
    failure: Mapping[str, Any] | None = None
    waiting: bool = False


def failure(name: str, uri: str, error: str) -> dict[str, Any]:
    """The run's failure for input ``name``: its URI and the fetcher's error (with its fix)."""
    return {"reason": INPUT_FETCH_FAILED, "message": f"input {name} ({uri}): {error}"}


def _secret_fix(uri: str, secret: str, namespace: str) -> str:
    if uri.startswith("hf://"):
        return (
            f"the input's Secret {secret} must exist, with HF_TOKEN (and HF_ENDPOINT for a "
            f"Hub other than huggingface.co): kubectl create secret generic {secret} -n "
            f"{namespace} --from-literal=HF_TOKEN=...; the run waits for it"
        )
    literals = " ".join(f"--from-literal={key}=..." for key in s3.CREDENTIALS)
    return (
        f"the input's Secret {secret} must hold {' and '.join(s3.CREDENTIALS)}: "
        f"kubectl create secret generic {secret} -n {namespace} {literals} (and "
        "AWS_ENDPOINT_URL for a store that is not AWS's); the run waits for it"
    )


def _unscheduled(pod: Mapping[str, Any]) -> str:
    """The scheduler's message when it found no node for the Pod (else '')."""
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
            return str(cond.get("message") or "no node fits it")
    return ""


def stuck_fetch(
    uri: str, secret: str, namespace: str, pods: Sequence[Mapping[str, Any]]
) -> tuple[str, str] | None:
    """(reason, message) when a fetch Pod cannot go on until something is fixed: the
    kubelet holds it back (its Secret or a key of it missing: CreateContainerConfigError;
    its image not pulled), or the scheduler finds no node for it (a claim that never
    binds, a quota, a taint); else None."""
    for pod in pods:
        name = pod.get("metadata", {}).get("name", "")
        unscheduled = _unscheduled(pod)
        if unscheduled:
            return POD_NOT_SCHEDULED, (
                f"{uri}: the fetch Pod {name} is not scheduled ({unscheduled}): it asks for "
                "no GPU; check the cache's claim (the chart's inputs cache) binds and that "
                "a node without taints it does not tolerate has CPU to spare; the run waits"
            )
        for cs in pod.get("status", {}).get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            said = str(waiting.get("reason") or "")
            if said not in STUCK_REASONS:
                continue
            what = (
                f"{uri}: the fetch Pod {name} cannot start ({said}: {waiting.get('message', '')})"
            )
            if said == "CreateContainerConfigError" and secret:
                return SECRET_NOT_READY, f"{what}: " + _secret_fix(uri, secret, namespace)
            return POD_NOT_STARTING, (
                f"{what}: check the operator's fetch image (the chart's initImage) and that "
                "the node may pull it; the run waits"
            )
    return None


def decide(observed: InputsObserved, generation: int | None) -> Decision:
    if observed.failure is not None:
        message = str(observed.failure["message"])
        cond = condition(
            "InputsReady", False, INPUT_FETCH_FAILED, message, observed_generation=generation
        )
        return Decision(cond, failure=observed.failure)
    if observed.blocked:
        found = sorted(observed.blocked.items())
        message = "; ".join(f"input {n}: {what}" for n, (_, what) in found)
        cond = condition(
            "InputsReady", False, found[0][1][0], message, observed_generation=generation
        )
        return Decision(cond, waiting=True)
    if observed.waiting:
        message = "; ".join(f"input {n}: {what}" for n, what in sorted(observed.waiting.items()))
        cond = condition("InputsReady", False, "Fetching", message, observed_generation=generation)
        return Decision(cond, waiting=True)
    count = len(observed.entries)
    fetched = sum(int(e.get("fetchedBytes") or 0) for e in observed.entries)
    message = f"{count} input(s) ready in the cache ({fetched} bytes fetched for this run)"
    return Decision(
        condition("InputsReady", True, "Ready", message, observed_generation=generation)
    )
