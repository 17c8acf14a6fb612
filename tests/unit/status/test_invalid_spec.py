"""One InvalidSpec status for every kind (status.conditions.invalid_spec_status): the same
phase and conditions for a TrainingRun, a Sweep, an Environment and an OnlineEndpoint, each
kind adding only its own fields."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from torchyard import status
from torchyard.status import endpoints, sweeps

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
Builder = Callable[[int | None, str, Mapping[str, Any] | None, datetime], dict[str, Any]]
KSTATUS = {
    "Accepted": "False",
    "Ready": "False",
    "Reconciling": "False",
    "Stalled": "True",
}
KINDS: list[tuple[str, Builder, dict[str, str]]] = [
    ("TrainingRun", status.invalid_trainingrun_status, {**KSTATUS, "Failed": "True"}),
    ("Sweep", sweeps.invalid_sweep_status, {**KSTATUS, "Failed": "True"}),
    ("Environment", status.invalid_environment_status, KSTATUS),
    ("OnlineEndpoint", endpoints.invalid_endpoint_status, KSTATUS),
]


@pytest.mark.parametrize(("kind", "build", "conditions"), KINDS, ids=[k[0] for k in KINDS])
def test_every_kind_says_an_invalid_spec_the_same_way(
    kind: str, build: Builder, conditions: dict[str, str]
) -> None:
    st = build(3, "spec.x: must be at least 1", None, T0)
    assert st["phase"] == "Failed" and st["observedGeneration"] == 3
    said = {c["type"]: c["status"] for c in st["conditions"]}
    assert said == conditions
    for cond in st["conditions"]:
        assert cond["reason"] == "InvalidSpec"
        assert cond["message"] == "spec.x: must be at least 1"
        assert cond["observedGeneration"] == 3


@pytest.mark.parametrize(("kind", "build", "conditions"), KINDS, ids=[k[0] for k in KINDS])
def test_said_again_it_is_the_same_status(
    kind: str, build: Builder, conditions: dict[str, str]
) -> None:
    first = build(3, "spec.x: bad", None, T0)
    assert build(3, "spec.x: bad", first, T0 + timedelta(minutes=5)) == first


def test_each_kind_adds_only_its_own_fields() -> None:
    run = status.invalid_trainingrun_status(1, "bad", None, T0)
    assert run["failure"] == {"reason": "InvalidSpec", "message": "bad"}
    env = status.invalid_environment_status(1, "bad", None, T0)
    assert env["message"] == "bad" and "failure" not in env
    endpoint = endpoints.invalid_endpoint_status(1, "bad", None, T0)
    assert endpoint["message"] == "bad" and "failure" not in endpoint
    pinned = {"seed": 7, "inputs": {"data": "sha256:ab"}, "activeTrials": 2}
    sweep = sweeps.invalid_sweep_status(1, "bad", pinned, T0)
    assert sweep["seed"] == 7 and sweep["inputs"] == {"data": "sha256:ab"}
    assert "activeTrials" not in sweep and "failure" not in sweep


@pytest.mark.parametrize(("kind", "build", "conditions"), KINDS, ids=[k[0] for k in KINDS])
def test_without_a_generation_none_is_written(
    kind: str, build: Builder, conditions: dict[str, str]
) -> None:
    st = build(None, "bad", None, T0)
    assert "observedGeneration" not in st
    assert all("observedGeneration" not in c for c in st["conditions"])
