"""``make test`` runs every tier (tests/tiers.py) in one go, so its steps must make what each
tier needs: a venv or tool that only one tier's own target made would be missing on a
fresh machine's first ``make test``. Each tier's target is ``make test TIER=<tier>``."""

from __future__ import annotations

import re
from pathlib import Path

from tests import tiers
from tests.cluster import debian

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"
TIERS = ("unit", "integration", "e2e", "node")


def rules() -> dict[str, tuple[set[str], list[str]]]:
    """Each rule's targets -> (its prerequisites, its recipe's lines)."""
    found: dict[str, tuple[set[str], list[str]]] = {}
    current: list[str] = []
    for line in MAKEFILE.read_text().splitlines():
        rule = re.fullmatch(r"([a-z][a-z0-9 -]*):(?!=)(.*)", line)
        if rule:
            current = []
            for target in rule.group(1).split():
                found[target] = (set(rule.group(2).split()), current)
        elif line.startswith("\t"):
            current.append(line.strip())
    return found


def test_each_tier_target_is_its_run_of_make_test() -> None:
    made = rules()
    for tier in TIERS:
        prerequisites, recipe = made[tier]
        assert prerequisites == {"venv"}, (tier, prerequisites)
        assert any("-m tests.tiers --tier $@" in line for line in recipe), (tier, recipe)
    assert made["test"][0] == {"venv"}


def test_the_venvs_step_makes_every_venv_a_tier_used_to_need() -> None:
    """The browser tests' Playwright, MLflow's and TensorBoard's venvs: each a target of
    its own, all made by the ``venvs`` step, which every run that uses them waits for."""
    made = rules()
    (venvs,) = [s for s in tiers.SETUP if s.label == "venvs"]
    for target in ("browser", "mlflow", "tensorboard"):
        assert target in made and target in venvs.command, target
    for run in tiers.RUNS:
        if run.label != "unit":
            assert "venvs" in run.after, run


def test_every_step_a_run_needs_is_a_setup_step_or_a_run() -> None:
    labels = {s.label for s in (*tiers.SETUP, *tiers.RUNS)}
    for step in (*tiers.SETUP, *tiers.RUNS):
        assert set(step.after) | set(step.also) <= labels, step


def test_every_apt_get_of_the_makefile_waits_its_turn() -> None:
    """``make test``'s venvs step installs chromium while its tools step may install the
    node's packages: each apt-get takes the lock tests/cluster/debian.py takes and waits for
    anyone else's dpkg lock rather than fail at once ("Could not get lock
    /var/lib/dpkg/lock-frontend")."""
    text = MAKEFILE.read_text()
    apt = re.search(r"^APT = (.*)$", text, re.MULTILINE)
    assert apt is not None
    assert f"flock {debian.APT_LOCK} apt-get -o DPkg::Lock::Timeout=" in apt.group(1)
    calls = [line for line in text.splitlines() if "apt-get" in line and not line.startswith("#")]
    assert calls == [apt.group(0)], calls
