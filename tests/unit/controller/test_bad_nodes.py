"""Bad nodes left out, through ``trainingruns.reconcile`` against the in-memory fake of
``torchyard.k8s``: a failure that blames a node (a GPU's Xid line, a ``policy.logRules``
excludeNode line, a node gone NotReady under the gang) restarts the gang with the node in
``status.excludedNodes``, and the next attempt's Pods rule it out. The real-control-plane
version is in tests/integration/test_bad_nodes.py."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from tests.unit.controller.world import (
    env,
    gpu_node,
    node_pod,
    reconcile,
    run,
    running,
    status,
    world,
)
from torchyard.planning import exclusions
from torchyard.status import exclusions as bad_nodes
from torchyard.status import failures

RUNNING = {"phase": "Running", "startTime": "2026-01-01T11:59:00Z", "restarts": 0}
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."


def launcher_failure(message: str, **extra: Any) -> str:
    return json.dumps(
        {"rank": 2, "nodeRank": 1, "exitCode": 1, "reason": "Error", "message": message, **extra}
    )


def failed_on(node_name: str, message: str) -> dict[str, Any]:
    return node_pod(1, phase="Failed", node_name=node_name, exit_code=1, message=message)


def test_a_gpu_xid_restarts_the_gang_without_its_node_and_the_retry_avoids_it() -> None:
    body = run(status=RUNNING, spec={"policy.backoffLimit": 1})
    crash = launcher_failure(
        "Traceback (most recent call last):\nRuntimeError: CUDA error: unspecified launch failure",
        evidence=[{"rank": 2, "line": XID}],
    )
    pods = [node_pod(0, phase="Running", node_name="gpu-0"), failed_on("gpu-1", crash)]
    nodes = [gpu_node("gpu-0"), gpu_node("gpu-1"), gpu_node("gpu-2")]
    fake = world(body, env(), *nodes, *pods)
    reconcile(fake, at=10)
    after = status(fake)
    assert after["restarts"] == 1 and after["lastFailure"]["class"] == "GpuXid"
    [entry] = after["excludedNodes"]
    assert (entry["node"], entry["reason"], entry["evidence"]) == ("gpu-1", "GpuXid", XID)
    assert entry["since"] == "2026-01-01T12:00:10Z"
    assert ("Warning", "NodeExcluded") in [(t, r) for t, r, _ in fake.events]
    assert fake.pods() == []  # the attempt's Pods are gone
    reconcile(fake, at=11)
    again = fake.pods()
    assert [p["metadata"]["name"] for p in again] == ["r-0", "r-1"]
    assert all(exclusions.excluded_of(p) == frozenset({"gpu-1"}) for p in again)
    # Further restarts keep the node out (and the first time it was left out).
    assert status(fake)["excludedNodes"] == [entry]


def test_a_log_rule_exclude_node_line_leaves_the_node_out() -> None:
    body = run(status=RUNNING, spec={"policy.backoffLimit": 1})
    hit = {"index": 0, "pattern": "ECC page retirement", "action": "excludeNode", "line": "x"}
    crash = launcher_failure("Traceback (most recent call last):\nValueError: bad", logRule=hit)
    pods = [node_pod(0, phase="Running", node_name="gpu-0"), failed_on("gpu-1", crash)]
    fake = world(body, env(), gpu_node("gpu-0"), gpu_node("gpu-1"), *pods)
    reconcile(fake, at=10)
    [entry] = status(fake)["excludedNodes"]
    assert (entry["node"], entry["reason"]) == ("gpu-1", "LogRule")
    assert entry["evidence"] == "policy.logRules[0] matched 'x'"


def test_a_python_error_leaves_no_node_out() -> None:
    body = run(status=RUNNING, spec={"policy.backoffLimit": 1})
    crash = launcher_failure("Traceback (most recent call last):\nValueError: bad")
    pods = [node_pod(0, phase="Running", node_name="gpu-0"), failed_on("gpu-1", crash)]
    fake = world(body, env(), gpu_node("gpu-0"), gpu_node("gpu-1"), *pods)
    reconcile(fake, at=10)
    assert status(fake)["restarts"] == 1 and "excludedNodes" not in status(fake)


def not_ready(name: str) -> dict[str, Any]:
    node = gpu_node(name)
    node["status"]["conditions"] = [
        {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}
    ]
    return node


def test_a_node_gone_not_ready_under_a_running_gang_fails_the_attempt_at_once() -> None:
    body = run(status=RUNNING)  # backoffLimit 0: a platform failure all the same
    fake = world(body, env(), gpu_node("gpu-0"), not_ready("gpu-1"), gpu_node("gpu-2"), *running())
    reconcile(fake, at=10)
    after = status(fake)
    assert after["restarts"] == 1 and "failedAttempts" not in after
    assert after["lastFailure"]["reason"] == "NodeNotReady"
    assert after["lastFailure"]["message"].startswith(
        "node Pod r-1 (node rank 1) runs on node gpu-1, which is NotReady "
        "(condition Ready=Unknown): the attempt is stopped now"
    )
    [entry] = after["excludedNodes"]
    assert (entry["node"], entry["reason"]) == ("gpu-1", "NodeNotReady")


def test_a_healthy_running_gang_is_left_running() -> None:
    fake = world(run(status=RUNNING), env(), gpu_node("gpu-0"), gpu_node("gpu-1"), *running())
    reconcile(fake, at=10)
    assert status(fake).get("restarts", 0) == 0 and "excludedNodes" not in status(fake)


def test_what_a_node_says_of_its_health() -> None:
    tainted = gpu_node("n")
    tainted["spec"]["taints"] = [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]
    problem = gpu_node("n")
    problem["status"]["conditions"].append(
        {"type": "KernelDeadlock", "status": "True", "reason": "DockerHung"}
    )
    assert bad_nodes.unhealthy(gpu_node("n")) is None
    assert bad_nodes.unhealthy(not_ready("n")) == (
        "NodeNotReady",
        "condition Ready=Unknown (NodeStatusUnknown)",
    )
    assert bad_nodes.unhealthy(tainted) == (
        "NodeNotReady",
        "taint node.kubernetes.io/unreachable:NoExecute",
    )
    assert bad_nodes.unhealthy(problem) == (
        "NodeUnhealthy",
        "condition KernelDeadlock=True (DockerHung)",
    )


def test_an_eviction_by_the_taint_manager_names_the_node_to_leave_out() -> None:
    pod = node_pod(1, phase="Running", node_name="gpu-1")
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    pod["status"]["conditions"] = [
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "DeletionByTaintManager",
            "message": "Taint manager: deleting due to NoExecute taint",
        }
    ]
    lost = failures.lost_failure(["r-0", "r-1"], [node_pod(0, phase="Running"), pod])
    entry = bad_nodes.of_failure(lost, datetime(2026, 1, 1, tzinfo=timezone.utc))
    assert entry is not None
    assert (entry["node"], entry["reason"]) == ("gpu-1", "DeletionByTaintManager")


def test_a_node_is_listed_once_and_the_list_stays_bounded() -> None:
    first = {"node": "a", "reason": "GpuXid", "evidence": "x", "since": "t0"}
    assert bad_nodes.merged([first], {**first, "since": "t1"}) == [first]
    many = [{"node": str(i)} for i in range(bad_nodes.MAX_EXCLUDED)]
    out = bad_nodes.merged(many, {"node": "new"})
    assert out is not None and len(out) == bad_nodes.MAX_EXCLUDED and out[-1] == {"node": "new"}
    assert bad_nodes.merged(None, None) is None


def test_a_gpu_xid_with_no_retry_left_still_names_its_node() -> None:
    body = run(status=RUNNING)  # backoffLimit 0: the run fails with it
    crash = launcher_failure(
        "Traceback (most recent call last):\nRuntimeError: CUDA error: unspecified launch failure",
        evidence=[{"rank": 2, "line": XID}],
    )
    pods = [node_pod(0, phase="Running", node_name="gpu-0"), failed_on("gpu-1", crash)]
    fake = world(body, env(), gpu_node("gpu-0"), gpu_node("gpu-1"), *pods)
    reconcile(fake, at=10)
    after = status(fake)
    assert after["phase"] == "Failed" and after["failure"]["class"] == "GpuXid"
    assert after["failure"]["nodeName"] == "gpu-1"
    [entry] = after["excludedNodes"]
    assert (entry["node"], entry["reason"], entry["evidence"]) == ("gpu-1", "GpuXid", XID)
    assert ("Warning", "NodeExcluded") in [(t, r) for t, r, _ in fake.events]
    reconcile(fake, at=20)  # a finished run keeps it
    assert status(fake)["excludedNodes"] == [entry]


def step_failure(message: str, step: int, exit_code: int = 1) -> str:
    return launcher_failure(message, step=step, exitCode=exit_code)


def test_the_same_node_in_two_consecutive_failures_is_left_out() -> None:
    segfault = "Fatal Python error: Segmentation fault"
    body = run(status=RUNNING, spec={"policy.backoffLimit": 3})
    pods = [
        node_pod(0, phase="Running", node_name="gpu-0"),
        failed_on("gpu-1", step_failure(segfault, 5)),
    ]
    nodes = [gpu_node("gpu-0"), gpu_node("gpu-1"), gpu_node("gpu-2")]
    fake = world(body, env(), *nodes, *pods)
    reconcile(fake, at=10)
    first = status(fake)
    assert first["restarts"] == 1 and first["lastFailure"]["nodeName"] == "gpu-1"
    assert "excludedNodes" not in first  # once is no pattern
    reconcile(fake, at=11)  # the next attempt's Pods
    again = [node_pod(0, attempt=1, phase="Running", node_name="gpu-0")]
    crash = step_failure("Traceback (most recent call last):\nValueError: bad batch", 9)
    again.append(
        node_pod(1, attempt=1, phase="Failed", node_name="gpu-1", exit_code=1, message=crash)
    )
    assert sorted(p["metadata"]["name"] for p in fake.pods()) == ["r-0", "r-1"]
    for p in again:
        fake.put(p)  # the new attempt ran on the same nodes, and gpu-1's rank failed again
    reconcile(fake, at=30)
    after = status(fake)
    assert after["restarts"] == 2
    [entry] = after["excludedNodes"]
    assert (entry["node"], entry["reason"]) == ("gpu-1", "RepeatedFailure")
    assert entry["evidence"] == (
        "two consecutive failures on gpu-1: Segfault at step 5: Fatal Python error: "
        "Segmentation fault; then PythonException at step 9: ValueError: bad batch"
    )
    reconcile(fake, at=31)
    assert all(exclusions.excluded_of(p) == frozenset({"gpu-1"}) for p in fake.pods())
