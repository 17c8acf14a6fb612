"""An MPI run's failure: node 0's launcher reports the rank mpirun named and the node it
ran on (``rankNode``); ``status.failure`` names that rank, node and Pod, not node 0."""

from __future__ import annotations

import json

from tests.builders import pod
from torchyard.status.failures import first_failure, observe_failure, public_failure

TRACEBACK = "Traceback (most recent call last):\n  ...\nValueError: rank 3 broke"


def node0_failed(rank_node: int | None) -> dict[str, object]:
    info = {"rank": 3, "nodeRank": 0, "exitCode": 1, "reason": "Error", "message": TRACEBACK}
    if rank_node is not None:
        info["rankNode"] = rank_node
    return pod("hvd", 0, phase="Failed", exit_code=1, message=json.dumps(info))


def test_the_rank_mpirun_named_is_reported_on_its_own_node_and_pod() -> None:
    worker = pod("hvd", 1, phase="Succeeded", exit_code=0, message='{"reason": "Completed"}')
    failure = first_failure([node0_failed(1), worker])
    assert failure is not None
    public = public_failure(failure)
    assert {k: public.get(k) for k in ("rank", "node", "pod", "exitCode", "reason", "message")} == {
        "rank": 3,
        "node": 1,
        "pod": "hvd-1",
        "exitCode": 1,
        "reason": "Error",
        "message": TRACEBACK,
    }


def test_without_rank_node_the_failure_stays_on_the_pod_that_reported_it() -> None:
    failure = observe_failure(node0_failed(None))
    assert failure is not None
    assert (failure["node"], failure["pod"], failure["rank"]) == (0, "hvd-0", 3)


def test_the_failing_ranks_node_is_the_one_its_pod_ran_on_so_exclusion_blames_it() -> None:
    reporter = node0_failed(1)
    reporter["spec"]["nodeName"] = "node-a"
    done = '{"reason": "Completed"}'
    worker = pod("hvd", 1, phase="Succeeded", exit_code=0, message=done, node_name="node-b")
    failure = first_failure([reporter, worker])
    assert failure is not None
    assert (failure["pod"], failure.get("nodeName")) == ("hvd-1", "node-b")
    assert public_failure(failure)["nodeName"] == "node-b"
    # Without rankNode, the reporting Pod's node.
    alone = first_failure([node0_failed(None) | {"spec": {"nodeName": "node-a"}}])
    assert alone is not None and alone.get("nodeName") == "node-a"
