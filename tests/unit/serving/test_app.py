"""The serving Pod's routes over real HTTP on loopback (Uvicorn in a thread, the app of
torchyard.serving.app), with a scoring script of the guide's form: the hostile requests
(a body over the limit, JSON that is not JSON, a run() that hangs, no token or a refused
one), the Open Inference Protocol's routes, health, metrics and the drain's
``Connection: close``."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from torchyard.serving import app, auth, scoring

SCRIPT = """
import json, threading
release = threading.Event()
def init():
    global classes
    classes = ["chicken", "turkey"]
def run(raw_data):
    if isinstance(raw_data, bytes):
        return {"bytes": len(raw_data)}
    data = json.loads(raw_data)["data"]
    if data == "hang":
        release.wait(30)
    if data == "raise":
        raise KeyError("no such feature")
    if data == "bad-config":
        json.loads("{not: json}")
    return {"label": classes[int(sum(map(float, data)) > 0)], "n": len(data)}
"""
TOKENS = {"alice": (200, ""), "mallory": (403, "mallory may not get onlineendpoints/birds")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    def __init__(self, state: app.State, port: int, server: uvicorn.Server) -> None:
        self.state, self.port, self.server = state, port, server
        self.asked: list[str] = []

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any, dict[str, str]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            data = response.read()
            try:
                parsed: Any = json.loads(data)
            except ValueError:
                parsed = data.decode()
            return response.status, parsed, {k.lower(): v for k, v in response.getheaders()}
        finally:
            conn.close()


def serve(tmp_path: Path, *, access: bool, max_body: int = 4096) -> Iterator[Served]:
    path = tmp_path / "app_score.py"
    path.write_text(textwrap.dedent(SCRIPT))
    scorer = scoring.Scorer(scoring.load(str(path)), 2)
    scorer.init()
    asked: list[str] = []

    def ask(token: str) -> auth.Decision:
        asked.append(token)
        return TOKENS.get(token, (401, "the token is not valid for this endpoint"))

    state = app.State("birds", "2", max_body, 0.5, auth.Access(ask) if access else None)
    state.scorer = scorer
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app.create_app(state, "test"), port=port, log_level="warning", lifespan="off"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    served = Served(state, port, server)
    served.asked = asked
    try:
        yield served
    finally:
        scorer.module.release.set()
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def public(tmp_path: Path) -> Iterator[Served]:
    yield from serve(tmp_path, access=False)


@pytest.fixture
def private(tmp_path: Path) -> Iterator[Served]:
    yield from serve(tmp_path, access=True)


def body(data: Any) -> bytes:
    return json.dumps({"data": data}).encode()


def test_score_runs_the_guides_run_on_the_body(public: Served) -> None:
    status, answer, headers = public.call("POST", "/score", body([0.5, 0.25]))
    assert status == 200 and answer == {"label": "turkey", "n": 2}
    assert headers["content-type"] == "application/json"
    assert "connection" not in headers or headers["connection"] != "close"


def test_a_body_over_the_limit_is_413_said_or_streamed(public: Served) -> None:
    big = body([1.0] * 2000)
    assert len(big) > 4096
    status, answer, _ = public.call("POST", "/score", big)
    assert status == 413 and "limit of 4096 bytes" in answer["error"]
    # without Content-Length (chunked): counted as it is read
    conn = http.client.HTTPConnection("127.0.0.1", public.port, timeout=10)
    conn.request("POST", "/score", body=iter([big[:3000], big[3000:]]), encode_chunked=True)
    response = conn.getresponse()
    assert response.status == 413, response.read()
    conn.close()


@pytest.mark.parametrize(
    "payload, headers, said",
    [
        (b'{"data": [1, 2', {}, "the request body is not JSON"),
        (b"data=1", {"Content-Type": "application/x-www-form-urlencoded"}, "not JSON"),
        (b"\xff\xfe not text", {"Content-Type": "application/json"}, "not UTF-8 text"),
    ],
)
def test_a_body_that_is_not_json_is_400(
    public: Served, payload: bytes, headers: dict[str, str], said: str
) -> None:
    status, answer, _ = public.call("POST", "/score", payload, headers)
    assert status == 400 and said in answer["error"], answer


def test_json_run_cannot_decode_elsewhere_is_its_own_error(public: Served) -> None:
    """A JSONDecodeError of another document (a file the script reads) is run()'s 500."""
    status, answer, _ = public.call("POST", "/score", body("bad-config"))
    assert status == 500 and answer["class"] == "JSONDecodeError"


def test_a_binary_body_reaches_run_as_bytes(public: Served) -> None:
    status, answer, _ = public.call(
        "POST", "/score", b"\x89PNG", {"Content-Type": "application/octet-stream"}
    )
    assert status == 200 and answer == {"bytes": 4}


