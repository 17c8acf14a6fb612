"""Runs that survive, repeated on a REAL node: kill anywhere, and graceful deletions.

The deterministic toy of tests/node/test_checkpoints.py (2 node Pods x 1 rank, gloo,
float64, a checkpoint every 5 steps through ``torchyard.checkpoint``; here each save
takes ``--save-seconds`` before its ``done``, so that a kill can land in one) runs on the
harness's real kubelet node (tests/cluster/realnode.py), each repetition its own
TrainingRun with its own created claim (a host-path volume of its own):

  - kill anywhere (``--kills``, default 20): node 1's launcher is SIGKILLed from the host
    after a random step (6..20; every other one right after the ranks reported a step that
    saves, so that the kill lands during that save). The gang restarts and must resume
    from the newest complete checkpoint at the kill (or one completed in its last moment),
    never a partial one, lose at most one interval, and its losses for the next 50 steps
    must equal the uninterrupted run's (computed here) to 1e-6;
  - graceful deletion (``--deletions``, default 10): node Pod 1 is deleted (its own
    terminationGracePeriodSeconds, 20 s); the ranks save just in time and the restart
    must resume at or after the step SIGTERM arrived at (at most 1 step lost), without
    using backoffLimit (0 here), and match the reference to 1e-6.

It prints one line per repetition and a summary with the issue's criteria (every kill
resumes from the newest complete checkpoint; at least 9 of 10 deletions save at or after
SIGTERM), and the load average beside the figures. Every Pod must have run on the real
node (``spec.nodeName``); the losses and resume steps are read from the kubelet
(``pods/log``). It takes the real-node lock itself; not the benchmark lock, since what it
prints are counts, steps and losses, not timings that other load would skew.

    .venv/bin/python benchmarks/survive.py [--kills 20] [--deletions 10] [--seed N]

Needs root and the real node's set-up (``make node`` once, cached); one real node per
machine.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "operator"),
]

from benchmarks import record  # noqa: E402
from tests.builders import environment  # noqa: E402
from tests.cluster.binaries import KUBERNETES_VERSION  # noqa: E402
from tests.cluster.harness import Cluster  # noqa: E402
from tests.cluster.realnode import NodeError, RealNode  # noqa: E402
from tests.cluster.session import operator_on_real_node  # noqa: E402
from tests.node import test_checkpoints as toy  # noqa: E402

from torchyard import checkpoint, k8s  # noqa: E402

NS = "survive"
LOCKS = ("/tmp/torchyard-node-tests.lock",)
COMPARED = 50  # steps after the resume compared with the reference
STEPS = 75  # per run: the latest resume (about step 21) + 50, and a little more
GRACE = 20
TOLERANCE = 1e-6
# The toy, with a save that takes SAVE_SECONDS between its files and its ``done``.
TOY = toy.TOY.replace(
    "        checkpoint.done(step)",
    '        time.sleep(float(os.environ.get("SAVE_SECONDS", "0")))\n        checkpoint.done(step)',
)
assert TOY != toy.TOY


class BenchError(Exception):
    """A repetition went wrong in a way that is not a measured outcome; says what."""


@dataclass
class Outcome:
    kind: str  # "kill" or "deletion"
    at: int  # the highest step reported when the kill / SIGTERM came
    resumed: int
    newest_before: int | None  # the newest complete checkpoint then
    during_save: bool  # a newer step-N folder lacked a rank's .done then
    complete_after: list[int]
    max_diff: float
    compared: int
    failed_attempts: int
    restarts: int

    @property
    def lost(self) -> int:
        """Steps done before the kill / SIGTERM that the resumed run does again."""
        return max(0, self.at - self.resumed)

    @property
    def from_newest(self) -> bool:
        """Resumed from a checkpoint that is complete (sizes and sha256 checked) and at
        least as new as the newest complete one at the kill."""
        newest = self.newest_before if self.newest_before is not None else 0
        return self.resumed >= newest and (self.resumed in self.complete_after or not newest)

    @property
    def ok(self) -> bool:
        matches = self.max_diff < TOLERANCE and self.compared >= COMPARED
        if self.kind == "kill":
            return self.from_newest and self.lost <= toy.INTERVAL and matches
        return self.resumed >= self.at and self.failed_attempts == 0 and matches


@contextlib.contextmanager
def locks() -> Iterator[None]:
    """The real-node lock (blocking), held throughout."""
    files = []
    try:
        for path in LOCKS:
            f = open(path, "a")  # noqa: SIM115
            print(f"survive: waiting for {path}", file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
            files.append(f)
        yield
    finally:
        for f in reversed(files):
            f.close()


def wait(what: str, check: Any, timeout: float, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class Volumes:
    """One host-path PersistentVolume (and folder) per run, of a storage class of its own."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.made: list[tuple[str, Path]] = []

    def make(self, name: str) -> tuple[str, Path]:
        klass = f"survive-{name}"
        path = Path("/tmp") / f"torchyard-{klass}-{os.getpid()}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(mode=0o777)
        path.chmod(0o777)  # the ranks run as user 1000
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": klass},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                "storageClassName": klass,
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(path), "type": "Directory"},
            },
        }
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(pv))
        self.made.append((klass, path))
        return klass, path

    def clean(self) -> None:
        for klass, path in self.made:
            self.cluster.kubectl("delete", "pv", klass, "--wait=false", check=False)
            shutil.rmtree(path, ignore_errors=True)


