"""What local mode checks around a run: the Environment's packages in this Python
(:func:`missing_packages`, a warning before), the register path inside node 0's folder
(:func:`register_source`) and the exported ONNX model (:func:`check_onnx`), after. Used
by ``local.runs`` and ``local.finalize``; tested in tests/unit/local/test_mode.py.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from torchyard.api import Environment

_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def register_source(node0: Path, path: str) -> Path:
    """The file or folder ``outputs.register.path`` names in node 0's working folder.

    The API refuses absolute paths and ``..``; this checks the path as the file system
    resolves it (links followed, a folder's links too), so a spec that bypassed validation
    or a link the run made cannot register a file from elsewhere on this machine."""
    root = node0.resolve()
    target = (root / path).resolve()

    def outside(resolved: Path, what: str) -> RuntimeError:
        return RuntimeError(
            f"outputs.register.path {path!r}: {what} resolves to {resolved}, outside node 0's "
            f"working folder {root}; nothing was registered. Name a file or folder the run "
            "writes, relative to its working folder (e.g. outputs/model.pt)"
        )

    if not target.is_relative_to(root):
        raise outside(target, "it")
    if target.is_dir():
        for inner in sorted(target.rglob("*")):
            if inner.is_symlink() and not inner.resolve().is_relative_to(root):
                raise outside(inner.resolve(), f"the link {inner.relative_to(root)}")
    return target


def missing_packages(env: Environment | None) -> list[str]:
    """The Environment's pip packages that are not installed in this Python."""
    if env is None:
        return []
    missing = []
    for requirement in env.spec.pip:
        match = _REQ_NAME.match(requirement)
        if not match:
            continue
        try:
            importlib.metadata.distribution(match.group(1))
        except importlib.metadata.PackageNotFoundError:
            missing.append(requirement)
    return missing


def check_onnx(path: Path) -> str:
    """Run an exported ONNX model once on zeros; '' when fine, else what went wrong."""
    try:
        import numpy as np
        import onnxruntime as ort  # type: ignore[import-untyped]
    except ImportError:
        return ""  # nothing to check with; the file's presence was checked already
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {}
        for inp in session.get_inputs():
            shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
            dtype = np.int64 if "int64" in inp.type else np.float32
            feeds[inp.name] = np.zeros(shape, dtype=dtype)
        session.run(None, feeds)
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return ""


__all__ = ["check_onnx", "missing_packages", "register_source"]
