"""Fixtures of the ``node`` tier: a REAL kubelet node beside the session's control plane.

``real_node`` starts ``tests.cluster.realnode.RealNode`` once per session next to the
``cluster`` fixture (tests/conftest.py) and, when the session ends, stops it and fails
the session's last test teardown if anything was left on the host.

These tests need root, and the first run installs Debian packages, builds kubelet,
kube-proxy, CoreDNS and crictl and makes the images (about 5 minutes on 2 cores after the
control plane's build; cached after). ``make test`` runs them after the other tiers (pytest
collects ``tests/node`` after ``tests/integration``, so the real node joins only once the
KWOK-only tests are done); ``make node`` runs them alone. Helpers for the tests are in
``tests/node/helpers.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.node.helpers import Pods


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
