"""Launch on a REAL node: from creating a TrainingRun to every rank's first training step,
against the same work started by hand as two bare Pods with the guide's ``torchrun``.

Both arms run on the harness's real kubelet node (tests/cluster/realnode.py), in the same
CPU PyTorch image, with the same script (``ddp_steps.py``, world size 4: 2 node Pods x 2
processes, gloo), the same resources (CPU request, memory limit, a memory-backed
``/dev/shm``), the same non-root user and the same rendezvous (node 0's DNS name through a
headless Service):
  - torchyard: the code is snapshotted as ``torchyard submit --source`` does (the archive
    is made before the clock starts; creating its ConfigMap is timed), then the
    TrainingRun is created (2 nodes x 2 processes, ``launch: process``, a curated
    Environment). The in-process operator applies the launcher's ConfigMap (once per
    namespace), gang-admits the run and creates the headless Service and the node Pods
    (ungated: the gang fits); the launcher, a read-only ConfigMap volume, unpacks the
    snapshot, waits for ``MASTER_ADDR`` and starts the ranks (no init container);
  - bare Pods: a ConfigMap with the script, a hand-made headless Service
    (``publishNotReadyAddresses``) and two Pods (``hostname``/``subdomain``) created at
    once, each running the guide's per-node launch ``python -m torch.distributed.run
    --nnodes 2 --nproc_per_node 2 --node_rank I --master_addr <pod-0>.<svc>.<ns>.svc
    --master_port 6105 ddp_steps.py`` (torchrun with its default static rendezvous).
The clock starts before the first API request and stops at the LAST rank's first optimizer
step, as the ranks themselves print it (``first-step <unix time>``, read back through
``pods/log`` from the kubelet; the containers share this machine's clock). Every Pod must
have run on the real node (``spec.nodeName``), else the benchmark fails. Polling the Pods
meanwhile, it also notes when every node Pod's main container (torchyard's launcher,
torchrun) was running: the share of the time the Pods took before any process of the
run started (for torchyard: gang admission and the Pods' creation). Each repetition
runs both arms one after the other, the order alternating, each cleaned up (Pods gone)
before the next, after ``--warmup`` unmeasured rounds; it prints every run, the medians
with their spread and the ratio of the medians (target <= 1.15).

    .venv/bin/python benchmarks/real_launch.py [--repeats 3] [--steps 20] [--warmup 1]
    .venv/bin/python benchmarks/real_launch.py --smoke   # 1 repeat, 5 steps, no warm-up

Needs root and the real node's set-up (``make node`` or ``python -m
tests.cluster.realnode --prepare-only`` once, cached); one real node per machine. The node
tier runs :func:`compare` at its smallest size on the session's node
(tests/node/test_benchmarks_smoke.py).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "operator"),
]

from benchmarks import record  # noqa: E402
from tests.cluster.binaries import KUBERNETES_VERSION  # noqa: E402
from tests.cluster.realnode import NodeError, RealNode  # noqa: E402
from tests.cluster.session import operator_on_real_node  # noqa: E402

from torchyard import k8s  # noqa: E402
from torchyard.sdk import snapshots  # noqa: E402
from torchyard.sdk.registry import RegistryClient  # noqa: E402

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "ddp_steps.py"
NS = "real-launch"
ENVIRONMENT = "pytorch"
NODES, PROCS, PORT, UID = 2, 2, 6105, 1000
# Small: two node Pods on the node's 2 CPUs, beside whatever else the machine runs.
CPU, MEMORY, SHM = "250m", "1Gi", "64Mi"
TARGET = 1.15
BARE_LABEL = "benchmarks.torchyard.dev/bare"
# Not anchored to lines: torchrun's ranks share their container's stdout, so two ranks'
# lines can run together ("first-step 1.5first-step 1.6"); torchyard's launcher labels
# each rank's lines ("[rank 3] first-step ...").
FIRST_STEP = re.compile(r"(?:\[rank (\d+)\] )?first-step (\d+\.\d{6})")
DONE = re.compile(r"done \d+\.\d{6}")


class BenchError(Exception):
    """A launch failed, hung or ran elsewhere than on the real node; says what to look at."""


@dataclass(frozen=True)
class Launch:
    """One arm's run, in seconds from the first API request: each rank's first step, and
    when the benchmark first saw every node Pod's main container running (polled every
    0.25 s, so within about that much: what the Pods took until the launcher or torchrun
    started, against what the processes took from there)."""

    firsts: tuple[float, ...]
    running: float
    note: str = ""

    @property
    def last(self) -> float:
        return max(self.firsts)


def wait(what: str, check: Callable[[], Any], timeout: float, explain: Callable[[], str]) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}\n{explain()}")
        time.sleep(0.25)


def describe(namespace: str, selector: str) -> str:
    """The Pods' phases, nodes and container states, and the namespace's last Events."""
    lines = []
    for pod in k8s.list_(k8s.PODS, namespace, label_selector=selector):
        status = pod.get("status", {})
        states = [
            (c["name"], c.get("state"))
            for c in status.get("initContainerStatuses", []) + status.get("containerStatuses", [])
        ]
        lines.append(
            f"  {pod['metadata']['name']}: {status.get('phase')} on "
            f"{pod['spec'].get('nodeName')!r}: {states}"
        )
    events = sorted(k8s.list_(k8s.EVENTS, namespace), key=lambda e: e.get("lastTimestamp") or "")
    lines += [
        f"  event {e['involvedObject'].get('name')}: {e.get('reason')}: {e.get('message')}"
        for e in events[-15:]
    ]
    return "\n".join(lines)


class Running:
    """Notes, while polled, when every node Pod's ``container`` was first seen running."""

    def __init__(self, namespace: str, selector: str, container: str, started: float) -> None:
        self.namespace, self.selector, self.container = namespace, selector, container
        self.started = started
        self.seen: float | None = None

    def poll(self) -> list[dict[str, Any]]:
        pods = k8s.list_(k8s.PODS, self.namespace, label_selector=self.selector)
        if self.seen is None and len(pods) == NODES and all(self._started(p) for p in pods):
            self.seen = time.time() - self.started
        return pods

    def _started(self, pod: dict[str, Any]) -> bool:
        for status in pod.get("status", {}).get("containerStatuses") or []:
            if status["name"] == self.container:
                state = status.get("state", {})
                return "running" in state or "terminated" in state
        return False

    def at(self) -> float:
        if self.seen is None:
            raise BenchError(f"never saw the {self.container} containers of {self.selector} run")
        return self.seen


