"""The in-process operator's client in the cluster tiers (``tests/cluster/chart.py``)
logs the authorizer's refusals (the chart's RBAC lacks something) at ERROR, where the
guard of tests/integration/operator_errors.py fails the test, and no other 403."""

from __future__ import annotations

import json
import logging

import pytest

from tests.cluster import chart
from tests.integration import operator_errors

URL = "https://127.0.0.1:6443/api/v1/namespaces/team/secrets/push"
SA = "system:serviceaccount:torchyard-session:session-torchyard-operator"


def refusal(message: str) -> str:
    return json.dumps({"kind": "Status", "status": "Failure", "reason": "Forbidden",
                       "message": message, "code": 403})  # fmt: skip


def test_the_authorizers_refusal_is_logged_where_the_guard_counts_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger=chart.REFUSALS.name)
    rbac = f'secrets "push" is forbidden: User "{SA}" cannot get resource "secrets" in API group'
    chart._refused("GET", URL, refusal(rbac + ' "" in the namespace "team"'))
    path = f'forbidden: User "{SA}" cannot get path "/metrics"'
    chart._refused("GET", "https://127.0.0.1:6443/metrics", refusal(path))
    [secret, metrics] = caplog.records
    assert secret.getMessage() == (
        "the apiserver refused the operator (the chart's RBAC): GET "
        f'api/v1/namespaces/team/secrets/push: {rbac} "" in the namespace "team"'
    )
    assert "/metrics" in metrics.getMessage()
    assert operator_errors.counts(secret) and operator_errors.counts(metrics)


def test_a_refusal_of_admission_is_not_the_charts_rbac(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=chart.REFUSALS.name)
    for message in (
        'events "run." is forbidden: unable to create new content in namespace t-a because '
        "it is being terminated",
        'pods "r-0" is forbidden: violates PodSecurity "restricted:latest": privileged',
        "not JSON at all",
    ):
        chart._refused("POST", URL, refusal(message))
    chart._refused("POST", URL, "<html>403</html>")
    assert caplog.records == []
