"""Sweeps (hyperparameter tuning, Azure ML's HyperDrive) as pure functions.

No I/O, no clock, no Kubernetes, standard library only. The modules: ``space`` (the
parameter expressions, read from ``spec.parameters`` and checked). Called by the Sweep
controller, local mode and the SDK.
"""

from __future__ import annotations

from torchyard.sweeps.space import SearchSpace, SpaceError, parse_space

__all__ = ["SearchSpace", "SpaceError", "parse_space"]