def log_of(namespace: str, pod: str, container: str) -> str:
    return "\n".join(k8s.pod_log_lines(namespace, pod, container=container))


def first_steps(
    node: RealNode, namespace: str, pods: list[dict[str, Any]], container: str, started: float
) -> tuple[tuple[float, ...], str]:
    """Every rank's first step (seconds after ``started``) from the Pods' logs, once each
    Pod is checked to have run on the real node; also the logs, joined."""
    if len(pods) != NODES:
        raise BenchError(f"expected {NODES} Pods, found {[p['metadata']['name'] for p in pods]}")
    texts, firsts, labelled = [], [], []
    for pod in pods:
        name, where = pod["metadata"]["name"], pod["spec"].get("nodeName")
        if where != node.name:
            raise BenchError(f"{name} ran on {where!r}, not on the real node {node.name!r}")
        text = log_of(namespace, name, container)
        found = FIRST_STEP.findall(text)
        if len(found) != PROCS:
            raise BenchError(
                f"{name}: expected {PROCS} ranks' 'first-step' lines, found {len(found)}; "
                f"its log ends:\n{text[-3000:]}"
            )
        texts.append(text)
        labelled += [int(rank) for rank, _ in found if rank]
        firsts += [float(stamp) - started for _, stamp in found]
    if labelled and sorted(labelled) != list(range(NODES * PROCS)):
        raise BenchError(f"the ranks' first steps came from ranks {sorted(labelled)}")
    return tuple(firsts), "\n".join(texts)


# -- the two arms ----------------------------------------------------------------------


