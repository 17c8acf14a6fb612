"""Every ``torchyard`` command the documentation shows exists, with every flag it shows:
each command line of every shell block of the README and docs/ is parsed by the CLI's
own parser (a command, a subcommand, a flag or a choice that is not there fails here).
The blocks that run locally run for real in tests/e2e/test_local_docs.py."""

from __future__ import annotations

import contextlib
import io

import pytest

from tests.documented import LOCAL_PAGES, PAGES, Block, blocks, is_local, torchyard_argv
from torchyard import cli

LINES = [
    (block, argv)
    for page in PAGES
    for block in blocks(page)
    for argv in map(torchyard_argv, block.lines)
    if argv is not None
]


def test_the_documentation_shows_commands() -> None:
    assert len(LINES) > 40
    local = [b for page in LOCAL_PAGES for b in blocks(page) if is_local(b)]
    assert len(local) >= 4, [b.where for b in local]


@pytest.mark.parametrize(
    ("block", "argv"), LINES, ids=[f"{b.where} {' '.join(a)[:60]}" for b, a in LINES]
)
def test_every_documented_command_and_flag_exists(block: Block, argv: list[str]) -> None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args, unknown = cli.build_parser().parse_known_args(argv)
    except SystemExit:
        pytest.fail(f"{block.where}: `torchyard {' '.join(argv)}`: {err.getvalue().strip()}")
    assert not unknown, f"{block.where}: `torchyard {' '.join(argv)}`: no such {unknown}"
    assert getattr(args, "func", None), f"{block.where}: `torchyard {' '.join(argv)}`: no command"
