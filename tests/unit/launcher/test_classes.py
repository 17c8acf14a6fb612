"""Failure classes over realistic evidence: what a failed node Pod's launcher said (exit
code, signal, reason, traceback tail, flagged lines) -> status.failure.class, retryable
and advice; a collective timeout (NCCL's watchdog, gloo's transport) is a cascade that a
failure explaining it wins over, else it names the node Pods it waited for."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.builders import pod
from torchyard.launch import classes
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
# NCCL's watchdog as torch 2.x prints it when a collective outlives init_process_group's
# timeout
NCCL_WATCHDOG = """[rank0]:[E ProcessGroupNCCL.cpp:1182] [Rank 0] Watchdog caught collective \
operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, \
Timeout(ms)=10000) ran for 10006 milliseconds before timing out."""
# what Debian's torch 1.13 (the pytorch image) said when rank 1 never joined an all_reduce
# of a gloo group with a 15 s timeout (tests/node/test_failure_classes.py's "collective")
GLOO = """Traceback (most recent call last):
  File "<string>", line 8, in <module>
  File "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", line 1541, \
in all_reduce
    work.wait()
RuntimeError: [./gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 15000ms for recv \
operation to complete"""
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
        ({"exitCode": 1, "message": NCCL}, "CollectiveTimeout", True),
        ({"exitCode": 1, "message": NCCL_WATCHDOG}, "CollectiveTimeout", True),
        ({"exitCode": 1, "message": GLOO}, "CollectiveTimeout", True),
        # the watchdog line flagged in another rank's output, this rank's traceback generic
        (
            {"exitCode": 1, "message": "RuntimeError: boom", "lines": [NCCL_WATCHDOG]},
            "CollectiveTimeout",
            True,
        ),
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


def test_a_collective_timeout_matches_the_line_that_says_it_timed_out() -> None:
    for text, line in [
        (NCCL_WATCHDOG, "Watchdog caught collective operation timeout"),
        (GLOO, "Timed out waiting 15000ms for recv operation to complete"),
    ]:
        found = classes.classify({"exitCode": 1, "message": text})
        assert found is not None and found[0] is classes.COLLECTIVE_TIMEOUT
        assert line in found[1] and found[0].cascade
    assert "NCCL's watchdog" in classes.COLLECTIVE_TIMEOUT.advice
    assert "gloo" in classes.COLLECTIVE_TIMEOUT.advice
    assert "NCCLTimeout" not in classes.BY_NAME
    assert classes.BY_NAME["CollectiveTimeout"] is classes.COLLECTIVE_TIMEOUT
    # a gloo peer that went away is not a timeout: it lost its peer (PeerLost)
    closed = "RuntimeError: [./gloo/transport/tcp/pair.cc:598] Connection closed by peer"
    found = classes.classify({"exitCode": 1, "message": closed})
    assert found is not None and found[0].name == "PeerLost"


# What the other ranks' collectives say when a peer rank or its node went away (gloo as
# Debian's torch 1.13 said it on the real node; NCCL's ncclRemoteError).
GLOO_CLOSED = (
    'Traceback (most recent call last):\n  File "train.py", line 30, in <module>\n'
    "RuntimeError: [./gloo/transport/tcp/pair.cc:598] Connection closed by peer "
    "[10.244.0.5]:6105"
)
GLOO_RESET = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
    "[10.244.0.7]:39217: Connection reset by peer"
)
NCCL_REMOTE = (
    "torch.distributed.DistBackendError: NCCL error in: "
    "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, remote process exited or "
    "there was a network error, NCCL version 2.19.3\nncclRemoteError: A call failed possibly "
    "due to a network error or a remote process exiting prematurely."
)


@pytest.mark.parametrize("text", [GLOO_CLOSED, GLOO_RESET, NCCL_REMOTE])
def test_a_collective_that_lost_its_peer_is_a_cascade_not_the_ranks_own_error(text: str) -> None:
    found = classes.classify({"exitCode": 1, "message": text})
    assert found is not None and found[0] is classes.PEER_LOST, found
    assert found[0].cascade and found[0].retryable
    # an earlier real error on another node explains it
    peer = {"failureClass": "PeerLost", "node": 0}
    culprit = {"failureClass": "PythonException", "node": 1}
    assert classes.prefer([peer, culprit]) is culprit


def test_only_classes_that_may_be_another_ranks_failure_are_symptoms() -> None:
    waits = {rule.name for rule in classes.RULES if rule.cascade or rule.symptom}
    assert waits == {"PeerLost", "RendezvousTimeout", "CollectiveTimeout"}


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
    assert only is not None and only["failureClass"] == "CollectiveTimeout"


def test_a_gloo_timeout_after_an_earlier_real_error_names_the_error() -> None:
    # node 1's rank raised first; node 0's rank then timed out in gloo waiting for it
    culprit = launcher_pod(1, PYTHON, 100.0, step=3)
    timeout = launcher_pod(0, GLOO, 115.0, step=3)
    chosen = first_failure([timeout, culprit])
    assert chosen is not None
    assert (chosen["node"], chosen["failureClass"]) == (1, "PythonException")
    assert "timed out in a collective" not in chosen["advice"]
    assert classes.prefer([observe_failure(timeout), observe_failure(culprit)]) == (
        observe_failure(culprit)
    )


def running_pod(node: int, procs: int) -> dict[str, Any]:
    running = pod("r", node, phase="Running")
    running["spec"]["containers"][0]["env"] = [{"name": "LOCAL_WORLD_SIZE", "value": str(procs)}]
    return running


def test_a_collective_timeout_alone_names_the_nodes_it_waited_for() -> None:
    # rank 0 timed out in gloo; node 1's rank (asleep, or stuck) never joined and still runs
    chosen = first_failure([launcher_pod(0, GLOO, 115.0), running_pod(1, 1)])
    assert chosen is not None and chosen["failureClass"] == "CollectiveTimeout"
    assert (chosen["rank"], chosen["node"], chosen["pod"]) == (0, 0, "r-0")
    assert chosen["advice"].startswith(
        "rank 0 (node 0) timed out in a collective while node 1 (Pod r-1, rank 1) still ran "
        "and had not failed: its ranks never joined the collective"
    ), chosen["advice"]
    assert chosen["advice"].endswith(
        "(matched: RuntimeError: [./gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
        "waiting 15000ms for recv operation to complete)"
    )
    # two nodes of four ranks each still running: both named, with their ranks
    many = first_failure(
        [launcher_pod(0, NCCL_WATCHDOG, 5.0), running_pod(2, 4), running_pod(1, 4)]
    )
    assert many is not None
    assert (
        "while node 1 (Pod r-1, ranks 4-7), node 2 (Pod r-2, ranks 8-11) still ran"
        in (many["advice"])
    )
    assert "their ranks never joined" in many["advice"]
    # every other node failed too: nobody to name, the rule's advice alone
    alone = first_failure([launcher_pod(0, GLOO, 115.0)])
    assert alone is not None and alone["advice"].startswith("a collective timed out")
    # a failure that is no cascade is never annotated
    raised = first_failure([launcher_pod(0, PYTHON, 1.0), running_pod(1, 1)])
    assert raised is not None and raised["advice"].startswith("the training script raised")


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


def test_the_crd_names_every_class_in_the_order_they_are_checked() -> None:
    from torchyard.api.trainingrun_status import FAILURE_CLASSES

    assert tuple(rule.name for rule in classes.RULES) == FAILURE_CLASSES


LONG = "ValueError: " + "x" * 400


@pytest.mark.parametrize(
    ("evidence", "matched"),
    [
        ({"reason": "OOMKilled", "exitCode": 137}, "reason OOMKilled"),
        ({"signal": 11, "exitCode": 1}, "signal 11"),
        ({"exitCode": 139}, "exit code 139"),
        # the whole line the pattern found, stripped, and no other line
        ({"message": "loading\nImportError: no foo  \nafter\nmore"}, "ImportError: no foo"),
        ({"message": "ImportError: first line\nafter"}, "ImportError: first line"),
        ({"message": "before\nImportError: last line"}, "ImportError: last line"),
        ({"message": "\nImportError: after an empty line"}, "ImportError: after an empty line"),
        ({"lines": ["ImportError: flagged"]}, "ImportError: flagged"),
        ({"message": LONG}, LONG[:300]),  # at most 300 characters
    ],
)
def test_what_matched_is_said_exactly(evidence: Any, matched: str) -> None:
    found = classes.classify(evidence)
    assert found is not None and found[1] == matched


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        ({"failureClass": "CudaOOM", "step": 4, "message": "a\nb\n"}, "CudaOOM|4|b"),
        ({"failureClass": "CudaOOM", "class": "Other", "step": 4}, "CudaOOM|4|"),
        ({"class": "Segfault", "step": 2, "message": "one line"}, "Segfault|2|one line"),
        ({"reason": "OOMKilled", "message": None}, "OOMKilled|None|"),
        ({"failureClass": "PythonException", "step": 1, "message": LONG * 2}, None),
    ],
)
def test_a_signature_is_class_step_and_last_line_within_500_characters(
    failure: Any, expected: str | None
) -> None:
    said = classes.signature(failure)
    if expected is None:
        assert said == f"PythonException|1|{LONG * 2}"[:500] and len(said) == 500
    else:
        assert said == expected
