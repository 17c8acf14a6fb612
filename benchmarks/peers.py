"""Side by side with Kubeflow: fan-out, API writes, gang restart and gang admission.

On one control plane (tests/cluster/harness.py) with KWOK GPU pools (``gpu``: as many
nodes as the largest size, ``adm``: 4 nodes; 8 ``nvidia.com/gpu`` each, tainted), the
torchyard operator (a process of its own, ``python -m torchyard.controller``, as
benchmarks/scale.py starts it; so are the peers) and Kubeflow's operators
(tests/cluster/peers.py: Trainer v2 over JobSet, Training Operator v1) all run at once,
and every figure is measured in the same run, in ``--rounds`` interleaved rounds (the
order of the contenders turns each round, so drift hits all alike), each run one node Pod
per node (8 GPUs per Pod):

  - fan-out: from create to N Pods Running, N in ``--sizes``: a torchyard TrainingRun, a
    TrainJob (runtime ``torch-distributed``'s template), a PyTorchJob (1 Master + N-1
    Workers) and ``direct``: the same N Pods (torchyard's builder, no gate) created by a
    client with 16 concurrent requests (the floor); each starts once the one before it
    is deleted and its Pods are gone (an idle pool);
  - API writes per Pod: the apiserver's own ``apiserver_request_total`` (POST, PUT,
    PATCH, APPLY; deletes, node leases and node status left out: the previous contender's
    cleanup and KWOK's heartbeats run all along)
    read from its /metrics before the create and after the N-th Pod is Running (plus 2s
    for the last status writes), so every client's writes count, controllers' and
    scheduler's included; the biggest items are printed by resource;
  - gang restart (N = ``--restart-size``): one Pod of a Running run fails (KWOK ends it
    with exit code 1; 137 for the PyTorchJob, whose ExitCode policy restarts only on
    retryable codes), until N Pods are Running again without it: torchyard's gang
    restart (policy.backoffLimit), JobSet's failurePolicy restart (the TrainJob's runtime
    ``torchyard-bench``: torch-distributed with failurePolicy.maxRestarts and Job
    backoffLimit 0), Training Operator's Pod restart; how many of the N Pods were replaced
    is printed beside it; and ``torchyard in place``: the launchers' own restart of a
    rank's failure (node 0's coordinator and N launcher peers over TCP on this machine,
    threads standing in for the launchers, since nothing runs inside KWOK's Pods): from the
    failure to every launcher told to start its ranks again, 0 Pods created; starting the
    ranks is in neither figure (KWOK's containers start nothing);
  - admission: ``--admission-runs`` runs of 4 nodes x 8 GPUs created at once on the
    4-node pool; each run's Pods are ended (exit code 0) as soon as all 4 are Running; the
    time until every run has finished, and, from a watch on the Pods, the most runs that
    held a partial gang at once (some but not all Pods bound, none ended: 1 is the most a
    gang scheduler allows).

With ``--breakdown`` (on in ``--smoke``) watches on the namespace (benchmarks/timeline.py)
say where each fan-out's time goes: from the create to the run's object seen, its first
child (JobSet, Service, Pod...), its Service, its first status, its first and last Pod
created and its last Pod Running, so the steps before the first Pod are measured apart;
and, per Pod, created -> ungated (its scheduling gates removed) -> scheduled (bound to a
node) -> Running, as the median and 95th percentile over all Pods (the watch's receipt
times: the apiserver's timestamps have a resolution of one second);
and where each gang restart's time goes (benchmarks/restart_steps.py, a watch on the run's
Pods by uid): from the failure to the victim seen Failed, the first old Pod being
deleted, the last old Pod gone, the first and last new Pod created and all Running, and
how many Pods were created (more than replaced: a Pod was made twice).

Every figure is a median over the rounds with its spread (lowest-highest); ratios are
against ``direct`` (fan-out) or torchyard. Peers that do not gang-schedule may deadlock in
the admission part (4 nodes held by Pods of several runs, none complete: nothing ends by
itself): a contender is given up when no run has started for ``--admission-stall``
seconds, and the report says after how many runs it stuck.

    .venv/bin/python benchmarks/peers.py [--sizes 8,64,256] [--rounds 3] [--restart-size 64]
        [--admission-runs 20] [--no-peers] [--parts fanout,restart,admission] [--breakdown]
        [--operator-src DIR]   # the operator from another source tree (an A/B)
        [--profile DIR]        # the torchyard operator under benchmarks/sampler.py
    .venv/bin/python benchmarks/peers.py --smoke   # N = 8, no peers (tests run this)
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import signal
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from benchmarks import record, restart_steps, timeline  # noqa: E402
from benchmarks.scale import Operator  # noqa: E402
from kubernetes import client, watch  # noqa: E402
from tests.cluster import peers  # noqa: E402
from tests.cluster.binaries import KUBERNETES_VERSION  # noqa: E402
from tests.cluster.harness import GPU_TAINT, Cluster, Pool  # noqa: E402

from torchyard import api, k8s  # noqa: E402
from torchyard.k8s import rest  # noqa: E402  (any resource: the peers' kinds too)
from torchyard.launch import coordination  # noqa: E402
from torchyard.planning import pods as pod_builder  # noqa: E402

NS = "peers"
GANG = 4  # admission: nodes per run = nodes in the pool
ADM = Pool("adm", nodes=GANG, gpus=8, cpu="96", memory="1Ti", taints=(GPU_TAINT,))
RUNTIME = "torchyard-bench"
WRITES = ("POST", "PUT", "PATCH", "APPLY", "DELETE")  # the apiserver counts SSA as APPLY
BACKGROUND = {"leases", "nodes"}  # KWOK's heartbeats: written whatever runs
TARGET_N, TARGET_RATIO, TARGET_RESTART_N = 256, 1.3, 64
IN_PLACE_TARGET = 1 / 3  # an in-place restart against torchyard's own recreate path
EXIT = "kwok.torchyard.dev/exit-code"
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
TRAINJOBS = k8s.Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs")
PYTORCHJOBS = k8s.Resource("kubeflow.org", "v1", "pytorchjobs")
RUNTIMES = k8s.Resource("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", False)
JOBSETS = k8s.Resource("jobset.x-k8s.io", "v1alpha2", "jobsets")


# -- the contenders ----------------------------------------------------------------------


def trainingrun(name: str, n: int, pool: str, restarts: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "environment": "pytorch",
            "command": ["python", "train.py"],
            "distribution": {"nodeCount": n},
            "resources": {"gpusPerNode": 8, "cpu": "1"},
            "compute": {"pool": pool},
            "policy": {"backoffLimit": restarts},
        },
    }


def trainjob(name: str, n: int, pool: str, restarts: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "runtimeRef": {"name": RUNTIME},
            "trainer": {
                "numNodes": n,
                "image": "img",
                "command": ["python", "train.py"],
                "resourcesPerNode": {
                    "requests": {"cpu": "1", "nvidia.com/gpu": "8"},
                    "limits": {"nvidia.com/gpu": "8"},
                },
            },
            "podSpecOverrides": [
                {
                    "targetJobs": [{"name": "node"}],
                    "nodeSelector": {"torchyard.dev/pool": pool},
                    "tolerations": [TOLERATION],
                }
            ],
        },
    }


def pytorchjob(name: str, n: int, pool: str, restarts: int = 0) -> dict[str, Any]:
    def replica(count: int) -> dict[str, Any]:
        return {
            "replicas": count,
            "restartPolicy": "ExitCode",
            "template": {
                "spec": {
                    "nodeSelector": {"torchyard.dev/pool": pool},
                    "tolerations": [TOLERATION],
                    "containers": [
                        {
                            "name": "pytorch",
                            "image": "img",
                            "command": ["python", "train.py"],
                            "resources": {
                                "requests": {"cpu": "1", "nvidia.com/gpu": "8"},
                                "limits": {"nvidia.com/gpu": "8"},
                            },
                        }
                    ],
                }
            },
        }

    specs = {"Master": replica(1)}
    if n > 1:
        specs["Worker"] = replica(n - 1)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"runPolicy": {"backoffLimit": 1000}, "pytorchReplicaSpecs": specs},
    }


def runtime(template: dict[str, Any]) -> dict[str, Any]:
    """torch-distributed's runtime with JobSet's restart of the whole gang: any failed
    Pod fails its Job (backoffLimit 0), and a failed Job restarts the JobSet."""
    doc: dict[str, Any] = {
        "apiVersion": template["apiVersion"],
        "kind": template["kind"],
        "metadata": {"name": RUNTIME},
        "spec": template["spec"],
    }
    jobset = doc["spec"]["template"]["spec"]
    jobset["failurePolicy"] = {"maxRestarts": 1000}
    for rjob in jobset["replicatedJobs"]:
        rjob["template"].setdefault("spec", {})["backoffLimit"] = 0
    return doc


@dataclass(frozen=True)
class Contender:
    name: str
    label: str  # the Pods' label whose value is the run's name
    resource: k8s.Resource | None  # None: Pods made by the benchmark itself
    body: Callable[[str, int, str, int], dict[str, Any]] | None
    exit_code: str = "1"  # what a failing Pod exits with in the gang-restart part

    def create(self, name: str, n: int, pool: str, restarts: int = 0) -> None:
        if self.body is None:
            direct_create(name, n, pool)
            return
        manifest = self.body(name, n, pool, restarts)
        assert self.resource is not None
        rest.call("POST", self.resource.path(NS), body=manifest)

    def delete(self, name: str) -> None:
        if self.resource is None:
            with ThreadPoolExecutor(16) as ex:
                list(
                    ex.map(
                        lambda p: k8s.delete(k8s.PODS, NS, p, grace_period_seconds=0),
                        [p["metadata"]["name"] for p in self.pods(name)],
                    )
                )
        else:
            k8s.delete(self.resource, NS, name)
        wait(f"{self.name} {name}'s Pods gone", lambda: not self.pods(name), timeout=600)

    def pods(self, name: str) -> list[dict[str, Any]]:
        return k8s.list_(k8s.PODS, NS, label_selector=f"{self.label}={name}")


# Direct Pods carry a label of their own instead of torchyard's run label, so that the
# operator running beside them treats them as it treats the peers' Pods (GPU holders for
# its admission cache), not as a run's Pods to reconcile.
DIRECT_LABEL = "bench.torchyard.dev/direct"


def direct_create(name: str, n: int, pool: str) -> None:
    run = api.parse_trainingrun(trainingrun(name, n, pool))
    manifests = []
    for p in pod_builder.pods(run, image="img"):
        p = pod_builder.ungate(p)
        p["metadata"].pop("ownerReferences", None)
        labels = p["metadata"]["labels"]
        labels[DIRECT_LABEL] = labels.pop("torchyard.dev/run")
        manifests.append(p)
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(k8s.create, manifests))


DIRECT = Contender("direct", DIRECT_LABEL, None, None)
TORCHYARD = Contender("torchyard", "torchyard.dev/run", k8s.TRAININGRUNS, trainingrun)
TRAINJOB = Contender("trainjob", "jobset.sigs.k8s.io/jobset-name", TRAINJOBS, trainjob)
PYTORCHJOB = Contender(
    "pytorchjob", "training.kubeflow.org/job-name", PYTORCHJOBS, pytorchjob, exit_code="137"
)


# -- measuring ---------------------------------------------------------------------------


def wait(what: str, check: Callable[[], Any], timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def running(c: Contender, name: str, n: int) -> list[dict[str, Any]] | None:
    items = [p for p in c.pods(name) if not p["metadata"].get("deletionTimestamp")]
    ok = len(items) == n and all(p.get("status", {}).get("phase") == "Running" for p in items)
    return items if ok else None


_METRIC = re.compile(r"^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$", re.M)


def writes(cluster: Cluster) -> Counter[str]:
    """The apiserver's write requests so far, by resource[/subresource] and verb."""
    code, text = cluster.request("GET", "/metrics")
    assert code == 200, text
    counts: Counter[str] = Counter()
    for labels, value in _METRIC.findall(text):
        tags = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if tags.get("verb") not in WRITES or tags.get("resource") in BACKGROUND:
            continue
        if tags.get("dry_run"):
            continue
        sub = f"/{tags['subresource']}" if tags.get("subresource") else ""
        counts[f"{tags.get('resource')}{sub} {tags['verb']}"] += int(float(value))
    return counts


