"""``spec.placement`` without Kueue: torchyard's own gang admission packs a gang into the
fewest racks of KWOK nodes labelled by block, rack and host, numbers node ranks rack by
rack, and says why a ``required`` gang waits; bad placements and ``managedBy`` values
are refused by the apiserver (CEL) and by the models alike.

    flock /tmp/ty-cluster.lock .venv/bin/python -m pytest tests/integration/test_placement.py
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from tests.cluster.harness import Cluster
from tests.cluster.racks import BLOCK, RACK, Racks, occupy
from tests.integration.helpers import finish_pod, refused_by_both, run_pods, wait_status
from tests.integration.test_trainingruns import running
from torchyard import k8s


def placed(ns: str, name: str, pool: str, nodes: int, level: str, mode: str) -> dict[str, Any]:
    b = TrainingRunBuilder(name, ns).nodes(nodes).gpus(8).procs(8).pool(pool)
    return b.placement(level, mode).obj()


def racks_by_rank(racks: Racks, ns: str, run: str) -> list[str]:
    return racks.racks_by_rank(run_pods(ns, run))


def admitted_message(ns: str, run: str) -> str:
    status = k8s.get(k8s.TRAININGRUNS, ns, run)["status"]
    return str(next(c for c in status["conditions"] if c["type"] == "Admitted")["message"])


def test_required_and_preferred_gangs_take_the_fewest_racks_with_ranks_rack_by_rack(
    cluster: Cluster, env: str, racks: Racks
) -> None:
    ns = env
    # free nodes per rack: b0-r0 3, b0-r1 2, b1-r0 4, b1-r1 3
    occupy(cluster, ns, [racks.name(0), racks.name(4), racks.name(5), racks.name(12)])

    k8s.create(placed(ns, "four", racks.pool, 4, RACK, "required"))
    running(ns, "four", timeout=60)
    assert racks_by_rank(racks, ns, "four") == ["b1-r0"] * 4  # the one rack that holds it
    for p in run_pods(ns, "four"):  # each Pod kept in its domain by its node selector
        assert p["spec"]["nodeSelector"][RACK] == "b1-r0"
        assert p["spec"]["nodeSelector"].get(BLOCK, "b1") == "b1"
    assert admitted_message(ns, "four").endswith(f"in {RACK} b1-r0 (node ranks 0-3)")

    # Required 3 now: b0-r0 and b1-r1 have 3 free each (best fit: one of them)
    k8s.create(placed(ns, "three", racks.pool, 3, RACK, "required"))
    running(ns, "three", timeout=60)
    (rack,) = set(racks_by_rank(racks, ns, "three"))
    assert rack in ("b0-r0", "b1-r1")

    # Required 3 again: the other 3-rack; then a fourth 3 waits, saying why
    k8s.create(placed(ns, "three-b", racks.pool, 3, RACK, "required"))
    running(ns, "three-b", timeout=60)
    k8s.create(placed(ns, "three-c", racks.pool, 3, RACK, "required"))
    waiting = wait_status(
        k8s.TRAININGRUNS, ns, "three-c", lambda s: s.get("phase") == "Queued", timeout=60
    )["status"]
    message = next(c for c in waiting["conditions"] if c["type"] == "Admitted")["message"]
    assert message == (
        f"needs 3 node(s) with 8 nvidia.com/gpu in pool {racks.pool} in one {RACK}; "
        f"the largest free {RACK} has 2"
    ), message
    assert all("schedulingGates" in p["spec"] for p in run_pods(ns, "three-c"))

    # The first run ends: its rack is free again and the waiting gang goes there
    for p in run_pods(ns, "four"):
        finish_pod(cluster, ns, p["metadata"]["name"], 0)
    running(ns, "three-c", timeout=60)
    assert set(racks_by_rank(racks, ns, "three-c")) == {"b1-r0"}


def test_a_preferred_gang_no_rack_holds_spans_racks_with_contiguous_ranks(
    cluster: Cluster, env: str, racks: Racks
) -> None:
    ns = env
    occupy(cluster, ns, [racks.name(0), racks.name(4), racks.name(5)])  # b0: 3 + 2 free, b1: 4 + 4
    k8s.create(placed(ns, "six", racks.pool, 6, RACK, "preferred"))
    running(ns, "six", timeout=60)
    by_rank = racks_by_rank(racks, ns, "six")
    # No Kueue Topology: the rack level alone (no blocks above it). Two racks, as Kueue's
    # best fit takes them: a whole free rack of b1, then the rack whose free nodes fit the
    # other two exactly (b0-r1), node ranks rack by rack
    assert sorted(by_rank.count(r) for r in set(by_rank)) == [2, 4], by_rank
    assert {r for r in by_rank if by_rank.count(r) == 2} == {"b0-r1"}, by_rank
    assert {r for r in by_rank if by_rank.count(r) == 4} <= {"b1-r0", "b1-r1"}, by_rank
    assert by_rank == sorted(by_rank, key=by_rank.index), by_rank  # contiguous per rack
    assert admitted_message(ns, "six").startswith("all 6 node Pod(s) admitted together in ")


def test_a_level_no_node_has_keeps_the_run_waiting_saying_so(
    cluster: Cluster, env: str, racks: Racks
) -> None:
    ns = env
    k8s.create(placed(ns, "nowhere", racks.pool, 2, "example.com/nvlink-domain", "required"))
    waiting = wait_status(
        k8s.TRAININGRUNS, ns, "nowhere", lambda s: s.get("phase") == "Queued", timeout=60
    )["status"]
    message = next(c for c in waiting["conditions"] if c["type"] == "Admitted")["message"]
    assert "has the label example.com/nvlink-domain (spec.placement.topology.level)" in message


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            "spec.placement",
            {"topology": {"level": "example.com/rack"}, "sliceSize": 3},
            "placement.sliceSize must divide distribution.nodeCount",
        ),
        (
            "spec.placement",
            {"topology": {"level": "example.com/rack", "mode": "preferred"}, "sliceSize": 2},
            "placement.sliceSize needs placement.topology.mode required",
        ),
        (
            "spec.placement",
            {"topology": {"level": "not a label!"}},
            "placement.topology.level must be a node label key",
        ),
        (
            "spec.managedBy",
            "example.com/my-controller",
            "managedBy: the only controller that may run a TrainingRun",
        ),
    ],
)
def test_bad_placements_and_managers_are_refused_by_the_apiserver_and_the_models(
    namespace: str, path: str, value: Any, message: str
) -> None:
    body = (
        TrainingRunBuilder("bad", namespace)
        .nodes(4)
        .with_("spec.scheduling.queueName", "team-a")
        .with_(path, value)
        .obj()
    )
    refused_by_both(namespace, body, message)


def test_managed_by_multikueue_needs_a_queue(namespace: str) -> None:
    body = TrainingRunBuilder("bad", namespace).with_("spec.managedBy", "kueue.x-k8s.io/multikueue")
    refused_by_both(namespace, body.obj(), "needs spec.scheduling.queueName")
