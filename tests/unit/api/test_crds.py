"""The CRDs in crds/ are exactly what the API models generate, and every field is
described (so ``kubectl explain`` is useful) and structural."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from torchyard.api import crds

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("kind", crds.KINDS, ids=lambda k: k.kind)
def test_crd_file_matches_the_models(kind: crds.Kind) -> None:
    on_disk = (REPO / "crds" / crds.filename(kind)).read_text()
    assert on_disk == crds.render(kind), (
        "crds/ drifted from torchyard.api: run `make crds` and commit the result"
    )


def walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, schema)]
    for name, sub in schema.get("properties", {}).items():
        out += walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        out += walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out += walk(schema["additionalProperties"], f"{path}{{}}")
    return out


@pytest.mark.parametrize("kind", crds.KINDS, ids=lambda k: k.kind)
def test_every_field_has_a_type_and_a_description(kind: crds.Kind) -> None:
    schema = crds.openapi_schema(kind)
    for path, node in walk(schema):
        if path in ("", ".metadata") or path.endswith("{}") or path.endswith("[]"):
            continue
        assert node.get("type"), f"{kind.kind}{path} has no type (not structural)"
        assert node.get("description"), f"{kind.kind}{path} has no description"
        assert "$ref" not in node and "anyOf" not in node and "title" not in node


# The reasons a CRD's CEL rule may give (apiextensions' FieldValueErrorReason): the
# apiserver refuses the whole CRD for any other.
CEL_REASONS = {
    "FieldValueInvalid",
    "FieldValueForbidden",
    "FieldValueRequired",
    "FieldValueDuplicate",
}


@pytest.mark.parametrize("kind", crds.KINDS, ids=lambda k: k.kind)
def test_every_cel_rule_gives_a_reason_the_apiserver_accepts(kind: crds.Kind) -> None:
    rules = [
        (path, rule)
        for path, node in walk(crds.openapi_schema(kind))
        for rule in node.get("x-kubernetes-validations", [])
    ]
    assert rules, f"{kind.kind} has no CEL rule to check"
    for path, rule in rules:
        assert rule.get("reason", "FieldValueInvalid") in CEL_REASONS, (
            f"{kind.kind}{path}: reason {rule['reason']!r} (the apiserver takes only "
            f"{sorted(CEL_REASONS)})"
        )


def test_crds_have_short_names_category_status_and_columns() -> None:
    names = {k.kind: crds.crd(k) for k in crds.KINDS}
    short = {k: v["spec"]["names"]["shortNames"] for k, v in names.items()}
    assert short == {
        "TrainingRun": ["tr"],
        "Environment": ["env"],
        "ModelVersion": ["mv"],
        "Sweep": ["sw"],
        # not "ep": the core Endpoints' short name
        "OnlineEndpoint": ["oe"],
    }
    for crd in names.values():
        assert crd["spec"]["names"]["categories"] == ["torchyard"]
        version = crd["spec"]["versions"][0]
        assert version["subresources"] == {"status": {}}
        assert version["additionalPrinterColumns"][-1]["name"] == "Age"


def test_generated_yaml_parses_back() -> None:
    for kind in crds.KINDS:
        doc = yaml.safe_load(crds.render(kind))
        assert doc["metadata"]["name"] == kind.name