@dataclass
class Results:
    fanout: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    writes: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    writes_by: dict[tuple[str, int], Counter[str]] = field(default_factory=dict)
    restart: dict[str, list[float]] = field(default_factory=dict)
    replaced: dict[str, list[int]] = field(default_factory=dict)
    restart_writes: dict[str, Counter[str]] = field(default_factory=dict)
    # contender -> per round, seconds from the failure to each step (restart_steps.STEPS)
    restart_steps: dict[str, list[dict[str, float | None]]] = field(default_factory=dict)
    finished: dict[str, list[int]] = field(default_factory=dict)
    drain: dict[str, list[float | None]] = field(default_factory=dict)
    partial: dict[str, list[int]] = field(default_factory=dict)
    # (contender, N) -> per round, seconds from create to each step (timeline.STEPS)
    breakdown: dict[tuple[str, int], list[dict[str, float | None]]] = field(default_factory=dict)
    # (contender, N) -> each Pod's seconds per step (timeline.POD_STAGES), every round's
    pod_stages: dict[tuple[str, int], dict[str, list[float]]] = field(default_factory=dict)


def fanout(
    cluster: Cluster,
    c: Contender,
    n: int,
    r: int,
    res: Results,
    seen: timeline.Timeline | None = None,
) -> float:
    name = f"{c.name}-{n}-{r}"
    before = writes(cluster)
    started = time.monotonic()
    c.create(name, n, "gpu")
    wait(f"{n} {c.name} Pods Running", lambda: running(c, name, n))
    elapsed = time.monotonic() - started
    time.sleep(2)  # the last status writes of the run (and the watches' last events)
    if seen is not None:
        if not seen.caught_up(name, n, started):
            print(f"  (the watches did not see {name}'s {n} Pods Running within 30s)")
        kind = c.resource.plural if c.resource is not None else None
        res.breakdown.setdefault((c.name, n), []).append(seen.milestones(name, kind, n, started))
        pooled = res.pod_stages.setdefault((c.name, n), {})
        for key, values in seen.pod_stages(name, started).items():
            pooled.setdefault(key, []).extend(values)
    # Deletes left out: the previous contender's cleanup (its Services, Endpoints, Pods
    # finalized by KWOK) may still be running.
    delta = Counter({k: v for k, v in (writes(cluster) - before).items() if "DELETE" not in k})
    res.fanout.setdefault((c.name, n), []).append(elapsed)
    res.writes.setdefault((c.name, n), []).append(sum(delta.values()) / n)
    res.writes_by[(c.name, n)] = delta
    c.delete(name)
    # The next contender starts on an idle pool: while these Pods are still being deleted
    # their nodes are taken, and a gang scheduler (torchyard) waits for room that a Pod
    # scheduler gets node by node as it frees; neither is what is measured.
    wait(f"{name}'s Pods gone", lambda: not c.pods(name))
    return elapsed


