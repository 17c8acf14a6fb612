"""Scale, the peers' columns (``benchmarks/scale.py --peers``): the same queue as TrainJobs
and PyTorchJobs.

On the control plane scale.py started (KWOK pool ``a100``: 4 nodes x 8 GPUs, tainted),
Kubeflow's controllers (tests/cluster/peers.py: Trainer v2 over JobSet, Training Operator
v1, each a process of the cluster) are started once scale.py's own operators are done, and
for each kind, on a namespace of its own after the other's Pods are gone:
  - apply: N one-node, one-GPU jobs created (16 at a time), and the time until every one
    has a status. Trainer v2.0.0 writes a TrainJob's status only at its end (its
    conditions are Suspended, Complete and Failed; ``jobsStatus`` is never set), so for a
    TrainJob this is its JobSet's status (``replicatedJobsStatus``, written by the JobSet
    controller); for a PyTorchJob its ``Created`` condition;
  - idle: the controllers' CPU (% of one core, the kind's controllers summed: Trainer and
    JobSet for TrainJobs) over a window where nothing changes, with the queue full (the
    peers have no queue: every job's Pod exists, 32 Running and the rest Pending for the
    scheduler), and their RSS (now and peak, summed);
  - refill: a job with a Running Pod deleted (a freed GPU), and the time until another
    job's Pod is Running (the scheduler binds a Pending Pod: the peers leave the queue to
    it). torchyard's figure beside it ends at the same point, the next run's Pod Running
    (scale.py's ``refill_pod_running``); its "freed slot -> its status Running", which
    ends one watch event and one status write later, is an extra row (no peer column:
    Trainer writes no TrainJob status until it ends).
The Job controller inside kube-controller-manager, which creates a TrainJob's Pods, is the
cluster's, shared by all, and not counted.

    .venv/bin/python benchmarks/scale.py --peers [--runs 1000] [--baseline none]
"""

from __future__ import annotations

import argparse
import re
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import record
from benchmarks.scale import POOL, SLOTS, TICK, World, show, wait, watch_forever
from kubernetes import client
from tests.cluster import peers
from tests.cluster.harness import Cluster

from torchyard import k8s
from torchyard.k8s import rest

TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
ONE_GPU = {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}


def trainjob(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {
                "numNodes": 1,
                "image": "img",
                "command": ["python", "train.py"],
                "resourcesPerNode": ONE_GPU,
            },
            "podSpecOverrides": [
                {
                    "targetJobs": [{"name": "node"}],
                    "nodeSelector": {"torchyard.dev/pool": POOL.name},
                    "tolerations": [TOLERATION],
                }
            ],
        },
    }


def pytorchjob(ns: str, name: str) -> dict[str, Any]:
    container = {
        "name": "pytorch",
        "image": "img",
        "command": ["python", "train.py"],
        "resources": ONE_GPU,
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": {
                        "spec": {
                            "nodeSelector": {"torchyard.dev/pool": POOL.name},
                            "tolerations": [TOLERATION],
                            "containers": [container],
                        }
                    },
                }
            }
        },
    }


def jobset_has_status(obj: dict[str, Any]) -> bool:
    return bool((obj.get("status") or {}).get("replicatedJobsStatus"))


def pytorchjob_has_status(obj: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Created" for c in (obj.get("status") or {}).get("conditions") or []
    )


@dataclass(frozen=True)
class Kind:
    """One peer's kind: how a job is made, which controllers serve it, which objects say
    it has a status, and the label its Pods carry with the job's name."""

    name: str
    resource: k8s.Resource
    body: Callable[[str, str], dict[str, Any]]
    controllers: tuple[str, ...]  # peers.Peer.binary of each
    status_of: tuple[str, str, str]  # (group, version, plural) whose status is watched
    has_status: Callable[[dict[str, Any]], bool]
    pod_label: str


KINDS = (
    Kind(
        "trainjob",
        k8s.Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
        trainjob,
        (peers.TRAINER.binary, peers.JOBSET.binary),
        ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
        jobset_has_status,
        "jobset.sigs.k8s.io/jobset-name",
    ),
    Kind(
        "pytorchjob",
        k8s.Resource("kubeflow.org", "v1", "pytorchjobs"),
        pytorchjob,
        (peers.TRAINING_OPERATOR.binary,),
        ("kubeflow.org", "v1", "pytorchjobs"),
        pytorchjob_has_status,
        "training.kubeflow.org/job-name",
    ),
)


