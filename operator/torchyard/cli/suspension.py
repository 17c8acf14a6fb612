"""``torchyard suspend NAME`` and ``torchyard resume NAME``: a run's ``spec.suspend``.

Called by ``torchyard.cli.app``; over ``torchyard.sdk.suspension``. Tested in
tests/integration/test_suspend.py.
"""

from __future__ import annotations

import argparse
from typing import Any

from torchyard.cli.errors import CliError
from torchyard.cli.options import connect, kube_options
from torchyard.sdk import suspension


def cmd_suspend(args: argparse.Namespace) -> int:
    connect(args)
    try:
        suspension.set_suspend(args.namespace, args.run, args.command == "suspend")
    except ValueError as err:
        raise CliError(str(err), 1) from None
    if args.command == "suspend":
        print(
            f"TrainingRun {args.namespace}/{args.run} suspending: its node Pods save a "
            "checkpoint and stop (torchyard get runs shows Suspended once they did)"
        )
    else:
        print(
            f"TrainingRun {args.namespace}/{args.run} resumed: admitted in its queue order, "
            "it continues from its newest complete checkpoint"
        )
    return 0


def add_suspend(sub: Any) -> None:
    p = sub.add_parser(
        "suspend",
        help="checkpoint a run now, stop its node Pods and free its capacity (spec.suspend)",
    )
    p.add_argument("run", help="the TrainingRun's name")
    kube_options(p)
    p.set_defaults(func=cmd_suspend)


def add_resume(sub: Any) -> None:
    p = sub.add_parser(
        "resume", help="admit a suspended run again; it resumes from its newest checkpoint"
    )
    p.add_argument("run", help="the TrainingRun's name")
    kube_options(p)
    p.set_defaults(func=cmd_suspend)
