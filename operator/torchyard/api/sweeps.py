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

import functools
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    TypeAdapter,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from torchyard.api._base import (
    BASE_CONFIG,
    CONDITIONS_FIELD_EXTRA,
    Condition,
    Model,
    Named,
    NoNulStr,
    observed_generation,
    registered_model,
    schema_of,
)
from torchyard.api.inputs import PinnedInput
from torchyard.api.trainingruns import RUN_NAME_MAX, ModelOutput, TrainingRunSpec
from torchyard.api.wire import API_VERSION
from torchyard.launch.contract import PARAM_VARIABLE_PREFIX
from torchyard.sweeps import expressions, policies, sampling, space
from torchyard.sweeps.expressions import base
from torchyard.variants import Rule, broken

# A trial is the TrainingRun <sweep>-t<index>: the Sweep's name leaves room for the index.
MAX_TOTAL_TRIALS = 10000
SWEEP_NAME_MAX = RUN_NAME_MAX - len("-t") - len(str(MAX_TOTAL_TRIALS - 1))
SWEEP_NAME_RULE = (
    "a Sweep name must be a DNS-1035 label (lower-case letters, digits and '-', starting "
    f"with a letter) of at most {SWEEP_NAME_MAX} characters, so that its trials can be "
    "named <sweep>-t<index> as TrainingRuns"
)
# The limits of the sweeps core, which the schema holds too.
MAX_PARAMETERS = base.MAX_PARAMETERS
MAX_CHOICES = base.MAX_CHOICES
MAX_RANDINT = base.MAX_RANDINT
PARAMETER_NAME = "^" + space.NAME.pattern.removesuffix(r"\Z") + "$"
PARAMETER_NAME_RULE = (
    "every parameter name must be ASCII letters, digits and _ (not a digit first), at most "
    "63 characters: it becomes the trial's --<name> argument and TORCHYARD_PARAM_<NAME> "
    "variable"
)
ENV_PREFIX = PARAM_VARIABLE_PREFIX
# A trial's spec.env holds at most this many variables (TrainingRunSpec.env).
MAX_ENV = 128

SAMPLINGS = sampling.SAMPLINGS
SAMPLING_RULE = f"must be {', '.join(SAMPLINGS[:-1])} or {SAMPLINGS[-1]}"

