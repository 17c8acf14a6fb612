"""Environment cache: Ready on a cache hit, and one build per distinct recipe.

Against the test control plane and a real OCI registry (both from tests/cluster/):
  1. cache hit: an Environment whose image is already in the registry, from creation to
     Ready (the operator asks the registry, finds the tag, creates no Job), beside the
     baseline measured in the same run: a curated Environment (no registry call at all);
  2. sharing: 50 Environments with 5 distinct recipes, and the number of build Jobs,
     counted once every one of them is Building (the run fails, naming the stragglers,
     when they are not within 60 s: a count taken earlier would prove nothing).
Targets: cache hit Ready in under 1 s; 5 Jobs. Each line says whether its target was met.

    .venv/bin/python benchmarks/env_cache.py [--repeats 5] [--environments 50] [--recipes 5]
    .venv/bin/python benchmarks/env_cache.py --smoke   # smallest sizes (tests run this)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "operator"),
]

from benchmarks import record  # noqa: E402
from tests.cluster import chart  # noqa: E402
from tests.cluster.binaries import KUBERNETES_VERSION  # noqa: E402
from tests.cluster.harness import Cluster  # noqa: E402
from tests.cluster.registry import OciRegistry  # noqa: E402
from tests.conftest import InProcessOperator  # noqa: E402
from tests.integration.test_envbuild import push_base_image  # noqa: E402

from torchyard import api, k8s  # noqa: E402
from torchyard.planning import environments  # noqa: E402

NS = "envcache"


def body(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "Environment",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def time_to_ready(name: str, spec: dict[str, Any]) -> float:
    started = time.monotonic()
    k8s.create(body(name, spec))
    while (k8s.get(k8s.ENVIRONMENTS, NS, name).get("status") or {}).get("phase") != "Ready":
        if time.monotonic() - started > 60:
            raise SystemExit(f"{name} never became Ready")
        time.sleep(0.01)
    return time.monotonic() - started


def verdict(met: bool) -> str:
    return "target met" if met else "TARGET MISSED"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="cache hits (and curated)")
    parser.add_argument("--environments", type=int, default=50, help="sharing Environments")
    parser.add_argument("--recipes", type=int, default=5, help="distinct recipes among them")
    parser.add_argument("--smoke", action="store_true", help="2 repeats, 6 Environments, 2 recipes")
    record.add_argument(parser)
    args = parser.parse_args()
    rec = record.Record("env_cache", args)
    rec.version("kubernetes", KUBERNETES_VERSION)
    if args.smoke:
        args.repeats, args.environments, args.recipes = 2, 6, 2
    with Cluster() as cluster:
        reg = OciRegistry().start()
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        # Reach no registry but the local one (never a public one for "img").
        os.environ["TORCHYARD_RESOLVE_CURATED"] = "127.0.0.1"
        k8s.reset()
        cluster.create_namespace(NS)
        op = InProcessOperator(chart.operator_client(cluster, cluster.workdir / "operator-rbac"))
        op.start()
        try:
            registry = {"repository": f"{reg.host}/envs", "insecure": True}
            curated, hits = [], []
            for i in range(args.repeats):
                curated.append(time_to_ready(f"curated-{i}", {"image": "python:3.11-slim"}))
                spec = {"baseImage": "python:3.11-slim", "pip": [f"pkg-{i}"], "registry": registry}
                tag = environments.image_tag(
                    environments.content_hash(api.parse_environment(body("x", spec)))
                )
                push_base_image(reg, "envs", tag)
                hits.append(time_to_ready(f"hit-{i}", spec))
            for i in range(args.environments):
                k8s.create(
                    body(
                        f"shared-{i}",
                        {
                            "baseImage": "python:3.11-slim",
                            "pip": [f"recipe-{i % args.recipes}"],
                            "registry": registry,
                        },
                    )
                )
            deadline = time.monotonic() + 60
            while True:
                phases = {
                    e["metadata"]["name"]: (e.get("status") or {}).get("phase")
                    for e in k8s.list_(k8s.ENVIRONMENTS, NS)
                    if e["metadata"]["name"].startswith("shared-")
                }
                behind = sorted(n for n, p in phases.items() if p != "Building")
                if len(phases) == args.environments and not behind:
                    break
                if time.monotonic() > deadline:
                    shown = ", ".join(f"{n}: {phases.get(n)}" for n in behind[:10])
                    raise SystemExit(
                        f"only {args.environments - len(behind)} of {args.environments} "
                        f"Environments reached Building within 60 s ({shown}): the Job count "
                        "would prove nothing; see the operator's log above"
                    )
                time.sleep(0.2)
            jobs = k8s.list_(
                k8s.JOBS, NS, label_selector="app.kubernetes.io/component=environment-build"
            )
        finally:
            op.stop()
            reg.stop()
    hit, base = statistics.median(hits), statistics.median(curated)
    n = args.repeats
    print(
        f"cache hit Ready (median of {n}):        {hit * 1000:7.0f} ms   "
        f"(target < 1000 ms: {verdict(hit < 1.0)}; "
        f"spread {min(hits) * 1000:.0f}-{max(hits) * 1000:.0f} ms)"
    )
    print(
        f"curated Ready, baseline (median of {n}): {base * 1000:7.0f} ms   "
        f"(spread {min(curated) * 1000:.0f}-{max(curated) * 1000:.0f} ms)"
    )
    print(f"ratio cache hit / curated:             {hit / base:7.2f}")
    print(
        f"build Jobs for {args.environments} Environments sharing {args.recipes} recipes, "
        f"all Building: {len(jobs)}   (target {args.recipes}: "
        f"{verdict(len(jobs) == args.recipes)})"
    )
    for i, (h, c) in enumerate(zip(hits, curated, strict=True)):
        rec.round(repetition=i + 1, cache_hit_ready_ms=h * 1000, curated_ready_ms=c * 1000)
    rec.figure(
        "cache hit: Environment created -> Ready",
        hit * 1000,
        "ms",
        spread=(min(hits) * 1000, max(hits) * 1000),
        baseline=("curated Environment", round(base * 1000, 1)),
        ratio=hit / base,
        target="< 1000 ms",
        met=hit < 1.0,
    )
    rec.figure(
        f"build Jobs for {args.environments} Environments of {args.recipes} recipes, all Building",
        len(jobs),
        "Jobs",
        target=str(args.recipes),
        met=len(jobs) == args.recipes,
    )
    rec.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
