"""The torchyard modules that travel to every node Pod, as one content-addressed ConfigMap.

The node Pods need the launcher (and the few standard-library-only modules a training
script may import, ``from torchyard import checkpoint``) inside images torchyard does
not build. They reach a Pod without a container start of their own: the operator applies
one immutable ConfigMap ``torchyard-launcher-<hash>`` per namespace, named by a hash of
the files it holds, and every node Pod mounts it read-only as a ``torchyard/`` package
folder (``planning.pods``), each file at its path (``launch/main.py``: a ConfigMap's keys
hold no "/", so the volume's ``items`` put them back). A new torchyard version is a new
name, so Pods of the old one keep reading their own files.

The one departure from "no I/O" in ``planning``: :func:`sources` reads the package's own
source files (cached; the same for one installed version, as ``__version__`` is), so that
the builders stay functions of the spec. Called by ``planning.pods`` (the volume and
:func:`config_map`), the controller's admission (applies the ConfigMap before a gang's
Pods) and the SDK's dry run. Tested in tests/unit/planning/test_shipped.py.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PACKAGE = "torchyard"
NAME_PREFIX = "torchyard-launcher-"
# The shipped package's __init__.py: a docstring, no imports, so that importing one
# shipped module never pulls in what the Pod does not have (pydantic, kubernetes).
INIT = (
    '"""torchyard modules shipped to a node Pod (standard library only): the launcher and\n'
    'what a training script may import, e.g. ``from torchyard import checkpoint``."""\n'
)
_ROOT = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=8)
def _read(modules: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    files = [("__init__.py", INIT)]
    for module in modules:
        if not module.isidentifier() or module.startswith("_"):
            raise ValueError(f"cannot ship {module!r}: name a top-level torchyard module")
        folder = _ROOT / module
        if folder.is_dir():  # a package: every module in it, its __init__.py too
            for path in sorted(folder.glob("*.py")):
                files.append((f"{module}/{path.name}", path.read_text(encoding="utf-8")))
        else:
            files.append((f"{module}.py", (_ROOT / f"{module}.py").read_text(encoding="utf-8")))
    return tuple(sorted(files))


@functools.lru_cache(maxsize=8)
def name_of(modules: tuple[str, ...]) -> str:
    """:func:`config_map_name` of the shipped modules' files, hashed once per process (node
    Pods are built on every reconcile; the files do not change under a running operator)."""
    return config_map_name(dict(_read(modules)))


def sources(modules: Sequence[str]) -> dict[str, str]:
    """``{path in the package folder: text}`` of the shipped package: ``__init__.py`` and
    each module (``checkpoint.py``), or each file of a shipped package (``launch/main.py``)."""
    return dict(_read(tuple(modules)))


def key(path: str) -> str:
    """The ConfigMap key of the file at ``path`` (keys hold no "/": ``launch.main.py``)."""
    return path.replace("/", ".")


@functools.lru_cache(maxsize=8)
def _items(modules: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((key(path), path) for path, _ in _read(modules))


def items(modules: Sequence[str]) -> list[dict[str, str]]:
    """The ConfigMap volume's ``items``: each key back at its path in the package folder."""
    return [{"key": k, "path": path} for k, path in _items(tuple(modules))]


def config_map_name(files: Mapping[str, str]) -> str:
    """``torchyard-launcher-<16 hex digits of the sha256 of the files>``."""
    digest = hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()
    return NAME_PREFIX + digest[:16]


def config_map(namespace: str, files: Mapping[str, str]) -> dict[str, Any]:
    """The immutable ConfigMap that holds ``files`` (by :func:`key`), in ``namespace``."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(files),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "torchyard"},
        },
        "immutable": True,
        "data": {key(path): text for path, text in sorted(files.items())},
    }
