"""Failure classes over realistic evidence: what a failed node Pod's launcher said (exit
code, signal, reason, traceback tail, flagged lines) -> status.failure.class, retryable
and advice; an NCCL timeout is a cascade that a failure explaining it wins over."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.builders import pod
from torchyard.status import classes
from torchyard.status.failures import first_failure, observe_failure, public_failure

CUDA_OOM = """Traceback (most recent call last):
  File "/workspace/train.py", line 88, in <module>
    loss.backward()
  File "/usr/lib/python3/dist-packages/torch/_tensor.py", line 525, in backward
    torch.autograd.backward(
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total \
capacity of 79.15 GiB of which 1.12 GiB is free. Of the allocated memory 75.3 GiB is \
allocated by PyTorch"""
IMPORT = """Traceback (most recent call last):
  File "/workspace/train.py", line 3, in <module>
    import timm
ModuleNotFoundError: No module named 'timm'"""
RENDEZVOUS = """Traceback (most recent call last):
  File "/workspace/train.py", line 12, in <module>
    dist.init_process_group("gloo")
  File "/usr/lib/python3/dist-packages/torch/distributed/rendezvous.py", line 189, in \
_create_c10d_store
    return TCPStore(
torch.distributed.DistStoreError: Timed out after 31 seconds waiting for clients. \
1/2 clients joined."""
NCCL = """[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation \
timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE, NumelIn=1048576, Timeout(ms)=600000) ran for \
600012 milliseconds before timing out.
RuntimeError: [Rank 1] NCCL watchdog thread terminated with exception"""
# what torch 2.x said on the real node when node 1 never joined (tests/node)
CLIENT_TIMEOUT = """Traceback (most recent call last):
  File "<string>", line 4, in <module>
TimeoutError: The client socket has timed out after 10s while trying to connect to \
(rdzv-0.rdzv.ns.svc, 6105)."""
PYTHON = """Traceback (most recent call last):
  File "/workspace/train.py", line 40, in <module>
    batch = next(it)
KeyError: 'label'"""
SEGV = "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):"
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."


@pytest.mark.parametrize(
    ("evidence", "name", "retryable"),
    [
        ({"exitCode": 1, "message": CUDA_OOM}, "CudaOOM", False),
        ({"exitCode": 137, "signal": 9, "reason": "OOMKilled", "message": ""}, "HostOOM", False),
        ({"exitCode": 139, "signal": 11, "message": SEGV}, "Segfault", True),
        ({"exitCode": 139, "message": ""}, "Segfault", True),
        ({"exitCode": 1, "message": IMPORT}, "ImportError", False),
        ({"exitCode": 1, "message": RENDEZVOUS}, "RendezvousTimeout", True),
        ({"exitCode": 1, "message": CLIENT_TIMEOUT}, "RendezvousTimeout", True),
        ({"exitCode": 1, "message": NCCL}, "NCCLTimeout", True),
        ({"exitCode": 1, "message": PYTHON}, "PythonException", True),
        # the Xid line came before a CUDA error: the hardware explains it
        (
            {"exitCode": 1, "message": "RuntimeError: CUDA error: unknown error", "lines": [XID]},
            "GpuXid",
            True,
        ),
        ({"exitCode": 1, "message": "uncorrectable ECC error encountered"}, "GpuXid", True),
    ],
)
def test_each_class_is_recognised(evidence: Any, name: str, retryable: bool) -> None:
    found = classes.classify(evidence)
    assert found is not None
    rule, matched = found
    assert (rule.name, rule.retryable) == (name, retryable)
    assert rule.advice and matched


def test_nothing_known_is_no_class() -> None:
    assert classes.classify({"exitCode": 2, "message": "usage: train.py [-h]"}) is None
    assert classes.classify({"exitCode": 137, "signal": 9, "message": ""}) is None  # a SIGKILL


def launcher_pod(node: int, message: str, exited: float, **extra: Any) -> dict[str, Any]:
    info = {"rank": node, "nodeRank": node, "exitCode": 1, "reason": "Error", "message": message}
    return pod(
        "r",
        node,
        phase="Failed",
        exit_code=1,
        message=json.dumps(dict(info, exitedAt=exited, **extra)),
    )


def test_the_status_says_class_retryable_and_advice_with_what_matched() -> None:
    failure = observe_failure(launcher_pod(0, IMPORT, 1.0, step=0))
    assert failure is not None
    shown = public_failure(failure)
    assert (shown["class"], shown["retryable"], shown["step"]) == ("ImportError", False, 0)
    assert "Environment's pip list" in shown["advice"]
    assert "No module named 'timm'" in shown["advice"]


def test_evidence_lines_from_the_launcher_are_classified() -> None:
    evidence = [{"rank": 1, "line": XID}]
    failure = observe_failure(
        launcher_pod(1, "RuntimeError: CUDA error: unknown error", 1.0, evidence=evidence)
    )
    assert failure is not None and failure["failureClass"] == "GpuXid"
    assert XID in failure["advice"]


def test_an_nccl_timeout_is_a_cascade_the_rank_that_broke_wins_over() -> None:
    # node 1 timed out first (its watchdog fired), node 0's rank raised a bit later: the
    # exception explains the timeout
    timeout = launcher_pod(1, NCCL, 100.0)
    culprit = launcher_pod(0, PYTHON, 101.0)
    chosen = first_failure([timeout, culprit])
    assert chosen is not None and (chosen["node"], chosen["failureClass"]) == (
        0,
        "PythonException",
    )
    # nothing else explains it: the timeout is the failure
    only = first_failure([timeout])
    assert only is not None and only["failureClass"] == "NCCLTimeout"


def test_a_log_rule_that_cancels_retries_makes_the_failure_final() -> None:
    hit = {"index": 0, "pattern": "illegal memory", "action": "cancelRetries", "line": "x"}
    failure = observe_failure(launcher_pod(0, PYTHON, 1.0, logRule=hit))
    assert failure is not None and failure["retryable"] is False
    assert failure["advice"].startswith("policy.logRules[0] ('illegal memory') matched 'x'")


def test_the_same_error_at_the_same_step_has_the_same_signature() -> None:
    first = observe_failure(launcher_pod(0, PYTHON, 1.0, step=40))
    again = observe_failure(launcher_pod(1, PYTHON, 9.0, step=40))
    later = observe_failure(launcher_pod(0, PYTHON, 9.0, step=41))
    assert first and again and later
    assert classes.signature(first) == classes.signature(again)
    assert classes.signature(public_failure(first)) == classes.signature(first)
    assert classes.signature(later) != classes.signature(first)
