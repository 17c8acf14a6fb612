"""The sweep page in-process over a source of test data: what blocks the trials (the
Sweep's ``TrialsWaiting`` condition) and how the sweep finished show on it, escaped; the
best trial is the one rule's (``sdk.sweeps.best``), named with its state when it failed."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from tests.unit.web.fakes import FakeSource
from tests.unit.web.test_app import call

NO_ENV = "spec.environment: Environment <nope> does not exist in namespace team-a"


def sweep(status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "sw", "namespace": "team-a"},
        "spec": {"objective": {"metric": "acc", "goal": "maximize"}},
        "status": status,
    }


def test_the_page_says_why_the_trials_cannot_start() -> None:
    waiting = {
        "type": "TrialsWaiting",
        "status": "True",
        "reason": "EnvironmentNotFound",
        "message": f"2 trial(s) cannot start yet; sw-t0, sw-t1: EnvironmentNotFound: {NO_ENV}",
    }
    src = FakeSource(objects={"team-a": [sweep({"phase": "Pending", "conditions": [waiting]})]})

    async def body(client: TestClient[Any, Any]) -> None:
        text = await (await client.get("/ns/team-a/sweeps/sw")).text()
        assert "<td>TrialsWaiting</td><td>True</td><td>EnvironmentNotFound</td>" in text, text
        assert "Environment &lt;nope&gt; does not exist" in text and "<nope>" not in text

    call(src, body)


def test_a_failed_best_is_shown_as_failed() -> None:
    rows = [
        {"name": "sw-t0", "index": 0, "state": "Completed", "metric": 0.9},
        {"name": "sw-t1", "index": 1, "state": "Failed", "metric": 0.95},
    ]
    src = FakeSource(objects={"team-a": [sweep({"phase": "Succeeded", "summary": rows})]})

    async def body(client: TestClient[Any, Any]) -> None:
        text = await (await client.get("/ns/team-a/sweeps/sw")).text()
        assert "best: sw-t1 (Failed) (acc 0.95, maximize)" in text, text

    call(src, body)
