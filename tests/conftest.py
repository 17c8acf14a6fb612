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
    _later_builds_last(items)


PLACEMENT_SMOKE = "::test_the_benchmark_runs_at_its_smallest_size[placement.py]"


def _needs(item: pytest.Item) -> list[str]:
    """What ``item`` needs made (``tests/cluster/needs.py``): by its fixtures, the real
    node for every ``node`` test (test_harness.py starts one as a process of its own), and
    Kueue for the placement benchmark's smoke run."""
    from tests.cluster import needs

    fixtures = list(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("node"):
        fixtures.append("real_node")
    if item.nodeid.endswith(PLACEMENT_SMOKE):  # benchmarks/placement.py starts Kueue
        fixtures.append("kueue")
    return needs.of(fixtures)


def _later_builds_last(items: list[pytest.Item]) -> None:
    """Within each tier's folder, the modules with a test that needs a later build
    (SeaweedFS, Kueue, syft, the Horovod image) after the others, in the order
    ``make test`` builds them; the same order on every run (pytest-xdist's workers must
    agree on it), whatever is already made."""
    from tests.cluster import needs

    order = list(needs.NEEDS)
    late: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        ranks = [order.index(n) for n in _needs(item) if n not in needs.FIRST]
        late[module] = max([late.get(module, 0), *ranks])

    def tier(module: str) -> str:  # tests/<tier>/...: the folder below tests/
        return "/".join(module.split("/")[:2])

    folder = {f: i for i, f in enumerate(dict.fromkeys(tier(m) for m in late))}
    position = {id(item): i for i, item in enumerate(items)}

    def key(item: pytest.Item) -> tuple[int, int, int]:
        module = item.nodeid.split("::", 1)[0]
        return (folder[tier(module)], late[module], position[id(item)])

    items.sort(key=key)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """What takes minutes to build the first time is made before any test's timeout starts
    (``tests/cluster/needs.py``; cached after): the control plane's tools and the real
    node (as root: Debian packages, its tools, images) before the first test, when a test
    of the run needs them. Returns None: the tests then run as always."""
    if session.config.option.collectonly:
        return
    from tests.cluster import needs

    first = {n for item in session.items for n in _needs(item) if n in needs.FIRST}
    needs.ensure(n for n in needs.NEEDS if n in first)


@pytest.hookimpl(tryfirst=True, wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """A later build a test needs (SeaweedFS, Kueue, syft, the Horovod image), made or
    waited for before the test's timeout starts (pytest-timeout's window is inside)."""
    from tests.cluster import needs

    needs.ensure(_needs(item))
    return (yield)


@pytest.fixture(scope="session")
def seaweedfs() -> Path:
    """SeaweedFS's ``weed``, for ``tests.cluster.s3.running`` (built before the test)."""
    from tests.cluster import binaries

    return binaries.build(binaries.TOOLS["seaweedfs"], log=False) / "weed"


@pytest.fixture(scope="session")
def syft() -> Path:
    """syft, which ``tests.cluster.release`` runs for an image's SBOM (built before the test)."""
    from tests.cluster import binaries

    return binaries.build(binaries.TOOLS["syft"], log=False) / "syft"


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
