"""Sweeps (hyperparameter tuning, Azure ML's HyperDrive) as pure functions.

No I/O, no clock, no Kubernetes, standard library only. The modules: ``space`` (the
parameter expressions, read from ``spec.parameters`` and checked), ``sampling`` (the n-th
trial's parameters, random or grid, and the arguments and variables a trial receives).
Called by the Sweep controller, local mode and the SDK.
"""

from __future__ import annotations

from torchyard.sweeps.sampling import SamplingError, arguments, environment, trial_parameters
from torchyard.sweeps.space import SearchSpace, SpaceError, parse_space

__all__ = [
    "SamplingError",
    "SearchSpace",
    "SpaceError",
    "arguments",
    "environment",
    "parse_space",
    "trial_parameters",
]
