"""Placement: how compactly gangs land in the network, by topology, side by side.

Against the test control plane (tests/cluster/harness.py) with KWOK nodes in racks
(tests/cluster/racks.py): 32 nodes of 8 GPUs, 2 blocks x 4 racks x 4 nodes, labelled by
block, rack and host; Kueue v0.17.0 (tests/cluster/kueue.py, topology-aware scheduling on,
a Topology of those levels, a flavor of the pool) and the operator as a process of its own
(``python -m torchyard.controller``, as benchmarks/scale.py starts it). For each run,
30 % of the nodes (10 of 32) are busy with a background Pod holding all their GPUs, drawn
at random (a seed per run: every arm meets the same layouts; a layout where no rack has
4 free nodes is drawn again, as no scheduler could place a required run there), and one
run of 4 nodes x 8 GPUs is placed by each arm in turn:

  - default scheduler: no ``spec.placement``: torchyard's own admission lets the gang in,
    kube-scheduler binds each Pod (the baseline);
  - torchyard preferred / required: ``spec.placement.topology`` at the rack level, placed
    by torchyard's own gang admission;
  - Kueue preferred / required: the same placement with ``scheduling.queueName``: Kueue's
    TAS places the run's Workload, torchyard applies its assignment;

once all 4 Pods are bound (``spec.nodeName``), the racks and blocks of their nodes are
counted and the run is deleted. Per arm: the share of runs in one rack and the mean racks
(and blocks) a run spans; targets: required 100 % in one rack, preferred <= 1.2 racks on
average, against the default scheduler's figure (the ratio).

Then a 64-node run (a second pool: 64 nodes, 2 blocks x 4 racks x 8 nodes, preferred at
the rack level), ``--big-rounds`` times for torchyard's own admission (admitted at once:
from its creation) and for Kueue (from the moment its Workload is seen admitted), until
all 64 Pods are bound: p95 target <= 3 s.

    .venv/bin/python benchmarks/placement.py [--runs 100] [--big-rounds 10] [--seed 51]
    .venv/bin/python benchmarks/placement.py --smoke   # 5 runs per arm, 2 big rounds
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from benchmarks import record, scale  # noqa: E402
from tests.builders import environment  # noqa: E402
from tests.cluster import kueue as kq  # noqa: E402
from tests.cluster.binaries import KUBERNETES_VERSION  # noqa: E402
from tests.cluster.harness import Cluster  # noqa: E402
from tests.cluster.racks import RACK, Racks, busy_pod, kueue_topology  # noqa: E402

from torchyard import k8s  # noqa: E402

NS = "placement"
BACKGROUND = "background"
POOL = Racks("tas", blocks=2, racks_per_block=4, nodes_per_rack=4)
BIG = Racks("big", blocks=2, racks_per_block=4, nodes_per_rack=8)
GANG, BIG_GANG = 4, 64
BUSY_SHARE = 0.3
TOPOLOGY = "racks"
ARMS = (
    ("default scheduler", None, False),
    ("torchyard preferred", "preferred", False),
    ("torchyard required", "required", False),
    ("Kueue preferred", "preferred", True),
    ("Kueue required", "required", True),
)
PREFERRED_TARGET = 1.2
BIG_TARGET_SECONDS = 3.0


def said(name: str) -> str:
    """What the run's status and its Workload's conditions say (why a run is not placed)."""
    run = k8s.get_or_none(k8s.TRAININGRUNS, NS, name) or {}
    lines = [
        f"{c['type']}={c['status']}: {c.get('message', '')}"
        for c in run.get("status", {}).get("conditions", [])
    ]
    for wl in k8s.list_(k8s.WORKLOADS, NS, label_selector=f"torchyard.dev/run={name}"):
        lines += [
            f"Workload {c['type']}={c['status']}: {c.get('message', '')}"
            for c in wl.get("status", {}).get("conditions", [])
        ]
    return "\n".join(lines)


def wait(
    what: str,
    check: Callable[[], Any],
    timeout: float = 120,
    on_timeout: Callable[[], str] = str,
) -> Any:
    """What ``check()`` found once it found something (past ``timeout``: the run ends,
    saying what ``on_timeout()`` says)."""
    found = None

    def holds() -> bool:
        nonlocal found
        found = check()
        return bool(found)

    if scale.wait(what, holds, timeout) is None:
        raise SystemExit(f"timed out waiting for {what}\n{on_timeout()}")
    return found


def run_body(name: str, pool: Racks, nodes: int, mode: str | None, kueue: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "environment": "pytorch",
        "command": ["python", "train.py"],
        "distribution": {"nodeCount": nodes},
        "resources": {"gpusPerNode": 8},
        "compute": {"pool": pool.pool},
    }
    if mode is not None:
        spec["placement"] = {"topology": {"level": RACK, "mode": mode}}
    if kueue:
        spec["scheduling"] = {"queueName": pool.pool}
    return {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def bound(name: str, nodes: int) -> list[str] | None:
    """The nodes of the run's Pods once all ``nodes`` are bound, else None."""
    items = k8s.list_(k8s.PODS, NS, label_selector=f"torchyard.dev/run={name}")
    chosen = [p.get("spec", {}).get("nodeName") for p in items]
    return [str(n) for n in chosen] if len(chosen) == nodes and all(chosen) else None


