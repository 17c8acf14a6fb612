"""The serving Pod's HTTP face, a Starlette application: the guide's ``POST /score``, the
Open Inference Protocol's V1 and V2 routes (``protocols``), health, and metrics.

Every scoring request passes :func:`guarded`: while ``init()`` has not returned, 503; a
caller without a token that may get the endpoint, 401/403 (``auth``; the health routes and
``/metrics`` are open to the kubelet and Prometheus); a body over the limit, 413 (before it
is read, when ``Content-Length`` says so); a body that is not JSON, 400 (a V1/V2 body as
it is read; a ``/score`` body when ``run()``, which parses it itself, cannot decode it);
``run()`` past the request's time, 504 (``scoring.Scorer``); ``run()`` raising, 500 with
the exception's class and message (its traceback on the Pod's log). Each answer counts in
``torchyard_serving_requests_total`` by route and code, with its time in
``torchyard_serving_request_seconds``. While the Pod drains (``server``: SIGTERM, before
it stops), every answer says ``Connection: close``, so that clients reconnect through the
Service to a Pod that stays.

Called by ``serving.server``; tested in-process in tests/unit/serving/test_app.py.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from torchyard import metrics
from torchyard.serving import contract, protocols
from torchyard.serving.auth import ALLOWED, Access, token_of
from torchyard.serving.scoring import RunTimeout, Scorer, encode, script_traceback

JSON = "application/json"
logger = logging.getLogger("torchyard.serving")


class Refused(Exception):
    """A request answered with ``status`` and ``message`` before or instead of run()."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class State:
    """What the routes read: the model, the limits, and the scorer once init() returned."""

    model: str
    version: str
    max_body_bytes: int
    timeout: float
    access: Access | None = None  # None: a public endpoint
    scorer: Scorer | None = None
    draining: bool = False
    registry: metrics.Registry = field(default_factory=metrics.Registry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = r.counter(
            "torchyard_serving_requests_total",
            "Requests by route and status code.",
            ["route", "code"],
        )
        self.seconds = r.histogram(
            "torchyard_serving_request_seconds", "Time to answer a request.", ["route"]
        )
        self.errors = r.counter(
            "torchyard_serving_run_errors_total", "run() raised or timed out.", ["route", "error"]
        )
        self.stuck = r.gauge(
            "torchyard_serving_stuck_runs", "Threads still in a run() whose request timed out."
        )
        self.ready_gauge = r.gauge("torchyard_serving_ready", "1 once init() returned.")

    @property
    def ready(self) -> bool:
        return self.scorer is not None and self.scorer.alive and not self.draining


async def _body(request: Request, limit: int) -> bytes:
    """The request's body, 413 beyond ``limit`` bytes (said or read)."""
    said = request.headers.get("content-length", "")
    if said.isdigit() and int(said) > limit:
        raise Refused(
            413,
            f"the request body ({said} bytes) is over this endpoint's limit of "
            f"{limit} bytes (spec.limits.maxBodyBytes)",
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Refused(413, f"the request body is over this endpoint's limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as err:  # (UnicodeDecodeError too)
        raise Refused(400, f"the request body is not JSON: {err}") from None


Handler = Callable[[Request, State, bytes], Awaitable[Response]]


def guarded(route: str, state: State, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` behind the checks of the module docstring, timed and counted."""

    async def endpoint(request: Request) -> Response:
        started = time.perf_counter()
        body = b""
        try:
            if state.scorer is None:
                raise Refused(503, "the model is loading: init() has not returned yet")
            if state.access is not None:
                code, why = await state.access.decide(token_of(request.headers))
                if code != ALLOWED:
                    raise Refused(code, why)
            body = await _body(request, state.max_body_bytes)
            response = await handler(request, state, body)
        except Refused as err:
            response = JSONResponse({"error": err.message}, err.status)
        except RunTimeout as err:
            state.errors.inc(route=route, error="Timeout")
            state.stuck.set(state.scorer.stuck if state.scorer else 0)
            response = JSONResponse({"error": str(err)}, 504)
        except Exception as err:  # run() raised: the caller gets its class and message
            response = _raised(route, state, err, body)
        if state.draining:
            response.headers["connection"] = "close"
        state.requests.inc(route=route, code=str(response.status_code))
        state.seconds.observe(time.perf_counter() - started, route=route)
        return response

    return endpoint


def _raised(route: str, state: State, err: Exception, body: bytes) -> Response:
    """run() raised: 400 when it could not decode the request's own body as JSON (the
    caller's mistake: ``JSONDecodeError.doc`` is the body), else 500 with the traceback
    on the Pod's log."""
    name = type(err).__name__
    state.errors.inc(route=route, error=name)
    if isinstance(err, json.JSONDecodeError) and err.doc == body.decode("utf-8", "replace"):
        return JSONResponse({"error": f"the request body is not JSON: {err}", "class": name}, 400)
    logger.error("run() raised:\n%s", script_traceback(err))
    return JSONResponse({"error": f"{name}: {err}", "class": name}, 500)


def _model(request: Request, state: State) -> None:
    asked = request.path_params["model"]
    if asked != state.model:
        raise Refused(404, f"no model {asked!r} here: this endpoint serves {state.model!r}")


def binary(content_type: str) -> bool:
    """A body run() gets as bytes (an image, audio, octet-stream); any other is JSON text."""
    kind = content_type.split(";")[0].strip().lower()
    return kind == "application/octet-stream" or kind.split("/")[0] in ("image", "audio", "video")


async def score(request: Request, state: State, body: bytes) -> Response:
    """The guide's route: run() gets the body as text (400 when it is not UTF-8), or as
    bytes for a binary content type. The body is parsed by run() alone (parsing it here
    too would cost as much again, a JSON array of an image's pixels takes milliseconds):
    the JSON run() cannot decode is answered 400 by :func:`_raised`."""
    assert state.scorer is not None
    raw: Any = body
    if not binary(request.headers.get("content-type", "")):
        try:
            raw = body.decode()
        except UnicodeDecodeError as err:
            raise Refused(400, f"the request body is not UTF-8 text: {err}") from None
    result = await state.scorer.run(raw, state.timeout)
    return Response(encode(result), media_type=JSON)


async def v1_predict(request: Request, state: State, body: bytes) -> Response:
    assert state.scorer is not None
    _model(request, state)
    try:
        raw = protocols.v1_raw(_json(body))
    except protocols.ProtocolError as err:
        raise Refused(400, str(err)) from None
    result = json.loads(encode(await state.scorer.run(raw, state.timeout)))
    return JSONResponse(protocols.v1_answer(result))


async def v2_infer(request: Request, state: State, body: bytes) -> Response:
    assert state.scorer is not None
    _model(request, state)
    parsed = _json(body)
    try:
        raw = protocols.v2_raw(parsed)
    except protocols.ProtocolError as err:
        raise Refused(400, str(err)) from None
    result = json.loads(encode(await state.scorer.run(raw, state.timeout)))
    answer = protocols.v2_answer(result, state.model, state.version, parsed.get("id"))
    return JSONResponse(answer)


def _health(state: State, kind: str) -> Callable[[Request], Awaitable[Response]]:
    async def health(request: Request) -> Response:
        if "model" in request.path_params:
            try:
                _model(request, state)
            except Refused as err:
                return JSONResponse({"error": err.message}, err.status)
        scorer = state.scorer
        if kind == "live":
            ok, why = scorer is None or scorer.alive, "every thread is stuck in run()"
        else:
            ok, why = state.ready, "not ready: init() has not returned, or the Pod drains"
        state.ready_gauge.set(1 if state.ready else 0)
        if scorer is not None:
            state.stuck.set(scorer.stuck)
        body: dict[str, Any] = {"live": True} if kind == "live" else {"ready": state.ready}
        return JSONResponse(body if ok else {"error": why, **body}, 200 if ok else 503)

    return health


def _metadata(state: State, version: bool) -> Callable[[Request], Awaitable[Response]]:
    async def metadata(request: Request) -> Response:
        try:
            _model(request, state)
        except Refused as err:
            return JSONResponse({"error": err.message}, err.status)
        if "version" in request.path_params and request.path_params["version"] != state.version:
            return JSONResponse({"error": f"this endpoint serves version {state.version}"}, 404)
        if not version:  # V1's model status
            return JSONResponse({"name": state.model, "ready": state.ready})
        return JSONResponse(protocols.v2_metadata(state.model, state.version))

    return metadata


def create_app(state: State, server_version: str = "") -> Starlette:
    """The application over ``state``."""

    async def server(request: Request) -> Response:
        return JSONResponse({"name": "torchyard", "version": server_version, "extensions": []})

    async def scrape(request: Request) -> Response:
        text = state.registry.render(request.headers.get("accept", ""))
        return Response(text, media_type=metrics.content_type(request.headers.get("accept", "")))

    c = contract
    routes = [
        Route(c.SCORE_PATH, guarded("score", state, score), methods=["POST"]),
        Route(c.V1_PREDICT, guarded("v1_predict", state, v1_predict), methods=["POST"]),
        Route(c.V2_INFER, guarded("v2_infer", state, v2_infer), methods=["POST"]),
        Route(c.LIVE_PATH, _health(state, "live")),
        Route(c.READY_PATH, _health(state, "ready")),
        Route(c.V2_MODEL_READY, _health(state, "ready")),
        Route(c.V1_MODEL, _metadata(state, False)),
        Route(c.V2_MODEL, _metadata(state, True)),
        Route(c.V2_MODEL_VERSION, _metadata(state, True)),
        Route(c.V2_SERVER, server),
        Route(c.METRICS_PATH, scrape),
    ]
    return Starlette(routes=routes)
