"""A control plane, the real kubelet node and an in-process operator (as the chart's
ServiceAccount, ``chart.operator_client``), for the benchmarks that run real Pods
(benchmarks/real_launch.py, survive.py, why.py, serving.py).

:func:`operator_on_real_node` starts them in that order, yields the cluster and the node
once a namespace exists, and stops everything in reverse order on the way out, also when
the process gets SIGTERM (it unwinds like Ctrl-C, so no node is left behind). The tests
have their own fixtures (tests/node/conftest.py); this is the same set-up for a script.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator

from tests.cluster import chart
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.conftest import InProcessOperator
from torchyard import k8s


def _interrupted(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def operator_on_real_node(
    namespace: str, settings: Callable[[Cluster, RealNode], dict[str, str]] | None = None
) -> Iterator[tuple[Cluster, RealNode]]:
    """Control plane, real node, ``namespace``, operator; all stopped on exit.
    ``settings``: what the operator's environment gets once the node and the namespace
    are there (its init image, a registry service's URL; benchmarks/serving.py)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):  # unwind (stop the node) like Ctrl-C
        signal.signal(sig, _interrupted)
    # Reach no registry but the local one; an in-process operator serves no /metrics.
    os.environ["TORCHYARD_RESOLVE_CURATED"] = "127.0.0.1"
    os.environ.setdefault("TORCHYARD_METRICS_PORT", "0")
    cluster = Cluster()
    node: RealNode | None = None
    op: InProcessOperator | None = None
    try:
        cluster.start()
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        k8s.reset()
        node = RealNode(cluster).start()
        cluster.create_namespace(namespace)
        if settings is not None:
            os.environ.update(settings(cluster, node))
        op = InProcessOperator(chart.operator_client(cluster, cluster.workdir / "operator-rbac"))
        op.start()
        yield cluster, node
    finally:
        if op is not None:
            op.stop()
        if node is not None:
            node.stop()
        cluster.stop()
