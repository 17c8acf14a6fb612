"""``torchyard sweep submit|get|describe|best|cancel``: hyperparameter sweeps (the Sweep
resource, ~ Azure ML's HyperDrive).

Called by ``torchyard.cli.app``; over ``torchyard.sdk.sweeps`` (the HyperDrive SDK's
reading of a Sweep). Tested in tests/unit/cli/test_sweep.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from torchyard import api
from torchyard.cli import local
from torchyard.cli.errors import CliError
from torchyard.cli.inspect import age, table
from torchyard.cli.options import connect, kube_options, load_documents
from torchyard.sdk import clusters, local_runs, sweeps

TOP = 10  # the trials describe lists


def _metric(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def cmd_submit(args: argparse.Namespace) -> int:
    docs = load_documents(args.file)
    found = [d for d in docs if d.get("kind") == "Sweep"]
    if not found:
        kinds = ", ".join(sorted({str(d.get("kind")) for d in docs})) or "nothing"
        raise CliError(
            f"{args.file} is not a Sweep file: it holds {kinds}; a Sweep file has a document "
            "of kind: Sweep (docs/how-to/sweeps.md)",
            2,
        )
    if len(found) > 1:
        raise CliError(f"{args.file} holds {len(found)} Sweeps: submit one file per Sweep", 2)
    body = found[0]
    meta = body.setdefault("metadata", {})
    if args.local:
        meta["namespace"] = args.namespace or meta.get("namespace") or "default"
        return _submit_local(args, docs, body)
    meta["namespace"] = (
        args.namespace
        or meta.get("namespace")
        or clusters.default_namespace(args.kubeconfig, args.context)
    )
    if args.dry_run:
        api.parse_sweep(body)
        print(yaml.safe_dump(body, sort_keys=False), end="")
        return 0
    connect(args)
    sweeps.create(body)
    ns, name = meta["namespace"], meta.get("name")
    print(f"Sweep {ns}/{name} created: torchyard sweep describe {name} -n {ns}")
    return 0


def _submit_local(
    args: argparse.Namespace, docs: list[dict[str, Any]], body: dict[str, Any]
) -> int:
    """Run the Sweep's trials on this machine, ``--parallel`` at a time."""
    if args.parallel < 1:
        raise CliError(f"--parallel must be at least 1, got {args.parallel}", 2)
    try:
        sweep = api.parse_sweep(body)
    except api.InvalidSpec as err:
        raise CliError(str(err), 2) from None
    environment, registry, workroot, source = local.inputs(args, docs, sweep.spec.trial.environment)
    try:
        result = local_runs.sweep(
            body,
            source,
            parallel=args.parallel,
            registry=registry,
            workroot=workroot,
            environment=environment,
        )
    except (OSError, ValueError) as err:
        raise CliError(str(err), 1) from None
    verdict = result.verdict
    print(
        f"\nSweep {sweep.name} {'succeeded' if verdict.succeeded else 'failed'} in "
        f"{result.seconds:.1f}s ({verdict.reason}): {verdict.message}"
    )
    print(table(local_runs.sweep_rows(result)))
    if result.model is not None:
        print(f"model: {result.model.model} version {result.model.version} at {result.model.path}")
    return 0 if verdict.succeeded else 1


def _rows(items: list[dict[str, Any]]) -> list[list[str]]:
    rows = [["NAME", "PHASE", "DONE", "RUNNING", "STOPPED", "FAILED", "BEST", "METRIC", "AGE"]]
    for s in items:
        st = s.get("status") or {}
        counts = st.get("trials") or {}
        best = st.get("best") or {}
        rows.append(
            [
                s["metadata"]["name"],
                st.get("phase") or "Pending",
                f"{counts.get('done', 0)}/{counts.get('planned', s['spec'].get('maxTotalTrials'))}",
                str(counts.get("running", 0)),
                str(counts.get("stopped", 0)),
                str(counts.get("failed", 0)),
                best.get("name") or "-",
                _metric(best.get("metric")),
                age(s),
            ]
        )
    return rows


def cmd_get(args: argparse.Namespace) -> int:
    connect(args)
    items = [sweeps.get(args.namespace, args.name)] if args.name else sweeps.list_(args.namespace)
    if args.output == "yaml":
        print(yaml.safe_dump_all(items, sort_keys=False), end="")
    elif args.output == "json":
        print(json.dumps(items if not args.name else items[0], indent=2))
    elif not items:
        print(f"No sweeps in {args.namespace}.", file=sys.stderr)
    else:
        print(table(_rows(items)))
    return 0


def _trial_rows(trials: list[sweeps.Trial], metric: str) -> list[list[str]]:
    rows = [["TRIAL", "STATE", metric.upper(), "INTERVALS", "PARAMETERS"]]
    for t in trials:
        shown = " ".join(f"{k}={v}" for k, v in sorted(t.parameters.items()))
        rows.append([t.name, t.state, _metric(t.best), str(len(t.history)), shown])
    return rows


