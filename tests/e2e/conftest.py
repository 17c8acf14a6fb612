"""E2E helpers: run ``torchyard run --local`` as a user would, in a subprocess."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


class Local:
    def __init__(self, tmp: Path) -> None:
        self.registry = tmp / "registry"
        self.workdir = tmp / "runs"
        self.tmp = tmp

    def folders(self) -> list[str]:
        """The options that name this test's registry and runs folders."""
        return ["--registry", str(self.registry), "--workdir", str(self.workdir)]

    def run(self, yaml_file: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        return self.command(["run", str(yaml_file)], *extra)

    def command(self, words: list[str], *extra: str) -> subprocess.CompletedProcess[str]:
        """``torchyard WORDS --local`` (``run FILE``, ``sweep submit FILE``) with this
        test's registry and runs folders, then ``extra``."""
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "torchyard",
                *words,
                "--local",
                "--registry",
                str(self.registry),
                "--workdir",
                str(self.workdir),
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=540,  # under pytest's 600 s per test: it fires first, with the output
            cwd=self.tmp,
        )

    def write_run(self, base: Path, **spec_changes: Any) -> Path:
        """A copy of an example's TrainingRun with some spec fields changed."""
        docs = list(yaml.safe_load_all(base.read_text()))
        run = next(d for d in docs if d["kind"] == "TrainingRun")
        run["spec"].update(spec_changes)
        path = self.tmp / "run.yaml"
        path.write_text(yaml.safe_dump_all(docs))
        return path

    def under_torchrun(self, path: Path) -> Path:
        """The run file at ``path`` changed to ``launch: node`` with a bare ``torchrun
        train.py`` (the script of torch's environment, on PATH, as a user types it; its
        ranks run that environment's Python): PET_* say how many ranks and where."""
        run = yaml.safe_load(path.read_text())
        run["spec"]["command"] = ["torchrun", "train.py"]
        run["spec"]["distribution"]["launch"] = "node"
        path.write_text(yaml.safe_dump(run))
        return path

    def archived_logs(self, run: str, namespace: str = "default") -> dict[int, str]:
        """Every rank's log from the run archive, by global rank."""
        logs = {}
        for path in (self.registry / namespace / "runs" / run / "logs").rglob("rank-*.txt"):
            if not path.parent.name.startswith("node-"):
                continue  # logs/node-N/stacks/rank-R.pid-P.txt: stack dumps, not the log
            logs[int(re.findall(r"rank-(\d+)", path.name)[0])] = path.read_text()
        return logs

    def contracts(self, run: str) -> list[dict[str, str]]:
        found = []
        for path in (self.registry / "default" / "runs" / run / "logs").rglob("*.txt"):
            for line in path.read_text().splitlines():
                if line.startswith("rank-contract "):
                    found.append(json.loads(line.removeprefix("rank-contract ")))
        return found


@pytest.fixture
def local(tmp_path: Path) -> Local:
    return Local(tmp_path)
