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

Each run goes through ``torchyard run --local`` (a launcher per node on this machine, the
operator's failure decision: ``status.failures.decide``). Named right: the failure names the
victim's rank and node. It prints each cell's count of named-right runs out of ``--runs``
and what was named when wrong, with the machine's load average.

    .venv/bin/python benchmarks/why_matrix.py [--runs 20] [--only ddp] [--faults gil,exit0]

The real node's side of the matrix runs these scripts as TrainingRuns on the kubelet node
(tests/node/test_failure_classes.py takes its DDP cases from here).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from benchmarks import record  # noqa: E402
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


def once(fault: str, shape: str, place: str, root: Path) -> tuple[bool, str]:
    """(named right, what was named) of one local run."""
    victim = PLACES[place]
    work = Path(tempfile.mkdtemp(prefix=f"{fault}-{shape}-{place}-", dir=root))
    (work / "src").mkdir()
    (work / "src" / "train.py").write_text(script(fault, shape, victim))
    (work / "run.yaml").write_text(yaml.safe_dump(run_body("why", shape)))
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
    found = NAMED.search(done.stderr)
    klass = CLASS.search(done.stderr)
    if found is None:
        return False, f"exit {done.returncode}, no failure named"
    rank = int(found.group(1)) if found.group(1) is not None else None
    node = int(found.group(2))
    said = f"rank {rank} node {node} {klass.group(1) if klass else found.group(3)}"
    return (rank, node) == (victim, victim // 2), said


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="runs per cell (default 1)")
    parser.add_argument("--only", default="", help="shapes, comma-separated (default all)")
    parser.add_argument("--faults", default="", help="faults, comma-separated (default all)")
    record.add_argument(parser)
    args = parser.parse_args()
    rec = record.Record("why_matrix", args)
    shapes = [s for s in args.only.split(",") if s] or list(SHAPES)
    faults = [f for f in args.faults.split(",") if f] or list(FAULTS)
    for name in [*shapes, *faults]:
        if name not in (*SHAPES, *FAULTS):
            parser.error(f"unknown shape or fault {name!r}: {', '.join((*SHAPES, *FAULTS))}")
    root = Path(tempfile.mkdtemp(prefix="torchyard-why-"))
    rows = []
    for shape in shapes:
        for fault in faults:
            for place in PLACES:
                right, wrong, started = 0, [], time.monotonic()
                for _ in range(args.runs):
                    ok, said = once(fault, shape, place, root)
                    right += ok
                    if not ok:
                        wrong.append(said)
                seconds = (time.monotonic() - started) / max(args.runs, 1)
                row = (
                    f"{shape:9} {fault:8} {place:6} {right:3}/{args.runs:<3} "
                    f"{seconds:5.0f}s/run  load {os.getloadavg()[0]:.1f}"
                    + (f"  wrong: {'; '.join(sorted(set(wrong)))}" if wrong else "")
                )
                print(row, flush=True)
                rows.append((right, args.runs))
                rec.round(
                    shape=shape,
                    fault=fault,
                    victim=place,
                    named_right=right,
                    runs=args.runs,
                    seconds_per_run=seconds,
                    load=os.getloadavg()[0],
                    wrong="; ".join(sorted(set(wrong))),
                )
                rec.figure(
                    f"{shape}, {fault}, victim on the {place} node: named right",
                    f"{right}/{args.runs}",
                    target=">= 95 %",
                    met=right >= 0.95 * args.runs,
                )
    total = sum(r for r, _ in rows)
    runs = sum(n for _, n in rows)
    print(
        f"named right: {total}/{runs} runs; cells at >= 95%: "
        f"{sum(1 for r, n in rows if r >= 0.95 * n)}/{len(rows)}"
    )
    rec.figure("runs named right, in all", f"{total}/{runs}")
    rec.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
