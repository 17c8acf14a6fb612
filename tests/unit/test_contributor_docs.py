"""The contributor pages say what the code is: docs/architecture.md names every custom
resource the CRDs define, its layer table every package and top-level module of
operator/torchyard (and nothing else), its launcher table every module of
torchyard.launch; docs/development/layout.md's lists of a package's modules
("`k8s` (`clients`, ...)") are each that package's modules, all of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "torchyard"
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()
LAYOUT = (ROOT / "docs" / "development" / "layout.md").read_text()
NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}
# "`k8s` (`clients`, `connections`, ...)": a package, then its modules in brackets (and,
# after a semicolon, a word on them).
MODULE_LIST = re.compile(
    r"`([a-z0-9_]+(?:/[a-z0-9_]+)*)/?`:? \(((?:`[a-z0-9_]+`(?:,? (?:and )?)?)+)(?:;[^)]*)?\)"
)


def _modules(folder: Path) -> set[str]:
    """The modules and packages directly in ``folder`` (not its __init__ or __main__)."""
    found = {p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")}
    return found | {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}


def _table(text: str, header: str) -> list[str]:
    """The first column's backticked names after ``header``'s table row (a row may name
    several, ```a`, `b```)."""
    start = text.index(header)
    names: list[str] = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        cell = cells[1] if header.startswith("| layer") else cells[0]
        names += re.findall(r"`([a-z0-9_]+)`", cell)
    return names


def test_the_architecture_names_every_custom_resource() -> None:
    kinds = sorted(
        yaml.safe_load(p.read_text())["spec"]["names"]["kind"]
        for p in (ROOT / "crds").glob("*.yaml")
    )
    said = re.search(r"with (\w+) custom resources \(([^)]*)\)", " ".join(ARCHITECTURE.split()))
    assert said is not None, "docs/architecture.md says how many custom resources there are"
    assert NUMBERS.get(said.group(1)) == len(kinds), said.group(0)
    assert sorted(re.findall(r"`(\w+)`", said.group(2))) == kinds


def test_the_layer_table_is_every_package() -> None:
    named = _table(ARCHITECTURE, "| layer (top to bottom) |")
    assert len(named) == len(set(named)), "a package is named twice"
    assert set(named) == _modules(PACKAGE)


def test_the_launcher_table_is_every_launcher_module() -> None:
    named = _table(ARCHITECTURE, "| module | its job |")
    assert sorted(named) == sorted(_modules(PACKAGE / "launch"))


LISTS = MODULE_LIST.findall(" ".join(LAYOUT.split()))


def test_the_layout_lists_modules_of_packages() -> None:
    assert {"k8s", "local", "sdk/azureml"} <= {package for package, _ in LISTS}


@pytest.mark.parametrize(("package", "modules"), LISTS, ids=[p for p, _ in LISTS])
def test_a_list_of_a_packages_modules_is_all_of_them(package: str, modules: str) -> None:
    assert (PACKAGE / package).is_dir(), f"{package} is no package of operator/torchyard"
    assert sorted(re.findall(r"`([a-z0-9_]+)`", modules)) == sorted(_modules(PACKAGE / package))


def test_a_module_list_is_found_as_written() -> None:
    text = "`k8s` (`clients`, `rest` and `logs`; `rest` is ...) and `sdk/azureml/` (`common`)"
    (k8s, modules), (azureml, common) = MODULE_LIST.findall(text)
    assert k8s == "k8s" and re.findall(r"`(\w+)`", modules) == ["clients", "rest", "logs"]
    assert (azureml, common) == ("sdk/azureml", "`common`")


def test_unit_tests_mirror_the_package() -> None:
    """A unit test of a package's code lives in tests/unit/<package>/; the files loose in
    tests/unit/ are about the repository (its docs, code shape, chart, images, tiers)."""
    packages = _modules(PACKAGE)
    loose = sorted(
        p.stem.removeprefix("test_") for p in (ROOT / "tests" / "unit").glob("test_*.py")
    )
    misplaced = [
        name
        for name in loose
        if any(name == package or name.startswith(package + "_") for package in packages)
    ]
    assert loose and not misplaced, f"tests/unit/test_<package>_*.py: {misplaced}"