def gang_restart(
    cluster: Cluster, c: Contender, n: int, r: int, res: Results, breakdown: bool = False
) -> float:
    name = f"{c.name}-restart-{n}-{r}"
    c.create(name, n, "gpu", restarts=10)
    items = wait(f"{n} {c.name} Pods Running", lambda: running(c, name, n))
    old = {p["metadata"]["uid"] for p in items}
    # the last Pod by name: a worker (never the PyTorchJob's Master, which ends its job)
    victim = sorted(items, key=lambda p: p["metadata"]["name"])[-1]
    log = restart_steps.PodLog(c.label, name)
    stop_watch = _watch_pods(log) if breakdown else None
    before = writes(cluster)
    started = time.monotonic()
    rest.call(
        "PATCH",
        k8s.PODS.path(NS, victim["metadata"]["name"]),
        body={"metadata": {"annotations": {EXIT: c.exit_code}}},
        content_type="application/merge-patch+json",
    )

    def recovered() -> list[dict[str, Any]] | None:
        now = running(c, name, n)
        if now and victim["metadata"]["uid"] not in {p["metadata"]["uid"] for p in now}:
            return now
        return None

    now = wait(f"{c.name} gang restarted", recovered)
    elapsed = time.monotonic() - started
    time.sleep(2)  # the last status writes of the restart
    res.restart_writes[c.name] = writes(cluster) - before
    if stop_watch is not None:
        stop_watch.set()
        steps = restart_steps.steps(log.snapshot(), old, victim["metadata"]["uid"], n, started)
        res.restart_steps.setdefault(c.name, []).append(steps)
    res.restart.setdefault(c.name, []).append(elapsed)
    res.replaced.setdefault(c.name, []).append(sum(p["metadata"]["uid"] not in old for p in now))
    c.delete(name)
    return elapsed


