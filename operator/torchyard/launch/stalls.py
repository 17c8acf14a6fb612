"""Stalled ranks: a hook that makes every rank write its stacks on SIGUSR1, what a stack
dump says (where a rank is, whether it waits for the others in ``torch.distributed``), and
which stalled rank the others wait for (:func:`culprit`, :func:`describe_stall`).

Standard library only, Python >= 3.8; shipped with the launcher, whose
``Launcher._check_stall`` finds a rank past its stall timeout (``ProgressTracker.stalled``)
and calls these. The operator applies the same rule (``contract.culprit_rule``) to
every node's ``suspects_of``. Tested in tests/unit/launcher/test_stalls.py and
tests/unit/status/test_culprits.py.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torchyard.launch.contract import (
    RANK,
    STALL_BUDGETS,
    TORCHYARD_GPUS_PER_NODE,
    TORCHYARD_STACKS_DIR,
    TORCHYARD_STALL_BUDGETS,
    TORCHYARD_STALL_FLOOR,
    TORCHYARD_STALL_TIMEOUT,
    culprit_rule,
    int_env,
    waiting_words,
)
from torchyard.launch.tracker import ProgressTracker

# Installed as ``sitecustomize`` in a folder first on the ranks' PYTHONPATH: every rank
# registers faulthandler on SIGUSR1, writing all its threads' stacks to a file of its own
# (no ptrace: works under Pod Security "restricted"), then runs any other sitecustomize.
_STACK_HOOK = """\"\"\"torchyard: SIGUSR1 writes this rank's stacks to a file (faulthandler).\"\"\"
import atexit
import os
import sys


def _torchyard_stacks():
    try:
        import faulthandler
        import signal

        folder = os.environ.get("@STACKS_DIR@", "")
        rank = os.environ.get("@RANK@", "")
        if folder and rank and hasattr(signal, "SIGUSR1"):
            name = "rank-%s.pid-%d.txt" % (rank, os.getpid())
            out = open(os.path.join(folder, name), "w")
            faulthandler.register(signal.SIGUSR1, file=out, all_threads=True, chain=False)
            sys._torchyard_stacks = out
    except Exception:
        pass


def _torchyard_settle():
    # At exit, after the script's own atexit handlers: a torch.distributed gloo worker
    # thread destroys its last collective's work after the script saw it complete, and
    # that drops Python references, so it takes the GIL. If it gets there after the
    # interpreter began to finalize, Python ends the thread inside a C++ destructor and
    # the whole process aborts ("terminate called without an active exception", SIGABRT)
    # although the script ended well; a loaded machine delays the worker enough. Holding
    # the interpreter a moment with the GIL released lets the workers finish first. Only
    # after a clean end (the process group destroyed, no exception): a rank that failed
    # with work still queued would let its workers start the next collective and wait.
    dist = sys.modules.get("torch.distributed")
    if dist is None or getattr(sys, "last_value", None) is not None:
        return
    try:
        if dist.is_initialized():
            return
    except Exception:
        return
    import time

    time.sleep(0.2)


def _torchyard_chain():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_torchyard_stacks()
atexit.register(_torchyard_settle)
_torchyard_chain()
"""
STACK_HOOK = _STACK_HOOK.replace("@STACKS_DIR@", TORCHYARD_STACKS_DIR).replace("@RANK@", RANK)
_FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in (.*)$')
STALL_FLOOR_SECONDS = 300  # the adaptive stall timeout's floor (TORCHYARD_STALL_FLOOR)


def stall_budgets(text: str) -> dict[str, float]:
    """TORCHYARD_STALL_BUDGETS (JSON ``{phase: seconds}``, policy.stallBudgets) as a dict;
    names other than those of STALL_BUDGETS and values that are not positive numbers are
    dropped (the operator's schema refuses them before they get here)."""
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in data.items()
        if k in STALL_BUDGETS and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
    }


STACKS_WAIT_SECONDS = 5.0