@dataclass
class Seen:
    """What the watches saw: jobs with a status, and when each job's Pod was first Running."""

    kind: Kind
    world: World = field(default_factory=World)  # only its stop event and lock are used
    with_status: set[str] = field(default_factory=set)
    pod_running_at: dict[str, float] = field(default_factory=dict)
    running_now: set[str] = field(default_factory=set)

    def object_event(self, event: str, obj: dict[str, Any]) -> None:
        if event != "DELETED" and self.kind.has_status(obj):
            with self.world.lock:
                self.with_status.add(obj["metadata"]["name"])

    def pod_event(self, event: str, obj: dict[str, Any]) -> None:
        job = (obj["metadata"].get("labels") or {}).get(self.kind.pod_label)
        if not job:
            return
        running = event != "DELETED" and (obj.get("status") or {}).get("phase") == "Running"
        with self.world.lock:
            if running:
                self.pod_running_at.setdefault(job, time.monotonic())
                self.running_now.add(job)
            else:
                self.running_now.discard(job)

    def start(self, ns: str) -> Seen:
        api = k8s.load()
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        group, version, plural = self.kind.status_of
        objects = (custom.list_namespaced_custom_object, self.object_event, group, version)
        threading.Thread(
            target=watch_forever, args=(self.world, *objects, ns, plural), daemon=True
        ).start()
        threading.Thread(
            target=watch_forever,
            args=(self.world, core.list_namespaced_pod, self.pod_event, ns),
            kwargs={"label_selector": self.kind.pod_label},
            daemon=True,
        ).start()
        return self


class Controllers:
    """The kind's controller processes (the cluster's children): CPU seconds and RSS."""

    def __init__(self, cluster: Cluster, binaries: tuple[str, ...]) -> None:
        self.pids = [cluster.processes[b].pid for b in binaries]

    def cpu_seconds(self) -> float:
        total = 0.0
        for pid in self.pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
        return total

    def memory_mib(self) -> tuple[float, float]:
        """RSS now and its peak (VmHWM), in MiB, summed over the processes."""
        rss = peak = 0.0
        for pid in self.pids:
            status = Path(f"/proc/{pid}/status").read_text()
            now = re.search(r"^VmRSS:\s+(\d+)", status, re.M)
            high = re.search(r"^VmHWM:\s+(\d+)", status, re.M)
            rss += int(now.group(1)) / 1024 if now else 0.0
            peak += int(high.group(1)) / 1024 if high else 0.0
        return rss, peak


def measure_kind(cluster: Cluster, kind: Kind, args: argparse.Namespace) -> dict[str, float | None]:
    ns = cluster.create_namespace(f"scale-{kind.name}")
    seen = Seen(kind).start(ns)
    procs = Controllers(cluster, kind.controllers)
    figures: dict[str, float | None] = {}
    n, running_wanted = args.runs, min(args.runs, SLOTS)
    try:
        time.sleep(0.5)  # the watches are open before the first create
        print(f"[{kind.name}] creating {n} jobs", flush=True)
        cpu_at_start = procs.cpu_seconds()
        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(
                pool.map(
                    lambda i: rest.call(
                        "POST", kind.resource.path(ns), body=kind.body(ns, f"j{i:05d}")
                    ),
                    range(n),
                )
            )
        figures["apply"] = time.monotonic() - started
        phased = wait("every job has a status", lambda: len(seen.with_status) >= n, args.timeout)
        figures["phased"] = None if phased is None else time.monotonic() - started
        wait(
            f"{running_wanted} Running",
            lambda: len(seen.running_now) >= running_wanted,
            args.timeout,
        )
        figures["apply_cpu"] = procs.cpu_seconds() - cpu_at_start
        print(f"[{kind.name}] all have a status; idle for {args.idle:.0f}s", flush=True)
        time.sleep(2)
        cpu0, t0 = procs.cpu_seconds(), time.monotonic()
        time.sleep(args.idle)
        figures["idle_cpu"] = 100 * (procs.cpu_seconds() - cpu0) / (time.monotonic() - t0)
        figures["rss"], figures["rss_peak"] = procs.memory_mib()
        refills = []
        for i in range(args.refills if n > SLOTS else 0):
            with seen.world.lock:
                victim = min(seen.running_now)
                before = set(seen.pod_running_at)
            freed = time.monotonic()
            k8s.delete(kind.resource, ns, victim)

            def fresh(before: set[str] = before) -> str | None:
                with seen.world.lock:
                    new = [j for j in seen.pod_running_at if j not in before]
                return new[0] if new else None

            took = wait(
                "another job's Pod Running", lambda: fresh() is not None, args.refill_timeout
            )
            nxt = fresh()
            refills.append(
                float("inf") if took is None or nxt is None else seen.pod_running_at[nxt] - freed
            )
            print(f"[{kind.name}] refill {i + 1}: {nxt} Running {refills[-1]:.2f}s", flush=True)
        figures["refill_running"] = statistics.median(refills) if refills else None
    finally:
        seen.world.stop.set()
        cluster.delete_namespace(ns)
        wait(
            f"Pods of {ns} gone",
            lambda: not k8s.list_(k8s.PODS, ns, label_selector=kind.pod_label),
            600,
        )
    return figures


