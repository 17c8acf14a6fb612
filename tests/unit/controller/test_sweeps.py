"""The Sweep reconcile (``controller.sweeps``) against the in-memory fake of
``torchyard.k8s``: trials made ``maxConcurrentTrials`` at a time with parameters drawn from
(seed, index), none made twice by a reconcile that starts afresh (an operator restart),
a trial the bandit policy stops suspended with the decision recorded on it, the sweep
finishing with its best trial, and what the sweeps core refuses said in a condition. The
real-control-plane version is tests/integration/test_sweeps.py."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

from tests.builders import SweepBuilder, TrainingRunBuilder, model_version
from tests.unit.controller.fake_k8s import FakeK8s
from tests.unit.controller.world import T0
from torchyard import api, k8s
from torchyard.api import wire
from torchyard.controller import context, sweeps
from torchyard.sweeps import sampling, space
from torchyard.sweeps.stopping import Goal
from torchyard.tuning import bayesian, plans

NS = "ns"
UID = "uid-sweep"


def sweep(builder: SweepBuilder | None = None) -> dict[str, Any]:
    body = (builder or SweepBuilder("hd", NS).seed(7)).obj()
    body["metadata"].update(uid=UID, generation=1)
    return body


def reconcile(fake: FakeK8s, at: float = 0.0, name: str = "hd") -> context.Result:
    ctx = context.Context(k8s=fake, clock=lambda: T0 + timedelta(seconds=at))
    body = fake.get(k8s.SWEEPS, NS, name)
    return sweeps.reconcile(body, logging.getLogger("test"), ctx)


def status(fake: FakeK8s, name: str = "hd") -> dict[str, Any]:
    return dict(fake.get(k8s.SWEEPS, NS, name).get("status") or {})


def conditions(fake: FakeK8s) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status(fake).get("conditions", [])}


def trials(fake: FakeK8s) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["name"]: o
        for (plural, _, _), o in fake.objects.items()
        if plural == "trainingruns"
    }


def ledger(fake: FakeK8s) -> dict[str, Any]:
    data = fake.get(k8s.CONFIGMAPS, NS, "hd-trials")["data"]
    return {key: json.loads(text) for key, text in data.items()}


def expected(index: int, seed: int = 7) -> dict[str, space.Value]:
    searched = space.parse_space(SweepBuilder("x").obj()["spec"]["parameters"])
    return sampling.random_trial(searched, seed, index)


def set_trial(fake: FakeK8s, name: str, **st: Any) -> None:
    """Give trial ``name`` the status the TrainingRun controller would write."""
    obj = fake.objects[("trainingruns", NS, name)]
    obj["status"] = {**(obj.get("status") or {}), **st}


def running(fake: FakeK8s, name: str, step: int | None = None, value: float | None = None) -> None:
    progress: dict[str, Any] = {}
    if step is not None:
        progress = {"step": step, "lastProgressTime": f"2026-01-01T12:0{step % 10}:00Z"}
        if value is not None:
            progress["metrics"] = {"best_val_acc": value}
    set_trial(fake, name, phase="Running", startTime="2026-01-01T12:00:00Z", progress=progress)


def test_the_first_reconcile_makes_max_concurrent_trials_with_sampled_parameters() -> None:
    fake = FakeK8s(sweep())
    reconcile(fake)
    made = trials(fake)
    assert sorted(made) == ["hd-t0", "hd-t1", "hd-t2", "hd-t3"]
    t1 = made["hd-t1"]
    params = expected(1)
    assert t1["spec"]["command"] == ["python", "train.py", *sampling.arguments(params)]
    assert {e["name"]: e["value"] for e in t1["spec"]["env"]} == sampling.environment(params)
    assert t1["metadata"]["labels"][wire.LABEL_SWEEP] == "hd"
    assert t1["metadata"]["labels"][wire.LABEL_TRIAL] == "1"
    assert json.loads(t1["metadata"]["annotations"][wire.ANNOTATION_PARAMETERS]) == params
    owner = t1["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("Sweep", UID, True)
    st = status(fake)
    assert st["phase"] == "Pending"
    assert st["seed"] == 7
    assert st["trials"]["created"] == 4 and st["trials"]["planned"] == 8
    assert st["trialsConfigMap"] == "hd-trials"
    assert ledger(fake)["t3"]["parameters"] == expected(3)
    assert conditions(fake)["Accepted"]["status"] == "True"
    assert conditions(fake)["MetricReported"]["status"] == "Unknown"


def test_a_reconcile_from_scratch_makes_no_trial_twice_and_the_same_parameters() -> None:
    fake = FakeK8s(sweep())
    reconcile(fake)
    fake.reset_writes()
    reconcile(fake)  # a restarted operator: a new Context, the same cluster
    assert fake.applied == [] and fake.statuses == []
    # the 5th trial, made after a slot frees, has the parameters trial 4 always has
    set_trial(fake, "hd-t0", phase="Succeeded", startTime="2026-01-01T12:00:00Z")
    reconcile(fake)
    made = trials(fake)
    assert sorted(made) == ["hd-t0", "hd-t1", "hd-t2", "hd-t3", "hd-t4"]
    assert json.loads(made["hd-t4"]["metadata"]["annotations"][wire.ANNOTATION_PARAMETERS]) == (
        expected(4)
    )


def test_a_seedless_sweep_draws_from_its_uid_and_says_the_seed() -> None:
    body = sweep(SweepBuilder("hd", NS))
    fake = FakeK8s(body)
    reconcile(fake)
    seed = status(fake)["seed"]
    assert seed == plans.seed_of(api.parse_sweep(body))
    made = trials(fake)
    params = json.loads(made["hd-t0"]["metadata"]["annotations"][wire.ANNOTATION_PARAMETERS])
    assert params == expected(0, seed)


def test_bandit_stops_a_trial_below_the_slack_and_frees_its_place() -> None:
    fake = FakeK8s(sweep(SweepBuilder("hd", NS).seed(7).bandit(0.15, 1, 2)))
    reconcile(fake)
    for step, value in ((1, 0.5), (2, 0.8), (3, 0.9)):
        running(fake, "hd-t0", step, value)
        reconcile(fake)
    running(fake, "hd-t1", 1, 0.3)
    reconcile(fake)
    assert wire.ANNOTATION_DECISION not in trials(fake)["hd-t1"]["metadata"]["annotations"]
    fake.reset_writes()
    running(fake, "hd-t1", 2, 0.6)  # below 0.8 / 1.15 = 0.696 at interval 2
    reconcile(fake)
    t1 = trials(fake)["hd-t1"]
    assert t1["spec"]["suspend"] is True
    assert t1["metadata"]["annotations"][wire.ANNOTATION_DECISION] == "stopped"
    reason = t1["metadata"]["annotations"][wire.ANNOTATION_DECISION_REASON]
    assert "below 0.695652" in reason and "trial 0" in reason
    assert t1["spec"]["command"][:2] == ["python", "train.py"]  # the rest stays as made
    assert ("Normal", "TrialStopped", f"hd-t1: {reason}") in fake.events
    assert "hd-t4" not in trials(fake)  # its gang is still stopping: its place is held
    assert status(fake)["trials"]["stopped"] == 1
    entry = ledger(fake)["t1"]
    assert entry["state"] == "Stopped" and entry["history"] == [[1, 0.3], [2, 0.6]]
    set_trial(fake, "hd-t1", phase="Suspended", suspendedSince="2026-01-01T12:05:00Z")
    reconcile(fake)
    assert "hd-t4" in trials(fake)
    # judged once at interval 2: a restart (another reconcile) decides nothing again
    fake.reset_writes()
    reconcile(fake)
    assert fake.applied == [] and fake.events == []


def test_the_sweep_succeeds_with_its_best_trial_once_every_trial_ended() -> None:
    fake = FakeK8s(sweep(SweepBuilder("hd", NS).seed(7).trials(2, 2)))
    reconcile(fake)
    for name, value in (("hd-t0", 0.7), ("hd-t1", 0.9)):
        running(fake, name, 1, value)
        reconcile(fake)
    assert status(fake)["phase"] == "Running"
    assert conditions(fake)["MetricReported"]["message"] == "hd-t0 reported best_val_acc first"
    for name in ("hd-t0", "hd-t1"):
        set_trial(fake, name, phase="Succeeded", completionTime="2026-01-01T12:10:00Z")
    reconcile(fake, at=600)
    st = status(fake)
    assert st["phase"] == "Succeeded"
    assert st["best"]["name"] == "hd-t1" and st["best"]["metric"] == 0.9
    assert st["best"]["parameters"] == sweeps.sweep_trials.shown(expected(1))
    assert st["trials"]["completed"] == 2 and st["trials"]["done"] == 2
    assert st["trialSeconds"]["spent"] == 2 * 600.0
    assert conditions(fake)["Succeeded"]["reason"] == "AllTrialsEnded"
    assert [r["name"] for r in st["summary"]] == ["hd-t1", "hd-t0"]
    fake.reset_writes()
    reconcile(fake, at=700)  # finished: nothing more
    assert fake.applied == [] and fake.statuses == []


def test_more_failed_trials_than_allowed_fail_the_sweep_and_cancel_the_rest() -> None:
    fake = FakeK8s(sweep(SweepBuilder("hd", NS).seed(7).with_("spec.maxFailedTrials", 1)))
    reconcile(fake)
    failed = [{"type": "Failed", "status": "True", "reason": "Error", "message": "rank 0 ..."}]
    for name in ("hd-t0", "hd-t2"):
        set_trial(fake, name, phase="Failed", conditions=failed)
    reconcile(fake)
    st = status(fake)
    assert st["phase"] == "Failed"
    assert st["failedTrials"] == ["hd-t0", "hd-t2"]
    failed_condition = conditions(fake)["Failed"]
    assert failed_condition["reason"] == "TooManyFailedTrials"
    assert "hd-t0, hd-t2" in failed_condition["message"]
    for name in ("hd-t1", "hd-t3"):
        t = trials(fake)[name]
        assert t["spec"]["suspend"] is True
        assert t["metadata"]["annotations"][wire.ANNOTATION_DECISION] == "canceled"
    assert sorted(trials(fake)) == ["hd-t0", "hd-t1", "hd-t2", "hd-t3"]  # no new one


def test_max_duration_cancels_the_running_trials_and_finishes_with_the_best() -> None:
    fake = FakeK8s(sweep(SweepBuilder("hd", NS).seed(7).with_("spec.maxDurationSeconds", 60)))
    result = reconcile(fake)
    assert result.requeue_after is not None and 60 <= result.requeue_after <= 61
    running(fake, "hd-t0", 1, 0.5)
    reconcile(fake, at=30)
    reconcile(fake, at=61)
    st = status(fake)
    assert st["phase"] == "Succeeded"
    assert conditions(fake)["Succeeded"]["reason"] == "MaxDurationReached"
    assert st["best"]["name"] == "hd-t0"
    assert all(t["spec"].get("suspend") for t in trials(fake).values())


def test_spec_cancel_cancels_the_running_trials_and_fails_the_sweep_keeping_the_best() -> None:
    """HyperDriveRun.cancel() and torchyard sweep cancel set spec.cancel."""
    fake = FakeK8s(sweep())
    reconcile(fake)
    running(fake, "hd-t0", 1, 0.5)
    reconcile(fake)
    fake.objects[("sweeps", NS, "hd")]["spec"]["cancel"] = True
    reconcile(fake)
    st = status(fake)
    assert st["phase"] == "Failed"
    assert conditions(fake)["Failed"]["reason"] == api.sweeps.CANCELED_REASON
    assert "the best so far is hd-t0" in conditions(fake)["Failed"]["message"]
    assert st["best"]["name"] == "hd-t0"
    made = trials(fake)
    assert all(t["spec"].get("suspend") for t in made.values())
    reconcile(fake)
    assert trials(fake).keys() == made.keys()  # no new trial after the cancel


def test_a_metric_no_trial_reports_is_said_once_trials_ended_without_it() -> None:
    fake = FakeK8s(sweep(SweepBuilder("hd", NS).seed(7).trials(1, 1)))
    reconcile(fake)
    set_trial(
        fake,
        "hd-t0",
        phase="Succeeded",
        startTime="2026-01-01T12:00:00Z",
        completionTime="2026-01-01T12:01:00Z",
        progress={"step": 3, "metrics": {"val_acc": 0.8, "loss": 0.2}},
    )
    reconcile(fake)
    st = status(fake)
    assert st["phase"] == "Failed"
    missing = conditions(fake)["MetricReported"]
    assert (missing["status"], missing["reason"]) == ("False", "MetricMissing")
    assert "none reported best_val_acc (their progress holds loss, val_acc)" in missing["message"]
    assert conditions(fake)["Failed"]["reason"] == "MetricMissing"


def invalid(builder: SweepBuilder) -> tuple[FakeK8s, dict[str, Any]]:
    fake = FakeK8s(sweep(builder))
    assert reconcile(fake).requeue_after is None  # said once, never retried
    return fake, conditions(fake)["Accepted"]


def test_what_the_sweeps_core_refuses_is_said_in_accepted_naming_the_field() -> None:
    cases = [
        (
            SweepBuilder("hd", NS)
            .grid()
            .parameters(
                batch={"type": "choice", "values": [16, 32, 64]},
                lr={"type": "choice", "values": [0.1, 0.01, 0.001]},
            )
            .trials(8, 2),
            "spec.maxTotalTrials: the grid has 9 combinations",
        ),
        (
            SweepBuilder("hd", NS).grid(),
            "spec.parameters.learning_rate: grid sampling takes only choice expressions",
        ),
        (
            SweepBuilder("hd", NS).parameters(
                lr={"type": "loguniform", "minValue": 1, "maxValue": 800}
            ),
            "spec.parameters.lr.maxValue: is a natural logarithm",
        ),
        (
            SweepBuilder("hd", NS).parameters(
                lr={"type": "uniform", "minValue": 0, "maxValue": 1},
                LR={"type": "uniform", "minValue": 0, "maxValue": 1},
            ),
            "would both be TORCHYARD_PARAM_LR",
        ),
    ]
    for builder, said in cases:
        fake, accepted = invalid(builder)
        assert (accepted["status"], accepted["reason"]) == ("False", "InvalidSpec")
        assert said in accepted["message"], accepted["message"]
        assert status(fake)["phase"] == "Failed"
        assert trials(fake) == {}


ASHA = {"type": "asha", "maxResource": 9, "minResource": 1, "reductionFactor": 3}


def asha_sweep() -> dict[str, Any]:
    builder = (
        SweepBuilder("hd", NS)
        .seed(7)
        .trials(5, 1)
        .with_("spec.earlyTermination", ASHA)
        .with_("spec.trial.checkpoints", {"size": "1Gi"})
    )
    return sweep(builder)


def decision(fake: FakeK8s, name: str) -> tuple[str | None, bool, str | None]:
    run = trials(fake)[name]
    notes = run["metadata"].get("annotations") or {}
    return (
        notes.get(wire.ANNOTATION_DECISION),
        bool(run["spec"].get("suspend")),
        notes.get(wire.ANNOTATION_PROMOTIONS),
    )


def report_then(fake: FakeK8s, name: str, value: float, phase: str) -> None:
    """Trial ``name`` reports ``value`` at interval 1, the sweep judges it, then it is in
    ``phase`` (Succeeded: it ended; Suspended: its gang is gone after a pause)."""
    running(fake, name, 1, value)
    reconcile(fake)
    set_trial(fake, name, phase=phase, completionTime="2026-01-01T12:10:00Z")
    reconcile(fake)


def test_asha_pauses_below_the_cutoff_and_promotes_once_later_trials_did_worse() -> None:
    fake = FakeK8s(asha_sweep())
    reconcile(fake)
    report_then(fake, "hd-t0", 0.9, "Succeeded")  # the first at rung 1 sets the bar
    running(fake, "hd-t1", 1, 0.5)
    reconcile(fake)
    assert decision(fake, "hd-t1") == ("paused", True, None)  # below the top third
    assert "hd-t2" not in trials(fake)  # its place is held until its gang is gone
    fake.reset_writes()
    reconcile(fake)  # a restarted operator: the same rungs from the ledger, nothing new
    assert fake.applied == [] and fake.statuses == []
    assert [r[1] for r in ledger(fake)["t1"]["rungs"]] == [1.0]
    set_trial(fake, "hd-t1", phase="Suspended")
    reconcile(fake)
    report_then(fake, "hd-t2", 0.2, "Suspended")
    assert decision(fake, "hd-t2")[0] == "paused"
    assert status(fake)["trials"]["paused"] == 2
    report_then(fake, "hd-t3", 0.1, "Suspended")
    # now 0.5 is within the top third of the others at rung 1: t1 resumes, before a t4
    assert decision(fake, "hd-t1") == ("promoted", False, "1")
    assert "hd-t4" not in trials(fake)
    assert "TrialPromoted" in [e[1] for e in fake.events]
    running(fake, "hd-t1", 3, 0.8)  # resumed from its checkpoint: interval 3 next
    set_trial(fake, "hd-t1", phase="Running")
    reconcile(fake)
    assert status(fake)["trials"]["running"] == 1
    set_trial(fake, "hd-t1", phase="Succeeded", completionTime="2026-01-01T12:10:00Z")
    reconcile(fake)
    running(fake, "hd-t4", 1, 0.05)
    reconcile(fake)
    assert decision(fake, "hd-t4")[0] == "paused"
    # its gang still runs (a place held): t2 and t3 stay paused, a promotion may come yet
    assert [decision(fake, f"hd-t{i}")[0] for i in (2, 3)] == ["paused"] * 2
    set_trial(fake, "hd-t4", phase="Suspended")
    reconcile(fake)
    # nothing left to run and no promotion: the paused trials are stopped, the sweep ends
    reconcile(fake)
    reconcile(fake)
    assert [decision(fake, f"hd-t{i}")[0] for i in (2, 3, 4)] == ["stopped"] * 3
    st = status(fake)
    assert st["phase"] == "Succeeded", st
    assert st["trials"]["completed"] == 2 and st["trials"]["stopped"] == 3
    assert st["best"]["name"] == "hd-t0"


def test_asha_without_checkpoints_or_with_an_interval_is_refused_naming_the_field() -> None:
    no_checkpoints = sweep(SweepBuilder("hd", NS).with_("spec.earlyTermination", ASHA))
    interval = asha_sweep()
    interval["spec"]["earlyTermination"]["evaluationInterval"] = 2
    for body, words in (
        (no_checkpoints, "spec.trial.checkpoints.size is required"),
        (interval, "evaluationInterval and delayEvaluation are not fields of asha"),
    ):
        fake = FakeK8s(body)
        reconcile(fake)
        accepted = conditions(fake)["Accepted"]
        assert accepted["status"] == "False" and words in accepted["message"]
        assert trials(fake) == {}


def test_a_trial_the_apiserver_refuses_fails_the_sweep_once_naming_it() -> None:
    fake = FakeK8s(sweep())
    fake.refuse("TrainingRun", 422, "Invalid", 'TrainingRun "hd-t0" is invalid: spec.command')
    assert reconcile(fake).requeue_after is None
    accepted = conditions(fake)["Accepted"]
    assert accepted["reason"] == "InvalidSpec"
    assert "spec.trial: the apiserver refused trial hd-t0 as a TrainingRun" in accepted["message"]


def test_thousands_of_trials_are_made_a_batch_per_reconcile() -> None:
    fake = FakeK8s(sweep(SweepBuilder("hd", NS).seed(7).trials(120)))
    result = reconcile(fake)
    assert len(trials(fake)) == sweeps.CREATES_PER_RECONCILE
    assert result.requeue_after == 0.0
    reconcile(fake)
    reconcile(fake)
    assert len(trials(fake)) == 120
    assert status(fake)["trials"]["created"] == 120


def test_a_loguniform_that_looks_like_values_not_logarithms_is_accepted_with_a_hint() -> None:
    fake = FakeK8s(
        sweep(
            SweepBuilder("hd", NS)
            .seed(7)
            .parameters(lr={"type": "loguniform", "minValue": 0.0001, "maxValue": 0.1})
        )
    )
    reconcile(fake)
    accepted = conditions(fake)["Accepted"]
    assert accepted["status"] == "True"
    assert "spec.parameters.lr: loguniform draws exp(uniform(0.0001, 0.1))" in accepted["message"]
    assert "write minValue: -9.21034, maxValue: -2.30259" in accepted["message"]
    assert len(trials(fake)) == 4


def bayesian_sweep() -> dict[str, Any]:
    return sweep(SweepBuilder("hd", NS).seed(7).with_("spec.sampling", "bayesian"))


def test_bayesian_trials_are_made_from_the_results_before_them_and_never_again() -> None:
    searched = space.parse_space(SweepBuilder("x").obj()["spec"]["parameters"])
    fake = FakeK8s(bayesian_sweep())
    reconcile(fake)
    made = trials(fake)
    assert sorted(made) == ["hd-t0", "hd-t1", "hd-t2", "hd-t3"]
    results: list[bayesian.Result] = []
    for i in range(4):  # each made while the ones before wait (running, to the sampler)
        params = bayesian.suggest(searched, Goal.MAXIMIZE, 7, i, results)
        annotation = made[f"hd-t{i}"]["metadata"]["annotations"][wire.ANNOTATION_PARAMETERS]
        assert json.loads(annotation) == params
        assert ledger(fake)[f"t{i}"]["parameters"] == params
        results.append(bayesian.Result(params))
    fake.reset_writes()
    reconcile(fake)  # a restarted operator: a new Context, the same cluster
    assert fake.applied == [] and fake.statuses == []
    # trial 4, made once t0 completed with its metric, learns from it
    running(fake, "hd-t0", 1, 0.8)
    reconcile(fake)
    set_trial(fake, "hd-t0", phase="Succeeded", completionTime="2026-01-01T12:10:00Z")
    reconcile(fake)
    t4 = json.loads(trials(fake)["hd-t4"]["metadata"]["annotations"][wire.ANNOTATION_PARAMETERS])
    before = [
        bayesian.Result(results[0].parameters, 0.8, ended=True),
        *results[1:],
    ]
    assert t4 == bayesian.suggest(searched, Goal.MAXIMIZE, 7, 4, before)
    assert status(fake)["seed"] == 7


def test_bayesian_sampling_of_an_unbounded_expression_is_said_in_accepted() -> None:
    body = bayesian_sweep()
    body["spec"]["parameters"]["noise"] = {"type": "normal", "mu": 0, "sigma": 1}
    fake = FakeK8s(body)
    reconcile(fake)
    accepted = conditions(fake)["Accepted"]
    assert (accepted["status"], accepted["reason"]) == ("False", "InvalidSpec")
    assert accepted["message"].startswith(
        "spec.parameters.noise: bayesian sampling takes only choice, randint"
    )
    assert trials(fake) == {}


class Behind(FakeK8s):
    """The fake, its list of trials not showing ``hidden`` yet: the view of a watch cache
    that has not delivered them (the apiserver holds them)."""

    def __init__(self, *objects: dict[str, Any]) -> None:
        super().__init__(*objects)
        self.hidden: set[str] = set()

    def list_(self, res: k8s.Resource, namespace: str | None = None, **kw: Any) -> Any:
        found = super().list_(res, namespace, **kw)
        return [o for o in found if o["metadata"]["name"] not in self.hidden]


def made_already(fake: Behind, index: int, owner_uid: str, lr: float) -> dict[str, Any]:
    """Trial ``index`` as the apiserver holds it, made with other parameters than this
    reconcile would draw, and not in the view the reconcile reads."""
    body = json.loads(json.dumps(trials(fake)["hd-t3"]))
    meta = body["metadata"]
    meta.update(name=f"hd-t{index}", uid=f"uid-t{index}")
    meta["labels"][wire.LABEL_TRIAL] = str(index)
    meta["ownerReferences"][0]["uid"] = owner_uid
    meta["annotations"][wire.ANNOTATION_PARAMETERS] = json.dumps({"learning_rate": lr})
    body["spec"]["command"] = ["python", "train.py", "--learning_rate", str(lr)]
    fake.put(body)
    fake.hidden.add(meta["name"])
    return json.loads(json.dumps(body))


def test_a_trial_made_already_but_not_in_the_view_read_is_read_never_overwritten() -> None:
    fake = Behind(sweep())
    reconcile(fake)  # t0..t3
    there = made_already(fake, 4, UID, 0.0042)
    set_trial(fake, "hd-t0", phase="Succeeded", startTime="2026-01-01T12:00:00Z")
    fake.reset_writes()
    assert reconcile(fake).requeue_after is None
    assert trials(fake)["hd-t4"] == there  # its spec and parameters as they were made
    assert [m["metadata"]["name"] for m in fake.applied if m["kind"] == "TrainingRun"] == []
    assert ledger(fake)["t4"]["parameters"] == {"learning_rate": 0.0042}
    assert status(fake)["trials"]["created"] == 5
    fake.hidden.clear()
    reconcile(fake)  # the view caught up: nothing more is made
    assert sorted(trials(fake)) == [f"hd-t{i}" for i in range(5)]


def test_a_namesakes_trial_found_at_create_is_left_alone_and_looked_at_again() -> None:
    fake = Behind(sweep())
    reconcile(fake)
    there = made_already(fake, 4, "uid-of-a-deleted-sweep", 0.0042)
    set_trial(fake, "hd-t0", phase="Succeeded", startTime="2026-01-01T12:00:00Z")
    result = reconcile(fake)
    assert result.requeue_after == sweeps.NAMESAKE_RETRY_SECONDS
    assert trials(fake)["hd-t4"] == there
    assert "t4" not in ledger(fake)
    assert status(fake)["trials"]["created"] == 4
    # once the namesake is gone (garbage collected), the trial is made as drawn
    del fake.objects[("trainingruns", NS, "hd-t4")]
    reconcile(fake)
    made = trials(fake)["hd-t4"]
    assert json.loads(made["metadata"]["annotations"][wire.ANNOTATION_PARAMETERS]) == expected(4)


# -- a model:// input that names no version ----------------------------------------------

BASE = {"name": "base", "uri": "model://birds"}


def tuned_from_latest(total: int = 4, concurrent: int = 2) -> dict[str, Any]:
    trial = TrainingRunBuilder("t").with_("spec.inputs", [BASE])
    return sweep(SweepBuilder("hd", NS).seed(7).trial(trial).trials(total, concurrent))


def base_versions(fake: FakeK8s) -> dict[str, str | None]:
    return {
        name: next(i.get("revision") for i in t["spec"]["inputs"] if i["name"] == "base")
        for name, t in trials(fake).items()
    }


PINNED = [{"name": "base", "uri": "model://birds/3", "revision": "3"}]


def test_the_latest_model_is_taken_once_and_every_trial_gets_that_version() -> None:
    fake = FakeK8s(
        tuned_from_latest(),
        *(model_version(f"birds-v{v}", NS, "birds", v) for v in (1, 3, 2)),
        model_version("other-v9", NS, "other", 9),
    )
    reconcile(fake)
    assert base_versions(fake) == {"hd-t0": "3", "hd-t1": "3"}
    assert status(fake)["inputs"] == PINNED
    fake.put(model_version("birds-v4", NS, "birds", 4))  # registered while the sweep runs
    set_trial(fake, "hd-t0", phase="Succeeded", startTime="2026-01-01T12:00:00Z")
    reconcile(fake)
    assert base_versions(fake)["hd-t2"] == "3"
    # an operator stopped after making a trial, before writing the status: the trials say
    fake.objects[("sweeps", NS, "hd")]["status"].pop("inputs")
    set_trial(fake, "hd-t1", phase="Succeeded", startTime="2026-01-01T12:00:00Z")
    reconcile(fake)
    assert base_versions(fake) == {f"hd-t{i}": "3" for i in range(4)}
    assert status(fake)["inputs"] == PINNED
    # the template itself stays as it was written
    assert fake.get(k8s.SWEEPS, NS, "hd")["spec"]["trial"]["inputs"] == [BASE]


def test_a_model_with_no_version_yet_is_pinned_by_none_of_the_trials() -> None:
    fake = FakeK8s(tuned_from_latest(2, 2))
    reconcile(fake)
    assert base_versions(fake) == {"hd-t0": None, "hd-t1": None}  # each fails naming it
    assert "inputs" not in status(fake)