def prune_empty(folder: str) -> None:
    """Remove the empty files of ``folder`` (each rank's stack file stays empty unless its
    stacks were asked for), then the folder if nothing is left: the archived logs keep
    only stacks that were written."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        path = os.path.join(folder, name)
        try:
            if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) == 0:
                os.unlink(path)
        except OSError:
            pass
    with contextlib.suppress(OSError):
        os.rmdir(folder)  # only when empty


def install_stack_hook(env: dict[str, str], logs: str) -> tuple[str, str]:
    """Make every rank write its stacks on SIGUSR1 to ``logs/stacks/`` (``STACK_HOOK``), and
    for GPU runs enable PyTorch's NCCL flight recorder, dumped there on a timeout. Returns
    the stacks folder and the hook's own temporary folder, which the caller removes once
    the ranks are gone (read only as an interpreter starts)."""
    import tempfile

    stacks = os.path.join(logs, "stacks")
    os.makedirs(stacks, exist_ok=True)
    hook = tempfile.mkdtemp(prefix="torchyard-hook-")
    with open(os.path.join(hook, "sitecustomize.py"), "w") as f:
        f.write(STACK_HOOK)
    # Last: before the interpreter's own folders (where a distribution's sitecustomize is,
    # run after ours), after the image's (a sitecustomize there wins, and no stacks come).
    env["PYTHONPATH"] = (env["PYTHONPATH"] + os.pathsep if env.get("PYTHONPATH") else "") + hook
    env[TORCHYARD_STACKS_DIR] = stacks
    if int_env(env, TORCHYARD_GPUS_PER_NODE, 0) > 0:
        env.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
        env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
        env.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", os.path.join(stacks, "nccl-trace-rank-"))
    return stacks, hook


_STACK_FILE = re.compile(r"^rank-(\d+)\.pid-(\d+)\.txt$")


def _parent(pid: int) -> int | None:
    """The parent of a process (Linux: /proc), None when it is gone or unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def rank_processes(stacks: str, root: int) -> list[tuple[int | None, int]]:
    """(rank, pid) of the live processes under ``root`` (the node command: torchrun, ...)
    that opened a stack file in ``stacks`` (``STACK_HOOK``: the file names say both), so
    that only the node command's own ranks are signalled."""
    found: list[tuple[int | None, int]] = []
    for name in sorted(os.listdir(stacks)) if os.path.isdir(stacks) else []:
        match = _STACK_FILE.match(name)
        if not match:
            continue
        pid, hops = int(match.group(2)), 0
        parent: int | None = pid
        while parent not in (None, 0, 1, root) and hops < 32:
            parent, hops = _parent(int(parent or 0)), hops + 1
        if parent == root and pid != root:
            found.append((int(match.group(1)), pid))
    return found


def stack_top(text: str) -> tuple[str, int, str] | None:
    """(file, line, function) where a faulthandler dump's thread is: the innermost frame of
    the thread the signal interrupted ("Current thread"), else of the last thread listed
    (the main thread), None when the dump has no frame."""
    frames = _frames(text)
    return frames[0] if frames else None


def _frames(text: str) -> list[tuple[str, int, str]]:
    """The frames of a faulthandler dump's interrupted thread (else its last one), innermost
    first."""
    blocks: list[tuple[bool, list[tuple[str, int, str]]]] = []
    for line in text.splitlines():
        if line.startswith(("Current thread", "Thread ", "Stack (")):
            blocks.append((line.startswith("Current thread"), []))
            continue
        found = _FRAME.match(line)
        if found and blocks:
            blocks[-1][1].append((found.group(1), int(found.group(2)), found.group(3).strip()))
    with_frames = [b for b in blocks if b[1]]
    current = [frames for is_current, frames in with_frames if is_current]
    return current[0] if current else (with_frames[-1][1] if with_frames else [])


_LIBRARY = re.compile(r"[/\\](site|dist)-packages[/\\]|[/\\]lib[/\\]python\d")


# The autograd engine's entry points: a DDP or FSDP rank waits for its peers inside
# ``loss.backward()`` (the gradient all-reduce runs in the engine's C++ hooks), with no
# ``torch.distributed`` frame on its Python stack.
_BACKWARD = (
    ("torch/autograd/graph.py", "_engine_run_backward"),
    ("torch/autograd/__init__.py", "backward"),
)


