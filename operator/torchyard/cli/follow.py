"""Following a run: ``torchyard wait`` (phase, nodes and logs until it ends, then the
outcome as the exit code) and ``torchyard logs`` (live from the Pods, else the archive;
``--local``: a local run's archive).

Called by ``torchyard.cli.app`` (and ``submit --wait``); over ``torchyard.sdk.runs``.
Tested in tests/integration/test_cli.py.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from torchyard.cli.errors import BAD_INPUT, FAILED, OK, TIMED_OUT, CliError
from torchyard.cli.options import (
    connect,
    local_options,
    local_registry,
    reads_local,
    registry_options,
    service,
)
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
            registry=lambda: service(args),
        )
    except TimeoutError as err:
        raise CliError(str(err), TIMED_OUT) from None
    code, text = runs.outcome(run)
    print(text, file=sys.stderr if code else sys.stdout)
    return FAILED if code else OK


def cmd_wait(args: argparse.Namespace) -> int:
    """Follow a run to its end (~ run.wait_for_completion(show_output=True))."""
    connect(args)
    return wait(args, args.run, not args.quiet)


def cmd_logs(args: argparse.Namespace) -> int:
    """A run's logs, node by node: live from its Pod, else (the kubelet unreachable, the
    Pod gone, an empty live log) archived in the registry service; a local run's from the
    local registry."""
    if reads_local(args):
        return _local_logs(args)
    connect(args)
    shown = runs.logs(
        args.namespace,
        args.run,
        out=sys.stdout,
        notes=sys.stderr,
        node=args.node,
        rank=args.rank,
        follow=args.follow,
        registry=lambda: service(args),
    )
    if not shown:
        raise CliError(f"no logs of {args.run} found")
    return OK


def _local_logs(args: argparse.Namespace) -> int:
    """A local run's archived logs (archived when it ended), ``[node n] [rank r]`` first."""
    if args.follow:
        raise CliError(
            "--follow follows a run in a cluster; a local run's logs are on its terminal "
            "while it runs and archived when it ends",
            BAD_INPUT,
        )
    nodes = None if args.node is None else [args.node]
    shown = 0
    for line in runs.archived_logs(local_registry(args), args.namespace, args.run, nodes):
        if args.rank is None or f"[rank {args.rank}] " in line:
            print(line)
            shown += 1
    if not shown:
        raise CliError(f"no logs of {args.run} in the local registry", FAILED)
    return OK


def add_wait(sub: Any) -> None:
    p = sub.add_parser(
        "wait",
        help="follow a run to its end: phase, nodes, logs (~ run.wait_for_completion)",
        description="Follow a TrainingRun: a line whenever its phase or a node changes, every "
        "node's log with [node n] [rank r] prefixes, then the outcome. Exit code 0 when it "
        "succeeded, 1 with the failing rank's traceback when it failed.",
    )
    p.add_argument("run", help="the TrainingRun's name")
    p.add_argument("-q", "--quiet", action="store_true", help="no logs, only the state")
    p.add_argument("--timeout", type=float, help="give up after this many seconds (exit 124)")
    registry_options(p)  # for the archived logs when the live ones are not reachable
    p.set_defaults(func=cmd_wait)


def add_logs(sub: Any) -> None:
    p = sub.add_parser(
        "logs",
        help="a run's logs (live from the Pods, else the archive; --local: a local run's)",
        description="A TrainingRun's logs, node by node, each line prefixed [node n] [rank r]: "
        "live from its node Pods while they exist, else archived in the registry service "
        "(the ranks' progress reports left out). With --local, a local run's archived logs.",
    )
    p.add_argument("run", help="the TrainingRun's name")
    p.add_argument("--node", type=int, help="only this node")
    p.add_argument("--rank", type=int, help="only this global rank")
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming (a cluster's run)")
    local_options(p)
    registry_options(p)
    p.set_defaults(func=cmd_logs)