def run_body(name: str, node: RealNode, klass: str, save_seconds: float, **policy: Any) -> Any:
    body = toy.toy_run(name, NS, node, klass, STEPS, **policy)
    body["spec"]["command"] = ["python", "-c", TOY]
    body["spec"]["env"].append({"name": "SAVE_SECONDS", "value": str(save_seconds)})
    # Keep every complete checkpoint: the one resumed from is then still there to check.
    body["spec"]["checkpoints"]["keep"] = 1000
    return body


def finished(name: str, timeout: float = 420) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        run = k8s.get(k8s.TRAININGRUNS, NS, name)
        return run if run.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    result: dict[str, Any] = wait(f"TrainingRun {name} to finish", done, timeout, 0.5)
    return result


def on_real_node(name: str, node: RealNode) -> None:
    pods = k8s.list_(k8s.PODS, NS, label_selector=f"torchyard.dev/run={name}")
    if len(pods) != 2:
        raise BenchError(f"{name}: expected 2 node Pods, found {len(pods)}")
    for pod in pods:
        if pod["spec"].get("nodeName") != node.name:
            raise BenchError(f"{pod['metadata']['name']} ran on {pod['spec'].get('nodeName')!r}")


def outcome(
    kind: str,
    cluster: Cluster,
    node: RealNode,
    name: str,
    host: Path,
    at: int,
    newest_before: int | None,
    during_save: bool,
    reference: dict[int, float],
) -> Outcome:
    run = finished(name)
    if run["status"]["phase"] != "Succeeded":
        raise BenchError(f"{name} ended {run['status']['phase']}: {run['status'].get('failure')}")
    on_real_node(name, node)
    resumed, losses = toy.final_losses(cluster, NS, name)
    compared = range(resumed + 1, min(STEPS, resumed + COMPARED) + 1)
    diffs = [abs(losses[s] - reference[s]) for s in compared if s in losses]
    return Outcome(
        kind,
        at,
        resumed,
        newest_before,
        during_save,
        checkpoint.complete_steps(str(host)),
        max(diffs) if len(diffs) == len(compared) else float("inf"),
        len(diffs),
        int(run["status"].get("failedAttempts") or 0),
        int(run["status"].get("restarts") or 0),
    )


