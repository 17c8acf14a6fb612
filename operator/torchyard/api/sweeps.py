"""The Sweep resource: hyperparameter tuning (~ Azure ML's HyperDriveConfig + submit).

A Sweep samples a search space (``spec.parameters``, Azure ML's parameter expressions),
runs each sample as a trial TrainingRun made from ``spec.trial`` with the parameters
appended to its command (``--learning_rate 0.0031``) and set as ``TORCHYARD_PARAM_<NAME>``,
at most ``maxConcurrentTrials`` at a time, stops trials early by a policy, and names the
best trial by ``spec.objective``. Typed spec and status with the descriptions ``kubectl
explain`` shows and the CEL rules the apiserver enforces (the CRD in ``crds/`` is
generated from these models by ``torchyard.api.crds``); each rule has its twin in Python
here, so what the apiserver refuses, the SDK and local mode refuse too. What needs the
sweeps core to check (a loguniform bound that overflows, names that differ only in case,
a grid larger than ``maxTotalTrials``) is checked by the Sweep controller, which says so
in the Sweep's ``Accepted`` condition. Parsed by the controller (``parse_sweep``); no I/O.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, WithJsonSchema, field_validator, model_validator

from torchyard.api._base import (
    CONDITIONS_FIELD_EXTRA,
    DNS1035_LABEL,
    Condition,
    Model,
    Named,
    NoNulStr,
    observed_generation,
    with_rules,
)
from torchyard.api.inputs import PinnedInput
from torchyard.api.trainingruns import RUN_NAME_MAX, ModelOutput, TrainingRunSpec
from torchyard.api.wire import API_VERSION
from torchyard.launch.contract import PARAM_VARIABLE_PREFIX

# A trial is the TrainingRun <sweep>-t<index>: the Sweep's name leaves room for the index.
MAX_TOTAL_TRIALS = 10000
SWEEP_NAME_MAX = RUN_NAME_MAX - len("-t") - len(str(MAX_TOTAL_TRIALS - 1))
SWEEP_NAME_RULE = (
    "a Sweep name must be a DNS-1035 label (lower-case letters, digits and '-', starting "
    f"with a letter) of at most {SWEEP_NAME_MAX} characters, so that its trials can be "
    "named <sweep>-t<index> as TrainingRuns"
)
# The limits of the sweeps core (torchyard.sweeps.space), repeated for the schema (the
# sweeps core imports no pydantic, this layer no sweeps: tests/unit/api/test_sweep_spec.py
# keeps the copies equal).
MAX_PARAMETERS = 64
MAX_CHOICES = 1000
MAX_RANDINT = 2**53
PARAMETER_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
PARAMETER_NAME_RULE = (
    "every parameter name must be ASCII letters, digits and _ (not a digit first), at most "
    "63 characters: it becomes the trial's --<name> argument and TORCHYARD_PARAM_<NAME> "
    "variable"
)
ENV_PREFIX = PARAM_VARIABLE_PREFIX  # sweeps.sampling.ENV_PREFIX
# A trial's spec.env holds at most this many variables (TrainingRunSpec.env).
MAX_ENV = 128

SAMPLINGS = ("random", "grid", "bayesian")
SAMPLING_RULE = "must be random, grid or bayesian"
POLICIES = ("bandit", "median", "truncation", "asha")
POLICY_RULE = "must be bandit, median, truncation or asha"
ASHA_FIELDS = ("minResource", "reductionFactor", "brackets")

# An int stays an int (q: 1 gives integer values), a float a float: one JSON number.
Number = Annotated[int | float, WithJsonSchema({"type": "number"})]

ExpressionType = Literal[
    "choice",
    "randint",
    "uniform",
    "quniform",
    "loguniform",
    "qloguniform",
    "normal",
    "qnormal",
    "lognormal",
    "qlognormal",
]
EXPRESSION_TYPES: tuple[str, ...] = get_args(ExpressionType)
# Which expression types take which field (sweeps.space's FIELDS), in the JSON names.
FIELDS_OF: dict[str, tuple[str, ...]] = {
    "values": ("choice",),
    "upper": ("randint",),
    "minValue": ("uniform", "quniform", "loguniform", "qloguniform"),
    "maxValue": ("uniform", "quniform", "loguniform", "qloguniform"),
    "q": ("quniform", "qloguniform", "qnormal", "qlognormal"),
    "mu": ("normal", "qnormal", "lognormal", "qlognormal"),
    "sigma": ("normal", "qnormal", "lognormal", "qlognormal"),
}


def _field_rule(name: str, types: tuple[str, ...]) -> dict[str, Any]:
    listed = ", ".join(types[:-1]) + (" and " if len(types) > 1 else "") + types[-1]
    return {
        "rule": f"has(self.{name}) == (self.type in {list(types)})",
        "message": f"{name} is required by {listed}, and is a field of {listed} only",
        "fieldPath": f".{name}",
    }


# CEL cannot see ``values`` (an array of numbers, strings or booleans has no CEL type, so
# the apiserver leaves it out of what a rule may read): that it is there exactly for a
# choice is checked by the model here and by the Sweep controller (Accepted False).
CEL_FIELDS = tuple(name for name in FIELDS_OF if name != "values")
EXPRESSION_RULES: tuple[dict[str, Any], ...] = (
    *(_field_rule(name, FIELDS_OF[name]) for name in CEL_FIELDS),
    {
        "rule": "!has(self.minValue) || !has(self.maxValue) || self.minValue < self.maxValue",
        "message": "minValue must be less than maxValue",
        "fieldPath": ".minValue",
    },
    {
        "rule": "!has(self.sigma) || self.sigma > 0.0",
        "message": "sigma must be greater than 0",
        "fieldPath": ".sigma",
    },
    {
        "rule": "!has(self.q) || self.q > 0.0",
        "message": "q must be greater than 0",
        "fieldPath": ".q",
    },
)


class ParameterExpression(Model):
    """One parameter's distribution: Azure ML's parameter expressions, as its sweep YAML
    writes them (``{type: uniform, minValue: 0.0005, maxValue: 0.005}``)."""

    model_config = with_rules(*EXPRESSION_RULES)

    type: ExpressionType = Field(
        description="choice (values), randint (upper: an integer in [0, upper)), uniform, "
        "quniform, loguniform, qloguniform (minValue, maxValue; the log ones' bounds are "
        "natural logarithms, as in Azure ML), normal, qnormal, lognormal, qlognormal (mu, "
        "sigma); the q forms round to a multiple of q."
    )
    values: (
        Annotated[
            list[Any],
            WithJsonSchema(
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_CHOICES,
                    "items": {"x-kubernetes-preserve-unknown-fields": True},
                }
            ),
        ]
        | None
    ) = Field(
        default=None,
        description="choice: the values (numbers, strings or booleans); grid sampling "
        "takes each in turn.",
    )
    upper: int | None = Field(
        default=None,
        ge=1,
        le=MAX_RANDINT,
        description="randint: values are the integers 0 .. upper-1.",
    )
    min_value: Number | None = Field(default=None, description="The lower bound.")
    max_value: Number | None = Field(default=None, description="The upper bound.")
    q: Number | None = Field(
        default=None,
        description="The step values are rounded to (an integer q gives integers).",
    )
    mu: Number | None = Field(default=None, description="normal: the mean.")
    sigma: Number | None = Field(default=None, description="normal: the standard deviation.")

    @model_validator(mode="after")
    def _fields_of_its_type(self) -> ParameterExpression:
        given = {
            "values": self.values,
            "upper": self.upper,
            "minValue": self.min_value,
            "maxValue": self.max_value,
            "q": self.q,
            "mu": self.mu,
            "sigma": self.sigma,
        }
        for name, types in FIELDS_OF.items():
            if (given[name] is not None) != (self.type in types):
                raise ValueError(_field_rule(name, types)["message"])
        if self.values is not None and not 1 <= len(self.values) <= MAX_CHOICES:
            raise ValueError(f"values must hold 1 to {MAX_CHOICES} values")
        checks = (
            self.min_value is None or self.max_value is None or self.min_value < self.max_value,
            self.sigma is None or self.sigma > 0,
            self.q is None or self.q > 0,
        )
        for rule, ok in zip(EXPRESSION_RULES[len(CEL_FIELDS) :], checks, strict=True):
            if not ok:
                raise ValueError(rule["message"])
        return self


class Objective(Model):
    """The primary metric and its goal (~ primary_metric_name, primary_metric_goal)."""

    metric: NoNulStr = Field(
        min_length=1,
        max_length=256,
        description="The metric the trials report (torchyard.progress.report(epoch, "
        "best_val_acc=...)) that ranks them and that early termination compares.",
    )
    goal: Literal["maximize", "minimize"] = Field(description="maximize or minimize the metric.")


def _policy_checks(policy: EarlyTermination) -> tuple[bool, ...]:
    """The CEL rules of :class:`EarlyTermination`, in their order, in Python."""
    bandit = policy.type == "bandit"
    slack = policy.slack_factor is not None, policy.slack_amount is not None
    return (
        policy.type in POLICIES,
        not bandit or slack[0] != slack[1],
        bandit or not any(slack),
        (policy.type == "truncation") == (policy.truncation_percentage is not None),
        (policy.type == "asha") == (policy.max_resource is not None),
        policy.type == "asha"
        or all(v is None for v in (policy.min_resource, policy.reduction_factor, policy.brackets)),
        policy.type != "asha" or (policy.evaluation_interval, policy.delay_evaluation) == (1, 0),
        policy.reduction_factor is None or policy.reduction_factor > 1,
    )


POLICY_RULES: tuple[dict[str, Any], ...] = (
    {
        "rule": f"self.type in {list(POLICIES)}",
        "message": f"earlyTermination.type {POLICY_RULE}",
        "fieldPath": ".type",
    },
    {
        "rule": "self.type != 'bandit' || has(self.slackFactor) != has(self.slackAmount)",
        "message": "bandit takes exactly one of slackFactor and slackAmount",
        "fieldPath": ".slackFactor",
    },
    {
        "rule": "self.type == 'bandit' || !(has(self.slackFactor) || has(self.slackAmount))",
        "message": "slackFactor and slackAmount are fields of bandit only",
        "fieldPath": ".slackFactor",
    },
    {
        "rule": "(self.type == 'truncation') == has(self.truncationPercentage)",
        "message": "truncationPercentage is required by truncation, and is a field of "
        "truncation only",
        "fieldPath": ".truncationPercentage",
    },
    {
        "rule": "(self.type == 'asha') == has(self.maxResource)",
        "message": "maxResource is required by asha, and is a field of asha only",
        "fieldPath": ".maxResource",
    },
    {
        "rule": "self.type == 'asha' || !("
        + " || ".join(f"has(self.{f})" for f in ASHA_FIELDS)
        + ")",
        "message": "minResource, reductionFactor and brackets are fields of asha only",
        "fieldPath": ".minResource",
    },
    {
        "rule": "self.type != 'asha' || "
        "(self.evaluationInterval == 1 && self.delayEvaluation == 0)",
        "message": "asha decides at its rungs (minResource x reductionFactor^k intervals): "
        "evaluationInterval and delayEvaluation are not fields of asha",
        "fieldPath": ".evaluationInterval",
    },
    {
        "rule": "!has(self.reductionFactor) || self.reductionFactor > 1.0",
        "message": "reductionFactor must be greater than 1",
        "fieldPath": ".reductionFactor",
    },
)


class EarlyTermination(Model):
    """Stop trials that do poorly, at each evaluation interval (~ BanditPolicy,
    MedianStoppingPolicy, TruncationSelectionPolicy). An interval is a step a trial
    reported the metric at: report it with the epoch as the step
    (``progress.report(epoch, best_val_acc=...)``), and interval N is epoch N."""

    model_config = with_rules(*POLICY_RULES)

    type: str = Field(
        max_length=32,
        description="bandit: stop a trial whose best metric is not within the slack of "
        "the best trial's at that interval; median: stop one whose best is worse than the "
        "median of all trials' running averages; truncation: stop the lowest "
        "truncationPercentage %; asha: asynchronous successive halving, which pauses a "
        "trial below the top 1/reductionFactor at a rung with its checkpoint (suspended) "
        "and promotes it (resumed from the checkpoint) should later trials do worse.",
    )
    slack_factor: float | None = Field(
        default=None,
        ge=0,
        description="bandit: the slack as a ratio: when maximizing, a trial stops below "
        "best / (1 + slackFactor).",
    )
    slack_amount: float | None = Field(
        default=None, ge=0, description="bandit: the slack as an amount of the metric."
    )
    evaluation_interval: int = Field(
        default=1, ge=1, le=100000, description="Apply the policy every this many intervals."
    )
    delay_evaluation: int = Field(
        default=0,
        ge=0,
        le=100000,
        description="Apply it from this interval on (the first intervals are never judged).",
    )
    truncation_percentage: int | None = Field(
        default=None,
        ge=1,
        le=99,
        description="truncation: the percentage of trials cut at each evaluation interval.",
    )

    max_resource: float | None = Field(
        default=None,
        ge=1,
        description="asha: the intervals a trial runs at most (its epochs); rungs at "
        "minResource x reductionFactor^k below it.",
    )
    min_resource: float | None = Field(
        default=None, ge=1, description="asha: the first rung (default 1 interval)."
    )
    reduction_factor: float | None = Field(
        default=None,
        ge=1,
        description="asha: 1/reductionFactor of the trials at a rung go on (default 3; "
        "greater than 1).",
    )
    brackets: int | None = Field(
        default=None, ge=1, le=10, description="asha: the number of brackets (default 1)."
    )

    def policy_dict(self) -> dict[str, Any]:
        """The policy's own fields, as ``sweeps.stopping.parse_policy`` reads them (asha
        has no evaluation interval or delay)."""
        out = self.to_dict()
        if self.type == "asha":
            out.pop("evaluationInterval", None)
            out.pop("delayEvaluation", None)
        return out

    @model_validator(mode="after")
    def _checks(self) -> EarlyTermination:
        for rule, ok in zip(POLICY_RULES, _policy_checks(self), strict=True):
            if not ok:
                raise ValueError(rule["message"])
        return self


class RegisterBest(ModelOutput):
    """Register the best trial's outputs as a model version once the sweep succeeded (~
    ``hyperdrive_run.get_best_run_by_primary_metric().register_model(...)``): the trial
    with the best metric among those that completed, its archived ``path`` promoted as the
    model's next version, as a TrainingRun's ``outputs.register`` does."""


_SPEC_RULES: list[dict[str, Any]] = [
    {
        "rule": "!has(self.maxConcurrentTrials) || self.maxConcurrentTrials <= self.maxTotalTrials",
        "message": "maxConcurrentTrials must not exceed maxTotalTrials",
        "fieldPath": ".maxConcurrentTrials",
    },
    {
        "rule": "!self.trial.suspend",
        "message": "the sweep suspends its trials itself (that is how it stops them): leave "
        "spec.trial.suspend out",
        "fieldPath": ".trial.suspend",
    },
    {
        "rule": "!has(self.earlyTermination) || self.earlyTermination.type != 'asha' || "
        "(has(self.trial.checkpoints) && has(self.trial.checkpoints.size))",
        "message": "asha pauses a trial with its checkpoint and resumes it from there: "
        "spec.trial.checkpoints.size is required (each trial's own claim; one claimName "
        "shared by the trials would resume a trial from another's checkpoint)",
        "fieldPath": ".trial.checkpoints",
    },
    {
        "rule": f"(has(self.trial.env) ? size(self.trial.env) : 0) + size(self.parameters) "
        f"<= {MAX_ENV}",
        "message": f"each parameter adds a {ENV_PREFIX}<NAME> variable to the trial's env, "
        f"which holds at most {MAX_ENV}: spec.trial.env and spec.parameters together are "
        "too many",
        "fieldPath": ".trial.env",
    },
    {
        "rule": f"!has(self.trial.env) || "
        f"self.trial.env.all(e, !e.name.startsWith('{ENV_PREFIX}'))",
        "message": f"spec.trial.env must not set {ENV_PREFIX}* variables: the sweep sets "
        "one per parameter",
        "fieldPath": ".trial.env",
    },
]

SEED_DESCRIPTION = (
    "The sampling's seed (status.seed shows the one used): random sampling gives every "
    "trial the same parameters with the same seed, bayesian sampling with the same seed "
    "and the same results before it. Unset: one derived from the Sweep's uid. Immutable."
)

_IMMUTABLE: dict[str, Any] = {
    "rule": "self == oldSelf",
    "message": "is immutable: create another Sweep",
}


def _immutable(description: str) -> dict[str, Any]:
    return {"x-kubernetes-validations": [dict(_IMMUTABLE)], "description": description}


class SweepSpec(Model):
    """Desired state of a Sweep."""

    model_config = with_rules(*_SPEC_RULES)

    trial: TrainingRunSpec = Field(
        description="The TrainingRun spec every trial runs, with the trial's parameters "
        "appended to its command (--name value, as HyperDrive passes them) and set as "
        f"{ENV_PREFIX}<NAME> variables. A change applies to the trials made after it "
        "(distribution is immutable, as in a TrainingRun)."
    )
    parameters: dict[str, ParameterExpression] = Field(
        min_length=1,
        max_length=MAX_PARAMETERS,
        description="The search space: parameter name -> expression, e.g. learning_rate: "
        "{type: uniform, minValue: 0.0005, maxValue: 0.005}; immutable.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(k, k.matches('{PARAMETER_NAME}'))",
                    "message": PARAMETER_NAME_RULE,
                },
                dict(_IMMUTABLE),
            ]
        },
    )
    sampling: str = Field(
        default="random",
        max_length=32,
        description="random: each trial's values drawn from the expressions, from the seed "
        "and the trial's index; grid: every combination of choice values, in order; "
        "bayesian: each trial's values chosen by Optuna's TPE sampler from the results of "
        "the trials before it (choice, randint and the uniform and loguniform forms only); "
        "immutable.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": f"self in {list(SAMPLINGS)}", "message": f"sampling {SAMPLING_RULE}"},
                dict(_IMMUTABLE),
            ]
        },
    )
    objective: Objective = Field(
        description="The primary metric and its goal; immutable.",
        json_schema_extra=_immutable("The primary metric and its goal; immutable."),
    )
    max_total_trials: int = Field(
        ge=1,
        le=MAX_TOTAL_TRIALS,
        description="How many trials the sweep runs at most (a grid runs all its "
        "combinations, which must not be more).",
    )
    max_concurrent_trials: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TOTAL_TRIALS,
        description="How many trials run (or wait for capacity) at once; unset: all of "
        "them, as the cluster's capacity allows (gang admission queues the rest).",
    )
    max_failed_trials: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TOTAL_TRIALS,
        description="The sweep fails, canceling its other trials, once more trials than "
        "this failed; unset: no limit.",
    )
    max_duration_seconds: int | None = Field(
        default=None,
        ge=1,
        description="After this long the sweep cancels its trials that still run and "
        "finishes with what it has.",
    )
    seed: int | None = Field(
        default=None,
        ge=0,
        le=2**53,
        description=SEED_DESCRIPTION,
        json_schema_extra=_immutable(SEED_DESCRIPTION),
    )
    cancel: bool = Field(
        default=False,
        description="true: cancel the sweep (~ HyperDriveRun.cancel()): its trials still "
        "running are canceled and it ends Failed, reason Canceled, keeping the best trial "
        "found so far. Cannot be undone.",
    )
    early_termination: EarlyTermination | None = Field(
        default=None,
        description="A policy that stops poorly doing trials early; unset: every trial runs "
        "to its end. Immutable.",
        json_schema_extra=_immutable(
            "A policy that stops poorly doing trials early; unset: every trial runs to its "
            "end. Immutable."
        ),
    )

    register_best: RegisterBest | None = Field(
        default=None,
        description="Once the sweep succeeded, register the outputs of its best completed "
        "trial as the model's next version (status.model names it and the trial).",
    )

    @field_validator("parameters")
    @classmethod
    def _names(cls, value: dict[str, ParameterExpression]) -> dict[str, ParameterExpression]:
        bad = sorted(k for k in value if not re.fullmatch(PARAMETER_NAME, k))
        if bad:
            raise ValueError(f"{PARAMETER_NAME_RULE}; got {', '.join(map(repr, bad))}")
        return value

    @field_validator("sampling")
    @classmethod
    def _sampling(cls, value: str) -> str:
        if value not in SAMPLINGS:
            raise ValueError(f"sampling {SAMPLING_RULE}; got {value!r}")
        return value

    @model_validator(mode="after")
    def _checks(self) -> SweepSpec:
        checks = (
            self.max_concurrent_trials is None
            or self.max_concurrent_trials <= self.max_total_trials,
            not self.trial.suspend,
            self.early_termination is None
            or self.early_termination.type != "asha"
            or (self.trial.checkpoints is not None and self.trial.checkpoints.size is not None),
            len(self.trial.env) + len(self.parameters) <= MAX_ENV,
            not any(e.name.startswith(ENV_PREFIX) for e in self.trial.env),
        )
        for rule, ok in zip(_SPEC_RULES, checks, strict=True):
            if not ok:
                raise ValueError(rule["message"])
        return self

    @property
    def concurrency(self) -> int:
        """maxConcurrentTrials, or maxTotalTrials when unset."""
        return self.max_concurrent_trials or self.max_total_trials


class TrialCounts(Model):
    """How many trials are in which state."""

    planned: int = Field(default=0, description="Trials the sweep runs in all.")
    created: int = Field(default=0, description="Trials made so far.")
    pending: int = Field(default=0, description="Made, waiting for capacity.")
    running: int = Field(default=0, description="Running.")
    paused: int = Field(
        default=0, description="Paused by asha with their checkpoint (may be promoted)."
    )
    stopped: int = Field(default=0, description="Stopped early by spec.earlyTermination.")
    completed: int = Field(default=0, description="Ran to their end.")
    failed: int = Field(default=0, description="Failed.")
    canceled: int = Field(default=0, description="Canceled when the sweep ended first.")
    done: int = Field(default=0, description="Ended: stopped, completed, failed or canceled.")


class TrialRow(Model):
    """One trial as the Sweep's status shows it."""

    name: str = Field(description="The trial's TrainingRun.")
    index: int = Field(description="The trial's index (0, 1, ...).")
    state: str = Field(
        description="Pending, Running, Paused, Stopped, Completed, Failed or Canceled."
    )
    parameters: dict[str, str] = Field(
        default_factory=dict, description="The parameters as the trial received them."
    )
    metric: float | None = Field(
        default=None, description="Its best value of the objective's metric."
    )
    interval: int | None = Field(
        default=None, description="The interval (step) it reported that best value at."
    )
    intervals: int | None = Field(default=None, description="The last interval it reported.")
    reason: str | None = Field(default=None, description="Why it was stopped or ended.")


