"""Progress on the REAL node: ranks that report with ``torchyard.progress`` (shipped into
the Pod with the launcher) show in ``status.progress`` while the run runs (the operator
reads the launchers' summaries from ``pods/log``) and when it finished (from the
termination messages). The Pods must have run on the real node and the kubelet's log
must hold the launcher's summary lines, so nothing here passes on KWOK."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

import pytest

from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.integration.helpers import run_pods
from tests.node import runs
from tests.node.test_failures import node_run
from torchyard import k8s

pytestmark = pytest.mark.node


STEPS = 30
# Each rank reports a step a second; rank 1 goes a little slower, so that it lags.
REPORTER = (
    "import os, time\n"
    "from torchyard import progress\n"
    "rank = int(os.environ['RANK'])\n"
    f"for step in range(1, {STEPS + 1}):\n"
    "    time.sleep(1.0 + 0.2 * rank)\n"
    f"    progress.report(step, total={STEPS}, loss=1.0 / step)\n"
)


def _unix(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def test_ranks_progress_shows_in_status_while_running_and_at_the_end(
    cluster: Cluster, env: str, real_node: RealNode
) -> None:
    ns, name = env, "steps"
    k8s.create(node_run(name, ns, real_node, REPORTER).nodes(2).obj())
    seen: list[tuple[float, dict[str, Any]]] = []

    def progress_while_running() -> dict[str, Any] | None:
        run = k8s.get(k8s.TRAININGRUNS, ns, name)
        st = run.get("status", {})
        progress = st.get("progress")
        if st.get("phase") == "Running" and progress:
            seen.append((time.time(), progress))
            return dict(progress)
        assert st.get("phase") not in ("Failed", "Succeeded"), runs.explain(cluster, ns, name)
        return None

    live = cluster.wait_for("status.progress while Running", progress_while_running, 150)
    # at most 15 s stale: the launcher says it every 5 s, the operator reads every 10 s
    # (a little more for the kubelet and apiserver on this loaded machine)
    while True:
        progress = progress_while_running()
        if progress is None or progress["step"] >= STEPS - 5:
            break
        stale = time.time() - _unix(progress["lastProgressTime"])
        assert stale < 20, (stale, progress)
        time.sleep(1)
    assert 0 < live["step"] < STEPS and live["total"] == STEPS, live
    assert live["lastProgressTime"] and "eta" in live and live["stepsPerSecond"] > 0, live
    assert live["metrics"]["loss"] == pytest.approx(1.0 / live["step"]), live

    run = runs.finished(ns, name, timeout=180)
    assert run["status"]["phase"] == "Succeeded", runs.explain(cluster, ns, name)
    final = run["status"]["progress"]
    assert (final["step"], final["percent"], final["eta"]) == (STEPS, 100, "0s"), final
    assert final["slowestRankLag"] == 0 and final["metrics"]["loss"] == pytest.approx(1 / STEPS)

    pods = run_pods(ns, name)
    runs.on_real_node(pods, real_node, 2)
    for node in (0, 1):
        text = runs.logs(cluster, ns, f"{name}-{node}")
        assert f'[rank {node}] @@torchyard {{"step": {STEPS}, "total": {STEPS}' in text, text
        assert '[torchyard] progress {"metrics"' in text, text
        term = runs.container(k8s.get(k8s.PODS, ns, f"{name}-{node}"), "trainer")["state"][
            "terminated"
        ]
        assert '"progress"' in term["message"], term
