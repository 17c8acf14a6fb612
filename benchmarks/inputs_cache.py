"""The inputs cache: a second run of an input fetches nothing and is admitted at once, a
sweep's trials share one fetch, and no run holds a GPU while its input is fetched.

Against the test control plane (KWOK GPU pools, ``tests/cluster/harness.py``) and an
operator of this tree (a subprocess: ``benchmarks/scale.py``'s ``Operator``), with a
host-path volume for the namespace's inputs cache. KWOK runs no container, so the harness
ends a fetch Job's Pod as the fetcher ends (exit 0, its termination message naming the
cache entry: key, digest, bytes): what is measured is the operator's side, the Jobs it
makes, the entries it records and when it admits (the fetch itself is measured against
boto3 by ``benchmarks/inputs.py``, and on the real node by ``tests/node``).

1. cold: a one-GPU run with an ``https://`` input (its sha256 given) is Preparing; while
   its fetch Pod runs, the run has no Pod (so no GPU); the harness ends the fetch; the
   time from the fetch's end to the run's node Pod.
2. warm: ``--repeat`` runs of the same input, one at a time: created -> node Pod (its gang
   admitted), the fetch Jobs made for them and the bytes their status says they fetched;
   each beside the same run with no input, created -> node Pod (taken in turns).
3. sweep: a Sweep of ``--trials`` trials (made at once) with the input: the fetch Jobs made
   for them, against one per trial without the cache.

Targets: a warm run admitted <= 5 s after it is created; 0 bytes fetched on a hit; one
fetch for the whole sweep.

    .venv/bin/python benchmarks/inputs_cache.py [--repeat 10] [--trials 16] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from benchmarks import record  # noqa: E402
from benchmarks.scale import Operator  # noqa: E402
from tests.cluster.binaries import KUBERNETES_VERSION  # noqa: E402
from tests.cluster.harness import Cluster  # noqa: E402
from tests.integration.helpers import finish_pod, host_volume, run_pods  # noqa: E402

from torchyard import api, k8s  # noqa: E402
from torchyard.api import wire  # noqa: E402
from torchyard.planning import inputs  # noqa: E402

SHA = "ab" * 32
BIRDS = {"name": "birds", "uri": "https://files.example/birds.tgz", "sha256": SHA}
# the sweep's own input (a cache entry of its own, fetched cold as the sweep starts)
FLOWERS = {"name": "birds", "uri": "https://files.example/flowers.tgz", "sha256": "ef" * 32}
SIZE = 512 << 20  # what the harness's fetcher says it fetched (bytes)
TARGET_S = 5.0
FETCH = f"app.kubernetes.io/component={inputs.COMPONENT_FETCH}"


def run_body(
    ns: str, name: str, with_input: bool, source: dict[str, str] = BIRDS
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "environment": "pytorch",
        "command": ["python", "train.py"],
        "resources": {"gpusPerNode": 1, "cpu": "1"},
        "compute": {"pool": "a100"},
    }
    if with_input:
        spec["inputs"] = [source]
    return {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def sweep_body(ns: str, trials: int) -> dict[str, Any]:
    return {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "Sweep",
        "metadata": {"name": "tune", "namespace": ns},
        "spec": {
            "trial": run_body(ns, "trial", True, FLOWERS)["spec"],
            "parameters": {
                "learning_rate": {"type": "uniform", "minValue": 1e-4, "maxValue": 1e-2}
            },
            "sampling": "random",
            "objective": {"metric": "best_val_acc", "goal": "maximize"},
            "maxTotalTrials": trials,
            "seed": 7,
        },
    }


def poll(what: str, check: Callable[[], Any], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise SystemExit(f"inputs_cache: {what}: not within {timeout:.0f}s")


def node_pods(ns: str, run: str) -> list[dict[str, Any]]:
    return run_pods(ns, run)


def fetch_jobs(ns: str) -> list[dict[str, Any]]:
    return k8s.list_(k8s.JOBS, ns, label_selector=FETCH)


def admitted_in(ns: str, body: dict[str, Any]) -> float:
    """Create ``body``; seconds until its node Pod exists (its gang admitted)."""
    started = time.monotonic()
    k8s.create(body)
    poll(f"{body['metadata']['name']}'s node Pod", lambda: node_pods(ns, body["metadata"]["name"]))
    return time.monotonic() - started


def end_fetches(cluster: Cluster, ns: str, body: dict[str, Any], source: dict[str, str]) -> int:
    """End every running fetch Pod as the fetcher ends after fetching ``source`` (the input
    of ``body``): exit 0, the cache entry in its termination message. How many it ended."""
    key = inputs.keys(api.parse_trainingrun(body))["birds"]
    entry = {"key": key, "uri": source["uri"], "revision": source["sha256"], "bytes": SIZE}
    entry["digest"] = "sha256:" + "cd" * 32
    message = json.dumps({"entry": entry, "fetchedBytes": SIZE})
    pods = [
        p
        for p in k8s.list_(k8s.PODS, ns, label_selector="job-name")
        if p.get("status", {}).get("phase") == "Running"
    ]
    for pod in pods:
        finish_pod(cluster, ns, pod["metadata"]["name"], 0, message)
    return len(pods)


def cold(cluster: Cluster, ns: str) -> tuple[float, bool]:
    """The first run: its fetch ended by the harness; (seconds from the fetch's end to its
    node Pod, whether it had no Pod while the fetch ran)."""
    body = run_body(ns, "first", True)
    k8s.create(body)
    [job] = poll("the fetch Job", lambda: fetch_jobs(ns))
    selector = f"job-name={job['metadata']['name']}"
    poll(
        "the fetch Pod running",
        lambda: [
            p
            for p in k8s.list_(k8s.PODS, ns, label_selector=selector)
            if p.get("status", {}).get("phase") == "Running"
        ],
    )
    no_gpu = node_pods(ns, "first") == []
    ended = time.monotonic()
    end_fetches(cluster, ns, body, BIRDS)
    poll("the first run's node Pod", lambda: node_pods(ns, "first"))
    return time.monotonic() - ended, no_gpu


def fetched(ns: str, name: str) -> int:
    """The bytes the run's status says its input fetched (once it is past Preparing)."""
    status = poll(
        f"{name}'s inputs in status",
        lambda: (k8s.get(k8s.TRAININGRUNS, ns, name).get("status") or {}).get("inputs"),
    )
    return int(status[0]["fetchedBytes"])


