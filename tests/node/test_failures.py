"""How torchyard runs fail, and how a user watches them, on the REAL node: a rank killed by
the kernel for going over the node Pod's memory limit, and ``torchyard logs -f``
streaming a rank's output live from the kubelet.

Each run carries its code in the command (``source: {image: true}``) and runs in the
training image as a non-root user; the operator runs in-process with the torchyard image
as its init image (the fixtures of ``tests/node/conftest.py``). Every test
checks that its Pods ran on the real node (``spec.nodeName``) and reads the outcome from
the kubelet (container states, ``pods/log``), so none passes on KWOK.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.integration.helpers import run_pods
from tests.node import runs
from torchyard import k8s

pytestmark = pytest.mark.node

# The fixtures of the TrainingRun tests: the operator with the torchyard init image, and
# a curated Environment "pytorch" (the training image) in the test's namespace.

MEMORY_LIMIT = "200Mi"
# Rank 1 allocates (and touches) 16 MiB at a time until the kernel kills it; rank 0
# waits for the launcher to stop it.
HOG = (
    "import os, sys, time\n"
    "rank = os.environ['RANK']\n"
    "print('rank', rank, 'started', flush=True)\n"
    "if rank == '1':\n"
    "    hoard = []\n"
    "    while True:\n"
    "        hoard.append(bytearray(16 << 20))\n"
    "        print('rank 1 holds', 16 * len(hoard), 'MiB', flush=True)\n"
    "time.sleep(600)\n"
)


def node_run(name: str, namespace: str, node: RealNode, script: str) -> TrainingRunBuilder:
    """One Pod per node, one rank each, running ``script`` from the command."""
    return (
        TrainingRunBuilder(name, namespace)
        .environment("pytorch")
        .command("python", "-c", script)
        .procs(1)
        .pool(node.pool)
        .with_("spec.resources", dict(runs.RESOURCES))
        .with_("spec.runAsUser", 1000)
    )


def test_a_rank_over_the_memory_limit_is_reported_oom_killed_with_its_rank_and_137(
    cluster: Cluster, env: str, real_node: RealNode
) -> None:
    ns, name = env, "oom"
    body = (
        node_run(name, ns, real_node, HOG)
        .nodes(2)
        .with_("spec.resources", {**runs.RESOURCES, "memory": MEMORY_LIMIT})
        .obj()
    )
    started = time.monotonic()
    k8s.create(body)
    run = runs.finished(ns, name, timeout=180)
    print(f"\n[node] rank over its memory limit: {run['status']['phase']} in "
          f"{time.monotonic() - started:.1f}s")  # fmt: skip
    assert run["status"]["phase"] == "Failed", runs.explain(cluster, ns, name)
    failure = run["status"]["failure"]
    assert (failure["reason"], failure["rank"], failure["node"], failure["pod"]) == (
        "OOMKilled",
        1,
        1,
        f"{name}-1",
    ), failure
    assert failure["exitCode"] == 137, failure
    # what to do about it, not an empty traceback
    assert "memory" in failure["message"] and MEMORY_LIMIT in failure["message"], failure
    failed = {c["type"]: c for c in run["status"]["conditions"]}["Failed"]
    assert failed["status"] == "True" and "OOMKilled" in failed["reason"] + failed["message"]

    # what the kubelet saw: node 1's container went over its limit and ended with 137,
    # the rank having grown past the limit (its own lines in pods/log)
    pod = k8s.get(k8s.PODS, ns, f"{name}-1")
    runs.on_real_node([pod], real_node, 1)
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["memory"] == MEMORY_LIMIT
    term = runs.container(pod, "trainer")["state"]["terminated"]
    assert (term["reason"], term["exitCode"]) == ("OOMKilled", 137), term
    text = runs.logs(cluster, ns, f"{name}-1")
    assert "[rank 1] rank 1 holds 16 MiB" in text, text
    assert "[torchyard] rank 1 exited with signal SIGKILL: stopping the other ranks" in text

    def all_stopped() -> list[dict[str, Any]] | None:
        pods = run_pods(ns, name)
        live = [p for p in pods if p["status"].get("phase") in ("Pending", "Running")]
        return None if live else pods

    pods = cluster.wait_for("every node Pod of the failed run to stop", all_stopped, 90)
    runs.on_real_node(pods, real_node, 2)


# Prints a line, waits until the test lets it go on (a file the test creates in the
# container through the kubelet), prints another, and ends.
STEPPER = (
    "import os, time\n"
    "print('first line', flush=True)\n"
    "while not os.path.exists('/tmp/go-on'):\n"
    "    time.sleep(0.1)\n"
    "print('second line', flush=True)\n"
)


def test_torchyard_logs_follow_streams_live_from_the_kubelet_and_ends_with_the_run(
    cluster: Cluster, env: str, real_node: RealNode
) -> None:
    ns, name = env, "follow"
    k8s.create(node_run(name, ns, real_node, STEPPER).nodes(1).obj())
    pod_name = f"{name}-0"

    def running() -> bool:
        pod = k8s.get_or_none(k8s.PODS, ns, pod_name)  # none until the operator made it
        statuses = (pod or {}).get("status", {}).get("containerStatuses") or []
        return any(c["name"] == "trainer" and "running" in c["state"] for c in statuses)

    cluster.wait_for("the rank's container to run", running, timeout=120)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_REGISTRY")}
    follow = subprocess.Popen(
        [sys.executable, "-m", "torchyard", "logs", name, "-f", "-n", ns],
        env={**environ, "KUBECONFIG": str(cluster.kubeconfig)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[tuple[float, str]] = []
    reader = threading.Thread(
        target=lambda: seen.extend((time.monotonic(), line) for line in follow.stdout or []),
        daemon=True,
    )
    reader.start()
    try:
        # The rank prints its second line only once /tmp/go-on exists, and only this test
        # makes it, after the first line arrived: so the first line came live from the
        # kubelet while the rank still ran (not from an archive after the run).
        cluster.wait_for(
            "the first line, live", lambda: any("first line" in s for _, s in seen), 60
        )
        assert not any("second line" in s for _, s in seen)
        assert follow.poll() is None, "logs -f ended while the rank still ran"
        pod = k8s.get(k8s.PODS, ns, pod_name)
        runs.on_real_node([pod], real_node, 1)
        assert pod["status"]["phase"] == "Running"
        released = time.monotonic()
        cluster.kubectl("exec", "-n", ns, pod_name, "-c", "trainer", "--", "touch", "/tmp/go-on")
        code = follow.wait(timeout=90)
        ended = time.monotonic()
    finally:
        if follow.poll() is None:
            follow.kill()
    reader.join(10)
    stderr = follow.stderr.read() if follow.stderr else ""
    lines = [s.rstrip("\n") for _, s in seen]
    print(f"\n[node] logs -f: exited {ended - released:.1f}s after the rank was let go on")
    assert code == 0, (lines, stderr)
    assert "[node 0] [rank 0] first line" in lines, lines
    assert "[node 0] [rank 0] second line" in lines, lines
    second = next(t for t, s in seen if "second line" in s)
    assert second >= released
    # it exited because the run's Pod ended: the run is over, and it succeeded
    run = runs.finished(ns, name, timeout=60)
    assert run["status"]["phase"] == "Succeeded", runs.explain(cluster, ns, name)
    term = runs.container(k8s.get(k8s.PODS, ns, pod_name), "trainer")["state"]["terminated"]
    assert term["exitCode"] == 0, term
