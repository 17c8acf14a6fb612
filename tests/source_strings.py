"""The string constants of a module's source (docstrings left out): for the tests that keep
a name written in one module only (``api.wire``, ``launch.contract``)."""

from __future__ import annotations

import ast
from collections.abc import Iterator


def code_strings(text: str) -> Iterator[tuple[int, str]]:
    """(line, value) of every string constant in ``text`` but docstrings (f-strings' parts
    included): the strings the code puts on the wire or into the environment."""
    tree = ast.parse(text)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    for node in ast.walk(tree):
        is_string = isinstance(node, ast.Constant) and isinstance(node.value, str)
        if is_string and id(node) not in docstrings:
            yield node.lineno, node.value
