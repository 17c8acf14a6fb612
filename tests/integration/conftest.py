"""Fixtures of the integration tests that several modules share, and the guard that fails
a test when the in-process operator logs an error during it (``operator_errors``)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.builders import environment
from tests.cluster.harness import Cluster
from tests.cluster.racks import Racks
from tests.conftest import InProcessOperator
from tests.integration import operator_errors
from tests.integration.helpers import wait_status
from tests.integration.test_registry_service import Service, trainer_token
from torchyard import k8s

GUARD = operator_errors.Guard()
INTEGRATION = Path(__file__).parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "expected_operator_errors(*patterns, reason): errors of the in-process operator this "
        "test makes on purpose (regular expressions searched in the logger, message and "
        "traceback); any other ERROR it logs during the test fails the test",
    )
    GUARD.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    GUARD.uninstall()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Every test (of any tier: this hook sees them all) opens its window of the guard;
    only integration tests keep records."""
    inside = Path(str(item.fspath)).is_relative_to(INTEGRATION)
    GUARD.begin(item.nodeid if inside else None)
    yield


@pytest.fixture(autouse=True)
def operator_errors_fail_the_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Set up first, so torn down last: what the test's own teardown (its namespace
    deleted) makes the operator log is still the test's."""
    yield
    patterns: list[str] = []
    for marker in request.node.iter_markers("expected_operator_errors"):
        assert marker.kwargs.get("reason"), "expected_operator_errors needs a reason="
        patterns += marker.args
    found = GUARD.check(patterns)
    if found:
        pytest.fail(operator_errors.failure(request.node.nodeid, found), pytrace=False)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    GUARD.begin(None)  # the last test's window is over
    if GUARD.late:
        terminalreporter.section("operator errors logged after their test ended", red=True)
        for window, record in GUARD.late:
            terminalreporter.write_line(f"after {window.test}:\n{operator_errors.shown(record)}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    GUARD.begin(None)
    if GUARD.late and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@dataclass
class ProxiedRegistry:
    """The registry service behind a Service the apiserver proxies to; ``token`` is the
    ``trainer`` ServiceAccount's (create/get on modelversions in the namespace)."""

    service: Service
    ref: str  # http:NS/NAME:PORT for --registry-service (this stand-in has no TLS)
    token: str


def _host_address() -> str:
    """An address of this machine the apiserver may proxy to (it refuses loopback)."""

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route's source
        address: str = s.getsockname()[0]
    assert not address.startswith("127."), "these tests need a non-loopback IPv4 address"
    return address


def stand_in_service(
    cluster: Cluster, namespace: str, address: str, port: int, scheme: str = "http"
) -> str:
    """A Service ``torchyard-registry:8080`` in ``namespace`` whose endpoint is
    ``address:port`` on this machine, as the chart runs the registry; the apiserver's
    service proxy reaches it over ``scheme``. Returns NS/NAME:PORT for --registry-service,
    with ``http:`` in front for a plain one."""
    # The apiserver proxies only to an endpoint that is a Pod's IP: a stand-in registry
    # Pod (held back from scheduling, so KWOK leaves it alone) carries this machine's.
    apply = functools.partial(cluster.kubectl, "apply", "-f", "-")
    apply(
        input=f"""
apiVersion: v1
kind: Pod
metadata: {{name: torchyard-registry-0, namespace: {namespace}}}
spec:
  schedulingGates: [{{name: torchyard.dev/test-stand-in}}]
  containers: [{{name: registry, image: torchyard}}]
---
apiVersion: v1
kind: Service
metadata: {{name: torchyard-registry, namespace: {namespace}}}
spec:
  ports: [{{name: {scheme}, port: 8080, targetPort: {port}}}]
""",
    )
    cluster.kubectl(
        "patch",
        "pod",
        "torchyard-registry-0",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"podIP": address, "podIPs": [{"ip": address}]}}),
    )
    apply(
        input=f"""
apiVersion: v1
kind: Endpoints
metadata: {{name: torchyard-registry, namespace: {namespace}}}
subsets:
- addresses:
  - ip: "{address}"
    targetRef: {{kind: Pod, name: torchyard-registry-0, namespace: {namespace}}}
  ports: [{{name: {scheme}, port: {port}}}]
""",
    )
    proxy = f"{k8s.proxy_url(namespace, 'torchyard-registry', 8080, scheme=scheme)}/healthz"
    cluster.wait_for("the service proxy", lambda: cluster.request("GET", proxy)[0] == 200, 20)
    return f"{'http:' if scheme == 'http' else ''}{namespace}/torchyard-registry:8080"


@pytest.fixture
def env(namespace: str, operator: InProcessOperator) -> str:
    """``namespace`` with the in-process operator running and a curated Environment
    ``pytorch`` Ready in it: what a TrainingRun test needs before its run."""
    k8s.create(environment("pytorch", namespace, image="ghcr.io/acme/pytorch:2.15-cuda12"))
    wait_status(k8s.ENVIRONMENTS, namespace, "pytorch", lambda s: s.get("phase") == "Ready")
    return namespace


@pytest.fixture
def racks(cluster: Cluster) -> Iterator[Racks]:
    """16 KWOK nodes of 8 GPUs in a pool of the test's own: 2 blocks x 2 racks x 4 nodes,
    labelled by block, rack and host (tests/cluster/racks.py)."""
    r = Racks(f"rk{time.monotonic_ns() % 10**8}", blocks=2, racks_per_block=2)
    r.create(cluster)
    yield r
    r.delete(cluster)


@pytest.fixture
def behind_apiserver(
    tmp_path: Path, namespace: str, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ProxiedRegistry]:
    """The registry as the chart runs it: a Service the CLI reaches through the apiserver's
    service proxy (here the Service's endpoint is this machine, where the process runs)."""
    monkeypatch.delenv("TORCHYARD_REGISTRY_URL", raising=False)
    address = _host_address()
    svc = Service(tmp_path / "registry", host=address)
    token = trainer_token(namespace)
    ref = stand_in_service(cluster, namespace, address, svc.port)
    yield ProxiedRegistry(svc, ref, token)
    svc.stop()


@contextlib.contextmanager
def operator_archiving_to(
    operator: InProcessOperator, url: str, token: str, tmp_path: Path
) -> Iterator[None]:
    """The in-process operator restarted to archive to the registry service at ``url``
    (showing it ``token`` when it promotes), and restarted plainly afterwards."""
    token_file = tmp_path / "operator-token"
    token_file.write_text(token)
    operator.stop()
    os.environ["TORCHYARD_REGISTRY_URL"] = url
    os.environ["TORCHYARD_REGISTRY_TOKEN_FILE"] = str(token_file)
    operator.start()
    try:
        yield
    finally:
        operator.stop()
        os.environ.pop("TORCHYARD_REGISTRY_URL")
        os.environ.pop("TORCHYARD_REGISTRY_TOKEN_FILE")
        operator.start()


@contextlib.contextmanager
def operator_instead(
    operator: InProcessOperator, namespaces: Sequence[str] = (), **options: Any
) -> Iterator[InProcessOperator]:
    """The session's operator stopped; another, watching ``namespaces`` with ``options``
    (``InProcessOperator``), runs instead, and the session's again after."""
    operator.stop()
    other = InProcessOperator(operator.client, namespaces, **options)
    other.start()
    try:
        yield other
    finally:
        other.stop()
        operator.start()


@pytest.fixture
def stopped_operator(operator: InProcessOperator) -> Iterator[None]:
    """The in-process (admin) operator stopped for the test, started again after."""
    operator.stop()
    try:
        yield
    finally:
        operator.start()
