"""The model registry from a laptop: ``torchyard models list|show|download|verify`` and
``torchyard runs download`` (an archived run file), over ``torchyard.sdk.RegistryClient``,
or with ``--local`` (or without any kubeconfig) over the local registry of ``torchyard
run --local`` (``sdk.local_registry``).

Called by ``torchyard.cli.app``; tested in tests/integration/test_models_cli.py and
test_registry_tls.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from torchyard.cli import history
from torchyard.cli.errors import BAD_INPUT, FAILED, OK, CliError
from torchyard.cli.inspect import table
from torchyard.cli.options import local_options, output_option, registry, registry_options


def model_ref(ref: str) -> tuple[str, int | None]:
    """NAME[:VERSION] as (name, version or None for the latest)."""
    name, _, version = ref.partition(":")
    if version and not version.isdigit():
        raise CliError(f"{ref!r}: the version after ':' is a number", BAD_INPUT)
    return name, int(version) if version else None


def cmd_models(args: argparse.Namespace) -> int:
    client = registry(args)
    if args.models_command == "list":
        models = client.models(args.namespace)
        if args.output in ("json", "yaml"):
            doc = {"models": dict(sorted(models.items()))}
            print(
                (
                    json.dumps(doc, indent=2) if args.output == "json" else yaml.safe_dump(doc)
                ).rstrip()
            )
            return OK
        rows = [["MODEL", "VERSIONS", "LATEST"]]
        if args.output == "wide":
            rows[0].append("ALL")
        for name, versions in sorted(models.items()):
            row = [name, str(len(versions)), str(versions[-1]) if versions else "-"]
            rows.append(row + ([",".join(map(str, versions))] if args.output == "wide" else []))
        if len(rows) == 1:
            print(f"No models in namespace {args.namespace}.", file=sys.stderr)
            return OK
        print(table(rows))
        return OK
    name, version = model_ref(args.model)
    if args.models_command == "show":
        m = client.manifest(args.namespace, name, version)
        print(
            f"{m['model']} version {m['version']}  ({m.get('size', '')}, created "
            f"{m.get('created', '?')})"
        )
        run = m.get("run") or {}
        print(f"  run:   {run.get('name', '?')} (uid {run.get('uid') or '?'})")
        if m.get("environmentImage"):
            print(f"  image: {m['environmentImage']}")
        for key, value in sorted((m.get("metrics") or {}).items()):
            print(f"  metric {key} = {value}")
        for f in m["files"]:
            print(f"  {f['sha256'][:16]}  {f['size']:>12d}  {f['path']}")
        return OK
    if args.models_command == "download":
        dest = Path(args.output)
        m = client.download(args.namespace, name, version, dest)
        print(
            f"downloaded {m['model']} version {m['version']}: {len(m['files'])} file(s), "
            f"sha256 verified, into {dest}"
        )
        return OK
    m, bad = client.verify(args.namespace, name, version)
    if bad:
        print(
            f"{m['model']} version {m['version']}: {len(bad)} file(s) do not match "
            f"the manifest: {', '.join(bad)}",
            file=sys.stderr,
        )
        return FAILED
    print(f"{m['model']} version {m['version']}: all {len(m['files'])} file(s) match their sha256")
    return OK


def cmd_runs_download(args: argparse.Namespace) -> int:
    dest = Path(args.output or Path(args.path).name)
    registry(args).download_run_file(args.namespace, args.run, args.path, dest)
    print(f"downloaded {args.run}/{args.path} to {dest}")
    return OK


def add_models(sub: Any) -> None:
    p = sub.add_parser(
        "models",
        help="registered models: list, show, download, verify",
        description="The models registered in the namespace's registry (--local: in the "
        "local registry of torchyard run --local, also read without any kubeconfig).",
    )
    models = p.add_subparsers(dest="models_command", metavar="COMMAND", required=True)
    p = models.add_parser(
        "list", help="models and their versions", description="Models and their versions."
    )
    output_option(p)
    local_options(p)
    registry_options(p)
    p.set_defaults(func=cmd_models)
    for name, text in (
        ("show", "a version's files, sha256, run and metrics"),
        ("verify", "check every file of a version against its sha256"),
        ("download", "download a version, verifying sha256"),
    ):
        p = models.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        p.add_argument("model", metavar="NAME[:VERSION]", help="model (default: latest)")
        if name == "download":
            p.add_argument("-o", "--output", required=True, help="folder to download into")
        local_options(p)
        registry_options(p)
        p.set_defaults(func=cmd_models)


def add_runs(sub: Any) -> None:
    p = sub.add_parser(
        "runs",
        help="run history (live runs and records) and archived files",
        description="Run history (live TrainingRuns beside the records of those that are "
        "gone, or local runs with --local) and the files runs archived.",
    )
    runs = p.add_subparsers(dest="runs_command", metavar="COMMAND", required=True)
    history.add_commands(runs)
    p = runs.add_parser(
        "download",
        help="download an archived file (~ run.download_file)",
        description="Download a file a run archived: outputs/... (node 0's ./outputs) or "
        "logs/node-N/... (every node's ./logs); --local: a local run's.",
    )
    p.add_argument("run", help="the TrainingRun's name")
    p.add_argument("path", help="outputs/... or logs/node-N/...")
    p.add_argument("-o", "--output", help="where to write it (default: its file name)")
    local_options(p)
    registry_options(p)
    p.set_defaults(func=cmd_runs_download)
