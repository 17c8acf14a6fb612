"""The operator's command-line options, without importing Kopf (keeps ``--help`` fast)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The operator's options (shared by ``torchyard operator`` and ``-m torchyard.controller``)."""
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        help="watch only this namespace (repeatable; default: all namespaces)",
    )
    parser.add_argument(
        "--peering", action="store_true", help="use Kopf peering so that only one replica acts"
    )
    parser.add_argument(
        "--liveness",
        metavar="URL",
        default=None,
        help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
