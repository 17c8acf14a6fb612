"""The torchyard image carries what its metrics need: ``prometheus_client`` (a dependency
of the package since the operator and the registry service expose their metrics through
it) installed from the wheel, so ``torchyard.metrics`` renders the process's own RSS and
CPU and speaks OpenMetrics inside a restricted Pod on the real node."""

from __future__ import annotations

import textwrap

import pytest

from tests.cluster.realnode import RealNode
from tests.node.helpers import Pods
from tests.node.test_images import logs, restricted_pod
from tests.node.test_real_node import on_real_node

pytestmark = pytest.mark.node

RENDER = textwrap.dedent(
    """\
    from torchyard import metrics
    registry = metrics.Registry()
    registry.counter("torchyard_pods_created_total", "Pods.", ["namespace"]).inc(namespace="a")
    print(registry.render("application/openmetrics-text; version=1.0.0"), end="")
    """
)


def test_the_image_renders_process_metrics_and_openmetrics(pods: Pods, real_node: RealNode) -> None:
    image = real_node.images["torchyard"].ref
    render = {"name": "render", "image": image, "command": ["python3", "-c", RENDER]}
    pods.create(restricted_pod(pods, "metrics", [render]))
    pod = pods.finished("metrics")
    on_real_node(pod, real_node)
    assert pod["status"]["phase"] == "Succeeded", pods.explain("metrics")
    lines = logs(pods, "metrics", "render").splitlines()
    samples = dict(line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))
    assert float(samples["process_resident_memory_bytes"]) > 1 << 20  # the container's RSS
    assert float(samples["process_cpu_seconds_total"]) > 0
    assert float(samples['torchyard_pods_created_total{namespace="a"}']) == 1.0
    assert lines[-1] == "# EOF"
