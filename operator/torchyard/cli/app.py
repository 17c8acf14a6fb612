"""The ``torchyard`` command: its parser, the dispatch to a command, and the one place that
turns a user's mistake into ``torchyard: error: <message>`` and an exit code.

Each command lives in the module of its concern and adds its own parser: ``servers``
(``operator``, ``registry serve``: the only commands that start server parts), ``local``
(``run --local``), ``submit`` (``submit``, ``validate``, ``crds``), ``follow`` (``wait``,
``logs``), ``inspect`` (``get``, ``describe``), ``history`` (``runs list``, ``runs
describe`` and the parser of ``describe``, which falls back to a gone run's record),
``suspension`` (``suspend``, ``resume``),
``models`` (``models ...``, ``runs download``), ``sweeps`` (``sweep ...``), ``ui``
(``ui``: the web view), ``tensorboard`` (``tensorboard``: TensorBoard over a run's event
files). Commands
raise :class:`CliError` or let the SDK's errors through; :func:`main` catches them once
(:data:`EXITS`), so no command shows a traceback for a missing kubeconfig, a cluster that
is down, a file that is not there or a refusal.

Called by the console scripts ``torchyard`` and ``kubectl-torchyard`` and
``python -m torchyard``; tested in tests/unit/test_cli.py, tests/unit/cli/ and
tests/integration/test_cli.py.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

import yaml

import torchyard
from torchyard import api
from torchyard.cli import (
    follow,
    history,
    inspect,
    local,
    models,
    servers,
    submit,
    suspension,
    sweeps,
    tensorboard,
    ui,
)
from torchyard.cli.errors import CliError
from torchyard.sdk import clusters, runs, snapshots
from torchyard.sdk import records as run_records
from torchyard.sdk import sweeps as sweep_sdk
from torchyard.sdk.registry import RegistryError

# The errors a command may end with, the exit code of each, and what goes before the
# message; the first that matches wins (TimeoutError is an OSError: ``wait`` turns its own
# into a CliError first).
EXITS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], int, str], ...] = (
    (api.InvalidSpec, 2, "invalid resource: "),
    (snapshots.SnapshotError, 2, ""),
    (run_records.BadQuery, 2, ""),
    (
        (
            clusters.ApiError,
            clusters.Unreachable,
            RegistryError,
            runs.RunNotFound,
            sweep_sdk.SweepNotFound,
        ),
        1,
        "",
    ),
    ((OSError, yaml.YAMLError), 2, ""),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchyard",
        description="Train PyTorch models at scale on Kubernetes: Environments, distributed "
        "TrainingRuns and a model registry.",
    )
    parser.add_argument("--version", action="version", version=f"torchyard {torchyard.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    servers.add_operator(sub)
    local.add_run(sub)
    submit.add_submit(sub)
    follow.add_wait(sub)
    follow.add_logs(sub)
    inspect.add_get(sub)
    history.add_describe(sub)
    suspension.add_suspend(sub)
    suspension.add_resume(sub)
    servers.add_registry(sub)
    models.add_models(sub)
    models.add_runs(sub)
    sweeps.add_sweep(sub)
    ui.add_ui(sub)
    tensorboard.add_tensorboard(sub)
    submit.add_crds(sub)
    submit.add_validate(sub)
    return parser


def failure(err: BaseException) -> CliError | None:
    """``err`` as what the user reads and the exit code, or None when it is a bug."""
    if isinstance(err, CliError):
        return err
    for kinds, code, prefix in EXITS:
        if isinstance(err, kinds):
            message = err.message if isinstance(err, clusters.ApiError) else str(err)
            return CliError(prefix + message, code)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        from_file = args.command == "submit" or getattr(args, "namespace_from_file", False)
        if not from_file and hasattr(args, "context") and args.namespace is None:
            args.namespace = clusters.default_namespace(args.kubeconfig, args.context)
        result: int = args.func(args)
    except KeyboardInterrupt as err:  # Ctrl-C, or a local run's SIGTERM/SIGHUP
        return 128 + int(getattr(err, "signum", signal.SIGINT))
    except Exception as err:
        error = failure(err)
        if error is None:
            raise
        print(f"torchyard: error: {error.message}", file=sys.stderr)
        return error.code
    return result
