"""Failure classes with advice: an ordered rule table over what a failed node Pod says.

:func:`classify` takes a failure's evidence (``Evidence``: exit code, signal, the
container's or launcher's reason, the failing rank's traceback tail and the lines the
launcher flagged in any rank's output, ``launch.output.LogScanner``) and returns the first
:class:`Rule` of ``RULES`` that matches: its ``name`` becomes ``status.failure.class``,
with ``retryable`` and ``advice``. The order matters: a GPU's Xid line explains the CUDA
error after it, a CUDA out-of-memory error the traceback around it; a collective timeout
(NCCL's watchdog, gloo's transport) is a *cascade* (another rank stalled or died first), so
:func:`prefer` picks a failure that explains it over it. :func:`signature` is what "the
same error at the same step" compares, so that a deterministic error stops the retries
after two attempts. The patterns of the classes that lines of any rank's output show
(``GpuXid``, ``CudaOOM``, ``Segfault``, ``RendezvousTimeout``, ``CollectiveTimeout``) are
``launch.contract.FAILURE_PATTERNS``, beside the launcher's flags for them.

Called by ``failures.observe_failure`` (the class of every failed Pod) and
``failures.first_failure``; the failure policy reads ``retryable``. Pure; tested as
tables over realistic logs in tests/unit/launcher/test_classes.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from torchyard.launch.contract import FAILURE_PATTERNS, STALLED_REASON


class Evidence(TypedDict, total=False):
    exitCode: int | None
    signal: int | None
    reason: str | None
    message: str  # the failing rank's traceback tail
    lines: Sequence[str]  # lines the launcher flagged in any rank's output


@dataclass(frozen=True)
class Rule:
    """One failure class: how to recognise it and what to do about it."""

    name: str
    retryable: bool
    advice: str
    patterns: tuple[str, ...] = ()  # any, searched in the message and flagged lines
    reasons: frozenset[str] = field(default_factory=frozenset)
    signals: frozenset[int] = field(default_factory=frozenset)
    exit_codes: frozenset[int] = field(default_factory=frozenset)
    cascade: bool = False  # a symptom of another rank's failure
    # May be what a rank sees of another's failure, though not always (a cascade always
    # is): the operator waits for the gang's other reports before deciding on one of
    # either (``failures.settling``).
    symptom: bool = False
    node_fault: bool = False  # the node, not the code: try elsewhere

    def matches(self, evidence: Evidence) -> str | None:
        """What matched (a line, the reason, the signal), None when nothing did."""
        if evidence.get("reason") in self.reasons:
            return f"reason {evidence.get('reason')}"
        if evidence.get("signal") in self.signals:
            return f"signal {evidence.get('signal')}"
        if evidence.get("exitCode") in self.exit_codes:
            return f"exit code {evidence.get('exitCode')}"
        # equivalent mutants: no pattern matches a stand-in for a missing message
        message = evidence.get("message") or ""  # pragma: no mutate
        for pattern in self.patterns:  # in order: the first pattern says it best
            for text in [*evidence.get("lines", ()), message]:
                found = re.search(pattern, text, re.MULTILINE)
                if found:
                    # equivalent mutants: the line is stripped, so where the search for
                    # the newline before it begins cannot change what is returned
                    start = text.rfind("\n", 0, found.start()) + 1  # pragma: no mutate
                    end = text.find("\n", found.end())
                    # (end is never 0: no pattern matches an empty string, so the mutants
                    # "end > 0" and "end >= 1" are equivalent and survive)
                    return text[start : end if end >= 0 else len(text)].strip()[:300]
        return None


GPU_XID = Rule(
    "GpuXid",
    retryable=True,
    node_fault=True,
    patterns=FAILURE_PATTERNS["GpuXid"],
    advice="the node's GPU reported a hardware error (Xid/ECC): the run is retried, and "
    "the node should be drained and checked (nvidia-smi -q, dmesg) before it takes work",
)
HANG = Rule(
    "Hang",
    retryable=True,
    reasons=frozenset({STALLED_REASON}),
    advice="a rank stopped making progress (torchyard.progress reports) for longer than "
    "the stall timeout: the message names it and where it was; every rank's stacks are "
    "archived in logs/node-<n>/stacks/. Look for a rank that skips a collective, waits on "
    "a lock or on I/O; raise policy.stallTimeoutSeconds if steps may take that long, or let "
    "the ranks say when they initialize, save or evaluate (torchyard.progress.report(step, "
    "phase='saving')) to get policy.stallBudgets instead",
)
CUDA_OOM = Rule(
    "CudaOOM",
    retryable=False,
    patterns=FAILURE_PATTERNS["CudaOOM"],
    advice="a rank ran out of GPU memory: use a smaller batch per rank, gradient "
    "accumulation or activation checkpointing, mixed precision, or "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; retrying alone would fail again",
)
HOST_OOM = Rule(
    "HostOOM",
    retryable=False,
    reasons=frozenset({"OOMKilled"}),
    advice="the node Pod went over its memory limit and the kernel killed it: give the "
    "run more memory (spec.resources.memory, per node Pod and shared by its ranks) or use "
    "less (smaller batches, fewer DataLoader workers, fewer processes per node)",
)
SEGFAULT = Rule(
    "Segfault",
    retryable=True,
    signals=frozenset({11}),
    exit_codes=frozenset({139}),
    patterns=FAILURE_PATTERNS["Segfault"],
    advice="a rank crashed in native code (SIGSEGV): usually a C extension built for "
    "another version of torch/CUDA/numpy, or a bug in one; check the packages of the "
    "Environment (one retry; the same crash at the same step stops the retries)",
)
IMPORT_ERROR = Rule(
    "ImportError",
    retryable=False,
    patterns=(r"^(ModuleNotFoundError|ImportError): .*",),
    advice="a module is missing from the image: add its package to the Environment's "
    "pip list (or use an image that has it), or ship the module with the source",
)
# What a rank's collective reports when a peer rank or its node went away while they
# exchanged data: gloo's tcp pair ("[../third_party/gloo/gloo/transport/tcp/pair.cc:598]
# Connection closed by peer [10.244.0.5]:6105", "Read error ...: Connection reset by
# peer"), NCCL's ncclRemoteError ("remote process exited or there was a network error").
PEER_LOST = Rule(
    "PeerLost",
    retryable=True,
    cascade=True,
    patterns=(
        r"Connection closed by peer",
        r"gloo/transport/tcp/pair\.cc.*(Connection reset by peer|Broken pipe)",
        r"remote process exited or there was a network error",
        r"ncclRemoteError",
        r"NCCL communicator was aborted",
    ),
    advice="a rank lost its connection to another rank in a collective: usually a symptom "
    "of that rank failing or its node going away first (see the other nodes' logs); if "
    "none did, look at the network between the nodes",
)
RENDEZVOUS = Rule(
    "RendezvousTimeout",
    retryable=True,
    symptom=True,  # a rank that lost the store may have lost rank 0, which holds it
    patterns=FAILURE_PATTERNS["RendezvousTimeout"],
    advice="the ranks could not meet at MASTER_ADDR:MASTER_PORT: check that every node Pod "
    "started (none Pending), that no NetworkPolicy blocks the port between them, and that "
    "rank 0 listens (a script that calls init_process_group late keeps the others waiting)",
)
COLLECTIVE_TIMEOUT = Rule(
    "CollectiveTimeout",
    retryable=True,
    cascade=True,
    patterns=FAILURE_PATTERNS["CollectiveTimeout"],
    advice="a collective timed out waiting for a rank (NCCL's watchdog on GPUs, gloo's "
    "transport on CPUs): usually a symptom of another rank that hung or died first (see "
    "its log and stacks); if none did, look for a rank that skips a collective or is much "
    "slower, or raise the timeout of init_process_group",
)
# A rank that exits with status 0 while its peers still train (``failures.early_exit``
# names it when they then fail of losing it): uneven data per rank, a ``return`` or
# ``sys.exit(0)`` taken on some ranks only.
EARLY_EXIT = Rule(
    "EarlyExit",
    retryable=False,
    reasons=frozenset({"EarlyExit"}),
    advice="a rank finished (exit status 0) while the other ranks still trained, and they "
    "then failed waiting for it (in a collective, or at the rendezvous it never joined): "
    "give every rank the same number of steps (DistributedSampler with drop_last=True, or "
    "torch.distributed.algorithms.Join for uneven inputs) and make sure no rank returns, "
    "calls sys.exit or skips init_process_group early; a retry would end the same way",
)
PYTHON_EXCEPTION = Rule(
    "PythonException",
    retryable=True,
    patterns=(r"^[\w.]+(Error|Exception|Interrupt)\b.*", r"^Traceback \(most recent call last\)"),
    advice="the training script raised: fix the error in the traceback (retried within "
    "policy.backoffLimit; the same error at the same step twice stops the retries)",
)

RULES: tuple[Rule, ...] = (
    EARLY_EXIT,
    GPU_XID,
    HANG,
    CUDA_OOM,
    HOST_OOM,
    SEGFAULT,
    IMPORT_ERROR,
    PEER_LOST,
    RENDEZVOUS,
    COLLECTIVE_TIMEOUT,
    PYTHON_EXCEPTION,
)
BY_NAME = {rule.name: rule for rule in RULES}


def evidence_of(failure: Mapping[str, Any], flagged: Any) -> Evidence:
    """The evidence of ``failure`` (its exit code, signal, reason and message) with the
    lines the launcher flagged (a termination message's ``evidence``)."""
    lines = [str(e.get("line", "")) for e in flagged if isinstance(e, dict)] if flagged else []
    return {
        "exitCode": failure.get("exitCode"),
        "signal": failure.get("signal"),
        "reason": failure.get("reason"),
        "message": failure.get("message") or "",
        "lines": lines,
    }


def classify(evidence: Evidence) -> tuple[Rule, str] | None:
    """The first rule that matches ``evidence`` and what matched, None for none."""
    for rule in RULES:
        matched = rule.matches(evidence)
        if matched is not None:
            return rule, matched
    return None


def prefer(failures: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """Of failures ordered first to last, the first that is not a cascade when there is
    one (a collective timeout is what the other ranks see of the rank that broke); else
    the first."""
    if not failures:
        return None
    for failure in failures:
        # equivalent mutants: no class is named like a stand-in for a missing one
        rule = BY_NAME.get(str(failure.get("failureClass") or ""))  # pragma: no mutate
        if rule is None or not rule.cascade:
            return failure
    return failures[0]


def signature(failure: Mapping[str, Any]) -> str:
    """'class|step|last line': what must differ between two failures for a retry to be
    worth it."""
    lines = str(failure.get("message") or "").strip().splitlines()
    kind = failure.get("failureClass") or failure.get("class") or failure.get("reason")
    last = lines[-1] if lines else ""
    return f"{kind}|{failure.get('step')}|{last}"[:500]
