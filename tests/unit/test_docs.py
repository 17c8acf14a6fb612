"""The repository's own documentation tells the truth about itself: docstrings and comments
cite only files that are in the repository, no text speaks of the project's history
("later issues add ...", "Changed:", "before, ..."), docs/architecture.md exists, is linked
from the README's Layout section and names every layer of pyproject.toml's import-linter
contract, the README stays short and gives the command .ci/run runs, and the generated
pages of the documentation site (docs/gen/: the CRD, CLI, Helm values, metrics and
failure class references, and the benchmarks page) are what their generator makes now."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib
import yaml

from torchyard.api.trainingrun_status import FAILURE_CLASSES

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "operator"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
CITED = re.compile(r"[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md\b")
# Words about the project's past or its issue tracker, which a reader of the code lacks.
HISTORY = re.compile(
    r"later issues?|with later|parenthesised layers|\bissue #\d|\(issue \d", re.IGNORECASE
)
# History notes in the user's documentation: it says what is, not what was.
DIARY = re.compile(
    r"changed:|\*changed\b|earlier run|before,|previously|used to|now fixed|as before\b|"
    r"is new\b|found (?:a|two) bugs?",
    re.IGNORECASE,
)
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def _python(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every docstring and comment of a Python file."""
    source = path.read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                yield getattr(node, "lineno", 1), docstring
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def _toml_comments(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("#"):
            yield number, line


def _exists(cited: str, beside: Path) -> bool:
    return any((base / cited).exists() for base in (ROOT, beside, OPERATOR / "torchyard"))


def test_docstrings_and_comments_cite_only_files_in_the_repository() -> None:
    missing = []
    sources = [(p, _prose(p)) for p in _python(OPERATOR)]
    sources.append((ROOT / "pyproject.toml", _toml_comments(ROOT / "pyproject.toml")))
    for path, prose in sources:
        for line, text in prose:
            for cited in CITED.findall(text):
                if not _exists(cited, path.parent):
                    missing.append(f"{path.relative_to(ROOT)}:{line} cites {cited}")
    # Test modules' docstrings too (their bodies make up file names on purpose).
    for path in _python(ROOT / "tests"):
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        for cited in CITED.findall(docstring):
            if not _exists(cited, path.parent):
                missing.append(f"{path.relative_to(ROOT)} cites {cited}")
    assert not missing, "files that are not in the repository:\n" + "\n".join(missing)


def test_no_text_speaks_of_the_projects_history() -> None:
    texts = [*_python(OPERATOR), *_python(ROOT / "tests"), ROOT / "pyproject.toml"]
    texts += [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in texts
        if path != Path(__file__).resolve()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not found, "history words:\n" + "\n".join(found)


def test_the_architecture_page_is_linked_and_names_every_layer() -> None:
    page = ARCHITECTURE.read_text()
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("\n## Layout") :]
    assert "(docs/architecture.md)" in layout
    assert "architecture.md" in str(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c["layers"] for c in contracts["contracts"] if c["type"] == "layers")
    packages = [name.strip() for row in layers for name in row.split("|")]
    assert len(packages) >= 10
    for package in packages:
        assert f"`{package.removeprefix('torchyard.')}`" in page, package
    for step in ("kubectl apply", "torchyard submit", "CEL", "launcher", "ModelVersion"):
        assert step in page, step


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_documentation_stands_on_its_own(path: Path) -> None:
    text = path.read_text()
    assert "../shared" not in text and "/work/shared" not in text


def test_the_documentation_keeps_no_diary() -> None:
    found = []
    for path in PAGES:
        text = " ".join(path.read_text().split())  # a note may span lines
        found += [
            f"{path.relative_to(ROOT)}: ...{text[max(0, m.start() - 60) : m.end() + 30]}..."
            for m in DIARY.finditer(text)
        ]
    assert not found, "history notes (say what is, not what was):\n" + "\n".join(found)


def test_the_readme_is_short_and_gives_the_ci_command() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    commands = readme[readme.index("## The two commands") :].split("```")[1]
    assert "make demo" in commands
    # .ci/run runs the README's test command
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci.startswith("exec "), ci
    assert ci.removeprefix("exec ").strip() in commands
    # and the README says where anything is still simulated
    assert "still simulated" in readme


def test_the_generated_pages_are_up_to_date() -> None:
    from docs.gen import pages

    wanted = pages()
    stale = [
        name
        for name, text in wanted.items()
        if not (DOCS / name).exists() or (DOCS / name).read_text() != text
    ]
    stale += [
        path.relative_to(DOCS).as_posix()
        for path in (DOCS / "reference").glob("*.md")
        if path.relative_to(DOCS).as_posix() not in wanted
    ]
    assert not stale, f"run `make docs`; stale pages: {stale}"


def test_the_reference_covers_every_field_command_value_metric_and_class() -> None:
    """Spot checks that the generators read what they should (the staleness test above
    keeps the files equal to what they make)."""
    from docs.gen import reference

    pages = reference.pages()
    trainingrun = pages["reference/trainingrun.md"]
    for field in ("`spec.distribution.nodeCount`", "`status.failure.class`", "CEL `"):
        assert field in trainingrun, field
    assert "`torchyard models download`" in pages["reference/cli.md"]
    assert "`registry.tls.certManager.issuerRef`" in pages["reference/helm-values.md"]
    assert "`torchyard_registry_sent_bytes_total`" in pages["reference/metrics.md"]
    troubleshooting = (DOCS / "operations" / "troubleshooting.md").read_text()
    for name in FAILURE_CLASSES:
        assert f"## {name}" in pages["reference/failure-classes.md"], name
        assert f"`{name}`" in troubleshooting, name


def test_the_documentation_tools_are_pinned() -> None:
    lock = (DOCS / "requirements.lock").read_text().splitlines()
    pins = [line for line in lock if line.strip() and not line.startswith("#")]
    assert {p.split("==")[0].lower() for p in pins} >= {"mkdocs", "mkdocs-material"}
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.+-]+", p) for p in pins), pins