def kill_once(
    cluster: Cluster, node: RealNode, volumes: Volumes, i: int, rng: random.Random, save: float
) -> Outcome:
    name = f"kill-{i}"
    klass, host = volumes.make(name)
    k8s.create(run_body(name, node, klass, save, backoffLimit=3))
    in_save = i % 2 == 1  # every other kill right after a step that saves
    step = rng.randint(6, 20)
    if in_save:
        step = max(toy.INTERVAL * 2, step - step % toy.INTERVAL)
    wait(f"{name}: both ranks at step {step}", lambda: toy.reported(host) >= step, 300)
    pid = toy.launcher_pid(NS, name, 1)
    if pid is None:
        raise BenchError(f"{name}: node 1's launcher not found under /proc")
    os.kill(pid, signal.SIGKILL)
    at = max(checkpoint.reported(str(host)).values())
    complete = checkpoint.complete_steps(str(host), verify=False)
    newest = complete[-1] if complete else None
    # A save under way: a newer step-N/ that some rank had not said done for yet.
    partial = [
        s
        for s in checkpoint.steps(str(host))
        if (newest is None or s > newest) and not checkpoint.ranks_done(s, 2, str(host))
    ]
    return outcome(
        "kill", cluster, node, name, host, at, newest, bool(partial), toy.reference_losses(STEPS)
    )


def delete_once(cluster: Cluster, node: RealNode, volumes: Volumes, i: int, save: float) -> Outcome:
    name = f"delete-{i}"
    klass, host = volumes.make(name)
    body = run_body(name, node, klass, save, backoffLimit=0, terminationGracePeriodSeconds=GRACE)
    k8s.create(body)
    wait(f"{name}: both ranks past step 8", lambda: toy.reported(host) >= 8, 300)
    at = max(checkpoint.reported(str(host)).values())
    complete = checkpoint.complete_steps(str(host), verify=False)
    cluster.kubectl("delete", "pod", f"{name}-1", "-n", NS, "--wait=false")
    return outcome(
        "deletion",
        cluster,
        node,
        name,
        host,
        at,
        complete[-1] if complete else None,
        False,
        toy.reference_losses(STEPS),
    )


def line(o: Outcome, seconds: float) -> str:
    return (
        f"  {o.kind:8s} at step {o.at:3d}: resumed from {o.resumed:3d} (lost {o.lost:2d}; "
        f"newest complete then {o.newest_before}, during a save {o.during_save}), "
        f"{o.compared} steps max |loss - reference| {o.max_diff:.1e}, restarts {o.restarts}, "
        f"failedAttempts {o.failed_attempts} -> {'ok' if o.ok else 'NOT OK'} ({seconds:.0f}s)"
    )


def record_outcomes(rec: record.Record, kills: list[Outcome], deletions: list[Outcome]) -> None:
    """Every repetition, and the counts :func:`summary` prints, into the results file."""
    for o in [*kills, *deletions]:
        rec.round(
            kind=o.kind,
            at_step=o.at,
            resumed_at=o.resumed,
            steps_lost=o.lost,
            during_save=o.during_save,
            from_newest=o.from_newest,
            max_loss_diff=o.max_diff,
            failed_attempts=o.failed_attempts,
            ok=o.ok,
        )
    if kills:
        rec.figure(
            "kill anywhere: resumed from the newest complete checkpoint",
            f"{sum(o.from_newest for o in kills)}/{len(kills)}",
            target="all",
            met=all(o.from_newest for o in kills),
        )
        rec.figure("kill anywhere: killed during a save", sum(o.during_save for o in kills))
        rec.figure(
            "kill anywhere: most steps lost",
            max(o.lost for o in kills),
            "steps",
            target=f"<= {toy.INTERVAL} (the interval)",
            met=max(o.lost for o in kills) <= toy.INTERVAL,
        )
        rec.figure(
            f"kill anywhere: losses equal to the uninterrupted run's for {COMPARED} steps",
            f"{sum(o.max_diff < TOLERANCE for o in kills)}/{len(kills)}",
            target=f"all, to {TOLERANCE:g}",
            met=all(o.max_diff < TOLERANCE for o in kills),
        )
    if deletions:
        saved = sum(o.resumed >= o.at for o in deletions)
        rec.figure(
            "graceful deletion: saved just in time (at or after the step SIGTERM came at)",
            f"{saved}/{len(deletions)}",
            target=">= 90 %",
            met=saved >= 0.9 * len(deletions),
        )
        rec.figure("graceful deletion: most steps lost", max(o.lost for o in deletions), "steps")
        rec.figure(
            "graceful deletion: backoffLimit untouched",
            f"{sum(o.failed_attempts == 0 for o in deletions)}/{len(deletions)}",
            target="all",
            met=all(o.failed_attempts == 0 for o in deletions),
        )
        rec.figure(
            "graceful deletion: losses equal to the uninterrupted run's",
            f"{sum(o.max_diff < TOLERANCE for o in deletions)}/{len(deletions)}",
            target="all",
            met=all(o.max_diff < TOLERANCE for o in deletions),
        )


