"""The operator talks to the apiserver only with a client of its own (``k8s.Client``),
never with the shared default one (``k8s.load()``: the CLI's, the SDK's, and in the
integration tier the tests' admin): so that the tests can run it with the chart's RBAC
while they stay admin, and a path that needs a permission the chart lacks fails there.

Read from the source: in ``torchyard.controller``, ``torchyard.k8s`` is used only for
where kinds live (``resources``), its errors and ``Client``; no function of it that makes
a request, no ``kubernetes`` import, and the module is never passed as a client. No other
module the controller imports talks to the API."""

from __future__ import annotations

import ast
from pathlib import Path

from torchyard import k8s
from torchyard.k8s import errors, resources

PACKAGE = Path(k8s.__file__).resolve().parents[1]  # operator/torchyard
CONTROLLER = PACKAGE / "controller"
# What the controller may name of torchyard.k8s: data and types, no request.
ALLOWED = {*resources.__all__, *errors.__all__, "Client", "FIELD_MANAGER"}
# Types the controller may name in annotations, never call (they would use the default).
TYPES_ONLY = {"WatchStream", "Connection"}


def defaults_used(tree: ast.AST) -> list[str]:
    """Uses of the shared default client in one module's source, as ``line: what``."""
    found: list[str] = []
    based: set[int] = set()  # ids of the Name nodes that are an attribute's base
    called: set[int] = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id != "k8s":
                continue
            based.add(id(node.value))
            if node.attr in ALLOWED or (node.attr in TYPES_ONLY and id(node) not in called):
                continue
            found.append(f"{node.lineno}: k8s.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("torchyard.k8s") or node.module.startswith("kubernetes"):
                found.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [
                f"{node.lineno}: import {a.name}" for a in node.names if "kubernetes" in a.name
            ]
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)):
            continue
        if node.id == "k8s" and id(node) not in based:
            found.append(f"{node.lineno}: the module k8s itself, as a value")
    return found


def test_no_module_of_the_controller_uses_the_shared_default_client() -> None:
    found = {
        path.name: used
        for path in sorted(CONTROLLER.glob("*.py"))
        if (used := defaults_used(ast.parse(path.read_text())))
    }
    assert found == {}


def test_the_rule_sees_each_way_of_reaching_the_default_client() -> None:
    source = """
from torchyard import k8s
from torchyard.k8s import rest
import kubernetes.client
k8s.get(k8s.PODS, "ns", "p")
k8s.load()
k8s.WatchStream(k8s.PODS, None, "1")
Context(k8s=k8s)
ok: k8s.WatchStream = ctx.k8s.list_(k8s.PODS)
k8s.Client(api)
"""
    assert defaults_used(ast.parse(source)) == [
        "3: from torchyard.k8s import ...",
        "4: import kubernetes.client",
        "5: k8s.get",
        "6: k8s.load",
        "7: k8s.WatchStream",
        "8: the module k8s itself, as a value",
    ]


def _imports(path: Path) -> set[str]:
    """The torchyard modules ``path`` imports (``from torchyard import x`` names x)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torchyard"):
            names.add(str(node.module))
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("torchyard"))
    return names


def _source(module: str) -> Path | None:
    base = PACKAGE.parent.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def test_no_other_module_the_controller_imports_talks_to_the_api() -> None:
    seen: set[str] = set()
    todo = [f"torchyard.controller.{p.stem}" for p in CONTROLLER.glob("*.py")]
    talkers = []
    while todo:
        module = todo.pop()
        path = _source(module)
        if module in seen or path is None or module.startswith("torchyard.k8s"):
            continue
        seen.add(module)
        imported = _imports(path)
        outside = not module.startswith("torchyard.controller") and module != "torchyard"
        if outside and any(name.startswith("torchyard.k8s") for name in imported):
            talkers.append(module)
        todo += sorted(imported)
    assert "torchyard.controller.handlers" in seen and "torchyard.planning.pods" in seen
    assert talkers == []
