"""Stalls on the REAL node: a rank that sleeps and a rank blocked in a C call
(``signal.pause``) stop reporting progress; the launcher (its ranks started with
faulthandler on SIGUSR1: no ptrace, the Pods admitted under Pod Security "restricted" as
a non-root user) collects every rank's stacks, names the stuck rank with its file:line,
and the run fails with class Hang. The Pods must have run on the real node; the kubelet's
container state and log say the same."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.faults import stalling
from tests.integration.helpers import run_pods
from tests.node import runs
from tests.node.test_failures import node_run
from torchyard import k8s

pytestmark = pytest.mark.node


STALL_SECONDS = 15


def restricted(cluster: Cluster, namespace: str) -> None:
    """Admit the runs' Pods only under Pod Security "restricted" (no ptrace, no added
    capabilities, non-root): stacks must come from faulthandler, not a debugger."""
    cluster.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )


CASES = {"sleeper": "time.sleep(3600)", "pauser": "while True: signal.pause()"}


def test_a_sleeping_and_a_blocked_rank_are_named_with_their_line(
    cluster: Cluster, env: str, real_node: RealNode
) -> None:
    ns = env
    restricted(cluster, ns)
    for name, stuck in CASES.items():
        body = (
            node_run(name, ns, real_node, stalling(stuck, 0.2))
            .nodes(1)
            .procs(2)
            .with_("spec.policy", {"stallTimeoutSeconds": STALL_SECONDS})
            .obj()
        )
        k8s.create(body)
    for name in CASES:
        where = "<string>:7 in <module>"
        failure = stalled_rank_1(cluster, ns, name, real_node, where, where, 240)
        assert failure["pod"] == f"{name}-0" and failure["step"] == 3, failure
        assert 'File "<string>", line 7 in <module>' in failure["message"], failure


def stalled_rank_1(
    cluster: Cluster, ns: str, name: str, node: RealNode, where: str, logged: str, timeout: float
) -> dict[str, Any]:
    """Run ``name`` failed as a Hang of rank 1 stuck ``where`` (its status says so, the node
    Pod's termination message says Stalled, its log that rank 1 stalled at ``logged``...);
    its failure."""
    run = runs.finished(ns, name, timeout=timeout)
    assert run["status"]["phase"] == "Failed", runs.explain(cluster, ns, name)
    failure: dict[str, Any] = run["status"]["failure"]
    assert (failure["reason"], failure["class"], failure["rank"]) == ("Stalled", "Hang", 1)
    assert f"stuck at {where}" in failure["message"], failure
    pods = run_pods(ns, name)
    runs.on_real_node(pods, node, 1)
    term = runs.container(pods[0], "trainer")["state"]["terminated"]
    assert '"reason": "Stalled"' in term["message"], term
    text = runs.logs(cluster, ns, f"{name}-0")
    assert f"[torchyard] rank 1 stalled at {logged}" in text, text
    return failure


# every rank in a gloo group, with a tensor to reduce (line 2 to 8 of the scripts below)
GLOO = (
    "from datetime import timedelta\n"
    "import torch\n"
    "import torch.distributed as dist\n"
    "from torchyard import progress\n"
    "dist.init_process_group('gloo', timeout=timedelta(seconds=600))\n"
    "rank = dist.get_rank()\n"
    "t = torch.ones(4)\n"
)
SKIPS = (
    "import os, time\n" + GLOO + "for step in range(1, 9):\n"
    "    if not (rank == 1 and step == 3):  # rank 1 skips one all_reduce\n"
    "        dist.all_reduce(t)\n"
    "    progress.report(step, total=8)\n"
    "    time.sleep(0.3)\n"
    "dist.barrier()\n"
)
SLEEPS = (
    "import os, time\n" + GLOO + "for step in range(1, 9):\n"
    "    if rank == 1 and step == 3:\n"
    "        time.sleep(3600)\n"
    "    dist.all_reduce(t)\n"
    "    progress.report(step, total=8)\n"
    "    time.sleep(0.3)\n"
)


def test_a_rank_that_skips_an_all_reduce_and_one_under_torchrun_are_named(
    cluster: Cluster, env: str, real_node: RealNode
) -> None:
    ns = env
    restricted(cluster, ns)
    stall = {"stallTimeoutSeconds": STALL_SECONDS}
    resources = {**runs.RESOURCES, "memory": "2Gi"}  # three processes that import torch
    k8s.create(
        node_run("skipper", ns, real_node, SKIPS)
        .procs(3)
        .with_("spec.resources", resources)
        .with_("spec.policy", stall)
        .obj()
    )
    torchrun = ["python", "-m", "torch.distributed.run", "--no_python", "python", "-c", SLEEPS]
    k8s.create(
        node_run("torchrunner", ns, real_node, SLEEPS)
        .procs(2)
        .command(*torchrun)
        .with_("spec.distribution.launch", "node")
        .with_("spec.resources", resources)
        .with_("spec.policy", stall)
        .obj()
    )
    expected = {
        # the skipper waits in the barrier after its loop; the others in their all_reduce
        "skipper": "<string>:14 in <module> (in torch.distributed barrier)",
        # torchrun's rank 1 sleeps; the launcher found and signalled torchrun's ranks
        "torchrunner": "<string>:11 in <module>",
    }
    for name, where in expected.items():
        stalled_rank_1(cluster, ns, name, real_node, where, "<string>:", 300)


ACROSS = (
    "import time\n" + GLOO + "for step in range(1, 100):\n"
    "    if rank == 1 and step == 3:\n"
    "        time.sleep(1)\n"
    "        progress.report(step)\n"
    "        time.sleep(3600)\n"
    "    dist.all_reduce(t)\n"
    "    progress.report(step)\n"
    "    time.sleep(0.3)\n"
)


def test_the_stuck_rank_on_another_node_is_named_over_the_first_node_to_report(
    cluster: Cluster, env: str, real_node: RealNode
) -> None:
    # Two node Pods, one rank each. Rank 1 (node 1) sleeps outside any collective, a
    # second after its last report; rank 0 (node 0) waits for it in all_reduce. Node 0's
    # launcher sees only rank 0 and names it, and reports first (its rank went quiet a
    # second earlier); node 1's names rank 1. The operator compares both nodes' stalled
    # ranks: the one outside torch.distributed is the one the other waits for.
    ns, name = env, "across"
    restricted(cluster, ns)
    resources = {**runs.RESOURCES, "memory": "2Gi"}
    k8s.create(
        node_run(name, ns, real_node, ACROSS)
        .nodes(2)
        .with_("spec.resources", resources)
        .with_("spec.policy", {"stallTimeoutSeconds": STALL_SECONDS})
        .obj()
    )
    run = runs.finished(ns, name, timeout=300)
    assert run["status"]["phase"] == "Failed", runs.explain(cluster, ns, name)
    failure = run["status"]["failure"]
    assert (failure["reason"], failure["class"], failure["rank"]) == ("Stalled", "Hang", 1)
    assert (failure["pod"], failure["node"], failure["nodeName"]) == (
        f"{name}-1",
        1,
        real_node.name,
    ), failure
    assert "stuck at <string>:13 in <module>" in failure["message"], failure
    pods = run_pods(ns, name)
    runs.on_real_node(pods, real_node, 2)
    # What each node's launcher said, from the kubelet: node 0 named its own rank 0.
    said = {
        p["metadata"]["name"]: runs.container(p, "trainer")["state"]["terminated"]["message"]
        for p in pods
    }
    assert '"reason": "Stalled"' in said[f"{name}-0"] and '"rank": 0' in said[f"{name}-0"]
    assert '"reason": "Stalled"' in said[f"{name}-1"] and '"rank": 1' in said[f"{name}-1"]
    text = runs.logs(cluster, ns, f"{name}-1")
    assert "[torchyard] rank 1 stalled at <string>:13 in <module>" in text, text
