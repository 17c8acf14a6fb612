"""``make test`` runs the tiers as separate pytest runs (``tests/tiers.py``): every test is
in exactly one of them, and the real-node tests all in the same one (one real node per
machine)."""

from __future__ import annotations

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
        run.label
        for runs in tiers.STAGES
        for run in runs
        if Expression.compile(run.markers).evaluate(matcher)
    ]


@pytest.mark.parametrize("markers", MARKER_SETS, ids=lambda m: "+".join(sorted(m)))
def test_every_test_is_in_exactly_one_run(markers: set[str]) -> None:
    assert len(runs_of(markers)) == 1, runs_of(markers)


def test_every_real_node_test_is_in_the_node_run_and_e2e_runs_alone() -> None:
    assert runs_of({"integration", "node"}) == runs_of({"node"}) == ["node"]
    assert [[r.label for r in runs] for runs in tiers.STAGES][-1] == ["e2e"]


def test_the_runs_output_is_labelled_and_a_failing_run_fails_the_whole(tmp_path: Path) -> None:
    """Three tests: a unit one that passes, a node one that fails, none of e2e (a run that
    selects nothing is no failure)."""
    (tmp_path / "test_a.py").write_text(
        "import pytest\n"
        "@pytest.mark.unit\n"
        "def test_passes():\n    pass\n"
        "@pytest.mark.node\n"
        "def test_fails():\n    assert 1 == 2\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "tests.tiers", str(tmp_path), "-p", "no:cacheprovider", "-q"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "[unit+integration] 1 passed, 1 deselected" in " ".join(lines)
    assert any(line.startswith("[node] FAILED") for line in lines), done.stdout
    assert re.search(r"\n  node +exit 1 +\d+s +.*1 failed, 1 deselected", done.stdout)
    assert re.search(r"\n  e2e +exit 5 +\d+s +.*2 deselected", done.stdout)
    # after the table, what failed, by name: the end of a long log is all some readers see
    table = done.stdout[done.stdout.index("how each run ended:") :]
    assert re.search(r"\n  \[node\] FAILED \S*test_a\.py::test_fails\b", table)
    assert "test_passes" not in table