def trainingrun(
    name: str, namespace: str, pool: str, source: dict[str, str], steps: int
) -> dict[str, Any]:
    return {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "environment": ENVIRONMENT,
            "source": source,
            "command": ["python", SCRIPT.name, "--steps", str(steps)],
            "distribution": {
                "nodeCount": NODES,
                "processCountPerNode": PROCS,
                "launch": "process",
                "masterPort": PORT,
            },
            "resources": {"cpu": CPU, "memory": MEMORY, "shmSize": SHM},
            "compute": {"pool": pool},
            "runAsUser": UID,
        },
    }


def no_registry() -> RegistryClient:
    raise BenchError(f"{SCRIPT.name} no longer fits a ConfigMap snapshot")


def torchyard_launch(
    node: RealNode, namespace: str, name: str, snap: snapshots.Snapshot, steps: int
) -> Launch:
    """``torchyard submit --source``: the snapshot's ConfigMap, then the TrainingRun."""
    selector = f"torchyard.dev/run={name}"

    def explain() -> str:
        run = k8s.get_or_none(k8s.TRAININGRUNS, namespace, name) or {}
        return f"run status: {run.get('status')}\n{describe(namespace, selector)}"

    started = time.time()
    snapshots.store(snap, namespace, no_registry)
    k8s.create(trainingrun(name, namespace, node.pool, snap.source, steps))
    running = Running(namespace, selector, "trainer", started)

    def finished() -> dict[str, Any] | None:
        running.poll()
        run = k8s.get(k8s.TRAININGRUNS, namespace, name)
        done = run.get("status", {}).get("phase") in ("Succeeded", "Failed")
        return run if done else None

    try:
        run = wait(f"TrainingRun {name} to finish", finished, 600, explain)
        if run["status"]["phase"] != "Succeeded":
            raise BenchError(f"TrainingRun {name} failed\n{explain()}")
        pods = k8s.list_(k8s.PODS, namespace, label_selector=selector)
        firsts, _ = first_steps(node, namespace, pods, "trainer", started)
    finally:
        k8s.delete(k8s.TRAININGRUNS, namespace, name, propagation="Foreground")
        k8s.delete(k8s.CONFIGMAPS, namespace, snap.configmap_name)
        gone(namespace, selector)
    return Launch(firsts, running.at())


def bare_service(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {BARE_LABEL: name},
            "ports": [{"name": "rendezvous", "port": PORT, "targetPort": PORT}],
        },
    }


def bare_pod(
    name: str, namespace: str, node_rank: int, image: str, pool: str, steps: int
) -> dict[str, Any]:
    """Node ``node_rank`` as the guide starts it: torchrun once per node."""
    master = f"{name}-0.{name}.{namespace}.svc"
    torchrun = [
        "python", "-m", "torch.distributed.run", "--nnodes", str(NODES),
        "--nproc_per_node", str(PROCS), "--node_rank", str(node_rank),
        "--master_addr", master, "--master_port", str(PORT),
        SCRIPT.name, "--steps", str(steps),
    ]  # fmt: skip
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-{node_rank}",
            "namespace": namespace,
            "labels": {BARE_LABEL: name},
        },
        "spec": {
            "hostname": f"{name}-{node_rank}",
            "subdomain": name,
            "restartPolicy": "Never",
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "nodeSelector": {"torchyard.dev/pool": pool},
            "securityContext": {
                "seccompProfile": {"type": "RuntimeDefault"},
                "runAsNonRoot": True,
                "runAsUser": UID,
                "runAsGroup": UID,
                "fsGroup": UID,
            },
            "containers": [
                {
                    "name": "torchrun",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": torchrun,
                    "workingDir": "/workspace",
                    "ports": [{"name": "rendezvous", "containerPort": PORT}],
                    "resources": {
                        "requests": {"cpu": CPU, "memory": MEMORY},
                        "limits": {"memory": MEMORY},
                    },
                    "volumeMounts": [
                        {"name": "source", "mountPath": "/workspace", "readOnly": True},
                        {"name": "dshm", "mountPath": "/dev/shm"},
                    ],
                    "securityContext": restricted,
                }
            ],
            "volumes": [
                {"name": "source", "configMap": {"name": name}},
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM}},
            ],
        },
    }


