"""The shape of the operator's code, so that each module can be read in one sitting: no
module over MODULE_LINES lines, no function over FUNCTION_LINES lines (the manifest
builders of ``torchyard.planning`` excepted, see FUNCTION_EXEMPT), and no block of
BLOCK_LINES consecutive code lines written twice anywhere under operator/ (one copy of
each rule, imported where it is needed).

Each module and each function is a case of its own, named by the failure.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "torchyard"
MODULE_LINES = 700
FUNCTION_LINES = 80
BLOCK_LINES = 6
# Pure builders of one manifest each (a node Pod, an Environment's build Job): the manifest
# is one literal dict that reads as the YAML it becomes; cut into helpers it would not.
FUNCTION_EXEMPT = {"planning/pods.py", "planning/environments.py"}


def _modules() -> list[str]:
    return sorted(
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts
    )


@functools.cache
def _tree(module: str) -> ast.Module:
    return ast.parse((PACKAGE / module).read_text())


def _functions(module: str) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function and method of ``module``."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    found.append((name, int(child.end_lineno or 0) - child.lineno + 1))
                visit(child, name + ".")

    visit(_tree(module), "")
    return found


def _code_lines(module: str) -> list[tuple[int, str, bool]]:
    """(line number, stripped text, trivial) of the module's non-blank, non-comment lines;
    trivial: part of an import, or brackets, commas and quotes only (a call's closing
    ``)``, a docstring's closing quotes)."""
    imports = {
        line
        for node in ast.walk(_tree(module))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for line in range(node.lineno, int(node.end_lineno or node.lineno) + 1)
    }
    out = []
    for number, raw in enumerate((PACKAGE / module).read_text().splitlines(), 1):
        text = raw.strip()
        if text and not text.startswith("#"):
            trivial = number in imports or set(text) <= set("()[]{},:'\"")
            out.append((number, text, trivial))
    return out


@functools.lru_cache(maxsize=1)
def _blocks() -> dict[tuple[str, ...], list[tuple[str, int]]]:
    """Every run of BLOCK_LINES code lines that is not trivial throughout -> where it is."""
    where: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
    for module in _modules():
        lines = _code_lines(module)
        for start in range(len(lines) - BLOCK_LINES + 1):
            window = lines[start : start + BLOCK_LINES]
            if not all(trivial for _, _, trivial in window):
                where[tuple(text for _, text, _ in window)].append((module, window[0][0]))
    return where


@pytest.mark.parametrize("module", _modules())
def test_a_module_is_at_most_700_lines(module: str) -> None:
    lines = len((PACKAGE / module).read_text().splitlines())
    assert lines <= MODULE_LINES, f"{module}: {lines} lines"


FUNCTIONS = [
    (f"{module}::{name}", lines)
    for module in _modules()
    if module not in FUNCTION_EXEMPT
    for name, lines in _functions(module)
]


@pytest.mark.parametrize(
    ("function", "lines"),
    [pytest.param(name, lines, id=name) for name, lines in FUNCTIONS],
)
def test_a_function_is_at_most_80_lines(function: str, lines: int) -> None:
    assert lines <= FUNCTION_LINES, f"{function}: {lines} lines"


@pytest.mark.parametrize("module", _modules())
def test_no_block_of_6_code_lines_is_written_twice(module: str) -> None:
    repeated = [
        f"{module}:{line} is also at "
        + ", ".join(f"{m}:{n}" for m, n in places if (m, n) != (module, line))
        + f": {block[0]!r} ..."
        for block, places in _blocks().items()
        if len(places) > 1
        for m0, line in places
        if m0 == module
    ]
    assert not repeated, "\n".join(repeated)


def test_the_exempt_builders_are_still_modules() -> None:
    """An exempt module that was renamed or removed would leave its exemption behind."""
    assert set(_modules()) >= FUNCTION_EXEMPT


# A resource's modules, one in each layer that handles it (docs/development/layout.md).
RESOURCE_MODULES = {"trainingruns", "sweeps", "inputs", "environments", "endpoints", "models"}


def _namesakes() -> set[str]:
    """The resources' module names that modules of more than one package have."""
    folders = defaultdict(set)
    for module in _modules():
        path = Path(module)
        folders[path.stem].add(str(path.parent))
    return {stem for stem, where in folders.items() if len(where) > 1} & RESOURCE_MODULES


def _package_of(module: str) -> str:
    return ".".join(["torchyard", *Path(module).parent.parts])


def _bare_namesake_imports(module: str) -> list[str]:
    """``from torchyard.<package> import <namesake>`` without ``as`` from another package:
    there, a bare ``sweeps`` could be any layer's (its own package's is its own)."""
    namesakes = _namesakes()
    return [
        f"{module}:{node.lineno}: from {node.module} import {alias.name}"
        for node in ast.walk(_tree(module))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torchyard")
        for alias in node.names
        if alias.name in namesakes
        and alias.asname is None
        and node.module != _package_of(module)
        and (PACKAGE.parent / (node.module or "").replace(".", "/") / f"{alias.name}.py").exists()
    ]


def test_a_module_named_as_other_layers_ones_is_imported_under_its_layers_name() -> None:
    """``api/sweeps.py``, ``status/sweeps.py`` ...: one module per layer for a resource,
    imported as ``sweep_api``, ``sweep_status``; never as a bare ``sweeps``."""
    assert _namesakes() == RESOURCE_MODULES
    bare = [line for module in _modules() for line in _bare_namesake_imports(module)]
    assert bare == [], "\n".join(bare)
