"""The web view's live log tail on the REAL node: a rank of a TrainingRun (the operator
makes its Pod; the kubelet runs it and serves its log) prints a line every moment, and
each new line appears on the run page in a real browser (Debian's Chromium) without a
reload. How soon is ``benchmarks/ui.py --real-node``'s figure, not a test's."""

from __future__ import annotations

import pytest

from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.integration.helpers import wait_status
from tests.integration.web.browser import (
    CHROMIUM,
    FLAGS,
    SHOTS,
    TICKER,
    Served,
    playwright,
    tick_delays,
    watched_page,
)
from tests.node.test_failures import node_run
from torchyard import k8s
from torchyard.web import app, source

pytestmark = pytest.mark.node


def test_a_ranks_new_log_line_appears_on_the_run_page(
    cluster: Cluster, env: str, real_node: RealNode
) -> None:
    ns, name = env, "ticks"
    k8s.create(node_run(name, ns, real_node, TICKER).obj())
    wait_status(k8s.TRAININGRUNS, ns, name, lambda s: s.get("phase") == "Running", timeout=180)
    served = Served(app.make_app(source.LiveSource(), namespace=ns))
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page, errors = watched_page(browser)
            page.goto(served.url + f"/ns/{ns}/runs/{name}")
            delays = tick_delays(page, 5, timeout_ms=120_000)
            assert len(delays) == 5  # five lines written after the page opened, shown
            assert "[rank 0] tick" in page.locator("#log").inner_text()
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "node-log-tail.png"), full_page=True)
            assert errors == []
            browser.close()
    finally:
        served.stop()
        k8s.delete(k8s.TRAININGRUNS, ns, name)
