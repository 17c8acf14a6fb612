"""Which failure names a gang's failure, when one rank takes its peers down with it.

Found on the real node (tests/node/test_trainingruns.py): rank 3 raised, and the ranks of
node 0, in gloo's all-reduce with it, failed a few milliseconds later with "Connection
closed by peer", in the same second of the kubelet's ``finishedAt``; the run then blamed
rank 1 of node 0 (the lower node rank broke the tie). The launcher now says when the
failing rank exited (``exitedAt``, Unix time), ``first_failure`` orders by it, and
``settling`` holds the decision while the gang's other Pods may still report an earlier
one."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests.builders import pod
from torchyard.status.failures import (
    FAILURE_SETTLE_SECONDS,
    first_failure,
    observe_failure,
    settling,
)

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
SECOND = "2026-01-01T12:00:00Z"


def launcher_message(rank: int, node: int, text: str, exited: float | None) -> str:
    info: dict[str, Any] = {
        "rank": rank,
        "localRank": rank % 2,
        "nodeRank": node,
        "exitCode": 1,
        "reason": "Error",
        "message": f"Traceback (most recent call last):\n{text}",
    }
    if exited is not None:
        info["exitedAt"] = exited
    return json.dumps(info)


def failed(node: int, rank: int, text: str, exited: float | None, finished: str = SECOND):
    return pod(
        "r",
        node,
        phase="Failed",
        exit_code=1,
        message=launcher_message(rank, node, text, exited),
        finished_at=finished,
    )


CULPRIT = "RuntimeError: rank 3 failed on purpose"
COLLATERAL = "RuntimeError: [./gloo/transport/tcp/pair.cc:598] Connection closed by peer"


def test_the_rank_that_exited_first_is_named_not_the_peer_that_lost_it() -> None:
    t = T0.timestamp() + 0.2
    peer = failed(0, 1, COLLATERAL, t + 0.004)  # same second, lower node rank
    culprit = failed(1, 3, CULPRIT, t)
    for pods in ([peer, culprit], [culprit, peer]):
        first = first_failure(pods)
        assert first is not None
        assert (first["rank"], first["node"]) == (3, 1)
        assert first["message"].endswith(CULPRIT)


def test_the_culprits_pod_may_end_later_its_rank_still_exited_first() -> None:
    """Its launcher stops the rank's siblings before it ends (up to the grace period)."""
    t = T0.timestamp()
    peer = failed(0, 0, COLLATERAL, t + 0.01, finished="2026-01-01T12:00:00Z")
    culprit = failed(1, 2, CULPRIT, t, finished="2026-01-01T12:00:07Z")
    first = first_failure([peer, culprit])
    assert first is not None and first["rank"] == 2


def test_without_the_launchers_time_the_kubelets_finish_decides_as_before() -> None:
    early = failed(1, 3, CULPRIT, None, finished="2026-01-01T12:00:01Z")
    late = failed(0, 1, COLLATERAL, None, finished="2026-01-01T12:00:05Z")
    first = first_failure([late, early])
    assert first is not None and first["rank"] == 3
    assert first["exitedAt"] == T0.timestamp() + 1
    # two errors of their own at the same time: the node rank breaks the tie
    tie = failed(1, 3, CULPRIT, None, finished="2026-01-01T12:00:05Z")
    other = failed(0, 1, "KeyError: 'label'", None, finished="2026-01-01T12:00:05Z")
    first = first_failure([tie, other])
    assert first is not None and first["node"] == 0
    # an error of its own wins a tie over a peer's lost connection (a cascade)
    lost = failed(0, 1, COLLATERAL, None, finished="2026-01-01T12:00:05Z")
    first = first_failure([tie, lost])
    assert first is not None and first["node"] == 1


@pytest.mark.parametrize(
    "exited",
    ["soon", True, None, [1.0], float("nan"), float("-inf"), float("inf")],
    ids=["string", "bool", "null", "list", "NaN", "-Infinity", "Infinity"],
)
def test_a_time_that_is_not_a_number_falls_back_to_the_kubelets(exited: Any) -> None:
    failure = observe_failure(failed(0, 1, CULPRIT, exited, finished="2026-01-01T12:00:02Z"))
    assert failure is not None and failure["exitedAt"] == T0.timestamp() + 2