def gone(name: str) -> bool:
    return not k8s.list_(k8s.PODS, NS, label_selector=f"torchyard.dev/run={name}")


def delete_run(name: str) -> None:
    k8s.delete(k8s.TRAININGRUNS, NS, name, propagation="Foreground")
    wait(f"{name}'s Pods gone", lambda: gone(name))
    wait(f"{name} gone", lambda: k8s.get_or_none(k8s.TRAININGRUNS, NS, name) is None)


def layout(seed: int, pool: Racks) -> set[int]:
    """The busy nodes of run ``seed``: 30 % of the pool, with a rack left whole."""
    rng = random.Random(seed)
    while True:
        busy = set(rng.sample(range(pool.size), round(BUSY_SHARE * pool.size)))
        racks = {pool.rack_of(i) for i in range(pool.size)}
        if any(all(i not in busy for i in range(pool.size) if pool.rack_of(i) == r) for r in racks):
            return busy


class Background:
    """The busy nodes' Pods, moved from one layout to the next."""

    def __init__(self, pool: Racks) -> None:
        self.pool = pool
        self.busy: set[int] = set()

    def become(self, busy: set[int]) -> None:
        going, coming = self.busy - busy, busy - self.busy
        with ThreadPoolExecutor(8) as ex:
            list(
                ex.map(
                    lambda i: k8s.delete(
                        k8s.PODS, BACKGROUND, f"busy-{self.pool.name(i)}", grace_period_seconds=0
                    ),
                    going,
                )
            )
        wait(
            "the freed nodes' Pods gone",
            lambda: all(
                k8s.get_or_none(k8s.PODS, BACKGROUND, f"busy-{self.pool.name(i)}") is None
                for i in going
            ),
        )
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda i: k8s.create(busy_pod(self.pool.name(i), BACKGROUND)), coming))
        wait(
            "the busy nodes' Pods running",
            lambda: all(
                (
                    k8s.get(k8s.PODS, BACKGROUND, f"busy-{self.pool.name(i)}").get("status") or {}
                ).get("phase")
                == "Running"
                for i in coming
            ),
        )
        self.busy = set(busy)


def spans(pool: Racks, nodes: list[str]) -> tuple[int, int]:
    index = {pool.name(i): i for i in range(pool.size)}
    racks = {pool.rack_of(index[n]) for n in nodes}
    blocks = {pool.block_of(index[n]) for n in nodes}
    return len(racks), len(blocks)


def placement_round(
    run: int, background: Background, seed: int, rec: record.Record
) -> dict[str, tuple[int, int]]:
    """One layout, one run of each arm in turn: (racks, blocks) per arm."""
    background.become(layout(seed + run, POOL))
    out = {}
    for label, mode, kueue in ARMS:
        name = f"r{run}-{label.split()[0][:5].lower()}-{mode or 'none'}"
        k8s.create(run_body(name, POOL, GANG, mode, kueue))
        nodes = wait(
            f"{name} bound", lambda n=name: bound(n, GANG), on_timeout=lambda n=name: said(n)
        )
        out[label] = spans(POOL, nodes)
        delete_run(name)
    rec.round(run=run, **{label: racks for label, (racks, _) in out.items()})
    return out


def big_round(round_: int, kueue: bool) -> float:
    """Seconds from admission to all 64 Pods bound."""
    name = f"big-{'kueue' if kueue else 'own'}-{round_}"
    created = time.monotonic()
    k8s.create(run_body(name, BIG, BIG_GANG, "preferred", kueue))
    admitted = created
    if kueue:

        def seen_admitted() -> bool:
            for wl in k8s.list_(k8s.WORKLOADS, NS, label_selector=f"torchyard.dev/run={name}"):
                for cond in wl.get("status", {}).get("conditions", []):
                    if cond["type"] == "Admitted" and cond["status"] == "True":
                        return True
            return False

        wait(f"{name}'s Workload admitted", seen_admitted)
        admitted = time.monotonic()
    wait(f"{name}'s 64 Pods bound", lambda: bound(name, BIG_GANG), timeout=300)
    seconds = time.monotonic() - admitted
    delete_run(name)
    return seconds


def setup(cluster: Cluster) -> None:
    for ns in (NS, BACKGROUND):
        cluster.create_namespace(ns)
    k8s.create(environment("pytorch", NS, image="img"))
    docs: list[dict[str, Any]] = [kueue_topology(TOPOLOGY)]
    for pool in (POOL, BIG):
        docs += [
            kq.resource_flavor(
                pool.pool, node_labels={"torchyard.dev/pool": pool.pool}, topology=TOPOLOGY
            ),
            kq.cluster_queue(pool.pool, pool.pool, gpus=8 * pool.size),
            kq.local_queue(NS, pool.pool, pool.pool),
        ]
    kq.create(cluster, *docs)


