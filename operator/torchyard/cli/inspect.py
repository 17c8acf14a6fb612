"""Looking at what is there: ``torchyard get runs|envs|models`` (kubectl-style tables, or
YAML/JSON) and ``torchyard describe RUN`` (nodes, conditions, failure, model, Events; its
parser is ``cli.history``'s, which falls back to the run's record once it is gone).

Called by ``torchyard.cli.app``; over ``torchyard.sdk.resources`` and
``torchyard.sdk.runs``. Tested in tests/integration/test_cli.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from typing import Any

import yaml

from torchyard.api.times import parse_time
from torchyard.api.trainingrun_status import QUEUE_EXACT_POSITIONS as EXACT_POSITIONS
from torchyard.cli.options import connect, kube_options, output_option
from torchyard.sdk import resources, runs


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def age(obj: dict[str, Any]) -> str:
    created = parse_time(obj["metadata"].get("creationTimestamp"))
    return runs.duration((datetime.now(timezone.utc) - created).total_seconds()) if created else "?"


def _run_rows(items: list[dict[str, Any]], wide: bool) -> list[list[str]]:
    rows = [
        ["NAME", "PHASE", "QUEUE", "NODES", "READY", "PROGRESS", "ETA", "ELAPSED", "MODEL", "AGE"]
    ]
    if wide:
        rows[0] += ["ENVIRONMENT", "FAILURE"]
    for r in items:
        st = r.get("status", {})
        model = st.get("model") or {}
        row = [
            r["metadata"]["name"],
            st.get("phase", "Pending"),
            _queue(st.get("queue")),
            str(r["spec"].get("distribution", {}).get("nodeCount", 1)),
            (st.get("nodes") or {}).get("ready", "0/0"),
            runs.progress_text(st.get("progress")) or "-",
            (st.get("progress") or {}).get("eta") or "-",
            runs.duration(runs.elapsed(r)),
            f"{model['name']}:{model['version']}" if model else "-",
            age(r),
        ]
        if wide:
            fail = st.get("failure") or {}
            row += [
                r["spec"].get("environment", ""),
                (f"rank {fail.get('rank')} exit {fail.get('exitCode')}" if fail else "-"),
            ]
        rows.append(row)
    return rows


def _queue(place: Any) -> str:
    """``3 (a100)``: the place in the pool's queue of a Queued run; ``>50 (a100)`` further
    back than the exact positions the operator keeps; ``-`` otherwise."""
    if not isinstance(place, dict) or not place.get("pool"):
        return "-"
    if not place.get("position"):
        return f">{EXACT_POSITIONS} ({place['pool']})"
    return f"{place['position']} ({place.get('pool', '')})"


def _env_rows(items: list[dict[str, Any]]) -> list[list[str]]:
    rows = [["NAME", "PHASE", "IMAGE", "AGE"]]
    for e in items:
        st = e.get("status", {})
        rows.append(
            [e["metadata"]["name"], st.get("phase", "Pending"), st.get("image", "-"), age(e)]
        )
    return rows


def _model_rows(items: list[dict[str, Any]]) -> list[list[str]]:
    rows = [["NAME", "MODEL", "VERSION", "RUN", "SIZE", "AGE"]]
    for m in items:
        spec, st = m.get("spec", {}), m.get("status", {})
        rows.append(
            [
                m["metadata"]["name"],
                str(spec.get("model", "")),
                str(spec.get("version", "")),
                str((spec.get("run") or {}).get("name", "-")),
                str(st.get("size") or spec.get("size") or "-"),
                age(m),
            ]
        )
    return rows


def cmd_get(args: argparse.Namespace) -> int:
    """kubectl-style tables of runs, environments, models."""
    connect(args)
    if args.name:
        items = [resources.get(args.kind, args.namespace, args.name)]
    else:
        items = resources.list_(args.kind, args.namespace)
    if args.output in ("yaml", "json"):
        doc: Any = items[0] if args.name else {"apiVersion": "v1", "kind": "List", "items": items}
        print(json.dumps(doc, indent=2) if args.output == "json" else yaml.safe_dump(doc), end="")
        return 0
    if args.kind == "runs":
        rows = _run_rows(items, wide=args.output == "wide")
    elif args.kind == "envs":
        rows = _env_rows(items)
    else:
        rows = _model_rows(items)
    if len(rows) == 1:
        print(f"No {args.kind} found in namespace {args.namespace}.", file=sys.stderr)
        return 0
    print(table(rows))
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    """A run's spec summary, node Pods, conditions, failure, model and events."""
    connect(args)
    run = runs.get(args.namespace, args.run)
    pods = runs.node_pods(args.namespace, args.run)
    events = runs.events(run)
    spec, st = run["spec"], run.get("status", {})
    dist = spec.get("distribution", {})
    print(f"Name:         {args.run}")
    print(f"Namespace:    {args.namespace}")
    print(f"Phase:        {st.get('phase', 'Pending')}  ({runs.duration(runs.elapsed(run))})")
    print(f"Environment:  {spec.get('environment')}")
    print(f"Command:      {' '.join(spec.get('command', []))}")
    print(
        f"Distribution: {dist.get('nodeCount', 1)} node(s) x "
        f"{dist.get('processCountPerNode', 1)} process(es), launch {dist.get('launch', 'process')}"
    )
    print(f"Source:       {yaml.safe_dump(spec.get('source'), default_flow_style=True).strip()}")
    print(f"Restarts:     {runs.restarts_text(st)}")
    if st.get("lastInPlaceRestart"):
        last = st["lastInPlaceRestart"]
        print(f"  last in place, {last.get('time') or '?'}: {last.get('message', '')}")
    print("Nodes:")
    for i, pod in enumerate(pods):
        node = pod["spec"].get("nodeName") or "-"
        print(f"  node {i}  {pod['metadata']['name']:40s} {runs.pod_state(pod):20s} on {node}")
    if not pods:
        print("  (none)")
    print("Conditions:")
    for c in st.get("conditions", []):
        reason, message = c.get("reason", ""), c.get("message", "")
        print(f"  {c.get('type'):12s} {c.get('status'):6s} {reason}: {message}")
    if st.get("failure"):
        print("Failure:")
        for line in runs.failure_text(run).splitlines():
            print(f"  {line}")
    if st.get("excludedNodes"):
        print("Excluded nodes (left out of this run's next attempts):")
        for bad in st["excludedNodes"]:
            print(f"  {bad.get('node')}  {bad.get('reason')} since {bad.get('since', '-')}")
            if bad.get("evidence"):
                print(f"    {bad['evidence']}")
    if st.get("model"):
        print(f"Model:        {st['model'].get('name')} version {st['model'].get('version')}")
    print("Events:")
    for e in events[-20:]:
        print(f"  {e.get('type', ''):8s} {e.get('reason', ''):20s} {e.get('message', '')}")
    if not events:
        print("  (none)")
    return 0


def add_get(sub: Any) -> None:
    p = sub.add_parser(
        "get",
        help="list runs, envs or models (kubectl get style)",
        description="TrainingRuns, Environments or ModelVersions of the namespace in the "
        "cluster, as kubectl get shows them (for local runs: torchyard runs list --local, "
        "torchyard models list --local).",
    )
    p.add_argument("kind", choices=["runs", "envs", "models"], help="what to list")
    p.add_argument("name", nargs="?", help="one of them")
    output_option(p)
    kube_options(p)
    p.set_defaults(func=cmd_get)
