"""The operator's command-line options, without importing Kopf (keeps ``--help`` fast)."""

from __future__ import annotations

import argparse

from torchyard.launch import contract


def _port(value: str) -> int:
    port = int(value)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (0 disables)")
    return port


# The bounds of spec.policy.logLimitBytes: the operator's default for a run that sets
# none keeps within them.
LOG_LIMIT_MIN, LOG_LIMIT_MAX = contract.LOG_LIMIT_MIN, contract.LOG_LIMIT_MAX


def log_limit(value: str) -> int:
    """An argparse type: bytes, within what ``spec.policy.logLimitBytes`` allows."""
    try:
        limit = int(value)
    except ValueError:
        limit = -1
    if not LOG_LIMIT_MIN <= limit <= LOG_LIMIT_MAX:
        raise argparse.ArgumentTypeError(
            f"{value!r}: give a number of bytes from {LOG_LIMIT_MIN} to {LOG_LIMIT_MAX} "
            "(as spec.policy.logLimitBytes), e.g. 67108864 for 64 MiB"
        )
    return limit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The operator's options (shared by ``torchyard operator`` and ``-m torchyard.controller``)."""
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        help="watch only this namespace (repeatable, exact names; default: all namespaces)",
    )
    parser.add_argument(
        "--peering",
        action="store_true",
        help="use Kopf peering (the peering object named 'default', when it exists) so that "
        "only one replica acts",
    )
    parser.add_argument(
        "--peering-name",
        metavar="NAME",
        default=None,
        help="mandatory Kopf peering through the KopfPeering (with --namespace) or "
        "ClusterKopfPeering named NAME: the operator does nothing until that object exists, "
        "and only the replica with the highest priority acts (default: "
        "$TORCHYARD_PEERING_NAME; implies --peering)",
    )
    parser.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        help="serve Prometheus metrics on http://0.0.0.0:PORT/metrics "
        "(default: $TORCHYARD_METRICS_PORT or 9090; 0 disables)",
    )
    parser.add_argument(
        "--liveness",
        metavar="URL",
        default=None,
        help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument(
        "--default-log-limit-bytes",
        type=log_limit,
        metavar="BYTES",
        default=None,
        help="the most each rank's archived log (logs/rank-<r>.txt) holds for a TrainingRun "
        "that sets no spec.policy.logLimitBytes (default: the launcher's 64 MiB)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
