"""Following a run: ``torchyard wait`` (phase, nodes and logs until it ends, then the
outcome as the exit code) and ``torchyard logs`` (live from the Pods, else the archive).

Called by ``torchyard.cli.app`` (and ``submit --wait``); over ``torchyard.sdk.runs``.
Tested in tests/integration/test_cli.py.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from torchyard.cli.errors import CliError
from torchyard.cli.options import connect, registry, registry_options
from torchyard.sdk import runs


def wait(args: argparse.Namespace, name: str, show_output: bool) -> int:
    """Follow run ``name`` to its end; 0 when it succeeded, 1 when it failed, 124 when
    ``--timeout`` passed first."""
    try:
        run = runs.wait(
            args.namespace,
            name,
            show_output=show_output,
            timeout=getattr(args, "timeout", None),
            registry=lambda: registry(args),
        )
    except TimeoutError as err:
        raise CliError(str(err), 124) from None
    code, text = runs.outcome(run)
    print(text, file=sys.stderr if code else sys.stdout)
    return code


def cmd_wait(args: argparse.Namespace) -> int:
    """Follow a run to its end (~ run.wait_for_completion(show_output=True))."""
    connect(args)
    return wait(args, args.run, not args.quiet)


def cmd_logs(args: argparse.Namespace) -> int:
    """A run's logs, node by node: live from its Pod, else (the kubelet unreachable, the
    Pod gone, an empty live log) archived in the registry service."""
    connect(args)
    shown = runs.logs(
        args.namespace,
        args.run,
        out=sys.stdout,
        notes=sys.stderr,
        node=args.node,
        rank=args.rank,
        follow=args.follow,
        registry=lambda: registry(args),
    )
    if not shown:
        raise CliError(f"no logs of {args.run} found")
    return 0


def add_wait(sub: Any) -> None:
    p = sub.add_parser(
        "wait",
        help="follow a run to its end: phase, nodes, logs (~ run.wait_for_completion)",
        description="Follow a TrainingRun: a line whenever its phase or a node changes, every "
        "node's log with [node n] [rank r] prefixes, then the outcome. Exit code 0 when it "
        "succeeded, 1 with the failing rank's traceback when it failed.",
    )
    p.add_argument("run")
    p.add_argument("-q", "--quiet", action="store_true", help="no logs, only the state")
    p.add_argument("--timeout", type=float, help="give up after this many seconds (exit 124)")
    registry_options(p)  # for the archived logs when the live ones are not reachable
    p.set_defaults(func=cmd_wait)


def add_logs(sub: Any) -> None:
    p = sub.add_parser("logs", help="a run's logs (live from the Pods, else the archive)")
    p.add_argument("run")
    p.add_argument("--node", type=int, help="only this node")
    p.add_argument("--rank", type=int, help="only this global rank")
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming")
    registry_options(p)
    p.set_defaults(func=cmd_logs)
