"""The ``torchyard`` command: its parser, the dispatch to a command, and the one place that
turns a user's mistake into ``torchyard: error: <message>`` and an exit code.

Each command lives in the module of its concern and adds its own parser: ``servers``
(``operator``, ``registry serve``: the only commands that start server parts), ``local``
(``run --local``), ``submit`` (``submit``, ``validate``, ``crds``), ``follow`` (``wait``,
``logs``), ``inspect`` (``get``, ``describe``), ``history`` (``runs list``, ``runs
describe`` and the parser of ``describe``, which falls back to a gone run's record),
``suspension`` (``suspend``, ``resume``),
``models`` (``models ...``, ``runs download``), ``sweeps`` (``sweep ...``), ``endpoints``
(``endpoints ...``: deployed models), ``ui``
(``ui``: the web view), ``tensorboard`` (``tensorboard``: TensorBoard over a run's event
files). Commands
raise :class:`CliError` or let the SDK's errors through; :func:`main` catches them once
(:data:`EXITS`), so no command shows a traceback for a missing kubeconfig, a cluster that
is down, a file that is not there or a refusal. The exit codes are ``cli.errors``'s: one
scheme for every command, shown in the CLI reference. A flag a command does not have is
refused with that command's usage; a reader that goes away (``| head``) ends the output
without a word.

Called by the console scripts ``torchyard`` and ``kubectl-torchyard`` and
``python -m torchyard``; tested in tests/unit/cli/test_commands.py, tests/unit/cli/ and
tests/integration/test_cli.py.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

import yaml

import torchyard
from torchyard import api
from torchyard.cli import endpoints as endpoint_commands
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
from torchyard.cli.errors import BAD_INPUT, BROKEN_PIPE, FAILED, SIGNALED, CliError
from torchyard.sdk import clusters, documents, runs, snapshots
from torchyard.sdk import endpoints as endpoint_sdk
from torchyard.sdk import records as run_records
from torchyard.sdk import sweeps as sweep_sdk
from torchyard.sdk.registry import RegistryError

# The errors a command may end with, the exit code of each, and what goes before the
# message; the first that matches wins (TimeoutError is an OSError: ``wait`` turns its own
# into a CliError first).
EXITS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], int, str], ...] = (
    (api.InvalidSpec, BAD_INPUT, "invalid resource: "),
    (documents.EmptyFile, BAD_INPUT, ""),
    (snapshots.SnapshotError, BAD_INPUT, ""),
    (run_records.BadQuery, BAD_INPUT, ""),
    (
        (
            clusters.ApiError,
            clusters.Unreachable,
            RegistryError,
            runs.RunNotFound,
            sweep_sdk.SweepNotFound,
            endpoint_sdk.EndpointNotFound,
        ),
        FAILED,
        "",
    ),
    ((OSError, yaml.YAMLError), BAD_INPUT, ""),
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
    endpoint_commands.add_endpoints(sub)
    ui.add_ui(sub)
    tensorboard.add_tensorboard(sub)
    submit.add_crds(sub)
    submit.add_validate(sub)
    _own_parsers(parser)
    return parser


def _own_parsers(parser: argparse.ArgumentParser) -> None:
    """Each command's parser in its own defaults, so that a flag it does not have is
    refused with its usage (argparse itself would show the top-level one); and its help
    line as its description where it has none, so that ``COMMAND --help`` says what it
    does."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                sub.set_defaults(command_parser=sub)
                if not sub.description and helps.get(name):
                    sub.description = str(helps[name])[0].upper() + str(helps[name])[1:] + "."
                _own_parsers(sub)


def failure(err: BaseException) -> CliError | None:
    """``err`` as what the user reads and the exit code, or None when it is a bug."""
    if isinstance(err, CliError):
        return err
    if isinstance(err, documents.Invalid):  # one error line per invalid document
        lines = [f"invalid resource: {problem}" for problem in err.problems]
        return CliError("\ntorchyard: error: ".join(lines), BAD_INPUT)
    for kinds, code, prefix in EXITS:
        if isinstance(err, kinds):
            message = err.message if isinstance(err, clusters.ApiError) else str(err)
            return CliError(prefix + message, code)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command of ``argv`` (default: the process's); its exit code."""
    try:
        return _run(build_parser(), argv)
    except BrokenPipeError:
        # the reader went away: what is still buffered goes nowhere, and Python says
        # nothing at exit either
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return BROKEN_PIPE


def _run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        own: argparse.ArgumentParser = getattr(args, "command_parser", parser)
        own.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return BAD_INPUT
    try:
        from_file = args.command == "submit" or getattr(args, "namespace_from_file", False)
        kube = hasattr(args, "context") and not getattr(args, "local", False)
        if not from_file and hasattr(args, "namespace") and args.namespace is None:
            args.namespace = (
                clusters.default_namespace(args.kubeconfig, args.context) if kube else "default"
            )
        result: int = args.func(args)
    except KeyboardInterrupt as err:  # Ctrl-C, or a local run's SIGTERM/SIGHUP
        return SIGNALED + int(getattr(err, "signum", signal.SIGINT))
    except BrokenPipeError:
        raise  # (main's: not a file the user named)
    except Exception as err:
        error = failure(err)
        if error is None:
            raise
        print(f"torchyard: error: {error.message}", file=sys.stderr)
        return error.code
    return result
