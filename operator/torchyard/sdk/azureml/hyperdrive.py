"""HyperDrive (``azureml.train.hyperdrive``) as a ``Sweep``: the parameter expressions
(``uniform(0.0005, 0.005)``, ``choice(16, 32)`` ...: ``torchyard.sweeps.space``'s, which
write the Sweep's ``spec.parameters``), the samplings (random, grid, Bayesian), the
early-termination policies (bandit, median, truncation, none),
``PrimaryMetricGoal`` and ``HyperDriveConfig``, whose :func:`sweep_manifest` is the Sweep
``Experiment.submit`` creates (no I/O here). Every argument is checked when it is given,
with the sweeps core's rules, so a mistake is an error at the line that made it; what has
no meaning here is refused (``common.refuse``). ``HyperDriveRun`` is in
``hyperdrive_runs``. Tested in tests/unit/sdk/test_hyperdrive.py.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from torchyard import api
from torchyard.api import sweeps as sweep_api
from torchyard.sdk.azureml.common import TorchyardSdkError, refuse
from torchyard.sdk.azureml.run_configs import ScriptRunConfig
from torchyard.sweeps import expressions, sampling, space, stopping

# Azure ML's default max_duration_minutes (7 days).
DEFAULT_MAX_DURATION_MINUTES = 10080


def _expression(name: str, make: Any, *args: Any) -> space.Expression:
    try:
        expression: space.Expression = make(*args)
    except space.SpaceError as err:
        shown = ", ".join(repr(a) for a in args)
        raise TorchyardSdkError(f"{name}({shown}): {err}") from None
    return expression


# The parameter expressions (azureml.train.hyperdrive.parameter_expressions).


def choice(*options: Any) -> space.Expression:
    """One of the values: ``choice(16, 32, 64)`` or ``choice([16, 32, 64])``."""
    return _expression("choice", space.choice, *options)


def randint(upper: int) -> space.Expression:
    """An integer in [0, upper)."""
    return _expression("randint", space.randint, upper)


def uniform(min_value: float, max_value: float) -> space.Expression:
    return _expression("uniform", space.uniform, min_value, max_value)


def quniform(min_value: float, max_value: float, q: int | float) -> space.Expression:
    return _expression("quniform", space.quniform, min_value, max_value, q)


def loguniform(min_value: float, max_value: float) -> space.Expression:
    """exp(uniform(min_value, max_value)): the bounds are natural logarithms, as in Azure ML."""
    return _expression("loguniform", space.loguniform, min_value, max_value)


def qloguniform(min_value: float, max_value: float, q: int | float) -> space.Expression:
    return _expression("qloguniform", space.qloguniform, min_value, max_value, q)


def normal(mu: float, sigma: float) -> space.Expression:
    return _expression("normal", space.normal, mu, sigma)


def qnormal(mu: float, sigma: float, q: int | float) -> space.Expression:
    return _expression("qnormal", space.qnormal, mu, sigma, q)


def lognormal(mu: float, sigma: float) -> space.Expression:
    return _expression("lognormal", space.lognormal, mu, sigma)


def qlognormal(mu: float, sigma: float, q: int | float) -> space.Expression:
    return _expression("qlognormal", space.qlognormal, mu, sigma, q)


class PrimaryMetricGoal(Enum):
    MAXIMIZE = "MAXIMIZE"
    MINIMIZE = "MINIMIZE"


# The samplings.


class _Sampling:
    KIND = ""

    def __init__(self, parameter_space: dict[str, Any], properties: dict[str, Any] | None) -> None:
        refuse(
            type(self).__name__,
            {"properties": (properties, None)},
            "the sampling takes no properties here; a fixed random seed is a Sweep's "
            "spec.seed (torchyard sweep submit)",
        )
        if not isinstance(parameter_space, dict):
            raise TorchyardSdkError(
                f"{type(self).__name__} takes a dict of parameter name -> expression, e.g. "
                f"{{'learning_rate': uniform(0.0005, 0.005)}}, not {parameter_space!r}"
            )
        # HyperDrive's keys may be written as the arguments ('--learning_rate'): the
        # Sweep passes each parameter as --<name> itself.
        named = {
            (k[2:] if isinstance(k, str) and k.startswith("--") else k): v
            for k, v in parameter_space.items()
        }
        try:
            self.space = space.make_space(named, field="parameter_space")
        except space.SpaceError as err:
            raise TorchyardSdkError(f"{type(self).__name__}: {err}") from None
        self.parameter_space = parameter_space


class RandomParameterSampling(_Sampling):
    """Each trial's values drawn at random from the expressions."""

    KIND = "random"

    def __init__(self, parameter_space: dict[str, Any], properties: dict[str, Any] | None = None):
        super().__init__(parameter_space, properties)


