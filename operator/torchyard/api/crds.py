"""CustomResourceDefinitions generated from the API models.

``crds/*.yaml`` are written by ``python -m torchyard.api.crds crds/`` and a unit test
fails when they drift from the models. The pydantic JSON schema is turned into a
structural OpenAPI v3 schema: references inlined, ``null`` alternatives dropped (an
optional field is simply not required), titles removed, and the ``x-kubernetes-*``
extensions (CEL rules, list types) carried over. Pure: no I/O except in ``main``.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from torchyard.api._base import CATEGORY, DNS1035_LABEL, GROUP, VERSION, Model
from torchyard.api.endpoints import ENDPOINT_NAME_MAX, ENDPOINT_NAME_RULE, OnlineEndpoint
from torchyard.api.environments import Environment
from torchyard.api.modelversions import ModelVersion
from torchyard.api.sweeps import SWEEP_NAME_MAX, SWEEP_NAME_RULE, Sweep
from torchyard.api.trainingruns import RUN_NAME_MAX, RUN_NAME_RULE, TrainingRun

_DROP = {"title"}


@dataclass(frozen=True)
class Kind:
    """What a CRD says beyond the schema of its model."""

    model: type[Model]
    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    columns: tuple[dict[str, Any], ...]
    description: str
    root_rules: tuple[dict[str, Any], ...] = ()

    @property
    def name(self) -> str:
        return f"{self.plural}.{GROUP}"


def _name_rule(most: int, message: str) -> dict[str, Any]:
    """The root CEL rule of a kind whose children are named after it."""
    return {
        "rule": f"size(self.metadata.name) <= {most} && "
        f"self.metadata.name.matches('{DNS1035_LABEL}')",
        "message": message,
    }


def _age() -> dict[str, Any]:
    return {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


KINDS: tuple[Kind, ...] = (
    Kind(
        model=TrainingRun,
        kind="TrainingRun",
        plural="trainingruns",
        singular="trainingrun",
        short_names=("tr",),
        description="A distributed PyTorch training run: one Pod per node with the rank "
        "contract injected, gang-admitted, its outputs archived to the model registry.",
        columns=(
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {
                "name": "Nodes",
                "type": "string",
                "jsonPath": ".status.nodes.ready",
                "description": "Node Pods running / total",
            },
            {
                "name": "Processes",
                "type": "integer",
                "jsonPath": ".status.worldSize",
                "description": "World size: nodeCount x processCountPerNode",
            },
            {
                "name": "Queue",
                "type": "integer",
                "jsonPath": ".status.queue.position",
                "description": "Place in its pool's queue while Queued",
            },
            {
                "name": "Environment",
                "type": "string",
                "jsonPath": ".spec.environment",
                "priority": 1,
            },
            {"name": "Model", "type": "string", "jsonPath": ".status.model.name"},
            {"name": "Version", "type": "integer", "jsonPath": ".status.model.version"},
            {
                "name": "Step",
                "type": "integer",
                "jsonPath": ".status.progress.step",
                "description": "The leading rank's last reported step",
            },
            {
                "name": "Percent",
                "type": "integer",
                "jsonPath": ".status.progress.percent",
                "description": "step / total in percent",
            },
            {
                "name": "ETA",
                "type": "string",
                "jsonPath": ".status.progress.eta",
                "description": "Time left at the current speed",
            },
            {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "priority": 1},
            _age(),
        ),
        root_rules=(_name_rule(RUN_NAME_MAX, RUN_NAME_RULE),),
    ),
    Kind(
        model=Environment,
        kind="Environment",
        plural="environments",
        singular="environment",
        short_names=("env",),
        description="A training image: prebuilt (curated), or built in the cluster from a "
        "base image plus pip/conda packages and cached by a content hash.",
        columns=(
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Image", "type": "string", "jsonPath": ".status.image"},
            {"name": "Hash", "type": "string", "jsonPath": ".status.hash", "priority": 1},
            _age(),
        ),
    ),
    Kind(
        model=ModelVersion,
        kind="ModelVersion",
        plural="modelversions",
        singular="modelversion",
        short_names=("mv",),
        description="One immutable version of a registered model: files with sizes and "
        "sha256, the run that produced it and its metrics.",
        columns=(
            {"name": "Model", "type": "string", "jsonPath": ".spec.model"},
            {"name": "Version", "type": "integer", "jsonPath": ".spec.version"},
            {"name": "Run", "type": "string", "jsonPath": ".spec.run.name"},
            {"name": "Size", "type": "string", "jsonPath": ".spec.size"},
            _age(),
        ),
        root_rules=(
            {
                "rule": "self.spec == oldSelf.spec",
                "message": "a ModelVersion is immutable: register a new version instead",
                "fieldPath": ".spec",
            },
        ),
    ),
    Kind(
        model=Sweep,
        kind="Sweep",
        plural="sweeps",
        singular="sweep",
        short_names=("sw",),
        description="Hyperparameter tuning (~ Azure ML HyperDrive): trial TrainingRuns "
        "made from a template with sampled parameters, some at a time, stopped early by a "
        "policy, the best named by the objective.",
        columns=(
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {
                "name": "Done",
                "type": "integer",
                "jsonPath": ".status.trials.done",
                "description": "Trials ended (stopped, completed, failed, canceled)",
            },
            {
                "name": "Running",
                "type": "integer",
                "jsonPath": ".status.trials.running",
                "description": "Trials running",
            },
            {
                "name": "Stopped",
                "type": "integer",
                "jsonPath": ".status.trials.stopped",
                "description": "Trials stopped early by the policy",
            },
            {
                "name": "Total",
                "type": "integer",
                "jsonPath": ".status.trials.planned",
                "description": "Trials the sweep runs in all",
            },
            {
                "name": "Best",
                "type": "number",
                "jsonPath": ".status.best.metric",
                "description": "The best metric any trial reported",
            },
            {
                "name": "Trial",
                "type": "string",
                "jsonPath": ".status.best.name",
                "description": "The trial with the best metric",
            },
            {
                "name": "Metric",
                "type": "string",
                "jsonPath": ".spec.objective.metric",
                "priority": 1,
            },
            _age(),
        ),
        root_rules=(_name_rule(SWEEP_NAME_MAX, SWEEP_NAME_RULE),),
    ),
    Kind(
        model=OnlineEndpoint,
        kind="OnlineEndpoint",
        plural="onlineendpoints",
        singular="onlineendpoint",
        # not "ep": that is the core Endpoints' short name
        short_names=("oe",),
        description="A registered model served online (~ Azure ML Model.deploy): serving "
        "Pods that run the scoring script's init() and run(raw_data) behind a Service, the "
        "model fetched through the inputs cache, rolled out without dropping a request.",
        columns=(
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Model", "type": "string", "jsonPath": ".status.model.name"},
            {"name": "Version", "type": "integer", "jsonPath": ".status.model.version"},
            {
                "name": "Ready",
                "type": "integer",
                "jsonPath": ".status.readyReplicas",
                "description": "Serving Pods that are ready",
            },
            {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
            {"name": "URI", "type": "string", "jsonPath": ".status.scoringUri", "priority": 1},
            _age(),
        ),
        root_rules=(_name_rule(ENDPOINT_NAME_MAX, ENDPOINT_NAME_RULE),),
    ),
)


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline ``$ref``s and collapse pydantic's constructs into structural schema."""
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    ref = node.pop("$ref", None)
    if ref is not None:
        target = copy.deepcopy(defs[ref.rsplit("/", 1)[-1]])
        # Field-level keys (description, default, rules) win over the model's own.
        target_rules = target.get("x-kubernetes-validations", [])
        field_rules = node.get("x-kubernetes-validations", [])
        target.update(node)
        if target_rules or field_rules:
            target["x-kubernetes-validations"] = target_rules + field_rules
        node = target
    all_of = node.pop("allOf", None)
    if all_of and len(all_of) == 1:
        merged = dict(all_of[0])
        merged.update(node)
        return _resolve(merged, defs)
    any_of = node.pop("anyOf", None)
    if any_of is not None:
        options = [o for o in any_of if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {any_of}")
        merged = dict(options[0])
        merged.update(node)
        if merged.get("default", 0) is None:
            merged.pop("default")
        return _resolve(merged, defs)
    if "const" in node:
        node["enum"] = [node.pop("const")]
        node.setdefault("type", "string")
    if node.get("additionalProperties") is False:
        node.pop("additionalProperties")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or key == "$defs":
            continue
        if key == "properties":
            out[key] = {k: _resolve(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _resolve(value, defs)
        else:
            out[key] = value
    return out


def _strip_defaults(node: Any) -> Any:
    """Status is written by the operator: no apiserver defaulting there."""
    if isinstance(node, dict):
        return {k: _strip_defaults(v) for k, v in node.items() if k != "default"}
    if isinstance(node, list):
        return [_strip_defaults(v) for v in node]
    return node


def openapi_schema(kind: Kind) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of ``kind`` (spec and status, no metadata)."""
    raw = kind.model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    resolved = _resolve(raw, defs)
    props = resolved["properties"]
    schema: dict[str, Any] = {
        "type": "object",
        "description": kind.description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "APIVersion defines the versioned schema of this object.",
            },
            "kind": {
                "type": "string",
                "description": "Kind is the REST resource this object represents.",
            },
            "metadata": {"type": "object"},
            "spec": props["spec"],
            "status": _strip_defaults(props["status"]),
        },
    }
    schema["properties"]["status"].pop("default", None)
    if kind.root_rules:
        schema["x-kubernetes-validations"] = [dict(r) for r in kind.root_rules]
    return schema


def crd(kind: Kind) -> dict[str, Any]:
    """The CustomResourceDefinition manifest of ``kind``."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": kind.name,
            "labels": {"app.kubernetes.io/part-of": "torchyard"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": list(kind.short_names),
                "categories": [CATEGORY],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [dict(c) for c in kind.columns],
                    "schema": {"openAPIV3Schema": openapi_schema(kind)},
                }
            ],
        },
    }


def render(kind: Kind) -> str:
    header = (
        "# Generated from torchyard.api by `python -m torchyard.api.crds crds/`.\n"
        "# Do not edit: change the models and regenerate (a unit test checks for drift).\n"
    )
    return header + yaml.safe_dump(crd(kind), sort_keys=False, width=100)


def filename(kind: Kind) -> str:
    return f"{kind.name}.yaml"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "crds")
    out.mkdir(parents=True, exist_ok=True)
    for kind in KINDS:
        (out / filename(kind)).write_text(render(kind))
        print(f"wrote {out / filename(kind)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
