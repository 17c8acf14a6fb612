"""A TrainingRun's ``spec.policy``: restarts, lifetimes, stall timeouts and log rules.

Pydantic models of that field (the CRD is generated from them, ``api.crds``); imported
by ``api.trainingruns`` (``TrainingRunSpec.policy``), read through the run elsewhere.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from torchyard.api._base import (
    Model,
)
from torchyard.launch.contract import LOG_LIMIT_MAX, LOG_LIMIT_MIN

LOG_RULE_ACTIONS = ("cancelRetries", "excludeNode", "ignore")
LOG_RULE_PATTERN_MAX = 256


class LogRule(Model):
    """What a line of any rank's output means for the run (~ Determined's log policies)."""

    pattern: str = Field(
        min_length=1,
        max_length=LOG_RULE_PATTERN_MAX,
        description="A Python regular expression searched in every line of every rank's "
        "output (e.g. 'CUDA error: an illegal memory access').",
    )
    action: Literal["cancelRetries", "excludeNode", "ignore"] = Field(
        description="cancelRetries: a failure after such a line is not retried; excludeNode: "
        "the gang's next attempt avoids the node of the Pod that printed it "
        "(status.excludedNodes); ignore: such a line is no evidence of a failure class "
        "(status.failure.class) nor of a later rule."
    )

    @model_validator(mode="after")
    def _pattern_compiles(self) -> LogRule:
        try:
            re.compile(self.pattern)
        except re.error as err:
            raise ValueError(
                f"policy.logRules pattern {self.pattern!r} is not a valid regular expression "
                f"({err}): escape characters such as ( [ + * ? with a backslash to match "
                "them as they are"
            ) from None
        return self


class StallBudgets(Model):
    """Stall timeouts while a rank says it is not training (``progress.report(phase=...)``)."""

    initializing: int | None = Field(
        default=None, ge=5, le=604800, description="Seconds while initializing (default 1800)."
    )
    saving: int | None = Field(
        default=None, ge=5, le=604800, description="Seconds while saving (default 1800)."
    )
    evaluating: int | None = Field(
        default=None, ge=5, le=604800, description="Seconds while evaluating (default 3600)."
    )


class Policy(Model):
    """Restarts and lifetimes."""

    backoff_limit: int = Field(
        default=0,
        ge=0,
        le=100,
        description="How often a run whose code failed is restarted: in place (the ranks "
        "start again inside the node Pods, from the newest complete checkpoint) where the "
        "node launchers can agree on it, else as a whole gang. Platform failures (node lost, "
        "eviction, preemption) do not count.",
    )
    platform_restart_limit: int = Field(
        default=20,
        ge=0,
        le=1000,
        description="How often the gang is restarted after platform failures (node lost, "
        "eviction, preemption) before the run fails with that reason (0: the first one "
        "fails the run).",
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Fail the run when it has been running longer than this: the time since "
        "it first ran, across all its attempts, less the time it was suspended (spec.suspend, "
        "or Kueue stopping it; as a Job's timer stops while suspended). Each attempt's node "
        "Pods get the seconds left as their own activeDeadlineSeconds.",
    )
    stall_timeout_seconds: int | None = Field(
        default=None,
        ge=5,
        le=86400,
        description="Fail a node whose rank made no progress (torchyard.progress reports) "
        "for this long, naming the rank and where it hangs, with every rank's stacks "
        "archived. Default: max(300, 5 x the slowest step seen after the first); ranks "
        "that never report are not watched. Keep it below the NCCL timeout (10 min).",
    )
    stall_budgets: StallBudgets | None = Field(
        default=None,
        description="The stall timeout while a rank says it is initializing, saving or "
        "evaluating (torchyard.progress.report(phase=...)), for it and the ranks of its node "
        "(which may wait for it); default 1800, 1800 and 3600 seconds.",
    )
    log_rules: list[LogRule] | None = Field(
        default=None,
        max_length=16,
        description="Rules over the ranks' output lines, first match wins: cancelRetries, "
        "excludeNode or ignore.",
    )
    log_limit_bytes: int | None = Field(
        default=None,
        ge=LOG_LIMIT_MIN,
        le=LOG_LIMIT_MAX,
        description="The most each rank's archived log (logs/rank-<r>.txt) may hold; a rank "
        "that writes more keeps its first and last half, with a line saying how many bytes "
        "and lines were dropped between them. Default: the operator's "
        "(--default-log-limit-bytes, the chart's operator.defaultLogLimitBytes), else 64 MiB.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="Delete the Pods and Service this long after the run finished "
        "(the run and its archived logs stay).",
    )
    termination_grace_period_seconds: int = Field(
        default=30,
        ge=1,
        le=86400,
        description="terminationGracePeriodSeconds of the node Pods: the time between "
        "SIGTERM and SIGKILL. With spec.checkpoints the ranks save a just-in-time "
        "checkpoint in it: make it longer than the slowest step plus the slowest save.",
    )


# A path segment ".." (also percent-encoded), with "/" or "\\" as separators.