def bare_launch(node: RealNode, namespace: str, name: str, steps: int) -> Launch:
    """A ConfigMap with the script, a headless Service and two torchrun Pods."""
    selector = f"{BARE_LABEL}={name}"
    image = node.images["pytorch"].ref
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {SCRIPT.name: SCRIPT.read_text()},
    }
    started = time.time()
    k8s.create(config)
    k8s.create(bare_service(name, namespace))
    for rank in range(NODES):
        k8s.create(bare_pod(name, namespace, rank, image, node.pool, steps))
    running = Running(namespace, selector, "torchrun", started)

    def finished() -> list[dict[str, Any]] | None:
        pods = running.poll()
        ended = [p for p in pods if p.get("status", {}).get("phase") in ("Succeeded", "Failed")]
        return pods if len(ended) == NODES else None

    try:
        pods = wait(
            f"Pods {name}-0 and {name}-1 to finish",
            finished,
            600,
            lambda: describe(namespace, selector),
        )
        pods.sort(key=lambda p: str(p["metadata"]["name"]))
        firsts, text = first_steps(node, namespace, pods, "torchrun", started)
        note = ""
        failed = [p["metadata"]["name"] for p in pods if p["status"]["phase"] != "Succeeded"]
        # torchrun's static rendezvous keeps its store in node 0's agent: when node 0 ends
        # first, node 1's agent can fail while shutting down, after every rank's last step
        # (as in launch_overhead.py). Timed all the same, and said; any other failure is not.
        if failed and len(DONE.findall(text)) == NODES * PROCS:
            note = f"{', '.join(failed)} exited non-zero after all 4 ranks were done"
        elif failed:
            raise BenchError(f"{', '.join(failed)} failed\n{text[-3000:]}")
    finally:
        for rank in range(NODES):
            k8s.delete(k8s.PODS, namespace, f"{name}-{rank}", grace_period_seconds=0)
        k8s.delete(k8s.SERVICES, namespace, name)
        k8s.delete(k8s.CONFIGMAPS, namespace, name)
        gone(namespace, selector)
    return Launch(firsts, running.at(), note)


def gone(namespace: str, selector: str) -> None:
    wait(
        f"Pods {selector} to be gone",
        lambda: not k8s.list_(k8s.PODS, namespace, label_selector=selector),
        180,
        lambda: describe(namespace, selector),
    )


# -- the comparison --------------------------------------------------------------------


ARMS = ("torchyard", "bare Pods")


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def compare(
    node: RealNode, namespace: str, *, repeats: int, steps: int, warmup: int = 1
) -> dict[str, list[Launch]]:
    """Both arms ``repeats`` times, alternating which goes first, after ``warmup``
    unmeasured rounds (the first Pods of an image on a fresh node pay for its snapshot).
    Needs the in-process operator running (its node Pods need no torchyard image). Prints
    every run and the summary; returns the launches per arm."""
    image = node.images["pytorch"].ref
    k8s.apply(
        {
            "apiVersion": "torchyard.dev/v1alpha1",
            "kind": "Environment",
            "metadata": {"name": ENVIRONMENT, "namespace": namespace},
            "spec": {"image": image},
        }
    )
    wait(
        f"Environment {ENVIRONMENT} Ready",
        lambda: (
            k8s.get(k8s.ENVIRONMENTS, namespace, ENVIRONMENT).get("status", {}).get("phase")
            == "Ready"
        ),
        120,
        lambda: str(k8s.get(k8s.ENVIRONMENTS, namespace, ENVIRONMENT).get("status")),
    )
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        (src / SCRIPT.name).write_bytes(SCRIPT.read_bytes())
        snap = snapshots.snapshot(src)
        try:
            return _rounds(node, namespace, snap, repeats, steps, warmup)
        finally:
            snap.close()


