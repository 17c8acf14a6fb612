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

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.builders import SweepBuilder, TrainingRunBuilder, environment, model_version
from tests.cluster.harness import Cluster
from tests.conftest import InProcessOperator
from tests.integration.helpers import (
    conditions,
    finish_pod,
    host_volume,
    run_pods,
    wait_for,
    wait_status,
)
from tests.integration.test_archiving import (  # noqa: F401 (a fixture)
    allow_default_service_account,
    archiving_operator,
    run_node,
)
from tests.integration.test_cli import torchyard
from tests.integration.test_inputs import (  # noqa: F401 (a fixture)
    fetch_jobs,
    inputs_operator,
)
from torchyard import api, k8s
from torchyard.api import wire
from torchyard.sdk import Experiment, HyperDriveRun, Workspace
from torchyard.sdk.azureml.common import ActivityFailedException, TorchyardSdkError
from torchyard.sweeps import sampling, space
from torchyard.sweeps.stopping import Goal
from torchyard.tuning import bayesian

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


def concurrency(namespace: str, sweep: str, trials: int) -> None:
    """Change the sweep's maxConcurrentTrials (a limit that may change)."""
    k8s.rest.call(
        "PATCH",
        k8s.SWEEPS.path(namespace, sweep),
        body={"spec": {"maxConcurrentTrials": trials}},
        content_type="application/merge-patch+json",
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
        "an unknown sampling",
        SweepBuilder("bad").with_("spec.sampling", "anneal"),
        "sampling must be random, grid or bayesian",
    ),
    (
        "asha without maxResource",
        SweepBuilder("bad").with_("spec.earlyTermination", {"type": "asha"}),
        "spec.earlyTermination.maxResource",
    ),
    (
        "asha without checkpoints",
        SweepBuilder("bad").with_("spec.earlyTermination", {"type": "asha", "maxResource": 9}),
        "spec.trial.checkpoints.size is required",
    ),
    (
        "asha with a delay",
        SweepBuilder("bad")
        .with_("spec.trial.checkpoints", {"size": "1Gi"})
        .with_("spec.earlyTermination", {"type": "asha", "maxResource": 9, "delayEvaluation": 2}),
        "evaluationInterval and delayEvaluation are not fields of asha",
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
        "bayesian sampling of an unbounded expression",
        SweepBuilder("bayes")
        .with_("spec.sampling", "bayesian")
        .parameters(lr=LR, noise={"type": "normal", "mu": 0, "sigma": 1}),
        "spec.parameters.noise: bayesian sampling takes only choice, randint, uniform, "
        "quniform, loguniform, qloguniform expressions",
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
    concurrency(ns, "fixed", 2)
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


# -- registerBest ------------------------------------------------------------------------

WRITE_MODEL = (
    "import os, pathlib\n"
    "out = pathlib.Path(os.environ['TORCHYARD_OUTPUTS'])\n"
    "(out / 'model.pt').write_text('weights of ' + os.environ['TORCHYARD_RUN'])\n"
)


@pytest.mark.usefixtures("archiving_operator")  # the registry, and the operator archiving
def test_the_best_trial_is_registered_as_a_model_version_once_across_restarts(
    cluster: Cluster, namespace: str, operator: InProcessOperator, tmp_path: Path
) -> None:
    ns = namespace
    allow_default_service_account(ns)
    k8s.create(environment("pytorch", ns, image="ghcr.io/acme/pytorch@sha256:" + "b" * 64))
    trial = TrainingRunBuilder("t").environment("pytorch").command("python", "train.py")
    sweep = SweepBuilder("tuned", ns).trial(trial.pool("cpu")).trials(3, 3).seed(SEED)
    k8s.create(sweep.register_best("birds", path="outputs/model.pt").obj())
    wait_for("three trials", lambda: len(trial_runs(ns, "tuned")) == 3)
    reported: dict[str, float] = {}
    for index in range(3):
        name = f"tuned-t{index}"
        run = wait_status(k8s.TRAININGRUNS, ns, name, lambda s: s.get("phase") == "Running", 60)
        parameters = json.loads(run["metadata"]["annotations"][wire.ANNOTATION_PARAMETERS])
        reported[name] = accuracy(parameters, 1)
        assert report(ns, "tuned", name, 1, reported[name])
        [pod] = run_pods(ns, name)
        (tmp_path / name).mkdir()
        done = run_node(pod, tmp_path / name, WRITE_MODEL)
        assert done.returncode == 0, done.stderr
        finish_pod(cluster, ns, pod["metadata"]["name"], 0)
    best = max(reported, key=lambda n: reported[n])
    swept = wait_status(k8s.SWEEPS, ns, "tuned", lambda s: "model" in s, 60)
    assert swept["status"]["phase"] == "Succeeded"
    assert swept["status"]["model"] == {"name": "birds", "version": 1, "trial": best}
    assert conditions(swept)["ModelRegistered"]["status"] == "True"
    mv = k8s.get(k8s.MODELVERSIONS, ns, "birds-v1")
    assert mv["spec"]["run"]["name"] == best
    assert mv["spec"]["run"]["uid"] == k8s.get(k8s.TRAININGRUNS, ns, best)["metadata"]["uid"]
    [model_file] = mv["spec"]["files"]
    weights = f"weights of {best}".encode()
    assert model_file["sha256"] == hashlib.sha256(weights).hexdigest()
    cluster.kubectl("wait", "--for=condition=Available", "mv/birds-v1", "-n", ns, "--timeout=5s")
    # an operator that restarts registers nothing again
    operator.stop()
    operator.start()
    operator.caught_up("Sweep", ns, "tuned")
    assert k8s.get(k8s.SWEEPS, ns, "tuned")["status"]["model"] == swept["status"]["model"]
    versions = k8s.list_(k8s.MODELVERSIONS, ns)
    assert [v["metadata"]["name"] for v in versions] == ["birds-v1"]


# -- a model:// input that names no version ----------------------------------------------


def test_every_trial_fetches_the_model_version_the_first_one_took(
    inputs_operator: tuple[str, InProcessOperator],  # noqa: F811
) -> None:
    """A version registered while the sweep runs, and an operator restart, leave the trials
    on the version the sweep took for its first trial: one fetch Job serves them all."""
    ns, operator = inputs_operator
    for version in (1, 2):
        k8s.create(model_version(f"birds-v{version}", ns, "birds", version))
    base = {"name": "base", "uri": "model://birds"}
    trial = TrainingRunBuilder("t").environment("pytorch").gpus(1).pool("a100")
    trial = trial.with_("spec.inputs", [base])
    k8s.create(SweepBuilder("latest", ns).trial(trial).trials(3, 1).seed(SEED).obj())
    wait_for("the first trial", lambda: sorted(trial_runs(ns, "latest")) == ["latest-t0"])
    pinned = [{"name": "base", "uri": "model://birds/2", "revision": "2"}]
    wait_status(k8s.SWEEPS, ns, "latest", lambda s: s.get("inputs") == pinned)

    k8s.create(model_version("birds-v3", ns, "birds", 3))  # registered meanwhile
    operator.stop()
    operator.start()
    concurrency(ns, "latest", 3)
    wait_for("three trials", lambda: len(trial_runs(ns, "latest")) == 3)
    runs = trial_runs(ns, "latest")
    assert {
        name: [(i["uri"], i["revision"]) for i in r["spec"]["inputs"]] for name, r in runs.items()
    } == {f"latest-t{i}": [("model://birds", "2")] for i in range(3)}
    [job] = wait_for("the fetch Job", lambda: fetch_jobs(ns))
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][container["args"].index("--uri") + 1] == "model://birds/2"
    for name in runs:
        wait_status(
            k8s.TRAININGRUNS,
            ns,
            name,
            lambda s: [i.get("uri") for i in s.get("inputs") or []] == ["model://birds/2"],
        )
    assert len(fetch_jobs(ns)) == 1
    assert k8s.get(k8s.SWEEPS, ns, "latest")["status"]["inputs"] == pinned


