"""``spec.registerBest`` through the Sweep reconcile, against the in-memory fake of
``torchyard.k8s`` and the registry's promote endpoint on loopback: the best completed
trial is promoted once the sweep succeeded, ``status.model`` names the version and the
trial, a reconcile that starts afresh (an operator restart) promotes nothing again, an
unreachable registry is tried again, and a sweep with nothing to register says why. The
real-control-plane version is in tests/integration/test_sweeps.py."""

from __future__ import annotations

import http.server
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from tests.builders import SweepBuilder
from tests.unit.controller.fake_k8s import FakeK8s
from tests.unit.controller.test_reconcile import Registry
from tests.unit.controller.test_sweeps import NS, conditions, running, set_trial, status, sweep
from tests.unit.controller.world import T0
from torchyard import k8s
from torchyard.api import wire
from torchyard.controller import context, sweep_register, sweeps
from torchyard.planning import pods
from torchyard.sweeps import trials
from torchyard.sweeps.stopping import Action, Decision, Goal


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[pods.Settings]:
    Registry.requests.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("operator-token\n")
    yield pods.Settings(
        registry_url=f"http://127.0.0.1:{server.server_address[1]}",
        registry_token_file=str(token),
    )
    server.shutdown()


def reconcile(fake: FakeK8s, settings: pods.Settings, at: float = 600.0) -> context.Result:
    ctx = context.Context(k8s=fake, clock=lambda: T0 + timedelta(seconds=at), settings=settings)
    return sweeps.reconcile(fake.get(k8s.SWEEPS, NS, "hd"), logging.getLogger("test"), ctx)


def finished(settings: pods.Settings, stop_best: bool = False) -> FakeK8s:
    """A two-trial sweep with registerBest: hd-t1 reports 0.9, hd-t0 0.7; both completed,
    or (``stop_best``) hd-t1 stopped by the sweep before its end."""
    fake = FakeK8s(sweep(SweepBuilder("hd", NS).seed(7).trials(2, 2).register_best("birds")))
    reconcile(fake, settings, at=0)
    for name, value in (("hd-t0", 0.7), ("hd-t1", 0.9)):
        running(fake, name, 1, value)
        reconcile(fake, settings, at=0)
    set_trial(fake, "hd-t0", phase="Succeeded", completionTime="2026-01-01T12:10:00Z")
    if stop_best:
        run = fake.objects[("trainingruns", NS, "hd-t1")]
        run["metadata"]["annotations"].update(
            {wire.ANNOTATION_DECISION: "stopped", wire.ANNOTATION_DECISION_REASON: "slack"}
        )
        set_trial(fake, "hd-t1", phase="Suspended")
    else:
        set_trial(fake, "hd-t1", phase="Succeeded", completionTime="2026-01-01T12:10:00Z")
    return fake


def test_the_best_completed_trial_is_registered_once_and_named_in_the_status(
    registry: pods.Settings,
) -> None:
    fake = finished(registry)
    assert reconcile(fake, registry).requeue_after == 0.0  # the next one writes its record
    [(path, body)] = Registry.requests
    assert path == f"/v1/namespaces/{NS}/models/birds/versions"
    assert (body["run"], body["path"]) == ("hd-t1", "outputs")
    assert body["metadata"]["run"]["name"] == "hd-t1"
    st = status(fake)
    assert st["phase"] == "Succeeded"
    assert st["model"] == {"name": "birds", "version": 3, "trial": "hd-t1"}
    registered = conditions(fake)["ModelRegistered"]
    assert (registered["status"], registered["reason"]) == ("True", "Registered")
    assert "birds version 3 from trial hd-t1" in registered["message"]
    assert conditions(fake)["Ready"]["reason"] == "AllTrialsEnded"
    assert fake.get(k8s.MODELVERSIONS, NS, "birds-v3")["spec"]["run"]["name"] == "hd-t1"
    assert "ModelRegistered" in [e[1] for e in fake.events]
    fake.reset_writes()
    reconcile(fake, registry, at=700)  # a restarted operator: its record, nothing more
    assert len(Registry.requests) == 1
    assert fake.applied == []
    assert [
        {c["type"] for c in s["status"]["conditions"]} - {c["type"] for c in st["conditions"]}
        for s in fake.statuses
    ] == [{"Recorded"}]


