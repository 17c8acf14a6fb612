"""A rank that exits with status 0 while its peers still train is the cause of their
failure (class EarlyExit), decided the same way for node Pods and for local mode.

Found by hand (DDP, 2 nodes x 2 processes, gloo): rank 1 called ``sys.exit(0)`` at step
10; rank 0 then failed with gloo's "Connection closed by peer" and the run blamed rank 0
(PeerLost). Each launcher now lists the ranks of its node that exited with status 0
(``earlyExits``) in its termination message, Completed or not, and
``failures.decide`` names the first of them that came before a failure that may be what
the ranks saw of losing it (a cascade or a symptom, or a stall of ranks waiting in a
collective)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.builders import pod
from torchyard.local.results import NodeResult
from torchyard.local.results import first_failure as local_first_failure
from torchyard.status import failures
from torchyard.status.failures import first_failure

T = 1_800_000_000.0
PEER_LOST = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed "
    "by peer [127.0.0.1]:44775"
)
COLLECTIVE_TIMEOUT = (
    "RuntimeError: [./gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 15000ms "
    "for recv operation to complete"
)
RENDEZVOUS = "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients"
OWN_ERROR = "ValueError: loss is nan"


def message(node: int, rank: int | None, **info: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"nodeRank": node}
    if rank is not None:
        base["rank"] = rank
    return {**base, **info}


def failed_node(node: int, rank: int, text: str, at: float, **more: Any) -> dict[str, Any]:
    return message(
        node,
        rank,
        exitCode=1,
        reason="Error",
        message=f"Traceback (most recent call last):\n{text}",
        exitedAt=at,
        **more,
    )


def stalled_node(node: int, rank: int, at: float, in_collective: bool | None) -> dict[str, Any]:
    suspect = {"rank": rank, "idle": 31.0, "step": 9, "inCollective": in_collective}
    if in_collective:
        suspect["collective"] = "backward"
    if in_collective is not None:  # None: a dump with no frame ("Garbage-collecting")
        suspect.update(file="train.py", line=18 if in_collective else 12, function="<module>")
    stall: dict[str, Any] = {"rank": rank, "seconds": 31, "step": 9, "suspects": [suspect]}
    if in_collective:
        stall["collective"] = "backward"
    return message(
        node,
        rank,
        exitCode=143,
        signal=15,
        reason="Stalled",
        message=f"rank {rank} made no progress for 31s",
        exitedAt=at,
        stall=stall,
    )


def no_dump(stalled: dict[str, Any]) -> dict[str, Any]:
    """A stall whose ranks left no stack dump: its record lists none."""
    return {**stalled, "exitCode": 138, "stall": {**stalled["stall"], "suspects": []}}


def completed_node(node: int, exits: list[tuple[int, float, int]]) -> dict[str, Any]:
    early = [{"rank": r, "exitedAt": at, "step": step} for r, at, step in exits]
    return message(node, None, exitCode=0, reason="Completed", earlyExits=early)


def early(rank: int, at: float, step: int = 9) -> dict[str, Any]:
    return {"earlyExits": [{"rank": rank, "exitedAt": at, "step": step}]}


def as_pod(node: int, info: dict[str, Any]) -> dict[str, Any]:
    code = int(info["exitCode"])
    return pod(
        "r",
        node,
        phase="Succeeded" if code == 0 else "Failed",
        exit_code=code,
        message=json.dumps(info),
    )


def both(messages: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """The decision over node Pods and over local mode's nodes, for the same messages."""
    pods = first_failure([as_pod(i["nodeRank"], i) for i in messages])
    local = local_first_failure(
        [NodeResult(i["nodeRank"], int(i["exitCode"]), 1.0, i) for i in messages]
    )
    return [pods, local]