# -- bayesian sampling -------------------------------------------------------------------


def test_a_bayesian_sweep_loses_and_repeats_no_trial_across_an_operator_restart(
    cluster: Cluster, env: str, operator: InProcessOperator
) -> None:
    """Five trials, two at a time, driven one at a time in index order: trial i (i >= 2) is
    made when trial i-2 completed, with trial i-1 still running, so the test knows the
    results each trial was sampled from; the operator restarts once a trial learned from a
    result."""
    ns = env
    trial = TrainingRunBuilder("t").environment("pytorch").gpus(1).pool("a100")
    body = SweepBuilder("tpe", ns).trial(trial).trials(5, 2).seed(SEED)
    k8s.create(body.with_("spec.sampling", "bayesian").obj())
    searched = space.parse_space(PARAMETERS)
    wait_for("two trials", lambda: len(trial_runs(ns, "tpe")) == 2)
    values: list[float] = []
    for index in range(5):
        name = f"tpe-t{index}"
        run = wait_status(k8s.TRAININGRUNS, ns, name, lambda s: s.get("phase") == "Running", 60)
        parameters = json.loads(run["metadata"]["annotations"][wire.ANNOTATION_PARAMETERS])
        values.append(accuracy(parameters, 1))
        assert report(ns, "tpe", name, 1, values[-1])
        finish_pod(cluster, ns, f"{name}-0", 0)
        wait_status(k8s.TRAININGRUNS, ns, name, lambda s: s.get("phase") == "Succeeded")
        if index == 0:
            wait_for("trial 2", lambda: "tpe-t2" in trial_runs(ns, "tpe"))
            made = trial_runs(ns, "tpe")["tpe-t2"]["metadata"]["uid"]
            operator.stop()
            operator.start()
            operator.caught_up("Sweep", ns, "tpe")
            assert sorted(trial_runs(ns, "tpe")) == ["tpe-t0", "tpe-t1", "tpe-t2"]
            assert trial_runs(ns, "tpe")["tpe-t2"]["metadata"]["uid"] == made
    swept = wait_status(k8s.SWEEPS, ns, "tpe", lambda s: s.get("phase") == "Succeeded", 60)
    runs = trial_runs(ns, "tpe")
    assert sorted(runs) == [f"tpe-t{i}" for i in range(5)]
    book = ledger(ns, "tpe")
    made_with: list[dict[str, Any]] = []
    for index in range(5):
        annotation = runs[f"tpe-t{index}"]["metadata"]["annotations"]
        parameters = json.loads(annotation[wire.ANNOTATION_PARAMETERS])
        assert book[f"t{index}"]["parameters"] == parameters
        # what the sampler knew when it made the trial: those before i-1 ended, i-1 waiting
        results = [
            bayesian.Result(made_with[j], values[j], ended=True) for j in range(index - 1)
        ] + [bayesian.Result(made_with[j]) for j in range(max(0, index - 1), index)]
        assert parameters == bayesian.suggest(searched, Goal.MAXIMIZE, SEED, index, results)
        made_with.append(parameters)
    assert swept["status"]["best"]["metric"] == max(values)