def test_a_hung_run_times_out_and_the_pod_stays_ready_for_others(public: Served) -> None:
    started = time.monotonic()
    status, answer, _ = public.call("POST", "/score", body("hang"))
    assert status == 504 and "longer than 0.5 s" in answer["error"]
    assert time.monotonic() - started < 5
    assert public.call("GET", "/v2/health/ready")[0] == 200
    assert public.call("GET", "/v2/health/live")[0] == 200
    assert public.call("POST", "/score", body([1.0]))[1] == {"label": "turkey", "n": 1}
    # the second and last thread stuck too: not alive, not ready (the kubelet restarts it)
    assert public.call("POST", "/score", body("hang"))[0] == 504
    assert public.call("GET", "/v2/health/live")[0] == 503
    assert public.call("GET", "/v2/health/ready")[0] == 503
    metrics = public.call("GET", "/metrics")[1]
    assert "torchyard_serving_stuck_runs 2.0" in metrics


def test_run_raising_is_500_with_its_class(public: Served) -> None:
    status, answer, _ = public.call("POST", "/score", body("raise"))
    assert status == 500
    assert answer == {"error": "KeyError: 'no such feature'", "class": "KeyError"}


def test_the_open_inference_protocol_routes(public: Served) -> None:
    status, answer, _ = public.call(
        "POST", "/v1/models/birds:predict", json.dumps({"instances": [-1.0, -2.0]}).encode()
    )
    assert status == 200 and answer == {"predictions": [{"label": "chicken", "n": 2}]}
    v2 = {
        "id": "r1",
        "inputs": [{"name": "data", "shape": [2], "datatype": "FP32", "data": [1, 2]}],
    }
    status, answer, _ = public.call("POST", "/v2/models/birds/infer", json.dumps(v2).encode())
    assert status == 200 and answer["id"] == "r1" and answer["model_version"] == "2"
    assert {o["name"]: o["data"] for o in answer["outputs"]} == {"label": ["turkey"], "n": [2]}
    assert public.call("POST", "/v2/models/other/infer", json.dumps(v2).encode())[0] == 404
    status, answer, _ = public.call("POST", "/v2/models/birds/infer", b'{"inputs": 3}')
    assert status == 400 and "V2 infer request" in answer["error"]
    assert public.call("GET", "/v1/models/birds")[1] == {"name": "birds", "ready": True}
    assert public.call("GET", "/v2/models/birds")[1]["versions"] == ["2"]
    assert public.call("GET", "/v2/models/birds/versions/3")[0] == 404
    assert public.call("GET", "/v2/models/birds/ready")[0] == 200
    assert public.call("GET", "/v2")[1]["name"] == "torchyard"


def test_a_private_endpoint_needs_a_token_that_may_call_it(private: Served) -> None:
    status, answer, _ = private.call("POST", "/score", body([1.0]))
    assert status == 401 and "token" in answer["error"]
    assert private.call("POST", "/score", body([1.0]), {"Authorization": "Bearer eve"})[0] == 401
    status, answer, _ = private.call(
        "POST", "/score", body([1.0]), {"Authorization": "Bearer mallory"}
    )
    assert status == 403 and "may not get" in answer["error"]
    for header in ({"Authorization": "Bearer alice"}, {"X-Torchyard-Token": "alice"}):
        assert private.call("POST", "/score", body([1.0]), header)[0] == 200
    assert private.asked.count("alice") == 1  # kept: asked once
    # the kubelet's probes and the scrape need none
    assert private.call("GET", "/v2/health/ready")[0] == 200
    assert private.call("GET", "/metrics")[0] == 200
    # a refused caller's body is never read: no 413 for it
    assert private.call("POST", "/score", b"x" * 10_000)[0] == 401


def test_while_draining_every_answer_closes_its_connection(public: Served) -> None:
    public.state.draining = True
    status, _, headers = public.call("POST", "/score", body([1.0]))
    assert status == 200 and headers["connection"] == "close"
    assert public.call("GET", "/v2/health/ready")[0] == 503
    assert public.call("GET", "/v2/health/live")[0] == 200


def test_before_init_returned_scoring_is_503_and_the_pod_alive(public: Served) -> None:
    public.state.scorer = None
    assert public.call("POST", "/score", body([1.0]))[0] == 503
    assert public.call("GET", "/v2/health/live")[0] == 200
    assert public.call("GET", "/v2/health/ready")[0] == 503


def test_requests_are_counted_by_route_and_code(public: Served) -> None:
    public.call("POST", "/score", body([1.0]))
    public.call("POST", "/score", b"{")
    text = public.call("GET", "/metrics")[1]
    assert 'torchyard_serving_requests_total{code="200",route="score"} 1.0' in text
    assert 'torchyard_serving_requests_total{code="400",route="score"} 1.0' in text
    assert 'torchyard_serving_request_seconds_count{route="score"} 2.0' in text
    assert asyncio.iscoroutinefunction(app.score)
