"""``torchyard tensorboard RUN`` (or ``--sweep NAME``): a real TensorBoard on 127.0.0.1 over
the run's event files (``$TORCHYARD_TENSORBOARD_DIR``), copied into a folder on this
machine and kept up to date while the run runs (``torchyard.sdk.tensorboard``): from node
0's Pod, then from the archive; with ``--local`` from a local run's folders. A sweep's
trials are a subfolder each, so TensorBoard shows them side by side.

TensorBoard itself is not a dependency of torchyard: ``pip install 'torchyard[tensorboard]'``
or ``--tensorboard PATH``. Called by ``torchyard.cli.app``; tested in
tests/unit/cli/test_tensorboard.py and tests/integration/tracking/test_tensorboard.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchyard.cli.errors import CliError
from torchyard.cli.options import (
    connect,
    local_registry_option,
    port_number,
    registry_options,
    service,
)
from torchyard.launch.contract import TORCHYARD_TENSORBOARD
from torchyard.sdk import clusters, local_runs
from torchyard.sdk import sweeps as sweep_sdk
from torchyard.sdk import tensorboard as tb
from torchyard.sdk.registry import RegistryClient, RegistryError
from torchyard.sdk.runs import RunNotFound

HOST = "127.0.0.1"
# What one round of copying may end with and the next may not (a Pod going away, the
# apiserver or the registry briefly unreachable, a refused exec).
SYNC_ERRORS = (OSError, clusters.ApiError, clusters.Unreachable, RegistryError)
INSTALL = "pip install 'torchyard[tensorboard]'"


def _binary(args: argparse.Namespace) -> str:
    """The ``tensorboard`` command: --tensorboard, $TORCHYARD_TENSORBOARD, else PATH's."""
    given = args.tensorboard or os.environ.get(TORCHYARD_TENSORBOARD)
    found = shutil.which(given) if given else shutil.which("tensorboard")
    if not found:
        raise CliError(
            f"no TensorBoard {'at ' + repr(given) if given else 'on PATH'}: {INSTALL}, "
            "or name one with --tensorboard PATH",
            1,
        )
    return found


def _text(err: BaseException) -> str:
    return err.message if isinstance(err, clusters.ApiError) else str(err)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _session(args: argparse.Namespace, folder: Path) -> tb.Session:
    """The runs to show and where each one's event files are (local or in the cluster)."""
    if args.local:
        ns = args.namespace or "default"  # (a local run's, unless its file names one)
        reg = Path(args.registry).expanduser() if args.registry else local_runs.default_registry()
        work = Path(args.workdir).expanduser() if args.workdir else local_runs.default_workroot()
        runs = [args.run] if args.run else tb.local_trials(reg, work, ns, args.sweep)
        if not runs:
            raise CliError(f"no trials of a local Sweep {ns}/{args.sweep} in {work} or {reg}", 1)
        return tb.Session(runs, lambda r: tb.local_source(reg, work, ns, r), tb.Mirror(folder))
    connect(args)
    ns = args.namespace or clusters.default_namespace(args.kubeconfig, args.context)
    made: list[RegistryClient] = []

    def archive() -> RegistryClient:  # (only when a run's archive or records are read)
        if not made:
            args.namespace = ns
            made.append(service(args))
            made[0].progress = False
        return made[0]

    runs = _trials(ns, args.sweep, archive) if args.sweep else [args.run]
    return tb.Session(runs, lambda r: tb.cluster_source(ns, r, archive), tb.Mirror(folder))


def _trials(ns: str, sweep: str, archive: Callable[[], RegistryClient]) -> list[str]:
    """A Sweep's trials: those in the cluster and those the registry recorded (their
    TrainingRuns deleted by their TTL); a registry that cannot be read leaves the latter
    out, said."""
    created = sweep_sdk.get(ns, sweep)["metadata"].get("creationTimestamp")  # (SweepNotFound)
    try:
        gone = tb.recorded_trials(archive(), ns, sweep, created)
    except SYNC_ERRORS as err:
        gone = []
        _say([f"trials whose TrainingRuns are gone are left out: no records ({_text(err)})"])
    runs = tb.trial_order([*tb.cluster_trials(ns, sweep), *gone])
    if not runs:
        raise CliError(f"Sweep {ns}/{sweep} has no trials yet", 1)
    return runs


def _say(lines: list[str]) -> None:
    for line in lines:
        print(f"torchyard tensorboard: {line}", file=sys.stderr, flush=True)


