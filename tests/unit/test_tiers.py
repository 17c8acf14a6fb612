"""``make test``'s steps (``tests/tiers.py``): every test is in exactly one pytest run, the
real-node tests all in the same one (one real node per machine); each step starts once
the steps it needs have ended well, and not at all when one failed; the runs' output is
labelled and the end names what failed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from tests import tiers

REPO = Path(__file__).resolve().parents[2]

# The tier markers a test can carry (tests/conftest.py marks by folder; the node tier's
# folder marks itself, and test_harness.py has one real-node test in the integration tier).
MARKER_SETS = [
    {"unit"},
    {"e2e"},
    {"integration"},
    {"integration", "node"},
    {"node"},
    {"integration", "peers"},
]


def runs_of(markers: set[str]) -> list[str]:
    def matcher(name: str, /, **kwargs: object) -> bool:
        return name in markers and not kwargs

    return [
        run.label for run in tiers.RUNS if Expression.compile(run.markers or "").evaluate(matcher)
    ]


@pytest.mark.parametrize("markers", MARKER_SETS, ids=lambda m: "+".join(sorted(m)))
def test_every_test_is_in_exactly_one_run(markers: set[str]) -> None:
    assert len(runs_of(markers)) == 1, runs_of(markers)


def test_every_real_node_test_is_in_the_node_run() -> None:
    assert runs_of({"integration", "node"}) == runs_of({"node"}) == ["node"]


def test_the_plan_makes_what_each_run_needs_and_checks_only_the_whole() -> None:
    every = [s.label for s in tiers.plan([], setup=True, serial=False)]
    assert every == [*(s.label for s in tiers.SETUP), *(r.label for r in tiers.RUNS)]
    node = [s.label for s in tiers.plan(["node"], setup=True, serial=False)]
    assert node == ["tools", "node-tools", "later-tools", "venvs", "node"]
    assert [s.label for s in tiers.plan(["unit"], setup=True, serial=False)] == ["unit"]
    assert [s.label for s in tiers.plan(["e2e"], setup=False, serial=False)] == ["e2e"]
    serial = tiers.plan([], setup=True, serial=True)
    assert [s.label for s in serial][-1] == "pytest" and len(serial) == len(tiers.SETUP) + 1


def run_tiers(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.tiers", "--timings", str(tmp_path / "timings"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_runs_output_is_labelled_and_a_failing_run_fails_the_whole(tmp_path: Path) -> None:
    """Three tests: a unit one that passes, a node one that fails, none of e2e (a run that
    selects nothing is no failure, and the run after it starts)."""
    (tmp_path / "test_a.py").write_text(
        "import pytest\n"
        "@pytest.mark.unit\n"
        "def test_passes():\n    pass\n"
        "@pytest.mark.node\n"
        "def test_fails():\n    assert 1 == 2\n"
    )
    # --rootdir: the files are named from it, not from the common folder of the clone and
    # tmp_path (/tmp for a clone there)
    done = run_tiers(
        tmp_path, "--no-setup", str(tmp_path), "--rootdir", str(tmp_path),
        "-p", "no:cacheprovider", "-q",
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert re.search(r"\[unit\] 1 passed\b", " ".join(lines)), done.stdout  # (two workers)
    assert any(line.startswith("[node] FAILED") for line in lines), done.stdout
    assert re.search(r"\n  node +exit 1 +\d+s +cpu +\d+s .*1 failed, 1 deselected", done.stdout)
    assert re.search(r"\n  e2e +exit 5 .*2 deselected", done.stdout)
    # after the table, what failed, by name: the end of a long log is all some readers see
    table = done.stdout[done.stdout.index("how each step ended:") :]
    assert re.search(r"\n  \[node\] FAILED \S*test_a\.py::test_fails\b", table)
    assert "test_passes" not in table
    assert done.stdout.splitlines()[-1] == "total: 1 passed, 1 failed, 0 skipped"
    # each run's figures, and every step's
    unit = json.loads((tmp_path / "timings" / "unit.json").read_text())
    assert [(f, figures["tests"]) for f, figures in unit["files"].items()] == [("test_a.py", 1)]
    steps = json.loads((tmp_path / "timings" / "steps.json").read_text())
    assert {s["step"] for s in steps["steps"]} == {r.label for r in tiers.RUNS}


def test_a_step_whose_need_failed_does_not_start(tmp_path: Path) -> None:
    """A unit test that fails: e2e, which comes after the unit run, is not started."""
    (tmp_path / "test_b.py").write_text(
        "import pytest\n@pytest.mark.unit\ndef test_fails():\n    assert 1 == 2\n"
    )
    done = run_tiers(tmp_path, "--no-setup", "--tier", "unit", "--tier", "e2e", str(tmp_path), "-q")
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(r"\n  e2e +exit -1 .*not started: unit failed", done.stdout), done.stdout
    assert "[e2e]" not in done.stdout
