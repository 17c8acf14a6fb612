"""Running the Kopf operator: in-process for tests, or as ``torchyard operator``.

Importing this module registers the handlers (``controller.handlers``) with Kopf.
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


def main_from_args(args: argparse.Namespace) -> int:
    return main(
        args.namespace or (),
        verbose=args.verbose,
        standalone=not args.peering,
        liveness_endpoint=args.liveness,
    )
