"""Bad nodes as pure functions of the decided failure and the attempt before's
(``status.lastFailure``): the same node in two consecutive failures is left out
(``RepeatedFailure``, both failures as evidence), unless it is the same error at the same
step (the code's), an error the code alone explains, or a cascade whose root cause is
elsewhere; a cascade names the root cause's node. The controller's use of them is in
tests/unit/controller/test_bad_nodes.py."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from tests.builders import pod
from torchyard.status import exclusions, failures

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
SEGFAULT = "Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):"
VALUE_ERROR = 'Traceback (most recent call last):\n  File "train.py", line 9\nValueError: nan'
NCCL = (
    "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE) ran for 600000 milliseconds"
)
CUDA_OOM = "Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory."


def failed_pod(
    node: int, node_name: str, message: str, step: int, exited: float, **info: Any
) -> dict[str, Any]:
    launcher = {
        "rank": 2 * node,
        "nodeRank": node,
        "exitCode": info.pop("exitCode", 1),
        "reason": "Error",
        "message": message,
        "step": step,
        "exitedAt": exited,
        **info,
    }
    return pod(
        "r",
        node,
        phase="Failed",
        node_name=node_name,
        exit_code=launcher["exitCode"],
        message=json.dumps(launcher),
    )


def decided(*pods: dict[str, Any]) -> failures.Failure:
    failure = failures.first_failure(list(pods))
    assert failure is not None
    return failure


def last(failure: failures.Failure) -> dict[str, Any]:
    """What status.lastFailure keeps of it."""
    return failures.public_failure(failure)


def test_the_failing_ranks_node_is_kept_in_the_failure_status_shows() -> None:
    failure = decided(failed_pod(1, "gpu-1", SEGFAULT, 5, 100.0, exitCode=139))
    assert last(failure)["nodeName"] == "gpu-1"


def test_two_consecutive_failures_on_one_node_leave_it_out_with_both_as_evidence() -> None:
    before = decided(failed_pod(1, "gpu-1", SEGFAULT, 5, 100.0, exitCode=139))
    now = decided(failed_pod(1, "gpu-1", VALUE_ERROR, 9, 200.0))
    entry = exclusions.of_failure(now, NOW, last(before))
    assert entry == {
        "node": "gpu-1",
        "reason": "RepeatedFailure",
        "evidence": "two consecutive failures on gpu-1: Segfault at step 5: Current thread "
        "0x1 (most recent call first):; then PythonException at step 9: ValueError: nan",
        "since": "2026-01-01T12:00:00Z",
    }


def test_no_exclusion_without_a_failure_before_or_on_another_node() -> None:
    before = decided(failed_pod(0, "gpu-0", SEGFAULT, 5, 100.0, exitCode=139))
    now = decided(failed_pod(1, "gpu-1", VALUE_ERROR, 9, 200.0))
    assert exclusions.of_failure(now, NOW, None) is None
    assert exclusions.of_failure(now, NOW, last(before)) is None


def test_the_same_error_at_the_same_step_blames_the_code_not_the_node() -> None:
    before = decided(failed_pod(1, "gpu-1", VALUE_ERROR, 9, 100.0))
    now = decided(failed_pod(1, "gpu-1", VALUE_ERROR, 9, 200.0))
    assert exclusions.repeated_on(now, last(before)) is None
    assert exclusions.of_failure(now, NOW, last(before)) is None


def test_an_error_the_code_alone_explains_blames_no_node() -> None:
    oom = decided(failed_pod(1, "gpu-1", CUDA_OOM, 3, 100.0))
    assert oom["failureClass"] == "CudaOOM"
    other = decided(failed_pod(1, "gpu-1", VALUE_ERROR, 9, 200.0))
    assert exclusions.repeated_on(other, last(oom)) is None
    assert exclusions.repeated_on(oom, last(other)) is None


def test_a_cascade_names_the_root_causes_node() -> None:
    # gpu-0's rank timed out in NCCL first, because gpu-1's rank had crashed: gpu-1 is
    # the root cause, both times.
    cascade = failed_pod(0, "gpu-0", NCCL, 7, 100.0)
    root = failed_pod(1, "gpu-1", SEGFAULT, 7, 101.0, exitCode=139)
    before = decided(cascade, root)
    assert (before["failureClass"], before["nodeName"]) == ("Segfault", "gpu-1")
    now = decided(
        failed_pod(0, "gpu-0", NCCL, 12, 200.0), failed_pod(1, "gpu-1", VALUE_ERROR, 12, 201.0)
    )
    entry = exclusions.of_failure(now, NOW, last(before))
    assert entry is not None and entry["node"] == "gpu-1"


def test_a_cascade_with_no_root_cause_found_blames_no_node() -> None:
    before = decided(failed_pod(0, "gpu-0", NCCL, 7, 100.0))
    now = decided(failed_pod(0, "gpu-0", NCCL, 12, 200.0))
    assert before["failureClass"] == now["failureClass"] == "CollectiveTimeout"
    assert exclusions.of_failure(now, NOW, last(before)) is None


def test_a_preempted_pod_says_nothing_of_its_node() -> None:
    preempted = {"reason": "Preempted", "nodeName": "gpu-1", "message": "preempted"}
    crash = decided(failed_pod(1, "gpu-1", SEGFAULT, 5, 100.0, exitCode=139))
    assert exclusions.repeated_on(crash, preempted) is None


def test_a_gpu_xid_names_its_node_whatever_came_before() -> None:
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
    failure = decided(failed_pod(1, "gpu-1", VALUE_ERROR, 5, 100.0, evidence=[{"line": xid}]))
    entry = exclusions.of_failure(failure, NOW, None)
    assert entry is not None and (entry["node"], entry["reason"]) == ("gpu-1", "GpuXid")
