"""The wire constants (torchyard.api.wire) are defined once: every other module imports
them, and the standard-library modules that run in images alone (the shipped modules of
the launcher, the Environment builder) keep literal copies that match."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import torchyard.envbuild
from tests.source_strings import code_strings
from torchyard import api, k8s
from torchyard.api import wire
from torchyard.planning import names, pods
from torchyard.status import failures

OPERATOR = Path(api.__file__).resolve().parents[1]
# Standard-library modules run in images: they may not import torchyard.api, so they copy.
SHIPPED = [(OPERATOR / path).resolve() for path in pods.shipped_files() if path != "__init__.py"]
COPIES = {*SHIPPED, Path(torchyard.envbuild.__file__).resolve()}
STRINGS = {
    name: value for name, value in vars(wire).items() if name.isupper() and isinstance(value, str)
}


def _sources() -> list[tuple[Path, str]]:
    return [
        (path, path.read_text())
        for path in sorted(OPERATOR.rglob("*.py"))
        if path.resolve() not in COPIES and path.name != "wire.py"
    ]


@pytest.mark.parametrize("name", sorted(STRINGS))
def test_a_wire_string_is_written_in_wire_py_only(name: str) -> None:
    literal = re.compile(r"""["']""" + re.escape(STRINGS[name]) + r"""["']""")
    found = [str(p.relative_to(OPERATOR)) for p, text in _sources() if literal.search(text)]
    assert found == [], f"{STRINGS[name]!r} is written out again; import wire.{name}"


def test_no_torchyard_dev_name_is_spelled_out_outside_wire_py() -> None:
    """Labels, annotations and the group (``{kind}.torchyard.dev/{name}`` too) come from
    wire; the standard-library copies keep none but what wire defines."""
    found = [
        f"{path.relative_to(OPERATOR)}:{line}: {value!r}"
        for path, text in _sources()
        for line, value in code_strings(text)
        if f"{wire.GROUP}/" in value or value.endswith(f".{wire.GROUP}")
    ]
    assert found == [], "import these from torchyard.api.wire"
    for copy in COPIES:
        names = {
            value
            for _, value in code_strings(copy.read_text())
            if value.startswith(f"{wire.GROUP}/")
        }
        assert names <= set(STRINGS.values()), f"{copy.name}: {names} not in wire"


def test_the_default_port_is_written_in_wire_py_only() -> None:
    found = [
        str(p.relative_to(OPERATOR))
        for p, text in _sources()
        if re.search(rf"[=(,]\s*{wire.DEFAULT_MASTER_PORT}\b", text)
    ]
    assert found == []
    assert api.Distribution().master_port == wire.DEFAULT_MASTER_PORT
    assert api.DEFAULT_MASTER_PORT == wire.DEFAULT_MASTER_PORT


def test_the_kinds_paths_and_labels_use_the_wire_names() -> None:
    assert api.API_VERSION == wire.API_VERSION == f"{wire.GROUP}/{wire.VERSION}"
    for res in (k8s.TRAININGRUNS, k8s.ENVIRONMENTS, k8s.MODELVERSIONS):
        assert res.api_version == wire.API_VERSION
    for kind in ("TrainingRun", "Environment", "ModelVersion"):
        assert k8s.resource_of({"apiVersion": wire.API_VERSION, "kind": kind}).group == wire.GROUP
    assert failures.NODE_RANK_LABEL == names.LABEL_NODE_RANK == wire.LABEL_NODE_RANK
    assert pods.REGISTRY_AUDIENCE == wire.REGISTRY_AUDIENCE
    # the names already on objects in clusters: they never change
    assert {"environment-hash", "snapshot", "sha256", "files", "size"} <= {
        value.removeprefix(f"{wire.GROUP}/") for value in STRINGS.values()
    }
    assert (pods.GANG_GATE, pods.POOL_LABEL, pods.ATTEMPT_LABEL) == (
        wire.GANG_GATE,
        wire.LABEL_POOL,
        wire.LABEL_ATTEMPT,
    )


def test_the_launchers_copies_match() -> None:
    """The launcher names the registry's audience in its error messages."""
    text = "".join(path.read_text() for path in SHIPPED)
    said = re.findall(r"audience ([\w.-]+)", text)
    assert said, "the launcher no longer names the audience: drop this test"
    assert set(said) == {wire.REGISTRY_AUDIENCE}
    # Nothing else of the wire is spelled out in the copied files (a new copy: test it here).
    for copy in COPIES:
        body = copy.read_text()
        copied = [name for name, value in STRINGS.items() if f'"{value}"' in body]
        assert copied == [], f"{copy.name} copies {copied}: check them against wire here"