def warm(ns: str, repeat: int, rec: record.Record) -> tuple[list[float], list[float], int, int]:
    """``repeat`` hits and as many runs with no input, in turns."""
    hits, plain, bytes_, jobs_before = [], [], 0, len(fetch_jobs(ns))
    for i in range(repeat):
        order = [True, False] if i % 2 == 0 else [False, True]
        got: dict[bool, float] = {}
        for with_input in order:
            name = f"{'hit' if with_input else 'plain'}-{i}"
            got[with_input] = admitted_in(ns, run_body(ns, name, with_input))
            if with_input:
                bytes_ += fetched(ns, name)
            k8s.delete(k8s.TRAININGRUNS, ns, name)  # (its GPU back for the next)
            poll(f"{name}'s Pods gone", lambda name=name: not node_pods(ns, name))
        hits.append(got[True])
        plain.append(got[False])
        rec.round(part="warm", round=i + 1, hit_admitted_s=got[True], plain_admitted_s=got[False])
        print(f"warm {i + 1}: hit admitted {got[True]:.2f}s, no input {got[False]:.2f}s")
    return hits, plain, bytes_, len(fetch_jobs(ns)) - jobs_before


def sweep(cluster: Cluster, ns: str, trials: int) -> tuple[int, int, float]:
    """A sweep of ``trials`` with an input not yet in the cache, its fetches ended by the
    harness as they run: (fetch Jobs made, fetch Pods ended, seconds until every trial's
    node Pod)."""
    before = {j["metadata"]["uid"] for j in fetch_jobs(ns)}
    trial = run_body(ns, "trial", True, FLOWERS)
    started, ended = time.monotonic(), [0]
    k8s.create(sweep_body(ns, trials))

    def trials_running() -> bool:
        ended[0] += end_fetches(cluster, ns, trial, FLOWERS)
        made = k8s.list_(k8s.TRAININGRUNS, ns, label_selector=f"{wire.LABEL_SWEEP}=tune")
        ready = [r for r in made if node_pods(ns, r["metadata"]["name"])]
        return len(made) == trials and len(ready) == trials

    poll(f"{trials} trials admitted", trials_running, 300)
    took = time.monotonic() - started
    jobs = [j for j in fetch_jobs(ns) if j["metadata"]["uid"] not in before]
    return len(jobs), ended[0], took


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10, help="warm runs (and as many plain)")
    parser.add_argument("--trials", type=int, default=16, help="trials of the sweep")
    parser.add_argument("--smoke", action="store_true", help="2 warm runs, 4 trials")
    record.add_argument(parser)
    args = parser.parse_args()
    if args.smoke:
        args.repeat, args.trials = 2, 4
    rec = record.Record("inputs_cache", args)
    rec.version("kubernetes", KUBERNETES_VERSION)
    with tempfile.TemporaryDirectory(prefix="torchyard-inputs-cache-") as tmp, Cluster() as cluster:
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        k8s.reset()
        ns = cluster.create_namespace("inputs-cache")
        host_volume(cluster, f"inputs-{ns}"[:63], f"{tmp}/cache", "1Ti")
        os.environ["TORCHYARD_INPUTS_STORAGE_CLASS"] = f"inputs-{ns}"[:63]
        env = {"apiVersion": "torchyard.dev/v1alpha1", "kind": "Environment"}
        k8s.create(
            {**env, "metadata": {"name": "pytorch", "namespace": ns}, "spec": {"image": "i"}}
        )
        op = Operator(str(REPO / "operator"), cluster.kubeconfig, Path(tmp) / "operator.log",
                      None, ("--namespace", ns))  # fmt: skip
        op.start()
        try:
            after_fetch, no_gpu = cold(cluster, ns)
            hits, plain, hit_bytes, hit_jobs = warm(ns, args.repeat, rec)
            jobs, sweep_fetches, sweep_s = sweep(cluster, ns, args.trials)
        finally:
            op.stop()
    report(rec, args, (after_fetch, no_gpu), (hits, plain, hit_bytes, hit_jobs),
           (jobs, sweep_fetches, sweep_s))  # fmt: skip
    return 0