def measure(cluster: Cluster, args: argparse.Namespace) -> dict[str, dict[str, float | None]]:
    """Every kind's figures, the peers started on ``cluster`` for them and stopped after."""
    running = peers.Peers(cluster).start()
    print(f"[peers] {peers.versions()}: up in {running.timings['start']:.1f}s", flush=True)
    try:
        return {kind.name: measure_kind(cluster, kind, args) for kind in KINDS}
    finally:
        running.stop()


ROWS = [
    ("phased", "every job has a status", "s"),
    ("apply_cpu", "controllers' CPU until then", "s"),
    ("refill_running", "freed slot -> next Pod Running", "s"),
    ("refill_status", "freed slot -> next run's status Running", "s"),
    ("idle_cpu", "idle CPU, queue full (% of a core)", "%"),
    ("rss", "RSS (MiB)", ""),
    ("rss_peak", "RSS peak (MiB)", ""),
]


def report(
    n: int,
    mine: dict[str, float | None],
    theirs: dict[str, dict[str, float | None]],
    rec: record.Record | None = None,
) -> None:
    """The peers' columns beside torchyard's (this tree), with each ratio peer / torchyard
    (above 1: torchyard is the smaller or faster)."""
    names = [k.name for k in KINDS if k.name in theirs]
    print(f"\nscale beside the peers: {n} one-GPU jobs, pool {POOL.name} ({SLOTS} GPUs)")
    print(f"peers: {peers.versions()}")
    if rec is not None:
        rec.note(f"peers: {peers.versions()}")
    head = f"{'figure':38s} {'torchyard':>10s}"
    for name in names:
        head += f" {name:>11s} {'ratio':>6s}"
    print(head)
    mine = dict(mine)
    # The same end point for all: the next job's (run's) Pod Running; torchyard's status
    # Running is its own row, as measured by scale.py.
    mine["refill_running"], mine["refill_status"] = (
        mine.get("refill_pod_running"),
        mine.get("refill_running"),
    )
    for key, title, unit in ROWS:
        a = mine.get(key)
        line = f"{title:38s} {show(a, unit):>10s}"
        for name in names:
            b = theirs[name].get(key)
            ratio = "n/a"
            if a is not None and b is not None and a not in (0, float("inf")):
                ratio = "inf" if b == float("inf") else f"{b / a:.2f}"
            line += f" {show(b, unit):>11s} {ratio:>6s}"
            if rec is not None and b is not None:
                rec.figure(
                    f"{n} jobs: {title} ({name})",
                    b,
                    unit,
                    baseline=("torchyard", a if a is not None else "n/a"),
                    ratio=b / a if a not in (None, 0, float("inf")) else None,
                )
        print(line)
    print(
        "  (refill: the next job's Pod Running for all; torchyard's run status Running "
        "beside it, the peers have none. TrainJob: Trainer + JobSet summed; its status: "
        "the JobSet's)"
    )
