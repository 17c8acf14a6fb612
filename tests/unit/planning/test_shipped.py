"""The modules shipped to node Pods: one content-addressed ConfigMap per namespace that
holds a ``torchyard/`` package folder whose modules import from it (and only the standard
library), as a rank in a Pod does."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import torchyard.launch.main
from tests.processes import python_3_8
from tests.shipped import launcher, lay_out
from torchyard.planning import pods, shipped


def test_the_config_map_holds_the_package_and_is_named_by_its_content() -> None:
    files = pods.shipped_files()
    assert files["launch/main.py"] == Path(torchyard.launch.main.__file__).read_text()
    # every module of the launcher's package, its __init__.py too
    launch = Path(torchyard.launch.main.__file__).parent
    assert {p for p in files if p.startswith("launch/")} == {
        f"launch/{path.name}" for path in launch.glob("*.py")
    }
    # importing one shipped module pulls in nothing else: each __init__.py is a docstring
    for init in ("__init__.py", "launch/__init__.py"):
        assert [type(node) for node in ast.parse(files[init]).body] == [ast.Expr], init
    cm = pods.launcher_config_map("team")
    assert cm["immutable"] is True and cm["metadata"]["namespace"] == "team"
    # a ConfigMap's keys hold no "/": the volume's items put each file back at its path
    assert cm["data"] == {path.replace("/", "."): text for path, text in files.items()}
    items = shipped.items(pods.SHIPPED_MODULES)
    assert {item["path"]: cm["data"][item["key"]] for item in items} == files
    assert cm["metadata"]["name"] == shipped.config_map_name(files)
    assert cm["metadata"]["name"].startswith("torchyard-launcher-")
    # a changed file is a new name: Pods of the old version keep their own files
    changed = {**files, "launch/main.py": files["launch/main.py"] + "\n"}
    assert shipped.config_map_name(changed) != cm["metadata"]["name"]
    assert pods.launcher_config_map("other")["metadata"]["name"] == cm["metadata"]["name"]


def test_only_top_level_torchyard_modules_can_be_shipped() -> None:
    for bad in ("../etc/passwd", "planning.pods", "_private"):
        with pytest.raises(ValueError, match="top-level torchyard module"):
            shipped.sources((bad,))


def test_a_rank_imports_the_shipped_package_through_the_launchers_pythonpath(
    tmp_path: Path,
) -> None:
    # The ConfigMap's files laid out as the kubelet mounts them, run with an interpreter
    # that has no torchyard installed (-I: isolated, no site-packages of this venv).
    root = tmp_path / "lib"
    package = lay_out(root)
    rank = (
        "import json, os, torchyard, torchyard.launch.main as l; "
        "print(json.dumps([os.path.dirname(torchyard.__file__), os.environ['PYTHONPATH']]))"
    )
    env = {
        "TORCHYARD_SHIPPED_PATH": str(root),
        "PYTHONPATH": "/image/own",
        "TORCHYARD_LOGS": str(tmp_path / "logs"),
        "TORCHYARD_OUTPUTS": str(tmp_path / "outputs"),
        "TORCHYARD_TERMINATION_LOG": str(tmp_path / "termination-log"),
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-S",
            str(launcher(package)),
            "--",
            sys.executable,
            "-S",
            "-c",
            rank,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if "[rank 0]" in x)
    found, pythonpath = json.loads(line.split("] ", 1)[1])
    assert found == str(package)
    # first, and the image's own path kept (the launcher's stack hook comes last)
    assert pythonpath.split(":")[:2] == [str(root), "/image/own"]


BARE = [pytest.param(sys.executable, id="this-python")]
BARE.append(
    pytest.param(
        python_3_8(),
        id="python3.8",
        marks=pytest.mark.skipif(python_3_8() is None, reason="no Python 3.8 on this machine"),
    )
)
# What the launcher may import: the standard library, and only the shipped modules of its
# own package (this interpreter's list of the standard library, Python >= 3.10).
LIST_MODULES = """
import runpy, sys
code, before = 0, set(sys.modules)  # the interpreter's own start-up (site-packages' .pth files)
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as done:
    code = done.code
outside = sorted(
    name for name in set(sys.modules) - before
    if name.split(".")[0] not in sys.stdlib_module_names
)
print("imported", " ".join(outside), file=sys.stderr)
print("from", sys.modules["torchyard"].__file__, file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.parametrize("python", BARE)
def test_the_shipped_files_alone_run_the_launcher_on_a_bare_interpreter(
    tmp_path: Path, python: str
) -> None:
    """The ConfigMap's files in a ``torchyard/`` folder are all the launcher needs: run as
    a file by a bare interpreter (-I -S: neither the script's folder nor any
    site-packages, so not this venv's torchyard, on its path), its ranks run, and it
    imported nothing but the standard library and the shipped modules."""
    package = lay_out(tmp_path / "lib")
    env = {
        "PATH": "/usr/bin:/bin",
        "TORCHYARD_NPROC_PER_NODE": "2",
        "TORCHYARD_TERMINATION_LOG": str(tmp_path / "termination-log"),
    }
    command = [str(launcher(package)), "--", python, "-I", "-S", "-c", "print(1)"]
    listing = python == sys.executable
    argv = [python, "-I", "-S", *(["-c", LIST_MODULES] if listing else []), *command]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(x for x in done.stdout.splitlines() if x.startswith("[rank")) == [
        "[rank 0] 1",
        "[rank 1] 1",
    ]
    assert json.loads((tmp_path / "termination-log").read_text())["reason"] == "Completed"
    if listing:
        [line] = [x for x in done.stderr.splitlines() if x.startswith("imported ")]
        imported = set(line.split()[1:])
        files = {f"torchyard.{path[:-3].replace('/', '.')}" for path in pods.shipped_files()}
        files = {name.removesuffix(".__init__") for name in files}
        # every module of the launcher's package, and no other torchyard module (the
        # checkpoint contract is imported only with a checkpoint folder)
        launch = {name for name in files if name.startswith("torchyard.launch")}
        assert imported - {"torchyard"} <= files - {"torchyard.launch.main"}, imported
        assert launch - {"torchyard.launch.main", "torchyard.launch.__main__"} <= imported
        assert f"from {package / '__init__.py'}" in done.stderr.splitlines()
    helped = subprocess.run(
        [python, "-I", "-S", str(launcher(package)), "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert helped.returncode == 0 and "TORCHYARD_LAUNCH" in helped.stdout, helped.stderr
