"""``torchyard run FILE --local``: a TrainingRun on this machine, with the cluster's rank
contract (``torchyard.sdk.local_runs``); with checkpoints it resumes an attempt that did
not finish and starts fresh after one that succeeded (``--fresh``, ``--resume`` say
otherwise). Exit code 0 when it succeeded, 1 when it failed (the rank's own code is in the
message), 2 for a file that is not valid. Called by ``torchyard.cli.app``; tested in
tests/unit/local/test_mode.py, tests/unit/cli/test_local_resume.py and tests/e2e/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from torchyard import api
from torchyard.cli.errors import BAD_INPUT, FAILED, OK, CliError
from torchyard.cli.options import load_documents, pick
from torchyard.sdk import local_runs, runs


def inputs(
    args: argparse.Namespace, docs: list[dict[str, Any]], environment_name: str
) -> tuple[api.Environment | None, Path, Path, local_runs.Source]:
    """What a local run (or a local sweep's trials) needs from the command line and the
    file: the Environment of that name in the file, the registry and runs folders, and
    the source files (said on standard error)."""
    env_body = pick(docs, "Environment", environment_name)
    environment = api.parse_environment(env_body) if env_body else None
    root = Path(args.source) if args.source else Path(args.file).resolve().parent
    registry = Path(args.registry).expanduser() if args.registry else local_runs.default_registry()
    workroot = Path(args.workdir).expanduser() if args.workdir else local_runs.default_workroot()
    source = local_runs.collect_source(root, registry, workroot)
    print(f"[torchyard] {source.report()}", file=sys.stderr)
    return environment, registry, workroot, source


def cmd_run(args: argparse.Namespace) -> int:
    """Run a TrainingRun; today on this machine (--local)."""
    if not args.local:
        raise CliError(
            "`torchyard run` needs --local (run on this machine); to run on a cluster, "
            "`torchyard submit` (or `kubectl apply -f`) the file with the operator installed",
            BAD_INPUT,
        )
    docs = load_documents(args.file)
    body = pick(docs, "TrainingRun", args.name)
    if body is None:
        raise CliError(f"no TrainingRun in {args.file}", BAD_INPUT)
    run = api.parse_trainingrun(body)
    environment, registry, workroot, source = inputs(args, docs, run.spec.environment)
    try:
        result = local_runs.run(
            run,
            source,
            registry=registry,
            workroot=workroot,
            environment=environment,
            resume=args.resume,
        )
    except (OSError, ValueError) as err:
        raise CliError(str(err), FAILED) from None
    if result.failure is not None:
        print(
            f"\nTrainingRun {run.name} failed after {result.seconds:.1f}s: "
            f"{local_runs.describe_failure(result.failure)}",
            file=sys.stderr,
        )
        return FAILED
    print(f"\nTrainingRun {run.name} succeeded in {result.seconds:.1f}s")
    ran = result.progress
    if ran is not None:
        metrics = ", ".join(f"{k}={v:g}" for k, v in sorted((ran.get("metrics") or {}).items()))
        shown = runs.progress_text(ran) + (f" ({metrics})" if metrics else "")
        print(f"  progress: {shown}")
    if result.archive is not None:
        print(f"  outputs and logs: {result.archive}")
    if result.model is not None:
        print(
            f"  model: {result.model.model} version {result.model.version} "
            f"({result.model.manifest['size']}, {len(result.model.manifest['files'])} files) "
            f"at {result.model.path}"
        )
    return OK


def add_run(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a TrainingRun (--local: on this machine, same rank contract as the cluster)",
        description="Run the TrainingRun in FILE. With --local it trains on this machine: "
        "one launcher per node, MASTER_ADDR 127.0.0.1, outputs archived to a local registry.",
    )
    p.add_argument("file", help="YAML with a TrainingRun (and optionally its Environment)")
    p.add_argument("--local", action="store_true", help="run on this machine, no cluster")
    p.add_argument(
        "--source",
        metavar="DIR",
        help="folder with the training code (default: the YAML file's folder); each node "
        "gets the files `submit --source` would snapshot, less --workdir and --registry",
    )
    p.add_argument(
        "--registry",
        metavar="DIR",
        help="local registry folder (default: ~/.torchyard/registry or $TORCHYARD_REGISTRY)",
    )
    p.add_argument(
        "--workdir",
        metavar="DIR",
        help="where node working folders go (default: ~/.torchyard/runs)",
    )
    p.add_argument("--name", help="which TrainingRun, when FILE holds several")
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--fresh",
        dest="resume",
        action="store_const",
        const="fresh",
        help="with spec.checkpoints: start over at step 0 (the checkpoints there are moved "
        "aside), whatever the last attempt did",
    )
    how.add_argument(
        "--resume",
        dest="resume",
        action="store_const",
        const="resume",
        help="with spec.checkpoints: resume from the newest checkpoint even when the last "
        "attempt succeeded (by default only an attempt that did not finish is resumed)",
    )
    p.set_defaults(func=cmd_run, resume="auto")
