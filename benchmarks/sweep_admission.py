"""Trial admission of a large sweep: N trials queued on 8 GPUs, against N plain TrainingRuns.

Against the test control plane with two KWOK pools of one 8-GPU node each
(tests/cluster/harness.py), two arms, each on a namespace and a pool of its own with an
operator of this tree watching only that namespace (``benchmarks/scale.py``'s
``Operator``, a subprocess: its CPU time and RSS read from /proc):

- baseline: N one-GPU TrainingRuns applied directly (the gang queue holds N - 8 of them);
- sweep: one Sweep of N trials (random sampling, no early termination, no
  ``maxConcurrentTrials``: every trial is made and waits in the same queue), its trial
  template the same run.

Each arm is queued in turn: the time from the first apply until every run (trial) has a
phase (8 Running, the rest Queued) and its operator's CPU meanwhile. Then, both queues
full: each operator's CPU (% of one core) over ``--idle`` seconds where nothing changes;
``--refills`` times, taking turns (so that both arms are timed under the same load of a
shared machine), the oldest run whose Pod runs is ended by KWOK (exit 0: the run
Succeeds, its GPU frees) and the time from that Pod's phase Succeeded to the next run's
Pod ungated (admitted: its gang placed), both as this process's watches see them, p50
and p95; each operator's RSS (now and peak) and Sweep reconciles per refill with their
mean duration (its /metrics). Printed: each figure for both arms and the sweep's over the
baseline's; the target: the sweep's admission p95 <= 2 s after a slot frees. The full
run writes benchmarks/results/sweep_admission.json.

    .venv/bin/python benchmarks/sweep_admission.py [--trials 500] [--refills 40] [--idle 20]
        [--profile DIR]   # the operator under benchmarks/sampler.py: where time goes
    .venv/bin/python benchmarks/sweep_admission.py --smoke   # 40 trials, 5 refills
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from benchmarks import record, scale  # noqa: E402
from benchmarks.scale import (  # noqa: E402
    LABEL_RUN,
    Operator,
    World,
    cleanup,
    percentile,
    run_body,
    show,
    start_watches,
    wait,
)
from tests.cluster.binaries import KUBERNETES_VERSION  # noqa: E402
from tests.cluster.harness import DEFAULT_POOLS, Cluster  # noqa: E402

from torchyard import k8s  # noqa: E402

# two pools of 1 node x 8 GPUs: the plain runs' and the sweep's trials'
POOLS = (
    dataclasses.replace(DEFAULT_POOLS[0], name="a100", nodes=1),
    dataclasses.replace(DEFAULT_POOLS[0], name="a100-sweep", nodes=1),
)
SLOTS = POOLS[0].nodes * POOLS[0].gpus
SWEEP = "many"
TARGET_P95 = 2.0


@dataclasses.dataclass
class Seen(World):
    """``scale.World``, and when each run's Pod was first seen Succeeded."""

    pod_ended_at: dict[str, float] = dataclasses.field(default_factory=dict)

    def pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        super().pod_event(kind, obj)
        run = (obj["metadata"].get("labels") or {}).get(LABEL_RUN)
        if run and kind != "DELETED" and (obj.get("status") or {}).get("phase") == "Succeeded":
            with self.lock:
                self.pod_ended_at.setdefault(run, time.monotonic())


def one_gpu(ns: str, name: str, pool: str) -> dict[str, Any]:
    """``scale.run_body`` on ``pool``."""
    body = run_body(ns, name)
    body["spec"]["compute"]["pool"] = pool
    return body


def sweep_body(ns: str, pool: str, n: int) -> dict[str, Any]:
    """N trials of the baseline's run, all made at once (no maxConcurrentTrials)."""
    return {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "Sweep",
        "metadata": {"name": SWEEP, "namespace": ns},
        "spec": {
            "trial": one_gpu(ns, "trial", pool)["spec"],
            "parameters": {
                "learning_rate": {"type": "uniform", "minValue": 0.0005, "maxValue": 0.005},
                "momentum": {"type": "uniform", "minValue": 0.9, "maxValue": 0.99},
            },
            "sampling": "random",
            "objective": {"metric": "best_val_acc", "goal": "maximize"},
            "maxTotalTrials": n,
            "seed": 7,
        },
    }


def apply_runs(ns: str, pool: str, n: int) -> None:
    """N TrainingRuns applied server-side, 16 at a time (as benchmarks/scale.py does)."""

    def one(i: int) -> None:
        k8s.apply(one_gpu(ns, f"r{i:05d}", pool), field_manager="sweep-admission-bench")

    with ThreadPoolExecutor(16) as threads:
        list(threads.map(one, range(n)))


def apply_sweep(ns: str, pool: str, n: int) -> None:
    k8s.create(sweep_body(ns, pool, n))