def _stop(signum: int, _frame: object) -> None:
    """SIGTERM as Ctrl-C: TensorBoard is ended with this command."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


def cmd_tensorboard(args: argparse.Namespace) -> int:
    if bool(args.run) == bool(args.sweep):
        raise CliError("name a run (RUN) or a sweep (--sweep NAME), one of them", 2)
    binary = _binary(args)
    name = args.run or args.sweep
    folder = Path(args.folder or Path("~/.torchyard/tensorboard").expanduser() / name)
    session = _session(args, folder)
    try:
        live, said = session.step()
        _say(said)
        session.check_found(live)
    except (RunNotFound, tb.NoEventFiles, RegistryError) as err:  # (the archive: no later)
        raise CliError(str(err), 1) from None
    except SYNC_ERRORS as err:  # a live run's Pod that cannot be read now: said, tried again
        live = True
        _say([f"cannot copy the event files now: {_text(err)}"])
    if live and not any(session.mirror.files(r) for r in session.runs):
        _say(["no event files yet: waiting for the run to write them"])
    port = args.port or _free_port()
    url = f"http://{HOST}:{port}"
    folder.mkdir(parents=True, exist_ok=True)
    command = tb.tensorboard_command(binary, folder, port, HOST)
    signal.signal(signal.SIGTERM, _stop)
    proc = tb.start_tensorboard(command, url, folder.parent / f".{folder.name}.tensorboard.log")
    print(f"torchyard tensorboard: serving {url} over {folder} (Ctrl-C stops it)", flush=True)
    try:
        while proc.poll() is None:
            time.sleep(args.interval)
            if live:
                try:
                    live, said = session.step()
                except SYNC_ERRORS as err:  # one failed round: said, tried again
                    said = [f"cannot copy the event files now: {_text(err)}"]
                _say(said)
                if not live:
                    _say(["every run ended: its event files are all here"])
    finally:
        proc.terminate()
        proc.wait(30)
    return 0 if proc.returncode in (0, -15) else 1


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1
    if not 0.2 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"seconds from 0.2 to 3600; got {text!r}")
    return value


def add_tensorboard(sub: Any) -> None:
    p = sub.add_parser(
        "tensorboard",
        help="serve a run's (or a sweep's) TensorBoard event files with TensorBoard, live",
        description="Start TensorBoard on 127.0.0.1 over the event files a run's scripts "
        "write to $TORCHYARD_TENSORBOARD_DIR (rank 0 by convention; node 0's are kept). "
        "While the run runs they are copied out of its node 0 Pod (the exec API: needs "
        "create on pods/exec, and 'sh' and 'tar' in the image) every --interval seconds; "
        "after it ended they come from its archive in the registry service. With --sweep "
        "each trial is a TensorBoard run of its own. TensorBoard is not installed with "
        f"torchyard: {INSTALL}.",
    )
    p.add_argument("run", nargs="?", help="the TrainingRun")
    p.add_argument(
        "--sweep",
        metavar="NAME",
        help="every trial of this Sweep, side by side (those whose TrainingRun was deleted "
        "from the registry's run records)",
    )
    p.add_argument(
        "--local",
        action="store_true",
        help="a local run ('torchyard run --local'): its working folder while it runs, the "
        "local registry's archive after",
    )
    local_registry_option(p)
    p.add_argument(
        "--workdir",
        metavar="DIR",
        help="with --local: where the local runs' folders are (default: ~/.torchyard/runs)",
    )
    p.add_argument(
        "--folder",
        metavar="DIR",
        help="where the event files are kept for TensorBoard, a subfolder per run "
        "(default: ~/.torchyard/tensorboard/NAME)",
    )
    p.add_argument(
        "--port", type=port_number, default=0, help="TensorBoard's port (default: a free one)"
    )
    p.add_argument(
        "--interval",
        type=_seconds,
        default=2.0,
        help="seconds between two copies of a running run's event files (default: 2)",
    )
    p.add_argument(
        "--tensorboard",
        metavar="PATH",
        help="the tensorboard command (default: $TORCHYARD_TENSORBOARD, else 'tensorboard' "
        "on PATH)",
    )
    registry_options(p)
    # (the namespace: with --local a local run's, "default"; else the context's, as kubectl)
    p.set_defaults(func=cmd_tensorboard, namespace_from_file=True)


__all__ = ["add_tensorboard", "cmd_tensorboard"]
