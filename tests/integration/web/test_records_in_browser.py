"""Run records in the web view, on the real control plane: the operator (in process)
records a failed run into a real registry service; a run deleted through the API and one
whose Pods its TTL collected still show, in a real browser, their spec, failure (class,
advice, traceback), node table, log tails, metrics and the files of its archive (a
download through the registry, hostile paths refused). A token of another namespace reads
nothing of these records on any page or API call, and a uid in the URL that is not a uid
is refused before anything is read.

The node Pod's launcher runs here as a process with the Pod's own variables (KWOK runs no
container), as in tests/integration/test_run_records.py, whose fixtures these are.
"""

from __future__ import annotations

import html
import os
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster
from tests.integration.helpers import run_pods, wait_for
from tests.integration.test_registry_service import Service
from tests.integration.test_run_records import failed_run, recording
from tests.integration.web.browser import (
    CHROMIUM,
    FLAGS,
    SHOTS,
    Served,
    playwright,
    watched_page,
)
from tests.integration.web.test_in_cluster import Browser, reader
from torchyard import k8s
from torchyard.sdk.registry import RegistryClient
from torchyard.web import access, app, source

__all__ = ["recording"]  # (the fixture, from tests/integration/test_run_records.py)
SHOWN = (
    "PythonException",  # the failure's class
    "Advice:",
    "ValueError: the labels do not match the classes",  # the traceback
    "about to fail at step 3",  # the log tail
    "Shown from the record kept when it ended",
)


@pytest.fixture
def gone(
    cluster: Cluster, namespace: str, recording: tuple[Service, str], tmp_path: Path
) -> tuple[Service, str, dict[str, str]]:
    """Failed runs, recorded: ``broken`` deleted through the API, ``brief`` (ttl 0) with
    its Pods collected; the registry service, its token, and the runs' uids."""
    ns = namespace
    uids = {}
    for name, ttl in (("broken", None), ("brief", 0)):
        uids[name] = failed_run(cluster, ns, name, tmp_path, ttl=ttl)["metadata"]["uid"]
    assert k8s.delete(k8s.TRAININGRUNS, ns, "broken")
    wait_for("broken gone", lambda: k8s.get_or_none(k8s.TRAININGRUNS, ns, "broken") is None)
    wait_for("brief's Pods collected", lambda: not run_pods(ns, "brief"), timeout=60)
    return (*recording, uids)


def test_deleted_and_ttl_collected_runs_show_their_records_in_a_browser(
    cluster: Cluster, namespace: str, gone: tuple[Service, str, dict[str, str]]
) -> None:
    svc, token, uids = gone
    ns = namespace
    served = Served(
        app.make_app(source.LiveSource(lambda n: RegistryClient(svc.url, token)), namespace=ns)
    )
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page, errors = watched_page(browser, viewport={"width": 1280, "height": 900})
            page.goto(served.url + f"/ns/{ns}/runs?phase=Failed&experiment=birds")
            page.get_by_text("2 of 2 run(s)").wait_for()
            row = page.locator("#runs tr", has_text="broken")
            assert "deleted" in row.inner_text() and "Failed" in row.inner_text()
            page.screenshot(path=str(SHOTS / "records-runs.png"), full_page=True)
            row.get_by_role("link", name="broken").click()
            page.wait_for_url(f"**/ns/{ns}/runs/broken/records/{uids['broken']}")
            for name in ("broken", "brief"):
                if name == "brief":
                    page.goto(served.url + f"/ns/{ns}/runs/brief")
                page.wait_for_load_state("load")
                for shows in SHOWN:
                    page.get_by_text(shows).first.wait_for()
                assert "pytorch" in page.locator("dl.summary").first.inner_text()  # the spec
                assert (
                    f"{name}-0"
                    in page.locator("#h-nodes + table, section table").first.inner_text()
                )
                chart = page.locator("figure.chart")
                chart.locator("canvas").wait_for()
                assert "3 of 3 points shown" in chart.inner_text()
                files = page.locator("#files")  # the archive the node Pod uploaded
                assert "logs/node-0/metrics.jsonl" in files.inner_text()
                page.screenshot(path=str(SHOTS / f"records-{name}.png"), full_page=True)
            assert errors == []
            browser.close()
        hostile = Browser(served.url)
        # a download through the real registry: the file its listing names, and no other
        metrics = "logs/node-0/metrics.jsonl"
        status, text, headers = hostile.call(f"/ns/{ns}/runs/broken/files/{metrics}")
        assert status == 200 and '"loss"' in text, (status, text[:200])
        assert headers["Content-Type"] == "application/octet-stream"
        assert int(headers["Content-Length"]) == len(text.encode())
        for path, said in (
            ("logs/node-0/..%2F..%2F..%2Fbrief%2Flogs%2Fnode-0%2Fmetrics.jsonl", "'..' name"),
            ("%2Fetc%2Fpasswd", "absolute"),
            ("outputs/never-written.pt", "has no file"),
            ("logs/" + "x" * 2000, "longer than 1024"),
        ):
            status, text, _ = hostile.call(f"/ns/{ns}/runs/broken/files/{path}")
            assert status in (400, 404) and said in html.unescape(text), (path, status)
        for uid in ("..%2F..%2Fetc%2Fpasswd", "%2e%2e", uids["broken"].upper(), "a" * 5000):
            for prefix in ("", "/api"):
                tail = "/metrics?name=loss" if prefix else ""
                status, text, _ = hostile.call(f"{prefix}/ns/{ns}/runs/broken/records/{uid}{tail}")
                assert status == 400 and "not a uid" in text, (uid, status, text[:200])
    finally:
        served.stop()


def test_a_token_of_another_namespace_reads_none_of_its_records(
    cluster: Cluster, namespace: str, gone: tuple[Service, str, dict[str, str]]
) -> None:
    svc, token, uids = gone
    ns = namespace
    other = cluster.create_namespace(f"t-web-rec-{os.urandom(2).hex()}")
    served = Served(
        app.make_app(
            source.LiveSource(lambda n: RegistryClient(svc.url, token)),
            namespace="default",
            reviews=access.kubernetes_reviews(ttl=1.0),
        )
    )
    paths = [
        f"/ns/{ns}/runs",
        f"/ns/{ns}/runs/broken",
        f"/ns/{ns}/runs/broken/records/{uids['broken']}",
        f"/ns/{ns}/runs/brief",
        f"/ns/{ns}/sweeps",
        f"/ns/{ns}/environments",
        f"/api/ns/{ns}/runs",
        f"/api/ns/{ns}/runs/broken/records/{uids['broken']}/metrics?name=loss",
        f"/ns/{ns}/runs/broken/files/logs/node-0/metrics.jsonl",
    ]
    try:
        insider, outsider = Browser(served.url), Browser(served.url)
        assert insider.login(reader(ns, "alice"))[0] == 303
        assert outsider.login(reader(other, "mallory"))[0] == 303
        status, text, _ = insider.call(paths[2])
        assert status == 200 and "the labels do not match the classes" in text
        status, text, _ = insider.call(paths[-1])  # a download, as the caller
        assert status == 200 and '"loss"' in text
        for path in paths:
            status, text, _ = outsider.call(path)
            assert status == 403, (path, status, text[:300])
            assert "do not match" not in text and "about to fail" not in text
            assert uids["broken"] not in text.replace(path, "")
    finally:
        served.stop()
        cluster.delete_namespace(other)
