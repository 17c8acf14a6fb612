"""``refusals.of`` as a table: the apiserver's refusal of a run's child -> the run waits,
fails (InvalidSpec, with the apiserver's message and the run's field), or the work queue
retries (None). The reconcile rows that go through it are in test_reconcile.py."""

from __future__ import annotations

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import api, k8s
from torchyard.controller import refusals

RUN = api.parse_trainingrun(
    TrainingRunBuilder("r", "team")
    .with_("spec.serviceAccountName", "trainer")
    .with_("spec.compute.priorityClassName", "high")
    .obj()
)
WAIT, FAIL, RETRY = "wait", "fail", "retry"

# (what, HTTP status, the apiserver's message, what the run does, its reason, in the message)
REFUSALS: list[tuple[str, int, str, str, str | None, str]] = [
    (
        "a nodeSelector value that is no label value",
        422,
        'Pod "r-0" is invalid: spec.nodeSelector: Invalid value: "a b": a valid label must be',
        FAIL,
        "InvalidSpec",
        "(from spec.compute.nodeSelector (and spec.compute.pool))",
    ),
    (
        "a toleration the Pod validation refuses",
        422,
        'Pod "r-0" is invalid: spec.tolerations[0].effect: Invalid value: "NoSchedule": '
        "effect must be 'NoExecute' when `tolerationSeconds` is set",
        FAIL,
        "InvalidSpec",
        "(from spec.compute.tolerations)",
    ),
    (
        "a resource the Pod validation refuses",
        422,
        'Pod "r-0" is invalid: spec.containers[0].resources.requests: Invalid value: "2": '
        "must be less than or equal to cpu limit",
        FAIL,
        "InvalidSpec",
        "(from spec.resources)",
    ),
    (
        "an invalid claim",
        422,
        'PersistentVolumeClaim "r-checkpoints" is invalid: spec.resources[storage]: '
        'Invalid value: "0": must be greater than zero',
        FAIL,
        "InvalidSpec",
        "(from spec.checkpoints.size)",
    ),
    (
        "a bad request",
        400,
        "the body of the request was in an unknown format",
        FAIL,
        "InvalidSpec",
        "the apiserver refused a child of the run (Invalid)",
    ),
    (
        "Pod Security",
        403,
        'pods "r-0" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true',
        FAIL,
        "InvalidSpec",
        "set spec.runAsUser",
    ),
    (
        "a LimitRange",
        403,
        'pods "r-0" is forbidden: maximum memory usage per Container is 1Gi, but limit is 64Gi',
        FAIL,
        "InvalidSpec",
        "the namespace's admission refused a child of the run: pods",
    ),
    (
        "a policy webhook",
        403,
        'admission webhook "validation.gatekeeper.sh" denied the request: [no-latest] image',
        FAIL,
        "InvalidSpec",
        "denied the request",
    ),
    (
        "a missing ServiceAccount",
        403,
        'pods "r-0" is forbidden: error looking up service account team/trainer: '
        'serviceaccount "trainer" not found',
        WAIT,
        "ServiceAccountNotFound",
        "kubectl create serviceaccount trainer -n team",
    ),
    (
        "a missing PriorityClass",
        403,
        'pods "r-0" is forbidden: no PriorityClass with name high was found',
        WAIT,
        "PriorityClassNotFound",
        "spec.compute.priorityClassName: no PriorityClass high",
    ),
    (
        "a full quota",
        403,
        'pods "r-0" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=4',
        WAIT,
        "QuotaExceeded",
        "exceeded quota: gpus",
    ),
    (
        "the operator's own RBAC",
        403,
        'pods is forbidden: User "system:serviceaccount:t:torchyard" cannot create resource '
        '"pods" in API group "" in the namespace "team"',
        RETRY,
        None,
        "",
    ),
    (
        "a namespace being deleted",
        403,
        "unable to create new content in namespace team because it is being terminated",
        RETRY,
        None,
        "",
    ),
    ("a conflict", 409, 'pods "r-0" already exists', RETRY, None, ""),
    ("an apiserver too busy", 429, "too many requests", RETRY, None, ""),
    ("an apiserver that failed", 500, "etcdserver: request timed out", RETRY, None, ""),
    ("a namespace that is gone", 404, 'namespaces "team" not found', RETRY, None, ""),
]


@pytest.mark.parametrize(
    ("what", "code", "message", "outcome", "reason", "said"),
    REFUSALS,
    ids=[r[0] for r in REFUSALS],
)
def test_each_refusal_of_a_child_makes_the_run_wait_fail_or_retry(
    what: str, code: int, message: str, outcome: str, reason: str | None, said: str
) -> None:
    http_reason = {400: "Invalid", 422: "Invalid"}.get(code, "Forbidden")
    refusal = refusals.of(k8s.ApiError(code, http_reason, message), RUN)
    if outcome == RETRY:
        assert refusal is None
        return
    assert refusal is not None
    assert refusal.fails is (outcome == FAIL)
    assert refusal.reason == reason
    assert said in refusal.message
    if outcome == FAIL:  # the apiserver's own words are kept
        assert message in refusal.message


def test_a_waiting_refusal_is_the_pending_reason_and_message() -> None:
    refusal = refusals.of(
        k8s.ApiError(403, "Forbidden", 'pods "r-0" is forbidden: exceeded quota: gpus'), RUN
    )
    assert refusal is not None and not refusal.fails
    reason, message = refusal.pending
    assert reason == "QuotaExceeded"
    assert message.endswith("the run waits until it has, or ask for fewer resources")
