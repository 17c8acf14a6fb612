"""What a tracking server answers is outside input: whatever it sends (an HTTP error with a
huge body, no JSON, JSON that is not an object, a closed connection), the client raises
one ``TrackingError`` with a short message, and sends credentials only as a header."""

from __future__ import annotations

import base64
import http.server
import threading
from collections.abc import Iterator

import pytest

from torchyard.controller.mlflow_rest import QUOTED_BYTES, Client, TrackingError, field

# path -> (status, body) the stand-in server answers
ANSWERS: dict[str, tuple[int, bytes]] = {
    "/api/2.0/mlflow/huge-error": (
        500,
        b'{"error_code": "INTERNAL_ERROR", "message": "' + b"x" * 100_000 + b'"}',
    ),
    "/api/2.0/mlflow/not-json": (200, b"<html>a login page</html>"),
    "/api/2.0/mlflow/a-list": (200, b"[1, 2, 3]"),
    "/api/2.0/mlflow/forbidden": (403, b""),
    "/api/2.0/mlflow/binary-error": (400, bytes(range(256))),
}
SEEN: list[dict[str, str]] = []


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        SEEN.append(dict(self.headers))
        if self.path.endswith("/hang-up"):
            self.connection.close()
            return
        status, body = ANSWERS[self.path]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("huge-error", "HTTP 500"),
        ("not-json", "no JSON"),
        ("forbidden", "HTTP 403"),
        ("binary-error", "HTTP 400"),
        ("hang-up", "cannot be reached"),
    ],
)
def test_any_bad_answer_is_one_short_tracking_error(server: str, path: str, says: str) -> None:
    with pytest.raises(TrackingError) as caught:
        Client(server, env={}).call("POST", path, {})
    assert says in str(caught.value)
    assert len(str(caught.value)) < QUOTED_BYTES + 200


def test_an_answer_that_is_not_an_object_is_empty(server: str) -> None:
    assert Client(server, env={}).call("POST", "a-list", {}) == {}


def test_the_error_code_is_read_from_a_long_body(server: str) -> None:
    with pytest.raises(TrackingError) as caught:
        Client(server, env={}).call("POST", "huge-error", {})
    assert caught.value.error_code == "INTERNAL_ERROR" and caught.value.code == 500


@pytest.mark.parametrize(
    ("env", "header"),
    [
        ({"MLFLOW_TRACKING_TOKEN": "t0k"}, "Bearer t0k"),
        (
            {"MLFLOW_TRACKING_USERNAME": "ann", "MLFLOW_TRACKING_PASSWORD": "pw"},
            "Basic " + base64.b64encode(b"ann:pw").decode(),
        ),
        ({}, None),
    ],
)
def test_credentials_go_as_the_authorization_header_and_never_into_errors(
    server: str, env: dict[str, str], header: str | None
) -> None:
    SEEN.clear()
    with pytest.raises(TrackingError) as caught:
        Client(server, env=env).call("POST", "forbidden", {})
    assert SEEN[-1].get("Authorization") == header
    assert not any(secret in str(caught.value) for secret in env.values())


def test_a_url_that_is_no_url_is_a_tracking_error() -> None:
    with pytest.raises(TrackingError, match="cannot be reached"):
        Client("not a url", env={}).call("POST", "runs/create", {})


@pytest.mark.parametrize(
    "answer",
    [{}, {"run": None}, {"run": {"info": []}}, {"run": {"info": {"run_id": ""}}}, [1], "x"],
)
def test_an_answer_without_the_field_is_a_tracking_error(answer: object) -> None:
    with pytest.raises(TrackingError, match=r"answered without run\.info\.run_id"):
        field(answer, "run", "info", "run_id")
    assert field({"run": {"info": {"run_id": "abc"}}}, "run", "info", "run_id") == "abc"