def _rounds(
    node: RealNode,
    namespace: str,
    snap: snapshots.Snapshot,
    repeats: int,
    steps: int,
    warmup: int,
) -> dict[str, list[Launch]]:
    arms: dict[str, Callable[[str], Launch]] = {
        "torchyard": lambda name: torchyard_launch(node, namespace, name, snap, steps),
        "bare Pods": lambda name: bare_launch(node, namespace, name, steps),
    }
    results: dict[str, list[Launch]] = {arm: [] for arm in ARMS}
    for i in range(-warmup, repeats):
        order = ARMS if i % 2 == 0 else ARMS[::-1]
        for arm in order:
            prefix = "ty" if arm == "torchyard" else "bare"
            launch = arms[arm](f"{prefix}-{i + warmup}")
            which = f"warm-up {i + warmup + 1}/{warmup}" if i < 0 else f"run {i + 1}/{repeats}"
            print(
                f"  {which} {arm:9s} every rank's first step {launch.last:6.2f}s "
                f"(ranks {spread(list(launch.firsts))}), containers running "
                f"{launch.running:6.2f}s" + (f"  note: {launch.note}" if launch.note else ""),
                flush=True,
            )
            if i >= 0:
                results[arm].append(launch)
    lasts = {arm: [launch.last for launch in results[arm]] for arm in ARMS}
    runs = {arm: [launch.running for launch in results[arm]] for arm in ARMS}
    med = {arm: statistics.median(lasts[arm]) for arm in ARMS}
    print(
        f"\nreal node {node.name}, world size {NODES * PROCS} ({NODES} Pods x {PROCS}), "
        f"{steps} steps, median of {repeats} runs (spread: lowest-highest)"
    )
    print(f"{'':10s} {'create -> every rank first step':>32s} {'of which containers running':>30s}")
    for arm in ARMS:
        print(
            f"{arm:10s} {med[arm]:18.2f}s ({spread(lasts[arm])}) "
            f"{statistics.median(runs[arm]):18.2f}s ({spread(runs[arm])})"
        )
    ratio = med["torchyard"] / med["bare Pods"]
    rounds = [t / b for t, b in zip(lasts["torchyard"], lasts["bare Pods"], strict=True)]
    verdict = "target met" if ratio <= TARGET else "TARGET MISSED"
    print(
        f"ratio torchyard / bare Pods: {ratio:.3f} (per round {spread(rounds)})   "
        f"(target <= {TARGET:.2f}: {verdict})",
        flush=True,
    )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first")
    parser.add_argument("--smoke", action="store_true", help="1 repeat of 5 steps, no warm-up")
    record.add_argument(parser)
    args = parser.parse_args()
    rec = record.Record("real_launch", args)
    rec.version("kubernetes", KUBERNETES_VERSION)
    if args.smoke:
        args.repeats, args.steps, args.warmup = 1, 5, 0
    if args.repeats < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--repeats and --steps must be >= 1, --warmup >= 0")
    try:
        with operator_on_real_node(NS) as (_cluster, node):
            results = compare(node, NS, repeats=args.repeats, steps=args.steps, warmup=args.warmup)
    except (BenchError, NodeError) as err:
        print(f"real_launch: {err}", file=sys.stderr)
        return 1
    for arm, launches in results.items():
        for i, launch in enumerate(launches):
            rec.round(arm=arm, run=i + 1, first_step_s=launch.last, running_s=launch.running)
    lasts = {arm: [launch.last for launch in launches] for arm, launches in results.items()}
    mine, bare = statistics.median(lasts["torchyard"]), statistics.median(lasts["bare Pods"])
    rounds = [t / b for t, b in zip(lasts["torchyard"], lasts["bare Pods"], strict=True)]
    rec.figure(
        f"real node: TrainingRun created -> every rank's first step, {NODES} x {PROCS}",
        mine,
        "s",
        spread=(min(lasts["torchyard"]), max(lasts["torchyard"])),
        baseline=("2 bare Pods with torchrun and a headless Service", bare),
        ratio=mine / bare,
        ratio_spread=(min(rounds), max(rounds)),
        target=f"<= {TARGET:.2f}",
        met=mine / bare <= TARGET,
    )
    rec.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
