"""The two commands that start server parts: ``torchyard operator`` (the Kopf operator,
``torchyard.controller.operators``) and ``torchyard registry serve`` (the registry service,
``torchyard.registry_server``). Every other command goes through the SDK.

Their options come from those entry points (``controller.options``,
``registry_server.add_arguments``), importable without Kopf or aiohttp, so that
``torchyard --help`` stays fast; the servers are imported when the command runs. Called by
``torchyard.cli.app``.
"""

from __future__ import annotations

import argparse
from typing import Any

from torchyard import registry_server
from torchyard.cli.errors import CliError
from torchyard.controller import options


def cmd_operator(args: argparse.Namespace) -> int:
    from torchyard.controller import operators

    return operators.main_from_args(args)


def cmd_registry_serve(args: argparse.Namespace) -> int:
    try:
        return registry_server.main_from_args(args)
    except registry_server.OptionError as err:
        raise CliError(str(err), 2) from None


def add_operator(sub: Any) -> None:
    p = sub.add_parser("operator", help="run the operator (Kopf) against the current cluster")
    options.add_arguments(p)
    p.set_defaults(func=cmd_operator)


def add_registry(sub: Any) -> None:
    p = sub.add_parser("registry", help="the model registry service")
    reg = p.add_subparsers(dest="registry_command", metavar="COMMAND")
    p = reg.add_parser(
        "serve",
        help="serve the registry volume over HTTPS (registry-audience tokens checked "
        "with TokenReview, requests with SubjectAccessReview)",
    )
    registry_server.add_arguments(p)
    p.set_defaults(func=cmd_registry_serve)