IN_PLACE = "torchyard in place"


def in_place_restart(n: int, res: Results) -> float:
    """torchyard's in-place restart of N nodes: node 0's coordinator and N launchers'
    peers (``torchyard.launch.coordination``, real TCP on this machine, threads for the
    launchers: on KWOK nothing runs inside the Pods), from the failure the last node's
    launcher reports to every launcher told to start its ranks again (settle, decision,
    N stopped, barrier). Starting the ranks again is not counted, nor is it in the recreate
    paths measured beside it (their Pods' containers start nothing on KWOK); no Pod is
    created or deleted."""
    coordinator = coordination.Coordinator(0, n, coordination.Budget(10, 0), 1, lambda _: None)
    peers = [coordination.Peer(f"127.0.0.1:{coordinator.port}", node, 30) for node in range(n)]
    assert all(peer.connected(30) for peer in peers), "a launcher did not reach the coordinator"
    time.sleep(0.5)  # every hello handled: the coordinator knows all N
    failure = {"rank": n - 1, "nodeRank": n - 1, "exitCode": 1, "reason": "Error", "step": 7}
    started = time.monotonic()

    def launcher(peer: coordination.Peer) -> None:
        if peer.node == n - 1:
            peer.send(failed=failure)
        restart = peer.wait("restart")
        assert restart is not None and "restart" in restart, restart
        peer.send(ready=True)
        go = peer.wait("go")
        assert go is not None and go.get("go") == 1, go

    with ThreadPoolExecutor(max_workers=n) as pool:
        list(pool.map(launcher, peers))
    elapsed = time.monotonic() - started
    for peer in peers:
        peer.close()
    coordinator.close()
    res.restart.setdefault(IN_PLACE, []).append(elapsed)
    res.replaced.setdefault(IN_PLACE, []).append(0)
    return elapsed


class PodWatch:
    """A watch on the namespace's Pods: each run's Pods (bound node, phase), the most runs
    seen at once with a partial gang, and which Pods ever Succeeded."""

    def __init__(self, c: Contender, runs: set[str]) -> None:
        self.c, self.runs = c, runs
        self.lock = threading.Lock()
        self.pods: dict[str, tuple[str, bool, str]] = {}  # pod -> (run, bound, phase)
        self.succeeded: dict[str, set[str]] = {r: set() for r in runs}
        self.max_partial = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PodWatch:
        self.thread.start()
        return self

    def _run(self) -> None:
        core = client.CoreV1Api(k8s.load())
        rv = None
        while not self.stop.is_set():
            try:
                w = watch.Watch()
                kwargs: dict[str, Any] = {"label_selector": self.c.label, "timeout_seconds": 5}
                if rv:
                    kwargs["resource_version"] = rv
                for event in w.stream(core.list_namespaced_pod, NS, **kwargs):
                    obj = event["raw_object"]
                    rv = obj["metadata"]["resourceVersion"]
                    self._event(event["type"], obj)
                    if self.stop.is_set():
                        w.stop()
            except Exception:  # an expired watch: start again from now
                rv = None
                time.sleep(0.2)

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        run = (meta.get("labels") or {}).get(self.c.label)
        if run not in self.runs:
            return
        with self.lock:
            if kind == "DELETED":
                self.pods.pop(meta["name"], None)
            else:
                phase = (obj.get("status") or {}).get("phase") or ""
                bound = bool((obj.get("spec") or {}).get("nodeName"))
                self.pods[meta["name"]] = (run, bound, phase)
                if phase == "Succeeded":
                    self.succeeded[run].add(meta["name"])
            by_run: dict[str, list[tuple[bool, str]]] = {}
            for r, bound, phase in self.pods.values():
                by_run.setdefault(r, []).append((bound, phase))
            partial = 0
            for states in by_run.values():
                ended = any(p in ("Succeeded", "Failed") for _, p in states)
                bound_count = sum(b for b, _ in states)
                if not ended and 0 < bound_count < GANG:
                    partial += 1
            self.max_partial = max(self.max_partial, partial)

    def snapshot(self) -> dict[str, list[tuple[str, bool, str]]]:
        with self.lock:
            out: dict[str, list[tuple[str, bool, str]]] = {}
            for pod, (run, bound, phase) in self.pods.items():
                out.setdefault(run, []).append((pod, bound, phase))
            return out

    def finished(self) -> int:
        with self.lock:
            return sum(len(s) >= GANG for s in self.succeeded.values())