def test_an_unreachable_registry_is_tried_again_until_it_answers(
    registry: pods.Settings, tmp_path: Path
) -> None:
    down = pods.Settings(
        registry_url="http://127.0.0.1:9", registry_token_file=registry.registry_token_file
    )
    fake = finished(down)
    assert reconcile(fake, down).requeue_after == sweep_register.RETRY_SECONDS
    waiting = conditions(fake)["ModelRegistered"]
    assert (waiting["status"], waiting["reason"]) == ("Unknown", "Waiting")
    assert status(fake)["phase"] == "Succeeded" and "model" not in status(fake)
    assert reconcile(fake, registry, at=610).requeue_after is None
    assert status(fake)["model"]["trial"] == "hd-t1"
    assert conditions(fake)["ModelRegistered"]["status"] == "True"


def test_without_a_registry_service_the_sweep_says_so_once(registry: pods.Settings) -> None:
    fake = finished(pods.Settings())
    reconcile(fake, pods.Settings())
    said = conditions(fake)["ModelRegistered"]
    assert (said["status"], said["reason"]) == ("False", "NoRegistry")
    assert "TORCHYARD_REGISTRY_URL" in said["message"]
    fake.reset_writes()
    reconcile(fake, pods.Settings(), at=700)
    assert fake.applied == [] and fake.statuses == [] and fake.events == []


def test_a_best_trial_that_was_stopped_gives_way_to_the_best_that_completed(
    registry: pods.Settings,
) -> None:
    fake = finished(registry, stop_best=True)
    reconcile(fake, registry)
    assert status(fake)["best"]["name"] == "hd-t1"  # the best any trial reported
    assert status(fake)["model"]["trial"] == "hd-t0"  # the best with its outputs


def record(index: int, state: trials.TrialState, best: float | None) -> trials.TrialRecord:
    return trials.TrialRecord(index, (), state=state, best=best)


@pytest.mark.parametrize(
    ("goal", "records", "chosen"),
    [
        (Goal.MAXIMIZE, [(0, "Completed", 0.5), (1, "Completed", 0.9)], 1),
        (Goal.MINIMIZE, [(0, "Completed", 0.5), (1, "Completed", 0.9)], 0),
        (Goal.MAXIMIZE, [(0, "Completed", 0.5), (1, "Stopped", 0.9)], 0),
        (Goal.MAXIMIZE, [(0, "Failed", 0.5), (1, "Canceled", 0.9)], None),
        (Goal.MAXIMIZE, [(0, "Completed", None), (1, "Running", 0.9)], None),
        (Goal.MAXIMIZE, [(0, "Completed", 0.9), (1, "Completed", 0.9)], 0),
    ],
)
def test_the_candidate_is_the_best_trial_that_completed(
    goal: Goal, records: list[tuple[int, str, float | None]], chosen: int | None
) -> None:
    book = trials.Book(
        goal, trials=tuple(record(i, trials.TrialState(s), v) for i, s, v in records)
    )
    found = sweep_register.candidate(book)
    assert (found.index if found is not None else None) == chosen


def test_a_stop_decision_is_not_a_completion() -> None:
    book = trials.fold_all(
        trials.Book(Goal.MAXIMIZE),
        [
            trials.Created(0, {}),
            trials.Started(0),
            trials.Reported(0, 1, 0.9, 1.0),
            trials.Decided(Decision(0, Action.STOP, "slack")),
        ],
    )
    assert sweep_register.candidate(book) is None
