"""The Python SDK: what a user script calls (the CLI is a thin layer over it).

- the Azure ML SDK (v1) names (``torchyard.sdk.azureml``): Workspace, Experiment,
  ScriptRunConfig, Environment, ComputeTarget, PyTorchConfiguration, MpiConfiguration,
  Run (wait_for_completion, register_model, download_file), and HyperDrive's
  (HyperDriveConfig, the samplings, policies and expressions, HyperDriveRun: a Sweep), so
  that the guide "Train PyTorch models at scale" and its tuning notebook run with only
  their imports changed;
- ``sweeps``: reading Sweeps (their trials, the best one) and canceling them;
- ``registry``: models and run files in the model registry service;
- ``runs``: following TrainingRuns (state, per-node Pods, logs, outcome);
- ``records``: run history, live runs beside the records of those that are gone;
- ``snapshots``: reproducible, content-addressed snapshots of a source folder.
"""

from __future__ import annotations

from torchyard.sdk import azureml
from torchyard.sdk.azureml import *  # noqa: F403  (the Azure ML names, see azureml.__all__)
from torchyard.sdk.registry import RegistryClient, RegistryError

__all__ = [*azureml.__all__, "RegistryClient", "RegistryError"]