# An int stays an int (q: 1 gives integer values), a float a float: one JSON number.
Number = Annotated[int | float, WithJsonSchema({"type": "number"})]
# A choice's values: numbers, strings or booleans (CEL sees no type of such an array).
Values = Annotated[
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


class ParameterExpression(Model):
    """One parameter's distribution: Azure ML's parameter expressions, as its sweep YAML
    writes them (``{type: uniform, minValue: 0.0005, maxValue: 0.005}``)."""

    # Its fields are the registered expressions' (torchyard.sweeps.expressions): a Sweep's
    # parameter is an instance of expression_model(), made from the registry, whose schema
    # and rules the CRD carries.

    model_config = schema_of(lambda: expression_model())

    type: str = Field(description="The expression.")


def _expression_rules(model: ParameterExpression) -> ParameterExpression:
    for field, membership in expressions.memberships():
        if not membership.holds(model):
            raise ValueError(membership.message)
        values = getattr(model, field.attribute)
        if field.kind == "values" and values is not None and not 1 <= len(values) <= MAX_CHOICES:
            raise ValueError(f"{field.name} must hold 1 to {MAX_CHOICES} values")
    rule = broken(expressions.value_rules(), model)
    if rule is not None:
        raise ValueError(rule.message)
    return model


_KINDS: dict[str, Any] = {
    "values": Values | None,
    "integer": int | None,
    "number": Number | None,
}


@functools.lru_cache(maxsize=4)
def _expression_model(generation: int) -> type[ParameterExpression]:
    fields: dict[str, Any] = {
        "type": (
            Literal[expressions.names()],
            Field(description=expressions.summary()),
        ),
    }
    for f in expressions.fields():
        fields[f.attribute] = (
            _KINDS[f.kind],
            Field(default=None, description=f.description, ge=f.minimum, le=f.maximum),
        )
    cel = (rule.cel for rule in expressions.cel_rules())
    return registered_model(ParameterExpression, fields, _expression_rules, cel)


def expression_model() -> type[ParameterExpression]:
    """A parameter's model for the expressions registered now."""
    return _expression_model(expressions.generation())


@functools.lru_cache(maxsize=4)
def _parameters_adapter(generation: int) -> TypeAdapter[dict[str, ParameterExpression]]:
    model: Any = _expression_model(generation)
    adapter: TypeAdapter[dict[str, ParameterExpression]] = TypeAdapter(dict[str, model])
    return adapter


class Objective(Model):
    """The primary metric and its goal (~ primary_metric_name, primary_metric_goal)."""

    metric: NoNulStr = Field(
        min_length=1,
        max_length=256,
        description="The metric the trials report (torchyard.progress.report(epoch, "
        "best_val_acc=...)) that ranks them and that early termination compares.",
    )
    goal: Literal["maximize", "minimize"] = Field(description="maximize or minimize the metric.")


class EarlyTermination(Model):
    """Stop trials that do poorly, at each evaluation interval (~ BanditPolicy,
    MedianStoppingPolicy, TruncationSelectionPolicy). An interval is a step a trial
    reported the metric at: report it with the epoch as the step
    (``progress.report(epoch, best_val_acc=...)``), and interval N is epoch N."""

    # Its fields are the registered policies' (torchyard.sweeps.policies): a Sweep's
    # policy is an instance of policy_model(), made from the registry, whose schema and
    # rules (CEL and their twins) the CRD carries.

    model_config = schema_of(lambda: policy_model())

    type: str = Field(max_length=32, description="The policy.")

    def policy_dict(self) -> dict[str, Any]:
        """The policy's own fields, as ``sweeps.stopping.parse_policy`` reads them (those of
        other policies left out: asha has no evaluation interval or delay)."""
        out = self.to_dict()
        if self.type not in policies.names():
            return out
        own = {f.name for f in policies.get(self.type).FIELDS}
        return {k: v for k, v in out.items() if k == "type" or k in own}


def _policy_rules(model: EarlyTermination) -> EarlyTermination:
    rule = broken(policies.rules(), model)
    if rule is not None:
        raise ValueError(rule.message)
    return model


@functools.lru_cache(maxsize=4)
def _policy_model(generation: int) -> type[EarlyTermination]:
    fields: dict[str, Any] = {
        "type": (str, Field(max_length=32, description=policies.summary())),
    }
    for f in policies.fields():
        kind: Any = int if f.integer else float
        annotation = kind if f.default is not None else kind | None
        fields[f.attribute] = (
            annotation,
            Field(default=f.default, description=f.description, ge=f.minimum, le=f.maximum),
        )
    return registered_model(
        EarlyTermination, fields, _policy_rules, (r.cel for r in policies.rules())
    )


def policy_model() -> type[EarlyTermination]:
    """``spec.earlyTermination``'s model for the policies registered now."""
    return _policy_model(policies.generation())


class RegisterBest(ModelOutput):
    """Register the best trial's outputs as a model version once the sweep succeeded (~
    ``hyperdrive_run.get_best_run_by_primary_metric().register_model(...)``): the trial
    with the best metric among those that completed, its archived ``path`` promoted as the
    model's next version, as a TrainingRun's ``outputs.register`` does."""


# The spec's own rules, around those its policy brings (``Policy.SPEC_RULES``: asha's
# checkpoints), as :func:`spec_rules` orders them.
_CONCURRENCY: tuple[Rule[Any], ...] = (
    Rule(
        {
            "rule": "!has(self.maxConcurrentTrials) || "
            "self.maxConcurrentTrials <= self.maxTotalTrials",
            "message": "maxConcurrentTrials must not exceed maxTotalTrials",
            "fieldPath": ".maxConcurrentTrials",
        },
        lambda s: s.max_concurrent_trials is None or s.max_concurrent_trials <= s.max_total_trials,
    ),
    Rule(
        {
            "rule": "!self.trial.suspend",
            "message": "the sweep suspends its trials itself (that is how it stops them): "
            "leave spec.trial.suspend out",
            "fieldPath": ".trial.suspend",
        },
        lambda s: not s.trial.suspend,
    ),
)
_ENV: tuple[Rule[Any], ...] = (
    Rule(
        {
            "rule": f"(has(self.trial.env) ? size(self.trial.env) : 0) + size(self.parameters) "
            f"<= {MAX_ENV}",
            "message": f"each parameter adds a {ENV_PREFIX}<NAME> variable to the trial's "
            f"env, which holds at most {MAX_ENV}: spec.trial.env and spec.parameters together "
            "are too many",
            "fieldPath": ".trial.env",
        },
        lambda s: len(s.trial.env) + len(s.parameters) <= MAX_ENV,
    ),
    Rule(
        {
            "rule": f"!has(self.trial.env) || "
            f"self.trial.env.all(e, !e.name.startsWith('{ENV_PREFIX}'))",
            "message": f"spec.trial.env must not set {ENV_PREFIX}* variables: the sweep sets "
            "one per parameter",
            "fieldPath": ".trial.env",
        },
        lambda s: not any(e.name.startswith(ENV_PREFIX) for e in s.trial.env),
    ),
)


def spec_rules() -> tuple[Rule[Any], ...]:
    """The Sweep spec's rules, the registered policies' among them."""
    return (*_CONCURRENCY, *policies.spec_rules(), *_ENV)


def _spec_schema(schema: dict[str, Any]) -> None:
    schema["x-kubernetes-validations"] = [rule.cel for rule in spec_rules()]


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

    model_config = ConfigDict(**BASE_CONFIG, json_schema_extra=_spec_schema)

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

    @field_validator("parameters", mode="wrap")
    @classmethod
    def _registered_expressions(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """Expressions of the registered ones (:func:`expression_model`)."""
        if isinstance(value, Mapping):
            value = _parameters_adapter(expressions.generation()).validate_python(value)
        return handler(value)

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

    @field_validator("early_termination", mode="wrap")
    @classmethod
    def _registered_policy(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """A policy of the registered ones (:func:`policy_model`)."""
        if isinstance(value, Mapping):
            return policy_model().model_validate(value)
        return handler(value)

    @model_validator(mode="after")
    def _checks(self) -> SweepSpec:
        rule = broken(spec_rules(), self)
        if rule is not None:
            raise ValueError(rule.message)
        return self

    @property
    def concurrency(self) -> int:
        """maxConcurrentTrials, or maxTotalTrials when unset."""
        return self.max_concurrent_trials or self.max_total_trials


class TrialCounts(Model):
    """How many trials are in which state."""

    planned: int = Field(default=0, description="Trials the sweep runs in all.")
    created: int = Field(default=0, description="Trials made so far.")
    pending: int = Field(default=0, description="Made, not started yet (see TrialsWaiting).")
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
        self.check_name(SWEEP_NAME_MAX, SWEEP_NAME_RULE)
        return self

    @property
    def uid(self) -> str:
        return str(self.metadata.get("uid") or "")
