"""A small client of MLflow's REST API (``/api/2.0/mlflow/...``) on the standard library:
the operator image needs no ``mlflow`` package.

Its calls raise :class:`TrackingError` (what was called, and the HTTP status or the
connection's error) and nothing else; ``controller.tracking`` turns that into the run's
``TrackingReady=False`` condition. Credentials come from the operator's environment
(``MLFLOW_TRACKING_TOKEN``, or ``MLFLOW_TRACKING_USERNAME`` and ``..._PASSWORD``, which
the chart takes from the credentials Secret).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

TIMEOUT_SECONDS = 10.0
# The most of an error body an error message quotes.
QUOTED_BYTES = 300
# The most of an error body read (for its error_code).
ERROR_BYTES = 1 << 20


class TrackingError(Exception):
    """The tracking server could not be reached, or refused a call."""

    def __init__(self, message: str, *, code: int | None = None, error_code: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.error_code = error_code


def _auth(env: Mapping[str, str]) -> dict[str, str]:
    token = env.get("MLFLOW_TRACKING_TOKEN")
    if token:
        return {"Authorization": f"Bearer {token}"}
    user, password = env.get("MLFLOW_TRACKING_USERNAME"), env.get("MLFLOW_TRACKING_PASSWORD")
    if user and password is not None:
        basic = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {basic}"}
    return {}


class Client:
    """MLflow's REST API at ``uri`` (e.g. ``http://mlflow.example:5000``)."""

    def __init__(
        self,
        uri: str,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = TIMEOUT_SECONDS,
    ) -> None:
        self.uri = uri.rstrip("/")
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json", **_auth(env or os.environ)}

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One call: ``POST path`` with ``body`` as JSON, or ``GET path?body``."""
        url = f"{self.uri}/api/2.0/mlflow/{path}"
        data = None
        if method == "GET" and body:
            url += "?" + urllib.parse.urlencode(body)
        elif body is not None:
            data = json.dumps(body).encode()
        try:
            request = urllib.request.Request(url, data=data, method=method, headers=self.headers)
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                answer = response.read()
        except urllib.error.HTTPError as err:
            raise _refused(url, err) from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            raise TrackingError(f"{self.uri} cannot be reached: {reason}") from None
        try:
            parsed = json.loads(answer or b"{}")
        except ValueError:
            raise TrackingError(f"{url} answered with no JSON (is it an MLflow server?)") from None
        return parsed if isinstance(parsed, dict) else {}

    def experiment_id(self, name: str) -> str:
        """The id of the experiment ``name``, created when it is missing."""
        try:
            found = self.call("GET", "experiments/get-by-name", {"experiment_name": name})
            return field(found, "experiment", "experiment_id")
        except TrackingError as err:
            if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
        try:
            return field(self.call("POST", "experiments/create", {"name": name}), "experiment_id")
        except TrackingError as err:  # created meanwhile (another replica, another worker)
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        found = self.call("GET", "experiments/get-by-name", {"experiment_name": name})
        return field(found, "experiment", "experiment_id")

    def create_run(self, body: Mapping[str, Any]) -> str:
        return field(self.call("POST", "runs/create", body), "run", "info", "run_id")

    def search_runs(self, experiment_id: str, filter_: str) -> list[dict[str, Any]]:
        found = self.call(
            "POST",
            "runs/search",
            {"experiment_ids": [experiment_id], "filter": filter_, "max_results": 10},
        )
        return list(found.get("runs") or [])

    def log_batch(self, body: Mapping[str, Any]) -> None:
        if body.get("params") or body.get("tags") or body.get("metrics"):
            self.call("POST", "runs/log-batch", body)

    def update_run(self, body: Mapping[str, Any]) -> None:
        self.call("POST", "runs/update", body)

    def register_version(self, model: Mapping[str, Any], version: Mapping[str, Any]) -> str:
        """The model registry's version of ``version["name"]`` made by run
        ``version["run_id"]``: found (a restarted operator registers once) or created, its
        registered model created first when missing."""
        name, run_id = str(version["name"]), str(version["run_id"])
        try:
            self.call("POST", "registered-models/create", model)
        except TrackingError as err:
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        found = self.call(
            "GET", "model-versions/search", {"filter": f"name='{name}' and run_id='{run_id}'"}
        )
        for existing in found.get("model_versions") or []:
            if existing.get("run_id") == run_id and existing.get("name") == name:
                return field(existing, "version")
        return field(
            self.call("POST", "model-versions/create", version), "model_version", "version"
        )


def field(answer: Any, *keys: str) -> str:
    """``answer[k1][k2]...`` as text; a TrackingError when the server answered otherwise."""
    for key in keys:
        answer = answer.get(key) if isinstance(answer, dict) else None
    if not isinstance(answer, str | int) or answer == "":
        raise TrackingError(f"the tracking server answered without {'.'.join(keys)}")
    return str(answer)


def _refused(url: str, err: urllib.error.HTTPError) -> TrackingError:
    try:
        raw = err.read(ERROR_BYTES)
    except OSError:
        raw = b""
    error_code = ""
    with contextlib.suppress(ValueError, AttributeError):
        error_code = str(json.loads(raw).get("error_code", ""))
    text = raw[:QUOTED_BYTES].decode("utf-8", "replace").strip()
    detail = f": {text}" if text else ""
    return TrackingError(
        f"{url} answered HTTP {err.code}{detail}", code=err.code, error_code=error_code
    )
