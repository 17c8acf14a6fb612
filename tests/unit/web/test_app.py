"""The web view in-process over a source of test data: every page answers, what came from
the cluster is escaped wherever it shows, and hostile requests get a clear refusal (4xx
and a message) that shows nothing of another namespace."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.unit.web.fakes import FAILURE, SCRIPT, FakeSource, endpoint, pod, run
from torchyard.web import app, source

SECRET = "secret-run-of-team-b"


def fixture_source() -> FakeSource:
    failed = run(
        "broken",
        phase="Failed",
        labels={"torchyard.dev/experiment": "e1", "note": "x"},
        status={"failure": dict(FAILURE)},
    )
    queued = run(
        "waits",
        phase="Queued",
        status={
            "queue": {"pool": "a100", "position": 2},
            "conditions": [
                {
                    "type": "Admitted",
                    "status": "False",
                    "reason": "Queued",
                    "message": "needs 4 x 8 GPU; 1 fit now",
                }
            ],
        },
    )
    sweep = {
        "metadata": {"name": "sw", "namespace": "team-a"},
        "spec": {"objective": {"metric": "loss", "goal": "minimize"}},
        "status": {
            "phase": "Running",
            "summary": [
                {
                    "name": "sw-t0",
                    "index": 0,
                    "state": "Stopped",
                    "metric": 0.9,
                    "reason": "bandit",
                },
                {"name": "sw-t1", "index": 1, "state": "Running", "metric": 0.2},
            ],
        },
    }
    return FakeSource(
        objects={
            "team-a": [failed, queued, run("s1"), run("ab"), sweep],
            "team-b": [run(SECRET, ns="team-b")],
        },
        pods_of={"broken": [pod("broken", 0), pod("broken", 1, state="Failed")]},
        logs={"broken-node-1": ["[rank 2] fine", f"[rank 3] {SCRIPT}"]},
        archives={
            "broken": source.Archive(
                metrics={"loss": [(float(i), 1.0 / (i + 1)) for i in range(10_000)]},
                stacks={"node-1/stacks/rank-3.pid-9.txt": f"File train.py line 9 {SCRIPT}"},
            )
        },
        forbidden={"team-b"},
        endpoints_of={"team-a": [endpoint("birds")]},
    )


def call(
    src: FakeSource,
    body: Callable[[TestClient[Any, Any]], Awaitable[None]],
    hosts: tuple[str, ...] = (),
) -> None:
    async def main() -> None:
        async with TestClient(
            TestServer(app.make_app(src, namespace="team-a", hosts=hosts))
        ) as client:
            await body(client)

    asyncio.run(main())


PAGES = [
    "/ns/team-a/runs",
    "/ns/team-a/runs?phase=Failed&experiment=e1&label=note%3Dx&since=7d&size=1",
    "/ns/team-a/runs/broken",
    "/ns/team-a/runs/waits",
    "/ns/team-a/sweeps",
    "/ns/team-a/sweeps/sw",
    "/ns/team-a/models",
    "/ns/team-a/environments",
    "/ns/team-a/endpoints",
    "/ns/team-a/endpoints/birds",
    "/ns/team-a/queue",
]


@pytest.mark.parametrize("page", PAGES)
def test_every_page_answers_and_escapes_what_came_from_the_cluster(page: str) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        response = await client.get(page)
        text = await response.text()
        assert response.status == 200, text
        assert "<script>alert" not in text
        assert re.findall(r"<script[^>]*>", text) == [
            m for m in re.findall(r"<script[^>]*>", text) if 'src="/static/' in m
        ]
        assert response.headers["Content-Security-Policy"].startswith("default-src 'none'")

    call(fixture_source(), body)


def test_the_run_page_shows_failure_stacks_queue_and_nodes() -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        text = await (await client.get("/ns/team-a/runs/broken")).text()
        for said in (
            "UserError",
            "fix the script",
            "ValueError: &lt;script&gt;",
            "rank-3.pid-9.txt",
            "broken-node-1",
            "Failed (exit",
            "data-metric-url",
            '<pre class="traceback" aria-label="traceback">',  # (styled: its class is class)
        ):
            assert said in text
        waits = await (await client.get("/ns/team-a/runs/waits")).text()
        assert "needs 4 x 8 GPU; 1 fit now" in waits and "2 in pool a100" in waits
        queue = await (await client.get("/ns/team-a/queue")).text()
        assert "needs 4 x 8 GPU; 1 fit now" in queue

    call(fixture_source(), body)


def test_the_endpoint_pages_show_versions_and_the_failure() -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        listed = await (await client.get("/ns/team-a/endpoints")).text()
        assert (
            "birds v3" in listed and "1/2" in listed and "http://birds.team-a.svc/score" in listed
        )
        page = await (await client.get("/ns/team-a/endpoints/birds")).text()
        for said in (
            "PythonException",
            "KeyError: &lt;script&gt;",
            "fix the scoring script",
            "birds-canary",
            "50%",
            "InitFailed",
        ):
            assert said in page, said
        missing = await client.get("/ns/team-a/endpoints/nope")
        assert missing.status == 404

    call(fixture_source(), body)


def test_a_run_and_a_sweep_say_the_command_that_serves_their_tensorboard() -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        run = await (await client.get("/ns/team-a/runs/broken")).text()
        assert "<code>torchyard tensorboard broken -n team-a</code>" in run
        sweep = await (await client.get("/ns/team-a/sweeps/sw")).text()
        assert "<code>torchyard tensorboard --sweep sw -n team-a</code>" in sweep

    call(fixture_source(), body)


def test_a_log_tail_is_json_by_rank_and_a_metric_comes_downsampled() -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        tail = await (await client.get("/api/ns/team-a/runs/broken/log?node=1&rank=3")).json()
        assert tail["lines"] == [f"[rank 3] {SCRIPT}"]  # JSON; the page sets it as text
        missing = await (await client.get("/api/ns/team-a/runs/broken/log?node=7")).json()
        assert missing == {"lines": [], "note": "node 7 has no Pod"}
        got = await (
            await client.get("/api/ns/team-a/runs/broken/metrics?name=loss&points=500")
        ).json()
        assert got["total"] == 10_000 and len(got["points"]) == 500

    call(fixture_source(), body)


HOSTILE = [
    ("/ns/team-a/runs/..%2F..%2Fkube-system", 400, "DNS-1123"),
    ("/ns/team-a/runs/%2e%2e", 404, "no page at this address"),  # (the client makes it /..)
    ("/ns/..%2Fteam-b/runs", 400, "DNS-1123"),
    ("/ns/team-a/runs/a%00b", 400, "DNS-1123"),
    ("/ns/team-a/runs/%3Cscript%3E", 400, "DNS-1123"),
    ("/ns/team-b/runs", 403, "forbidden"),
    (f"/ns/team-b/runs/{SECRET}", 403, "forbidden"),
    (f"/api/ns/team-b/runs/{SECRET}/log?node=0", 403, "forbidden"),
    ("/ns/team-a/runs?size=100000000", 400, "size must be"),
    ("/ns/team-a/runs?phase=%3Cscript%3E", 400, "phase must be"),
    ("/ns/team-a/runs?namespace=team-b", 400, "unknown parameter"),
    ("/ns/team-a/runs?page=1&page=2", 400, "more than once"),
    ("/ns/team-a/runs/broken?x=1", 400, "unknown parameter"),
    ("/api/ns/team-a/runs/broken/log?lines=99999999", 400, "lines must be"),
    ("/api/ns/team-a/runs/broken/log?node=-1", 400, "node must be"),
    ("/api/ns/team-a/runs/broken/metrics?name=..%2Fx", 400, "not a metric name"),
    ("/api/ns/team-a/runs/broken/metrics?name=acc", 404, "no metric"),
    ("/ns/team-a/runs/nope", 404, "not found"),
    ("/static/..%2F..%2Fapp.py", 404, "no asset"),
    ("/static/%2e%2e%2fsource.py", 404, "no asset"),
    ("/static/app.css%00.py", 404, "no asset"),
    ("/etc/passwd", 404, "no page at this address"),
    ("/ns?namespace=..%2Fx", 400, "DNS-1123"),
]


@pytest.mark.parametrize(("url", "status", "said"), HOSTILE)
def test_hostile_requests_get_a_clear_refusal_and_nothing_leaks(
    url: str, status: int, said: str
) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        response = await client.get(url, allow_redirects=False)
        text = await response.text()
        assert response.status == status, text
        assert said.lower() in text.lower()
        assert SECRET not in text and "<script>alert" not in text
        assert "Traceback" not in text

    call(fixture_source(), body)


def test_changes_need_the_pages_token_and_a_post() -> None:
    src = fixture_source()

    async def body(client: TestClient[Any, Any]) -> None:
        page = await (await client.get("/ns/team-a/runs/s1")).text()
        token = re.search(r'name="torchyard-token" content="([^"]+)"', page)[1]  # type: ignore[index]
        url = "/ns/team-a/runs/s1/suspend"
        assert (await client.get(url)).status == 405
        refused = await client.post(url, data={"token": "guess"}, allow_redirects=False)
        assert refused.status == 403 and "page token" in await refused.text()
        assert (await client.post(url, data={}, allow_redirects=False)).status == 403
        assert src.acted == []
        done = await client.post(url, data={"token": token}, allow_redirects=False)
        assert done.status == 303 and done.headers["Location"] == "/ns/team-a/runs/s1"
        assert src.acted == [("team-a", "runs", "s1", "suspend")]
        other = await client.post(f"/ns/team-b/runs/{SECRET}/suspend", data={"token": token})
        assert other.status == 403 and "forbidden" in await other.text()  # the API's answer
        bad = await client.post("/ns/team-a/runs/s1/delete", data={"token": token})
        assert bad.status == 404 and "no action" in await bad.text()

    call(src, body)


def test_another_host_is_refused_and_the_probe_answers_any() -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        for host in ("127.0.0.1:8080", "LOCALHOST:1234", "ui.example.test", "[::1]:9"):
            ok = await client.get("/ns/team-a/runs", headers={"Host": host})
            assert ok.status == 200, host
        for host in ("evil.example:8080", "10.244.0.7:8080", "ui.example.test.evil", "a:b"):
            rebound = await client.get("/ns/team-a/runs", headers={"Host": host})
            assert rebound.status == 421, host
            assert "answers for 127.0.0.1, ::1, localhost, ui.example.test only" in (
                await rebound.text()
            )
        probe = await client.get("/healthz", headers={"Host": "10.244.0.7:8080"})
        assert probe.status == 200 and await probe.text() == "ok"
        assert probe.headers["X-Frame-Options"] == "DENY"

    call(fixture_source(), body, hosts=("127.0.0.1", "localhost", "::1", "ui.example.test"))


def test_every_asset_is_shipped_in_the_package() -> None:
    for name in app.STATIC_TYPES:
        assert "cdn" not in app.asset(name).decode(errors="replace").lower() or name.startswith(
            "uplot"
        )
