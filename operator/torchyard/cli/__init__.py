"""The ``torchyard`` command line: a thin layer over the SDK (``torchyard.sdk``) and the
two server entry points (``torchyard operator``, ``torchyard registry serve``).

This file is its face. ``main`` (the console scripts' entry, in ``cli.app``) builds the
parser from the command modules (``servers``, ``local``, ``submit``, ``follow``,
``inspect``, ``models``; shared options in ``options``) and is the one place errors
become ``torchyard: error: ...`` (``errors.CliError``). pyproject.toml's import-linter
contract keeps the CLI on the SDK, ``torchyard.api`` and the server entry points.
"""

from torchyard.cli.app import build_parser, main
from torchyard.cli.errors import CliError

__all__ = ["CliError", "build_parser", "main"]
