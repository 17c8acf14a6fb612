"""``environments.reconcile`` against the in-memory fake of ``torchyard.k8s``: a curated
image pinned by digest is Ready at once (no registry asked), the runs waiting on it are
reconciled next, the status is written once and not again while nothing changed; an
Environment torchyard cannot build is Failed with a Warning. Builds are tested against a
real control plane and registry in tests/integration/test_environments.py."""

from __future__ import annotations

import logging
from typing import Any

from tests.builders import TrainingRunBuilder, environment
from tests.unit.controller.fake_k8s import FakeK8s
from tests.unit.controller.world import T0
from torchyard import k8s
from torchyard.controller import context, environments

PINNED = "python@sha256:" + "1" * 64


def reconcile(fake: FakeK8s, name: str = "pytorch") -> context.Result:
    body = fake.get(k8s.ENVIRONMENTS, "ns", name)
    ctx = context.Context(clock=lambda: T0, k8s=fake)
    return environments.reconcile(body, logging.getLogger("test"), ctx)


def env_status(fake: FakeK8s, name: str = "pytorch") -> dict[str, Any]:
    stored: dict[str, Any] = fake.get(k8s.ENVIRONMENTS, "ns", name)["status"]
    return stored


def test_a_pinned_curated_image_is_ready_and_wakes_its_runs_once() -> None:
    waiting = TrainingRunBuilder("waiting", "ns").environment("pytorch").obj()
    other = TrainingRunBuilder("other", "ns").environment("tensorflow").obj()
    fake = FakeK8s(environment("pytorch", "ns", image=PINNED), waiting, other)
    result = reconcile(fake)
    assert env_status(fake)["phase"] == "Ready" and env_status(fake)["image"] == PINNED
    assert len(fake.statuses) == 1
    assert [(t, r) for t, r, _ in fake.events] == [("Normal", "Ready")]
    assert result.also == [("TrainingRun", "ns", "waiting")]

    fake.reset_writes()
    again = reconcile(fake)
    assert (fake.statuses, fake.events, again.also) == ([], [], [])


def test_an_environment_that_cannot_be_built_is_failed_with_a_warning() -> None:
    fake = FakeK8s(environment("broken", "ns", pip=["torch"]))  # neither image nor baseImage
    reconcile(fake, "broken")
    assert env_status(fake, "broken")["phase"] == "Failed"
    assert len(fake.statuses) == 1
    [(type_, reason, message)] = fake.events
    assert (type_, reason) == ("Warning", "InvalidSpec") and message
