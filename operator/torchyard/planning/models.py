"""The ModelVersion a promotion in the registry service is recorded as (pure)."""

from __future__ import annotations

from typing import Any

from torchyard import api
from torchyard.planning import names


def model_version(
    namespace: str,
    model: str,
    manifest: dict[str, Any],
    *,
    run: str,
    run_uid: str,
    command: list[str],
    image: str = "",
) -> dict[str, Any]:
    """``<model>-v<N>``: no owner, so it outlives its run; spec from the manifest."""
    version = manifest["version"]
    return {
        "apiVersion": api.API_VERSION,
        "kind": "ModelVersion",
        "metadata": {
            "name": names.model_version(model, version),
            "namespace": namespace,
            "labels": {names.LABEL_MODEL: model, names.LABEL_RUN: run},
        },
        "spec": {
            "model": model,
            "version": version,
            "run": {"name": run, "uid": run_uid},
            "files": manifest.get("files", []),
            "totalBytes": manifest.get("totalBytes", 0),
            "size": manifest.get("size", ""),
            "command": list(command),
            "metrics": manifest.get("metrics", {}),
            "storagePath": f"{namespace}/models/{model}/{version}",
            **({"environmentImage": image} if image else {}),
        },
    }
