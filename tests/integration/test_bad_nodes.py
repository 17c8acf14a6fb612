"""Bad nodes left out, on the real control plane with KWOK GPU nodes (node-level faults
the real node cannot make): a GPU Xid failure on one node sends the retry to another one
and the run completes; a node that goes NotReady under a running gang fails the attempt
at once (not after the taint manager's 5-minute eviction) and the gang restarts
elsewhere; the same node in two consecutive failures (different errors) is left out too.
The pure parts are tested in tests/unit/controller/test_bad_nodes.py and
tests/unit/status/test_exclusions.py."""

from __future__ import annotations

import json
import time

import pytest

from tests.builders import TrainingRunBuilder
from tests.cluster.harness import Cluster, Pool
from tests.integration.helpers import finish_pod, run_pods, wait_event, wait_status
from tests.integration.test_cli import torchyard
from tests.integration.test_trainingruns import extra_pool, running
from torchyard import k8s
from torchyard.planning import exclusions

__all__ = ["extra_pool"]  # a fixture

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."


def one_node_run(ns: str, name: str, pool: str, backoff: int = 0) -> None:
    k8s.create(
        TrainingRunBuilder(name, ns)
        .environment("pytorch")
        .nodes(1)
        .procs(8)
        .gpus(8)
        .pool(pool)
        .with_("spec.policy.backoffLimit", backoff)
        .obj()
    )


@pytest.mark.parametrize("extra_pool", [(2, 8)], indirect=True)
def test_a_gpu_xid_on_one_node_sends_the_retry_to_another_and_the_run_completes(
    cluster: Cluster, env: str, extra_pool: Pool
) -> None:
    ns, pool = env, extra_pool.name
    one_node_run(ns, "xid", pool, backoff=1)
    running(ns, "xid", timeout=120)
    bad = k8s.get(k8s.PODS, ns, "xid-0")["spec"]["nodeName"]
    crash = {
        "rank": 3,
        "nodeRank": 0,
        "exitCode": 1,
        "reason": "Error",
        "message": "Traceback (most recent call last):\n"
        "RuntimeError: CUDA error: unspecified launch failure",
        "evidence": [{"rank": 3, "line": XID}],
    }
    finish_pod(cluster, ns, "xid-0", 1, json.dumps(crash))
    retried = wait_status(
        k8s.TRAININGRUNS,
        ns,
        "xid",
        lambda s: (
            s.get("restarts") == 1
            and s.get("phase") == "Running"
            and s.get("nodes", {}).get("running") == 1
        ),
        timeout=120,
    )
    [entry] = retried["status"]["excludedNodes"]
    assert (entry["node"], entry["reason"], entry["evidence"]) == (bad, "GpuXid", XID)
    assert retried["status"]["lastFailure"]["class"] == "GpuXid"
    [again] = run_pods(ns, "xid")
    assert again["metadata"]["labels"]["torchyard.dev/attempt"] == "1"
    assert again["spec"]["nodeName"] not in ("", bad)
    assert again["spec"]["nodeName"].startswith(f"{pool}-")
    assert exclusions.excluded_of(again) == frozenset({bad})
    wait_event(
        ns,
        "xid",
        "the NodeExcluded Event",
        lambda e: (
            e["reason"] == "NodeExcluded" and e["message"].startswith(f"node {bad} is left out")
        ),
    )
    described = torchyard(cluster, "describe", "xid", "-n", ns)
    assert described.returncode == 0, described.stderr
    assert "Excluded nodes (left out of this run's next attempts):" in described.stdout
    assert f"  {bad}  GpuXid since {entry['since']}\n    {XID}\n" in described.stdout
    finish_pod(cluster, ns, "xid-0", 0)
    cluster.kubectl("wait", "--for=condition=Succeeded", "tr/xid", "-n", ns, "--timeout=60s")