# -- the SDK's cancel --------------------------------------------------------------------


def test_the_sdks_cancel_cancels_the_running_trials_and_ends_the_sweep_canceled(
    cluster: Cluster, env: str
) -> None:
    ns = env
    trial = TrainingRunBuilder("t").environment("pytorch").gpus(1).pool("a100")
    k8s.create(SweepBuilder("stop", ns).trial(trial).trials(6, 2).seed(SEED).obj())
    run = HyperDriveRun(Experiment(Workspace(namespace=ns), "birds"), "stop")
    wait_for("two trials", lambda: len(trial_runs(ns, "stop")) == 2)
    wait_status(k8s.TRAININGRUNS, ns, "stop-t0", lambda s: s.get("phase") == "Running", 60)
    wait_status(k8s.TRAININGRUNS, ns, "stop-t1", lambda s: s.get("phase") == "Running", 60)
    assert report(ns, "stop", "stop-t0", 1, 0.5)
    wait_for("the sweep running", lambda: run.get_status() == "Running")

    run.cancel()

    details = run.wait_for_completion(raise_on_error=False, poll=0.2, timeout=60)
    assert details["status"] == "Canceled"
    with pytest.raises(ActivityFailedException, match="anceled"):
        run.wait_for_completion(poll=0.2, timeout=60)
    swept = k8s.get(k8s.SWEEPS, ns, "stop")
    assert conditions(swept)["Failed"]["reason"] == "Canceled"
    assert swept["status"]["best"]["name"] == "stop-t0"  # the best found so far stays
    # the trials it ran are canceled, their gangs stopped; none is made after
    for name in ("stop-t0", "stop-t1"):
        stopped = wait_status(
            k8s.TRAININGRUNS, ns, name, lambda s: s.get("phase") == "Suspended", 60
        )
        assert stopped["metadata"]["annotations"][wire.ANNOTATION_DECISION] == "canceled"
        wait_for(f"{name}'s Pods gone", lambda n=name: run_pods(ns, n) == [])
    assert sorted(trial_runs(ns, "stop")) == ["stop-t0", "stop-t1"]
    best = run.get_best_run_by_primary_metric()
    assert best is not None and best.id == "stop-t0"
    with pytest.raises(TorchyardSdkError, match="already finished"):
        run.cancel()


