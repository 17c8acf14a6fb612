"""Who broke a DDP run, on the REAL node (2 node Pods x 2 ranks, gloo, Debian's torch):
a rank that leaves with status 0 while the others train (class EarlyExit, naming it, not
rank 0 that lost it), and a rank stuck in C while holding the GIL while its peers wait
inside ``loss.backward()`` (class Hang, naming it and its line, not a rank that only
waits). The scripts are tests/faults.py's (benchmarks/why_matrix.py runs the whole matrix
locally); the Pods run under Pod Security "restricted" as a non-root user."""

from __future__ import annotations

import pytest

from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.faults import AT, script
from tests.integration.helpers import run_pods
from tests.node import runs
from tests.node.test_failures import node_run
from tests.node.test_stalls import STALL_SECONDS, restricted
from torchyard import k8s

pytestmark = pytest.mark.node


# name: (fault, victim rank, class): the victim on the other node, then on node 0's
CASES = {"leaver": ("exit0", 3, "EarlyExit"), "gilholder": ("gil", 1, "Hang")}


def test_the_rank_that_left_early_and_the_rank_stuck_holding_the_gil_are_named(
    cluster: Cluster, env: str, real_node: RealNode
) -> None:
    ns = env
    restricted(cluster, ns)
    resources = {**runs.RESOURCES, "memory": "2Gi"}  # two processes that import torch
    for name, (fault, victim, _) in CASES.items():
        k8s.create(
            node_run(name, ns, real_node, script(fault, "ddp", victim))
            .nodes(2)
            .procs(2)
            .with_("spec.resources", resources)
            .with_("spec.policy", {"stallTimeoutSeconds": STALL_SECONDS})
            .obj()
        )
    for name, (_, victim, klass) in CASES.items():
        run = runs.finished(ns, name, timeout=300)
        assert run["status"]["phase"] == "Failed", runs.explain(cluster, ns, name)
        failure = run["status"]["failure"]
        assert (failure["class"], failure["rank"], failure["node"]) == (
            klass,
            victim,
            victim // 2,
        ), failure
        assert failure["pod"] == f"{name}-{victim // 2}", failure
        # the failed run's Pods that still ran when it was decided are deleted (the one
        # named too, when it still ran): how many are left depends on that moment, so
        # where the named Pod ran is read from the status, which keeps its Node
        assert failure["nodeName"] == real_node.name, failure
        pods = run_pods(ns, name)
        runs.on_real_node(pods, real_node, len(pods))
    leaver = k8s.get(k8s.TRAININGRUNS, ns, "leaver")["status"]["failure"]
    assert leaver["message"].startswith(
        f"rank 3 (node 1) exited with status 0 at step {AT - 1} while the other ranks still trained"
    ), leaver
    assert leaver["retryable"] is False and leaver["exitCode"] == 0, leaver
    stuck = k8s.get(k8s.TRAININGRUNS, ns, "gilholder")["status"]["failure"]
    # the script's line of the C call (``-c``: "<string>"), and never "for 0s"
    lines = script("gil", "ddp", 1).splitlines()
    line = next(n for n, text in enumerate(lines, 1) if "ctypes.PyDLL(None).sleep" in text)
    assert f"stuck at <string>:{line} in <module>" in stuck["message"], stuck
    assert "made no progress for 0s" not in stuck["message"], stuck
