"""A run's inputs in its status: what the controller observed of their cache entries and
fetch Jobs, and the ``InputsReady`` condition it makes, as pure functions.

``controller.inputs`` fills :class:`InputsObserved`; ``status.trainingruns`` asks
:func:`decide` after the Environment: a failed fetch fails the run (reason
``InputFetchFailed``, the input, its URI and the fetcher's error with its fix), a fetch
in progress keeps it ``Preparing`` (no Pod, so no GPU, is held), and once every input is
ready the run goes on to admission. Tested as tables in tests/unit/status/test_inputs.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchyard.status.conditions import condition

INPUT_FETCH_FAILED = "InputFetchFailed"


@dataclass(frozen=True)
class InputsObserved:
    """The run's fetched inputs this time: their status entries (``status.inputs``), the
    ones still being fetched (name -> what is going on) and the first failure."""

    entries: Sequence[Mapping[str, Any]] = ()
    waiting: Mapping[str, str] = field(default_factory=dict)
    failure: Mapping[str, Any] | None = None

    @property
    def ready(self) -> bool:
        return not self.waiting and self.failure is None


@dataclass(frozen=True)
class Decision:
    """The InputsReady condition and whether the run fails (``failure``) or waits."""

    condition: dict[str, Any]
    failure: Mapping[str, Any] | None = None
    waiting: bool = False


def failure(name: str, uri: str, error: str) -> dict[str, Any]:
    """The run's failure for input ``name``: its URI and the fetcher's error (with its fix)."""
    return {"reason": INPUT_FETCH_FAILED, "message": f"input {name} ({uri}): {error}"}


def decide(observed: InputsObserved, generation: int | None) -> Decision:
    if observed.failure is not None:
        message = str(observed.failure["message"])
        cond = condition(
            "InputsReady", False, INPUT_FETCH_FAILED, message, observed_generation=generation
        )
        return Decision(cond, failure=observed.failure)
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