def waiting_in(text: str) -> str | None:
    """What a rank's stack dump shows it waiting for the others in: the innermost
    ``torch.distributed`` function (a collective, a barrier, a store wait), or "backward"
    when its innermost frame is the autograd engine (DDP's and FSDP's gradient
    all-reduce); None when it is elsewhere (the one the others may wait for)."""
    frames = [(f.replace("\\", "/"), line, fn) for f, line, fn in _frames(text)]
    for file, _, function in frames:
        if "torch/distributed/" in file:
            return function
    if frames and any(frames[0][0].endswith(f) and frames[0][2] == fn for f, fn in _BACKWARD):
        return "backward"
    return None


def in_collective(text: str) -> bool:
    """Whether a rank's stack dump shows it waiting for the others (``waiting_in``): in
    ``torch.distributed`` or in the autograd engine's ``backward``, not the one they wait
    for."""
    return waiting_in(text) is not None


def user_frame(text: str) -> tuple[str, int, str] | None:
    """The innermost frame of a dump outside the Python library and installed packages:
    where in the training script the rank is (relative to the working folder, when in it)."""
    here = os.path.join(os.getcwd(), "")
    for file, line, function in _frames(text):
        if not _LIBRARY.search(file):
            # relative to the node's working folder: the same script's place reads the
            # same on every node (local mode gives each node a folder of its own)
            return (file[len(here) :] if file.startswith(here) else file), line, function
    return None


def culprit(
    stacks: Mapping[int | None, str],
    suspects: Sequence[int | None],
    first: int | None,
    step: Callable[[int | None], int | None] = lambda _: None,
) -> int | None:
    """Which of ``suspects`` (ranks of this node that stalled too; ``first``: the one idle
    longest) the others wait for, by the stacks they dumped and the steps they reported:
    ``culprit_rule`` with whether each is in ``torch.distributed`` (``in_collective``), its
    place in the script (``user_frame``; a rank with no dump says neither) and its last
    ``step``."""
    return culprit_rule(
        list(suspects),
        first,
        lambda r: in_collective(stacks.get(r) or ""),
        lambda r: user_frame(stacks.get(r) or ""),
        step,
    )


# Stalled ranks of a node whose places the termination message carries (about 250 bytes
# each at most: the message's 4 KiB keeps room for the stuck rank's stack).
SUSPECTS_REPORTED = 8


def suspects_of(
    stacks: Mapping[int | None, str],
    suspects: Sequence[int | None],
    idle: Callable[[int | None], float | None],
    step: Callable[[int | None], int | None],
) -> list[dict[str, Any]]:
    """Where each of ``suspects`` (this node's stalled ranks) is, for the termination
    message: rank, seconds idle, last step, whether in ``torch.distributed`` and the
    script's place (``user_frame``); of a rank that wrote no stacks (it was ending, as a
    peer's stop broke its collective) only its rank, seconds idle and last step, which
    still tell a rank a step ahead of all others. The operator applies ``culprit_rule``
    to those of every node (``torchyard.status.culprits``): one node sees only its own
    ranks."""
    found: list[dict[str, Any]] = []
    for rank in suspects[:SUSPECTS_REPORTED]:
        if rank is None:
            continue
        text = stacks.get(rank) or ""
        seconds = idle(rank)
        entry: dict[str, Any] = {
            "rank": rank,
            "idle": round(seconds, 1) if seconds is not None else None,
            "step": step(rank),
        }
        if not text:
            found.append({k: v for k, v in entry.items() if v is not None})
            continue
        entry["inCollective"] = in_collective(text)
        where = user_frame(text)
        if where is not None:
            entry.update(file=where[0][-120:], line=where[1], function=where[2][:40])
        if entry["inCollective"]:
            entry["collective"] = str(waiting_in(text))[:40]
        found.append({k: v for k, v in entry.items() if v is not None})
    return found


