"""Finalizing a run whose nodes all succeeded: register its outputs as a model version.

:func:`needs_registering` (pure) says when: ``outputs.register`` is set, every node Pod
succeeded and node 0's outputs were archived (with ``outputs.optional`` a node may
succeed without them). :func:`register` asks the registry service to promote the run's
archived outputs (``registry.client``, with ``planning.models.promote_metadata``, as the
SDK's ``register_model`` does) and records the answer as a
ModelVersion with its ``Available`` status (the one place the controller writes a
ModelVersion's status). :func:`archive_warning` is the Warning Event of a run that
succeeded without all of its archive. Called by ``trainingruns.reconcile``; tested in
tests/unit/controller/test_reconcile.py and tests/integration/test_archiving.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from torchyard import api, status
from torchyard.controller import recording
from torchyard.controller.context import Context, Event, Log
from torchyard.planning import models as model_plans
from torchyard.registry.client import RegistryError
from torchyard.status import failures


class ModelRef(TypedDict):
    """``status.model``: the model version a run registered."""

    name: str
    version: int


@dataclass(frozen=True)
class Registration:
    """What registering did: the model version, or why it is not there yet."""

    model: ModelRef | None = None
    # Why it cannot be done yet ("" with no model: no registry service, nothing to wait for).
    waiting: str = ""

    @property
    def done(self) -> bool:
        return self.model is not None or not self.waiting


def needs_registering(run: api.TrainingRun, pods: Sequence[Mapping[str, Any]]) -> bool:
    return (
        run.spec.outputs.register_ is not None
        and len(pods) == run.spec.distribution.node_count
        and all(p.get("status", {}).get("phase") == "Succeeded" for p in pods)
        and 0 not in failures.archive_failures(pods)
    )


def register(
    run: api.TrainingRun, environment: Mapping[str, Any] | None, ctx: Context, logger: Log
) -> Registration:
    """Promote the run's outputs in the registry service and record a ModelVersion."""
    reg = run.spec.outputs.register_
    assert reg is not None
    url = ctx.settings.registry_url
    if not url:
        logger.warning(
            "TrainingRun %s/%s: outputs.register is set but no registry service "
            "is configured (TORCHYARD_REGISTRY_URL)",
            run.namespace,
            run.name,
        )
        return Registration()
    image = str(((environment or {}).get("status") or {}).get("image") or "")
    try:
        manifest = recording.client(ctx).promote(
            run.namespace,
            reg.model,
            run.name,
            reg.path,
            model_plans.promote_metadata(run, image=image),
        )
    except RegistryError as err:
        if err.status is not None:
            return Registration(waiting=f"the registry refused the promotion: {err}")
        return Registration(waiting=str(err))
    except (OSError, ValueError) as err:  # the token file, the CA
        return Registration(waiting=f"the registry service is not reachable: {err}")
    files = manifest.get("files", [])
    primary = next((f for f in files if f["path"].endswith(".pt")), files[0] if files else {})
    mv = ctx.k8s.apply(
        model_plans.model_version(
            run.namespace,
            reg.model,
            manifest,
            run=run.name,
            run_uid=str(run.metadata.get("uid", "")),
            command=list(run.spec.command),
            image=image,
        )
    )
    if status.find((mv.get("status") or {}).get("conditions"), "Available") is None:
        available = status.modelversion_status(
            len(files),
            str(manifest.get("size", "")),
            manifest.get("created"),
            mv.get("metadata", {}).get("generation"),
            ctx.clock(),
        )
        ctx.k8s.apply_status(
            model_plans.model_version_status(run.namespace, mv["metadata"]["name"], available)
        )
    logger.info(
        "TrainingRun %s/%s registered %s version %s (%s sha256 %s)",
        run.namespace,
        run.name,
        reg.model,
        manifest["version"],
        primary.get("path"),
        primary.get("sha256"),
    )
    return Registration(ModelRef(name=reg.model, version=manifest["version"]))


def archive_warning(previous: Mapping[str, Any], new: Mapping[str, Any]) -> Event | None:
    """A run that succeeded (or began finalizing) without all of its archive
    (``outputs.optional``): a Warning, once."""
    archived = status.find(new.get("conditions"), "OutputsArchived")
    if archived is None or archived.get("status") != "False":
        return None
    if new.get("phase") == previous.get("phase"):
        return None
    if new.get("phase") not in (api.Phase.SUCCEEDED.value, api.Phase.FINALIZING.value):
        return None
    if previous.get("phase") == api.Phase.FINALIZING.value:
        return None  # said when it began finalizing
    return Event("Warning", failures.ARCHIVE_FAILED, str(archived.get("message") or ""))
