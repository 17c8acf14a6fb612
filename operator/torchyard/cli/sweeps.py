"""``torchyard sweep submit|get|describe|best|cancel``: hyperparameter sweeps (the Sweep
resource, ~ Azure ML's HyperDrive); ``get``, ``describe`` and ``best`` read the sweeps
local mode ran with ``--local`` (or without any kubeconfig), from their records.

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
from torchyard.cli.errors import BAD_INPUT, FAILED, OK, CliError
from torchyard.cli.inspect import age, table
from torchyard.cli.options import (
    connect,
    kube_options,
    load_documents,
    local_options,
    local_registry,
    local_registry_option,
    output_option,
    reads_local,
)
from torchyard.sdk import clusters, local_runs
from torchyard.sdk import sweeps as sweep_sdk

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
            BAD_INPUT,
        )
    if len(found) > 1:
        raise CliError(
            f"{args.file} holds {len(found)} Sweeps: submit one file per Sweep", BAD_INPUT
        )
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
        print(yaml.safe_dump(body, sort_keys=False), end="")
        return OK
    connect(args)
    sweep_sdk.create(body)
    ns, name = meta["namespace"], meta.get("name")
    print(f"Sweep {ns}/{name} created: torchyard sweep describe {name} -n {ns}")
    return OK


def _submit_local(
    args: argparse.Namespace, docs: list[dict[str, Any]], body: dict[str, Any]
) -> int:
    """Run the Sweep's trials on this machine, ``--parallel`` at a time."""
    if args.parallel < 1:
        raise CliError(f"--parallel must be at least 1, got {args.parallel}", BAD_INPUT)
    sweep = api.parse_sweep(body)
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
        raise CliError(str(err), FAILED) from None
    verdict = result.verdict
    print(
        f"\nSweep {sweep.name} {'succeeded' if verdict.succeeded else 'failed'} in "
        f"{result.seconds:.1f}s ({verdict.reason}): {verdict.message}"
    )
    print(table(local_runs.sweep_rows(result)))
    if result.model is not None:
        print(f"model: {result.model.model} version {result.model.version} at {result.model.path}")
    return OK if verdict.succeeded else FAILED


def _rows(items: list[dict[str, Any]], wide: bool = False) -> list[list[str]]:
    rows = [["NAME", "PHASE", "DONE", "RUNNING", "STOPPED", "FAILED", "BEST", "METRIC", "AGE"]]
    if wide:
        rows[0] += ["OBJECTIVE", "MODEL"]
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
        if wide:
            objective = s["spec"].get("objective") or {}
            model = st.get("model") or {}
            rows[-1] += [
                f"{objective.get('goal', '?')} {objective.get('metric', '?')}",
                f"{model['name']}:{model['version']}" if model else "-",
            ]
    return rows


def _sweep(args: argparse.Namespace) -> tuple[dict[str, Any], list[sweep_sdk.Trial]]:
    """The sweep ``args.name`` and its trials: in the cluster, or a local one's record."""
    if reads_local(args):
        body = sweep_sdk.recorded_one(local_registry(args), args.namespace, args.name)
        return body, sweep_sdk.trials_of(body, None)
    connect(args)
    return sweep_sdk.trials(args.namespace, args.name)


def cmd_get(args: argparse.Namespace) -> int:
    if reads_local(args):
        source = local_registry(args)
        items = (
            [sweep_sdk.recorded_one(source, args.namespace, args.name)]
            if args.name
            else sweep_sdk.recorded(source, args.namespace)
        )
    else:
        connect(args)
        items = (
            [sweep_sdk.get(args.namespace, args.name)]
            if args.name
            else sweep_sdk.list_(args.namespace)
        )
    if args.output == "yaml":
        print(yaml.safe_dump_all(items, sort_keys=False), end="")
    elif args.output == "json":
        print(json.dumps(items if not args.name else items[0], indent=2))
    elif not items:
        print(f"No sweeps in {args.namespace}.", file=sys.stderr)
    else:
        print(table(_rows(items, wide=args.output == "wide")))
    return OK


def _trial_rows(trials: list[sweep_sdk.Trial], metric: str) -> list[list[str]]:
    rows = [["TRIAL", "STATE", metric.upper(), "INTERVALS", "PARAMETERS"]]
    for t in trials:
        shown = " ".join(f"{k}={v}" for k, v in sorted(t.parameters.items()))
        rows.append([t.name, t.state, _metric(t.best), str(len(t.history)), shown])
    return rows


def cmd_describe(args: argparse.Namespace) -> int:
    """Phase, objective, counts, conditions, the best trial and the top trials."""
    body, trials = _sweep(args)
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
            f"Best trial:   {sweep_sdk.best_name(best)} {objective['metric']} "
            f"{_metric(best.get('metric'))} at interval {best.get('interval', '-')} ({params})"
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
    ranked = sweep_sdk.ranked(trials, objective["goal"])
    print(f"Trials (best first, {min(TOP, len(ranked))} of {len(ranked)}):")
    if ranked:
        for line in table(_trial_rows(ranked[:TOP], objective["metric"])).splitlines():
            print(f"  {line}")
    else:
        print("  (none yet)")
    if st.get("trialsConfigMap"):
        print(f"Every trial:  ConfigMap {st['trialsConfigMap']}")
    if st.get("model"):
        print(f"Model:        {st['model'].get('name')} version {st['model'].get('version')}")
    return OK


