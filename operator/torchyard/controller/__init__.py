"""The torchyard operator: Kopf handlers over the pure layers.

``torchyard operator`` and ``python -m torchyard.controller`` call :func:`main`; tests
run :func:`run` in a thread against the test control plane. Only this package imports
kopf; ``torchyard.k8s`` is the only code that talks to the API.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
from collections.abc import Sequence

import kopf

from torchyard.controller import handlers as handlers  # registers the handlers


def run(
    namespaces: Sequence[str] = (),
    *,
    stop_flag: threading.Event | None = None,
    ready_flag: threading.Event | None = None,
    standalone: bool = True,
    liveness_endpoint: str | None = None,
) -> None:
    """Run the operator until ``stop_flag`` is set (blocking; own event loop)."""
    asyncio.run(
        kopf.operator(
            standalone=standalone,
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            stop_flag=stop_flag,
            ready_flag=ready_flag,
            liveness_endpoint=liveness_endpoint,
        )
    )


def main(
    namespaces: Sequence[str] = (),
    *,
    verbose: bool = False,
    standalone: bool = True,
    liveness_endpoint: str | None = None,
) -> int:
    kopf.configure(verbose=verbose, log_format=kopf.LogFormat.PLAIN)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    run(namespaces, standalone=standalone, liveness_endpoint=liveness_endpoint)
    return 0


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


def main_from_args(args: argparse.Namespace) -> int:
    return main(
        args.namespace or (),
        verbose=args.verbose,
        standalone=not args.peering,
        liveness_endpoint=args.liveness,
    )


__all__ = ["add_arguments", "handlers", "main", "main_from_args", "run"]
