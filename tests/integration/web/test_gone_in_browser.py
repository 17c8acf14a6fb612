"""Sweeps and Environment builds that are gone, in a real browser on the real control
plane: the operator (in process) records into a real registry service a Sweep deleted
while its trials ran (one had finished with its metric) and an Environment whose build
failed (then deleted). Their lists still show them, marked deleted, and their pages show,
from the records, the trials (state, metric, the best one) and the build's result (Failed,
the builder's error), with no console error and every control labelled. Screenshots under
build/web-screenshots/ (gone-*.png).

The trials' and the build's Pods are KWOK's: the test ends them as a container would (exit
code and termination message), as tests/integration/test_sweeps.py and
test_environments.py do.
"""

from __future__ import annotations

import json
from typing import Any

from tests.builders import SweepBuilder, TrainingRunBuilder, environment
from tests.cluster.harness import Cluster
from tests.cluster.registry import OciRegistry
from tests.integration.helpers import finish_pod, run_pods, wait_for, wait_status
from tests.integration.test_environments import recipe, running_build_pod
from tests.integration.test_registry_service import Service
from tests.integration.test_run_records import recording
from tests.integration.web.browser import SHOTS, browsing
from tests.integration.web.test_browser import LABELLED
from torchyard import k8s
from torchyard.sdk.registry import RegistryClient
from torchyard.web import app, source

__all__ = ["recording"]  # (the fixture, from tests/integration/test_run_records.py)
SWEEP, ENV = "birds-sweep", "broken-env"
BUILD_ERROR = (
    "pip install failed (exit code 1):\nERROR: Could not find a version that "
    "satisfies the requirement no-such-package"
)


def recorded(svc: Service, token: str, ns: str, name: str, kind: str) -> Any:
    """The registry's record of ``name``, once the operator wrote it."""
    client = RegistryClient(svc.url, token)
    return wait_for(f"the record of {kind} {name}", lambda: client.get_record(ns, name, kind=kind))


def running(ns: str, run: str) -> list[dict[str, Any]]:
    return [p for p in run_pods(ns, run) if (p.get("status") or {}).get("phase") == "Running"]


def deleted_sweep(cluster: Cluster, ns: str, svc: Service, token: str) -> Any:
    """A Sweep of two trials at once: t0 ends with its metric, then the Sweep is deleted
    while t1 runs; its record."""
    trial = TrainingRunBuilder("t").environment("pytorch").pool("cpu")
    k8s.create(SweepBuilder(SWEEP, ns).trial(trial).trials(2, 2).seed(7).obj())
    for index in (0, 1):
        wait_for(f"trial {index} running", lambda i=index: running(ns, f"{SWEEP}-t{i}"), timeout=60)
    [pod] = running(ns, f"{SWEEP}-t0")
    progress = {"step": 3, "metrics": {"best_val_acc": 0.8125}}
    finish_pod(cluster, ns, pod["metadata"]["name"], 0, json.dumps({"progress": progress}))
    wait_status(
        k8s.SWEEPS,
        ns,
        SWEEP,
        lambda s: any(r.get("metric") == 0.8125 for r in s.get("summary") or []),
        timeout=60,
    )
    assert k8s.delete(k8s.SWEEPS, ns, SWEEP)
    wait_for("the Sweep gone", lambda: k8s.get_or_none(k8s.SWEEPS, ns, SWEEP) is None)
    record = recorded(svc, token, ns, SWEEP, "Sweep")
    assert record["deleted"] is True
    return record


def deleted_build(cluster: Cluster, ns: str, oci: OciRegistry, svc: Service, token: str) -> Any:
    """An Environment whose build fails (pip finds no such package), recorded, deleted."""
    k8s.create(environment(ENV, ns, **recipe(oci, "no-such-package")))
    finish_pod(cluster, ns, running_build_pod(ns), 1, json.dumps({"error": BUILD_ERROR}))
    wait_status(k8s.ENVIRONMENTS, ns, ENV, lambda s: s.get("phase") == "Failed", timeout=60)
    record = recorded(svc, token, ns, ENV, "Environment")
    assert k8s.delete(k8s.ENVIRONMENTS, ns, ENV)
    wait_for("the Environment gone", lambda: k8s.get_or_none(k8s.ENVIRONMENTS, ns, ENV) is None)
    return record


def test_a_deleted_sweep_and_a_deleted_build_show_their_records_in_a_browser(
    cluster: Cluster, namespace: str, recording: tuple[Service, str], oci_registry: OciRegistry
) -> None:
    """Both pages from their records, after the objects are gone (see the module's text)."""
    svc, token = recording
    ns = namespace
    sweep = deleted_sweep(cluster, ns, svc, token)
    build = deleted_build(cluster, ns, oci_registry, svc, token)
    live = source.LiveSource(lambda n: RegistryClient(svc.url, token))
    with browsing(app.make_app(live, namespace=ns)) as (url, page, errors):
        page.goto(url + f"/ns/{ns}/sweeps")
        row = page.locator("table tr", has_text=SWEEP)
        assert "deleted" in row.inner_text()
        page.screenshot(path=str(SHOTS / "gone-sweeps.png"), full_page=True)
        row.get_by_role("link", name=SWEEP).click()
        page.wait_for_url(f"**/ns/{ns}/sweeps/{SWEEP}/records/{sweep['uid']}")
        page.get_by_text("It was deleted before it ended").wait_for()
        trials = page.get_by_role("table", name="Trials, best first")
        t0 = trials.locator("tr", has_text=f"{SWEEP}-t0").inner_text()
        t1 = trials.locator("tr", has_text=f"{SWEEP}-t1").inner_text()
        assert "0.8125" in t0, t0
        assert "Running" in t1 and "0.8125" not in t1, t1
        page.get_by_text(f"best: {SWEEP}-t0 (best_val_acc 0.8125, maximize)").wait_for()
        page.locator("#sweep-chart canvas").wait_for()
        assert page.evaluate(LABELLED) == []
        page.screenshot(path=str(SHOTS / "gone-sweep.png"), full_page=True)

        page.goto(url + f"/ns/{ns}/environments")
        row = page.locator("table tr", has_text=ENV)
        assert "deleted" in row.inner_text() and "Failed" in row.inner_text()
        page.screenshot(path=str(SHOTS / "gone-environments.png"), full_page=True)
        row.get_by_role("link", name=ENV).click()
        page.wait_for_url(f"**/ns/{ns}/environments/{ENV}/records/{build['uid']}")
        page.locator(".head", has_text="Failed").wait_for()
        page.get_by_text("Shown from the record kept when it ended").wait_for()
        log = page.get_by_label("build log", exact=True).inner_text()
        assert "satisfies the requirement no-such-package" in log, log
        assert "no-such-package" in page.locator("#h-spec + pre, section pre").last.inner_text()
        assert page.evaluate(LABELLED) == []
        page.screenshot(path=str(SHOTS / "gone-environment.png"), full_page=True)
        for path in (f"/ns/{ns}/sweeps/{SWEEP}", f"/ns/{ns}/environments/{ENV}"):
            page.goto(url + path)  # by name alone: the newest record
            page.get_by_text("Failed" if ENV in path else f"{SWEEP}-t0").first.wait_for()
        assert errors == []
