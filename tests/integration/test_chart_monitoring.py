"""The chart's monitoring parts against Helm itself and the real components: the Grafana
dashboard ConfigMap (``metrics.dashboard``) and the Prometheus Operator ServiceMonitors
(``metrics.serviceMonitor``) render only when asked, select the Services the chart
renders, and every metric the dashboard queries is one that the in-process operator's or
a registry service's ``/metrics`` really exposes (a typo in a query fails here)."""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import binaries
from tests.cluster.chart import CHART, Helm
from tests.cluster.harness import Cluster
from tests.conftest import InProcessOperator
from tests.integration.test_registry_service import Service

DASHBOARD = CHART / "dashboards" / "torchyard.json"
MONITORING = ["--api-versions", "monitoring.coreos.com/v1"]
# PromQL words that are not metric names (functions are followed by "(" and left out).
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or"}
KEYWORDS |= {"unless", "bool", "offset", "inf", "nan"}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Helm]:
    binaries.build(binaries.TOOLS["helm"])
    yield Helm(tmp_path_factory.mktemp("helm"))


def kinds(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def queries(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers outside label matchers,
    ranges, strings and by/without/on/ignoring lists, not called like functions."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", expr):  # not 5m
        rest = expr[match.end() :].lstrip()
        if rest.startswith("(") or match.group() in KEYWORDS:
            continue
        names.add(match.group())
    return names


def exposed_names(text: str) -> set[str]:
    """Every series name a Prometheus scraping this text-format page stores, labelled
    families with no series yet included (a histogram's _bucket, _sum and _count)."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
            names.update(name + suffix for suffix in suffixes)
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


# -- without a cluster -------------------------------------------------------------------


def test_the_metric_name_parser_finds_names_and_skips_the_rest() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, kind) (rate(a_bucket{kind="x",y=~"b|c"}[5m])))'
        " / on(job) group_left b_total or vector(0) + c offset 5m"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}


def test_monitoring_is_off_by_default(helm: Helm) -> None:
    docs = helm.template(*MONITORING)
    assert "t-torchyard-dashboard" not in kinds(docs, "ConfigMap")
    assert not kinds(docs, "ServiceMonitor")


def test_the_dashboard_configmap_carries_the_json_with_the_sidecar_label(helm: Helm) -> None:
    docs = helm.template(
        "--set", "metrics.dashboard.enabled=true", "--set", "metrics.dashboard.namespace=grafana"
    )
    configmap = kinds(docs, "ConfigMap")["t-torchyard-dashboard"]
    assert configmap["metadata"]["namespace"] == "grafana"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["torchyard.json"])
    assert dashboard == json.loads(DASHBOARD.read_text())
    titles = [p["title"] for p in dashboard["panels"]]
    for wanted in ("TrainingRuns by phase", "Reconcile latency", "Admission wait"):
        assert wanted in titles
    read = set().union(*(metric_names(q) for q in queries(dashboard)))
    for metric in (
        "torchyard_trainingruns",
        "torchyard_reconcile_duration_seconds_bucket",
        "torchyard_admission_wait_seconds_bucket",
        "torchyard_pods_created_total",
        "process_resident_memory_bytes",
        "torchyard_registry_received_bytes_total",
        "torchyard_registry_sent_bytes_total",
    ):
        assert metric in read, metric
    # Every panel queries the datasource the user picks.
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {"${datasource}"}


def test_service_monitors_select_the_operator_and_registry_services(helm: Helm) -> None:
    docs = helm.template(
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.serviceMonitor.labels.release=kube-prometheus-stack",
        *MONITORING,
    )
    monitors = kinds(docs, "ServiceMonitor")
    assert sorted(monitors) == ["t-torchyard-operator", "t-torchyard-registry"]
    services = kinds(docs, "Service")
    secrets = kinds(docs, "Secret")
    for monitor in monitors.values():
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        spec = monitor["spec"]
        wanted = spec["selector"]["matchLabels"]
        selected = [
            s for s in services.values() if wanted.items() <= s["metadata"]["labels"].items()
        ]
        assert len(selected) == 1, (monitor["metadata"]["name"], wanted)
        ports = {p["name"] for p in selected[0]["spec"]["ports"]}
        (endpoint,) = spec["endpoints"]
        assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
        assert endpoint["interval"] == "30s"
        assert spec["namespaceSelector"]["matchNames"] == ["torchyard-system"]
        assert spec["targetLabels"] == ["app.kubernetes.io/component"]
    registry = monitors["t-torchyard-registry"]["spec"]["endpoints"][0]
    assert registry["scheme"] == "https"
    ca = registry["tlsConfig"]["ca"]["secret"]
    assert ca["key"] == "ca.crt" and ca["key"] in secrets[ca["name"]]["data"]
    assert registry["tlsConfig"]["serverName"] == "torchyard-registry.torchyard-system.svc"

    plain = kinds(
        helm.template(
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "registry.tls.enabled=false",
            *MONITORING,
        ),
        "ServiceMonitor",
    )["t-torchyard-registry"]["spec"]["endpoints"][0]
    assert (plain["port"], plain["scheme"], "tlsConfig" in plain) == ("http", "http", False)


def test_a_service_monitor_without_the_prometheus_operator_fails_with_advice(helm: Helm) -> None:
    result = helm(
        "template", "t", str(CHART), "--set", "metrics.serviceMonitor.enabled=true", check=False
    )
    assert result.returncode != 0
    assert "needs the Prometheus Operator (API monitoring.coreos.com/v1)" in result.stderr
    assert "metrics.serviceMonitor.enabled=false" in result.stderr


def test_a_bad_scrape_interval_fails_with_a_schema_error(helm: Helm) -> None:
    result = helm(
        "template", "t", str(CHART), "--set", "metrics.serviceMonitor.interval=often", check=False
    )
    assert result.returncode != 0
    assert "/metrics/serviceMonitor/interval" in result.stderr, result.stderr


# -- against the real components ---------------------------------------------------------


def test_every_metric_the_dashboard_queries_is_exposed(
    cluster: Cluster, operator: InProcessOperator, tmp_path: Path
) -> None:
    operator_page = page(f"http://127.0.0.1:{os.environ['TORCHYARD_METRICS_PORT']}/metrics")
    registry = Service(tmp_path / "registry")
    try:
        registry_page = page(f"{registry.url}/metrics")
    finally:
        registry.stop()
    exposed = exposed_names(operator_page) | exposed_names(registry_page)
    assert "torchyard_reconcile_duration_seconds_bucket" in exposed_names(operator_page)
    assert "torchyard_registry_sent_bytes_total" in exposed_names(registry_page)
    for expr in queries(json.loads(DASHBOARD.read_text())):
        missing = metric_names(expr) - exposed
        assert not missing, f"the dashboard queries {missing}, which nothing exposes: {expr}"


def test_the_dashboard_configmap_is_accepted_by_a_server_side_dry_run(
    helm: Helm, cluster: Cluster, namespace: str
) -> None:
    rendered = helm(
        "template",
        "t",
        str(CHART),
        "-n",
        namespace,
        "--set",
        "metrics.dashboard.enabled=true",
        "--show-only",
        "templates/monitoring.yaml",
    )
    out = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered.stdout)
    assert "configmap/t-torchyard-dashboard created (server dry run)" in out
