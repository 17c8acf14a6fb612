"""Sweeps (hyperparameter tuning, Azure ML's HyperDrive) as pure functions.

No I/O, no clock, no Kubernetes, standard library only. The modules: ``space`` (the
parameter expressions, read from ``spec.parameters`` and checked), ``sampling`` (the n-th
trial's parameters, random or grid, and the arguments and variables a trial receives),
``stopping`` (the early-termination policies: bandit, median, truncation, ASHA).
Called by the Sweep controller, local mode and the SDK.
"""

from __future__ import annotations

from torchyard.sweeps.sampling import SamplingError, arguments, environment, trial_parameters
from torchyard.sweeps.space import SearchSpace, SpaceError, parse_space
from torchyard.sweeps.stopping import Action, Decision, Goal, PolicyError, parse_goal, parse_policy

__all__ = [
    "Action",
    "Decision",
    "Goal",
    "PolicyError",
    "SamplingError",
    "SearchSpace",
    "SpaceError",
    "arguments",
    "environment",
    "parse_goal",
    "parse_policy",
    "parse_space",
    "trial_parameters",
]
