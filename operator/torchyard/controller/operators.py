"""Running the Kopf operator: in-process for tests, or as ``torchyard operator``.

Importing this module registers the handlers (``controller.handlers``) with Kopf.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import threading
from collections.abc import Sequence

import kopf

from torchyard import k8s
from torchyard.controller import handlers as handlers  # registers the handlers
from torchyard.controller import telemetry
from torchyard.launch.contract import TORCHYARD_METRICS_PORT, TORCHYARD_PEERING_NAME


def metrics_port(port: int | None = None) -> int:
    """``port``, else $TORCHYARD_METRICS_PORT, else 9090 (0: no metrics server)."""
    if port is not None:
        return port
    return int(os.environ.get(TORCHYARD_METRICS_PORT) or telemetry.DEFAULT_PORT)


def peering_name(name: str | None = None) -> str | None:
    """``name``, else $TORCHYARD_PEERING_NAME, else None (no mandatory peering)."""
    return name or os.environ.get(TORCHYARD_PEERING_NAME) or None


def _memo(
    memo: kopf.Memo | None,
    namespaces: Sequence[str],
    log_limit_bytes: int | None,
    client: k8s.Client,
) -> kopf.Memo:
    memo = memo if memo is not None else kopf.Memo()
    memo.namespaces = tuple(namespaces)
    memo.log_limit_bytes = log_limit_bytes  # read by handlers.configure into the Settings
    memo.k8s = client  # every request of the operator, Kopf's own included (handlers.login)
    return memo


def run(
    namespaces: Sequence[str] = (),
    *,
    stop_flag: threading.Event | None = None,
    ready_flag: threading.Event | None = None,
    standalone: bool = True,
    liveness_endpoint: str | None = None,
    peering: str | None = None,
    metrics: int | None = None,
    memo: kopf.Memo | None = None,
    log_limit_bytes: int | None = None,
    client: k8s.Client | None = None,
) -> None:
    """Run the operator until ``stop_flag`` is set (blocking; own event loop).

    ``peering`` names the (Cluster)KopfPeering object that makes peering mandatory;
    ``metrics`` is the port of ``/metrics`` (see :func:`metrics_port`); ``memo`` is the
    operator's memo (an in-process caller reads its work queue, ``memo.queue``);
    ``log_limit_bytes`` the limit of each rank's log for a run that sets none
    (``--default-log-limit-bytes``; None: the launcher's default);
    ``client`` holds the credentials the operator uses for everything, default a client of
    its own from the Pod's ServiceAccount or the kubeconfig (never the shared
    ``k8s.load()`` one, which an in-process caller such as a test keeps for itself).
    """
    client = client if client is not None else k8s.Client.configured()
    telemetry.serve(metrics_port(metrics))
    name = peering_name(peering)
    asyncio.run(
        kopf.operator(
            standalone=standalone and name is None,
            peering_name=name,
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            stop_flag=stop_flag,
            ready_flag=ready_flag,
            liveness_endpoint=liveness_endpoint,
            memo=_memo(memo, namespaces, log_limit_bytes, client),
        )
    )


def main(
    namespaces: Sequence[str] = (),
    *,
    verbose: bool = False,
    standalone: bool = True,
    liveness_endpoint: str | None = None,
    peering: str | None = None,
    metrics: int | None = None,
    log_limit_bytes: int | None = None,
) -> int:
    kopf.configure(verbose=verbose, log_format=kopf.LogFormat.PLAIN)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    run(
        namespaces,
        standalone=standalone,
        liveness_endpoint=liveness_endpoint,
        peering=peering,
        metrics=metrics,
        log_limit_bytes=log_limit_bytes,
    )
    return 0


def main_from_args(args: argparse.Namespace) -> int:
    return main(
        args.namespace or (),
        verbose=args.verbose,
        standalone=not (args.peering or args.peering_name),
        liveness_endpoint=args.liveness,
        peering=args.peering_name,
        metrics=args.metrics_port,
        log_limit_bytes=args.default_log_limit_bytes,
    )
