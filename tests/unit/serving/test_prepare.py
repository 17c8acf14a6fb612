"""The serving Pod's init container (torchyard.serving.prepare): the runtime and its
libraries copied out of this installation serve on their own, with a Python that sees
nothing else (no site-packages: ``python -S``), as an Environment's image would; and
``contract.LIBRARIES`` is exactly what starlette, uvicorn and prometheus_client need."""

from __future__ import annotations

import importlib.metadata
import stat
import sys
from pathlib import Path

from packaging.requirements import Requirement

from tests.unit.serving import test_server as processes
from torchyard.serving import contract, prepare


def _closure(names: list[str]) -> set[str]:
    """Every distribution ``names`` need on this Python (extras left out)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = Requirement(todo.pop()).name.lower().replace("-", "_")
        if name in seen:
            continue
        seen.add(name)
        for text in importlib.metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def test_the_libraries_are_the_runtimes_requirements_closure() -> None:
    assert sys.version_info >= (3, 11)
    wanted = _closure(["starlette", "uvicorn", "prometheus_client"])
    assert wanted == {n.lower() for n in contract.LIBRARIES}


def test_the_copied_runtime_serves_alone(tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    assert prepare.main(["--runtime", str(runtime)]) == 0
    lib = runtime / "lib"
    assert (lib / "starlette" / "applications.py").is_file()
    assert (lib / "uvicorn" / "server.py").is_file()
    assert (lib / "torchyard" / "serving" / "app.py").is_file()
    assert "__version__" in (lib / "torchyard" / "__init__.py").read_text()
    assert not list(lib.rglob("*.pyc")) and not (runtime / "bin").exists()
    work = tmp_path / "work"
    work.mkdir()
    port = processes._port()
    process = processes.start(
        work, processes.GOOD, port, python=[sys.executable, "-S"], path=str(lib)
    )
    try:
        processes.wait_ready(port, process)
        status, _ = processes.get(port, contract.SCORE_PATH, "POST", b"{}")
        assert status == 200
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=30)
    assert "init() returned" in out


def test_the_source_arguments_go_to_the_launchers_copy(tmp_path: Path) -> None:
    source = tmp_path / "configmap"
    source.mkdir()
    (source / "pytorch_score.py").write_text("def init(): pass\n")
    (source / "..data").mkdir()  # a ConfigMap volume's own bookkeeping: not copied
    work = tmp_path / "workspace"
    code = prepare.main(["--runtime", str(tmp_path / "rt"), "--", "--copy", str(source), str(work)])
    assert code == 0
    assert sorted(p.name for p in work.iterdir()) == ["pytorch_score.py"]


def test_the_runtimes_folder_is_left_as_the_volume_made_it(tmp_path: Path) -> None:
    """The folder is an emptyDir's mount, owned by root: the init container runs as the
    endpoint's user, who may write into it but not chmod it (EPERM on the real node)."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    runtime.chmod(0o1777)
    assert prepare.main(["--runtime", str(runtime)]) == 0
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o1777
    assert (runtime / "lib" / "torchyard" / "serving" / "app.py").is_file()
