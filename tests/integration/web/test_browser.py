"""The web view in a real browser (Debian's Chromium driven by Playwright) on the real
control plane: every page, with a failed run, a hung run and its stacks (from its
archive in a real registry service), a sweep with stopped trials, a gang that cannot
fit and an endpoint whose canary's init() raised; no console error on any page, every
control labelled, the keyboard reaches them, and a screenshot of each page under
build/web-screenshots/ (git-ignored).

The runs' statuses are written as the operator writes them (the status subresource), with
the in-process operator stopped, so that each page shows a known state. ``make browser``
installs Chromium and Playwright (tests/integration/web/requirements.lock).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders import (
    EndpointBuilder,
    SweepBuilder,
    TrainingRunBuilder,
    environment,
    model_version,
)
from tests.integration.test_registry_service import Service, trainer_token
from tests.integration.web.browser import (
    CHROMIUM,
    FLAGS,
    SHOTS,
    Served,
    held_node_pod,
    playwright,
    watched_page,
)
from tests.unit.web.fakes import endpoint as degraded_endpoint
from torchyard import api, k8s
from torchyard.registry.store import Store
from torchyard.sdk.registry import RegistryClient
from torchyard.web import app, source

SCRIPT = "<img src=x onerror=alert(1)>"
HANG = "Stalled: rank 1 made no progress for 300s, in all_reduce (train.py:42)"


def status(kind: str, namespace: str, name: str, body: dict[str, Any]) -> None:
    k8s.apply_status(
        {
            "apiVersion": api.API_VERSION,
            "kind": kind,
            "metadata": {"name": name, "namespace": namespace},
            "status": body,
        },
        field_manager="torchyard",
    )


def node_pod(namespace: str, run: str, node: int, exit_code: int | None) -> None:
    pod = held_node_pod(namespace, run, node)
    k8s.create(pod)
    if exit_code is not None:
        term = {"exitCode": exit_code, "reason": "Error"}
        cs = {
            "name": "trainer",
            "image": "pytorch",
            "imageID": "",
            "ready": False,
            "restartCount": 2,
            "state": {"terminated": term},
        }
        k8s.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{run}-node-{node}", "namespace": namespace},
                "status": {"phase": "Failed", "containerStatuses": [cs]},
            },
            field_manager="torchyard-test",
            subresource="status",
        )


def trial(state: str, rate: float, history: list[float], reason: str = "") -> str:
    """A trial as the sweep's ledger (its ConfigMap) holds it."""
    entry = {"state": state, "parameters": {"learning_rate": rate}, "reason": reason}
    return json.dumps({**entry, "history": [[i + 1, v] for i, v in enumerate(history)]})


