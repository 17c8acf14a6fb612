"""The model registry: a PVC-backed store of run archives and immutable model versions.

``store`` holds the folder layout and the atomic publish; the HTTP service that owns the
volume in a cluster builds on it.
"""

from __future__ import annotations

from torchyard.registry.store import Store, Version, human_size, sha256_file

__all__ = ["Store", "Version", "human_size", "sha256_file"]
