"""The Sweep model: the notebook's sweep parses, and the models refuse what the CRD's CEL
rules refuse, naming the field, so the SDK and local mode reject what the apiserver would
(tests/integration/test_sweeps.py sends the same bodies to the apiserver). The limits the
API repeats from the sweeps core stay equal to the core's."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import SweepBuilder, TrainingRunBuilder
from torchyard import api
from torchyard.api import sweeps as sweep_api
from torchyard.sweeps import expressions


def test_the_notebooks_sweep_parses_with_azure_mls_defaults() -> None:
    sw = api.parse_sweep(SweepBuilder("hd").bandit(0.15, 1, 10).obj())
    spec = sw.spec
    assert spec.sampling == "random"
    assert (spec.objective.metric, spec.objective.goal) == ("best_val_acc", "maximize")
    assert (spec.max_total_trials, spec.concurrency) == (8, 4)
    lr = spec.parameters["learning_rate"]
    assert (lr.type, lr.min_value, lr.max_value) == ("uniform", 0.0005, 0.005)
    policy = spec.early_termination
    assert policy is not None
    assert policy.to_dict() == {
        "type": "bandit",
        "slackFactor": 0.15,
        "evaluationInterval": 1,
        "delayEvaluation": 10,
    }
    assert spec.trial.command == ["python", "train.py"]


def test_unset_max_concurrent_trials_is_every_trial() -> None:
    sw = api.parse_sweep(SweepBuilder("hd").trials(6).obj())
    assert sw.spec.max_concurrent_trials is None and sw.spec.concurrency == 6


def test_an_integer_q_stays_an_integer() -> None:
    body = SweepBuilder("hd").parameters(
        batch={"type": "quniform", "minValue": 16, "maxValue": 128, "q": 16}
    )
    q = api.parse_sweep(body.obj()).spec.parameters["batch"].q
    assert q == 16 and isinstance(q, int)


def test_the_schema_of_a_parameter_is_made_from_the_registered_expressions() -> None:
    schema = sweep_api.expression_model().model_json_schema(by_alias=True)
    assert schema["properties"]["type"]["enum"] == list(expressions.names())
    fields = {f.name for e in expressions.registered() for f in e.FIELDS}
    assert set(schema["properties"]) == {"type", *fields}
    rules = [r["rule"] for r in schema["x-kubernetes-validations"]]
    for e in expressions.registered():
        for f in e.FIELDS:
            if f.cel:
                [rule] = [r for r in rules if r.startswith(f"has(self.{f.name}) ==")]
                assert repr(e.TYPE) in rule


LR = {"type": "uniform", "minValue": 0.0005, "maxValue": 0.005}
REFUSED: list[tuple[str, SweepBuilder, str]] = [
    ("an empty space", SweepBuilder("hd").parameters(), "spec.parameters"),
    (
        "a bad parameter name",
        SweepBuilder("hd").parameters(**{"learning-rate": LR}),
        "every parameter name must be ASCII letters",
    ),
    (
        "an unknown expression type",
        SweepBuilder("hd").parameters(lr={"type": "gaussian", "mu": 0, "sigma": 1}),
        "spec.parameters.lr.type",
    ),
    (
        "uniform without maxValue",
        SweepBuilder("hd").parameters(lr={"type": "uniform", "minValue": 0.1}),
        "maxValue is required by uniform",
    ),
    (
        "uniform with a choice's values",
        SweepBuilder("hd").parameters(lr={**LR, "values": [1]}),
        "values is required by choice, and is a field of choice only",
    ),
    (
        "minValue not below maxValue",
        SweepBuilder("hd").parameters(lr={"type": "uniform", "minValue": 1, "maxValue": 1}),
        "minValue must be less than maxValue",
    ),
    (
        "an empty choice",
        SweepBuilder("hd").parameters(bs={"type": "choice", "values": []}),
        "values must hold 1 to 1000 values",
    ),
    (
        "a non-positive sigma",
        SweepBuilder("hd").parameters(x={"type": "normal", "mu": 0, "sigma": 0}),
        "sigma must be greater than 0",
    ),
    (
        "a goal other than maximize or minimize",
        SweepBuilder("hd").objective("best_val_acc", "highest"),
        "spec.objective.goal",
    ),
    (
        "an unknown sampling",
        SweepBuilder("hd").with_("spec.sampling", "anneal"),
        "sampling must be random, grid or bayesian",
    ),
    (
        "more concurrent than total trials",
        SweepBuilder("hd").trials(4, 8),
        "maxConcurrentTrials must not exceed maxTotalTrials",
    ),
    ("no trials", SweepBuilder("hd").trials(0), "spec.maxTotalTrials"),
    (
        "asha without maxResource",
        SweepBuilder("hd").with_("spec.earlyTermination", {"type": "asha"}),
        "maxResource is required by asha",
    ),
    (
        "asha without checkpoints",
        SweepBuilder("hd").with_("spec.earlyTermination", {"type": "asha", "maxResource": 9}),
        "spec.trial.checkpoints.size is required",
    ),
    (
        "asha with an evaluation interval",
        SweepBuilder("hd")
        .with_("spec.trial.checkpoints", {"size": "1Gi"})
        .with_(
            "spec.earlyTermination",
            {"type": "asha", "maxResource": 9, "delayEvaluation": 3},
        ),
        "evaluationInterval and delayEvaluation are not fields of asha",
    ),
    (
        "asha's fields on bandit",
        SweepBuilder("hd").with_(
            "spec.earlyTermination", {"type": "bandit", "slackFactor": 0.1, "brackets": 2}
        ),
        "minResource, reductionFactor and brackets are fields of asha only",
    ),
    (
        "bandit with both slacks",
        SweepBuilder("hd").with_(
            "spec.earlyTermination", {"type": "bandit", "slackFactor": 0.1, "slackAmount": 0.1}
        ),
        "exactly one of slackFactor and slackAmount",
    ),
    (
        "truncation without its percentage",
        SweepBuilder("hd").with_("spec.earlyTermination", {"type": "truncation"}),
        "truncationPercentage is required by truncation",
    ),
    (
        "a trial template a TrainingRun refuses",
        SweepBuilder("hd").trial(TrainingRunBuilder("t").procs(4).gpus(2)),
        "processCountPerNode (4) must not exceed gpusPerNode (2)",
    ),
    (
        "a suspended trial template",
        SweepBuilder("hd").with_("spec.trial.suspend", True),
        "the sweep suspends its trials itself",
    ),
    (
        "a trial template that sets a parameter's variable",
        SweepBuilder("hd").trial(TrainingRunBuilder("t").env(TORCHYARD_PARAM_MOMENTUM="0.9")),
        "must not set TORCHYARD_PARAM_* variables",
    ),
]


@pytest.mark.parametrize(("body", "said"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_refused_naming_the_field(body: SweepBuilder, said: str) -> None:
    with pytest.raises(api.InvalidSpec) as err:
        api.parse_sweep(body.obj())
    assert said in str(err.value)


def test_a_name_leaves_room_for_the_trials_index() -> None:
    longest = "s" * sweep_api.SWEEP_NAME_MAX
    api.parse_sweep(SweepBuilder(longest).obj())
    with pytest.raises(api.InvalidSpec, match="at most 46 characters"):
        api.parse_sweep(SweepBuilder(longest + "s").obj())
    trial: Any = f"{longest}-t{sweep_api.MAX_TOTAL_TRIALS - 1}"
    assert len(trial) == 52  # api.trainingruns.RUN_NAME_MAX
