"""``torchyard sweep submit FILE --local`` as a user runs it: a Sweep's trials run on this
machine through the local runner, with the cluster's sampling (the same parameters for the
same seed), early termination (the same bandit decision), best trial and registerBest.

The trial is a tiny script: its accuracy per epoch is a function of its parameters, it
writes what it received (arguments, variables) and when it ran to ./outputs, and a trial
the test expects the policy to stop waits after its last epoch until it is stopped (so
that the test waits for the decision instead of racing it)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Local
from torchyard.sweeps import sampling, space
from torchyard.sweeps.stopping import Goal
from torchyard.tuning import bayesian

TRAIN = """\
import argparse, json, os, pathlib, sys, time
from torchyard import progress
p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int)
p.add_argument("--wait_below", type=float, default=0.0)
p.add_argument("--learning_rate", type=float)
p.add_argument("--momentum", type=float, default=0.95)
a = p.parse_args()
out = pathlib.Path(os.environ["TORCHYARD_OUTPUTS"])
seen = {"argv": sys.argv[1:], "start": time.time(), "pid": os.getpid(),
        "env": {k: v for k, v in os.environ.items() if k.startswith("TORCHYARD_PARAM_")}}
(out / "seen.json").write_text(json.dumps(seen))
quality = 1 - 180 * abs(a.learning_rate - 0.0015) - 2 * abs(a.momentum - 0.95)
for epoch in range(1, a.epochs + 1):
    progress.report(epoch, a.epochs, best_val_acc=round(quality * (1 - 0.5 ** epoch), 6))
if quality < a.wait_below:
    time.sleep(120)  # to be stopped by the sweep's policy
(out / "model.pt").write_text(f"lr={a.learning_rate}")
seen["end"] = time.time()
(out / "seen.json").write_text(json.dumps(seen))
"""


def sweep_file(tmp: Path, spec: dict[str, Any]) -> Path:
    (tmp / "train.py").write_text(TRAIN)
    body = {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "Sweep",
        "metadata": {"name": "tiny"},
        "spec": {"objective": {"metric": "best_val_acc", "goal": "maximize"}, **spec},
    }
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def submit(local: Local, path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return local.command(["sweep", "submit", str(path)], *extra)


def seen(local: Local, trial: str) -> dict[str, Any]:
    path = local.registry / "default" / "runs" / trial / "outputs" / "seen.json"
    found: dict[str, Any] = json.loads(path.read_text())
    return found


def reported(local: Local, trial: str) -> list[float]:
    path = local.registry / "default" / "runs" / trial / "logs" / "node-0" / "metrics.jsonl"
    return [json.loads(line)["best_val_acc"] for line in path.read_text().splitlines()]


def rows(stdout: str) -> dict[str, list[str]]:
    """The trials table the command prints: trial -> its columns."""
    return {
        line.split()[0]: line.split() for line in stdout.splitlines() if line.startswith("tiny-t")
    }


def test_a_grid_sweep_stops_the_trial_bandit_gives_up_on_and_registers_the_best(
    local: Local,
) -> None:
    path = sweep_file(
        local.tmp,
        {
            "trial": {
                "environment": "local",
                "command": ["python", "train.py", "--epochs", "4", "--wait_below", "0.9"],
            },
            "parameters": {"learning_rate": {"type": "choice", "values": [0.0015, 0.004, 0.0013]}},
            "sampling": "grid",
            "maxTotalTrials": 3,
            "earlyTermination": {
                "type": "bandit",
                "slackFactor": 0.05,
                "evaluationInterval": 1,
                "delayEvaluation": 1,
            },
            "registerBest": {"model": "tiny", "path": "outputs/model.pt"},
        },
    )
    done = submit(local, path)
    assert done.returncode == 0, done.stderr
    assert "Sweep tiny succeeded" in done.stdout, done.stdout
    table = rows(done.stdout)
    assert {name: r[1] for name, r in table.items()} == {
        "tiny-t0": "Completed",
        "tiny-t1": "Stopped",
        "tiny-t2": "Completed",
    }
    assert "trial tiny-t1 stopped: " in done.stderr and "slack factor 0.05" in done.stderr
    assert seen(local, "tiny-t1")["argv"][-2:] == ["--learning_rate", "0.004"]
    assert "end" not in seen(local, "tiny-t1")  # stopped while it waited
    # the best is t0 (learning_rate 0.0015), registered from its outputs
    assert next(iter(table)) == "tiny-t0"
    assert float(table["tiny-t0"][2]) == max(reported(local, "tiny-t0"))
    model = local.registry / "default" / "models" / "tiny" / "1" / "model.pt"
    assert model.read_text() == "lr=0.0015"
    assert "model: tiny version 1" in done.stdout


SHAPES = """\
import argparse, sys
from torchyard import progress
p = argparse.ArgumentParser()
p.add_argument("--shape")
shape = p.parse_args().shape
curves = {
    "rises": [0.5 + 0.02 * e for e in range(1, 21)],  # its best at its last interval, 20
    "peaks": [0.6, 0.7, 0.8, 0.85, 0.8, 0.7],  # its best at interval 4
    "crashes": [0.92, 0.95, 0.95],  # the best value of all, then it crashes
}
for epoch, value in enumerate(curves[shape], 1):
    progress.report(epoch, best_val_acc=round(value, 6))
if shape == "crashes":
    print("objective crashed on purpose", flush=True)
    sys.exit(3)