def admission(
    c: Contender, runs: int, r: int, timeout: float, stall: float, res: Results
) -> float | None:
    """The time until all ``runs`` finished; None when it did not drain: past ``timeout``,
    or when no run could start for ``stall`` seconds (the Pods never end by themselves, so
    a pool held by partial gangs is a deadlock)."""
    names = {f"{c.name}-adm-{r}-{i}" for i in range(runs)}
    seen = PodWatch(c, names).start()
    time.sleep(0.5)  # the watch is open before the first create
    started = time.monotonic()
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda name: c.create(name, GANG, ADM.name), sorted(names)))
    ended: set[str] = set()
    drained: float | None = None
    deadline = started + timeout
    progress = started
    while time.monotonic() < deadline and time.monotonic() - progress < stall:
        for run, states in seen.snapshot().items():
            live = [s for s in states if s[2] == "Running"]
            if run not in ended and len(live) == GANG:
                ended.add(run)
                progress = time.monotonic()
                for pod, _, _ in live:
                    rest.call(
                        "PATCH",
                        k8s.PODS.path(NS, pod),
                        body={"metadata": {"annotations": {EXIT: "0"}}},
                        content_type="application/merge-patch+json",
                    )
        if seen.finished() == runs:
            drained = time.monotonic() - started
            break
        time.sleep(0.05)
    seen.stop.set()
    res.drain.setdefault(c.name, []).append(drained)
    res.finished.setdefault(c.name, []).append(seen.finished())
    res.partial.setdefault(c.name, []).append(seen.max_partial)
    for name in names:
        c.delete(name)
    return drained


def _watcher(list_fn: Callable[..., Any], *args: Any) -> timeline.Watcher:
    """A watch of ``list_fn(*args)`` (a kubernetes client list call) that resumes from the
    last resourceVersion it saw, for :class:`timeline.Timeline`."""
    version: list[str | None] = [None]

    def stream(event: Callable[[str, dict[str, Any]], None], stopping: threading.Event) -> None:
        w = watch.Watch()
        kwargs: dict[str, Any] = {"timeout_seconds": 60}
        if version[0]:
            kwargs["resource_version"] = version[0]
        try:
            for item in w.stream(list_fn, *args, **kwargs):
                obj = item["raw_object"]
                version[0] = (obj.get("metadata") or {}).get("resourceVersion") or version[0]
                event(item["type"], obj)
                if stopping.is_set():
                    w.stop()
        except Exception:
            version[0] = None  # expired (410): from now
            raise

    return stream


def _watch_pods(log: restart_steps.PodLog) -> threading.Event:
    """A watch on the namespace's Pods into ``log`` (from now) until the event is set."""
    stopping = threading.Event()
    stream = _watcher(client.CoreV1Api(k8s.load()).list_namespaced_pod, NS)
    opened = threading.Event()

    def note(type_: str, obj: dict[str, Any]) -> None:
        opened.set()
        log.note(type_, obj)

    def run() -> None:
        while not stopping.is_set():
            try:
                stream(note, stopping)
            except Exception:  # an expired or broken watch: open it again
                time.sleep(0.2)

    threading.Thread(target=run, daemon=True, name="restart-pods").start()
    opened.wait(30)  # the list's ADDED events: the run's Pods as they are before the failure
    return stopping


def start_timeline(with_peers: bool) -> timeline.Timeline:
    """Watches on the namespace's Pods, Services, ConfigMaps, Jobs and every contender's
    kind (``--breakdown``)."""
    api_client = k8s.load()
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    kinds = [k8s.TRAININGRUNS] + ([TRAINJOBS, JOBSETS, PYTORCHJOBS] if with_peers else [])
    watchers: dict[str, timeline.Watcher] = {
        "pods": _watcher(core.list_namespaced_pod, NS),
        "services": _watcher(core.list_namespaced_service, NS),
        "configmaps": _watcher(core.list_namespaced_config_map, NS),
        "jobs": _watcher(batch.list_namespaced_job, NS),
    }
    for kind in kinds:
        watchers[kind.plural] = _watcher(
            custom.list_namespaced_custom_object, kind.group, kind.version, NS, kind.plural
        )
    labels = sorted({c.label for c in (DIRECT, TORCHYARD, TRAINJOB, PYTORCHJOB)})
    return timeline.Timeline(watchers, labels).start()


