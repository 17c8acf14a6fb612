"""What torchrun's output says (``launch: node``): the rank its failure summary names as the
root cause, and the worker's traceback before its own. Standard library only; tested in
tests/unit/launcher/test_early_exits.py."""

from __future__ import annotations

import re
from collections.abc import Sequence

from torchyard.launch.contract import traceback_tail

TORCHRUN_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank", re.MULTILINE)
# torchrun's own log lines (logging's default format), e.g. "ERROR:torch.distributed.
# elastic.multiprocessing.api:failed (exitcode: 1) ..." after a worker's traceback
TORCHRUN_LOG = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL):torch\.distributed\.")


def torchrun_root_cause(tail: Sequence[str]) -> int | None:
    """The rank torchrun's failure summary names as the root cause (its "Root Cause (first
    observed failure)" section; "Failures:" before it lists the others), None for none."""
    text = "".join(tail)
    root = text.rfind("Root Cause")
    found = TORCHRUN_RANK.findall(text[root:] if root >= 0 else text)
    return int(found[0]) if found else None


def worker_traceback(tail: Sequence[str]) -> str:
    """Before torch 2.2 (no ``[rankN]: `` prefix): the last traceback printed before
    torchrun's own (its ChildFailedError), which is a worker's, since torchrun prints its
    own after its workers ended, without torchrun's log lines that follow it (its last
    line is the error's); "" when there is none. (Which worker's, the text does not say:
    torchrun's summary names the rank.)"""
    lines = list(tail)
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call")]
    if len(starts) < 2 or "ChildFailedError" not in "".join(lines[starts[-1] :]):
        return ""
    worker = lines[starts[-2] : starts[-1]]
    while worker and (not worker[-1].strip() or TORCHRUN_LOG.match(worker[-1])):
        worker.pop()
    return traceback_tail(worker)
