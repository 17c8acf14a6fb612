"""Environment cache: Ready on a cache hit, and one build per distinct recipe.

Against the test control plane and a real OCI registry (both from tests/cluster/):
  1. cache hit: an Environment whose image is already in the registry, from creation to
     Ready (the operator asks the registry, finds the tag, creates no Job), beside the
     baseline measured in the same run: a curated Environment (no registry call at all);
  2. sharing: 50 Environments with 5 distinct recipes, and the number of build Jobs.
Targets: cache hit Ready in under 1 s; 5 Jobs.

    .venv/bin/python benchmarks/env_cache.py
"""

from __future__ import annotations

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


def main() -> int:
    with Cluster() as cluster:
        reg = OciRegistry().start()
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        # Reach no registry but the local one (never a public one for "img").
        os.environ["TORCHYARD_RESOLVE_CURATED"] = "127.0.0.1"
        k8s.reset()
        cluster.create_namespace(NS)
        op = InProcessOperator()
        op.start()
        try:
            registry = {"repository": f"{reg.host}/envs", "insecure": True}
            curated, hits = [], []
            for i in range(5):
                curated.append(time_to_ready(f"curated-{i}", {"image": "python:3.11-slim"}))
                spec = {"baseImage": "python:3.11-slim", "pip": [f"pkg-{i}"], "registry": registry}
                tag = environments.image_tag(
                    environments.content_hash(api.parse_environment(body("x", spec)))
                )
                push_base_image(reg, "envs", tag)
                hits.append(time_to_ready(f"hit-{i}", spec))
            for i in range(50):
                k8s.create(
                    body(
                        f"shared-{i}",
                        {
                            "baseImage": "python:3.11-slim",
                            "pip": [f"recipe-{i % 5}"],
                            "registry": registry,
                        },
                    )
                )
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                phases = [
                    (e.get("status") or {}).get("phase")
                    for e in k8s.list_(k8s.ENVIRONMENTS, NS)
                    if e["metadata"]["name"].startswith("shared-")
                ]
                if len(phases) == 50 and all(p == "Building" for p in phases):
                    break
                time.sleep(0.2)
            jobs = k8s.list_(
                k8s.JOBS, NS, label_selector="app.kubernetes.io/component=environment-build"
            )
        finally:
            op.stop()
            reg.stop()
    hit, base = statistics.median(hits), statistics.median(curated)
    print(f"cache hit Ready (median of 5):        {hit * 1000:7.0f} ms   (target < 1000 ms)")
    print(f"curated Ready, baseline (median of 5): {base * 1000:7.0f} ms")
    print(f"ratio cache hit / curated:             {hit / base:7.2f}")
    print(f"build Jobs for 50 Environments sharing 5 recipes: {len(jobs)}   (target 5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
