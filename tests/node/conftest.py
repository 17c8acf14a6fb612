"""Fixtures of the ``node`` tier: a REAL kubelet node beside the session's control plane.

``real_node`` starts ``tests.cluster.realnode.RealNode`` once per session next to the
``cluster`` fixture (tests/conftest.py) and, when the session ends, stops it and fails
the session's last test teardown if anything was left on the host.

These tests need root, and the first run installs Debian packages, builds kubelet,
kube-proxy, CoreDNS and crictl and makes the images (about 5 minutes on 2 cores after the
control plane's build; cached after). ``make test`` runs them after the other tiers (pytest
collects ``tests/node`` after ``tests/integration``, so the real node joins only once the
KWOK-only tests are done); ``make node`` runs them alone. Helpers for the tests are in
``tests/node/helpers.py`` (Pods) and ``tests/node/runs.py`` (TrainingRuns).

The fixtures of the TrainingRun tests: ``real_operator`` (the in-process operator whose
build Jobs' init containers run the torchyard image made here, once per module), ``env``
(the curated Environment ``pytorch``), ``registry`` (the registry service behind a
Service of the namespace), ``only_real_node`` (the KWOK nodes cordoned: Pods without a node
selector, as build and fetch Jobs are, go to the real node) and ``cache_class`` (a volume
for the namespace's inputs cache).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.builders import environment
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.conftest import InProcessOperator
from tests.integration.conftest import _host_address, stand_in_service
from tests.integration.helpers import host_volume, wait_status
from tests.integration.test_registry_service import Service
from tests.node.helpers import Pods
from tests.node.runs import operator_with
from torchyard import k8s


@pytest.fixture(scope="session")
def real_node(cluster: Cluster) -> Iterator[RealNode]:
    node = RealNode(cluster).start()
    print(f"\n[node] timings: {', '.join(f'{k} {v:.1f}s' for k, v in node.timings.items())}")
    yield node
    node.stop()
    left = node.leftovers()
    assert not left, f"the real node left on the host: {left}"


@pytest.fixture
def pods(cluster: Cluster, real_node: RealNode, namespace: str) -> Pods:
    """Pods in the test's own namespace, pinned to the real node."""
    return Pods(cluster, real_node, namespace)


@pytest.fixture(scope="module")
def real_operator(operator: InProcessOperator, real_node: RealNode) -> Iterator[RealNode]:
    """The operator whose Environment builds' init containers run in the torchyard image
    made here (node Pods need no torchyard image: their launcher is a ConfigMap's)."""
    with operator_with(operator, TORCHYARD_INIT_IMAGE=real_node.images["torchyard"].ref):
        yield real_node


@pytest.fixture
def env(namespace: str, real_operator: RealNode) -> str:
    """A curated Environment ``pytorch`` whose image is the CPU PyTorch image."""
    image = real_operator.images["pytorch"].ref
    k8s.create(environment("pytorch", namespace, image=image))
    wait_status(k8s.ENVIRONMENTS, namespace, "pytorch", lambda s: s.get("phase") == "Ready")
    return namespace


@pytest.fixture
def registry(
    namespace: str, cluster: Cluster, real_node: RealNode, tmp_path: Path
) -> Iterator[tuple[Service, str, str]]:
    """The registry service on this machine behind a Service ``torchyard-registry:8080``
    of the namespace (Endpoints: this machine's non-loopback address). Yields the service,
    the URL the operator and the node Pods use (the Service's ClusterIP, routed by
    kube-proxy) and the --registry-service reference of the CLI (the apiserver's proxy)."""
    address = _host_address()
    svc = Service(tmp_path / "registry", host=address)
    try:
        ref = stand_in_service(cluster, namespace, address, svc.port)
        ip = k8s.get(k8s.SERVICES, namespace, "torchyard-registry")["spec"]["clusterIP"]
        real_node.wait_for(
            "kube-proxy's rules for the registry Service",
            lambda: _proxied(ip, 8080, f"{address}:{svc.port}"),
            timeout=30,
        )
        yield svc, f"http://{ip}:8080", ref
    finally:
        svc.stop()


def _proxied(cluster_ip: str, port: int, endpoint: str) -> bool:
    rules = subprocess.run(
        ["iptables-save", "-t", "nat"], capture_output=True, text=True, check=True
    ).stdout
    return f"-d {cluster_ip}/32" in rules and f"--to-destination {endpoint}" in rules


@pytest.fixture
def only_real_node(cluster: Cluster, real_operator: RealNode) -> Iterator[RealNode]:
    """The KWOK nodes cordoned for the test (uncordoned after): Pods without a node
    selector, as build Jobs are, can only go to the real node."""
    kwok = [
        n["metadata"]["name"]
        for n in k8s.list_(k8s.NODES)
        if n["metadata"]["name"] != real_operator.name and not n["spec"].get("unschedulable")
    ]
    for name in kwok:
        cluster.kubectl("cordon", name)
    try:
        yield real_operator
    finally:
        for name in kwok:
            cluster.kubectl("uncordon", name, check=False)


@pytest.fixture
def cache_class(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A volume for the namespace's inputs cache: a host folder the fetcher (user 65532)
    may write, as a storage class of its own."""
    name = f"inputs-{namespace}"[:63]
    folder = Path("/tmp") / name
    folder.mkdir()
    folder.chmod(0o777)
    host_volume(cluster, name, str(folder))
    yield name
    cluster.kubectl("delete", "pv", name, "--wait=false", check=False)
    shutil.rmtree(folder, ignore_errors=True)
