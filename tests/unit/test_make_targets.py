"""``make test`` runs every tier (tests/tiers.py) in one go, so it must prepare what each
tier's own target prepares: a venv or tool that only ``make integration`` (or ``e2e``,
``node``) builds is missing on a fresh machine's first ``make test``."""

from __future__ import annotations

import re
from pathlib import Path

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"
TIERS = ("unit", "integration", "e2e", "node")


def prerequisites() -> dict[str, set[str]]:
    """Each rule's target and the prerequisites written on its line."""
    found: dict[str, set[str]] = {}
    for line in MAKEFILE.read_text().splitlines():
        rule = re.fullmatch(r"([a-z][a-z0-9-]*):(?!=)(.*)", line)
        if rule:
            found[rule.group(1)] = set(rule.group(2).split())
    return found


def test_make_test_prepares_what_every_tier_needs() -> None:
    rules = prerequisites()
    assert set(TIERS) <= set(rules), sorted(rules)
    for tier in TIERS:
        missing = rules[tier] - rules["test"]
        assert not missing, f"make {tier} prepares {sorted(missing)}, make test does not"
