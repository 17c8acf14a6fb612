"""Launch overhead of ``torchyard run --local`` against plain ``torchrun``.

The same DDP script (``ddp_steps.py``, world size 4) is started, in turn, by
  - torchyard: ``torchyard run RUN.yaml --local`` with 2 nodes x 2 processes
    (the CLI, the YAML parse, one launcher per node, output teeing, archiving);
  - torchrun standalone: ``torchrun --standalone --nnodes 1 --nproc-per-node 4``
    (one node, a c10d rendezvous on a free port);
  - torchrun static: the same 2 nodes x 2 processes as torchyard, the way the Azure ML
    guide launches per node: one ``torchrun --rdzv-backend=static --nnodes 2
    --node-rank i --master-addr 127.0.0.1 --master-port P --nproc-per-node 2`` per node,
    both started together.
For each it measures the time from starting the command(s) to the last rank's first
optimizer step ("time to first step") and to the (last) command's exit ("total"),
repeats ``--repeats`` times, and prints medians with their spread and torchyard's ratio
to each baseline. Target: ratio <= 1.10 against both.

    .venv/bin/python benchmarks/launch_overhead.py [--repeats 3] [--steps 300]
    .venv/bin/python benchmarks/launch_overhead.py --smoke   # 1 repeat, 5 steps
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import record
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


TARGET = 1.10
BASELINES = ("torchrun standalone", "torchrun static")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Hung(Exception):
    """A launch did not end within its time limit (its processes were killed)."""


def measure(
    commands: list[list[str]], cwd: Path, limit: float = 600, baseline: bool = False
) -> tuple[float, float]:
    """Start every command at once (one per node, or one); the last rank's first step
    and the last exit, in seconds from the start. :class:`Hung` past ``limit`` seconds.
    A ``baseline`` may exit non-zero in its shutdown after every rank's last step."""
    started = time.time()
    procs = [
        subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # killed with every process it started
        )
        for argv in commands
    ]
    outputs = []
    for argv, proc in zip(commands, procs, strict=True):
        try:
            out, err = proc.communicate(timeout=max(1.0, started + limit - time.time()))
        except subprocess.TimeoutExpired:
            for other in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(other.pid, signal.SIGKILL)
            tails = [(o or "")[-600:] for o in (p.communicate()[0] for p in procs)]
            what = " ".join(argv[:3])
            raise Hung(f"{what}: no exit after {limit:.0f}s; output: {tails}") from None
        outputs.append(out + err)
    total = time.time() - started
    text = "".join(outputs)
    failed = [
        (argv, o) for argv, p, o in zip(commands, procs, outputs, strict=True) if p.returncode
    ]
    # torchrun's static rendezvous keeps its store in node 0's agent: when node 0 is done
    # first, node 1's ranks can abort while shutting down, after their last step. That run
    # still measured what it should; any other failure (and any of torchyard's) is fatal.
    if failed and baseline and len(re.findall(r"done \d+\.\d+", text)) == 4:
        failed = []
        print(
            "  note: a baseline command exited non-zero after all 4 ranks were done "
            "(shutdown after the last step); timed as finished",
            flush=True,
        )
    if failed:
        argv, out = failed[0]
        raise SystemExit(f"{' '.join(argv[:3])} failed:\n{out[-3000:]}")
    firsts = [float(t) for t in re.findall(r"first-step (\d+\.\d+)", text)]
    if len(firsts) != 4:
        raise SystemExit(f"expected 4 ranks' first steps, found {len(firsts)}")
    return max(firsts) - started, total


def static_nodes(bindir: Path, steps: int) -> list[list[str]]:
    """One torchrun per node with a fixed (static) rendezvous on node 0's address."""
    port = str(free_port())
    return [
        [
            str(bindir / "torchrun"),
            "--rdzv-backend=static",
            "--nnodes",
            "2",
            "--node-rank",
            str(node),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            port,
            "--nproc-per-node",
            "2",
            str(HERE / "ddp_steps.py"),
            "--steps",
            str(steps),
        ]
        for node in (0, 1)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--smoke", action="store_true", help="1 repeat of 5 steps")
    record.add_argument(parser)
    args = parser.parse_args()
    rec = record.Record("launch_overhead", args)
    limit = 600.0
    if args.smoke:
        args.repeats, args.steps, limit = 1, 5, 90.0
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
        standalone = [
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
        results: dict[str, list[tuple[float, float]]] = {
            name: [] for name in (*BASELINES, "torchyard")
        }
        for i in range(args.repeats):
            launches = (
                ("torchrun standalone", [standalone]),
                ("torchrun static", static_nodes(bindir, args.steps)),
                ("torchyard", [torchyard]),
            )
            for name, commands in launches:
                try:
                    first, total = measure(commands, work, limit, name != "torchyard")
                except Hung as hung:
                    if name == "torchyard":
                        raise SystemExit(f"torchyard hung: {hung}") from None
                    # A baseline's rendezvous on a port picked free beforehand can lose it
                    # to another process on a busy machine; say so and measure it again.
                    print(f"  run {i + 1} {name}: {hung}; measuring it again", flush=True)
                    if name == "torchrun static":
                        commands = static_nodes(bindir, args.steps)
                    first, total = measure(commands, work, limit, baseline=True)
                results[name].append((first, total))
                print(
                    f"  run {i + 1}/{args.repeats} {name:19s} first step {first:6.2f}s  "
                    f"total {total:6.2f}s",
                    flush=True,
                )
                rec.round(round=i + 1, arm=name, first_step_s=first, total_s=total)
    med = {
        k: (statistics.median(f for f, _ in v), statistics.median(t for _, t in v))
        for k, v in results.items()
    }
    print(
        f"\nworld size 4, {args.steps} steps, median of {args.repeats} runs "
        "(spread: lowest-highest)"
    )
    print(f"{'':19s} {'first step':>22s} {'total':>22s}")
    for name in (*BASELINES, "torchyard"):
        firsts = [f for f, _ in results[name]]
        totals = [t for _, t in results[name]]
        print(
            f"{name:19s} {med[name][0]:7.2f}s ({min(firsts):5.2f}-{max(firsts):5.2f}) "
            f"{med[name][1]:7.2f}s ({min(totals):5.2f}-{max(totals):5.2f})"
        )
    for base in BASELINES:
        ratio_first = med["torchyard"][0] / med[base][0]
        ratio_total = med["torchyard"][1] / med[base][1]
        verdict = "target met" if max(ratio_first, ratio_total) <= TARGET else "TARGET MISSED"
        print(
            f"ratio torchyard / {base:19s} first step {ratio_first:6.3f}  total "
            f"{ratio_total:6.3f}   (target <= {TARGET:.2f}: {verdict})"
        )
        for i, what in enumerate(("time to first step", "total")):
            rec.figure(
                f"{what}, world size 4, {args.steps} steps (against {base})",
                med["torchyard"][i],
                "s",
                spread=(
                    min(r[i] for r in results["torchyard"]),
                    max(r[i] for r in results["torchyard"]),
                ),
                baseline=(base, med[base][i]),
                ratio=med["torchyard"][i] / med[base][i],
                target=f"<= {TARGET:.2f}",
                met=med["torchyard"][i] / med[base][i] <= TARGET,
            )
    rec.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
