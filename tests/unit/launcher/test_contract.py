"""Every environment variable's name is written once, in ``torchyard.launch.contract``: the
planner that sets a variable and the launcher that reads it import the same name, and so
do the operator's, the CLI's and the SDK's settings, and the Environment builder (which reads
them from the contract's copy beside it in a build Pod)."""

from __future__ import annotations

import re
from pathlib import Path

import torchyard
from tests.source_strings import code_strings
from torchyard.launch import contract

OPERATOR = Path(torchyard.__file__).parent
CONTRACT = Path(contract.__file__)
NAMES = {
    name
    for name, value in vars(contract).items()
    if isinstance(value, str) and name == value and name.isupper()
}
PREFIXES = {contract.INPUT_VARIABLE_PREFIX, contract.PARAM_VARIABLE_PREFIX}


def _names_in(value: str) -> bool:
    """A string that is a variable's name, or starts with one or with the prefix of all (a
    message naming it first)."""
    return value in NAMES or value.startswith(contract.VARIABLE_PREFIX)


def test_no_variable_name_is_written_outside_the_contract() -> None:
    found = [
        f"{path.relative_to(OPERATOR)}:{line}: {value!r}"
        for path in sorted(OPERATOR.rglob("*.py"))
        if path != CONTRACT
        for line, value in code_strings(path.read_text())
        if _names_in(value)
    ]
    assert found == [], "import these names from torchyard.launch.contract"


def test_every_name_of_the_contract_is_used() -> None:
    """A name no module reads or sets any more is dropped from the contract, not kept."""
    others = "".join(path.read_text() for path in OPERATOR.rglob("*.py") if path != CONTRACT)
    used_inside = CONTRACT.read_text().split("# -- the variables", 1)[0]
    unused = sorted(
        name
        for name in NAMES
        if not re.search(rf"\b{name}\b", others) and not re.search(rf"\b{name}\b", used_inside)
    )
    assert unused == []
    assert all(prefix.startswith(contract.VARIABLE_PREFIX) for prefix in PREFIXES)


def test_the_rank_contract_is_the_documented_one() -> None:
    """docs/concepts/rank-contract.md names every variable of the rank contract (torchrun's
    as `PET_*`)."""
    page = (OPERATOR.parents[1] / "docs" / "concepts" / "rank-contract.md").read_text()
    said = {name for name in contract.RANK_CONTRACT_VARIABLES if f"`{name}`" in page}
    if "`PET_*`" in page:
        said |= {name for name in contract.RANK_CONTRACT_VARIABLES if name.startswith("PET_")}
    assert set(contract.RANK_CONTRACT_VARIABLES) - said == set()
