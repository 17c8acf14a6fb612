"""A 64-trial Sweep (8 at a time, on KWOK GPU capacity) while the operator process
(``python -m torchyard.controller``, the chart's ServiceAccount) is SIGKILLed at random
moments, at least 10 times: every trial is made once and run once (one TrainingRun per
index, never deleted and made again, one Pod each), none is lost, each has the parameters
its seed and index give, never more than 8 hold a place, and the sweep ends Succeeded
naming the trial that reported the best metric.

The harness drives each running trial as ``test_sweeps`` does: its metric written as the
progress poll would (until the Sweep's ledger holds it), then its Pod ended by KWOK. A kill
lands a random moment (0 to 0.5 s) after a random one of those 128 steps, while the
operator is reacting to it: making the next trial, writing the ledger, ending a run. The
seed of the kill points is printed; ``TORCHYARD_KILL_SEED`` replays them.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.builders import SweepBuilder, TrainingRunBuilder, environment
from tests.cluster import chart
from tests.cluster.harness import Cluster
from tests.integration.helpers import OperatorProcess, finish_pod, run_pods, wait_status
from tests.integration.test_operator import namespaced_operator  # noqa: F401 (a fixture)
from tests.integration.test_sweeps import (
    EPOCHS,
    PARAMETERS,
    SEED,
    accuracy,
    holding,
    ledger,
    report,
    trial_runs,
)
from torchyard import k8s
from torchyard.api import wire
from torchyard.sweeps import sampling, space

TRIALS = 64
AT_ONCE = 8
KILLS = 10
SWEEP = "many"


class Killer:
    """The operator process, SIGKILLed after the chosen steps and started again at once."""

    def __init__(self, kubeconfig: Path, namespace: str, logs: Path, seed: int) -> None:
        self.kubeconfig, self.namespace, self.logs = kubeconfig, namespace, logs
        self.rng = random.Random(seed)
        self.at = set(self.rng.sample(range(1, 2 * TRIALS - 1), KILLS))
        self.step = 0
        self.kills: list[int] = []
        self.proc = self._start()

    def _start(self) -> OperatorProcess:
        log = self.logs / f"operator-{len(self.kills)}.log"
        return OperatorProcess(self.kubeconfig, log, "--namespace", self.namespace)

    def done(self, _: str) -> None:
        """One harness step is done; the operator dies a random moment later if chosen."""
        self.step += 1
        assert self.proc.process.poll() is None, "the operator exited by itself"
        if self.step not in self.at:
            return
        time.sleep(self.rng.uniform(0, 0.5))  # where in its reaction the kill lands
        self.proc.process.kill()  # SIGKILL: no handler runs, no request is finished
        self.proc.process.wait(10)
        self.proc.stop()
        self.kills.append(self.step)
        self.proc = self._start()

    def text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.logs.glob("*.log")))


def drive(cluster: Cluster, ns: str, killer: Killer) -> tuple[dict[str, Any], dict[str, Any]]:
    """Drive every trial to its end, watching that none is made twice and at most 8 hold a
    place; the ended Sweep and what the harness saw (``uids``, ``pods``, ``reported``)."""
    uids: dict[str, str] = {}  # trial -> the uid of its TrainingRun, first seen
    pods: dict[str, str] = {}  # trial -> the uid of the one Pod it ran
    reported: dict[str, float] = {}
    deadline = time.monotonic() + 900
    while True:
        sweep = k8s.get(k8s.SWEEPS, ns, SWEEP)
        if (sweep.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return sweep, {"uids": uids, "pods": pods, "reported": reported}
        assert time.monotonic() < deadline, json.dumps(sweep.get("status"), indent=1)
        runs = trial_runs(ns, SWEEP)
        for name, run in runs.items():
            uid = run["metadata"]["uid"]
            assert uids.setdefault(name, uid) == uid, f"{name} was made a second time"
        assert len(holding(runs)) <= AT_ONCE, holding(runs)
        ready = sorted(
            (name for name, r in runs.items() if name not in reported and _running(r)),
            key=lambda n: int(n.rsplit("-t", 1)[1]),
        )
        if not ready:
            time.sleep(0.2)  # polling for the next trial to run (nothing is asserted on it)
            continue
        for name in ready:
            _run_trial(cluster, ns, runs[name], reported, pods, killer.done)
            if (r := k8s.get_or_none(k8s.TRAININGRUNS, ns, name)) is not None:
                assert r["metadata"]["uid"] == uids[name], f"{name} was made a second time"


def _running(run: dict[str, Any]) -> bool:
    return (run.get("status") or {}).get("phase") == "Running"


def _run_trial(
    cluster: Cluster,
    ns: str,
    run: dict[str, Any],
    reported: dict[str, float],
    pods: dict[str, str],
    done: Callable[[str], None],
) -> None:
    """The trial's metric reported (until the Sweep saw it), then its one Pod ended."""
    name = run["metadata"]["name"]
    parameters = json.loads(run["metadata"]["annotations"][wire.ANNOTATION_PARAMETERS])
    value = accuracy(parameters, EPOCHS)
    assert report(ns, SWEEP, name, EPOCHS, value), f"{name} was stopped (no policy stops)"
    reported[name] = value
    done(f"{name} reported")
    [pod] = run_pods(ns, name)
    pods[name] = pod["metadata"]["uid"]
    finish_pod(cluster, ns, pod["metadata"]["name"], 0)
    done(f"{name} ended")


