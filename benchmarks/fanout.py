"""Fan-out: how fast the operator turns a TrainingRun into N Running Pods.

Against the test control plane (tests/cluster/harness.py) with a pool of KWOK nodes (as
many as the largest size), for N = 8, 64 and 256 it measures, in the same run:
  - torchyard: from creating a TrainingRun with nodeCount N until all N node Pods are
    Running (created gated, gang-admitted, ungated, scheduled, started by KWOK);
  - ceiling: the same N Pods (same builder, no gate) created directly by a client with 16
    concurrent requests, until all are Running;
in ``--rounds`` interleaved rounds (every size once per round, ceiling and torchyard
alternately, so drift hits both alike), and prints per size the median of each, the
median ratio with its spread over the rounds (target <= 1.5 at N = 256, met only when
every round meets it) and the API writes per run: the apiserver's own
``apiserver_request_total`` (POST/PUT/PATCH/APPLY, by resource; every client's, the
scheduler's bindings and KWOK's status writes included; deletes, leases and nodes left
out), read before the create and 1 s after the N-th Pod is Running.

The operator runs as a process of its own (``python -m torchyard.controller``, as
benchmarks/scale.py starts it), so that it does not share this interpreter (and its GIL)
with the benchmark's polls; its CPU seconds per fan-out (from the create until 1 s after
the N-th Pod is Running, per round and their median) and its RSS are printed.

    .venv/bin/python benchmarks/fanout.py [--sizes 8,64,256] [--rounds 3]
        [--profile DIR]   # the operator under benchmarks/sampler.py: where its time goes
    .venv/bin/python benchmarks/fanout.py --smoke   # N = 8, 3 rounds (tests run this)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from benchmarks import record  # noqa: E402
from benchmarks.peers import _METRIC  # noqa: E402
from benchmarks.peers import writes as api_writes  # noqa: E402
from benchmarks.scale import Operator  # noqa: E402
from tests.cluster.binaries import KUBERNETES_VERSION  # noqa: E402
from tests.cluster.harness import Cluster, Pool  # noqa: E402

from torchyard import api, k8s  # noqa: E402
from torchyard.planning import pods  # noqa: E402

NS = "fanout"
POOL = Pool("fan", nodes=256, gpus=0, cpu="8", memory="32Gi")
TARGET_N, TARGET_RATIO = 256, 1.5


def log_reads(cluster: Cluster) -> int:
    """The apiserver's ``pods/log`` reads so far (the operator's progress polls: nobody
    else here reads a log)."""
    code, text = cluster.request("GET", "/metrics")
    assert code == 200, text
    total = 0.0
    for labels, value in _METRIC.findall(text):
        tags = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if tags.get("resource") == "pods" and tags.get("subresource") == "log":
            total += float(value)
    return int(total)


def run_body(name: str, n: int) -> dict[str, Any]:
    return {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "environment": "pytorch",
            "command": ["python", "train.py"],
            "distribution": {"nodeCount": n},
            "resources": {"cpu": "4"},
            "compute": {"pool": POOL.name},
        },
    }


def running(label: str, n: int) -> bool:
    items = k8s.list_(k8s.PODS, NS, label_selector=label)
    return len(items) == n and all(p.get("status", {}).get("phase") == "Running" for p in items)


def wait(what: str, check: Any, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def gone(label: str) -> bool:
    return not k8s.list_(k8s.PODS, NS, label_selector=label)


DIRECT_LABEL = "bench.torchyard.dev/direct"


def ceiling(n: int, round_: int) -> float:
    """N Pods from the same builder, created directly by 16 concurrent requests."""
    run = api.parse_trainingrun(run_body(f"direct-{n}-{round_}", n))
    manifests = []
    for p in pods.pods(run, image="img"):
        p = pods.ungate(p)
        p["metadata"].pop("ownerReferences")
        # a label of their own: the operator beside them reconciles no run for them
        labels = p["metadata"]["labels"]
        labels[DIRECT_LABEL] = labels.pop("torchyard.dev/run")
        manifests.append(p)
    label = f"{DIRECT_LABEL}=direct-{n}-{round_}"
    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(k8s.create, manifests))
    wait(f"{n} direct Pods Running", lambda: running(label, n))
    elapsed = time.monotonic() - started
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(
                lambda m: k8s.delete(k8s.PODS, NS, m["metadata"]["name"], grace_period_seconds=0),
                manifests,
            )
        )
    wait("direct Pods gone", lambda: gone(label))
    return elapsed


def operator_run(
    cluster: Cluster, op: Operator, n: int, round_: int
) -> tuple[float, int, float, int]:
    """Seconds to N Running, API writes, the operator's CPU seconds from the create
    until 1 s after the N-th Pod is Running (the teardown after it not counted), and the
    Pod logs it read meanwhile."""
    name = f"fan-{n}-{round_}"
    label = f"torchyard.dev/run={name}"
    before = api_writes(cluster)
    logs_before = log_reads(cluster)
    cpu_before = op.cpu_seconds()
    started = time.monotonic()
    k8s.create(run_body(name, n))
    wait(f"{n} operator Pods Running", lambda: running(label, n))
    elapsed = time.monotonic() - started
    time.sleep(1)  # let the last status write land before counting
    cpu = op.cpu_seconds() - cpu_before
    logs = log_reads(cluster) - logs_before
    delta = api_writes(cluster) - before
    writes = sum(v for k, v in delta.items() if "DELETE" not in k)
    k8s.delete(k8s.TRAININGRUNS, NS, name, propagation="Foreground")
    wait("operator Pods gone", lambda: gone(label))
    return elapsed, writes, cpu, logs


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg()) + f" ({os.cpu_count()} cores)"


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return fmt.format(min(values)) + "-" + fmt.format(max(values))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,64,256")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per size")
    parser.add_argument("--smoke", action="store_true", help="N = 8 only, 3 rounds")
    parser.add_argument(
        "--profile",
        type=Path,
        help="folder for the operator's sampled profile (benchmarks/sampler.py), per round",
    )
    record.add_argument(parser)
    args = parser.parse_args()
    if args.smoke:
        args.sizes = "8"
    rec = record.Record("fanout", args)
    rec.version("kubernetes", KUBERNETES_VERSION)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.rounds < 1 or not sizes or min(sizes) < 1:
        parser.error("--rounds and every size must be >= 1")
    pool = dataclasses.replace(POOL, nodes=max(sizes))
    print(f"load average before: {load()}", flush=True)
    with Cluster(pools=(pool,)) as cluster:
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        # Reach no registry but the local one (never a public one for "img").
        os.environ["TORCHYARD_RESOLVE_CURATED"] = "127.0.0.1"
        k8s.reset()
        cluster.create_namespace(NS)
        k8s.create(
            {
                "apiVersion": "torchyard.dev/v1alpha1",
                "kind": "Environment",
                "metadata": {"name": "pytorch", "namespace": NS},
                "spec": {"image": "img"},
            }
        )
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
        op = Operator(
            str(REPO / "operator"),
            cluster.kubeconfig,
            (args.profile or cluster.workdir) / "fanout-operator.log",
            args.profile / "profile" if args.profile else None,
        )
        op.start()
        results: dict[int, list[tuple[float, float, int]]] = {n: [] for n in sizes}
        # the operator's CPU seconds per torchyard fan-out (create .. Running + 1 s)
        cpus: dict[int, list[float]] = {n: [] for n in sizes}
        try:
            for r in range(args.rounds):
                for n in sizes:
                    direct = ceiling(n, r)
                    op.cut()  # a profile window per torchyard fan-out (--profile)
                    mine, writes, cpu, logs = operator_run(cluster, op, n, r)
                    op.cut()
                    results[n].append((mine, direct, writes))
                    cpus[n].append(cpu)
                    print(
                        f"round {r + 1}/{args.rounds}  N={n:4d}  torchyard {mine:6.2f}s  "
                        f"ceiling {direct:6.2f}s  ratio {mine / direct:5.2f}  "
                        f"API writes {writes}  operator CPU {cpu:5.2f}s "
                        f"({1000 * cpu / n:.1f} ms/Pod)  Pod logs read {logs}",
                        flush=True,
                    )
                    rec.round(
                        round=r + 1,
                        n=n,
                        torchyard_s=mine,
                        direct_s=direct,
                        ratio=mine / direct,
                        api_writes=writes,
                        operator_cpu_s=cpu,
                        pod_logs_read=logs,
                    )
            rss, peak = op.memory_mib()
            print(
                f"operator process: CPU {op.cpu_seconds():.1f}s, RSS {rss:.0f} MiB "
                f"(peak {peak:.0f} MiB)"
            )
        finally:
            op.stop()
    print(f"\nmedian of {args.rounds} interleaved rounds (spread: lowest-highest)")
    print(
        "   N  torchyard          ceiling            ratio              API writes/run"
        "  operator CPU/fan-out"
    )
    for n in sizes:
        mine = [m for m, _, _ in results[n]]
        direct = [d for _, d, _ in results[n]]
        ratios = [m / d for m, d, _ in results[n]]
        writes = [w for _, _, w in results[n]]
        print(
            f"{n:4d}  {statistics.median(mine):6.2f}s ({spread(mine)})  "
            f"{statistics.median(direct):6.2f}s ({spread(direct)})  "
            f"{statistics.median(ratios):5.2f} ({spread(ratios)})  "
            f"{statistics.median(writes):6.0f}          "
            f"{statistics.median(cpus[n]):5.2f}s ({spread(cpus[n])}, "
            f"{1000 * statistics.median(cpus[n]) / n:.1f} ms/Pod)"
        )
        rec.figure(
            f"TrainingRun -> {n} Pods Running",
            statistics.median(mine),
            "s",
            spread=(min(mine), max(mine)),
            baseline=("the same Pods created directly, 16 at a time", statistics.median(direct)),
            ratio=statistics.median(ratios),
            ratio_spread=(min(ratios), max(ratios)),
            target=f"<= {TARGET_RATIO} in every round" if n == TARGET_N else None,
            met=all(r <= TARGET_RATIO for r in ratios) if n == TARGET_N else None,
        )
        rec.figure(f"API writes per fan-out of {n}", statistics.median(writes), "writes")
        rec.figure(
            f"operator CPU per fan-out of {n}", 1000 * statistics.median(cpus[n]) / n, "ms/Pod"
        )
    rec.figure("operator process RSS (peak)", peak, "MiB")
    rec.write()
    print(f"load average after: {load()}")
    if TARGET_N in results:
        ratios = [m / d for m, d, _ in results[TARGET_N]]
        met = sum(r <= TARGET_RATIO for r in ratios)
        verdict = "target met" if met == len(ratios) else "TARGET MISSED"
        print(
            f"target: ratio <= {TARGET_RATIO} at N = {TARGET_N}: {verdict} "
            f"({met} of {len(ratios)} rounds within it)"
        )
    else:
        print(f"target: ratio <= {TARGET_RATIO} at N = {TARGET_N} (not measured in this run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
