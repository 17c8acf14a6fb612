"""The stuck rank across nodes: two nodes' launchers each report their stalled ranks
(``stalls.suspects_of`` over faulthandler dumps), and ``first_failure`` names the rank
the others wait for with the launcher's own rules applied to all of them, not the rank
the first node to report named among its own."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest

from tests.builders import pod
from tests.unit.launcher.test_stalls import IN_ALL_REDUCE, IN_BARRIER, SLEEPING
from torchyard.launch import contract, stalls
from torchyard.status import culprits, failures
from torchyard.status.failures import first_failure, public_failure


def stalled_node(
    node: int,
    stacks: dict[int, str],
    idle: dict[int, float],
    exited: float,
    named: int,
    steps: dict[int, int] | None = None,
    detected: float | None = None,
) -> dict[str, Any]:
    """Node ``node``'s Pod, failed as its launcher reports a stall: ``named`` is the rank
    it chose among its own (``stalls.culprit``), ``stacks`` its stalled ranks' dumps
    ("": none), ``idle`` their seconds idle when it found the stall at ``detected``."""
    order = [named] + [r for r in stacks if r != named]
    suspects = stalls.suspects_of(
        {r: stacks[r] for r in order}, order, idle.get, lambda r: (steps or {}).get(r, 40)
    )
    info = {
        "rank": named,
        "nodeRank": node,
        "exitCode": 143,
        "reason": "Stalled",
        "message": f"rank {named} made no progress for 60s (last step 40): stuck at ...",
        "step": 40,
        "exitedAt": exited,
        "stall": {"rank": named, "seconds": 60, "step": 40, "suspects": suspects},
    }
    if detected is not None:
        info["stall"]["detectedAt"] = detected
    return pod(
        "r", node, phase="Failed", node_name=f"gpu-{node}", exit_code=143, message=json.dumps(info)
    )


def test_a_rank_outside_torch_distributed_on_the_second_node_is_named() -> None:
    # Rank 3 (node 1) sleeps; ranks 0-2 wait in all_reduce. Node 0's launcher can only
    # name its longest-idle rank, and its Pod reports first.
    node0 = stalled_node(0, {0: IN_ALL_REDUCE, 1: IN_ALL_REDUCE}, {0: 61, 1: 60}, 100.0, named=0)
    node1 = stalled_node(1, {2: IN_ALL_REDUCE, 3: SLEEPING}, {2: 60, 3: 60}, 101.5, named=3)
    failure = first_failure([node0, node1])
    assert failure is not None
    public = public_failure(failure)
    assert (public["rank"], public["node"], public["pod"], public["nodeName"]) == (
        3,
        1,
        "r-1",
        "gpu-1",
    )
    assert public["class"] == "Hang"


def test_the_rank_whose_place_differs_across_nodes_is_named_with_its_line() -> None:
    # Rank 3 skipped an all_reduce and waits in the barrier after the loop; with two
    # ranks a node cannot tell (no majority), across four the odd one out shows.
    node0 = stalled_node(0, {0: IN_ALL_REDUCE, 1: IN_ALL_REDUCE}, {0: 61, 1: 60}, 100.0, named=0)
    node1 = stalled_node(1, {2: IN_ALL_REDUCE, 3: IN_BARRIER}, {2: 61, 3: 60}, 100.4, named=2)
    failure = first_failure([node0, node1])
    assert failure is not None
    assert (failure["rank"], failure["pod"], failure.get("nodeName")) == (3, "r-1", "gpu-1")
    assert str(failure["message"]).startswith(
        "rank 3 (node 1) made no progress for 60s (last step 40): stuck at "
        "/workspace/train.py:18 in <module> (in torch.distributed barrier); of the stalled "
        "ranks of every node, the one the others wait for (the nodes' launchers named "
        "rank 0 (node 0), rank 2 (node 1))"
    )


def test_with_no_odd_one_out_the_rank_idle_longest_of_all_nodes_is_named() -> None:
    node0 = stalled_node(0, {0: IN_ALL_REDUCE, 1: IN_ALL_REDUCE}, {0: 61, 1: 60}, 100.0, named=0)
    node1 = stalled_node(1, {2: IN_ALL_REDUCE, 3: IN_ALL_REDUCE}, {2: 75, 3: 60}, 100.4, named=2)
    failure = first_failure([node0, node1])
    assert failure is not None and (failure["rank"], failure["pod"]) == (2, "r-1")


def test_one_stalled_rank_alone_keeps_the_launchers_choice() -> None:
    node0 = stalled_node(0, {1: SLEEPING}, {1: 60}, 100.0, named=1)
    failure = first_failure([node0])
    assert failure is not None and (failure["rank"], failure["pod"]) == (1, "r-0")
    assert culprits.pick([]) is None


def test_what_the_launcher_reports_of_each_stalled_rank() -> None:
    [waiting, sleeping, ended] = stalls.suspects_of(
        {0: IN_ALL_REDUCE, 1: SLEEPING, 2: ""}, [0, 1, 2], {0: 61.04, 1: 60.0}.get, lambda r: 40
    )
    assert waiting == {
        "rank": 0,
        "idle": 61.0,
        "step": 40,
        "inCollective": True,
        "collective": "all_reduce",
        "file": "/workspace/train.py",
        "line": 14,
        "function": "<module>",
    }
    assert sleeping == {
        "rank": 1,
        "idle": 60.0,
        "step": 40,
        "inCollective": False,
        "file": "/workspace/train.py",
        "line": 12,
        "function": "<module>",
    }
    # no stacks (it was ending): where it is is unknown, its last step is not
    assert ended == {"rank": 2, "step": 40}


def test_a_nodes_stalled_ranks_fit_the_termination_message_beside_a_long_stack() -> None:
    deep = "/" + "/".join(["very-long-folder-name"] * 20) + "/train.py"
    stacks = {
        r: IN_ALL_REDUCE.replace("/workspace/train.py", deep).replace("<module>", "f" * 200)
        for r in range(16)
    }
    suspects = stalls.suspects_of(stacks, list(stacks), lambda r: 61.0, lambda r: 40)
    assert len(suspects) == stalls.SUSPECTS_REPORTED
    info = {"reason": "Stalled", "message": "x" * 8000, "stall": {"suspects": suspects}}
    text = contract.termination_message(info)
    assert len(text.encode()) <= contract.TERMINATION_MESSAGE_LIMIT
    assert json.loads(text)["stall"]["suspects"] == suspects


def test_a_stall_waits_longer_for_the_other_nodes_to_report_theirs() -> None:
    node0 = stalled_node(0, {0: IN_ALL_REDUCE}, {0: 61}, 100.0, named=0)
    node1 = pod("r", 1, phase="Running", node_name="gpu-1")
    stall = first_failure([node0, node1])
    assert stall is not None and stall["reason"] == "Stalled"
    at = datetime.fromtimestamp(100.0 + 5, tz=timezone.utc)  # 5 s after node 0's rank exited
    wait = failures.settling(stall, [node0, node1], at)
    assert wait == failures.STALL_SETTLE_SECONDS - 5
    # A failure of its own kind is decided at once, other Pods running or not.
    error = {**stall, "reason": "Error"}
    assert failures.settling(error, [node0, node1], at) is None
    # Once every Pod reported, at once.
    assert failures.settling(stall, [node0], at) is None


def test_a_ddp_rank_stuck_outside_backward_is_named_across_nodes_and_on_its_own() -> None:
    # DDP, the GIL-held rank 1 (node 0) at its own line; ranks 0, 2, 3 wait in
    # loss.backward() (the autograd engine's all-reduce): no torch.distributed frame.
    from tests.unit.launcher.test_stalls import IN_BACKWARD

    for named0, idle in ((0, {0: 61.0, 1: 60.0}), (1, {0: 60.0, 1: 61.0})):
        node0 = stalled_node(0, {0: IN_BACKWARD, 1: SLEEPING}, idle, 100.0, named=named0)
        node1 = stalled_node(1, {2: IN_BACKWARD, 3: IN_BACKWARD}, {2: 62, 3: 61}, 99.0, named=2)
        for pods in ([node0, node1], [node1, node0]):
            failure = first_failure(pods)
            assert failure is not None
            assert (failure["rank"], failure["node"]) == (1, 0), failure
            if named0 == 0:  # only the comparison across nodes saw the one they wait for
                assert "rank 1 (node 0) made no progress for 6" in failure["message"]
                assert "stuck at /workspace/train.py:12 in <module>" in failure["message"]


# A dump whose threads show no Python frame: a rank dumped as its frames unwound (its
# peers went down and it was on its way out), which says nothing of where it stood.
NO_FRAME = (
    "Current thread 0x00007f0000000001 (most recent call first):\n  <no Python frame>\n\n"
    "Thread 0x00007f0000000002 (most recent call first):\n  <no Python frame>\n"
)


# (node 0's stalled ranks' dumps, node 1's, the rank named): DDP on the real node, a
# rank dumped with no frame at all beside the rank at fault (its idle time the longest)
NO_FRAME_CASES = {
    # rank 1 (node 0) ignores SIGTERM and sleeps at its line; ranks 0 and 2 wait in
    # backward: the rank at its place is named before the frame-less rank 3
    "a rank outside the collectives": (
        {1: SLEEPING, 0: "backward"},
        {3: NO_FRAME, 2: "backward"},
        1,
    ),
    # rank 3 (node 1) skipped a collective and waits in the barrier after its loop: the
    # odd one out of those whose dumps say where they are, frame-less rank 1 left out
    "a rank that skipped a collective": (
        {1: NO_FRAME, 0: "backward"},
        {3: IN_BARRIER, 2: "backward"},
        3,
    ),
}


@pytest.mark.parametrize("case", sorted(NO_FRAME_CASES))
def test_a_rank_whose_dump_shows_no_frame_says_nothing_of_where_it_is(case: str) -> None:
    from tests.unit.launcher.test_stalls import IN_BACKWARD

    assert stalls.stack_top(NO_FRAME) is None
    dumps0, dumps1, culprit = NO_FRAME_CASES[case]
    stacks = [
        {r: IN_BACKWARD if d == "backward" else d for r, d in dumps.items()}
        for dumps in (dumps0, dumps1)
    ]
    idle = {r: 16.0 if d == "backward" else 17.0 for r, d in {**dumps0, **dumps1}.items()}
    node0 = stalled_node(0, stacks[0], idle, 100.0, named=next(iter(dumps0)))
    node1 = stalled_node(1, stacks[1], idle, 100.2, named=next(iter(dumps1)))
    for pods in ([node0, node1], [node1, node0]):
        failure = first_failure(pods)
        assert failure is not None
        where = (culprit, culprit // 2, f"r-{culprit // 2}")
        assert (failure["rank"], failure["node"], failure["pod"]) == where, failure


def test_a_launcher_names_a_rank_at_its_place_before_one_whose_dump_shows_none() -> None:
    from tests.unit.launcher.test_stalls import IN_BACKWARD

    stacks: dict[int | None, str] = {0: IN_BACKWARD, 1: NO_FRAME, 2: SLEEPING}
    assert stalls.culprit(stacks, [1, 0, 2], 1) == 2
    # with nothing better, a frame-less rank outside the collectives is still named
    assert stalls.culprit({0: IN_BACKWARD, 1: NO_FRAME}, [1, 0], 1) == 1


def test_a_rank_a_step_ahead_of_the_others_is_named_when_the_stacks_cannot_tell() -> None:
    # explicit all_reduce, in local mode: rank 1 (node 0) skipped an all_reduce and waits in
    # the barrier after its loop (step 40); rank 0 waits in all_reduce (step 39); node 1's
    # ranks 2 and 3 (step 39) dumped "Garbage-collecting" with no frame
    node0 = stalled_node(
        0, {0: IN_ALL_REDUCE, 1: IN_BARRIER}, {0: 15.5, 1: 15.5}, 100.5, 0, {0: 39, 1: 40}
    )
    node1 = stalled_node(
        1, {3: NO_FRAME, 2: NO_FRAME}, {2: 17.0, 3: 17.0}, 101.5, 3, {2: 39, 3: 39}
    )
    for pods in ([node0, node1], [node1, node0]):
        failure = first_failure(pods)
        assert failure is not None
        assert (failure["rank"], failure["node"], failure["pod"]) == (1, 0, "r-0"), failure
    # the launcher's own pick, by the steps its ranks reported
    stacks: dict[int | None, str] = {0: IN_ALL_REDUCE, 1: IN_BARRIER, 2: NO_FRAME}
    steps = {0: 39, 1: 40, 2: 39}
    assert stalls.culprit(stacks, [2, 0, 1], 2, steps.get) == 1
    # all at one step, or two ranks only: the step says nothing
    assert stalls.culprit(stacks, [2, 0, 1], 2, lambda r: 39) == 2
    assert stalls.culprit(stacks, [2, 1], 2, steps.get) == 2


def test_a_rank_a_step_ahead_that_wrote_no_stacks_is_named_by_its_step() -> None:
    # torchrun on the real node: rank 3 (node 1) skipped a collective. Node 0 found the
    # stall first and stopped its ranks, which broke node 1's collectives: when node 1 took
    # its stacks (5 s later: it waited for them), rank 2 dumped in a garbage collection
    # and rank 3 had ended. Ranks 0 to 2 last reported step 39, rank 3 step 40.
    from tests.unit.launcher.test_stalls import IN_BACKWARD

    garbage = (
        "Current thread 0x00007ff448738040 (most recent call first):\n"
        "  Garbage-collecting\n  <no Python frame>\n"
    )
    node0 = stalled_node(
        0, {1: IN_BACKWARD, 0: IN_BACKWARD}, {0: 15.6, 1: 15.6}, 100.0, 1, {0: 39, 1: 39}, 100.0
    )
    node1 = stalled_node(
        1, {2: garbage, 3: ""}, {2: 21.0, 3: 20.8}, 105.4, 2, {2: 39, 3: 40}, 105.4
    )
    for pods in ([node0, node1], [node1, node0]):
        failure = first_failure(pods)
        assert failure is not None
        assert (failure["rank"], failure["node"], failure["pod"]) == (3, 1, "r-1"), failure
        assert (
            "rank 3 (node 1) made no progress for 21s (last step 40, ahead of every "
            "other stalled rank's 39): stuck at (no stacks"
        ) in failure["message"]
    # node 1's launcher alone cannot tell (two ranks); with a third at step 39 it can
    assert stalls.culprit({2: garbage, 3: ""}, [2, 3], 2, {2: 39, 3: 40}.get) == 2
    stacks: dict[int | None, str] = {0: IN_BACKWARD, 2: garbage, 3: ""}
    assert stalls.culprit(stacks, [2, 0, 3], 2, {0: 39, 2: 39, 3: 40}.get) == 3


def test_of_nodes_that_found_the_stall_apart_the_rank_whose_progress_stopped_first_is_named() -> (
    None
):
    # every rank in all_reduce at one line and step: nothing but time tells. Node 1 found
    # its stall 10 s after node 0, so its ranks were idle longer then; rank 0's last
    # progress came first.
    same = {0: 39, 1: 39, 2: 39, 3: 39}
    node0 = stalled_node(
        0, {0: IN_ALL_REDUCE, 1: IN_ALL_REDUCE}, {0: 61, 1: 60}, 100.0, 0, same, 100.0
    )
    node1 = stalled_node(
        1, {2: IN_ALL_REDUCE, 3: IN_ALL_REDUCE}, {2: 70, 3: 69}, 110.0, 2, same, 110.0
    )
    for pods in ([node0, node1], [node1, node0]):
        failure = first_failure(pods)
        assert failure is not None and (failure["rank"], failure["pod"]) == (0, "r-0"), failure
