"""Sweeps on the real control plane (KWOK nodes), the trials finished by the harness.

The guide's notebook tunes the birds model with HyperDrive: random sampling of
learning_rate uniform(0.0005, 0.005) and momentum uniform(0.9, 0.99), best_val_acc
maximized, 8 trials, 4 at a time, a Bandit policy (slack factor 0.15, evaluation interval
1; delay 3 here instead of 10, to keep the trials short). Here that Sweep runs: each trial
TrainingRun's progress is written as the operator's progress poll would write it (a KWOK
Pod has no log to read), one step at a time, with a metric that is a function of the
trial's own parameters, and its Pod ended by KWOK. Never more than 4 trials hold a place,
8 are made with the parameters the seed gives, a trial the policy stops has its gang
stopped (its Pods gone) while its record stays, and the status names the best trial;
``kubectl get sw`` shows it. Bad input is refused by the apiserver naming the field, or
said in the Sweep's Accepted condition, and the operator neither fails nor loops on it
(``operator_errors`` fails a test on any ERROR the operator logs).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.builders import SweepBuilder, TrainingRunBuilder
from tests.cluster.harness import Cluster
from tests.conftest import InProcessOperator
from tests.integration.helpers import conditions, finish_pod, run_pods, wait_for, wait_status
from torchyard import api, k8s
from torchyard.api import wire
from torchyard.sweeps import sampling, space

SEED = 2026
EPOCHS = 5
PARAMETERS = SweepBuilder("x").obj()["spec"]["parameters"]


def notebook_sweep(name: str, namespace: str) -> dict[str, Any]:
    trial = (
        TrainingRunBuilder("trial")
        .environment("pytorch")
        .command("python", "pytorch_train.py", "--num_epochs", str(EPOCHS))
        .gpus(1)
        .pool("a100")
    )
    return SweepBuilder(name, namespace).trial(trial).seed(SEED).bandit(0.15, 1, 3).obj()


def accuracy(parameters: dict[str, Any], epoch: int) -> float:
    """best_val_acc after ``epoch``: the nearer learning_rate is to 0.0015 and momentum to
    0.95, the higher it climbs (a shipped family would do; this one is small)."""
    quality = 1.0 - 180 * abs(parameters["learning_rate"] - 0.0015)
    quality -= 2 * abs(parameters["momentum"] - 0.95)
    return round(quality * (1 - 0.5**epoch), 6)


def trial_runs(namespace: str, sweep: str) -> dict[str, dict[str, Any]]:
    runs = k8s.list_(k8s.TRAININGRUNS, namespace, label_selector=f"{wire.LABEL_SWEEP}={sweep}")
    return {r["metadata"]["name"]: r for r in runs}


def ledger(namespace: str, sweep: str) -> dict[str, Any]:
    found = k8s.get_or_none(k8s.CONFIGMAPS, namespace, f"{sweep}-trials") or {}
    return {key: json.loads(text) for key, text in (found.get("data") or {}).items()}


def holding(runs: dict[str, dict[str, Any]]) -> list[str]:
    """The trials that hold a place: not ended, and not stopped with their gang gone."""
    return sorted(
        name
        for name, r in runs.items()
        if (r.get("status") or {}).get("phase") not in ("Succeeded", "Failed", "Suspended")
    )


def report(namespace: str, sweep: str, trial: str, epoch: int, value: float) -> bool:
    """Write the trial's progress at ``epoch`` as the operator's progress poll would, until
    the Sweep's ledger holds it (a TrainingRun status write that raced with it may have
    put the step before back); False when the Sweep stopped the trial meanwhile."""
    index = trial.rsplit("-t", 1)[1]
    for _ in range(20):
        run = k8s.get(k8s.TRAININGRUNS, namespace, trial)
        if run["spec"].get("suspend"):
            return False
        k8s.apply_status(
            {
                "apiVersion": api.API_VERSION,
                "kind": "TrainingRun",
                "metadata": {"name": trial, "namespace": namespace},
                "status": {
                    "progress": {
                        "step": epoch,
                        "total": EPOCHS,
                        "metrics": {"best_val_acc": value},
                        "lastProgressTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    }
                },
            },
            field_manager="test-progress",
        )
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            history = ledger(namespace, sweep).get(f"t{index}", {}).get("history", [])
            if [epoch, value] in history:
                return True
            time.sleep(0.1)
    raise AssertionError(f"the Sweep never saw {trial} report epoch {epoch}")


def test_the_notebooks_sweep_runs_8_trials_4_at_a_time_and_names_the_best(
    cluster: Cluster, env: str
) -> None:
    ns = env
    k8s.create(notebook_sweep("hd", ns))
    searched = space.parse_space(PARAMETERS)
    reported: dict[str, float] = {}  # trial -> the best it reported
    stopped: list[str] = []
    driven: set[str] = set()
    most = 0
    deadline = time.monotonic() + 300
    while True:
        sweep = k8s.get(k8s.SWEEPS, ns, "hd")
        if (sweep.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            break
        assert time.monotonic() < deadline, json.dumps(sweep.get("status"), indent=1)
        runs = trial_runs(ns, "hd")
        most = max(most, len(holding(runs)))
        assert len(holding(runs)) <= 4, holding(runs)
        ready = sorted(
            name
            for name, r in runs.items()
            if name not in driven and (r.get("status") or {}).get("phase") == "Running"
        )
        if not ready:
            time.sleep(0.2)
            continue
        name = ready[0]
        driven.add(name)
        parameters = json.loads(runs[name]["metadata"]["annotations"][wire.ANNOTATION_PARAMETERS])
        for epoch in range(1, EPOCHS + 1):
            value = accuracy(parameters, epoch)
            if not report(ns, "hd", name, epoch, value):
                stopped.append(name)
                break
            reported[name] = value
        else:
            for pod in run_pods(ns, name):
                finish_pod(cluster, ns, pod["metadata"]["name"], 0)
            wait_status(k8s.TRAININGRUNS, ns, name, lambda s: s.get("phase") == "Succeeded")

    status = sweep["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    runs = trial_runs(ns, "hd")
    assert sorted(runs) == [f"hd-t{i}" for i in range(8)]
    assert most == 4
    # deterministic parameters: the seed's, as arguments and variables
    for i in range(8):
        run = runs[f"hd-t{i}"]
        parameters = sampling.random_trial(searched, SEED, i)
        assert json.loads(run["metadata"]["annotations"][wire.ANNOTATION_PARAMETERS]) == (
            parameters
        )
        assert run["spec"]["command"][-4:] == sampling.arguments(parameters)
        env_vars = {e["name"]: e["value"] for e in run["spec"]["env"]}
        assert (
            env_vars["TORCHYARD_PARAM_LEARNING_RATE"]
            == sampling.environment(parameters)["TORCHYARD_PARAM_LEARNING_RATE"]
        )
    # the policy stopped some: their gang is gone, their record stays
    assert stopped, "the bandit policy stopped no trial"
    for name in stopped:
        run = wait_status(k8s.TRAININGRUNS, ns, name, lambda s: s.get("phase") == "Suspended")
        annotations = run["metadata"]["annotations"]
        assert annotations[wire.ANNOTATION_DECISION] == "stopped"
        assert "slack factor 0.15" in annotations[wire.ANNOTATION_DECISION_REASON]
        assert run_pods(ns, name) == []
        assert run["status"]["progress"]["metrics"]["best_val_acc"] > 0
    assert status["trials"]["stopped"] == len(stopped)
    assert status["trials"]["completed"] == 8 - len(stopped)
    assert status["trials"]["done"] == 8
    best = max(reported, key=lambda n: reported[n])
    assert status["best"]["name"] == best
    assert status["best"]["metric"] == reported[best]
    assert conditions(sweep)["Succeeded"]["reason"] == "AllTrialsEnded"
    assert status["trialSeconds"]["spent"] > 0
    # kubectl get sw: the printer columns
    table = cluster.kubectl("get", "sw", "-n", ns).splitlines()
    assert table[0].split() == [
        "NAME", "PHASE", "DONE", "RUNNING", "STOPPED", "TOTAL", "BEST", "TRIAL", "AGE"
    ]  # fmt: skip
    row = table[1].split()
    assert row[:6] == ["hd", "Succeeded", "8", "0", str(len(stopped)), "8"]
    assert row[7] == best
    assert "sweep.torchyard.dev/hd" in cluster.kubectl("get", "torchyard", "-n", ns)


# -- bad input --------------------------------------------------------------------------

LR = {"type": "uniform", "minValue": 0.0005, "maxValue": 0.005}
REFUSED: list[tuple[str, SweepBuilder, str]] = [
    ("an empty space", SweepBuilder("bad").parameters(), "spec.parameters"),
    (
        "a bad parameter name",
        SweepBuilder("bad").parameters(**{"learning-rate": LR}),
        "every parameter name must be ASCII letters",
    ),
    (
        "an unknown expression",
        SweepBuilder("bad").parameters(lr={"type": "gaussian", "mu": 0, "sigma": 1}),
        "spec.parameters.lr.type",
    ),
    (
        "uniform without maxValue",
        SweepBuilder("bad").parameters(lr={"type": "uniform", "minValue": 0.1}),
        "spec.parameters[lr].maxValue: Invalid value: maxValue is required by uniform",
    ),
    (
        "minValue above maxValue",
        SweepBuilder("bad").parameters(lr={"type": "uniform", "minValue": 2, "maxValue": 1}),
        "spec.parameters[lr].minValue: Invalid value: minValue must be less than maxValue",
    ),
    ("a bad goal", SweepBuilder("bad").objective("best_val_acc", "highest"), "spec.objective.goal"),
    (
        "more concurrent than total trials",
        SweepBuilder("bad").trials(4, 8),
        "spec.maxConcurrentTrials",
    ),
    (
        "bayesian sampling",
        SweepBuilder("bad").with_("spec.sampling", "bayesian"),
        "bayesian sampling (Optuna's TPE) is not supported yet",
    ),
    (
        "asha",
        SweepBuilder("bad").with_("spec.earlyTermination", {"type": "asha"}),
        "spec.earlyTermination.type",
    ),
    (
        "a trial template a TrainingRun refuses",
        SweepBuilder("bad").trial(TrainingRunBuilder("t").procs(4).gpus(2)),
        "spec.trial.distribution.processCountPerNode",
    ),
    (
        "a name too long for its trials",
        SweepBuilder("b" * 47),
        "at most 46 characters",
    ),
]


@pytest.mark.parametrize(
    ("builder", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_bad_input_is_refused_at_admission_naming_the_field(
    cluster: Cluster, namespace: str, builder: SweepBuilder, message: str
) -> None:
    body = builder.obj()
    body["metadata"]["namespace"] = namespace
    with pytest.raises(k8s.ApiError) as err:
        k8s.create(body)
    assert err.value.invalid, err.value
    assert message in err.value.message
    with pytest.raises(api.InvalidSpec):  # the models refuse it too (the SDK, local mode)
        api.parse_sweep(body)


SAID: list[tuple[str, SweepBuilder, str]] = [
    (
        "a grid larger than maxTotalTrials",
        SweepBuilder("grid")
        .grid()
        .parameters(
            batch={"type": "choice", "values": [16, 32, 64]},
            lr={"type": "choice", "values": [0.1, 0.01, 0.001]},
        )
        .trials(8, 2),
        "spec.maxTotalTrials: the grid has 9 combinations (3 batch x 3 lr), more than "
        "maxTotalTrials 8",
    ),
    (
        "a loguniform bound that overflows",
        SweepBuilder("log").parameters(lr={"type": "loguniform", "minValue": 1, "maxValue": 800}),
        "spec.parameters.lr.maxValue: is a natural logarithm",
    ),
    (
        "a choice without values (CEL cannot read an array of mixed values)",
        SweepBuilder("choice").parameters(bs={"type": "choice"}),
        "spec.parameters.bs: values is required by choice",
    ),
    (
        "names that differ only in case",
        SweepBuilder("case").parameters(lr=LR, LR=LR),
        "would both be TORCHYARD_PARAM_LR",
    ),
]


@pytest.mark.parametrize(("builder", "message"), [s[1:] for s in SAID], ids=[s[0] for s in SAID])
def test_bad_input_admission_cannot_see_is_said_in_a_condition_once(
    env: str, operator: InProcessOperator, builder: SweepBuilder, message: str
) -> None:
    body = builder.obj()
    body["metadata"]["namespace"] = env
    name = body["metadata"]["name"]
    k8s.create(body)
    said = wait_status(
        k8s.SWEEPS,
        env,
        name,
        lambda s: conditions({"status": s}).get("Accepted", {}).get("reason") == "InvalidSpec",
    )
    accepted = conditions(said)["Accepted"]
    assert accepted["status"] == "False"
    assert message in accepted["message"]
    assert said["status"]["phase"] == "Failed"
    # said once: the operator's last reconcile saw the sweep as it is and nothing is due for
    # it (a later write would need an event it has not had); no trial made
    version = operator.caught_up("Sweep", env, name)
    assert k8s.get(k8s.SWEEPS, env, name)["metadata"]["resourceVersion"] == version
    assert trial_runs(env, name) == {}


def test_a_metric_no_trial_reports_is_said_once_trials_ended_without_it(
    cluster: Cluster, env: str
) -> None:
    ns = env
    body = (
        SweepBuilder("quiet", ns)
        .trial(TrainingRunBuilder("t").environment("pytorch").gpus(1).pool("a100"))
        .trials(1, 1)
        .seed(1)
        .obj()
    )
    k8s.create(body)
    wait_for(
        "the trial running",
        lambda: (
            (k8s.get_or_none(k8s.TRAININGRUNS, ns, "quiet-t0") or {}).get("status", {}).get("phase")
            == "Running"
        ),
    )
    progress = {"step": 3, "metrics": {"val_acc": 0.8}}
    message = json.dumps({"progress": progress})
    finish_pod(cluster, ns, "quiet-t0-0", 0, message)
    done = wait_status(
        k8s.SWEEPS, ns, "quiet", lambda s: s.get("phase") in ("Succeeded", "Failed"), timeout=60
    )
    missing = conditions(done)["MetricReported"]
    assert (missing["status"], missing["reason"]) == ("False", "MetricMissing")
    assert "none reported best_val_acc (their progress holds val_acc)" in missing["message"]
    assert done["status"]["phase"] == "Failed"
    assert conditions(done)["Failed"]["reason"] == "MetricMissing"


def test_deleting_a_sweep_takes_its_trials_and_ledger_with_it(env: str) -> None:
    ns = env
    k8s.create(
        SweepBuilder("gone", ns)
        .trial(TrainingRunBuilder("t").environment("pytorch").gpus(1).pool("a100"))
        .trials(2, 2)
        .obj()
    )
    wait_for("two trials", lambda: len(trial_runs(ns, "gone")) == 2)
    wait_for("the ledger", lambda: ledger(ns, "gone"))
    k8s.delete(k8s.SWEEPS, ns, "gone", propagation="Foreground")
    wait_for("the trials gone", lambda: not trial_runs(ns, "gone"), timeout=60)
    wait_for(
        "the ledger gone",
        lambda: k8s.get_or_none(k8s.CONFIGMAPS, ns, "gone-trials") is None,
        timeout=60,
    )


def test_the_search_space_and_the_objective_are_immutable(env: str) -> None:
    ns = env
    k8s.create(SweepBuilder("fixed", ns).trials(8, 1).obj())
    edits = {
        "parameters": {"lr": LR},
        "objective": {"metric": "loss", "goal": "minimize"},
        "sampling": "grid",
        "seed": 3,
    }
    k8s.rest.call(  # a seed to change first (immutable once set)
        "PATCH",
        k8s.SWEEPS.path(ns, "fixed"),
        body={"spec": {"seed": 1}},
        content_type="application/merge-patch+json",
    )
    for field, value in edits.items():
        with pytest.raises(k8s.ApiError) as err:
            k8s.rest.call(
                "PATCH",
                k8s.SWEEPS.path(ns, "fixed"),
                body={"spec": {field: value}},
                content_type="application/merge-patch+json",
            )
        assert err.value.invalid and f"spec.{field}" in err.value.message, err.value
        assert "is immutable: create another Sweep" in err.value.message
    # the limits may change: one more trial at a time
    k8s.rest.call(
        "PATCH",
        k8s.SWEEPS.path(ns, "fixed"),
        body={"spec": {"maxConcurrentTrials": 2}},
        content_type="application/merge-patch+json",
    )
    wait_for("a second trial", lambda: len(trial_runs(ns, "fixed")) == 2)


def test_an_operator_restart_makes_no_trial_twice_and_keeps_the_parameters(
    cluster: Cluster, env: str, operator: InProcessOperator
) -> None:
    ns = env
    trial = TrainingRunBuilder("t").environment("pytorch").gpus(1).pool("a100")
    k8s.create(SweepBuilder("again", ns).trial(trial).trials(4, 2).seed(SEED).obj())
    wait_for("two trials", lambda: sorted(trial_runs(ns, "again")) == ["again-t0", "again-t1"])
    operator.stop()
    operator.start()
    wait_status(k8s.TRAININGRUNS, ns, "again-t0", lambda s: s.get("phase") == "Running", 60)
    finish_pod(cluster, ns, "again-t0-0", 0)
    wait_for("a third trial", lambda: len(trial_runs(ns, "again")) == 3, timeout=60)
    operator.stop()
    operator.start()
    operator.caught_up("Sweep", ns, "again")
    runs = trial_runs(ns, "again")
    assert sorted(runs) == ["again-t0", "again-t1", "again-t2"]
    searched = space.parse_space(PARAMETERS)
    for i in range(3):
        annotation = runs[f"again-t{i}"]["metadata"]["annotations"][wire.ANNOTATION_PARAMETERS]
        assert json.loads(annotation) == sampling.random_trial(searched, SEED, i)