def sweep_reconciles(op: Operator) -> tuple[float, float]:
    """The operator's Sweep reconciles so far and the seconds they took (its /metrics)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{op.port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = [
        re.search(
            rf'^torchyard_reconcile_duration_seconds_{part}\{{kind="Sweep"\}} (\S+)', text, re.M
        )
        for part in ("count", "sum")
    ]
    count, total = (float(f.group(1)) if f else 0.0 for f in found)
    return count, total


def refill(cluster: Cluster, ns: str, world: Seen, timeout: float) -> float | None:
    """End the oldest running Pod's run; seconds from its Pod Succeeded to the next gang's
    Pod ungated (None: not within ``timeout``)."""
    with world.lock:
        running = [r for r in world.pod_running_at if r not in world.pod_ended_at]
        before = set(world.pod_ungated_at)
    victim = min(running, key=lambda r: world.pod_running_at[r])
    pod = k8s.list_(k8s.PODS, ns, label_selector=f"{LABEL_RUN}={victim}")[0]
    cluster.kubectl(
        "annotate", "pod", pod["metadata"]["name"], "-n", ns, "--overwrite",
        "kwok.torchyard.dev/exit-code=0",
    )  # fmt: skip

    def admitted() -> str | None:
        with world.lock:
            fresh = [r for r in world.pod_ungated_at if r not in before]
        return fresh[0] if fresh and victim in world.pod_ended_at else None

    if wait("next gang ungated", lambda: admitted() is not None, timeout) is None:
        return None
    nxt = admitted()
    assert nxt is not None
    took = world.pod_ungated_at[nxt] - world.pod_ended_at[victim]
    # the next victim must be running: wait for the admitted run's Pod
    wait(f"{nxt}'s Pod Running", lambda: nxt in world.pod_running_at, timeout)
    return took


@dataclasses.dataclass
class Arm:
    """One side of the comparison: its pool, namespace, watches and operator."""

    label: str
    pool: str
    make: Callable[[str, str, int], None]
    ns: str = ""
    world: Seen = dataclasses.field(default_factory=Seen)
    op: Operator | None = None
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)
    took: list[float] = dataclasses.field(default_factory=list)


def queue(arm: Arm, cluster: Cluster, args: argparse.Namespace, workdir: Path) -> Operator:
    """The arm's namespace, its operator (watching only it), and its N runs queued."""
    arm.ns = cluster.create_namespace(f"admit-{arm.label}")
    k8s.create(
        {
            "apiVersion": "torchyard.dev/v1alpha1",
            "kind": "Environment",
            "metadata": {"name": "pytorch", "namespace": arm.ns},
            "spec": {"image": "img"},
        }
    )
    start_watches(arm.world, arm.ns)
    profile = args.profile / f"profile-{arm.label}" if args.profile else None
    log = (args.profile or workdir) / f"operator-{arm.label}.log"
    op = Operator(str(REPO / "operator"), cluster.kubeconfig, log, profile, ("--namespace", arm.ns))
    arm.op = op
    op.start()
    n, world = args.trials, arm.world
    print(f"[{arm.label}] queueing {n}", flush=True)
    cpu0, started = op.cpu_seconds(), time.monotonic()
    arm.make(arm.ns, arm.pool, n)
    phased = wait("every run has a phase", lambda: world.count() >= n, args.timeout)
    arm.figures["phased"] = None if phased is None else time.monotonic() - started
    wait(f"{SLOTS} Running", lambda: len(world.pod_running_at) >= SLOTS, args.timeout)
    arm.figures["queue_cpu"] = op.cpu_seconds() - cpu0
    op.cut()  # profile window 1: queueing
    return op


def measure(arms: list[Arm], cluster: Cluster, args: argparse.Namespace, workdir: Path) -> None:
    """Queue each arm in turn; then, both queues full, the idle window and the refills,
    taking turns (one refill of each arm after the other), so that both are timed under
    the same load of the machine."""
    ops = [queue(arm, cluster, args, workdir) for arm in arms]
    time.sleep(2)
    cpu, t0 = [op.cpu_seconds() for op in ops], time.monotonic()
    time.sleep(args.idle)
    for arm, op, used in zip(arms, ops, cpu, strict=True):
        arm.figures["idle_cpu"] = 100 * (op.cpu_seconds() - used) / (time.monotonic() - t0)
        op.cut()  # profile window 2: idle
    before = [sweep_reconciles(op) for op in ops]
    for i in range(args.refills):
        for arm in arms:
            found = refill(cluster, arm.ns, arm.world, args.refill_timeout)
            arm.took.append(float("inf") if found is None else found)
            print(f"[{arm.label}] refill {i + 1}: admitted {show(arm.took[-1], 's')}", flush=True)
        if float("inf") in (arm.took[-1] for arm in arms):
            break
    for arm, op, was in zip(arms, ops, before, strict=True):
        op.cut()  # profile window 3: refills
        took, figures = arm.took, arm.figures
        count, seconds = (a - b for a, b in zip(sweep_reconciles(op), was, strict=True))
        figures["sweep_reconciles"] = count / len(took)
        figures["sweep_reconcile_s"] = seconds / count if count else None
        figures["admit_p50"] = percentile(took, 0.5)
        figures["admit_p95"] = percentile(took, 0.95)
        figures["admit_max"] = max(took)
        figures["refills"] = took
        figures["rss"], figures["rss_peak"] = op.memory_mib()