def seed(namespace: str, root: Path) -> None:
    """A failed run, a hung run (its stacks and metrics in its archive), a running and a
    queued one that cannot fit, a sweep with a stopped trial, an Environment, a model."""
    k8s.create(environment("pytorch", namespace, image="ghcr.io/acme/pytorch:2.15"))
    status(
        "Environment",
        namespace,
        "pytorch",
        {"phase": "Ready", "image": "ghcr.io/acme/pytorch@sha256:" + "ab" * 32},
    )
    k8s.create(
        environment(
            "custom",
            namespace,
            baseImage="python:3.11-slim",
            pip=["torch==9"],
            registry={"repository": "registry.example/acme/custom"},
        )
    )
    status(
        "Environment",
        namespace,
        "custom",
        {
            "phase": "Failed",
            "buildJob": "custom-build-1",
            "message": "ERROR: No matching distribution found for torch==9",
        },
    )
    k8s.create(model_version("birds-3", namespace, "birds", 3))
    failed = TrainingRunBuilder("failed-run", namespace).nodes(2).obj()
    failed["metadata"]["labels"] = {"torchyard.dev/experiment": "birds", "note": "x"}
    k8s.create(failed)
    status(
        "TrainingRun",
        namespace,
        "failed-run",
        {
            "phase": "Failed",
            "restarts": 2,
            "failure": {
                "rank": 3,
                "node": 1,
                "exitCode": 1,
                "class": "UserError",
                "advice": "Fix the exception in the training script, then submit again.",
                "message": "Traceback (most recent call last):\n"
                f'  File "train.py", line 7\nValueError: {SCRIPT}',
            },
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "RankFailed",
                    "message": "rank 3 failed",
                    "lastTransitionTime": "2026-11-27T10:05:00Z",
                }
            ],
        },
    )
    node_pod(namespace, "failed-run", 0, 0)
    node_pod(namespace, "failed-run", 1, 1)
    k8s.create(TrainingRunBuilder("hung-run", namespace).nodes(2).obj())
    status(
        "TrainingRun",
        namespace,
        "hung-run",
        {
            "phase": "Failed",
            "failure": {
                "rank": 1,
                "node": 0,
                "reason": "Stalled",
                "class": "Hang",
                "message": HANG,
                "advice": "Look for a rank that skips a collective.",
            },
            "progress": {"step": 1200, "total": 3000, "percent": 40},
        },
    )
    logs = root / "hung-logs"
    (logs / "stacks").mkdir(parents=True)
    (logs / "stacks" / "rank-1.pid-42.txt").write_text(
        'Thread 0x7f (most recent call first):\n  File "train.py", line 42 in all_reduce\n'
    )
    (logs / "metrics.jsonl").write_text(
        "".join(
            f'{{"step": {s}, "loss": {2.0 / (s + 1):.5f}, "rank": 0, "time": {s}}}\n'
            for s in range(5000)
        )
    )
    Store(root / "registry").archive_run(namespace, "hung-run", outputs=None, logs={0: logs})
    k8s.create(TrainingRunBuilder("running-run", namespace).obj())
    status(
        "TrainingRun",
        namespace,
        "running-run",
        {
            "phase": "Running",
            "nodes": {"total": 1, "running": 1, "ready": "1/1"},
            "progress": {"step": 120, "total": 3000, "percent": 4, "eta": "4m10s"},
        },
    )
    k8s.create(TrainingRunBuilder("too-big", namespace).nodes(4).gpus(8).pool("a100").obj())
    status(
        "TrainingRun",
        namespace,
        "too-big",
        {
            "phase": "Queued",
            "queue": {"pool": "a100", "position": 1},
            "conditions": [
                {
                    "type": "Admitted",
                    "status": "False",
                    "reason": "Queued",
                    "message": "needs 4 x (8 GPU); the pool cannot hold it even when idle "
                    "(0 matching node(s))",
                    "lastTransitionTime": "2026-11-27T10:00:00Z",
                }
            ],
        },
    )
    # an endpoint in a canary split whose new version's init() raised (markup in its error)
    k8s.create(EndpointBuilder("birds", namespace).model("birds", 3).traffic(v2=50, v3=50).obj())
    status("OnlineEndpoint", namespace, "birds", degraded_endpoint("birds", namespace)["status"])
    sweep = SweepBuilder("lr-sweep", namespace).objective("loss", "minimize").bandit(0.1).obj()
    k8s.create(sweep)
    k8s.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "lr-sweep-trials", "namespace": namespace},
            "data": {
                "t0": trial("Completed", 0.001, [0.9, 0.5, 0.3]),
                "t1": trial("Stopped", 0.004, [1.2, 0.8], reason="bandit: 0.8 outside 0.33"),
                "t2": trial("Running", 0.002, [0.95]),
                "t3": trial("Paused", 0.003, [1.0, 0.7], reason="asha: rung 2"),
            },
        }
    )
    status(
        "Sweep",
        namespace,
        "lr-sweep",
        {
            "phase": "Running",
            "trials": {"planned": 8, "created": 3, "running": 1, "completed": 1, "stopped": 1},
        },
    )


@pytest.fixture
def served(namespace: str, cluster: Any, stopped_operator: None, tmp_path: Path) -> Iterator[str]:
    seed(namespace, tmp_path)
    registry = Service(tmp_path / "registry")
    token = trainer_token(namespace)
    server = Served(
        app.make_app(
            source.LiveSource(lambda ns: RegistryClient(registry.url, token)), namespace=namespace
        )
    )
    yield server.url
    server.stop()
    registry.stop()


LABELLED = """() => [...document.querySelectorAll(
    'input:not([type=hidden]), select, button, textarea')]
  .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                && !(el.tagName === 'BUTTON' && el.textContent.trim()))
  .map(el => el.outerHTML)"""


