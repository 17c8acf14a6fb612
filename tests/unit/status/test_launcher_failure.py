"""A launcher's termination message is read into a failure once
(``failures.launcher_failure``): a node Pod (``observe_failure``) and a local node
(``local.results.node_failure``) that say the same thing give the same failure — rank,
node, message, when the rank exited, its step, a stall's suspects, MPI's ``rankNode``, the
class and advice — so that ``failures.decide`` names the same culprit in both."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.builders import pod
from torchyard.local.results import NodeResult, node_failure
from torchyard.status.failures import observe_failure

SUSPECTS = [{"rank": 3, "idle": 16.0, "step": 9, "inCollective": False, "file": "t.py"}]
AT = {"exitedAt": 1700000000.5}
TRACEBACK = "Traceback (most recent call last):\nValueError: bad"
# name: (the launcher's termination message, the node's exit code)
SAID: dict[str, tuple[dict[str, Any], int]] = {
    "exception": (
        {"rank": 3, "exitCode": 1, "reason": "Error", "message": TRACEBACK, "step": 7, **AT},
        1,
    ),
    "stall": (
        {
            "rank": 3,
            "exitCode": 143,
            "signal": 15,
            "reason": "Stalled",
            "message": "rank 3 made no progress for 16s",
            "stall": {"suspects": SUSPECTS},
            "step": 9,
            **AT,
        },
        143,
    ),
    "mpi": ({"rank": 5, "rankNode": 1, "exitCode": 1, "message": TRACEBACK, **AT}, 1),
    "killed": ({}, 137),  # a launcher that wrote nothing
    "junk": ({"rank": 3, "exitedAt": "soon", "step": "nine", "nodeRank": True}, 1),
}
SAME = ("rank", "node", "message", "exitedAt", "step", "stall", "failureClass", "advice")


@pytest.mark.parametrize("name", SAID)
def test_a_node_pod_and_a_local_node_that_say_the_same_fail_the_same(name: str) -> None:
    info, code = SAID[name]
    node = 1 if name != "mpi" else 0
    in_pod = observe_failure(
        pod(
            "r",
            node,
            phase="Failed",
            exit_code=code,
            message=json.dumps(info),
            finished_at="",
        )
    )
    local = node_failure(NodeResult(node, code, 30.0, info))
    assert in_pod is not None
    assert {k: in_pod.get(k) for k in SAME} == {k: local.get(k) for k in SAME}, name
    assert in_pod["exitCode"] == local["exitCode"] == code


def test_what_each_says_is_read() -> None:
    stall = node_failure(NodeResult(1, 143, 30.0, SAID["stall"][0]))
    assert (stall["rank"], stall["node"], stall["step"]) == (3, 1, 9)
    assert stall["exitedAt"] == AT["exitedAt"]
    assert stall["stall"] == {"suspects": SUSPECTS} and stall["reason"] == "Stalled"
    mpi = observe_failure(
        pod("r", 0, phase="Failed", exit_code=1, message=json.dumps(SAID["mpi"][0]))
    )
    assert mpi is not None and (mpi["node"], mpi["pod"], mpi["rank"]) == (1, "r-1", 5)
    junk = node_failure(NodeResult(1, 1, 30.0, SAID["junk"][0]))
    assert (junk["node"], junk["exitedAt"], "step" in junk) == (1, None, False)