def stop(arms: list[Arm], cluster: Cluster) -> None:
    for arm in arms:
        if arm.op is not None:
            arm.op.stop()
        arm.world.stop.set()
        if arm.ns:
            cleanup(cluster, arm.ns)


ROWS = [
    ("phased", "every run has a phase", "s"),
    ("queue_cpu", "operator CPU until then", "s"),
    ("admit_p50", "slot freed -> next gang admitted p50", "s"),
    ("admit_p95", "slot freed -> next gang admitted p95", "s"),
    ("admit_max", "slot freed -> next gang admitted max", "s"),
    ("sweep_reconciles", "Sweep reconciles per refill", ""),
    ("sweep_reconcile_s", "Sweep reconcile, mean", "s"),
    *(row for row in scale.ROWS if row[0] in ("idle_cpu", "rss", "rss_peak")),
]


def report(
    args: argparse.Namespace, sweep: dict[str, Any], base: dict[str, Any], rec: record.Record
) -> None:
    n = args.trials
    print(
        f"\nsweep admission: {n} one-GPU trials queued, {SLOTS} GPUs each (pools "
        f"{POOLS[0].name}, {POOLS[1].name}), "
        f"{len(sweep['refills'])} refills each"
    )
    print(f"{'figure':40s} {'sweep':>10s} {f'{n} TrainingRuns':>16s} {'ratio':>7s}")
    for key, title, unit in ROWS:
        a, b = sweep.get(key), base.get(key)
        ratio = a / b if a is not None and b not in (None, 0, float("inf")) else None
        shown = "n/a" if ratio is None else f"{ratio:.2f}"
        print(f"{title:40s} {show(a, unit):>10s} {show(b, unit):>16s} {shown:>7s}")
        if a is not None:
            p95 = key == "admit_p95"
            rec.figure(
                f"{n} trials queued: {title}",
                a,
                unit,
                baseline=(f"{n} TrainingRuns created directly", b if b is not None else "n/a"),
                ratio=ratio,
                target=f"<= {TARGET_P95:g} s" if p95 else None,
                met=a <= TARGET_P95 if p95 else None,
            )
    for label, figures in (("sweep", sweep), ("baseline", base)):
        rec.round(arm=label, **figures)
    p95 = sweep.get("admit_p95")
    verdict = "met" if p95 is not None and p95 <= TARGET_P95 else "not met"
    print(
        f"target: a sweep's trial admitted within {TARGET_P95:g} s of a freed slot, p95: "
        f"{show(p95, 's')} ({verdict}; ratio to plain TrainingRuns "
        f"{show(p95 / base['admit_p95'] if p95 and base.get('admit_p95') else None, '')})"
    )
    rec.write()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--refills", type=int, default=40, help="freed slots to time")
    parser.add_argument("--idle", type=float, default=20.0, help="idle CPU window (s)")
    parser.add_argument("--timeout", type=float, default=600.0, help="limit per wait (s)")
    parser.add_argument("--refill-timeout", type=float, default=60.0)
    parser.add_argument("--smoke", action="store_true", help="40 trials, 5 refills, 3 s idle")
    parser.add_argument(
        "--profile",
        type=Path,
        help="folder for the operator's sampled profile (benchmarks/sampler.py) and its log",
    )
    record.add_argument(parser)
    args = parser.parse_args()
    if args.smoke:
        args.trials, args.refills, args.idle = 40, 5, 3.0
    rec = record.Record("sweep_admission", args)
    rec.version("kubernetes", KUBERNETES_VERSION)
    if args.trials <= SLOTS + args.refills or args.refills < 1 or args.idle <= 0:
        parser.error(f"--trials must exceed {SLOTS} + --refills, --refills >= 1, --idle > 0")
    arms = [Arm("runs", POOLS[0].name, apply_runs), Arm("sweep", POOLS[1].name, apply_sweep)]
    with (
        tempfile.TemporaryDirectory(prefix="torchyard-admission-") as tmp,
        Cluster(pools=POOLS) as cluster,
    ):
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        k8s.reset()
        try:
            measure(arms, cluster, args, Path(tmp))
        finally:
            stop(arms, cluster)
    base, sweep = arms[0].figures, arms[1].figures
    report(args, sweep, base, rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