# -- asha: pause with the checkpoint, promote by resuming ---------------------------------


def paused_or_stopped(ns: str, name: str, what: str) -> dict[str, Any]:
    """Wait until the Sweep's decision ``what`` is on the trial and its gang is gone."""
    run = wait_status(k8s.TRAININGRUNS, ns, name, lambda s: s.get("phase") == "Suspended", 60)
    assert run["metadata"]["annotations"][wire.ANNOTATION_DECISION] == what, run["metadata"]
    wait_for(f"{name}'s Pods gone", lambda: run_pods(ns, name) == [])
    return run


def finish_running(cluster: Cluster, ns: str, name: str) -> None:
    [pod] = [p for p in run_pods(ns, name) if not p["metadata"].get("deletionTimestamp")]
    finish_pod(cluster, ns, pod["metadata"]["name"], 0)
    wait_status(k8s.TRAININGRUNS, ns, name, lambda s: s.get("phase") == "Succeeded", 60)


def test_asha_pauses_a_trial_with_its_checkpoint_and_promotes_it_by_resuming(
    cluster: Cluster, env: str
) -> None:
    """Four trials one at a time, asha with rungs at 1, 3 (and 9, the end): t0 sets the
    bar at rung 1; t1, t2, t3 do worse there and are paused (suspended, their gang gone,
    their claim kept); once t3 did worse than t1, t1 is promoted: resumed, it reports
    interval 3 and ends; t2 and t3, whom no later trial makes good enough, are stopped."""
    ns = env
    storage = f"asha-{ns}"[:63]
    for i in range(4):  # each trial's claim binds one
        host_volume(cluster, f"{storage}-{i}", f"/tmp/{storage}-{i}", "1Gi", storage)
    trial = (
        TrainingRunBuilder("t")
        .environment("pytorch")
        .gpus(1)
        .pool("a100")
        .with_("spec.checkpoints", {"size": "1Gi", "storageClassName": storage})
    )
    asha = {"type": "asha", "maxResource": 9, "minResource": 1, "reductionFactor": 3}
    body = SweepBuilder("sh", ns).trial(trial).trials(4, 1).seed(SEED)
    k8s.create(body.with_("spec.earlyTermination", asha).obj())
    running = lambda name: wait_status(  # noqa: E731
        k8s.TRAININGRUNS, ns, name, lambda s: s.get("phase") == "Running", 60
    )
    wait_for("trial 0", lambda: "sh-t0" in trial_runs(ns, "sh"))
    running("sh-t0")
    assert report(ns, "sh", "sh-t0", 1, 0.9)
    finish_running(cluster, ns, "sh-t0")
    for index, value in ((1, 0.5), (2, 0.1), (3, 0.05)):
        name = f"sh-t{index}"
        wait_for(name, lambda n=name: n in trial_runs(ns, "sh"))
        running(name)
        assert report(ns, "sh", name, 1, value)
        paused = paused_or_stopped(ns, name, "paused")
        assert paused["spec"]["suspend"] is True
        assert (
            "paused with its checkpoint"
            in paused["metadata"]["annotations"][wire.ANNOTATION_DECISION_REASON]
        )
        assert k8s.get_or_none(k8s.PERSISTENTVOLUMECLAIMS, ns, f"{name}-checkpoints")
    # t1 is promoted: resumed (a new gang), and goes on from interval 3
    promoted = wait_status(k8s.TRAININGRUNS, ns, "sh-t1", lambda s: s.get("phase") == "Running", 60)
    notes = promoted["metadata"]["annotations"]
    assert (notes[wire.ANNOTATION_DECISION], notes[wire.ANNOTATION_PROMOTIONS]) == (
        "promoted",
        "1",
    )
    assert not promoted["spec"].get("suspend")
    assert report(ns, "sh", "sh-t1", 3, 0.8)
    finish_running(cluster, ns, "sh-t1")
    swept = wait_status(k8s.SWEEPS, ns, "sh", lambda s: s.get("phase") == "Succeeded", 60)
    for name in ("sh-t2", "sh-t3"):
        paused_or_stopped(ns, name, "stopped")
    counts = swept["status"]["trials"]
    assert (counts["completed"], counts["stopped"], counts["paused"]) == (2, 2, 0)
    assert swept["status"]["best"]["name"] == "sh-t0"
    rungs = {k: [r[1] for r in v.get("rungs", [])] for k, v in ledger(ns, "sh").items()}
    assert rungs == {"t0": [1.0], "t1": [1.0, 3.0], "t2": [1.0], "t3": [1.0]}
    for i in range(4):
        cluster.kubectl("delete", "pv", f"{storage}-{i}", "--wait=false", check=False)