def collect_stacks(folder: str, live: Sequence[tuple[int | None, int]]) -> dict[int | None, str]:
    """SIGUSR1 to every live rank (rank, pid): its faulthandler writes its stacks
    (``STACK_HOOK``) into ``folder``; then what each wrote, once every file stopped
    growing (at most STACKS_WAIT_SECONDS)."""
    for _, pid in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGUSR1)
    numbers = sorted({rank for rank, _ in live}, key=lambda r: -1 if r is None else r)

    def read() -> dict[int | None, str]:
        texts: dict[int | None, str] = {}
        for number in numbers:
            parts = []
            for path in sorted(glob.glob(os.path.join(folder, f"rank-{number}.pid-*"))):
                with contextlib.suppress(OSError), open(path, errors="replace") as f:
                    parts.append(f.read())
            texts[number] = "".join(parts)
        return texts

    deadline = time.monotonic() + STACKS_WAIT_SECONDS
    texts = read()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        again = read()
        if again == texts and all(again.values()):
            break
        texts = again
    return texts


def stall_limits(env: Mapping[str, str]) -> tuple[float | None, int, dict[str, float]]:
    """(the fixed stall timeout or None: adaptive, its floor, the phases' budgets) of
    TORCHYARD_STALL_TIMEOUT, TORCHYARD_STALL_FLOOR and TORCHYARD_STALL_BUDGETS."""
    fixed = int_env(env, TORCHYARD_STALL_TIMEOUT, 0)
    floor = int_env(env, TORCHYARD_STALL_FLOOR, STALL_FLOOR_SECONDS)
    budgets = stall_budgets(env.get(TORCHYARD_STALL_BUDGETS, ""))
    return (float(fixed) if fixed > 0 else None), floor, budgets


def describe_stall(
    progress: ProgressTracker,
    stacks: Mapping[int | None, str],
    stuck: tuple[int | None, str, int | None],
    first: int | None,
    suspects: Sequence[int | None],
    found: tuple[float, float, float],
) -> tuple[str, dict[str, Any]]:
    """Where the stuck rank is and the termination message's ``stall`` record (its
    ``message`` included). ``stuck``: (the rank the others wait for, its label, the rank
    of its process: None with ``launch: node``), ``first``: the rank idle longest,
    ``suspects``: this node's stalled ranks, ``found``: (seconds idle when found, the
    timeout, when it was found as Unix time)."""
    number, label, own = stuck
    seconds, timeout, detected = found
    step = progress.step_of(number) or 0
    seconds = progress.idle_seconds(number, time.time()) or seconds
    text = stacks.get(number, "")
    where = user_frame(text) or stack_top(text)  # the script's line, not torch's
    at = f"{where[0]}:{where[1]} in {where[2]}" if where else "(no Python stack)"
    collective = waiting_in(text)
    if collective:
        at += f" ({waiting_words(collective)})"
    phase = progress.phase_of(own)
    budget = f"stall budget while {phase}" if phase else "stall timeout"
    message = (
        f"{label} made no progress for {seconds:.0f}s (last step {step}; {budget} "
        f"{timeout:.0f}s): stuck at {at}. Every rank's stacks are in "
        f"logs/stacks/ of this node.\n{text.strip()}"
    )
    stall: dict[str, Any] = {"rank": number, "seconds": round(seconds), "step": step}
    if phase:
        stall["phase"] = phase
    if where:
        stall.update(file=where[0], line=where[1], function=where[2])
    if collective:
        stall["collective"] = collective
    # This node's stalled ranks, idle longest first: the operator names the culprit
    # across every node's (``suspects_of``), idle as of when the stall was found (with
    # ``detectedAt``: when each last made progress, comparable across nodes).
    order = [first] + [r for r in suspects if r != first]
    stall["suspects"] = suspects_of(
        stacks, order, lambda r: progress.idle_seconds(r, detected), progress.step_of
    )
    stall["message"] = message
    # when the stall was found: the stuck rank itself may take the grace period to end
    # (it ignores SIGTERM), while its peers on other nodes end at once
    stall["detectedAt"] = round(detected, 6)
    return at, stall
