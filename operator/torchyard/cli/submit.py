"""Putting resources into a cluster, and checking them first: ``torchyard submit`` (with a
source folder snapshotted; ``--dry-run`` prints what the operator would create),
``torchyard validate`` (the operator's own parsers, offline: the same checks, message and
exit code as ``run --local``, ``submit --dry-run`` and ``sweep submit`` give the same
file, ``sdk.documents``) and ``torchyard crds``.

Called by ``torchyard.cli.app``; over ``torchyard.sdk.resources`` and
``torchyard.sdk.snapshots``. Tested in tests/unit/cli/test_commands.py (dry runs, validate) and
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
from torchyard.cli.errors import BAD_INPUT, OK, CliError
from torchyard.cli.options import connect, load_documents, registry_options, service
from torchyard.sdk import clusters, documents, resources, snapshots

FIELD_MANAGER = "torchyard-cli"


def cmd_crds(args: argparse.Namespace) -> int:
    print("---\n".join(crds.render(kind) for kind in crds.KINDS), end="")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Check every document of FILE as every command that reads it does: a line for each
    valid one; the invalid ones as ``run`` and ``submit`` say them, exit 2."""
    problems = []
    for body in documents.load(args.file):
        try:
            checked = documents.check_one(body)
        except api.InvalidSpec as err:
            problems.append(str(err))
            continue
        if checked.model is None:
            version = checked.body.get("apiVersion")
            print(f"{checked.name}: skipped ({version}: not a {wire.GROUP} resource)")
        else:
            print(f"{checked.name}: valid")
    if problems:
        raise documents.Invalid(problems)
    return OK


def cmd_submit(args: argparse.Namespace) -> int:
    """Apply the file's Environments and TrainingRuns, with ``--source DIR`` snapshotted
    (a content-addressed ConfigMap, or the registry service when it is large); --dry-run
    prints what would be created, from the operator's own planner."""
    docs = load_documents(args.file)
    runs = [d for d in docs if d.get("kind") == "TrainingRun"]
    if not runs:
        raise CliError(f"no TrainingRun in {args.file}", BAD_INPUT)
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
                snapshots.store(snap, namespace, lambda: service(args), progress=True),
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
    p = sub.add_parser(
        "crds",
        help="print the CustomResourceDefinitions (kubectl apply -f -)",
        description="Print the CustomResourceDefinitions of TrainingRun, Environment, "
        "ModelVersion and Sweep, to apply with kubectl apply -f -.",
    )
    p.set_defaults(func=cmd_crds)


def add_validate(sub: Any) -> None:
    p = sub.add_parser(
        "validate",
        help="check a YAML file of torchyard resources without a cluster",
        description="Check every document of FILE as the operator parses it, offline: the "
        "kind and version of the torchyard.dev group, every field (a typo is named with the "
        "nearest field), a Sweep as its sweeps core compiles it. Documents of other groups "
        "are skipped. The same checks, messages and exit code (2) as run --local, submit "
        "--dry-run and sweep submit give the same file.",
    )
    p.add_argument("file", help="YAML file ('-' for standard input)")
    p.set_defaults(func=cmd_validate)
