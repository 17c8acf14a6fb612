"""Tuning: what a Sweep does, in one copy for the Sweep controller and local mode.

``plans`` (the spec compiled for the sweeps core, each trial's parameters under its
sampling), ``sweep_trials`` (a trial as seen, the ledger that remembers every trial, the
book of trials folded from both), ``sweep_policy`` (which trials the early-termination
policy stops, which start, whether the sweep finished), ``bayesian`` (Optuna's TPE: the one
module that imports ``optuna``). Pure but for what the caller passes in; over the sweeps
core (``torchyard.sweeps``), under the controller and local mode.
"""
