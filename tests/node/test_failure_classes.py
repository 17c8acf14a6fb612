"""Failure classes produced for real on the REAL node: a segfault (ctypes reads address 0),
a missing module, a Python exception (which, being the same error at the same step, stops
after two attempts although backoffLimit allows four), a GPU Xid line before a CUDA-style
error (the line, not a GPU), a rendezvous that times out because node 1 never joins, and
a collective that times out (gloo's transport) because node 1's rank sleeps instead of
joining the ``all_reduce``: a ``CollectiveTimeout`` naming node 1 as the one it waited for.
Each run's ``status.failure`` must say the class, whether retrying may help and advice;
its Pods must have run on the real node and the kubelet must show the exit."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.integration.helpers import run_pods, wait_for
from tests.node import runs
from tests.node.test_failures import node_run
from torchyard import k8s

pytestmark = pytest.mark.node


SEGFAULT = "import ctypes\nprint('reading address 0', flush=True)\nctypes.string_at(0)\n"
MISSING = "import no_such_module_for_torchyard\n"
RAISES = "from torchyard import progress\nprogress.report(7)\nraise KeyError('label')\n"
XID = (
    "print('NVRM: Xid (PCI:0000:3b:00): 79, pid=12, GPU has fallen off the bus.', flush=True)\n"
    "raise RuntimeError('CUDA error: unknown error')\n"
)
# Node 0 waits 10 s for node 1 at the TCPStore; node 1 never joins (it sleeps: a node
# that ended with status 0 instead would be named, as EarlyExit).
RENDEZVOUS = (
    "import datetime, os, time\n"
    "if os.environ['RANK'] == '0':\n"
    "    import torch.distributed as dist\n"
    "    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=10))\n"
    "else:\n"
    "    time.sleep(600)\n"
)
# The ranks meet (a long rendezvous timeout: node 1's Pod may start late), then rank 0's
# all_reduce times out after 15 s in gloo's transport ("Timed out waiting 15000ms for recv
# operation to complete") while rank 1 sleeps; node 1's Pod still runs when it fails.
COLLECTIVE = (
    "import datetime, time\n"
    "import torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=300))\n"
    "group = dist.new_group(timeout=datetime.timedelta(seconds=15))\n"
    "print('rank', dist.get_rank(), 'joined', flush=True)\n"
    "if dist.get_rank() == 1:\n"
    "    time.sleep(900)\n"
    "dist.all_reduce(torch.ones(1), group=group)\n"
)
# spec.policy beyond backoffLimit: the stall detector (class Hang, earlier in the rule
# order) must not fire before the 15 s collective timeout does.
POLICIES: dict[str, dict[str, int]] = {"collective": {"stallTimeoutSeconds": 600}}
CASES: dict[str, tuple[str, int, int, str, bool]] = {
    # name: (script, nodes, backoffLimit, class, retryable)
    "segv": (SEGFAULT, 1, 0, "Segfault", True),
    "missing": (MISSING, 1, 3, "ImportError", False),
    "raises": (RAISES, 1, 3, "PythonException", True),
    "xid": (XID, 1, 0, "GpuXid", True),
    "rdzv": (RENDEZVOUS, 2, 0, "RendezvousTimeout", True),
    "collective": (COLLECTIVE, 2, 0, "CollectiveTimeout", True),
}


def joined(cluster: Cluster, ns: str, pod: str, text: str) -> dict[str, Any] | None:
    """The Pod while it runs, once the kubelet's log of it (pods/log) says ``text``."""
    found = k8s.list_(k8s.PODS, ns, field_selector=f"metadata.name={pod}")
    if not found or found[0].get("status", {}).get("phase") != "Running":
        return None
    log = cluster.kubectl("logs", "-n", ns, pod, "-c", "trainer", check=False)
    return found[0] if text in log else None


def test_each_failure_class_is_produced_and_named_with_advice(
    cluster: Cluster, env: str, real_node: RealNode
) -> None:
    ns = env
    for name, (script, nodes, backoff, _, _) in CASES.items():
        body = (
            node_run(name, ns, real_node, script)
            .nodes(nodes)
            .with_("spec.policy", {"backoffLimit": backoff, **POLICIES.get(name, {})})
            .obj()
        )
        k8s.create(body)
    # node 1's rank of "collective" joins, then sleeps: its Pod is deleted once the run
    # fails, so the kubelet's word that it ran and joined is taken while it runs
    sleeper = wait_for(
        "collective-1 running with 'rank 1 joined' in its log",
        lambda: joined(cluster, ns, "collective-1", "rank 1 joined"),
        timeout=300,
    )
    assert sleeper["spec"]["nodeName"] == real_node.name, sleeper["spec"]
    seen: dict[str, Any] = {}
    for name, (_, nodes, _, klass, retryable) in CASES.items():
        run = runs.finished(ns, name, timeout=300)
        assert run["status"]["phase"] == "Failed", runs.explain(cluster, ns, name)
        failure = run["status"]["failure"]
        seen[name] = failure
        assert (failure.get("class"), failure.get("retryable")) == (klass, retryable), failure
        assert failure["advice"], failure
        pods = run_pods(ns, name)
        if name in ("collective", "rdzv"):  # node 1's Pod, still running, was deleted
            pods = [p for p in pods if p["metadata"]["name"] == f"{name}-0"]
            nodes = 1
        runs.on_real_node(pods, real_node, nodes)
        term = runs.container(k8s.get(k8s.PODS, ns, failure["pod"]), "trainer")["state"]
        assert term["terminated"]["exitCode"] == failure["exitCode"], term

    assert seen["segv"]["exitCode"] == 139 and seen["segv"]["signal"] == 11
    assert "no_such_module_for_torchyard" in seen["missing"]["advice"]
    assert seen["rdzv"]["class"] == "RendezvousTimeout" and seen["rdzv"]["node"] == 0
    assert "NVRM: Xid" in seen["xid"]["advice"]
    # rank 0 (node 0) timed out in gloo's transport; node 1's rank, asleep, never joined
    timeout = seen["collective"]
    assert (timeout["rank"], timeout["node"]) == (0, 0), timeout
    assert "Timed out waiting 15000ms for recv operation to complete" in timeout["message"]
    assert timeout["advice"].startswith(
        "rank 0 (node 0) timed out in a collective while node 1 (Pod collective-1, rank 1) "
        "still ran"
    ), timeout
    assert "rank 0 joined" in runs.logs(cluster, ns, "collective-0")
    # a deterministic error: the same error at the same step twice, then no more retries
    raised = k8s.get(k8s.TRAININGRUNS, ns, "raises")["status"]
    # (restarted once in place: the launcher ran the ranks again, in the same Pod)
    assert (raised["restarts"], raised["inPlaceRestarts"], raised["failedAttempts"]) == (0, 1, 1)
    assert raised["failure"]["step"] == 7, raised
    assert raised["failure"]["advice"].startswith("the same error at the same step"), raised
    assert raised["lastFailure"]["class"] == "PythonException"
    # the import error was not retried at all, despite backoffLimit 3
    assert k8s.get(k8s.TRAININGRUNS, ns, "missing")["status"]["restarts"] == 0
