"""The stuck rank across nodes: the launcher's ``culprit`` rules over every node's stalls.

A node's launcher sees only its own ranks: in a gang where rank 3 (node 1) sleeps while
every other rank waits in an ``all_reduce``, node 0's launcher finds all of its ranks in
``torch.distributed`` and names the one idle longest, which only waits. Each node's
``Stalled`` termination message lists its stalled ranks (``stall.suspects``, from the
launcher's ``suspects_of``: rank, seconds idle, last step, whether in
``torch.distributed``, the script's file:line; a rank that wrote no stacks: only the
first three). :func:`pick` applies the launcher's rule (``launch.contract.culprit_rule``,
the one copy) to those of all nodes together, the one whose progress stopped first
first (its node's ``detectedAt`` less its seconds idle then; nodes find their stalls
seconds apart): the only ranks outside ``torch.distributed`` while others are in it,
else, of three or more, the one whose place in the script differs from where all the
others are (it skipped a collective and waits in another one), else the one whose last
step differs from all the others', else the first. :func:`across_nodes` turns the pick into
the failure to decide on: the reporting node's own, named after the culprit when that
node named another of its ranks.

Called by ``failures.first_failure``; pure; tested in tests/unit/status/test_culprits.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torchyard.launch.contract import STALLED_REASON, culprit_rule, waiting_words

STALLED = STALLED_REASON  # failures.STALLED (failures imports this module)

LAST_PROGRESS = "lastProgressAt"  # what across_nodes adds to each suspect

Place = tuple[Any, Any, Any]  # (file, line, function) of the script


def _suspects(failure: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    stall = failure.get("stall")
    found = stall.get("suspects") if isinstance(stall, Mapping) else None
    if not isinstance(found, list):
        return []
    return [s for s in found if isinstance(s, Mapping) and isinstance(s.get("rank"), int)]


def _place(suspect: Mapping[str, Any]) -> Place | None:
    if suspect.get("file") is None:
        return None
    return suspect.get("file"), suspect.get("line"), suspect.get("function")


def _idle(suspect: Mapping[str, Any]) -> float:
    idle = suspect.get("idle")
    return float(idle) if isinstance(idle, (int, float)) else 0.0


def _since(suspect: Mapping[str, Any]) -> float | None:
    since = suspect.get(LAST_PROGRESS)
    return float(since) if isinstance(since, (int, float)) else None


def pick(suspects: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The suspect the others wait for (see the module docstring); None for none."""
    if not suspects:
        return None
    known = [_since(s) for s in suspects]
    if all(since is not None for since in known):
        # each node measured idle when it found its stall: when each rank last made
        # progress compares ranks of nodes that found theirs seconds apart
        ordered = sorted(suspects, key=lambda s: _since(s) or 0.0)
    else:
        ordered = sorted(suspects, key=lambda s: -_idle(s))
    return culprit_rule(
        ordered,
        ordered[0],
        lambda s: bool(s.get("inCollective")),
        _place,
        lambda s: s.get("step") if isinstance(s.get("step"), int) else None,
    )


def _with_since(failure: Mapping[str, Any], suspect: Mapping[str, Any]) -> Mapping[str, Any]:
    """``suspect`` with when it last made progress (Unix time): its node's ``detectedAt``
    less its seconds idle then; as it was when either is unknown."""
    stall = failure.get("stall")
    found = stall.get("detectedAt") if isinstance(stall, Mapping) else None
    idle = suspect.get("idle")
    if not isinstance(found, (int, float)) or not isinstance(idle, (int, float)):
        return suspect
    return {**suspect, LAST_PROGRESS: float(found) - float(idle)}


def _suspect_sentence(
    suspect: Mapping[str, Any], node: Any, others: Sequence[Mapping[str, Any]]
) -> str:
    place = _place(suspect)
    if place is not None:
        at = f"{place[0]}:{place[1]} in {place[2]}"
    elif "inCollective" in suspect:
        at = "(no Python stack)"
    else:
        at = "(no stacks: it wrote none)"
    if suspect.get("collective"):
        at += f" ({waiting_words(str(suspect['collective']))})"
    step, steps = suspect.get("step"), {s.get("step") for s in others}
    ahead = ""
    theirs = next(iter(steps)) if len(steps) == 1 else None
    if isinstance(step, int) and isinstance(theirs, int) and step != theirs:
        where = "ahead of" if step > theirs else "behind"
        ahead = f", {where} every other stalled rank's {theirs}"
    return (
        f"rank {suspect['rank']} (node {node}) made no progress for "
        f"{_idle(suspect):.0f}s (last step {step}{ahead}): stuck at {at}"
    )


def across_nodes(failures: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """Of ``failures`` (a gang's, first to last), the ``Stalled`` one of the node whose
    rank the others wait for, named after that rank; None when fewer than two stalled
    ranks were reported (nothing to compare: the launcher's pick stands)."""
    stalled = [f for f in failures if f.get("reason") == STALLED and _suspects(f)]
    everyone = [(f, _with_since(f, s)) for f in stalled for s in _suspects(f)]
    if len(everyone) < 2:
        return None
    chosen = pick([s for _, s in everyone])
    failure, suspect = next((f, s) for f, s in everyone if s is chosen)
    if suspect["rank"] == failure.get("rank"):
        return failure
    # Its own node named another rank: only this comparison saw the one they wait for.
    named = [f"rank {f.get('rank')} (node {f.get('node')})" for f in stalled]
    others = [s for _, s in everyone if s is not chosen]
    message = (
        f"{_suspect_sentence(suspect, failure.get('node'), others)}; "
        "of the stalled ranks of every node, "
        f"the one the others wait for (the nodes' launchers named {', '.join(named)}). "
        f"Every rank's stacks are in logs/stacks/ of its node."
    )
    out = {**failure, "rank": suspect["rank"], "message": message}
    if isinstance(suspect.get("step"), int):
        out["step"] = suspect["step"]
    return out