def pages(ns: str) -> list[tuple[str, str, str]]:
    """(screenshot name, path, what the page must show)."""
    return [
        ("runs", f"/ns/{ns}/runs", "failed-run"),
        (
            "runs-filtered",
            f"/ns/{ns}/runs?phase=Failed&experiment=birds&label=note%3Dx",
            "1 of 1 run(s)",
        ),
        ("run-failed", f"/ns/{ns}/runs/failed-run", "UserError"),
        ("run-hung", f"/ns/{ns}/runs/hung-run", "rank-1.pid-42.txt"),
        ("run-running", f"/ns/{ns}/runs/running-run", "ETA"),
        ("run-queued", f"/ns/{ns}/runs/too-big", "cannot hold it even when idle"),
        ("sweeps", f"/ns/{ns}/sweeps", "lr-sweep"),
        ("sweep", f"/ns/{ns}/sweeps/lr-sweep", "asha: rung 2"),
        ("models", f"/ns/{ns}/models", "model.pt sha256:aaaaaaaaaaaa"),
        ("environments", f"/ns/{ns}/environments", "sha256:abab"),
        ("environment", f"/ns/{ns}/environments/pytorch", "Build log"),
        ("environment-failed", f"/ns/{ns}/environments/custom", "No matching distribution"),
        ("endpoints", f"/ns/{ns}/endpoints", f"http://birds.{ns}.svc/score"),
        ("endpoint", f"/ns/{ns}/endpoints/birds", "InitFailed"),
        ("queue", f"/ns/{ns}/queue", "cannot hold it even when idle"),
        ("refused", f"/ns/{ns}/runs?size=100000", "size must be a whole number"),
    ]


def test_every_page_in_a_real_browser(served: str, namespace: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page, errors = watched_page(browser, viewport={"width": 1280, "height": 900})
        for shot, where, shows in pages(namespace):
            page.goto(served + where)
            # "load", not "networkidle": a run page polls its log tail every 500 ms, so the
            # network is idle for 500 ms only when the machine is quick enough
            page.wait_for_load_state("load")
            page.get_by_text(shows).first.wait_for()
            if shot == "refused":  # the refusal is the page; its 400 is the only console line
                errors[:] = [e for e in errors if "400" not in e]
            assert page.evaluate(LABELLED) == [], shot
            page.screenshot(path=str(SHOTS / f"{shot}.png"), full_page=True)
            assert errors == [], f"{shot}: {errors}"
        page.goto(served + f"/ns/{namespace}/runs/hung-run")
        page.locator("figure.chart canvas").first.wait_for()  # the chart of the archive's loss
        assert (
            "2000 of 5000 points shown"
            in page.locator("#h-metrics + figure, figure.chart").first.inner_text()
        )
        browser.close()


def test_the_keyboard_reaches_the_skip_link_the_sections_and_the_filters(
    served: str, namespace: str
) -> None:
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page()
        page.goto(served + f"/ns/{namespace}/runs")
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.textContent") == "Skip to content"
        seen = []
        for _ in range(20):
            page.keyboard.press("Tab")
            seen.append(
                page.evaluate("document.activeElement.id || document.activeElement.textContent")
            )
        for wanted in ("Runs", "Sweeps", "Queue", "ns-input", "f-phase", "f-experiment", "f-label"):
            assert wanted in seen, seen
        page.focus("#f-phase")
        page.select_option("#f-phase", "Failed")
        page.focus("#f-size")
        page.keyboard.press("Enter")  # submits the filter form
        page.wait_for_url("**phase=Failed**")
        assert "failed-run" in page.content() and "running-run" not in page.content()
        browser.close()


def test_phases_refresh_on_the_page_without_a_reload(served: str, namespace: str) -> None:
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        runs_page, run_page = browser.new_page(), browser.new_page()
        runs_page.goto(served + f"/ns/{namespace}/runs")
        run_page.goto(served + f"/ns/{namespace}/runs/running-run")
        for page in (runs_page, run_page):
            badge = page.locator('[data-phase="running-run"] .badge')
            assert badge.inner_text() == "Running"
        status("TrainingRun", namespace, "running-run", {"phase": "Succeeded"})
        for page in (runs_page, run_page):
            badge = page.locator('[data-phase="running-run"] .badge')
            badge.filter(has_text="Succeeded").wait_for(timeout=30_000)
            assert "ok" in (badge.get_attribute("class") or "")
        browser.close()