def running(node: int) -> dict[str, Any]:
    return pod("r", node, phase="Running", node_name="real-0")


AGO = T0.timestamp()
SETTLE: list[tuple[str, float | None, list[int], float, float | None]] = [
    # (case, failure time, other nodes still running, seconds after T0, wait)
    ("a peer still runs: wait the rest", AGO, [1], 0.5, FAILURE_SETTLE_SECONDS - 0.5),
    ("settled", AGO, [1], FAILURE_SETTLE_SECONDS, None),
    ("long ago", AGO, [1], 60.0, None),
    ("nobody else runs: decide now", AGO, [], 0.5, None),
    ("no time known", None, [1], 0.5, None),
    ("slightly ahead of this clock", AGO + 1.0, [1], 0.0, FAILURE_SETTLE_SECONDS + 1.0),
    ("far ahead of this clock: never wait long", AGO + 600, [1], 0.0, None),
]


@pytest.mark.parametrize(
    ("case", "exited", "others", "after", "wait"), SETTLE, ids=[s[0] for s in SETTLE]
)
def test_settling(
    case: str, exited: float | None, others: list[int], after: float, wait: float | None
) -> None:
    # a lost connection: what a rank sees of a peer that failed first
    peer = failed(0, 1, COLLATERAL, exited, finished=SECOND if exited is not None else "")
    failure = first_failure([peer, *[running(n) for n in others]])
    assert failure is not None and failure["failureClass"] == "PeerLost"
    got = settling(failure, [peer, *[running(n) for n in others]], T0 + timedelta(seconds=after))
    if wait is None:
        assert got is None
    else:
        assert got == pytest.approx(wait)


def test_a_killed_launchers_log_tail_is_the_message_without_its_progress_lines() -> None:
    """Seen on the real node (benchmarks/survive.py): a SIGKILLed launcher writes no
    termination message, the kubelet puts the log tail there instead, and the tail ended
    with the launcher's own progress line, which became the failure's whole message."""
    tail = (
        "[rank 1] step 14 loss 0.25\n"
        '[torchyard] progress {"checkpointSeconds": {"save": 1.007}, "step": 14}'
    )
    killed = pod("r", 1, phase="Failed", exit_code=137, message=tail)
    failure = observe_failure(killed)
    assert failure is not None and failure["message"] == "[rank 1] step 14 loss 0.25"
    only_progress = pod("r", 1, phase="Failed", exit_code=137, message=tail.splitlines()[1])
    failure = observe_failure(only_progress)
    assert failure is not None and "progress" not in failure["message"]


@pytest.mark.parametrize(
    "text",
    [CULPRIT, "KeyError: 'label'", ""],
    ids=["an exception", "another exception", "an exit with nothing to say"],
)
def test_a_failure_of_its_own_kind_is_decided_at_once_while_its_peers_run(text: str) -> None:
    """Nothing in it says another rank failed first: the gang restarts without waiting."""
    culprit = failed(0, 1, text, AGO) if text else pod("r", 0, phase="Failed", exit_code=1)
    failure = first_failure([culprit, running(1)])
    assert failure is not None
    assert settling(failure, [culprit, running(1)], T0 + timedelta(seconds=0.5)) is None


def test_a_store_that_went_away_may_be_rank_0s_failure_so_it_waits() -> None:
    store = "torch.distributed.DistNetworkError: Connection reset by peer"
    lost = failed(1, 3, store, AGO)
    failure = first_failure([lost, running(0)])
    assert failure is not None and failure["failureClass"] == "RendezvousTimeout"
    wait = settling(failure, [lost, running(0)], T0 + timedelta(seconds=0.5))
    assert wait == pytest.approx(FAILURE_SETTLE_SECONDS - 0.5)


def test_a_pod_ended_at_its_deadline_waits_for_its_siblings_to_end_at_theirs() -> None:
    ended = pod(
        "r", 0, phase="Failed", exit_code=137, pod_reason="DeadlineExceeded", finished_at=SECOND
    )
    failure = first_failure([ended, running(1)])
    assert failure is not None and failure["reason"] == "DeadlineExceeded", failure
    wait = settling(failure, [ended, running(1)], T0 + timedelta(seconds=0.5))
    assert wait == pytest.approx(FAILURE_SETTLE_SECONDS - 0.5)