def report(
    rec: record.Record,
    args: argparse.Namespace,
    first: tuple[float, bool],
    hit: tuple[list[float], list[float], int, int],
    swept: tuple[int, int, float],
) -> None:
    (after_fetch, no_gpu), (hits, plain, hit_bytes, hit_jobs) = first, hit
    jobs, sweep_fetches, sweep_s = swept
    load = os.getloadavg()[0]
    median, worst = statistics.median(hits), max(hits)
    ratio = median / statistics.median(plain)
    print(
        f"inputs cache: {args.repeat} warm runs, a sweep of {args.trials} trials (load {load:.2f})"
    )
    print(f"cold run: no Pod while its input was fetched: {'yes' if no_gpu else 'NO'}; "
          f"node Pod {after_fetch:.2f}s after the fetch ended")  # fmt: skip
    print(f"warm run created -> admitted: median {median:.2f}s, max {worst:.2f}s; the same run "
          f"with no input {statistics.median(plain):.2f}s (ratio {ratio:.2f}); "
          f"fetch Jobs {hit_jobs}, bytes fetched {hit_bytes}")  # fmt: skip
    print(f"sweep of {args.trials} trials: fetch Jobs {jobs} (without the cache: "
          f"{args.trials}), fetch Pods run {sweep_fetches}, bytes fetched {sweep_fetches * SIZE}; "
          f"every trial admitted in {sweep_s:.1f}s")  # fmt: skip
    met = worst <= TARGET_S and hit_bytes == 0 and hit_jobs == 0
    once = "met" if jobs == 1 else "not met"
    print(f"target: a warm run admitted within {TARGET_S:g} s, fetching nothing: "
          f"{'met' if met else 'not met'}; one fetch for the sweep: {once}")  # fmt: skip
    rec.figure("cold run: a node Pod while its input was fetched", "none" if no_gpu else "yes",
               target="none", met=no_gpu)  # fmt: skip
    rec.figure("cold run: fetch ended -> node Pod", after_fetch, "s")
    rec.figure(
        "warm run (cache hit): created -> gang admitted",
        median,
        "s",
        spread=(min(hits), worst),
        baseline=("the same run with no input", statistics.median(plain)),
        ratio=ratio,
        target=f"<= {TARGET_S:g} s (every run)",
        met=worst <= TARGET_S,
    )
    rec.figure("warm runs: bytes fetched", hit_bytes, "B", target="0", met=hit_bytes == 0)
    rec.figure(
        f"sweep of {args.trials} trials: fetch Jobs",
        jobs,
        baseline=("one per trial, without the cache", args.trials),
        target="1",
        met=jobs == 1,
    )
    rec.round(
        part="sweep",
        trials=args.trials,
        fetch_jobs=jobs,
        fetch_pods=sweep_fetches,
        admitted_s=sweep_s,
    )
    rec.write()


if __name__ == "__main__":
    sys.exit(main())
