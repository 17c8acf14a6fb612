"""The shell commands the documentation shows: every ``sh``/``bash`` block of the README
and docs/ (indented ones under list items too), and the ``torchyard`` command lines in
them. Used by tests/unit/test_documented_commands.py (each line parses with the CLI) and
tests/e2e/test_local_docs.py (the local blocks run, in order)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# The pages whose local blocks are the first hour, in the order a newcomer reads them.
LOCAL_PAGES = [
    ROOT / "docs" / "getting-started" / "local.md",
    *sorted((ROOT / "docs" / "how-to").glob("*.md")),
]
_BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>sh|bash|shell)\n(?P<body>.*?)^(?P=indent)```", re.M | re.S
)
_COMMAND = re.compile(r"^(?:\.venv/bin/|\.\./\.\./\.venv/bin/)?(?:kubectl[ -])?torchyard\b")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of its first command
    lines: tuple[str, ...]  # its commands, comments and continuation lines taken off

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The shell blocks of ``page``."""
    text = page.read_text()
    found = []
    for match in _BLOCK.finditer(text):
        start = text.count("\n", 0, match.start()) + 2
        indent = len(match["indent"])
        lines = []
        for raw in match["body"].splitlines():
            line = raw[indent:] if raw[:indent].strip() == "" else raw
            line = re.split(r"\s+#\s", " " + line, maxsplit=1)[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
        if lines:
            found.append(Block(page, start, tuple(lines)))
    return found


def torchyard_argv(line: str) -> list[str] | None:
    """The arguments of the ``torchyard`` command a line runs (up to a pipe), or None."""
    for part in line.split("&&"):
        part = part.split(" | ")[0].strip()
        if _COMMAND.match(part):
            words = shlex.split(part)
            at = next(i for i, w in enumerate(words) if w.endswith("torchyard"))
            return words[at + 1 :]
    return None


def is_local(block: Block) -> bool:
    """A block that runs on this machine alone: each line a ``torchyard`` command that
    reads or runs locally (``--local``, ``validate``), or the SDK's local target."""
    for line in block.lines:
        argv = torchyard_argv(line)
        if argv is None:
            if "train_locally.py" not in line:
                return False
        elif "--local" not in argv and argv[:1] != ["validate"]:
            return False
    return True
