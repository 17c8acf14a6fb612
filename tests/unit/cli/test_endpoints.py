"""``torchyard endpoints describe`` prints what the status says: versions and their
shares, a failing Pod's class, advice and traceback, the conditions and Pods."""

from __future__ import annotations

import pytest

from tests.unit.web.fakes import endpoint
from torchyard.cli.endpoints import describe_lines
from torchyard.sdk import endpoints


def test_describe_says_which_version_fails_and_why() -> None:
    body = endpoint("birds")
    pods = [
        {
            "metadata": {"name": "birds-7d-x"},
            "status": {
                "phase": "Running",
                "containerStatuses": [{"ready": False, "restartCount": 4}],
            },
        }
    ]
    text = "\n".join(describe_lines(body, pods))
    assert "OnlineEndpoint team-a/birds: Degraded" in text
    assert "birds 3" not in text and "birds version 3" in text
    assert "version 2: 50% of requests, Deployment birds-canary, 1/1 ready" in text
    assert "failure:  PythonException (InitFailed) in Pod birds-7d-x, 4 restart(s)" in text
    assert "advice:   fix the scoring script" in text and "KeyError:" in text
    assert "Pod birds-7d-x: Running, not ready, 4 restart(s)" in text
    assert "access:   a token that may get it" in text


def test_invoke_routes_to_the_protocol_asked_for() -> None:
    body = endpoint("birds")
    assert endpoints.route(body) == "/score"
    assert endpoints.route(body, "v1") == "/v1/models/birds:predict"
    assert endpoints.route(body, "v2") == "/v2/models/birds/infer"
    new = {"metadata": {"name": "fresh"}, "status": {}}
    with pytest.raises(endpoints.EndpointNotFound, match="serves no model yet"):
        endpoints.route(new, "v2")