def summary(kills: list[Outcome], deletions: list[Outcome]) -> bool:
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (shared machine)")
    good = True
    if kills:
        newest = sum(o.from_newest for o in kills)
        in_save = sum(o.during_save for o in kills)
        print(
            f"kill anywhere: {newest}/{len(kills)} resumed from the newest complete checkpoint "
            f"({in_save} killed during a save), max steps lost "
            f"{max(o.lost for o in kills)} (interval {toy.INTERVAL}), "
            f"{sum(o.max_diff < TOLERANCE for o in kills)}/{len(kills)} matched the reference "
            f"to {TOLERANCE:g} for {COMPARED} steps; all ok: {all(o.ok for o in kills)}"
        )
        good = good and all(o.ok for o in kills)
    if deletions:
        saved = sum(o.resumed >= o.at for o in deletions)
        print(
            f"graceful deletion: {saved}/{len(deletions)} saved at or after the step SIGTERM "
            f"arrived at (needed: 90%), max steps lost {max(o.lost for o in deletions)}, "
            f"backoffLimit untouched {sum(o.failed_attempts == 0 for o in deletions)}"
            f"/{len(deletions)}, {sum(o.max_diff < TOLERANCE for o in deletions)}"
            f"/{len(deletions)} matched the reference"
        )
        good = (
            good
            and saved >= 0.9 * len(deletions)
            and all(o.failed_attempts == 0 and o.max_diff < TOLERANCE for o in deletions)
        )
    return good


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--deletions", type=int, default=10)
    parser.add_argument("--save-seconds", type=float, default=1.0, help="each save's length")
    parser.add_argument("--seed", type=int, default=None)
    record.add_argument(parser)
    args = parser.parse_args()
    rec = record.Record("survive", args)
    rec.version("kubernetes", KUBERNETES_VERSION)
    if args.kills < 0 or args.deletions < 0 or args.kills + args.deletions == 0:
        parser.error("--kills and --deletions must be >= 0, and not both 0")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    rng = random.Random(seed)
    kills: list[Outcome] = []
    deletions: list[Outcome] = []
    with locks():
        try:
            with operator_on_real_node(NS) as (cluster, node):
                volumes = Volumes(cluster)
                try:
                    k8s.create(environment("pytorch", NS, image=node.images["pytorch"].ref))
                    print(f"survive: {args.kills} kills, {args.deletions} deletions, seed {seed}")
                    for i in range(args.kills):
                        started = time.monotonic()
                        kills.append(kill_once(cluster, node, volumes, i, rng, args.save_seconds))
                        print(line(kills[-1], time.monotonic() - started), flush=True)
                    for i in range(args.deletions):
                        started = time.monotonic()
                        deletions.append(delete_once(cluster, node, volumes, i, args.save_seconds))
                        print(line(deletions[-1], time.monotonic() - started), flush=True)
                finally:
                    volumes.clean()
        except (BenchError, NodeError) as err:
            print(f"survive: {err}", file=sys.stderr)
            return 1
    good = summary(kills, deletions)
    rec.note(f"seed {seed}")
    record_outcomes(rec, kills, deletions)
    rec.write()
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