def report(
    results: list[dict[str, tuple[int, int]]], big: dict[str, list[float]], rec: record.Record
) -> bool:
    """Print and record the figures; True when every target was met."""
    ok = True
    base = statistics.mean(r["default scheduler"][0] for r in results)
    print(
        f"\n{'arm':22} {'one rack':>9} {'racks/run':>10} {'blocks/run':>11} "
        f"{'racks vs default':>17}"
    )
    for label, mode, _ in ARMS:
        racks = [r[label][0] for r in results]
        blocks = [r[label][1] for r in results]
        one = 100.0 * sum(1 for n in racks if n == 1) / len(racks)
        mean = statistics.mean(racks)
        print(
            f"{label:22} {one:8.0f}% {mean:10.2f} {statistics.mean(blocks):11.2f} "
            f"{mean / base:16.2f}x"
        )
        if mode == "required":
            met = one == 100.0
            rec.figure(f"{label}: runs in one rack", one, "%", target="= 100 %", met=met)
        elif mode == "preferred":
            met = mean <= PREFERRED_TARGET
            rec.figure(
                f"{label}: racks per run",
                round(mean, 3),
                "racks",
                spread=(min(racks), max(racks)),
                baseline=("default scheduler", round(base, 3)),
                ratio=round(mean / base, 3),
                target=f"<= {PREFERRED_TARGET}",
                met=met,
            )
        else:
            met = True
            rec.figure(
                f"{label}: racks per run", round(mean, 3), "racks", spread=(min(racks), max(racks))
            )
        ok &= met
    for arm, seconds in big.items():
        if not seconds:
            continue
        value = scale.percentile(seconds, 0.95)
        met = value <= BIG_TARGET_SECONDS
        print(
            f"64-node run, {arm}: admission -> all Pods bound p95 {value:.2f}s "
            f"(median {statistics.median(seconds):.2f}s, {len(seconds)} rounds)"
        )
        rec.figure(
            f"64-node run ({arm}): admission -> all Pods bound, p95",
            round(value, 3),
            "s",
            spread=(round(min(seconds), 3), round(max(seconds), 3)),
            target=f"<= {BIG_TARGET_SECONDS:g} s",
            met=met,
        )
        ok &= met
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="runs per arm")
    parser.add_argument("--big-rounds", type=int, default=10, help="64-node runs per arm")
    parser.add_argument("--seed", type=int, default=51, help="seed of the busy layouts")
    parser.add_argument("--smoke", action="store_true", help="5 runs per arm, 2 big rounds")
    record.add_argument(parser)
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.big_rounds = 5, 2
    if args.runs < 1 or args.big_rounds < 0:
        parser.error("--runs must be >= 1 and --big-rounds >= 0")
    rec = record.Record("placement", args)
    rec.version("kubernetes", KUBERNETES_VERSION)
    rec.version("kueue", kq.KUEUE.version)
    started = time.monotonic()
    with Cluster(pools=()) as cluster:
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        os.environ["TORCHYARD_RESOLVE_CURATED"] = "127.0.0.1"
        k8s.reset()
        for pool in (POOL, BIG):
            pool.create(cluster)
        kueue = kq.Kueue(cluster).start()
        setup(cluster)
        log = cluster.workdir / "operator.log"
        op = scale.Operator(str(REPO / "operator"), cluster.kubeconfig, log)
        op.start()
        try:
            background = Background(POOL)
            results = []
            for run in range(args.runs):
                results.append(placement_round(run, background, args.seed, rec))
                if (run + 1) % 10 == 0:
                    print(
                        f"  {run + 1}/{args.runs} runs per arm ({time.monotonic() - started:.0f}s)",
                        flush=True,
                    )
            background.become(set())
            big: dict[str, list[float]] = {"torchyard": [], "Kueue": []}
            for round_ in range(args.big_rounds):
                for arm, kueue_arm in (("torchyard", False), ("Kueue", True)):
                    big[arm].append(big_round(round_, kueue_arm))
            rec.round(big_seconds=big)
        finally:
            op.stop()
            kueue.stop(remove_crds=False)
    ok = report(results, big, rec)
    rec.note(
        f"{POOL.size} nodes of 8 GPUs ({POOL.blocks} blocks x {POOL.racks_per_block} racks x "
        f"{POOL.nodes_per_rack}), {round(BUSY_SHARE * POOL.size)} busy per run (seed "
        f"{args.seed} + run); runs of {GANG} nodes x 8 GPUs placed one at a time"
    )
    rec.write()
    # a target missed is a figure (met: false in the results), not a failed run
    print(f"done in {time.monotonic() - started:.0f}s; targets {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
