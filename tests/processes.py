"""The processes a test starts and signals: as from a terminal, and none left behind."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path


def as_from_a_terminal() -> None:
    """``preexec_fn`` of a process the test sends Ctrl-C: SIGINT at its default, as a shell
    with job control leaves it. A shell without it (a CI runner's ``cmd &``, ``nohup``)
    starts its children with SIGINT ignored, and Python then installs no KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def running() -> Iterator[tuple[int, str, str]]:
    """Each process's pid, command line and working folder ("" where it cannot be read)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:  # gone meanwhile, or not ours to read
            cwd = ""
        yield int(entry.name), cmdline.strip(), cwd


def working_in(folder: Path) -> list[str]:
    """The command lines of the processes whose working folder is in ``folder``."""
    return [cmd for _, cmd, cwd in running() if cwd and Path(cwd).is_relative_to(folder)]


@functools.lru_cache(maxsize=1)
def python_3_8() -> str | None:
    """A Python 3.8 interpreter on this machine (the oldest the modules shipped to node
    Pods support): one of pyenv's, or on PATH; None when there is none that runs."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found = [str(p) for p in sorted(root.glob("versions/3.8*/bin/python3.8"))]
    found += [p for p in [shutil.which("python3.8")] if p]
    for python in found:
        ran = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if ran.returncode == 0 and ran.stdout.strip() == "(3, 8)":
            return python
    return None