# -- reporting ---------------------------------------------------------------------------


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return fmt.format(min(values)) + "-" + fmt.format(max(values))


def machine() -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores, {mem:.0f} GiB, {platform.machine()}, load average {load}"


def report(args: argparse.Namespace, order: list[Contender], res: Results, parts: set[str]) -> None:
    if "fanout" in parts:
        report_fanout(args, order, res)
        if res.breakdown:
            timeline.report(res.breakdown, [c.name for c in order], args.sizes)
            timeline.report_pods(res.pod_stages, [c.name for c in order], args.sizes)
    if "restart" in parts:
        report_restart(args, res)
    if "admission" in parts:
        report_admission(args, res)


def report_fanout(args: argparse.Namespace, order: list[Contender], res: Results) -> None:
    names = [c.name for c in order]
    print(f"\nfan-out: median of {args.rounds} interleaved rounds (spread: lowest-highest)")
    print("   N  contender    create -> N Running    ratio to direct      writes/Pod")
    for n in args.sizes:
        direct = res.fanout[("direct", n)]
        for name in names:
            t = res.fanout[(name, n)]
            ratios = [x / d for x, d in zip(t, direct, strict=True)]
            w = res.writes[(name, n)]
            print(
                f"{n:4d}  {name:11s}  {statistics.median(t):6.2f}s ({spread(t)})  "
                f"{statistics.median(ratios):5.2f} ({spread(ratios)})  "
                f"{statistics.median(w):6.1f}"
            )
    top = max(args.sizes)
    print(f"\nAPI writes at N = {top} (last round), biggest items:")
    for name in names:
        items = res.writes_by[(name, top)].most_common(8)
        print(f"  {name:11s} " + ", ".join(f"{k} {v}" for k, v in items))
    if ("torchyard", TARGET_N) in res.fanout:
        t, d = res.fanout[("torchyard", TARGET_N)], res.fanout[("direct", TARGET_N)]
        ratios = [x / y for x, y in zip(t, d, strict=True)]
        met = sum(x <= TARGET_RATIO for x in ratios)
        print(
            f"target: torchyard / direct <= {TARGET_RATIO} at N = {TARGET_N}: "
            f"{'target met' if met == len(ratios) else 'TARGET MISSED'} "
            f"({met} of {len(ratios)} rounds within it)"
        )
        for peer in ("trainjob", "pytorchjob"):
            if (peer, TARGET_N) in res.fanout:
                p = res.fanout[(peer, TARGET_N)]
                ratio = statistics.median(t) / statistics.median(p)
                verdict = "target met" if ratio < 1 else "TARGET MISSED"
                print(
                    f"target: torchyard faster than {peer} at N = {TARGET_N}: "
                    f"ratio {ratio:.2f}: {verdict}"
                )
    else:
        print(f"target: torchyard / direct <= {TARGET_RATIO} at N = {TARGET_N} (not measured)")


def report_restart(args: argparse.Namespace, res: Results) -> None:
    print(f"\ngang restart of N = {args.restart_size}: one Pod fails -> N Pods Running again")
    base = res.restart.get("torchyard")
    for name, t in res.restart.items():
        ratio = " ".join(f"{x / y:.2f}" for x, y in zip(t, base, strict=True)) if base else "-"
        print(
            f"  {name:11s} {statistics.median(t):6.2f}s ({spread(t)})  "
            f"Pods replaced {statistics.median(res.replaced[name]):.0f} of {args.restart_size}"
            f"  ratio to torchyard per round {ratio}"
        )
    print("API writes from the failure to N Running (last round), biggest items:")
    for name, delta in res.restart_writes.items():
        items = delta.most_common(8)
        print(f"  {name:11s} " + ", ".join(f"{k} {v}" for k, v in items))
    if res.restart_steps:
        restart_steps.report(res.restart_steps, args.restart_size)
    if args.restart_size == TARGET_RESTART_N and base and len(res.restart) > 1:
        slower = [
            name
            for name, t in res.restart.items()
            if name not in ("torchyard", IN_PLACE)
            and statistics.median(t) <= statistics.median(base)
        ]
        verdict = "target met" if not slower else f"TARGET MISSED ({', '.join(slower)})"
        print(f"target: gang restart of {TARGET_RESTART_N} faster than the peers: {verdict}")
    if base and IN_PLACE in res.restart:
        ratio = statistics.median(res.restart[IN_PLACE]) / statistics.median(base)
        met = "met" if ratio <= IN_PLACE_TARGET else "MISSED"
        print(
            f"target: in place <= {IN_PLACE_TARGET:.2f} of torchyard's recreate: {ratio:.2f}, {met}"
        )


