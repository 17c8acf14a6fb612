"""Putting resources into a cluster, and checking them first: ``torchyard submit`` (with a
source folder snapshotted; ``--dry-run`` prints what the operator would create),
``torchyard validate`` (the operator's own parsers, offline) and ``torchyard crds``.

Called by ``torchyard.cli.app``; over ``torchyard.sdk.resources`` and
``torchyard.sdk.snapshots``. Tested in tests/unit/test_cli.py (dry runs, validate) and
tests/integration/test_cli.py (real submissions).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from torchyard import api
from torchyard.api import crds, wire
from torchyard.cli import follow
from torchyard.cli.errors import CliError
from torchyard.cli.options import connect, load_documents, registry, registry_options
from torchyard.sdk import clusters, resources, snapshots

FIELD_MANAGER = "torchyard-cli"


def cmd_crds(args: argparse.Namespace) -> int:
    print("---\n".join(crds.render(kind) for kind in crds.KINDS), end="")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Parse every TrainingRun/Environment in FILE with the same models as the operator."""
    parsers = {"TrainingRun": api.parse_trainingrun, "Environment": api.parse_environment}
    failed = 0
    for doc in load_documents(args.file):
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


def cmd_submit(args: argparse.Namespace) -> int:
    """Apply the file's Environments and TrainingRuns, with ``--source DIR`` snapshotted
    (a content-addressed ConfigMap, or the registry service when it is large); --dry-run
    prints what would be created, from the operator's own planner."""
    docs = load_documents(args.file)
    runs = [d for d in docs if d.get("kind") == "TrainingRun"]
    if not runs:
        raise CliError(f"no TrainingRun in {args.file}", 2)
    envs = {
        str((d.get("metadata") or {}).get("name")): d
        for d in docs
        if d.get("kind") == "Environment"
    }
    snap = None
    if args.source:
        snap = snapshots.snapshot(Path(args.source), include_secrets=args.include_secrets)
        where = (
            f"ConfigMap {snap.configmap_name}"
            if snap.fits_configmap
            else "the registry service (over the ~900 KiB a ConfigMap holds)"
        )
        print(f"{snap.report()} -> {where}", file=sys.stderr)
        for body in runs:
            body.setdefault("spec", {})["source"] = snap.source
    try:
        for body in runs + list(envs.values()):
            body.setdefault("metadata", {})
            body["metadata"]["namespace"] = (
                args.namespace
                or body["metadata"].get("namespace")
                or clusters.default_namespace(args.kubeconfig, args.context)
            )
            parse = (
                api.parse_trainingrun if body["kind"] == "TrainingRun" else api.parse_environment
            )
            parse(body)
        namespace = runs[0]["metadata"]["namespace"]
        if args.dry_run:
            if snap is not None and not snap.fits_configmap:
                print(f"# would upload snapshot {snap.sha256} to the registry service")
            out = resources.dry_run(runs, envs, namespace, snap)
            print(yaml.safe_dump_all(out, sort_keys=False), end="")
            return 0
        connect(args)
        if snap is not None:
            print(
                snapshots.store(snap, namespace, lambda: registry(args), progress=True),
                file=sys.stderr,
            )
        for body in list(envs.values()) + runs:
            resources.apply(body, field_manager=FIELD_MANAGER)
            meta = body["metadata"]
            print(
                f"{body['kind'].lower()}.{wire.GROUP}/{meta['name']} applied "
                f"(namespace {meta['namespace']})"
            )
    finally:
        if snap is not None:
            snap.close()
    if args.wait:
        args.namespace = namespace
        return follow.wait(args, runs[-1]["metadata"]["name"], show_output=True)
    return 0


def add_submit(sub: Any) -> None:
    p = sub.add_parser(
        "submit",
        help="submit TrainingRuns (and Environments) with the code of a folder",
        description="Apply the TrainingRuns and Environments in FILE. With --source DIR the "
        "folder is snapshotted (honouring .torchyardignore, .amlignore or .gitignore; "
        "refusing secrets such as .env files and private keys) into a content-addressed "
        "ConfigMap, or, over ~900 KiB, uploaded to the registry service; the same code "
        "submitted again creates nothing new.",
    )
    p.add_argument("file", help="YAML with TrainingRuns and Environments ('-' for stdin)")
    p.add_argument("--source", metavar="DIR", help="the folder with the training code")
    p.add_argument(
        "--include-secrets",
        action="store_true",
        help="snapshot files that look like secrets (.env, private keys) all the same",
    )
    p.add_argument(
        "--wait", action="store_true", help="then follow the run to its end (torchyard wait)"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print every manifest that would be created (snapshot ConfigMap, run, its "
        "headless Service and node Pods); change nothing",
    )
    registry_options(p)
    p.set_defaults(func=cmd_submit)


def add_crds(sub: Any) -> None:
    p = sub.add_parser("crds", help="print the CustomResourceDefinitions (kubectl apply -f -)")
    p.set_defaults(func=cmd_crds)


def add_validate(sub: Any) -> None:
    p = sub.add_parser("validate", help="check TrainingRun/Environment YAML without a cluster")
    p.add_argument("file", help="YAML file ('-' for standard input)")
    p.set_defaults(func=cmd_validate)