# -- the best trial: one rule, a failed best named failed, where it peaked ---------------


def test_the_best_is_one_rule_everywhere_and_a_failed_best_is_named_failed(
    cluster: Cluster, env: str
) -> None:
    """t0 rises for 5 intervals and completes (its best at its last, 5); t1 reports more,
    peaking at interval 2, then fails: the status, its message, ``sweep describe`` and
    ``sweep best`` name t1 as Failed at interval 2, and the completed t0 when failed trials
    are left out (``--exclude-failed``, ``include_failed=False``), as HyperDrive does."""
    ns = env
    trial = TrainingRunBuilder("t").environment("pytorch").gpus(1).pool("a100")
    shape = {"type": "choice", "values": ["rises", "crashes"]}
    body = SweepBuilder("peak", ns).trial(trial).grid().parameters(shape=shape).trials(2, 2)
    k8s.create(body.with_("spec.maxFailedTrials", 1).obj())
    curves = {"peak-t0": [0.5, 0.6, 0.7, 0.8, 0.9], "peak-t1": [0.92, 0.95, 0.93]}
    wait_for("two trials", lambda: sorted(trial_runs(ns, "peak")) == sorted(curves))
    for name in curves:
        wait_status(k8s.TRAININGRUNS, ns, name, lambda s: s.get("phase") == "Running", 60)
    for name, values in curves.items():
        for epoch, value in enumerate(values, 1):
            assert report(ns, "peak", name, epoch, value)
        [pod] = run_pods(ns, name)
        finish_pod(cluster, ns, pod["metadata"]["name"], 0 if name == "peak-t0" else 1)
    swept = wait_status(k8s.SWEEPS, ns, "peak", lambda s: s.get("phase") == "Succeeded", 60)
    st = swept["status"]
    assert (st["best"]["name"], st["best"]["state"], st["best"]["interval"]) == (
        "peak-t1",
        "Failed",
        2,
    )
    rows = {row["name"]: row for row in st["summary"]}
    assert (rows["peak-t0"]["metric"], rows["peak-t0"]["interval"]) == (0.9, 5)
    assert conditions(swept)["Succeeded"]["message"].endswith(
        "the best is peak-t1 (Failed), best_val_acc 0.95 at interval 2"
    ), conditions(swept)["Succeeded"]

    described = torchyard(cluster, "sweep", "describe", "peak", "-n", ns)
    assert "Best trial:   peak-t1 (Failed) best_val_acc 0.95 at interval 2" in described.stdout
    best = torchyard(cluster, "sweep", "best", "peak", "-n", ns)
    assert best.stdout.startswith("peak-t1  best_val_acc 0.95  (Failed)"), best
    completed = torchyard(cluster, "sweep", "best", "peak", "-n", ns, "--exclude-failed")
    assert completed.stdout.startswith("peak-t0  best_val_acc 0.9  (Completed)"), completed
    run = HyperDriveRun(Experiment(Workspace(namespace=ns), "birds"), "peak")
    assert run.get_best_run_by_primary_metric().id == "peak-t1"  # type: ignore[union-attr]
    assert run.get_best_run_by_primary_metric(include_failed=False).id == "peak-t0"  # type: ignore[union-attr]


