"""Deployed models from the shell: ``torchyard endpoints list|describe|invoke|logs``, over
``torchyard.sdk.endpoints``.

``invoke`` sends a body (``--data`` or ``--file``) to the guide's ``/score`` or the Open
Inference Protocol's routes (``--v1``/``--v2``), through the apiserver's service proxy
(``--direct`` from inside the cluster) with a token minted for the endpoint (a public one
gets none), and prints the answer; a refusal ends with exit code 1. Called by
``torchyard.cli.app``; tested in tests/unit/cli/test_endpoints.py and on the real node.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from torchyard.cli.errors import CliError
from torchyard.cli.options import connect, kube_options
from torchyard.sdk import endpoints as sdk_endpoints


def _row(body: dict[str, Any]) -> list[str]:
    st = body.get("status") or {}
    model = st.get("model") or {}
    return [
        str(body["metadata"]["name"]),
        str(st.get("phase") or "Pending"),
        str(model.get("name") or "-"),
        str(model.get("version") or "-"),
        f"{st.get('readyReplicas', 0)}/{st.get('replicas', 0)}",
        str(st.get("scoringUri") or "-"),
    ]


def _table(rows: list[list[str]], head: list[str]) -> None:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def cmd_list(args: argparse.Namespace) -> int:
    connect(args)
    rows = [_row(e) for e in sdk_endpoints.list_endpoints(args.namespace)]
    _table(rows, ["NAME", "PHASE", "MODEL", "VERSION", "READY", "URI"])
    return 0


def describe_lines(body: dict[str, Any], pods: list[dict[str, Any]]) -> list[str]:
    """What ``describe`` prints of an endpoint and its serving Pods."""
    st = body.get("status") or {}
    spec = body.get("spec") or {}
    name, phase, model, version, ready, uri = _row(body)
    lines = [
        f"OnlineEndpoint {body['metadata']['namespace']}/{name}: {phase}",
        f"  model:    {model} version {version} ({json.dumps(spec.get('model'))})",
        f"  serving:  {ready} Pods ready, {uri}",
        f"  access:   {'public' if spec.get('public') else 'a token that may get it'}",
    ]
    if st.get("message"):
        lines.append(f"  message:  {st['message']}")
    for v in st.get("versions") or []:
        lines.append(
            f"  version {v['version']}: {v['percent']}% of requests, Deployment "
            f"{v['deployment']}, {v.get('readyReplicas', 0)}/{v.get('replicas', 0)} ready"
        )
    failure = st.get("failure")
    if failure:
        lines.append(
            f"  failure:  {failure.get('class')} ({failure.get('reason')}) in Pod "
            f"{failure.get('pod')}, {failure.get('restarts', 0)} restart(s)"
        )
        if failure.get("advice"):
            lines.append(f"  advice:   {failure['advice']}")
        lines += [f"    {line}" for line in str(failure.get("message") or "").splitlines()]
    for c in st.get("conditions") or []:
        lines.append(
            f"  condition {c['type']}={c['status']} ({c.get('reason')}): {c.get('message')}"
        )
    for pod in pods:
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        ready_pod = all(s.get("ready") for s in statuses) and bool(statuses)
        restarts = sum(int(s.get("restartCount") or 0) for s in statuses)
        lines.append(
            f"  Pod {pod['metadata']['name']}: {(pod.get('status') or {}).get('phase')}, "
            f"{'ready' if ready_pod else 'not ready'}, {restarts} restart(s)"
        )
    return lines


def cmd_describe(args: argparse.Namespace) -> int:
    connect(args)
    body = _get(args)
    print("\n".join(describe_lines(body, sdk_endpoints.pods(args.namespace, args.name))))
    return 0


def _get(args: argparse.Namespace) -> dict[str, Any]:
    return sdk_endpoints.get(args.namespace, args.name)


def cmd_invoke(args: argparse.Namespace) -> int:
    connect(args)
    body = _get(args)
    if (args.data is None) == (args.file is None):
        raise CliError("give the request body with --data TEXT or --file FILE (not both)", 2)
    data = args.data.encode() if args.data is not None else Path(args.file).read_bytes()
    protocol = "v1" if args.v1 else "v2" if args.v2 else "score"
    answer = sdk_endpoints.invoke(
        args.namespace,
        args.name,
        data,
        route=sdk_endpoints.route(body, protocol),
        content_type=args.content_type,
        service_account=args.service_account,
        direct=True if args.direct else None,
    )
    text = answer.body.decode("utf-8", "replace")
    if answer.status != 200:
        raise CliError(f"endpoint {args.name} answered {answer.status}: {text}", 1)
    print(text)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    connect(args)
    _get(args)
    for pod, lines in sdk_endpoints.logs(args.namespace, args.name, args.tail).items():
        print(f"== {pod} ==")
        for line in lines:
            print(line)
    return 0


def add_endpoints(sub: Any) -> None:
    p = sub.add_parser(
        "endpoints", help="deployed models (OnlineEndpoints): list, describe, invoke, logs"
    )
    cmds = p.add_subparsers(dest="endpoints_command", metavar="COMMAND", required=True)
    p = cmds.add_parser("list", help="the namespace's endpoints, their phase and model")
    kube_options(p)
    p.set_defaults(func=cmd_list)
    p = cmds.add_parser("describe", help="an endpoint's versions, failure, conditions and Pods")
    p.add_argument("name", help="the OnlineEndpoint")
    kube_options(p)
    p.set_defaults(func=cmd_describe)
    p = cmds.add_parser("invoke", help="send a request, print the answer (~ service.run)")
    p.add_argument("name", help="the OnlineEndpoint to call")
    p.add_argument("--data", help="the request body, e.g. '{\"data\": [[...]]}'")
    p.add_argument("--file", help="a file holding the request body")
    route = p.add_mutually_exclusive_group()
    route.add_argument("--v1", action="store_true", help="POST /v1/models/<model>:predict")
    route.add_argument("--v2", action="store_true", help="POST /v2/models/<model>/infer")
    p.add_argument("--content-type", default="application/json", help="the body's type")
    p.add_argument(
        "--service-account",
        default="default",
        metavar="NAME",
        help="the ServiceAccount whose 10-minute token for the endpoint is minted (it needs "
        "get on the endpoint; you need create on its serviceaccounts/token)",
    )
    p.add_argument(
        "--direct",
        action="store_true",
        help="call the Service itself (from inside the cluster) instead of going through the "
        "apiserver's service proxy",
    )
    kube_options(p)
    p.set_defaults(func=cmd_invoke)
    p = cmds.add_parser("logs", help="the serving Pods' logs (the run before a restart too)")
    p.add_argument("name", help="the OnlineEndpoint whose Pods to read")
    p.add_argument("--tail", type=int, default=200, help="lines per Pod (default 200)")
    kube_options(p)
    p.set_defaults(func=cmd_logs)
