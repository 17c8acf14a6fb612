"""Launch overhead of ``torchyard run --local`` against plain ``torchrun``.

The same DDP script (``ddp_steps.py``, world size 4) is started, alternately, by
  - torchyard: ``torchyard run RUN.yaml --local`` with 2 nodes x 2 processes
    (the CLI, the YAML parse, one launcher per node, output teeing, archiving), and
  - torchrun:  ``torchrun --standalone --nnodes 1 --nproc-per-node 4 ddp_steps.py``.
For each it measures the time from starting the command to the last rank's first
optimizer step ("time to first step") and to the command's exit ("total"), repeats
``--repeats`` times, and prints medians and the torchyard/torchrun ratios.
Target: ratio <= 1.10.

    .venv/bin/python benchmarks/launch_overhead.py [--repeats 3] [--steps 300]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
RUN = {
    "apiVersion": "torchyard.dev/v1alpha1",
    "kind": "TrainingRun",
    "metadata": {"name": "launch-overhead"},
    "spec": {
        "environment": "pytorch-cpu",
        "source": {"image": True},
        "command": ["python", "ddp_steps.py"],
        "distribution": {"nodeCount": 2, "processCountPerNode": 2},
    },
}


def measure(argv: list[str], cwd: Path) -> tuple[float, float]:
    started = time.time()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)
    total = time.time() - started
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    firsts = [float(t) for t in re.findall(r"first-step (\d+\.\d+)", done.stdout + done.stderr)]
    if len(firsts) != 4:
        raise SystemExit(f"expected 4 ranks' first steps, found {len(firsts)}")
    return max(firsts) - started, total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    bindir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run = dict(RUN)
        run["spec"] = {
            **RUN["spec"],
            "command": ["python", "ddp_steps.py", "--steps", str(args.steps)],
        }
        (work / "run.yaml").write_text(yaml.safe_dump(run))
        torchyard = [
            str(bindir / "torchyard"),
            "run",
            str(work / "run.yaml"),
            "--local",
            "--source",
            str(HERE),
            "--registry",
            str(work / "registry"),
            "--workdir",
            str(work / "runs"),
        ]
        torchrun = [
            str(bindir / "torchrun"),
            "--standalone",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "4",
            str(HERE / "ddp_steps.py"),
            "--steps",
            str(args.steps),
        ]
        results: dict[str, list[tuple[float, float]]] = {"torchyard": [], "torchrun": []}
        for i in range(args.repeats):
            for name, argv in (("torchrun", torchrun), ("torchyard", torchyard)):
                first, total = measure(argv, work)
                results[name].append((first, total))
                print(
                    f"  run {i + 1}/{args.repeats} {name:9s} first step {first:6.2f}s  "
                    f"total {total:6.2f}s",
                    flush=True,
                )
    med = {
        k: (statistics.median(f for f, _ in v), statistics.median(t for _, t in v))
        for k, v in results.items()
    }
    print(f"\nworld size 4, {args.steps} steps, median of {args.repeats} runs")
    print(f"{'':10s} {'first step':>12s} {'total':>10s}")
    for name in ("torchrun", "torchyard"):
        print(f"{name:10s} {med[name][0]:11.2f}s {med[name][1]:9.2f}s")
    ratio_first = med["torchyard"][0] / med["torchrun"][0]
    ratio_total = med["torchyard"][1] / med["torchrun"][1]
    print(f"{'ratio':10s} {ratio_first:12.3f} {ratio_total:10.3f}   (target <= 1.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