def cmd_describe(args: argparse.Namespace) -> int:
    """Phase, objective, counts, conditions, the best trial and the top trials."""
    connect(args)
    body, trials = sweeps.trials(args.namespace, args.name)
    spec, st = body["spec"], body.get("status") or {}
    objective = spec["objective"]
    counts = st.get("trials") or {}
    print(f"Name:         {args.name}")
    print(f"Namespace:    {args.namespace}")
    print(f"Phase:        {st.get('phase') or 'Pending'}")
    print(f"Objective:    {objective['goal']} {objective['metric']}")
    seed = st.get("seed", spec.get("seed", "-"))
    print(f"Sampling:     {spec.get('sampling', 'random')}, seed {seed}")
    early = spec.get("earlyTermination")
    policy = yaml.safe_dump(early, default_flow_style=True).strip() if early else "none"
    print(f"Policy:       {policy}")
    concurrent = spec.get("maxConcurrentTrials") or spec["maxTotalTrials"]
    print(f"Trials:       {spec['maxTotalTrials']} at most, {concurrent} at a time")
    shown = ", ".join(f"{counts[k]} {k}" for k in counts if k not in ("planned",) and counts[k])
    print(f"Counts:       {shown or 'none yet'}")
    best = st.get("best")
    if best:
        params = " ".join(f"{k}={v}" for k, v in sorted((best.get("parameters") or {}).items()))
        print(
            f"Best trial:   {best['name']} {objective['metric']} {_metric(best.get('metric'))}"
            f" at interval {best.get('interval', '-')} ({params})"
        )
    else:
        print("Best trial:   none yet")
    if spec.get("cancel"):
        print("Cancel:       requested (spec.cancel)")
    print("Conditions:")
    for c in st.get("conditions", []):
        reason, message = c.get("reason", ""), c.get("message", "")
        print(f"  {c.get('type'):15s} {c.get('status'):6s} {reason}: {message}")
    if not st.get("conditions"):
        print("  (none)")
    ranked = sweeps.ranked(trials, objective["goal"])
    print(f"Trials (best first, {min(TOP, len(ranked))} of {len(ranked)}):")
    if ranked:
        for line in table(_trial_rows(ranked[:TOP], objective["metric"])).splitlines():
            print(f"  {line}")
    else:
        print("  (none yet)")
    if st.get("trialsConfigMap"):
        print(f"Every trial:  ConfigMap {st['trialsConfigMap']}")
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    """The best trial: its TrainingRun, metric and parameters (exit 1: none yet)."""
    connect(args)
    body, trials = sweeps.trials(args.namespace, args.name)
    metric = body["spec"]["objective"]["metric"]
    ranked = sweeps.ranked(trials, body["spec"]["objective"]["goal"])
    if not ranked or ranked[0].best is None:
        raise CliError(f"Sweep {args.namespace}/{args.name}: no trial reported {metric} yet", 1)
    best = ranked[0]
    if args.output == "json":
        print(
            json.dumps(
                {"name": best.name, "metric": {metric: best.best}, "parameters": best.parameters}
            )
        )
        return 0
    print(f"{best.name}  {metric} {_metric(best.best)}  ({best.state})")
    for k, v in sorted(best.parameters.items()):
        print(f"  --{k} {v}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    connect(args)
    try:
        sweeps.cancel(args.namespace, args.name)
    except ValueError as err:
        raise CliError(str(err), 1) from None
    print(
        f"Sweep {args.namespace}/{args.name} canceling: its running trials are canceled and it "
        "ends Failed (reason Canceled) with the best trial so far"
    )
    return 0


def add_sweep(sub: Any) -> None:
    p = sub.add_parser(
        "sweep",
        help="hyperparameter sweeps (Sweep resources, ~ Azure ML HyperDrive): submit, get, "
        "describe, best, cancel",
        description="Hyperparameter sweeps: a Sweep runs its trial TrainingRun with sampled "
        "parameters, stops poor trials early and names the best (docs/how-to/sweeps.md).",
    )
    cmds = p.add_subparsers(dest="sweep_command", metavar="SWEEP_COMMAND", required=True)
    s = cmds.add_parser("submit", help="create the Sweep of a YAML file")
    s.add_argument("file", help="a YAML file with one Sweep ('-': standard input)")
    s.add_argument("--dry-run", action="store_true", help="check it and print it, create nothing")
    s.add_argument(
        "--local",
        action="store_true",
        help="run the trials on this machine (local mode), with the same sampling, early "
        "termination and best trial",
    )
    s.add_argument(
        "--parallel",
        type=int,
        default=1,
        metavar="N",
        help="--local: trials at a time (default 1)",
    )
    s.add_argument(
        "--source",
        metavar="DIR",
        help="--local: folder with the training code (default: the YAML file's folder)",
    )
    s.add_argument(
        "--registry",
        metavar="DIR",
        help="--local: local registry folder (default: ~/.torchyard/registry or "
        "$TORCHYARD_REGISTRY)",
    )
    s.add_argument(
        "--workdir",
        metavar="DIR",
        help="--local: where the trials' node folders go (default: ~/.torchyard/runs)",
    )
    kube_options(s)
    s.set_defaults(func=cmd_submit, namespace_from_file=True)
    g = cmds.add_parser("get", help="list sweeps, or one: phase, trials, best")
    g.add_argument("name", nargs="?", help="one sweep")
    g.add_argument("-o", "--output", choices=["yaml", "json"], help="output format")
    kube_options(g)
    g.set_defaults(func=cmd_get)
    d = cmds.add_parser(
        "describe", help="a sweep: phase, conditions, counts, the best trial and the top trials"
    )
    d.add_argument("name")
    kube_options(d)
    d.set_defaults(func=cmd_describe)
    b = cmds.add_parser("best", help="the best trial: its TrainingRun, metric and parameters")
    b.add_argument("name")
    b.add_argument("-o", "--output", choices=["json"], help="output format")
    kube_options(b)
    b.set_defaults(func=cmd_best)
    c = cmds.add_parser(
        "cancel", help="cancel a sweep (spec.cancel): its running trials are canceled"
    )
    c.add_argument("name")
    kube_options(c)
    c.set_defaults(func=cmd_cancel)
