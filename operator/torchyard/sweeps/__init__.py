"""Sweeps (hyperparameter tuning, Azure ML's HyperDrive) as pure functions.

No I/O, no clock, no Kubernetes, standard library only. The modules: ``space`` (the
parameter expressions, read from ``spec.parameters`` and checked), ``sampling`` (the n-th
trial's parameters, random or grid, and the arguments and variables a trial receives),
``stopping`` (the early-termination policies: bandit, median, truncation, ASHA), ``trials``
(the book of trials the Sweep's status holds, folded from events). Called by the Sweep
controller, local mode and the SDK.
"""

from __future__ import annotations

from torchyard.sweeps.sampling import SamplingError, arguments, environment, trial_parameters
from torchyard.sweeps.space import SearchSpace, SpaceError, parse_space
from torchyard.sweeps.stopping import Action, Decision, Goal, PolicyError, parse_goal, parse_policy
from torchyard.sweeps.trials import Book, TrialRecord, TrialState, fold, summary

__all__ = [
    "Action",
    "Book",
    "Decision",
    "Goal",
    "PolicyError",
    "SamplingError",
    "SearchSpace",
    "SpaceError",
    "TrialRecord",
    "TrialState",
    "arguments",
    "environment",
    "fold",
    "parse_goal",
    "parse_policy",
    "parse_space",
    "summary",
    "trial_parameters",
]
