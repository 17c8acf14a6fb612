"""What ``torchyard.progress.report`` costs a training step, through the real launcher.

Runs the launcher (one node, ``--procs`` ranks) over a script whose steps each burn
``--step-ms`` of CPU, twice per round, rounds interleaved: once reporting every step with
``progress.report(step, total=..., loss=...)`` (the launcher parses every such line, keeps
it in metrics.jsonl and prints the node's summary), once printing a plain line of the same
length (the baseline: the launcher tees it as any output). Each round runs the pair back
to back, in alternating order (baseline first in even rounds, reports first in odd ones),
and gives one paired ratio (step time with reports / baseline's): load that changes
between rounds cancels within a pair, and the order's own bias cancels over the rounds.
The figure is the median of the paired ratios (with their spread); the target is an
overhead under 0.5 % of the step time. A loaded machine still adds noise: say so beside
the figure.

    .venv/bin/python benchmarks/progress_overhead.py [--steps 2000] [--step-ms 20]
    .venv/bin/python benchmarks/progress_overhead.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import record

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = ROOT / "operator" / "torchyard" / "launch" / "main.py"

SCRIPT = """
import os, sys, time
from torchyard import progress
steps, step_s, report = int(sys.argv[1]), float(sys.argv[2]) / 1000, sys.argv[3] == "1"
line = '@@torchyard ' + '{"step": 1, "total": %d, "loss": 0.123456}' % steps
started = time.perf_counter()
for step in range(1, steps + 1):
    end = time.perf_counter() + step_s
    while time.perf_counter() < end:
        pass
    if report:
        progress.report(step, total=steps, loss=0.123456)
    else:
        print('x' * len(line), flush=True)
print('elapsed', time.perf_counter() - started, file=sys.stderr, flush=True)
"""


def one(steps: int, step_ms: float, report: bool, procs: int) -> float:
    """Mean seconds per step of the slowest rank."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "bench.py").write_text(SCRIPT)
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(ROOT / "operator"),
            "TORCHYARD_NPROC_PER_NODE": str(procs),
            "NODE_RANK": "0",
            "WORLD_SIZE": str(procs),
            "TORCHYARD_TERMINATION_LOG": str(Path(tmp, "termination.json")),
        }
        done = subprocess.run(
            [
                sys.executable,
                str(LAUNCHER),
                "--",
                sys.executable,
                "bench.py",
                str(steps),
                str(step_ms),
                "1" if report else "0",
            ],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        times = [float(x.split()[-1]) for x in done.stderr.splitlines() if "elapsed" in x]
        assert len(times) == procs, done.stderr
        if report:
            info = json.loads(Path(tmp, "termination.json").read_text())
            assert info["progress"]["step"] == steps, info
        return max(times) / steps


def cpu_per_report(n: int = 20000) -> tuple[float, float]:
    """CPU seconds per report (process time, which other work on the machine changes far
    less than wall time): formatting and writing it in the rank, and parsing and recording
    it in the launcher (``parse_progress`` + ``ProgressTracker.record``)."""
    sys.path.insert(0, str(ROOT / "operator"))
    from torchyard import progress
    from torchyard.launch import contract
    from torchyard.launch.tracker import ProgressTracker

    with open(os.devnull, "w") as sink:
        saved, sys.stdout = sys.stdout, sink
        try:
            started = time.process_time()
            for step in range(n):
                progress.report(step, total=n, loss=0.123456)
            rank = (time.process_time() - started) / n
        finally:
            sys.stdout = saved
    line = (progress.line(1, total=n, loss=0.123456) + "\n").encode()
    with tempfile.TemporaryDirectory() as tmp:
        tracker = ProgressTracker(tmp)
        started = time.process_time()
        for _ in range(n):
            record = contract.parse_progress(line.rstrip(b"\n"))
            assert record is not None
            tracker.record(0, record)
        read = (time.process_time() - started) / n
        tracker.close()
    return rank, read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--smoke", action="store_true")
    record.add_argument(parser)
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.rounds = 50, 1
    rec = record.Record("progress_overhead", args)
    ratios, baseline, with_reports = [], [], []
    for i in range(args.rounds):
        order = (False, True) if i % 2 == 0 else (True, False)
        measured = {report: one(args.steps, args.step_ms, report, args.procs) for report in order}
        baseline.append(measured[False])
        with_reports.append(measured[True])
        ratios.append(measured[True] / measured[False])
        first = "baseline first" if i % 2 == 0 else "reports first"
        print(
            f"round {i + 1} ({first}): baseline {measured[False] * 1000:.3f} ms/step, with "
            f"progress.report {measured[True] * 1000:.3f} ms/step: ratio {ratios[-1]:.4f} "
            f"(load {os.getloadavg()[0]:.2f})"
        )
        rec.round(
            round=i + 1,
            order=first,
            baseline_ms_per_step=measured[False] * 1000,
            reports_ms_per_step=measured[True] * 1000,
            ratio=ratios[-1],
            load=os.getloadavg()[0],
        )
    ratio = statistics.median(ratios)
    print(
        f"step {args.step_ms:g} ms x {args.steps} steps x {args.procs} ranks, "
        f"{args.rounds} round(s): baseline {statistics.median(baseline) * 1000:.3f} ms/step, "
        f"with progress.report {statistics.median(with_reports) * 1000:.3f} ms/step (medians); "
        f"median paired ratio {ratio:.4f} ({min(ratios):.4f}-{max(ratios):.4f}): overhead "
        f"{(ratio - 1) * 100:+.2f} % (target < 0.5 %: {'met' if ratio - 1 < 0.005 else 'not met'})"
    )
    print(f"load average: {os.getloadavg()[0]:.2f} (other work on this machine adds noise)")
    rank, read = cpu_per_report()
    step = args.step_ms / 1000
    print(
        f"CPU per report: {rank * 1e6:.1f} us in the rank, {read * 1e6:.1f} us in the "
        f"launcher: {(rank + read) / step * 100:.3f} % of a {args.step_ms:g} ms step "
        "(target < 0.5 %)"
    )
    workload = f"{args.procs} ranks x {args.steps} steps of {args.step_ms:g} ms"
    rec.figure(
        f"step time with progress.report every step ({workload})",
        statistics.median(with_reports) * 1000,
        "ms/step",
        spread=(min(with_reports) * 1000, max(with_reports) * 1000),
        baseline=("a plain line of the same length", statistics.median(baseline) * 1000),
        ratio=ratio,
        ratio_spread=(min(ratios), max(ratios)),
        target="overhead < 0.5 % (median paired ratio < 1.005)",
        met=ratio - 1 < 0.005,
    )
    rec.figure("CPU per report in the rank", rank * 1e6, "us")
    rec.figure("CPU per report in the launcher", read * 1e6, "us")
    rec.figure(
        f"CPU per report, share of a {args.step_ms:g} ms step",
        (rank + read) / step * 100,
        "%",
        target="< 0.5 %",
        met=(rank + read) / step < 0.005,
    )
    rec.write()


if __name__ == "__main__":
    main()
