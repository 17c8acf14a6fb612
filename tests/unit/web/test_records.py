"""The web view over run records (a real ``FolderRecords`` behind a source of test data):
a run, sweep or Environment that is gone still shows in its list, marked and filtered as
the live ones, and its page shows what its record kept; a uid in the URL is checked
before anything is read, and another namespace's records stay out of reach."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from tests.unit.web.fakes import FAILURE, SCRIPT, FakeSource, pod, run
from torchyard.records import (
    FolderRecords,
    environment_record,
    sweep_record,
    trainingrun_record,
)
from torchyard.web import app

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=timezone.utc)
GONE_UID = "0b0b0b0b-0000-4000-8000-000000000001"
B_UID = "0b0b0b0b-0000-4000-8000-00000000000b"
SECRET = "secret-record-of-team-b"


def _with_uid(obj: dict[str, Any], uid: str) -> dict[str, Any]:
    obj["metadata"]["uid"] = uid
    return obj


def _write_records(root: Path) -> FolderRecords:
    store = FolderRecords(root)
    failure = dict(FAILURE)
    gone = _with_uid(
        run(
            "gone",
            phase="Failed",
            labels={"torchyard.dev/experiment": "e1"},
            created="2026-11-27T09:00:00Z",
            status={"failure": failure, "completionTime": "2026-11-27T09:30:00Z"},
        ),
        GONE_UID,
    )
    archive = root / "team-a" / "archive-gone"
    (archive / "logs" / "node-0").mkdir(parents=True)
    reports = [json.dumps({"step": i, "rank": 0, "loss": 1.0 / (i + 1)}) for i in range(5000)]
    (archive / "logs" / "node-0" / "metrics.jsonl").write_text("\n".join(reports) + "\n")
    tails = {0: ["[rank 0] step 10"], 1: [f"[rank 3] {SCRIPT}"]}
    pods = [pod("gone", 0), pod("gone", 1, state="Failed")]
    store.write(trainingrun_record(gone, pods, [], tails, NOW, deleted=True), archive)
    live = _with_uid(run("alive", phase="Succeeded"), "0b0b0b0b-0000-4000-8000-000000000002")
    store.write(trainingrun_record(live, [], [], {}, NOW))
    secret = _with_uid(run(SECRET, ns="team-b", phase="Failed"), B_UID)
    store.write(trainingrun_record(secret, [], [], {}, NOW, deleted=True))
    sweep = {
        "metadata": {"name": "old-sweep", "namespace": "team-a", "uid": GONE_UID},
        "spec": {"objective": {"metric": "loss", "goal": "minimize"}},
        "status": {
            "phase": "Succeeded",
            "summary": [{"name": "old-sweep-t0", "index": 0, "state": "Stopped", "metric": 0.5}],
        },
    }
    store.write(sweep_record(sweep, [], NOW, deleted=True))
    env = {
        "metadata": {"name": "old-env", "namespace": "team-a", "uid": GONE_UID},
        "spec": {"base": "python:3.11"},
        "status": {"phase": "Ready", "image": "registry/old-env@sha256:abc"},
    }
    store.write(environment_record(env, [], ["Step 1/3 : FROM python", f"{SCRIPT}"], NOW))
    return store


def source_with_records(root: Path) -> FakeSource:
    alive = _with_uid(run("alive", phase="Succeeded"), "0b0b0b0b-0000-4000-8000-000000000002")
    return FakeSource(
        objects={"team-a": [alive, run("running")], "team-b": []},
        forbidden={"team-b"},
        records=_write_records(root),
    )


def call(src: FakeSource, body: Callable[[TestClient[Any, Any]], Awaitable[None]]) -> None:
    async def main() -> None:
        async with TestClient(TestServer(app.make_app(src, namespace="team-a"))) as client:
            await body(client)

    asyncio.run(main())


async def _text(client: TestClient[Any, Any], url: str, status: int = 200) -> str:
    # (as sent: the client normalizes neither ".." nor its percent-encoding away)
    response = await client.get(URL(url, encoded=True), allow_redirects=False)
    text = await response.text()
    assert response.status == status, text
    assert "<script>alert" not in text and SECRET not in text
    return text


def test_a_gone_run_is_listed_marked_and_filtered_as_the_live_ones(tmp_path: Path) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        every = await _text(client, "/ns/team-a/runs")
        assert "3 of 3 run(s)" in every
        assert f'href="/ns/team-a/runs/gone/records/{GONE_UID}"' in every
        assert "deleted</span>" in every and "recorded</span>" in every
        failed = await _text(client, "/ns/team-a/runs?phase=Failed")
        assert "1 of 1 run(s)" in failed and "gone" in failed
        by_experiment = await _text(client, "/ns/team-a/runs?experiment=e1")
        assert "1 of 1 run(s)" in by_experiment
        assert "no runs match" in await _text(client, "/ns/team-a/runs?experiment=other")
        # an experiment the registry's query cannot ask (not a DNS label): filtered here
        assert "no runs match" in await _text(client, "/ns/team-a/runs?experiment=E_1")
        listed = await (await client.get("/api/ns/team-a/runs?phase=Failed")).json()
        assert [(r["name"], r["deleted"], r["uid"]) for r in listed["items"]] == [
            ("gone", True, GONE_UID)
        ]

    call(source_with_records(tmp_path), body)


@pytest.mark.parametrize(
    "url", ["/ns/team-a/runs/gone", f"/ns/team-a/runs/gone/records/{GONE_UID}"]
)
def test_a_gone_runs_page_shows_what_its_record_kept(tmp_path: Path, url: str) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        page = await _text(client, url)
        for kept in ("UserError", "fix the script", "ValueError: &lt;script&gt;", "python"):
            assert kept in page
        assert "[rank 3] &lt;script&gt;" in page and "[rank 0] step 10" in page  # log tails
        assert "gone-node-1" in page and "kwok-1" in page  # the node table
        chart = f"/api/ns/team-a/runs/gone/records/{GONE_UID}/metrics?name=loss"
        assert chart in page
        shown = await (await client.get(chart + "&points=100")).json()
        assert shown["total"] == 5000 and len(shown["points"]) == 100
        assert shown["points"][0] == [0.0, 1.0]

    call(source_with_records(tmp_path), body)


def test_a_finished_run_whose_pods_are_gone_shows_its_record(tmp_path: Path) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        page = await _text(client, "/ns/team-a/runs/alive")
        assert "Shown from the record kept when it ended" in page
        assert "0b0b0b0b-0000-4000-8000-000000000002" in page
        live = await _text(client, "/ns/team-a/runs/running")  # a live run's own page
        assert "Shown from the record" not in live

    call(source_with_records(tmp_path), body)


def test_gone_sweeps_and_environments_show_from_their_records(tmp_path: Path) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        sweeps = await _text(client, "/ns/team-a/sweeps")
        assert f"/ns/team-a/sweeps/old-sweep/records/{GONE_UID}" in sweeps
        assert "deleted</span>" in sweeps
        sweep = await _text(client, "/ns/team-a/sweeps/old-sweep")
        assert "old-sweep-t0" in sweep and "Stopped" in sweep
        envs = await _text(client, "/ns/team-a/environments")
        assert "/ns/team-a/environments/old-env/records/" in envs
        env = await _text(client, f"/ns/team-a/environments/old-env/records/{GONE_UID}")
        assert "Step 1/3 : FROM python" in env and "registry/old-env@sha256:abc" in env

    call(source_with_records(tmp_path), body)


HOSTILE_UIDS = [
    ("..%2F..%2Fteam-b", 400, "not a uid"),
    ("%2e%2e", 400, "not a uid"),
    ("..", 404, ""),  # (a literal .. is resolved before routing: another path, not found)
    ("%2E%2E%2F%2E%2E%2Fetc%2Fpasswd", 400, "not a uid"),
    ("0B0B0B0B-0000-4000-8000-000000000001", 400, "not a uid"),
    (GONE_UID + "0" * 5000, 400, "not a uid"),
    ("%00", 400, "not a uid"),
    (B_UID, 404, "no record"),  # team-b's uid under team-a's path: not found
]


@pytest.mark.parametrize(("uid", "status", "said"), HOSTILE_UIDS)
@pytest.mark.parametrize(
    "prefix", ["/ns/team-a/runs/gone/records/", "/api/ns/team-a/runs/gone/records/"]
)
def test_a_hostile_uid_is_refused_before_anything_is_read(
    tmp_path: Path, prefix: str, uid: str, status: int, said: str
) -> None:
    url = prefix + uid + ("/metrics?name=loss" if prefix.startswith("/api/") else "")

    async def body(client: TestClient[Any, Any]) -> None:
        text = await _text(client, url, status)
        assert said.lower() in text.lower()

    call(source_with_records(tmp_path), body)


@pytest.mark.parametrize(
    "url",
    [
        f"/ns/team-b/runs/{SECRET}",
        f"/ns/team-b/runs/{SECRET}/records/{B_UID}",
        f"/api/ns/team-b/runs/{SECRET}/records/{B_UID}/metrics?name=loss",
        "/ns/team-b/runs",
        "/api/ns/team-b/runs",
        "/ns/team-b/sweeps",
        "/ns/team-b/environments",
    ],
)
def test_another_namespaces_records_stay_out_of_reach(tmp_path: Path, url: str) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        response = await client.get(url, allow_redirects=False)
        assert response.status == 403
        assert SECRET not in (await response.text()).replace(f"/{SECRET}", "")

    call(source_with_records(tmp_path), body)


def test_without_a_registry_the_lists_say_so_and_still_answer(tmp_path: Path) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        listed = await _text(client, "/ns/team-a/runs")
        assert "records of what ended: no registry service configured" in listed
        assert "2 of 2 run(s)" in listed
        gone = await _text(client, "/ns/team-a/runs/gone", 404)
        assert "no registry service configured" in gone

    src = source_with_records(tmp_path)
    src.records = None
    call(src, body)
