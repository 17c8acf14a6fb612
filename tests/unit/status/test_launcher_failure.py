"""Node Pods and local mode decide a failure with the same code: a launcher's termination
message is read into a failure once (``failures.launcher_failure``), so that a node Pod
(``observe_failure``) and a local node (``local.results.node_failure``) that say the same
thing give the same failure (rank, node, message, when the rank exited, its step, a
stall's suspects, MPI's ``rankNode``, the class and advice) for ``failures.decide``; and a
collective timeout names the nodes it waited for by one rule (``waited_for_nodes``): the
node Pods still running, or the nodes local mode stopped."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.builders import pod
from tests.unit.launcher.test_classes import GLOO, launcher_pod, running_pod
from torchyard.local.results import NodeResult, first_failure, node_failure
from torchyard.local.results import settle_seconds as local_settle
from torchyard.status import failures
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


def test_a_collective_timeout_names_the_nodes_it_waited_for_in_both() -> None:
    # rank 0 timed out in gloo while node 1 (ranks 2-3) still ran: its Pod was still
    # Running when the operator decided; local mode stopped its launcher (Terminated)
    timeout = {"rank": 0, "nodeRank": 0, "exitCode": 1, "reason": "Error", "message": GLOO}
    in_pods = failures.first_failure([launcher_pod(0, GLOO, 115.0), running_pod(1, 2)])
    stopped = {"nodeRank": 1, "reason": "Terminated", "signal": 15, "exitedAt": 117.0}
    local = first_failure(
        [NodeResult(0, 1, 30.0, {**timeout, "exitedAt": 115.0}), NodeResult(1, 143, 30.0, stopped)],
        procs=2,
    )
    assert in_pods is not None and local is not None
    assert in_pods["advice"].startswith(
        "rank 0 (node 0) timed out in a collective while node 1 (Pod r-1, ranks 2-3) still ran "
        "and had not failed: its ranks never joined the collective"
    ), in_pods["advice"]
    assert local["advice"] == in_pods["advice"].replace("(Pod r-1, ranks 2-3)", "(ranks 2-3)")
    assert (local["rank"], local["node"], local["failureClass"]) == (0, 0, "CollectiveTimeout")


@pytest.mark.parametrize(
    ("waited", "said"),
    [
        (failures.Waited(1, "r-1", 1), "node 1 (Pod r-1, rank 1)"),
        (failures.Waited(1, "r-1", 4), "node 1 (Pod r-1, ranks 4-7)"),
        (failures.Waited(1, "r-1", None), "node 1 (Pod r-1)"),
        (failures.Waited(2, None, 2), "node 2 (ranks 4-5)"),
        (failures.Waited(2, None, None), "node 2"),
        (failures.Waited(None, "r-x", 2), "node None (Pod r-x)"),
    ],
)
def test_a_node_waited_for_is_said_with_what_is_known_of_it(
    waited: failures.Waited, said: str
) -> None:
    assert waited.said() == said


def test_only_a_collective_timeout_with_nodes_still_running_gets_the_note() -> None:
    raised = node_failure(NodeResult(0, 1, 1.0, {"rank": 0, "message": "ValueError: bad"}))
    assert failures.waited_for_nodes(raised, [failures.Waited(1, None, 2)]) == raised
    alone = node_failure(NodeResult(0, 1, 1.0, {"rank": 0, "message": GLOO}))
    assert failures.waited_for_nodes(alone, []) == alone


STALLED = {
    "rank": 1,
    "nodeRank": 0,
    "exitCode": 143,
    "reason": "Stalled",
    "message": "rank 1 made no progress for 16s",
    "stall": {"suspects": [{"rank": 1, "idle": 16.0, "inCollective": True}]},
    "exitedAt": 100.0,
}
PEER_LOST = {"rank": 2, "nodeRank": 1, "exitCode": 1, "reason": "Error", "exitedAt": 100.0}
OWN = {"rank": 3, "nodeRank": 1, "exitCode": 1, "reason": "Error", "exitedAt": 100.5}
LOST = "RuntimeError: [./gloo/transport/tcp/pair.cc:598] Connection closed by peer [1.2.3.4]:5"


def test_local_mode_waits_for_the_other_nodes_as_the_operator_does() -> None:
    stalled = NodeResult(0, 143, 1.0, STALLED)
    lost = NodeResult(1, 1, 1.0, {**PEER_LOST, "message": LOST})
    own = NodeResult(1, 1, 1.0, {**OWN, "message": "ValueError: bad"})
    # a stall waits STALL_SETTLE_SECONDS from when it was found; a lost peer
    # FAILURE_SETTLE_SECONDS; an error of its own not at all; nothing left running: now
    assert local_settle([stalled], True, 105.0) == failures.STALL_SETTLE_SECONDS - 5
    assert local_settle([lost], True, 101.0) == failures.FAILURE_SETTLE_SECONDS - 1
    assert local_settle([own], True, 101.0) is None
    assert local_settle([stalled], False, 105.0) is None
    assert local_settle([NodeResult(0, 0, 1.0, {})], True, 105.0) is None
    # of the failures so far, the one decided: the operator asks it of first_failure
    for nodes in ([lost, own], [own, lost]):
        chosen = failures.first_failure([as_pod(n) for n in nodes])
        assert chosen is not None
        assert local_settle(nodes, True, 101.0) == failures.settle_seconds(chosen, True, 101.0)


def as_pod(node: NodeResult) -> dict[str, Any]:
    return pod(
        "r",
        node.node,
        phase="Failed",
        exit_code=node.exit_code,
        message=json.dumps(node.termination),
        finished_at="",
    )