class GridParameterSampling(_Sampling):
    """Every combination of the ``choice`` values, each once."""

    KIND = "grid"

    def __init__(self, parameter_space: dict[str, Any], properties: dict[str, Any] | None = None):
        super().__init__(parameter_space, properties)
        others = [p.name for p in self.space.parameters if p.expression.grid_values() is None]
        if others:
            raise TorchyardSdkError(
                f"GridParameterSampling takes choice() expressions only; {', '.join(others)} "
                "is not one: use choice(...) values, or RandomParameterSampling"
            )


class BayesianParameterSampling(_Sampling):
    """Each trial's values chosen by Optuna's TPE sampler from the results of the trials
    before it; bounded expressions only (choice, randint, the uniform and loguniform
    forms)."""

    KIND = "bayesian"

    def __init__(self, parameter_space: dict[str, Any], properties: dict[str, Any] | None = None):
        super().__init__(parameter_space, properties)
        try:
            sampling.check_bayesian(self.space)
        except sampling.SamplingError as err:
            raise TorchyardSdkError(f"BayesianParameterSampling: {err}") from None


# The early-termination policies.


class _Policy:
    def __init__(self, spec: dict[str, Any] | None) -> None:
        if spec is not None:
            try:
                stopping.parse_policy(spec, field=type(self).__name__)
            except stopping.PolicyError as err:
                raise TorchyardSdkError(str(err)) from None
        self._spec = spec

    def to_json(self) -> dict[str, Any] | None:
        """The Sweep's ``spec.earlyTermination`` (None: no early termination)."""
        return None if self._spec is None else dict(self._spec)


class BanditPolicy(_Policy):
    """Stop a trial whose best metric is not within the slack of the best trial's."""

    def __init__(
        self,
        evaluation_interval: int = 1,
        slack_factor: float | None = None,
        slack_amount: float | None = None,
        delay_evaluation: int = 0,
    ) -> None:
        if (slack_factor is None) == (slack_amount is None):
            raise TorchyardSdkError(
                "BanditPolicy takes exactly one of slack_factor and slack_amount"
            )
        spec: dict[str, Any] = {"type": "bandit"}
        if slack_factor is not None:
            spec["slackFactor"] = slack_factor
        if slack_amount is not None:
            spec["slackAmount"] = slack_amount
        spec |= {"evaluationInterval": evaluation_interval, "delayEvaluation": delay_evaluation}
        super().__init__(spec)


class MedianStoppingPolicy(_Policy):
    """Stop a trial whose best metric is worse than the median of all running averages."""

    def __init__(self, evaluation_interval: int = 1, delay_evaluation: int = 5) -> None:
        super().__init__(
            {
                "type": "median",
                "evaluationInterval": evaluation_interval,
                "delayEvaluation": delay_evaluation,
            }
        )


class TruncationSelectionPolicy(_Policy):
    """Stop the lowest ``truncation_percentage`` % of the trials at each interval."""

    def __init__(
        self,
        truncation_percentage: int,
        evaluation_interval: int = 1,
        delay_evaluation: int = 0,
        exclude_finished_jobs: bool = False,
    ) -> None:
        refuse(
            "TruncationSelectionPolicy",
            {"exclude_finished_jobs": (exclude_finished_jobs, False)},
            "the Sweep compares a trial with every trial that reached the interval, "
            "finished ones included",
        )
        super().__init__(
            {
                "type": "truncation",
                "truncationPercentage": truncation_percentage,
                "evaluationInterval": evaluation_interval,
                "delayEvaluation": delay_evaluation,
            }
        )


class NoTerminationPolicy(_Policy):
    """Every trial runs to its end (as ``policy=None``)."""

    def __init__(self) -> None:
        super().__init__(None)


