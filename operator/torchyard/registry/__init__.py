"""The model registry: a PVC-backed store of run archives and immutable model versions.

``store`` holds the folder layout and the atomic publish, used by local mode and by the
HTTP service that owns the volume in a cluster (``service``, its face, over ``variables``,
``access``, ``bodies``, ``archives``, ``versions``, ``records`` and ``tls``); ``auth`` is
who may use the service, ``client`` the one HTTP client of it. This file re-exports the
store.
"""

from __future__ import annotations

from torchyard.registry.store import Store, Version, human_size, sha256_file

__all__ = ["Store", "Version", "human_size", "sha256_file"]