@pytest.mark.parametrize("extra_pool", [(2, 8)], indirect=True)
def test_a_node_that_goes_not_ready_under_a_running_gang_fails_the_attempt_fast(
    cluster: Cluster, env: str, extra_pool: Pool
) -> None:
    ns, pool = env, extra_pool.name
    one_node_run(ns, "notready", pool)
    running(ns, "notready", timeout=120)
    first = k8s.get(k8s.PODS, ns, "notready-0")
    bad = first["spec"]["nodeName"]
    # KWOK lets go of the node, which then says NotReady (as a kubelet that stopped).
    cluster.node_not_ready(bad)
    went = time.monotonic()
    # Fast: well within the taint manager's eviction (300 s) and the 40 s grace period
    # of the node lifecycle controller; the node's own event wakes the run.
    restarted = wait_status(
        k8s.TRAININGRUNS, ns, "notready", lambda s: s.get("restarts") == 1, timeout=30
    )
    took = time.monotonic() - went
    last = restarted["status"]["lastFailure"]
    assert last["reason"] == "NodeNotReady", last
    assert f"runs on node {bad}, which is NotReady" in last["message"]
    assert "failedAttempts" not in restarted["status"]  # a platform failure
    [entry] = restarted["status"]["excludedNodes"]
    assert (entry["node"], entry["reason"]) == (bad, "NodeNotReady")
    # The Pod the NotReady node cannot confirm the end of is deleted at once, and the new
    # attempt runs on the other node.
    running(ns, "notready", timeout=120)
    [again] = run_pods(ns, "notready")
    assert again["metadata"]["uid"] != first["metadata"]["uid"]
    assert again["spec"]["nodeName"] == next(
        f"{pool}-{i}" for i in range(2) if f"{pool}-{i}" != bad
    )
    assert took < 30, took


def crash(message: str, step: int, exit_code: int = 1) -> str:
    info = {"rank": 0, "nodeRank": 0, "exitCode": exit_code, "reason": "Error", "step": step}
    return json.dumps({**info, "message": message})


@pytest.mark.parametrize("extra_pool", [(2, 8)], indirect=True)
def test_the_same_node_in_two_consecutive_failures_is_left_out_and_the_run_completes(
    cluster: Cluster, env: str, extra_pool: Pool
) -> None:
    ns, pool = env, extra_pool.name
    one_node_run(ns, "rep", pool, backoff=3)
    running(ns, "rep", timeout=120)
    bad = k8s.get(k8s.PODS, ns, "rep-0")["spec"]["nodeName"]
    [other] = [f"{pool}-{i}" for i in range(2) if f"{pool}-{i}" != bad]
    # Keep the retry on the same node: the other one takes no new Pod for a while.
    cluster.kubectl("cordon", other)
    segfault = "Fatal Python error: Segmentation fault"
    finish_pod(cluster, ns, "rep-0", 139, crash(segfault, 5, 139))
    first = wait_status(
        k8s.TRAININGRUNS,
        ns,
        "rep",
        lambda s: s.get("restarts") == 1 and s.get("nodes", {}).get("running") == 1,
        timeout=120,
    )["status"]
    assert first["lastFailure"]["nodeName"] == bad and "excludedNodes" not in first
    [again] = run_pods(ns, "rep")
    assert again["metadata"]["labels"]["torchyard.dev/attempt"] == "1"
    assert again["spec"]["nodeName"] == bad
    eio = "Traceback (most recent call last):\nOSError: EIO"
    finish_pod(cluster, ns, "rep-0", 1, crash(eio, 9))
    second = wait_status(
        k8s.TRAININGRUNS, ns, "rep", lambda s: s.get("restarts") == 2, timeout=120
    )["status"]
    [entry] = second["excludedNodes"]
    assert (entry["node"], entry["reason"]) == (bad, "RepeatedFailure")
    assert entry["evidence"] == (
        f"two consecutive failures on {bad}: Segfault at step 5: Fatal Python error: "
        "Segmentation fault; then PythonException at step 9: OSError: EIO"
    )
    # Only the cordoned node is left: the gang runs there once it takes Pods again.
    cluster.kubectl("uncordon", other)
    running(ns, "rep", timeout=120)
    [third] = run_pods(ns, "rep")
    assert third["metadata"]["labels"]["torchyard.dev/attempt"] == "2"
    assert third["spec"]["nodeName"] == other
    assert exclusions.excluded_of(third) == frozenset({bad})
    finish_pod(cluster, ns, "rep-0", 0)
    cluster.kubectl("wait", "--for=condition=Succeeded", "tr/rep", "-n", ns, "--timeout=60s")
