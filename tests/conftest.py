"""Shared fixtures: tiers are marked by folder; integration tests share one real cluster.

- ``tests/unit/``: marked ``unit``; pure layers.
- ``tests/integration/``: marked ``integration``; the session-wide ``cluster`` fixture
  starts a real control plane (``tests/cluster/harness.py``), ``operator`` runs the
  torchyard operator in-process against it with the chart's RBAC (``operator_client``:
  ``tests/cluster/chart.py``) while the tests stay admin, ``namespace`` gives each test
  its own.
- ``tests/e2e/``: marked ``e2e``; real PyTorch training.
- ``tests/node/``: marked ``node`` in the folder itself; a real kubelet node joins the
  session's cluster (``tests/node/conftest.py``).
- marked ``peers`` (``tests/integration/test_peers.py``): Kubeflow's operators beside the
  control plane (``tests/cluster/peers.py``); deselected unless pytest runs with ``--peers``.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from torchyard import k8s

TIERS = ("unit", "integration", "e2e")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--peers",
        action="store_true",
        help="also run the tests marked `peers`: Kubeflow Trainer, JobSet and Training "
        "Operator built from their Go modules beside the control plane (tests/cluster/peers.py)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
    # The peers' tests need their Go builds: only with --peers (deselected, not skipped).
    if not config.getoption("--peers"):
        peers = [item for item in items if item.get_closest_marker("peers")]
        if peers:
            config.hook.pytest_deselected(items=peers)
            items[:] = [item for item in items if not item.get_closest_marker("peers")]


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """Builds that take minutes the first time, made before any test's timeout starts
    (cached after): a run with ``node`` tests (as root) prepares the real node (Debian
    packages, binaries, images) and, when a test uses it, the Horovod image; a run with
    the Kueue test builds Kueue. On a fresh machine the first test to start the node timed
    out building images (its harness killed), and the Horovod test building its image.
    Returns None: the tests then run as always."""
    if session.config.option.collectonly:
        return
    uses = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    root = os.geteuid() == 0
    if root and any(item.get_closest_marker("node") for item in session.items):
        from tests.cluster import realnode

        realnode.prepare()
    if root and "horovod_env" in uses:  # Horovod built from source: about 10 minutes
        from tests.cluster import horovod_image

        horovod_image.ensure_horovod_image()
    if "operator_client" in uses:  # the chart's RBAC is rendered by helm
        from tests.cluster import binaries

        binaries.build(binaries.TOOLS["helm"])
    if "kueue" in uses:  # Kueue from its Go module
        from tests.cluster import kueue

        kueue.build()


@pytest.fixture(scope="session")
def cluster() -> Iterator[object]:
    from tests.cluster.harness import Cluster, free_port
    from torchyard import k8s

    # The tests reach no registry but their own on loopback: never resolve curated
    # images such as python:3.11-slim against a public registry.
    os.environ["TORCHYARD_RESOLVE_CURATED"] = "127.0.0.1"
    # The in-process operator serves /metrics here (a free port, not 9090).
    os.environ["TORCHYARD_METRICS_PORT"] = str(free_port())
    with Cluster() as c:
        os.environ["KUBECONFIG"] = str(c.kubeconfig)
        k8s.reset()
        print(f"\n[cluster] control plane up in {c.timings['total']:.1f}s ({c.workdir})")
        yield c
    os.environ.pop("KUBECONFIG", None)
    k8s.reset()


class InProcessOperator:
    """The torchyard operator in this process (its own thread and event loop), with
    ``client``'s credentials for all it does (the chart's ServiceAccount: never the
    tests' shared admin client), watching ``namespaces`` (none: every namespace), with
    ``options`` as ``operators.run`` takes them from its command line
    (``log_limit_bytes=...``)."""

    def __init__(self, client: k8s.Client, namespaces: Sequence[str] = (), **options: Any) -> None:
        self.client = client
        self.namespaces = tuple(namespaces)
        self.options = options
        self.thread: threading.Thread | None = None
        self.stop_flag = threading.Event()
        self.memo: Any = None

    def start(self) -> None:
        import kopf

        from torchyard.controller import operators

        self.stop_flag = threading.Event()
        self.memo = kopf.Memo()
        ready = threading.Event()
        self.thread = threading.Thread(
            target=operators.run,
            args=(self.namespaces,),
            kwargs={
                "stop_flag": self.stop_flag,
                "ready_flag": ready,
                "memo": self.memo,
                **self.options,
                "client": self.client,
            },
            name="torchyard-operator",
            daemon=True,
        )
        self.thread.start()
        assert ready.wait(60), "the operator did not start within 60s"

    def caught_up(self, kind: str, namespace: str, name: str, timeout: float = 60) -> str:
        """Wait until this operator's last reconcile of the object saw its current
        resourceVersion and nothing is due for it; returns that version. What a test
        checks before it says that nothing more was written: by ordering, not by
        sleeping (a later write by the operator would need an event it has not had)."""
        from torchyard import k8s

        res = {
            "TrainingRun": k8s.TRAININGRUNS,
            "Environment": k8s.ENVIRONMENTS,
            "Sweep": k8s.SWEEPS,
        }[kind]
        key = (kind, namespace, name)
        deadline = time.monotonic() + timeout
        while True:
            version = str(k8s.get(res, namespace, name)["metadata"]["resourceVersion"])
            queue = getattr(self.memo, "queue", None)
            if queue is not None and queue.caught_up(key, version):
                return version
            assert time.monotonic() < deadline, (
                f"the operator did not catch up with {kind} {namespace}/{name} at "
                f"resourceVersion {version} within {timeout}s (its last reconcile saw "
                f"{queue.seen.get(key) if queue is not None else None})"
            )
            time.sleep(0.05)

    def stop(self) -> None:
        self.stop_flag.set()
        if self.thread is not None:
            self.thread.join(30)
            assert not self.thread.is_alive(), "the operator did not stop within 30s"


@pytest.fixture(scope="session")
def operator_client(cluster: object, tmp_path_factory: pytest.TempPathFactory) -> k8s.Client:
    """The operator's own ``k8s.Client``: a token of the chart's operator ServiceAccount,
    with the chart's RBAC (cluster-wide) applied; every 403 it gets is logged at ERROR,
    which fails the test (``tests/cluster/chart.py``)."""
    from tests.cluster import chart
    from tests.cluster.harness import Cluster

    assert isinstance(cluster, Cluster)
    return chart.operator_client(cluster, tmp_path_factory.mktemp("operator-rbac"))


@pytest.fixture(scope="session")
def operator(operator_client: k8s.Client) -> Iterator[InProcessOperator]:
    op = InProcessOperator(operator_client)
    op.start()
    yield op
    op.stop()


@pytest.fixture(scope="session")
def oci_registry() -> Iterator[object]:
    """A real OCI registry (CNCF distribution) on loopback."""
    from tests.cluster.registry import OciRegistry

    reg = OciRegistry().start()
    yield reg
    reg.stop()


@pytest.fixture
def namespace(cluster: object, request: pytest.FixtureRequest) -> Iterator[str]:
    from tests.cluster.harness import Cluster

    assert isinstance(cluster, Cluster)
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:36].strip("-")
    # A name no other test had (as long as before: a Helm release named after it stays
    # within 53): parametrized tests share their first 36 characters, and a
    # namesake still being deleted refuses every create ("being terminated").
    name = ""
    while not name:
        name = cluster.create_namespace(f"t-{base}-{os.urandom(4).hex()}", fresh=True)
    yield name
    cluster.delete_namespace(name)