def report_admission(args: argparse.Namespace, res: Results) -> None:
    print(
        f"\nadmission: {args.admission_runs} runs of {GANG} nodes x 8 GPUs on {GANG} nodes "
        f"(given up after {args.admission_stall:.0f}s without a run starting, or "
        f"{args.admission_timeout:.0f}s)"
    )
    for name, drains in res.drain.items():
        done = [d for d in drains if d is not None]
        shown = f"{statistics.median(done):6.2f}s ({spread(done)})" if done else "never"
        stuck = [f for d, f in zip(drains, res.finished[name], strict=True) if d is None]
        print(
            f"  {name:11s} drained {shown}"
            + (
                f", {len(stuck)} of {len(drains)} rounds stuck after "
                f"{'/'.join(map(str, stuck))} of {args.admission_runs} runs"
                if stuck
                else ""
            )
            + f"  most runs with a partial gang at once {max(res.partial[name])}"
        )


def record_results(
    rec: record.Record, args: argparse.Namespace, names: list[str], res: Results
) -> None:
    """The figures :func:`report` prints, and every round's, into the results file. A ratio
    is the figure's over its baseline's (torchyard's against direct creation and against
    each peer; a peer's against torchyard's)."""
    for (name, n), times in sorted(res.fanout.items()):
        for r, t in enumerate(times):
            rec.round(part="fanout", n=n, contender=name, round=r + 1, seconds=t)
        if name == "direct":
            continue
        direct = res.fanout[("direct", n)]
        ratios = [x / d for x, d in zip(times, direct, strict=True)]
        at_target = name == "torchyard" and n == TARGET_N
        rec.figure(
            f"{name}: create -> {n} Pods Running",
            statistics.median(times),
            "s",
            spread=(min(times), max(times)),
            baseline=("direct Pods, 16 concurrent creates", statistics.median(direct)),
            ratio=statistics.median(ratios),
            ratio_spread=(min(ratios), max(ratios)),
            target=f"<= {TARGET_RATIO} in every round" if at_target else None,
            met=all(x <= TARGET_RATIO for x in ratios) if at_target else None,
        )
    for (name, n), w in sorted(res.writes.items()):
        rec.figure(f"{name}: API writes per Pod at N = {n}", statistics.median(w), "writes")
    for (name, n), stages in sorted(res.pod_stages.items()):
        for key, words, _, _ in timeline.POD_STAGES:
            if values := stages.get(key):
                title = f"{name}: per Pod at N = {n}, {words}"
                rec.figure(f"{title}, median", statistics.median(values), "s")
                rec.figure(f"{title}, 95th percentile", timeline.percentile(values, 0.95), "s")
    for peer in names:
        if peer in ("torchyard", "direct") or (peer, TARGET_N) not in res.fanout:
            continue
        if ("torchyard", TARGET_N) in res.fanout:
            mine = statistics.median(res.fanout[("torchyard", TARGET_N)])
            theirs = statistics.median(res.fanout[(peer, TARGET_N)])
            rec.figure(
                f"torchyard: create -> {TARGET_N} Pods Running, against {peer}",
                mine,
                "s",
                baseline=(peer, theirs),
                ratio=mine / theirs,
                target="< 1",
                met=mine / theirs < 1,
            )
    base = res.restart.get("torchyard")
    for name, times in res.restart.items():
        for r, t in enumerate(times):
            rec.round(part="restart", contender=name, round=r + 1, seconds=t)
        replaced = statistics.median(res.replaced[name])
        title = (
            f"{name}: gang restart of {args.restart_size}, one Pod fails -> all Running "
            f"({replaced:.0f} Pods replaced)"
        )
        median = statistics.median(times)
        if not base or name == "torchyard":
            rec.figure(title, median, "s", spread=(min(times), max(times)))
            continue
        if name == IN_PLACE:
            rec.figure(
                f"{name}: restart of {args.restart_size} nodes' ranks, a rank fails -> every "
                "launcher told to start again (0 Pods created; launchers simulated)",
                median,
                "s",
                spread=(min(times), max(times)),
                baseline=("torchyard's gang restart (recreate)", statistics.median(base)),
                ratio=median / statistics.median(base),
                target=f"<= {IN_PLACE_TARGET:.2f}",
                met=median / statistics.median(base) <= IN_PLACE_TARGET,
            )
            continue
        rec.figure(
            title,
            median,
            "s",
            spread=(min(times), max(times)),
            baseline=("torchyard", statistics.median(base)),
            ratio=median / statistics.median(base),
            target="> 1 (slower than torchyard)",
            met=median > statistics.median(base),
        )
    for name, drains in res.drain.items():
        for r, d in enumerate(drains):
            rec.round(part="admission", contender=name, round=r + 1, drained_s=d)
        done = [d for d in drains if d is not None]
        rec.figure(
            f"{name}: admission, {args.admission_runs} runs of {GANG} x 8 GPUs on {GANG} "
            f"nodes, time to drain ({len(drains) - len(done)} of {len(drains)} rounds stuck)",
            statistics.median(done) if done else "never",
            "s" if done else "",
            spread=(min(done), max(done)) if done else None,
        )
        rec.figure(
            f"{name}: most runs holding a partial gang at once",
            max(res.partial[name]),
            "runs",
            target="<= 1",
            met=max(res.partial[name]) <= 1,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,64,256")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--restart-size", type=int, default=TARGET_RESTART_N)
    parser.add_argument("--admission-runs", type=int, default=20)
    parser.add_argument("--admission-timeout", type=float, default=600.0)
    parser.add_argument(
        "--admission-stall",
        type=float,
        default=30.0,
        help="give a contender up when no run started for this long (a deadlock)",
    )
    parser.add_argument(
        "--parts", default="fanout,restart,admission", help="which parts to measure"
    )
    parser.add_argument("--no-peers", action="store_true", help="torchyard and direct only")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="where the time goes, step by step, in the fan-out and the gang restart "
        "(watches on the namespace)",
    )
    parser.add_argument(
        "--operator-src",
        default=str(REPO / "operator"),
        help="the source root the torchyard operator runs from (an A/B against another tree)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="folder for the torchyard operator's sampled profile (benchmarks/sampler.py)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="N = 8, restart of 8, 4 admission runs, no peers"
    )
    record.add_argument(parser)
    args = parser.parse_args()
    rec = record.Record("peers", args)
    rec.version("kubernetes", KUBERNETES_VERSION)
    if not args.no_peers:
        rec.note(f"peers: {peers.versions()}")
    # SIGTERM (timeout, a CI's cancel) unwinds like Ctrl-C: the cluster stops what it started.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    if args.smoke:
        args.sizes, args.restart_size, args.admission_runs, args.no_peers = "8", 8, 4, True
        args.breakdown = True
    args.sizes = [int(s) for s in args.sizes.split(",")]
    parts = set(args.parts.split(","))
    if not parts or parts - {"fanout", "restart", "admission"}:
        parser.error("--parts: a comma-separated subset of fanout,restart,admission")
    if args.rounds < 1 or min(args.sizes) < 1 or args.restart_size < 2:
        parser.error("--rounds and every size must be >= 1, --restart-size >= 2")
    gpu = Pool("gpu", nodes=max(*args.sizes, args.restart_size), gpus=8, cpu="96",
               memory="1Ti", taints=(GPU_TAINT,))  # fmt: skip
    contenders = [DIRECT, TORCHYARD] + ([] if args.no_peers else [TRAINJOB, PYTORCHJOB])
    print(f"peers: {'none (--no-peers)' if args.no_peers else peers.versions()}")
    print(f"machine: {machine()}", flush=True)
    if args.operator_src != str(REPO / "operator"):
        print(f"torchyard operator from: {args.operator_src}", flush=True)
    res = Results()
    with Cluster(pools=(gpu, ADM)) as cluster:
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        os.environ["TORCHYARD_RESOLVE_CURATED"] = "127.0.0.1"  # no public registry for "img"
        k8s.reset()
        running_peers = None
        if not args.no_peers:
            running_peers = peers.Peers(cluster).start()
            template = k8s.get(RUNTIMES, None, "torch-distributed")
            rest.call("POST", RUNTIMES.path(None), body=runtime(template))
            print(f"peers up in {running_peers.timings['start']:.1f}s", flush=True)
        cluster.create_namespace(NS)
        k8s.create(
            {
                "apiVersion": "torchyard.dev/v1alpha1",
                "kind": "Environment",
                "metadata": {"name": "pytorch", "namespace": NS},
                "spec": {"image": "img"},
            }
        )
        profile = args.profile / "profile-torchyard" if args.profile else None
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
        op = Operator(args.operator_src, cluster.kubeconfig, cluster.workdir / "op.log", profile)
        op.start()
        seen = start_timeline(not args.no_peers) if args.breakdown else None
        try:
            for r in range(args.rounds):
                turn = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
                for n in args.sizes if "fanout" in parts else []:
                    line = [f"round {r + 1}/{args.rounds}  N={n:4d}"]
                    for c in turn:
                        line.append(f"{c.name} {fanout(cluster, c, n, r, res, seen):6.2f}s")
                    print("  ".join(line), flush=True)
                line = [f"round {r + 1}/{args.rounds}  restart N={args.restart_size:4d}"]
                for c in turn:
                    if c is not DIRECT and "restart" in parts:
                        took = gang_restart(cluster, c, args.restart_size, r, res, args.breakdown)
                        line.append(f"{c.name} {took:6.2f}s")
                if "restart" in parts:
                    took = in_place_restart(args.restart_size, res)
                    line.append(f"{IN_PLACE} {took:6.2f}s")
                if "restart" in parts:
                    print("  ".join(line), flush=True)
                line = [f"round {r + 1}/{args.rounds}  admission {args.admission_runs} runs"]
                for c in turn:
                    if c is not DIRECT and "admission" in parts:
                        d = admission(
                            c,
                            args.admission_runs,
                            r,
                            args.admission_timeout,
                            args.admission_stall,
                            res,
                        )
                        line.append(f"{c.name} {'never' if d is None else f'{d:6.2f}s'}")
                if "admission" in parts:
                    print("  ".join(line), flush=True)
            rss, peak = op.memory_mib()
            print(
                f"torchyard operator process: CPU {op.cpu_seconds():.1f}s, "
                f"RSS {rss:.0f} MiB (peak {peak:.0f} MiB)",
                flush=True,
            )
        finally:
            if seen is not None:
                seen.stop()
            op.stop()
            if running_peers is not None:
                running_peers.stop()
    report(args, [c for c in contenders], res, parts)
    print(f"machine after: {machine()}")
    record_results(rec, args, [c.name for c in contenders], res)
    rec.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
