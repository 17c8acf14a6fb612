"""Why a run failed, repeated on a REAL node: how often each hang is detected and its rank
and line named right, and how often each failure class is produced and named right.

Each round creates one TrainingRun per case on the harness's real kubelet node
(tests/cluster/realnode.py), in the CPU PyTorch image, as a non-root user in a namespace
that enforces Pod Security "restricted" (no ptrace), and waits for every one to end:
  - hangs (``policy.stallTimeoutSeconds`` 15): a rank that sleeps, one blocked in a C call
    (``signal.pause``), one that skips an ``all_reduce`` (three ranks, gloo: it waits in the
    barrier after its loop), and one that sleeps among the ranks torchrun starts
    (``launch: node``). Detected: the run failed with class ``Hang`` within the stall
    timeout + 60 s of its Pods running; named right: ``status.failure`` names rank 1 and
    the script's line (``<string>:N``) the rank is stuck at;
  - failure classes (tests/node/test_failure_classes.py's scripts): a segfault, a missing
    module, a Python exception, a GPU Xid line, a rendezvous timeout, a collective timeout
    (gloo's, ``collective``: rank 1 sleeps instead of joining an ``all_reduce``), and a rank
    over the node Pod's memory limit (tests/node/test_failures.py's, killed by the kernel:
    HostOOM). Named right: ``status.failure.class`` is the expected class, with advice (a
    collective timeout: advice that names node 1, the node it waited for).
Every Pod must have run on the real node (``spec.nodeName``), else the round fails. It
prints each round's results, then per case the detected and named-right counts out of
``--runs`` (target: at least 19 of 20), with the machine's load average beside them.

    flock /tmp/torchyard-bench.lock flock /tmp/torchyard-node-tests.lock \\
        .venv/bin/python benchmarks/why.py [--runs 20] [--only skipper,xid]

Needs root and the real node's set-up (``make node`` once, cached); one real node per
machine: take both locks.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "operator"),
]

from benchmarks import record  # noqa: E402
from tests.builders import TrainingRunBuilder, environment  # noqa: E402
from tests.cluster.binaries import KUBERNETES_VERSION  # noqa: E402
from tests.cluster.realnode import NodeError, RealNode  # noqa: E402
from tests.cluster.session import operator_on_real_node  # noqa: E402
from tests.integration.helpers import wait_status  # noqa: E402
from tests.node import test_failure_classes as classes  # noqa: E402
from tests.node import test_failures as failures  # noqa: E402
from tests.node import test_stalls as stalls  # noqa: E402

from torchyard import k8s  # noqa: E402

NS = "why"
STALL_SECONDS = stalls.STALL_SECONDS
RESTRICTED = "pod-security.kubernetes.io/enforce"
RESOURCES = {"cpu": "250m", "memory": "2Gi", "shmSize": "64Mi"}
TORCHRUN = ["python", "-m", "torch.distributed.run", "--no_python", "python", "-c"]


@dataclass(frozen=True)
class Case:
    script: str
    klass: str
    nodes: int = 1
    procs: int = 1
    backoff: int = 0
    where: str | None = None  # a hang: what status.failure.message must name
    launch: str = "process"
    memory: str | None = None  # the node Pods' memory limit, when not RESOURCES'
    policy: tuple[tuple[str, int], ...] = ()  # spec.policy fields beyond backoffLimit


CASES: dict[str, Case] = {
    "sleeper": Case(stalls.script("time.sleep(3600)"), "Hang", procs=2, where="<string>:7"),
    "pauser": Case(
        stalls.script("while True: signal.pause()"), "Hang", procs=2, where="<string>:7"
    ),
    "skipper": Case(stalls.SKIPS, "Hang", procs=3, where="<string>:14"),
    "torchrunner": Case(stalls.SLEEPS, "Hang", procs=2, where="<string>:11", launch="node"),
    **{
        name: Case(
            script,
            klass,
            nodes=nodes,
            backoff=backoff,
            policy=tuple(classes.POLICIES.get(name, {}).items()),
        )
        for name, (script, nodes, backoff, klass, _) in classes.CASES.items()
    },
    # rank 1 of node 1 allocates until the kernel kills its container (exit 137)
    "oom": Case(failures.HOG, "HostOOM", nodes=2, memory=failures.MEMORY_LIMIT),
}


class BenchError(Exception):
    pass


def body(node: RealNode, name: str, case: Case) -> dict[str, Any]:
    command = ["python", "-c", case.script]
    if case.launch == "node":
        command = [*TORCHRUN, case.script]
    policy: dict[str, Any] = {"backoffLimit": case.backoff, **dict(case.policy)}
    if case.klass == "Hang":
        policy["stallTimeoutSeconds"] = STALL_SECONDS
    return (
        TrainingRunBuilder(name, NS)
        .environment("pytorch")
        .command(*command)
        .nodes(case.nodes)
        .procs(case.procs)
        .pool(node.pool)
        .with_("spec.distribution.launch", case.launch)
        .with_("spec.resources", {**RESOURCES, **({"memory": case.memory} if case.memory else {})})
        .with_("spec.runAsUser", 1000)
        .with_("spec.policy", policy)
        .obj()
    )


def judge(node: RealNode, name: str, case: Case) -> tuple[bool, bool, str]:
    """(detected, named right, what status said) of one finished run."""
    run = wait_status(
        k8s.TRAININGRUNS,
        NS,
        name,
        lambda s: s.get("phase") in ("Succeeded", "Failed"),
        timeout=STALL_SECONDS + 600,
    )
    pods = k8s.list_(k8s.PODS, NS, label_selector=f"torchyard.dev/run={name}")
    labels = k8s.get(k8s.NAMESPACES, None, NS)["metadata"].get("labels") or {}
    if labels.get(RESTRICTED) != "restricted":
        raise BenchError(f"namespace {NS} does not enforce Pod Security restricted: {labels}")
    for pod in pods:
        if pod["spec"].get("nodeName") not in (None, node.name):
            raise BenchError(f"{pod['metadata']['name']} ran on {pod['spec'].get('nodeName')}")
    failure = run["status"].get("failure") or {}
    said = f"{failure.get('class')} rank {failure.get('rank')}"
    detected = failure.get("class") == case.klass
    if case.klass == "Hang":
        started = run["status"].get("startTime")
        ended = run["status"].get("completionTime")
        if started and ended:
            took = time.mktime(time.strptime(ended, "%Y-%m-%dT%H:%M:%SZ")) - time.mktime(
                time.strptime(started, "%Y-%m-%dT%H:%M:%SZ")
            )
            detected = detected and took <= STALL_SECONDS + 60 + 60  # + start-up
        message = str(failure.get("message") or "")
        named = detected and failure.get("rank") == 1 and f"stuck at {case.where}" in message
        said += f" at {message.split('stuck at ', 1)[-1].split('.', 1)[0][:60]}"
    elif case.klass == "CollectiveTimeout":
        advice = str(failure.get("advice") or "")
        named = detected and failure.get("rank") == 0 and "while node 1 (Pod " in advice
        said += f" waited for {advice.split(' while ', 1)[-1].split(' still ran', 1)[0][:40]}"
    else:
        named = detected and bool(failure.get("advice"))
    return detected, named, said


def rounds(node: RealNode, runs: int, only: list[str]) -> dict[str, list[tuple[bool, bool]]]:
    results: dict[str, list[tuple[bool, bool]]] = {name: [] for name in only}
    for i in range(runs):
        names = {f"{name}-{i}": name for name in only}
        for run, name in names.items():
            k8s.create(body(node, run, CASES[name]))
        line = []
        for run, name in names.items():
            detected, named, said = judge(node, run, CASES[name])
            results[name].append((detected, named))
            line.append(f"{name}: {'ok' if named else 'MISSED'} ({said})")
        for run in names:
            k8s.delete(k8s.TRAININGRUNS, NS, run)
        print(f"round {i + 1}/{runs}: " + "; ".join(line), flush=True)
    return results


def record_results(rec: record.Record, results: dict[str, list[tuple[bool, bool]]]) -> None:
    for name, seen in results.items():
        for i, (detected, named) in enumerate(seen):
            rec.round(case=name, round=i + 1, detected=detected, named_right=named)
        n = len(seen)
        rec.figure(
            f"{name} ({CASES[name].klass}): detected",
            f"{sum(1 for d, _ in seen if d)}/{n}",
            target="all",
            met=all(d for d, _ in seen),
        )
        rec.figure(
            f"{name} ({CASES[name].klass}): rank (and line) named right",
            f"{sum(1 for _, r in seen if r)}/{n}",
            target="all",
            met=all(r for _, r in seen),
        )


def report(results: dict[str, list[tuple[bool, bool]]]) -> None:
    load = os.getloadavg()
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (other helpers share it)")
    print(f"{'case':12s} {'class':18s} {'detected':>9s} {'named right':>12s}")
    for name, seen in results.items():
        n = len(seen)
        detected = sum(1 for d, _ in seen if d)
        named = sum(1 for _, r in seen if r)
        print(f"{name:12s} {CASES[name].klass:18s} {detected:>5d}/{n:<3d} {named:>8d}/{n:<3d}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="rounds (each case once)")
    parser.add_argument("--only", default="", help="comma-separated cases (default: all)")
    record.add_argument(parser)
    args = parser.parse_args()
    rec = record.Record("why", args)
    rec.version("kubernetes", KUBERNETES_VERSION)
    only = [c for c in args.only.split(",") if c] or list(CASES)
    unknown = sorted(set(only) - set(CASES))
    if args.runs < 1 or unknown:
        parser.error(f"--runs must be >= 1; cases are {', '.join(CASES)} (not {unknown})")
    try:
        with operator_on_real_node(NS) as (cluster, node):
            # every run's Pods are admitted under Pod Security "restricted" (no ptrace)
            cluster.kubectl("label", "namespace", NS, f"{RESTRICTED}=restricted")
            k8s.create(environment("pytorch", NS, image=node.images["pytorch"].ref))
            wait_status(k8s.ENVIRONMENTS, NS, "pytorch", lambda s: s.get("phase") == "Ready")
            results = rounds(node, args.runs, only)
            report(results)
    except (BenchError, NodeError) as err:
        print(f"why: {err}", file=sys.stderr)
        return 1
    record_results(rec, results)
    rec.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