def test_sigkills_mid_sweep_lose_no_trial_start_none_twice_and_keep_the_parameters(
    cluster: Cluster,
    namespace: str,
    stopped_operator: None,
    namespaced_operator: Path,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    ns = namespace
    seed = int(os.environ.get("TORCHYARD_KILL_SEED") or random.randrange(1 << 30))
    k8s.create(environment("pytorch", ns, image="ghcr.io/acme/pytorch:2.15-cuda12"))
    killer = Killer(namespaced_operator, ns, tmp_path, seed)
    try:
        wait_status(k8s.ENVIRONMENTS, ns, "pytorch", lambda s: s.get("phase") == "Ready", 60)
        trial = TrainingRunBuilder("t").environment("pytorch").gpus(1).pool("a100")
        trial = trial.command("python", "pytorch_train.py", "--num_epochs", str(EPOCHS))
        k8s.create(SweepBuilder(SWEEP, ns).trial(trial).trials(TRIALS, AT_ONCE).seed(SEED).obj())
        sweep, saw = drive(cluster, ns, killer)
        assert killer.proc.process.poll() is None, killer.proc.text()[-3000:]
    except AssertionError as err:
        raise AssertionError(
            f"{err}\n(seed {seed}, kills after steps {killer.kills})\n--- operator log:\n"
            f"{killer.proc.text()[-3000:]}"
        ) from None
    finally:
        killer.proc.stop()
    assert len(killer.kills) == KILLS, killer.kills
    names = [f"{SWEEP}-t{i}" for i in range(TRIALS)]
    status = sweep["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    # every trial made once, with the parameters of (seed, index), and run once
    runs = trial_runs(ns, SWEEP)
    assert sorted(runs) == sorted(names)
    assert sorted(saw["reported"]) == sorted(names)
    assert {n: r["metadata"]["uid"] for n, r in runs.items()} == saw["uids"]
    searched = space.parse_space(PARAMETERS)
    for i, name in enumerate(names):
        annotation = runs[name]["metadata"]["annotations"][wire.ANNOTATION_PARAMETERS]
        assert json.loads(annotation) == sampling.random_trial(searched, SEED, i), name
        assert runs[name]["status"]["phase"] == "Succeeded", name
        assert {p["metadata"]["uid"] for p in run_pods(ns, name)} <= {saw["pods"][name]}, name
    entries = ledger(ns, SWEEP)
    assert sorted(entries) == sorted(f"t{i}" for i in range(TRIALS))
    assert {e["state"] for e in entries.values()} == {"Completed"}
    # the sweep's account of them, and the best trial
    assert status["trials"]["completed"] == TRIALS
    assert status["trials"]["done"] == TRIALS
    best = max(saw["reported"], key=lambda n: saw["reported"][n])
    assert status["best"]["name"] == best
    assert status["best"]["metric"] == saw["reported"][best]
    forbidden = chart.forbidden_lines(killer.text())
    assert forbidden == [], "\n".join(forbidden)
    print(f"\n[sweep kill test] seed {seed}: SIGKILLs after steps {sorted(killer.kills)}")
