"""The Python SDK: what a user script calls (the CLI is a thin layer over it).

- ``registry``: models and run files in the model registry service
  (~ Azure ML ``Model.list``, ``run.download_file``, ``model.download``).
"""

from __future__ import annotations

from torchyard.sdk.registry import RegistryClient, RegistryError

__all__ = ["RegistryClient", "RegistryError"]