def _whole(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TorchyardSdkError(f"{name} must be a whole number >= {low}, not {value!r}")
    if high is not None and value > high:
        raise TorchyardSdkError(f"{name} must be at most {high}, not {value!r}")
    return value


class HyperDriveConfig:
    """A sweep: ``run_config`` (a ScriptRunConfig) run as ``max_total_runs`` trials with
    the sampled parameters appended to its arguments (``--learning_rate 0.0031``), at most
    ``max_concurrent_runs`` at a time, ranked by ``primary_metric_name`` (what the script
    logs with ``Run.get_context().log``), stopped early by ``policy``."""

    def __init__(
        self,
        hyperparameter_sampling: _Sampling,
        primary_metric_name: str,
        primary_metric_goal: PrimaryMetricGoal | str,
        max_total_runs: int,
        max_concurrent_runs: int | None = None,
        max_duration_minutes: int = DEFAULT_MAX_DURATION_MINUTES,
        policy: _Policy | None = None,
        estimator: Any = None,
        run_config: ScriptRunConfig | None = None,
        resume_from: Any = None,
        resume_child_runs: Any = None,
        pipeline: Any = None,
        debug_flag: Any = None,
        custom_run_id: Any = None,
    ) -> None:
        refuse(
            "HyperDriveConfig",
            {
                "estimator": (estimator, None),
                "resume_from": (resume_from, None),
                "resume_child_runs": (resume_child_runs, None),
                "pipeline": (pipeline, None),
                "debug_flag": (debug_flag, None),
                "custom_run_id": (custom_run_id, None),
            },
            "the trials run a ScriptRunConfig (run_config=); a trial resumes from its "
            "checkpoint in the script; the sweep's name is made by Experiment.submit",
        )
        if not isinstance(run_config, ScriptRunConfig):
            raise TorchyardSdkError(
                f"HyperDriveConfig needs run_config=ScriptRunConfig(...), the run each trial "
                f"is, not {run_config!r}"
            )
        if not isinstance(hyperparameter_sampling, _Sampling):
            raise TorchyardSdkError(
                "hyperparameter_sampling must be RandomParameterSampling, "
                f"GridParameterSampling or BayesianParameterSampling, not "
                f"{hyperparameter_sampling!r}"
            )
        if policy is not None and not isinstance(policy, _Policy):
            raise TorchyardSdkError(
                "policy must be BanditPolicy, MedianStoppingPolicy, TruncationSelectionPolicy, "
                f"NoTerminationPolicy or None, not {policy!r}"
            )
        if not isinstance(primary_metric_name, str) or not primary_metric_name.strip():
            raise TorchyardSdkError(
                f"primary_metric_name must name the metric the script logs, not "
                f"{primary_metric_name!r}"
            )
        goal = (
            primary_metric_goal.value
            if isinstance(primary_metric_goal, PrimaryMetricGoal)
            else primary_metric_goal
        )
        try:
            self.goal = stopping.parse_goal(goal, field="primary_metric_goal")
        except stopping.PolicyError as err:
            raise TorchyardSdkError(f"{err} (PrimaryMetricGoal.MAXIMIZE or .MINIMIZE)") from None
        total = _whole("max_total_runs", max_total_runs, 1, sweep_api.MAX_TOTAL_TRIALS)
        if max_concurrent_runs is not None:
            _whole("max_concurrent_runs", max_concurrent_runs, 1)
            if max_concurrent_runs > total:
                raise TorchyardSdkError(
                    f"max_concurrent_runs ({max_concurrent_runs}) must not exceed "
                    f"max_total_runs ({total})"
                )
        _whole("max_duration_minutes", max_duration_minutes, 1)
        try:
            sampling.check(hyperparameter_sampling.KIND, hyperparameter_sampling.space, total)
        except sampling.SamplingError as err:
            raise TorchyardSdkError(str(err).replace("maxTotalTrials", "max_total_runs")) from None
        self.run_config = run_config
        self.hyperparameter_sampling = hyperparameter_sampling
        self.policy = policy
        self.primary_metric_name = primary_metric_name
        self.max_total_runs = total
        self.max_concurrent_runs = max_concurrent_runs
        self.max_duration_minutes = max_duration_minutes

    def sweep_spec(self, trial: dict[str, Any]) -> dict[str, Any]:
        """The Sweep's spec, with ``trial`` (the TrainingRun spec of ``run_config``)."""
        spec: dict[str, Any] = {
            "trial": trial,
            "parameters": self.hyperparameter_sampling.space.to_json(),
            "sampling": self.hyperparameter_sampling.KIND,
            "objective": {"metric": self.primary_metric_name, "goal": self.goal.value},
            "maxTotalTrials": self.max_total_runs,
            "maxDurationSeconds": self.max_duration_minutes * 60,
        }
        if self.max_concurrent_runs is not None:
            spec["maxConcurrentTrials"] = self.max_concurrent_runs
        early = self.policy.to_json() if self.policy is not None else None
        if early is not None:
            spec["earlyTermination"] = early
        return spec


def sweep_manifest(
    config: HyperDriveConfig, trial: dict[str, Any], metadata: dict[str, Any]
) -> dict[str, Any]:
    """The Sweep ``Experiment.submit(config)`` creates (checked as the apiserver would:
    ``api.InvalidSpec`` names the field)."""
    body = {
        "apiVersion": api.API_VERSION,
        "kind": "Sweep",
        "metadata": metadata,
        "spec": config.sweep_spec(trial),
    }
    api.parse_sweep(body)
    return body


__all__ = [
    "BanditPolicy",
    "BayesianParameterSampling",
    "GridParameterSampling",
    "HyperDriveConfig",
    "MedianStoppingPolicy",
    "NoTerminationPolicy",
    "PrimaryMetricGoal",
    "RandomParameterSampling",
    "TruncationSelectionPolicy",
    # the parameter expressions (choice, uniform, ...), as the built-in ones are named
    *expressions.BUILT_IN,
]
