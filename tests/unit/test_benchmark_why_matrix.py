"""benchmarks/why_real.py: a real-node run of the culprit matrix is judged from the
TrainingRun's ``status.failure``, and counts only when both its node Pods were seen bound
to the real node."""

from __future__ import annotations

import json
from typing import Any

import pytest
from benchmarks.why_real import Cell, judge, report

NODE = "real-node"
CELL = Cell("ddp", "gil", "other", 3)  # the victim: rank 3, on node 1


def failed(rank: Any, node: Any, klass: str = "Hang") -> dict[str, Any]:
    failure = {"rank": rank, "node": node, "class": klass, "message": "rank stuck at x:1"}
    return {"status": {"phase": "Failed", "failure": failure}}


BOTH = {"r-0": NODE, "r-1": NODE}


@pytest.mark.parametrize(
    ("run", "bound", "counted", "right"),
    [
        (failed(3, 1), BOTH, True, True),
        (failed(2, 1), BOTH, True, False),  # a peer on the victim's node
        (failed(1, 0), BOTH, True, False),  # the first reporter's rank that only waited
        (failed(3, 0), BOTH, True, False),  # the right rank on the wrong node
        (failed(None, 1), BOTH, True, False),  # a node without a rank
        ({"status": {"phase": "Running"}}, BOTH, True, False),  # never decided
        ({"status": {"phase": "Succeeded"}}, BOTH, True, False),
        (failed(3, 1), {"r-0": NODE}, False, False),  # node 1's Pod never seen
        (failed(3, 1), {"r-0": NODE, "r-1": None}, False, False),  # never bound
        (failed(3, 1), {"r-0": NODE, "r-1": "kwok-0"}, False, False),  # another node
        (failed(3, 1), {**BOTH, "r-2": "kwok-0"}, False, False),  # any Pod elsewhere
    ],
)
def test_a_run_is_named_right_only_for_the_victim_and_counts_only_on_the_real_node(
    run: dict[str, Any], bound: dict[str, str | None], counted: bool, right: bool
) -> None:
    outcome = judge(NODE, "r", CELL, run, bound, 30.0)
    assert (outcome.counted, outcome.right) == (counted, right), outcome
    assert outcome.cell == CELL and outcome.seconds == 30.0
    assert outcome.said.startswith("NOT COUNTED") is not counted, outcome.said


def test_what_was_named_is_said() -> None:
    said = judge(NODE, "r", CELL, failed(1, 0, "EarlyExit"), BOTH, 1.0).said
    assert said.startswith("Failed EarlyExit rank 1 node 0: rank stuck at x:1"), said


def trainer(state: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"containerStatuses": [{"name": "trainer", "state": state}]}}


def test_what_a_node_pod_reported_is_kept_for_a_wrong_run() -> None:
    said = {
        "rank": 3,
        "reason": "Stalled",
        "exitedAt": 5.5,
        "message": "long",
        "stall": {"rank": 3, "detectedAt": 5.5, "suspects": [{"rank": 3}], "message": "x"},
    }
    ended = {"terminated": {"exitCode": 143, "finishedAt": "T", "message": json.dumps(said)}}
    assert report(trainer(ended)) == {
        "rank": 3,
        "reason": "Stalled",
        "exitedAt": 5.5,
        "stall": {"rank": 3, "detectedAt": 5.5, "suspects": [{"rank": 3}]},
        "exitCode": 143,
        "finishedAt": "T",
    }
    assert report(trainer({"running": {}})) is None
    tail = report(trainer({"terminated": {"exitCode": 1, "message": "Traceback ..."}}))
    assert tail == {"message": "Traceback ...", "exitCode": 1, "finishedAt": None}


def test_a_run_is_a_round_of_the_results_with_its_cell() -> None:
    run = judge(NODE, "r", CELL, failed(3, 1), BOTH, 12.345)
    assert run.row() == {
        "shape": "ddp",
        "fault": "gil",
        "place": "other",
        "victim": 3,
        "counted": True,
        "right": True,
        "said": run.said,
        "seconds": 12.3,
        "load": run.load,
    }


def test_runs_per_cell_are_one_count_for_every_shape_or_a_count_per_shape() -> None:
    from benchmarks.why_matrix import runs_of

    shapes = ["ddp", "allreduce", "torchrun"]
    assert runs_of("20", shapes) == {"ddp": 20, "allreduce": 20, "torchrun": 20}
    assert runs_of("ddp=20,allreduce=3", shapes) == {"ddp": 20, "allreduce": 3, "torchrun": 1}
    with pytest.raises(ValueError, match="'mpi', not one of the shapes run"):
        runs_of("ddp=20,mpi=3", shapes)
    with pytest.raises(ValueError):
        runs_of("ddp=many", shapes)