# -- trials that cannot start ------------------------------------------------------------


def test_a_sweep_whose_trials_cannot_start_says_why_until_they_can(
    cluster: Cluster, env: str
) -> None:
    """Its trials name an Environment that does not exist: each trial waits
    (EnvironmentNotFound), and the Sweep says so in TrialsWaiting (and its Ready), as
    ``sweep describe`` shows; once the Environment exists the trials start and the
    condition goes."""
    ns = env
    trial = TrainingRunBuilder("t").environment("nope").gpus(1).pool("a100")
    k8s.create(SweepBuilder("lost", ns).trial(trial).trials(4, 2).seed(SEED).obj())
    swept = wait_status(
        k8s.SWEEPS,
        ns,
        "lost",
        # each trial's own status says it waits, one after the other: both, then
        lambda s: "lost-t0, lost-t1" in str(conditions({"status": s}).get("TrialsWaiting")),
        60,
    )
    waiting = conditions(swept)["TrialsWaiting"]
    assert (waiting["status"], waiting["reason"]) == ("True", "EnvironmentNotFound")
    assert waiting["message"] == (
        "2 trial(s) cannot start yet; lost-t0, lost-t1: EnvironmentNotFound: "
        f"spec.environment: Environment nope does not exist in namespace {ns}; the run "
        "waits for it"
    )
    assert conditions(swept)["Ready"]["reason"] == "EnvironmentNotFound"
    described = torchyard(cluster, "sweep", "describe", "lost", "-n", ns).stdout
    assert "TrialsWaiting   True   EnvironmentNotFound: 2 trial(s) cannot start yet" in described

    k8s.create(environment("nope", ns, image="ghcr.io/acme/pytorch:2.15-cuda12"))
    started = wait_status(
        k8s.SWEEPS, ns, "lost", lambda s: "TrialsWaiting" not in conditions({"status": s}), 60
    )
    assert started["status"]["trials"]["running"] == 2, started["status"]
