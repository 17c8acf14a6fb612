"""The ``torchyard`` command line: a thin layer over the SDK and the operator.

Each subcommand is one function; argument parsing lives in :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

import torchyard
from torchyard import api


def _load_documents(path: str) -> list[dict[str, Any]]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    return [d for d in yaml.safe_load_all(text) if d]


def cmd_operator(args: argparse.Namespace) -> int:
    from torchyard import controller

    return controller.main_from_args(args)


def cmd_crds(args: argparse.Namespace) -> int:
    from torchyard.api import crds

    print("---\n".join(crds.render(kind) for kind in crds.KINDS), end="")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Parse every TrainingRun/Environment in FILE with the same models as the operator."""
    parsers = {"TrainingRun": api.parse_trainingrun, "Environment": api.parse_environment}
    failed = 0
    for doc in _load_documents(args.file):
        kind = doc.get("kind", "?")
        name = (doc.get("metadata") or {}).get("name", "?")
        parse = parsers.get(kind)
        if parse is None:
            print(f"{kind}/{name}: skipped (not a torchyard resource torchyard validates)")
            continue
        try:
            parse(doc)
        except api.InvalidSpec as err:
            failed += 1
            print(f"{kind}/{name}: invalid: {err}", file=sys.stderr)
        else:
            print(f"{kind}/{name}: valid")
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchyard",
        description="Train PyTorch models at scale on Kubernetes: Environments, distributed "
        "TrainingRuns and a model registry.",
    )
    parser.add_argument("--version", action="version", version=f"torchyard {torchyard.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("operator", help="run the operator (Kopf) against the current cluster")
    from torchyard import controller

    controller.add_arguments(p)
    p.set_defaults(func=cmd_operator)

    p = sub.add_parser("crds", help="print the CustomResourceDefinitions (kubectl apply -f -)")
    p.set_defaults(func=cmd_crds)

    p = sub.add_parser("validate", help="check TrainingRun/Environment YAML without a cluster")
    p.add_argument("file", help="YAML file ('-' for standard input)")
    p.set_defaults(func=cmd_validate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        result: int = args.func(args)
    except (OSError, yaml.YAMLError) as err:
        print(f"torchyard: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return result
