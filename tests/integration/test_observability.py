"""What an operator's user watches: Prometheus metrics scraped over HTTP from the
in-process operator, and a Kubernetes Event for every phase change and failure of a
TrainingRun (and of an Environment), on the real control plane with KWOK nodes."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder, environment
from tests.cluster.harness import Cluster
from tests.conftest import InProcessOperator
from tests.integration.helpers import (
    finish_pod,
    launcher_message,
    run_pods,
    sample,
    scrape,
    wait_for,
    wait_status,
)
from torchyard import k8s


@pytest.fixture
def metrics_url(operator: InProcessOperator) -> str:
    return f"http://127.0.0.1:{os.environ['TORCHYARD_METRICS_PORT']}/metrics"


def events(namespace: str, name: str) -> list[dict[str, Any]]:
    found = k8s.list_(k8s.EVENTS, namespace, field_selector=f"involvedObject.name={name}")
    mine = [e for e in found if e.get("reportingComponent") == k8s.FIELD_MANAGER]
    # Timestamps have seconds only; the operator records them one after the other.
    return sorted(mine, key=lambda e: int(e["metadata"]["resourceVersion"]))


def scrape_when(url: str, what: str, check: Any) -> dict[Any, float]:
    """Scrape until ``check(samples)`` holds (the gauge follows the watch, a moment later)."""

    def page() -> dict[Any, float] | None:
        samples = scrape(url)
        return samples if check(samples) else None

    result: dict[Any, float] = wait_for(what, page)
    return result


def test_the_operator_exposes_its_own_memory_and_cpu(metrics_url: str) -> None:
    # prometheus_client's process collector: what a user watches at scale (RSS, CPU).
    page = scrape(metrics_url)
    assert sample(page, "process_resident_memory_bytes") > 10 << 20
    assert sample(page, "process_cpu_seconds_total") > 0
    assert sample(page, "process_open_fds") > 0


def test_metrics_move_while_a_run_goes_from_creation_to_success(
    cluster: Cluster, namespace: str, metrics_url: str
) -> None:
    ns = namespace
    before = scrape(metrics_url)
    k8s.create(environment("pytorch", ns, image="ghcr.io/acme/pytorch:2.15-cuda12"))
    wait_status(k8s.ENVIRONMENTS, ns, "pytorch", lambda s: s.get("phase") == "Ready")
    k8s.create(TrainingRunBuilder("bert", ns).environment("pytorch").nodes(2).pool("cpu").obj())
    wait_status(
        k8s.TRAININGRUNS,
        ns,
        "bert",
        lambda s: s.get("phase") == "Running" and s["nodes"]["running"] == 2,
    )
    running = scrape_when(
        metrics_url,
        "the runs-by-phase gauge to show the run Running",
        lambda m: sample(m, "torchyard_trainingruns", namespace=ns, phase="Running") == 1,
    )
    assert sample(running, "torchyard_pods_created_total", namespace=ns) == 2
    assert sample(running, "torchyard_trainingruns", namespace=ns, phase="Succeeded") == 0
    for pod in run_pods(ns, "bert"):
        finish_pod(cluster, ns, pod["metadata"]["name"], 0)
    wait_status(k8s.TRAININGRUNS, ns, "bert", lambda s: s.get("phase") == "Succeeded")
    after = scrape_when(
        metrics_url,
        "the runs-by-phase gauge to show the run Succeeded",
        lambda m: sample(m, "torchyard_trainingruns", namespace=ns, phase="Succeeded") == 1,
    )

    def moved(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert sample(after, "torchyard_trainingruns", namespace=ns, phase="Running") == 0
    assert moved("torchyard_pods_created_total", namespace=ns) == 2
    assert moved("torchyard_admission_wait_seconds_count") >= 1
    assert moved("torchyard_reconcile_duration_seconds_count", kind="TrainingRun") >= 3
    assert moved("torchyard_reconcile_duration_seconds_count", kind="Environment") >= 1
    assert moved("torchyard_reconcile_duration_seconds_sum", kind="TrainingRun") > 0
    # Cumulative buckets: +Inf holds every observation.
    assert sample(
        after, "torchyard_reconcile_duration_seconds_bucket", kind="TrainingRun", le="+Inf"
    ) == sample(after, "torchyard_reconcile_duration_seconds_count", kind="TrainingRun")


def test_every_phase_change_and_the_failure_are_events(cluster: Cluster, namespace: str) -> None:
    ns = namespace
    k8s.create(environment("pytorch", ns, image="ghcr.io/acme/pytorch:2.15-cuda12"))
    wait_status(k8s.ENVIRONMENTS, ns, "pytorch", lambda s: s.get("phase") == "Ready")
    for name in ("ok", "bad"):
        k8s.create(TrainingRunBuilder(name, ns).environment("pytorch").pool("cpu").obj())
        wait_status(
            k8s.TRAININGRUNS,
            ns,
            name,
            lambda s: s.get("phase") == "Running" and s["nodes"]["running"] == 1,
        )
    finish_pod(cluster, ns, run_pods(ns, "ok")[0]["metadata"]["name"], 0)
    message = launcher_message(0, 0, "RuntimeError: loss is NaN")
    finish_pod(cluster, ns, run_pods(ns, "bad")[0]["metadata"]["name"], 1, message)
    for name, phase in (("ok", "Succeeded"), ("bad", "Failed")):
        wait_status(k8s.TRAININGRUNS, ns, name, lambda s, p=phase: s.get("phase") == p)

    env_events = wait_for("the Environment's event", lambda: events(ns, "pytorch"))
    assert [(e["type"], e["reason"]) for e in env_events] == [("Normal", "Ready")]

    # One Event per phase the run went through, in order, each naming the run.
    def until(name: str, reason: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = wait_for(
            f"the {reason} event of {name}",
            lambda: [e for e in events(ns, name) if e["reason"] == reason] and events(ns, name),
        )
        return found

    ok = until("ok", "Succeeded")
    reasons = [e["reason"] for e in ok]
    assert reasons[-2:] == ["Running", "Succeeded"], reasons
    assert set(reasons) <= {"Pending", "Queued", "Running", "Succeeded"}, reasons
    assert len(reasons) == len(set(reasons)), f"an Event per change, not per reconcile: {reasons}"
    assert all(e["type"] == "Normal" for e in ok)
    assert ok[-1]["message"] == "all 1 node(s) succeeded"
    for e in ok:
        assert e["involvedObject"]["kind"] == "TrainingRun"
        assert e["involvedObject"]["uid"] == k8s.get(k8s.TRAININGRUNS, ns, "ok")["metadata"]["uid"]

    bad = until("bad", "Error")
    assert [(e["type"], e["reason"], e["message"]) for e in bad if e["type"] == "Warning"] == [
        (
            "Warning",
            "Error",
            "rank 0 (node 0) failed (Error, exit code 1): RuntimeError: loss is NaN",
        )
    ]
    assert [e["reason"] for e in bad][-2:] == ["Running", "Error"]
