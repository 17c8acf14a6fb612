"""Who broke a distributed run, as a matrix: how often the rank at fault is named.

Faults (one rank, the *victim*, at step 10 of 40; tests/faults.py):
  python   stuck in Python (a busy loop)
  gil      stuck in C holding the GIL (ctypes.PyDLL: libc sleep, again after each signal)
  nogil    stuck in C without the GIL (ctypes.CDLL: libc sleep, again after each signal)
  lock     deadlocked on a lock (a threading.Lock taken twice)
  skip     skips one collective (then runs a step ahead, and ends in a barrier)
  sigterm  ignores SIGTERM and sleeps
  exit0    exits with status 0 (``sys.exit(0)``) while the others train
Shapes: ``ddp`` (DistributedDataParallel: the peers wait inside ``loss.backward()``),
``allreduce`` (an explicit ``dist.all_reduce`` per step) and ``torchrun`` (``launch: node``:
torchrun starts the ranks of each node; DDP inside). Places: the victim on the node whose
launcher reports first (node 0: rank 1) or on another (node 1: rank 3). 2 nodes x 2
processes, gloo, ``policy.stallTimeoutSeconds`` 15.

Two places to run, a matrix axis of their own:
  - local (the default): each run goes through ``torchyard run --local`` (a launcher per
    node on this machine, the operator's failure decision: ``status.failures.decide``);
    named right: the failure it prints names the victim's rank and node;
  - ``--real-node``: each run is a TrainingRun on the harness's real kubelet node
    (benchmarks/why_real.py; the operator in this process, Pod Security "restricted",
    a non-root user); named right: ``status.failure`` names the victim's rank and node. A
    run counts only if both its node Pods were seen bound to the real node
    (``spec.nodeName``). Needs root and the real node's set-up; take the node tests' lock.
``--parallel N`` runs N at once (on the real node each in a namespace of its own);
``--minutes M`` starts no run M minutes after the first (rounds go cell by cell, so every cell has
had as many runs, give or take one, when it stops). It prints every run (what was named,
its seconds and the load average), then each cell's count named right out of the runs
that counted, and what was named when wrong; the results file keeps every run with the
load at its end (local: ``why_matrix.json``, real node: ``why_matrix_real.json``).

    .venv/bin/python benchmarks/why_matrix.py [--runs 20] [--only ddp] [--faults gil,exit0]
    flock /tmp/torchyard-node-tests.lock .venv/bin/python benchmarks/why_matrix.py \\
        --real-node --runs ddp=20,allreduce=2,torchrun=2 --parallel 3

tests/node/test_culprits_on_node.py runs two of the real node's DDP cells once, as a test.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from benchmarks import record, why_real  # noqa: E402
from benchmarks.why_real import Cell, Outcome  # noqa: E402
from tests.cluster.binaries import KUBERNETES_VERSION  # noqa: E402
from tests.faults import FAULTS, SHAPES, script  # noqa: E402

STALL_SECONDS = 15
PLACES = {"same": 1, "other": 3}  # the victim's global rank: node 0 or node 1


def run_body(name: str, shape: str) -> dict[str, object]:
    command = ["python", "train.py"]
    if shape == "torchrun":
        command = ["python", "-m", "torch.distributed.run", "train.py"]
    return {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": name},
        "spec": {
            "environment": "pytorch-cpu",
            "source": {"configMap": f"{name}-src"},
            "command": command,
            "distribution": {
                "nodeCount": 2,
                "processCountPerNode": 2,
                "launch": "node" if shape == "torchrun" else "process",
            },
            "policy": {"stallTimeoutSeconds": STALL_SECONDS},
        },
    }


NAMED = re.compile(r"failed after [\d.]+s: (?:rank (\d+) )?\(?node (\d+)\)? ?failed \((\w+)")
CLASS = re.compile(r"^class: (\w+)", re.MULTILINE)


def once(cell: Cell, root: Path) -> Outcome:
    """One local run of ``cell``: named right, what was named."""
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f"{cell.fault}-{cell.shape}-{cell.place}-", dir=root))
    (work / "src").mkdir()
    (work / "src" / "train.py").write_text(script(cell.fault, cell.shape, cell.victim))
    (work / "run.yaml").write_text(yaml.safe_dump(run_body("why", cell.shape)))
    done = subprocess.run(
        [
            *(sys.executable, "-m", "torchyard", "run", str(work / "run.yaml"), "--local"),
            *("--source", str(work / "src"), "--registry", str(work / "reg")),
            *("--workdir", str(work / "runs")),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=work,
    )
    seconds, load = time.monotonic() - started, os.getloadavg()[0]
    found = NAMED.search(done.stderr)
    klass = CLASS.search(done.stderr)
    if found is None:
        return Outcome(
            cell, True, False, f"exit {done.returncode}, no failure named", seconds, load
        )
    rank = int(found.group(1)) if found.group(1) is not None else None
    node = int(found.group(2))
    said = f"rank {rank} node {node} {klass.group(1) if klass else found.group(3)}"
    right = (rank, node) == (cell.victim, cell.victim // 2)
    return Outcome(cell, True, right, said, seconds, load)


def run_all(
    jobs: list[Cell], parallel: int, until: float, one: Callable[[Cell], Outcome]
) -> Iterator[Outcome]:
    """Every job through ``one``, ``parallel`` at a time, none started after the monotonic
    time ``until``; the outcomes as they end."""

    def job(cell: Cell) -> Outcome | None:
        return None if time.monotonic() > until else one(cell)

    pool = ThreadPoolExecutor(max_workers=parallel)
    try:
        for future in as_completed([pool.submit(job, cell) for cell in jobs]):
            outcome = future.result()
            if outcome is not None:
                yield outcome
    finally:  # interrupted: the runs under way end, none of those queued starts
        pool.shutdown(wait=True, cancel_futures=True)


def runs_of(text: str, shapes: list[str]) -> dict[str, int]:
    """``--runs``: one count for every shape (``20``), or a count per shape
    (``ddp=20,allreduce=3``: a shape of ``shapes`` not named gets 1)."""
    if "=" not in text:
        return dict.fromkeys(shapes, int(text))
    counts = dict.fromkeys(shapes, 1)
    for item in text.split(","):
        shape, _, count = item.partition("=")
        if shape not in shapes:
            raise ValueError(
                f"--runs names {shape!r}, not one of the shapes run ({', '.join(shapes)})"
            )
        counts[shape] = int(count)
    return counts


def summary(rec: record.Record, results: dict[Cell, list[Outcome]], runs: dict[str, int]) -> None:
    """Each cell's count named right out of the runs that count, what was named when
    wrong, and the load; as figures too."""
    rows = []
    for cell, outcomes in results.items():
        counted = [o for o in outcomes if o.counted]
        right = sum(o.right for o in counted)
        wrong = sorted({o.said for o in counted if not o.right})
        seconds = sum(o.seconds for o in counted) / max(len(counted), 1)
        loads = [o.load for o in outcomes] or [0.0]
        uncounted = len(outcomes) - len(counted)
        print(
            f"{cell.shape:9} {cell.fault:8} {cell.place:6} {right:3}/{len(counted):<3} "
            f"{seconds:5.0f}s/run  load {min(loads):.1f}-{max(loads):.1f}"
            + (f"  not counted {uncounted}" if uncounted else "")
            + (f"  wrong: {'; '.join(wrong)}" if wrong else "")
        )
        rows.append((right, len(counted)))
        rec.figure(
            f"{cell.shape}, {cell.fault}, victim on the {cell.place} node: named right",
            f"{right}/{len(counted)}",
            target=">= 95 %"
            + ("" if len(counted) >= runs[cell.shape] else f" ({runs[cell.shape]} runs asked)"),
            met=bool(counted) and right >= 0.95 * len(counted),
        )
    total, n = sum(r for r, _ in rows), sum(c for _, c in rows)
    met = sum(1 for r, c in rows if c and r >= 0.95 * c)
    print(f"named right: {total}/{n} runs; cells at >= 95%: {met}/{len(rows)}")
    rec.figure("runs named right, in all", f"{total}/{n}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs",
        default="1",
        help="runs per cell (default 1), or per shape: ddp=20,allreduce=3 (others 1)",
    )
    parser.add_argument("--only", default="", help="shapes, comma-separated (default all)")
    parser.add_argument("--faults", default="", help="faults, comma-separated (default all)")
    parser.add_argument(
        "--real-node", action="store_true", help="TrainingRuns on the real node (root)"
    )
    parser.add_argument("--parallel", type=int, default=1, help="runs at once (default 1)")
    parser.add_argument(
        "--minutes", type=float, default=0, help="start no run after this many (0: no limit)"
    )
    record.add_argument(parser)
    args = parser.parse_args()
    if args.real_node:
        rec = record.Record("why_matrix_real", args)
        rec.version("kubernetes", KUBERNETES_VERSION)
    else:
        rec = record.Record("why_matrix", args)
    named = [i.partition("=")[0] for i in args.runs.split(",") if "=" in i]
    shapes = [s for s in args.only.split(",") if s] or named or list(SHAPES)
    faults = [f for f in args.faults.split(",") if f] or list(FAULTS)
    for name in [*shapes, *faults]:
        if name not in (*SHAPES, *FAULTS):
            parser.error(f"unknown shape or fault {name!r}: {', '.join((*SHAPES, *FAULTS))}")
    try:
        runs = runs_of(args.runs, shapes)
    except ValueError as err:
        parser.error(f"--runs {args.runs!r}: {err}")
    if min(runs.values()) < 1 or args.parallel < 1 or args.minutes < 0:
        parser.error("--runs and --parallel must be >= 1, --minutes >= 0")
    cells = [Cell(s, f, p, v) for s in shapes for f in faults for p, v in PLACES.items()]
    results: dict[Cell, list[Outcome]] = {cell: [] for cell in cells}
    # round by round: every cell's n-th run before any cell's n+1-th
    jobs = [c for n in range(max(runs.values())) for c in cells if n < runs[c.shape]]
    with contextlib.ExitStack() as stack:
        if args.real_node:
            one = stack.enter_context(why_real.real_node(args.parallel, STALL_SECONDS))
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="torchyard-why-")))
            one = functools.partial(once, root=root)
        until = time.monotonic() + (args.minutes * 60 or float("inf"))  # once set up
        for outcome in run_all(jobs, args.parallel, until, one):
            results[outcome.cell].append(outcome)
            c = outcome.cell
            print(
                f"  {c.shape} {c.fault} {c.place}: {'right' if outcome.right else 'WRONG'}"
                f"{'' if outcome.counted else ' (not counted)'} {outcome.seconds:.0f}s "
                f"load {outcome.load:.1f}: {outcome.said}",
                flush=True,
            )
            rec.round(**outcome.row())
    summary(rec, results, runs)
    rec.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