# (what happened, the termination messages of the gang): rank 1 left at T with status 0
NAMED = {
    "peer on the same node lost it": [
        failed_node(0, 0, PEER_LOST, T + 0.3, **early(1, T)),
        failed_node(1, 2, PEER_LOST, T + 0.31),
    ],
    "peer on another node lost it (its node completed)": [
        completed_node(0, [(1, T, 9), (0, T + 0.01, 9)]),
        failed_node(1, 2, PEER_LOST, T + 0.3),
    ],
    "a collective timed out waiting for it": [
        failed_node(0, 0, COLLECTIVE_TIMEOUT, T + 15, **early(1, T)),
    ],
    "the store went away with it": [
        completed_node(0, [(1, T, 0)]),
        failed_node(1, 3, RENDEZVOUS, T + 900),
    ],
    # seen on the real node under load: rank 1 closed its connections while its
    # interpreter wound down, and its launcher noted its end later still; node 1's rank 2
    # failed of losing it 0.3 s before the exit's recorded time (within the slack)
    "its peer failed before its recorded exit": [
        {**failed_node(0, 0, PEER_LOST, T + 0.5), **early(1, T + 0.3)},
        failed_node(1, 2, PEER_LOST, T),
    ],
    # seen in local mode: rank 1 left; rank 0 (its node's only other rank) and rank 2
    # dumped "Garbage-collecting" with no frame (a destructor waiting for it), rank 3 in
    # backward; node 0 reported the stall of its frame-less rank
    "the others stalled with dumps that show no frame": [
        {**stalled_node(0, 0, T + 16, in_collective=None), **early(1, T)},
        stalled_node(1, 2, T + 15, in_collective=None),
    ],
    # seen in local mode: rank 0 lost rank 1, raised, and hung as its interpreter
    # finalized; the stack signal killed it (no dump, exit 138): node 0's stall lists no
    # rank; node 1's rank 3 waits in backward
    "the others stalled, one with no dump at all": [
        {**no_dump(stalled_node(0, 0, T + 6.7, in_collective=None)), **early(1, T)},
        stalled_node(1, 3, T + 6.75, in_collective=True),
    ],
    "the others stalled in backward waiting for it": [
        {**stalled_node(0, 0, T + 31, in_collective=True), **early(1, T)},
        stalled_node(1, 3, T + 31.2, in_collective=True),
    ],
}


@pytest.mark.parametrize("case", sorted(NAMED))
def test_a_rank_that_left_early_is_named_for_the_peers_that_lost_it(case: str) -> None:
    for decided in both(NAMED[case]):
        assert decided is not None
        assert (decided["rank"], decided["node"]) == (1, 0), decided
        assert decided["failureClass"] == "EarlyExit"
        assert decided["exitCode"] == 0
        assert decided["retryable"] is False
        assert decided["message"].startswith("rank 1 (node 0) exited with status 0 at step")
        assert "while the other ranks still trained" in decided["message"]
        assert "DistributedSampler" in decided["advice"]


KEPT = {
    # its own error: the rank that left had nothing to do with it
    "an error of its own": (
        [failed_node(0, 0, OWN_ERROR, T + 5, **early(1, T))],
        (0, 0, "PythonException"),
    ),
    # a rank stuck outside any collective waits for no one
    "a stall outside a collective": (
        [{**stalled_node(0, 0, T + 31, in_collective=False), **early(1, T)}],
        (0, 0, "Hang"),
    ),
    # the rank finished after the failure, past the slack: stopped with the others (local
    # mode stops them FAILURE_SETTLE_SECONDS after it), not their cause
    "an exit after the failure": (
        [failed_node(0, 0, PEER_LOST, T, **early(1, T + failures.EARLY_EXIT_SLACK_SECONDS))],
        (0, 0, "PeerLost"),
    ),
    "a cascade with nobody gone early": (
        [failed_node(0, 0, PEER_LOST, T), failed_node(1, 2, OWN_ERROR, T - 0.1)],
        (2, 1, "PythonException"),
    ),
}


@pytest.mark.parametrize("case", sorted(KEPT))
def test_a_failure_that_no_early_exit_explains_stays_named(case: str) -> None:
    messages, (rank, node, klass) = KEPT[case]
    for decided in both(messages):
        assert decided is not None
        assert (decided["rank"], decided["node"], decided["failureClass"]) == (rank, node, klass)


def test_of_several_early_exits_the_first_is_named() -> None:
    gang = [
        completed_node(1, [(2, T + 1, 12), (3, T + 2, 12)]),
        failed_node(0, 0, PEER_LOST, T + 3, **early(1, T + 0.5, step=11)),
    ]
    for decided in both(gang):
        assert decided is not None
        assert (decided["rank"], decided["node"], decided.get("step")) == (1, 0, 11)


def test_bad_early_exit_records_are_ignored() -> None:
    junk: list[Any] = [
        "rank 1",
        {"rank": "1", "exitedAt": T},
        {"rank": 1, "exitedAt": "soon"},
        {"rank": 1, "exitedAt": float("nan")},
        {"rank": 1},
    ]
    gang = [failed_node(0, 0, PEER_LOST, T + 1, earlyExits=junk)]
    for decided in both(gang):
        assert decided is not None
        assert (decided["rank"], decided["failureClass"]) == (0, "PeerLost")
