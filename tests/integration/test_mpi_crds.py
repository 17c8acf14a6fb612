"""``distribution.type: mpi`` on a real apiserver: an MPI run is accepted with its
defaults, and what does not combine with MPI is refused with a message saying what to do
(the CEL rules of ``torchyard.api.trainingruns.MPI_RULES``; the models refuse the same)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from tests.cluster.harness import Cluster
from tests.integration.helpers import refused_by_both
from torchyard import k8s


def mpi_run(name: str) -> TrainingRunBuilder:
    return TrainingRunBuilder(name).with_("spec.distribution.type", "mpi").nodes(2).procs(2)


REJECTED: list[tuple[str, dict[str, Any], str]] = [
    (
        "mpich",
        mpi_run("mpich").with_("spec.distribution.implementation", "mpich").obj(),
        "only 'openmpi' is supported",
    ),
    (
        "implementation without mpi",
        TrainingRunBuilder("impl").with_("spec.distribution.implementation", "openmpi").obj(),
        "distribution.implementation applies to type mpi only",
    ),
    (
        "mpirunArgs without mpi",
        TrainingRunBuilder("args").with_("spec.distribution.mpirunArgs", ["-v"]).obj(),
        "distribution.mpirunArgs applies to type mpi only",
    ),
    (
        "launch node",
        mpi_run("node").launch("node").obj(),
        "distribution.launch 'node' does not combine with type mpi",
    ),
    (
        "last port",
        mpi_run("port").master_port(65535).obj(),
        "masterPort must be at most 65534",
    ),
]


@pytest.mark.parametrize(("case", "body", "message"), REJECTED, ids=[c[0] for c in REJECTED])
def test_mpi_combinations_are_refused_with_what_to_do(
    cluster: Cluster, namespace: str, case: str, body: dict[str, Any], message: str
) -> None:
    refused_by_both(namespace, body, message)


def test_an_mpi_run_is_accepted(cluster: Cluster, namespace: str) -> None:
    body = (
        mpi_run("horovod")
        .with_("spec.distribution.implementation", "openmpi")
        .with_("spec.distribution.mpirunArgs", ["--mca", "btl_tcp_if_include", "eth0"])
        .obj()
    )
    body["metadata"]["namespace"] = namespace
    created = k8s.create(body)
    assert created["spec"]["distribution"] == {
        "type": "mpi",
        "nodeCount": 2,
        "processCountPerNode": 2,
        "implementation": "openmpi",
        "mpirunArgs": ["--mca", "btl_tcp_if_include", "eth0"],
        "launch": "process",
        "masterPort": 6105,
    }
    assert cluster.kubectl("explain", "trainingrun.spec.distribution.mpirunArgs")