print("trained", shape, flush=True)
"""


@pytest.mark.parametrize(
    ("shapes", "best"),
    [
        (["rises", "peaks"], "tiny-t0, best_val_acc 0.9 at interval 20"),
        (["peaks"], "tiny-t0, best_val_acc 0.85 at interval 4"),
        (["peaks", "rises", "crashes"], "tiny-t2 (Failed), best_val_acc 0.95 at interval 2"),
    ],
)
def test_the_summary_names_the_best_where_it_peaked_and_a_failed_best_as_failed(
    local: Local, shapes: list[str], best: str
) -> None:
    """Two trials at a time: each line of a trial's output starts with its name; the best
    (any state, as HyperDrive's get_best_run_by_primary_metric) is named with the interval
    it peaked at, and registerBest says when it takes another (the best completed)."""
    (local.tmp / "shapes.py").write_text(SHAPES)
    path = sweep_file(
        local.tmp,
        {
            "trial": {"environment": "local", "command": ["python", "shapes.py"]},
            "parameters": {"shape": {"type": "choice", "values": shapes}},
            "sampling": "grid",
            "maxTotalTrials": len(shapes),
            "maxFailedTrials": 1,
            "registerBest": {"model": "shapes", "path": "outputs"},
        },
    )
    done = submit(local, path, "--parallel", "2")
    assert done.returncode == 0, done.stderr
    assert f"all {len(shapes)} trials ended; the best is {best}" in done.stdout, done.stdout
    failed = "crashes" in shapes
    registers = "; registerBest takes the best completed trial, tiny-t1 (best_val_acc 0.9)"
    assert (registers in done.stdout) is failed, done.stdout
    assert rows(done.stdout)["tiny-t2" if failed else "tiny-t0"][1] == (
        "Failed" if failed else "Completed"
    )
    # whose line it is, though two trials write at once
    for index, shape in enumerate(shapes):
        words = "objective crashed on purpose" if shape == "crashes" else f"trained {shape}"
        lines = [line for line in done.stdout.splitlines() if words in line]
        assert lines == [f"[tiny-t{index}] [rank 0] {words}"], done.stdout
    started = sorted(line for line in done.stderr.splitlines() if "] node 0 started" in line)
    assert [line.split()[0] for line in started] == [
        f"[tiny-t{index}]" for index in range(len(shapes))
    ], done.stderr


def test_random_trials_get_the_clusters_parameters_at_most_parallel_at_a_time(
    local: Local,
) -> None:
    parameters = {
        "learning_rate": {"type": "uniform", "minValue": 0.0005, "maxValue": 0.005},
        "momentum": {"type": "uniform", "minValue": 0.9, "maxValue": 0.99},
    }
    path = sweep_file(
        local.tmp,
        {
            "trial": {"environment": "local", "command": ["python", "train.py", "--epochs", "2"]},
            "parameters": parameters,
            "maxTotalTrials": 5,
            "seed": 11,
        },
    )
    done = submit(local, path, "--parallel", "2")
    assert done.returncode == 0, done.stderr
    searched = space.parse_space(parameters)
    spans = []
    for i in range(5):
        got = seen(local, f"tiny-t{i}")
        expected = sampling.random_trial(searched, 11, i)
        assert got["argv"] == ["--epochs", "2", *sampling.arguments(expected)]
        assert got["env"] == sampling.environment(expected)
        spans.append((got["start"], got["end"]))
    for start, _ in spans:  # at no trial's start were more than 2 running
        assert sum(1 for s, e in spans if s <= start < e) <= 2
    assert set(rows(done.stdout)) == {f"tiny-t{i}" for i in range(5)}


def test_bayesian_trials_one_at_a_time_are_what_tpe_gives_for_the_results_before_them(
    local: Local,
) -> None:
    parameters = {"learning_rate": {"type": "uniform", "minValue": 0.0005, "maxValue": 0.005}}
    path = sweep_file(
        local.tmp,
        {
            "trial": {"environment": "local", "command": ["python", "train.py", "--epochs", "2"]},
            "parameters": parameters,
            "sampling": "bayesian",
            "maxTotalTrials": 4,
            "seed": 5,
        },
    )
    done = submit(local, path)
    assert done.returncode == 0, done.stderr
    searched = space.parse_space(parameters)
    results: list[bayesian.Result] = []
    for i in range(4):
        expected = bayesian.suggest(searched, Goal.MAXIMIZE, 5, i, results)
        assert seen(local, f"tiny-t{i}")["argv"][2:] == sampling.arguments(expected)
        results.append(bayesian.Result(expected, max(reported(local, f"tiny-t{i}")), ended=True))


def test_sigterm_stops_every_trial_and_leaves_no_process(local: Local) -> None:
    path = sweep_file(
        local.tmp,
        {
            "trial": {
                "environment": "local",
                "command": ["python", "train.py", "--epochs", "1", "--wait_below", "2"],
            },
            "parameters": {"learning_rate": {"type": "choice", "values": [0.001, 0.002]}},
            "sampling": "grid",
            "maxTotalTrials": 2,
        },
    )
    cli = subprocess.Popen(
        [sys.executable, "-m", "torchyard", "sweep", "submit", str(path), "--local",
         "--parallel", "2", "--registry", str(local.registry), "--workdir", str(local.workdir)],
        cwd=local.tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    pids: list[int] = []
    while len(pids) < 2:  # both trials running (each wrote its pid)
        assert cli.poll() is None and time.monotonic() < deadline, cli.communicate()
        time.sleep(0.1)
        with contextlib.suppress(ValueError):  # one being written
            pids = [
                json.loads(p.read_text())["pid"]
                for p in local.workdir.glob("*/node-0/outputs/seen.json")
            ]
    cli.send_signal(signal.SIGTERM)
    _, err = cli.communicate(timeout=120)
    assert cli.returncode != 0
    assert "SIGTERM received: stopping every trial" in err, err
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
