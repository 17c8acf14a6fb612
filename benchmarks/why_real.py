"""The real node's side of ``benchmarks/why_matrix.py``: each fault script of tests/faults.py
as a TrainingRun on the harness's real kubelet node (tests/cluster/realnode.py), through
the operator, read back from ``status.failure`` (rank, node, class).

Runs go ``parallel`` at a time, each in a namespace of its own (``why-matrix-<slot>``,
Pod Security "restricted", a curated Environment ``pytorch``); a run's Pods are polled
while it runs, and a run counts only if both its node Pods were seen and every Pod seen
was bound to the real node (``spec.nodeName``). After a run its TrainingRun and Pods are
deleted and gone before its namespace takes the next one. Not a benchmark of its own:
why_matrix.py ``--real-node`` records the figures.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tests.builders import TrainingRunBuilder, environment
from tests.cluster.realnode import RealNode
from tests.cluster.session import operator_on_real_node
from tests.faults import script
from tests.integration.helpers import wait_status

from torchyard import k8s

RESTRICTED = "pod-security.kubernetes.io/enforce"
RESOURCES = {"cpu": "250m", "memory": "2Gi", "shmSize": "64Mi"}
TORCHRUN = ["python", "-m", "torch.distributed.run", "--no_python", "python", "-c"]
NODES, PROCS = 2, 2


@dataclass(frozen=True)
class Cell:
    shape: str
    fault: str
    place: str
    victim: int  # global rank


@dataclass(frozen=True)
class Outcome:
    """One run: whether it counts (its Pods ran on the real node), whether the victim's
    rank and node were named, what ``status.failure`` said, and how long it took."""

    cell: Cell
    counted: bool
    right: bool
    said: str
    seconds: float
    load: float
    evidence: dict[str, Any] | None = None  # a wrong run: status.failure, each node's word

    def row(self) -> dict[str, Any]:
        """The run as a round of the results file (the cell: shape, fault, place, victim)."""
        row = {**dataclasses.asdict(self), **dataclasses.asdict(self.cell)}
        del row["cell"]
        row["seconds"] = round(self.seconds, 1)
        return {k: v for k, v in row.items() if v is not None}


def body(node: RealNode, namespace: str, name: str, cell: Cell, stall: int) -> dict[str, Any]:
    code = script(cell.fault, cell.shape, cell.victim)
    command = [*TORCHRUN, code] if cell.shape == "torchrun" else ["python", "-c", code]
    return (
        TrainingRunBuilder(name, namespace)
        .environment("pytorch")
        .command(*command)
        .nodes(NODES)
        .procs(PROCS)
        .launch("node" if cell.shape == "torchrun" else "process")
        .pool(node.pool)
        .with_("spec.resources", dict(RESOURCES))
        .with_("spec.runAsUser", 1000)
        .with_("spec.policy", {"backoffLimit": 0, "stallTimeoutSeconds": stall})
        .obj()
    )


def _pods(namespace: str, name: str) -> list[dict[str, Any]]:
    return k8s.list_(k8s.PODS, namespace, label_selector=f"torchyard.dev/run={name}")


def _wait(what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(1)
    return found


def once(node: RealNode, namespace: str, name: str, cell: Cell, stall: int) -> Outcome:
    """Create the run, poll it (and where its Pods are bound) until it ends, judge it, and
    delete it (its Pods gone)."""
    started = time.monotonic()
    k8s.create(body(node, namespace, name, cell, stall))
    bound: dict[str, str | None] = {}
    reports: dict[str, dict[str, Any]] = {}

    def ended() -> dict[str, Any] | None:
        for pod in _pods(namespace, name):
            where = pod["spec"].get("nodeName")
            if where or pod["metadata"]["name"] not in bound:
                bound[pod["metadata"]["name"]] = where
            if (said := report(pod)) is not None:
                reports[pod["metadata"]["name"]] = said
        run = k8s.get(k8s.TRAININGRUNS, namespace, name)
        return run if run.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    try:
        try:
            run = _wait(f"TrainingRun {namespace}/{name} to end", ended, stall + 600)
        except TimeoutError:  # never ended: judged as it stands (nothing named)
            run = k8s.get(k8s.TRAININGRUNS, namespace, name)
        ended()  # the Pods as they were when it ended
    finally:
        k8s.delete(k8s.TRAININGRUNS, namespace, name)
        for pod in _pods(namespace, name):
            k8s.delete(k8s.PODS, namespace, pod["metadata"]["name"], grace_period_seconds=0)
    seconds = time.monotonic() - started
    _wait(f"the Pods of {namespace}/{name} gone", lambda: not _pods(namespace, name), 180)
    outcome = judge(node.name, name, cell, run, bound, seconds)
    if outcome.counted and not outcome.right:  # what each node said, to see why
        failure = run.get("status", {}).get("failure")
        return dataclasses.replace(outcome, evidence={"failure": failure, "nodes": reports})
    return outcome


# What a node Pod's termination message says that decides the culprit.
REPORTED = ("rank", "reason", "exitedAt", "step", "earlyExits")


def report(pod: dict[str, Any]) -> dict[str, Any] | None:
    """What a node Pod's launcher said when it ended (its rank, reason, exit time,
    early exits, a stall's suspects and when it was found) and when the kubelet saw it
    end; None while it runs."""
    for status in pod.get("status", {}).get("containerStatuses") or []:
        ended = (status.get("state") or {}).get("terminated")
        if status.get("name") != "trainer" or not ended:
            continue
        text = str(ended.get("message") or "{}")
        try:
            said = json.loads(text)
        except ValueError:  # a launcher that wrote none: the kubelet's log tail
            said = None
        if not isinstance(said, dict):
            return {"message": text[-300:], **_kubelet(ended)}
        stall = said.get("stall")
        out = {k: said[k] for k in REPORTED if k in said}
        if isinstance(stall, dict):
            out["stall"] = {k: stall.get(k) for k in ("rank", "detectedAt", "suspects")}
        return {**out, **_kubelet(ended)}
    return None


def _kubelet(ended: dict[str, Any]) -> dict[str, Any]:
    return {"exitCode": ended.get("exitCode"), "finishedAt": ended.get("finishedAt")}


def judge(
    node: str,
    name: str,
    cell: Cell,
    run: dict[str, Any],
    bound: dict[str, str | None],
    seconds: float,
) -> Outcome:
    """Named right: ``status.failure`` names the victim's rank and node. Counted: both node
    Pods were seen, every one (``bound``: Pod name to ``spec.nodeName``) bound to the real
    node, named ``node``."""
    expected = {f"{name}-{i}" for i in range(NODES)}
    elsewhere = {pod: where for pod, where in bound.items() if where != node}
    counted = expected <= set(bound) and not elsewhere
    status = run.get("status", {})
    failure = status.get("failure") or {}
    rank, at = failure.get("rank"), failure.get("node")
    said = (
        f"{status.get('phase')} {failure.get('class')} rank {rank} node {at}: "
        f"{str(failure.get('message') or '')[:160]}"
    )
    if not counted:
        said = f"NOT COUNTED (Pods seen: {bound}) " + said
    right = counted and (rank, at) == (cell.victim, cell.victim // PROCS)
    return Outcome(cell, counted, right, said, seconds, load())


def load() -> float:
    return os.getloadavg()[0]


def prepare(cluster: Any, node: RealNode, namespace: str) -> str:
    """A namespace of its own: restricted Pod Security, a Ready Environment ``pytorch``."""
    cluster.create_namespace(namespace)  # 409 (there already) is fine
    cluster.kubectl("label", "--overwrite", "namespace", namespace, f"{RESTRICTED}=restricted")
    k8s.create(environment("pytorch", namespace, image=node.images["pytorch"].ref))
    wait_status(k8s.ENVIRONMENTS, namespace, "pytorch", lambda s: s.get("phase") == "Ready")
    return namespace


@contextmanager
def real_node(parallel: int, stall: int) -> Iterator[Callable[[Cell], Outcome]]:
    """The control plane, the real node and the operator, and ``parallel`` namespaces;
    yields ``one(cell)``, which runs one TrainingRun of the cell in a free namespace (safe
    to call from ``parallel`` threads at once)."""
    with operator_on_real_node("why-matrix-0") as (cluster, node):
        slots: queue.Queue[str] = queue.Queue()
        for i in range(parallel):
            slots.put(prepare(cluster, node, f"why-matrix-{i}"))
        numbers = itertools.count()
        lock = threading.Lock()

        def one(cell: Cell) -> Outcome:
            namespace = slots.get()
            with lock:
                name = f"{cell.shape}-{cell.fault}-{cell.place}-{next(numbers)}"
            try:
                return once(node, namespace, name, cell, stall)
            except Exception as err:  # an API error or a Pod that never went: not counted
                return Outcome(cell, False, False, f"NOT COUNTED ({name}: {err})", 0.0, load())
            finally:
                slots.put(namespace)

        yield one
