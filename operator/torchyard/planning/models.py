"""Registering a model, the pure half: what a promotion records about its run, and the
ModelVersion it is recorded as (pure).

:func:`promote_metadata` is the one metadata of a model version made from a run: the
operator's finalize step (``controller.finalize``), the SDK's ``Run.register_model`` and
local mode (``local.finalize``) all build it here, and only ``tags``, ``properties``,
``description`` and ``framework`` (the SDK's arguments), ``metrics`` (local mode reads
them off the run's folder) and ``mode`` differ; tests/unit/planning/test_models.py is the
table of those differences. :func:`model_version` and :func:`model_version_status` are the
ModelVersion ``<model>-v<N>`` and its status, from the registry's manifest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from torchyard import api
from torchyard.planning import names


class RunRef(TypedDict):
    """The run a version came from (the registry checks name and namespace)."""

    name: str
    namespace: str
    uid: str


class Framework(TypedDict):
    name: str
    version: str


class PromoteMetadata(TypedDict, total=False):
    """What a promotion adds to the registry's manifest (keys: the store's METADATA_KEYS)."""

    run: RunRef
    environment: str
    environmentImage: str
    command: list[str]
    nodeCount: int
    processCountPerNode: int
    metrics: dict[str, float]
    tags: dict[str, str]
    properties: dict[str, Any]
    description: str
    framework: Framework
    mode: Literal["local"]


def promote_metadata(
    run: api.TrainingRun,
    *,
    image: str = "",
    metrics: Mapping[str, float] | None = None,
    tags: Mapping[str, str] | None = None,
    properties: Mapping[str, Any] | None = None,
    description: str | None = None,
    framework: Framework | None = None,
    local: bool = False,
) -> PromoteMetadata:
    """The metadata of a model version made from ``run``; ``image`` is the Environment's
    image when known (its status' digest in a cluster, spec.image locally). What is None
    is left out."""
    dist = run.spec.distribution
    meta = PromoteMetadata(
        run=RunRef(name=run.name, namespace=run.namespace, uid=str(run.metadata.get("uid") or "")),
        environment=run.spec.environment,
        command=list(run.spec.command),
        nodeCount=dist.node_count,
        processCountPerNode=dist.process_count_per_node,
    )
    if image:
        meta["environmentImage"] = image
    if metrics is not None:
        meta["metrics"] = dict(metrics)
    if tags is not None:
        meta["tags"] = dict(tags)
    if properties is not None:
        meta["properties"] = dict(properties)
    if description is not None:
        meta["description"] = description
    if framework is not None:
        meta["framework"] = framework
    if local:
        meta["mode"] = "local"
    return meta


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


def model_version_status(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
    """The status-subresource apply of ModelVersion ``name`` (``status``:
    ``torchyard.status.modelversion_status``)."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": "ModelVersion",
        "metadata": {"name": name, "namespace": namespace},
        "status": status,
    }