def cmd_best(args: argparse.Namespace) -> int:
    """The best trial (``sweep_sdk.best``, the rule of the summary and the SDK): its
    TrainingRun, state, metric and parameters (exit 1: none yet)."""
    body, trials = _sweep(args)
    metric = body["spec"]["objective"]["metric"]
    best = sweep_sdk.best(body, trials, not args.exclude_failed, not args.exclude_canceled)
    if best is None:
        raise CliError(
            f"Sweep {args.namespace}/{args.name}: no trial reported {metric} yet", FAILED
        )
    if args.output == "json":
        shown = {"name": best.name, "state": best.state, "metric": {metric: best.best}}
        print(json.dumps({**shown, "parameters": best.parameters}))
        return OK
    print(f"{best.name}  {metric} {_metric(best.best)}  ({best.state})")
    for k, v in sorted(best.parameters.items()):
        print(f"  --{k} {v}")
    model = (body.get("status") or {}).get("model")
    if model:
        print(f"  model: {model.get('name')} version {model.get('version')} (registerBest)")
    return OK


def cmd_cancel(args: argparse.Namespace) -> int:
    connect(args)
    try:
        sweep_sdk.cancel(args.namespace, args.name)
    except ValueError as err:
        raise CliError(str(err), FAILED) from None
    print(
        f"Sweep {args.namespace}/{args.name} canceling: its running trials are canceled and it "
        "ends Failed (reason Canceled) with the best trial so far"
    )
    return OK


def add_sweep(sub: Any) -> None:
    p = sub.add_parser(
        "sweep",
        help="hyperparameter sweeps (Sweep resources, ~ Azure ML HyperDrive): submit, get, "
        "describe, best, cancel",
        description="Hyperparameter sweeps: a Sweep runs its trial TrainingRun with sampled "
        "parameters, stops poor trials early and names the best (docs/how-to/sweeps.md).",
    )
    cmds = p.add_subparsers(dest="sweep_command", metavar="SWEEP_COMMAND", required=True)
    _add_submit(cmds)
    _add_reads(cmds)
    _add_cancel(cmds)


def _add_submit(cmds: Any) -> None:
    s = cmds.add_parser(
        "submit",
        help="create the Sweep of a YAML file (--local: run its trials on this machine)",
        description="Create the Sweep of FILE in the cluster, checked first as validate "
        "checks it; --dry-run only checks and prints it; --local runs its trials here.",
    )
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
    local_registry_option(s)
    s.add_argument(
        "--workdir",
        metavar="DIR",
        help="--local: where the trials' node folders go (default: ~/.torchyard/runs)",
    )
    kube_options(s)
    s.set_defaults(func=cmd_submit, namespace_from_file=True)


def _add_reads(cmds: Any) -> None:
    """get, describe and best: read a sweep of the cluster or of local mode."""
    g = cmds.add_parser(
        "get",
        help="list sweeps, or one: phase, trials, best",
        description="The sweeps of the namespace (or one): phase, trial counts, the best "
        "trial; --local: those local mode ran.",
    )
    g.add_argument("name", nargs="?", help="one sweep")
    output_option(g)
    local_options(g)
    kube_options(g)
    g.set_defaults(func=cmd_get)
    d = cmds.add_parser(
        "describe",
        help="a sweep: phase, conditions, counts, the best trial and the top trials",
        description="A sweep: its phase, objective, policy, conditions, counts, the best "
        "trial and the top trials; --local: one local mode ran.",
    )
    d.add_argument("name", help="the sweep's name")
    local_options(d)
    kube_options(d)
    d.set_defaults(func=cmd_describe)
    b = cmds.add_parser(
        "best",
        help="the best trial (any state, as HyperDrive's get_best_run_by_primary_metric): "
        "its TrainingRun, state, metric and parameters",
        description="The best trial of a sweep, in any state unless left out (as HyperDrive's "
        "get_best_run_by_primary_metric): its TrainingRun, state, metric and parameters (exit "
        "1 while no trial reported the metric); --local: of one local mode ran.",
    )
    b.add_argument("name", help="the sweep's name")
    b.add_argument("--exclude-failed", action="store_true", help="leave out the trials that failed")
    b.add_argument(
        "--exclude-canceled",
        action="store_true",
        help="leave out the trials stopped by the policy and those canceled",
    )
    output_option(b, "json")
    local_options(b)
    kube_options(b)
    b.set_defaults(func=cmd_best)


def _add_cancel(cmds: Any) -> None:
    c = cmds.add_parser(
        "cancel",
        help="cancel a sweep (spec.cancel): its running trials are canceled",
        description="Cancel a sweep in the cluster (spec.cancel): its running trials are "
        "canceled and it ends Failed, reason Canceled, with the best trial so far.",
    )
    c.add_argument("name", help="the sweep's name")
    kube_options(c)
    c.set_defaults(func=cmd_cancel)