class TrialSeconds(Model):
    """Trial-seconds (seconds times GPUs; times nodes for a CPU trial)."""

    spent: float = Field(default=0.0, description="Used by all trials so far.")
    saved: float | None = Field(
        default=None,
        description="Not used thanks to early termination: each stopped trial's seconds "
        "per interval times the intervals it did not run (unset while the full length is "
        "unknown).",
    )


# The reason a sweep that spec.cancel ended has (Failed and Running conditions).
CANCELED_REASON = "Canceled"
SWEEP_PHASES = ("Pending", "Running", "Succeeded", "Failed")
# The status lists the best few trials and those running, at most this many each; every
# trial is in the ConfigMap status.trialsConfigMap names.
STATUS_TOP = 5
STATUS_RUNNING = 10
STATUS_FAILED_NAMES = 20


class SweepModel(Model):
    """The model version spec.registerBest registered."""

    name: str = Field(description="The model.")
    version: int = Field(description="Its version (the ModelVersion <name>-v<version>).")
    trial: str = Field(description="The trial TrainingRun whose outputs it holds.")


class SweepStatus(Model):
    """Observed state of a Sweep, written by the operator."""

    phase: Literal["Pending", "Running", "Succeeded", "Failed"] | None = Field(
        default=None, description="Pending, Running, Succeeded or Failed."
    )
    observed_generation: int | None = observed_generation()
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Accepted, MetricReported, Succeeded, Failed, ModelRegistered "
        "(spec.registerBest), and Ready, Reconciling, Stalled; Recorded once the ended "
        "sweep's record is in the registry.",
        json_schema_extra=CONDITIONS_FIELD_EXTRA,
    )
    seed: int | None = Field(default=None, description="The seed the sampling uses.")
    trials: TrialCounts | None = Field(default=None, description="Trials by state.")
    best: TrialRow | None = Field(
        default=None,
        description="The trial with the best metric any trial reported (~ "
        "get_best_run_by_primary_metric).",
    )
    summary: list[TrialRow] | None = Field(
        default=None,
        max_length=STATUS_TOP + STATUS_RUNNING,
        description=f"The best {STATUS_TOP} trials and up to {STATUS_RUNNING} running ones; "
        "every trial is in the ConfigMap trialsConfigMap.",
    )
    trials_config_map: str | None = Field(
        default=None,
        description="The ConfigMap holding every trial: its parameters, state and the "
        "metric at each interval it reported.",
    )
    trial_seconds: TrialSeconds | None = Field(
        default=None, description="Trial-seconds spent, and saved by early termination."
    )
    failed_trials: list[str] | None = Field(
        default=None,
        max_length=STATUS_FAILED_NAMES,
        description="The trials that failed (the first few).",
    )
    model: SweepModel | None = Field(
        default=None, description="The model version spec.registerBest registered."
    )
    inputs: list[PinnedInput] | None = Field(
        default=None,
        description="Each model:// input of spec.trial that names no version, pinned to "
        "the model's latest version when the first trial was made: every trial fetches "
        "that one, whatever is registered while the sweep runs.",
    )
    start_time: datetime | None = Field(default=None, description="When the sweep started.")
    completion_time: datetime | None = Field(default=None, description="When it finished.")


class Sweep(Named, Model):
    """A Sweep as the API holds it (metadata kept as a plain mapping)."""

    api_version: str = Field(default=API_VERSION, description="APIVersion.")
    kind: Literal["Sweep"] = Field(default="Sweep", description="Kind.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard metadata.")
    spec: SweepSpec = Field(description="Desired state.")
    status: SweepStatus = Field(default_factory=SweepStatus, description="Observed state.")

    @model_validator(mode="after")
    def _name_leaves_room_for_trials(self) -> Sweep:
        name = self.metadata.get("name")
        if name is not None and not (
            len(str(name)) <= SWEEP_NAME_MAX and re.fullmatch(DNS1035_LABEL, str(name))
        ):
            raise ValueError(f"metadata.name: {SWEEP_NAME_RULE}")
        return self

    @property
    def uid(self) -> str:
        return str(self.metadata.get("uid") or "")
