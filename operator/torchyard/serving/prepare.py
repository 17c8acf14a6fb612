"""The serving Pod's init container (``python3 -m torchyard.serving.prepare``, in the
torchyard image): the runtime and its server libraries into the Pod, and the scoring code
into its working folder.

``--runtime DIR`` fills ``DIR/lib`` with the ``torchyard.serving`` package, the torchyard
modules it imports (``contract.MODULES``) under a ``torchyard/__init__.py`` that imports
nothing, and every file of the distributions in ``contract.LIBRARIES`` (Starlette,
Uvicorn and theirs, ``prometheus_client``), as this image has them installed at the
versions of torchyard's ``requirements.lock``. The serving container mounts ``DIR``
read-only and puts ``DIR/lib`` first on its ``PYTHONPATH``, so any Environment whose Python
is 3.11 or newer serves without installing a server. After ``--``, the source arguments of
the launcher (``--copy SRC DIR`` of a ConfigMap, ``--fetch SHA256 DIR`` of a registry
snapshot: ``launch.node_files.prepare``). Tested in tests/unit/serving/test_prepare.py and on
the real node.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from torchyard.launch import node_files
from torchyard.serving import contract

INIT = '"""torchyard\'s serving runtime, as a serving Pod\'s init container copied it."""\n'
PACKAGE = Path(__file__).resolve().parent  # torchyard/serving
SKIPPED = ("__pycache__",)


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def library_files(name: str) -> list[tuple[Path, str]]:
    """(installed file, its path under site-packages) of distribution ``name``'s files that
    live in site-packages (not its scripts in bin/, nor compiled caches)."""
    dist = importlib.metadata.distribution(name)
    out = []
    for file in dist.files or []:
        rel = file.as_posix()
        if rel.startswith("..") or rel.endswith(".pyc") or any(s in file.parts for s in SKIPPED):
            continue
        out.append((Path(str(dist.locate_file(file))), rel))
    if not out:
        raise RuntimeError(f"{name} is installed without a file list (RECORD): cannot ship it")
    return out


def copy_runtime(root: str) -> int:
    """The runtime and its libraries under ``root/lib``; the number of files."""
    lib = Path(root) / "lib"
    count = 0
    for name in contract.LIBRARIES:
        for source, rel in library_files(name):
            _copy(source, lib / rel)
            count += 1
    package = lib / "torchyard"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(INIT + _version())
    for module in contract.MODULES:
        _copy(PACKAGE.parent / module, package / module)
    for source in sorted(PACKAGE.glob("*.py")):
        _copy(source, package / "serving" / source.name)
    return count + len(contract.MODULES) + len(list(PACKAGE.glob("*.py"))) + 1


def _version() -> str:
    from torchyard import __version__

    return f"__version__ = {__version__!r}\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    source = args[args.index("--") + 1 :] if "--" in args else []
    own = args[: args.index("--")] if "--" in args else args
    parser = argparse.ArgumentParser(prog="python3 -m torchyard.serving.prepare")
    parser.add_argument("--runtime", required=True, metavar="DIR")
    options = parser.parse_args(own)
    # the folder itself is the emptyDir's, owned by root: the Pod's user may not chmod it
    count = copy_runtime(options.runtime)
    sys.stderr.write(f"[torchyard] the serving runtime: {count} files in {options.runtime}\n")
    if not source:
        return 0
    return node_files.prepare(source, termination_log="/dev/termination-log")


if __name__ == "__main__":
    sys.exit(main())
