"""Run history from a laptop: ``torchyard runs list [--all]`` (live TrainingRuns, and with
``--all`` the records of those that are gone, marked ``deleted``), ``torchyard runs
describe NAME`` and the record behind ``torchyard describe`` once a TrainingRun is gone.

Records are read through ``torchyard.sdk.records`` from the registry service (the same
options and the same authorization as ``torchyard models``), or with ``--local`` (or
without any kubeconfig) from the local registry folder of ``torchyard run --local``,
whose runs are listed as ``finished``. Called by ``torchyard.cli.app`` (and
``cli.models.add_runs``, ``cli.inspect.cmd_describe``); tested in
tests/unit/cli/test_history.py and tests/integration/test_run_records.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from torchyard.cli.errors import OK
from torchyard.cli.inspect import cmd_describe, table
from torchyard.cli.options import (
    connect,
    local_options,
    output_option,
    phase,
    reads_local,
    registry,
    registry_options,
)
from torchyard.sdk import clusters, records, resources, runs
from torchyard.sdk.records import Row
from torchyard.sdk.registry import RegistryError

TAIL_SHOWN = 20  # lines of each node's log tail that describe shows


def source(args: argparse.Namespace) -> Any:
    """Where records are read: the local registry folder, or the registry service."""
    if getattr(args, "local", False):
        return records.local(Path(args.registry).expanduser() if args.registry else None)
    return registry(args)


def _state(row: Row, local: bool) -> str:
    if local:
        return "finished"  # a local run's record: it ended (the FAILURE says how)
    if row.deleted:
        return "deleted"
    return "live, recorded" if row.recorded else "live"


def _rows_table(rows: list[Row], local: bool, wide: bool) -> str:
    head = ["NAME", "PHASE", "FAILURE", "MODEL", "CREATED", "FINISHED", "STATE", "UID"]
    if wide:
        head += ["EXPERIMENT"]
    body = [
        [
            r.name,
            r.phase,
            r.failure or "-",
            r.model or "-",
            r.created or "-",
            r.finished or "-",
            _state(r, local),
            r.uid if wide else r.uid[:8],
            *([r.experiment or "-"] if wide else []),
        ]
        for r in rows
    ]
    return table([head, *body])


def cmd_runs_list(args: argparse.Namespace) -> int:
    """Live runs (and with --all, the records of those that are gone), newest first."""
    reads_local(args)
    live: list[dict[str, Any]] = []
    if not args.local:
        connect(args)
        live = resources.list_("runs", args.namespace)
    if args.all or args.local:
        query = records.Query.of(
            "TrainingRun",
            phase=args.phase,
            experiment=args.experiment,
            label_selector=args.selector,
            since=args.since,
            limit=args.limit,
            continue_token=args.continue_token,
        )
        rows, token = records.history(source(args), args.namespace, live, query)
    else:
        rows, token = records.merged(live, records.Page()), None
    if args.output in ("json", "yaml"):
        doc = {"items": [r.__dict__ for r in rows], "continue": token}
        shown = json.dumps(doc, indent=2) if args.output == "json" else yaml.safe_dump(doc)
        print(shown.rstrip())
        return OK
    if not rows:
        print(f"No runs found in namespace {args.namespace}.", file=sys.stderr)
        return OK
    print(_rows_table(rows, args.local, args.output == "wide"))
    if token:
        print(f"(more: --continue {token})", file=sys.stderr)
    return OK


def describe_record(record: dict[str, Any], local: bool = False) -> None:
    """A record, as ``torchyard describe`` shows a run (``local``: a local run's)."""
    run = records.as_run(record)  # type: ignore[arg-type]
    spec, st = run["spec"], run["status"]
    dist = spec.get("distribution") or {}
    gone = "deleted before it ended" if record.get("deleted") else "its TrainingRun is gone"
    if local:
        gone = "a local run"
    print(f"Name:         {record.get('name')}   (from its record: {gone})")
    print(f"Namespace:    {record.get('namespace')}")
    print(f"UID:          {record.get('uid')}")
    print(f"Phase:        {record.get('phase')}")
    print(
        f"Created:      {record.get('created') or '-'}   Finished: {record.get('finished') or '-'}"
    )
    print(f"Environment:  {spec.get('environment')}")
    print(f"Command:      {' '.join(spec.get('command') or [])}")
    print(
        f"Distribution: {dist.get('nodeCount', 1)} node(s) x "
        f"{dist.get('processCountPerNode', 1)} process(es)"
    )
    print("Nodes:")
    for n in record.get("nodes") or []:
        print(
            f"  node {n.get('node')}  {n.get('pod', ''):40s} {n.get('phase', ''):10s} "
            f"exit {n.get('exitCode', '-')} on {n.get('nodeName') or '-'} "
            f"({n.get('started') or '?'} .. {n.get('finished') or '?'})"
        )
    print("Attempts:")
    for a in record.get("attempts") or []:
        first = next(iter((a.get("message") or "").splitlines()), "")
        print(
            f"  {a.get('attempt')}  {a.get('outcome', ''):10s} {a.get('started') or '?'} .. "
            f"{a.get('ended') or '?'}" + (f"  {first}" if first else "")
        )
    if st.get("failure"):
        print("Failure:")
        for line in runs.failure_text(run).splitlines():
            print(f"  {line}")
        failure = st["failure"]
        if failure.get("class"):
            print(f"  class: {failure['class']} (retryable: {failure.get('retryable')})")
        if failure.get("advice"):
            print(f"  advice: {failure['advice']}")
    for bad in record.get("excludedNodes") or []:
        print(f"Excluded node: {bad.get('node')}  {bad.get('reason')}: {bad.get('evidence', '')}")
    if record.get("model"):
        print(f"Model:        {record['model']['name']} version {record['model']['version']}")
    for key, value in sorted((record.get("metrics") or {}).items()):
        print(f"Metric:       {key} = {value}")
    for node, lines in sorted((record.get("logTails") or {}).items(), key=lambda kv: int(kv[0])):
        print(f"Log tail of node {node}:")
        for line in lines[-TAIL_SHOWN:]:
            print(f"  {line}")
    print("Events:")
    for e in (record.get("events") or [])[-20:]:
        print(f"  {e.get('type', ''):8s} {e.get('reason', ''):20s} {e.get('message', '')}")
    if not record.get("events"):
        print("  (none)")


def show_record(args: argparse.Namespace, name: str, uid: str | None = None) -> int:
    """The record of run ``name`` (RunNotFound when there is none either)."""
    found = source(args).get_record(args.namespace, name, uid)
    if found is None:
        which = f" (uid {uid})" if uid else ""
        raise runs.RunNotFound(
            f"TrainingRun {args.namespace}/{name}{which} not found, and the registry holds "
            "no record of it"
        )
    if getattr(args, "output", None) in ("yaml", "json"):
        dump = json.dumps(found, indent=2) if args.output == "json" else yaml.safe_dump(found)
        print(dump.rstrip())
        return OK
    describe_record(dict(found), bool(getattr(args, "local", False)))
    return OK


def cmd_runs_describe(args: argparse.Namespace) -> int:
    """A live run as ``torchyard describe`` shows it; its record once it is gone (or with
    --uid, or --local)."""
    if reads_local(args) or args.uid or args.output:
        return show_record(args, args.run, args.uid)
    return describe_or_record(args)


def describe_or_record(args: argparse.Namespace) -> int:
    """``torchyard describe RUN``: the live run, else its record in the registry; a local
    run's record with --local (or without any kubeconfig)."""
    if reads_local(args):
        return show_record(args, args.run)
    try:
        return cmd_describe(args)
    except runs.RunNotFound as gone:
        try:
            return show_record(args, args.run)
        except (RegistryError, clusters.ApiError, clusters.Unreachable) as err:
            why = err.message if isinstance(err, clusters.ApiError) else str(err)
            raise runs.RunNotFound(
                f"{gone}, and its record could not be read from the registry: {why}"
            ) from None


def _filters(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--phase",
        type=phase,
        help="only runs in this phase, any case (succeeded, Failed, running ...)",
    )
    p.add_argument(
        "--experiment",
        help="only the runs of this experiment (its label; a sweep's trials are in its "
        "experiment, else in one named after the sweep)",
    )
    p.add_argument("-l", "--selector", help="label selector, e.g. team=vision,stage!=test")
    p.add_argument(
        "--since", metavar="TIME", help="only runs created since, e.g. 2026-03-01T00:00:00Z"
    )
    p.add_argument("--limit", type=int, default=50, help="records per page (1 to 500, default 50)")
    p.add_argument("--continue", dest="continue_token", metavar="TOKEN", help="the next page")


def add_commands(runs_sub: Any) -> None:
    """``runs list`` and ``runs describe`` (``cli.models.add_runs`` makes ``runs``)."""
    p = runs_sub.add_parser(
        "list",
        help="runs of the namespace; --all adds the records of deleted ones",
        description="The TrainingRuns of the namespace, newest first; with --all also the "
        "records of those that are gone; with --local (or without any kubeconfig) the "
        "records of local runs (torchyard run --local), interrupted ones included.",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="also the runs whose TrainingRun is gone (deleted, or collected by its TTL), "
        "from their records in the registry",
    )
    output_option(p)
    _filters(p)
    local_options(p)
    registry_options(p)
    p.set_defaults(func=cmd_runs_list)
    p = runs_sub.add_parser(
        "describe",
        help="a run, or its record once its TrainingRun is gone",
        description="A TrainingRun as torchyard describe shows it; its record (spec, final "
        "status, nodes, attempts, failure, metrics, log tails, Events) once it is gone, with "
        "--uid, or with --local (a local run's).",
    )
    p.add_argument("run", help="the TrainingRun's name")
    p.add_argument("--uid", help="the record of this uid (a name used again keeps both)")
    output_option(p, "yaml", "json")
    local_options(p)
    registry_options(p)
    p.set_defaults(func=cmd_runs_describe)


def add_describe(sub: Any) -> None:
    p = sub.add_parser(
        "describe",
        help="a run: nodes, conditions, failure, model and events (its record once the "
        "TrainingRun is gone; --local: a local run's)",
        description="A TrainingRun: its spec in short, its node Pods, conditions, failure "
        "(which rank, why, the traceback), model and Events; once the TrainingRun is gone, "
        "its record in the registry. With --local (or without any kubeconfig), a local "
        "run's record: nodes with their times, attempts, failure, metrics, log tails.",
    )
    p.add_argument("run", help="the TrainingRun's name")
    local_options(p)
    registry_options(p)
    p.set_defaults(func=describe_or_record, uid=None, output=None)
