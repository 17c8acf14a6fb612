"""What the tests need built (``tests/cluster/needs.py``): by their fixtures, in the order
``make test`` makes it; within a tier, the modules whose tests need a later build run after
the others, in that order, whatever order they were named in (tests/conftest.py), so that
a run started while a later tool is still being built reaches those tests last."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cluster import needs

REPO = Path(__file__).resolve().parents[3]


def test_a_tests_needs_come_from_its_fixtures_in_the_order_they_are_made() -> None:
    assert needs.of(["tmp_path"]) == []
    assert needs.of(["kueue", "cluster", "operator"]) == ["control-plane", "kueue"]
    assert needs.of(["seaweedfs", "kueue"]) == ["seaweedfs", "kueue"]
    assert needs.of(["with_kserve", "prepared"]) == ["kserve"]
    assert list(needs.NEEDS)[: len(needs.FIRST)] == list(needs.FIRST)


def test_modules_that_need_a_later_build_run_last_in_their_tier() -> None:
    named = [
        "tests/integration/test_kueue.py",  # Kueue
        "tests/integration/test_s3_store.py",  # SeaweedFS, made before Kueue
        "tests/integration/test_crds.py",  # only the control plane
        "tests/unit/test_tiers.py",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *named],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    modules = list(
        dict.fromkeys(line.split("::")[0] for line in done.stdout.splitlines() if "::" in line)
    )
    assert modules == [
        "tests/integration/test_crds.py",
        "tests/integration/test_s3_store.py",
        "tests/integration/test_kueue.py",
        "tests/unit/test_tiers.py",
    ]
