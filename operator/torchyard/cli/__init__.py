"""The ``torchyard`` command line: a thin layer over the SDK and the operator.

Each subcommand is one function; argument parsing lives in :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

import torchyard
from torchyard import api
from torchyard.controller import options
from torchyard.planning.pods import REGISTRY_AUDIENCE as AUDIENCE
from torchyard.registry import store
from torchyard.sdk.registry import DEFAULT_SERVICE

if TYPE_CHECKING:
    from torchyard.registry.service import RunIdentity


def _load_documents(path: str) -> list[dict[str, Any]]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    return [d for d in yaml.safe_load_all(text) if d]


def cmd_operator(args: argparse.Namespace) -> int:
    from torchyard.controller import operators

    return operators.main_from_args(args)


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


def _pick(docs: list[dict[str, Any]], kind: str, name: str | None) -> dict[str, Any] | None:
    found = [d for d in docs if d.get("kind") == kind]
    if name is not None:
        found = [d for d in found if (d.get("metadata") or {}).get("name") == name]
    if len(found) > 1:
        names = ", ".join((d.get("metadata") or {}).get("name", "?") for d in found)
        raise SystemExit(f"torchyard: error: several {kind}s ({names}): pick one with --name")
    return found[0] if found else None


def cmd_run(args: argparse.Namespace) -> int:
    """Run a TrainingRun; today on this machine (--local)."""
    if not args.local:
        print(
            "torchyard: error: `torchyard run` needs --local (run on this machine); to run on "
            "a cluster, `kubectl apply -f` the file with the operator installed",
            file=sys.stderr,
        )
        return 2
    from torchyard import local

    docs = _load_documents(args.file)
    body = _pick(docs, "TrainingRun", args.name)
    if body is None:
        print(f"torchyard: error: no TrainingRun in {args.file}", file=sys.stderr)
        return 2
    try:
        run = api.parse_trainingrun(body)
        env_body = _pick(docs, "Environment", run.spec.environment)
        environment = api.parse_environment(env_body) if env_body else None
    except api.InvalidSpec as err:
        print(f"torchyard: error: invalid resource: {err}", file=sys.stderr)
        return 2
    from torchyard.sdk import snapshots

    source = Path(args.source) if args.source else Path(args.file).resolve().parent
    registry = Path(args.registry).expanduser() if args.registry else local.default_registry()
    workroot = Path(args.workdir).expanduser() if args.workdir else local.default_workroot()
    # The files `submit` would snapshot, less the runs folder and the registry when they
    # lie inside the source (else every run copies the ones before). Secrets stay: the
    # copies stay on this machine.
    try:
        files, ignore_file, skipped = snapshots.collect(
            source, include_secrets=True, exclude=[workroot, registry]
        )
    except snapshots.SnapshotError as err:
        print(f"torchyard: error: {err}", file=sys.stderr)
        return 2
    left_out = [f"{rel}/" for rel in snapshots.excluded_inside(source, [workroot, registry])]
    print(
        f"[torchyard] source {source.resolve()}: {len(files)} files"
        + (f", {skipped} ignored by {ignore_file}" if ignore_file else "")
        + (f", left out {', '.join(left_out)}" if left_out else ""),
        file=sys.stderr,
    )
    try:
        result = local.run_local(
            run, source, files, registry=registry, workroot=workroot, environment=environment
        )
    except (OSError, ValueError) as err:
        print(f"torchyard: error: {err}", file=sys.stderr)
        return 1
    if result.failure is not None:
        print(
            f"\nTrainingRun {run.name} failed after {result.seconds:.1f}s: "
            f"{local.describe_failure(result.failure)}",
            file=sys.stderr,
        )
        return result.exit_code or 1
    print(f"\nTrainingRun {run.name} succeeded in {result.seconds:.1f}s")
    if result.archive is not None:
        print(f"  outputs and logs: {result.archive}")
    if result.model is not None:
        print(
            f"  model: {result.model.model} version {result.model.version} "
            f"({result.model.manifest['size']}, {len(result.model.manifest['files'])} files) "
            f"at {result.model.path}"
        )
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    """Apply the file's Environments and TrainingRuns, with ``--source DIR`` snapshotted
    (a content-addressed ConfigMap, or the registry service when it is large); --dry-run
    prints what would be created, from the operator's own planner."""
    from torchyard.planning import pods
    from torchyard.sdk import snapshots

    docs = _load_documents(args.file)
    runs = [d for d in docs if d.get("kind") == "TrainingRun"]
    if not runs:
        print(f"torchyard: error: no TrainingRun in {args.file}", file=sys.stderr)
        return 2
    envs = {
        (d.get("metadata") or {}).get("name"): d for d in docs if d.get("kind") == "Environment"
    }
    snap = None
    if args.source:
        try:
            snap = snapshots.snapshot(Path(args.source), include_secrets=args.include_secrets)
        except snapshots.SnapshotError as err:
            print(f"torchyard: error: {err}", file=sys.stderr)
            return 2
        where = (
            f"ConfigMap {snap.configmap_name}"
            if snap.fits_configmap
            else "the registry service (over the ~900 KiB a ConfigMap holds)"
        )
        print(f"{snap.report()} -> {where}", file=sys.stderr)
        for body in runs:
            body.setdefault("spec", {})["source"] = snap.source
    try:
        try:
            for body in runs + list(envs.values()):
                body.setdefault("metadata", {})
                body["metadata"]["namespace"] = (
                    args.namespace or body["metadata"].get("namespace") or _context_namespace(args)
                )
                parse = (
                    api.parse_trainingrun
                    if body["kind"] == "TrainingRun"
                    else api.parse_environment
                )
                parse(body)
        except api.InvalidSpec as err:
            print(f"torchyard: error: invalid resource: {err}", file=sys.stderr)
            return 2
        namespace = runs[0]["metadata"]["namespace"]
        if args.dry_run:
            out: list[dict[str, Any]] = []
            if snap is not None and snap.fits_configmap:
                out.append(snapshots.configmap(snap, namespace))
            elif snap is not None:
                print(f"# would upload snapshot {snap.sha256} to the registry service")
            out += list(envs.values())
            for body in runs:
                run = api.parse_trainingrun(body)
                env = envs.get(run.spec.environment, {}).get("spec", {})
                image = env.get("image") or f"<image of Environment {run.spec.environment}>"
                out += [body, pods.service(run)]
                out += pods.pods(run, image=image, python=env.get("python", "python3"))
            print(yaml.safe_dump_all(out, sort_keys=False), end="")
            return 0
        from torchyard import k8s
        from torchyard.sdk import RegistryError

        _kubeconfig(args)
        try:
            if snap is not None:
                print(
                    snapshots.store(snap, namespace, lambda: _registry(args), progress=True),
                    file=sys.stderr,
                )
            for body in list(envs.values()) + runs:
                k8s.apply(body, field_manager="torchyard-cli")
                meta = body["metadata"]
                print(
                    f"{body['kind'].lower()}.torchyard.dev/{meta['name']} applied "
                    f"(namespace {meta['namespace']})"
                )
        except k8s.ApiError as err:
            print(f"torchyard: error: {err.message}", file=sys.stderr)
            return 1
        except RegistryError as err:  # no registry token, or the registry said no
            print(f"torchyard: error: {err}", file=sys.stderr)
            return 1
        if args.wait:
            args.namespace = namespace
            return _wait(args, runs[-1]["metadata"]["name"], show_output=True)
        return 0
    finally:
        if snap is not None:
            snap.close()


def _context_namespace(args: argparse.Namespace) -> str:
    from torchyard import k8s

    return k8s.default_namespace(args.kubeconfig, args.context)


def _wait(args: argparse.Namespace, name: str, show_output: bool) -> int:
    from torchyard.sdk import runs

    namespace = args.namespace
    try:
        run = runs.wait(
            namespace,
            name,
            show_output=show_output,
            timeout=getattr(args, "timeout", None),
            registry=lambda: _registry(args),
        )
    except runs.RunNotFound as err:
        print(f"torchyard: error: {err}", file=sys.stderr)
        return 1
    except TimeoutError as err:
        print(f"torchyard: error: {err}", file=sys.stderr)
        return 124
    code, text = runs.outcome(run)
    print(text, file=sys.stderr if code else sys.stdout)
    return code


def cmd_wait(args: argparse.Namespace) -> int:
    """Follow a run to its end (~ run.wait_for_completion(show_output=True))."""
    _kubeconfig(args)
    return _wait(args, args.run, not args.quiet)


def cmd_logs(args: argparse.Namespace) -> int:
    """A run's logs, node by node: live from its Pod, else (the kubelet unreachable, the
    Pod gone, an empty live log) archived in the registry service."""
    from torchyard import k8s
    from torchyard.sdk import RegistryError, runs

    _kubeconfig(args)
    try:
        run = k8s.get_or_none(k8s.TRAININGRUNS, args.namespace, args.run)
        pods = {runs.node_rank(p): p for p in runs.node_pods(args.namespace, args.run)}
        nodes = set(pods) | set(range(runs.node_count(run) if run else 0))
        if args.node is not None:
            nodes = {args.node}
        shown, missing = 0, set()
        for node in sorted(nodes):
            live = 0
            if node in pods:
                try:
                    for line in k8s.pod_log_lines(
                        args.namespace,
                        pods[node]["metadata"]["name"],
                        container="trainer",
                        follow=args.follow,
                    ):
                        live += 1  # the node delivered, whichever ranks are shown
                        if args.rank is None or line.startswith(f"[rank {args.rank}]"):
                            print(f"[node {node}] {line}")
                            shown += 1
                except k8s.ApiError as err:
                    print(
                        f"(node {node}: live log unavailable: {err.message[:200]})",
                        file=sys.stderr,
                    )
            if not live:
                missing.add(node)
        # Nodes whose live log did not deliver (or no run and no Pods: every archived node).
        if missing or not nodes:
            wanted = sorted(missing) if nodes else None
            for line in runs.archived_logs(_registry(args), args.namespace, args.run, wanted):
                if args.rank is not None and f"[rank {args.rank}] " not in line:
                    continue
                print(line)
                shown += 1
        if not shown:
            print(f"torchyard: error: no logs of {args.run} found", file=sys.stderr)
            return 1
        return 0
    except (k8s.ApiError, RegistryError) as err:
        print(f"torchyard: error: {getattr(err, 'message', err)}", file=sys.stderr)
        return 1


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def _age(obj: dict[str, Any]) -> str:
    from datetime import datetime, timezone

    from torchyard.sdk import runs

    created = runs.parse_time(obj["metadata"].get("creationTimestamp"))
    return runs.duration((datetime.now(timezone.utc) - created).total_seconds()) if created else "?"


def cmd_get(args: argparse.Namespace) -> int:
    """kubectl-style tables of runs, environments, models."""
    import json

    from torchyard import k8s
    from torchyard.sdk import runs

    _kubeconfig(args)
    res = {"runs": k8s.TRAININGRUNS, "envs": k8s.ENVIRONMENTS, "models": k8s.MODELVERSIONS}[
        args.kind
    ]
    try:
        if args.name:
            items = [k8s.get(res, args.namespace, args.name)]
        else:
            items = k8s.list_(res, args.namespace)
    except k8s.ApiError as err:
        print(f"torchyard: error: {err.message}", file=sys.stderr)
        return 1
    if args.output in ("yaml", "json"):
        doc: Any = items[0] if args.name else {"apiVersion": "v1", "kind": "List", "items": items}
        print(json.dumps(doc, indent=2) if args.output == "json" else yaml.safe_dump(doc), end="")
        return 0
    wide = args.output == "wide"
    if args.kind == "runs":
        rows = [["NAME", "PHASE", "NODES", "READY", "ELAPSED", "MODEL", "AGE"]]
        if wide:
            rows[0] += ["ENVIRONMENT", "FAILURE"]
        for r in items:
            st = r.get("status", {})
            model = st.get("model") or {}
            row = [
                r["metadata"]["name"],
                st.get("phase", "Pending"),
                str(r["spec"].get("distribution", {}).get("nodeCount", 1)),
                (st.get("nodes") or {}).get("ready", "0/0"),
                runs.duration(runs.elapsed(r)),
                f"{model['name']}:{model['version']}" if model else "-",
                _age(r),
            ]
            if wide:
                fail = st.get("failure") or {}
                row += [
                    r["spec"].get("environment", ""),
                    (f"rank {fail.get('rank')} exit {fail.get('exitCode')}" if fail else "-"),
                ]
            rows.append(row)
    elif args.kind == "envs":
        rows = [["NAME", "PHASE", "IMAGE", "AGE"]]
        for e in items:
            st = e.get("status", {})
            rows.append(
                [e["metadata"]["name"], st.get("phase", "Pending"), st.get("image", "-"), _age(e)]
            )
    else:
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
                    _age(m),
                ]
            )
    if len(rows) == 1:
        print(f"No {args.kind} found in namespace {args.namespace}.", file=sys.stderr)
        return 0
    print(_table(rows))
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    """A run's spec summary, node Pods, conditions, failure, model and events."""
    from torchyard import k8s
    from torchyard.sdk import runs

    _kubeconfig(args)
    try:
        run = runs.get(args.namespace, args.run)
        pods = runs.node_pods(args.namespace, args.run)
        events = k8s.events_of(args.namespace, args.run, run["metadata"].get("uid"))
    except (runs.RunNotFound, k8s.ApiError) as err:
        print(f"torchyard: error: {getattr(err, 'message', err)}", file=sys.stderr)
        return 1
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
    if st.get("model"):
        print(f"Model:        {st['model'].get('name')} version {st['model'].get('version')}")
    print("Events:")
    for e in events[-20:]:
        print(f"  {e.get('type', ''):8s} {e.get('reason', ''):20s} {e.get('message', '')}")
    if not events:
        print("  (none)")
    return 0


class KubernetesAuthorizer:
    """The registry service's Authorizer: TokenReview and SubjectAccessReview.

    Only tokens bound to the registry's audience (``torchyard-registry``) pass: node Pods'
    projected tokens, the operator's, and the TokenRequest tokens the CLI and SDK mint. A
    token for the apiserver (a Pod's automounted token, a kubeconfig's) or for any other
    audience is refused, so the registry can never replay one against the apiserver."""

    def user(self, token: str) -> dict[str, Any] | None:
        from torchyard import k8s

        return k8s.review_token(token, [AUDIENCE])

    def allowed(self, user: dict[str, Any], verb: str, namespace: str) -> bool:
        from torchyard import k8s

        return k8s.allowed(user, verb, namespace, "modelversions")

    def training_run(self, namespace: str, name: str) -> RunIdentity | None:
        """The run's uid and its node Pods' ServiceAccount (``spec.serviceAccountName``,
        whose default is ``default``), or None when there is no such TrainingRun."""
        from torchyard import k8s
        from torchyard.registry import service

        run = k8s.get_or_none(k8s.TRAININGRUNS, namespace, name)
        if run is None:
            return None
        account = (run.get("spec") or {}).get("serviceAccountName") or "default"
        return service.RunIdentity(str(run["metadata"].get("uid", "")), str(account))


def cmd_registry_serve(args: argparse.Namespace) -> int:
    from torchyard.registry import service

    if bool(args.tls_cert) != bool(args.tls_key):
        print(
            "torchyard: error: --tls-cert and --tls-key go together (the certificate and its "
            "private key, PEM); pass both, or neither to serve plain HTTP",
            file=sys.stderr,
        )
        return 2
    tls = None
    if args.tls_cert:
        try:
            tls = service.TLSFiles(Path(args.tls_cert), Path(args.tls_key))
        except ValueError as err:
            print(f"torchyard: error: {err}", file=sys.stderr)
            return 2
    limits = service.Limits(args.max_upload_bytes, args.max_snapshot_bytes)
    service.serve(
        Path(args.root),
        KubernetesAuthorizer(),
        host=args.host,
        port=args.port,
        tls=tls,
        limits=limits,
    )
    return 0


def _size(text: str) -> int:
    """An argparse type: bytes, or a quantity such as 512Mi or 20Gi."""
    from torchyard.api import quantities

    try:
        size = int(quantities.quantity(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give bytes or a size such as 20Gi") from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the limit must be at least 1 byte")
    return size


def _registry(args: argparse.Namespace) -> Any:
    """Direct when a URL is given (in the cluster, or a port-forward); else through the
    apiserver's service proxy. Either way the registry sees a token bound to its audience,
    never the kubeconfig's own credentials."""
    from torchyard.sdk import RegistryClient, RegistryError

    url = args.registry_url or os.environ.get("TORCHYARD_REGISTRY_URL")
    if not url:
        if args.registry_ca:
            raise RegistryError(
                "--registry-ca goes with --registry-url: through the apiserver's service "
                "proxy it is the apiserver that connects to the registry"
            )
        _kubeconfig(args)
        client = RegistryClient.through_kubernetes(
            args.namespace, args.service_account, args.registry_service
        )
    elif args.service_account:
        client = RegistryClient.for_service_account(
            url, args.namespace, args.service_account, ca_file=args.registry_ca
        )
    else:
        token = Path(args.token_file).read_text().strip() if args.token_file else None
        client = RegistryClient(url, token, ca_file=args.registry_ca)
    client.progress = True
    return client


def _model_ref(ref: str) -> tuple[str, int | None]:
    name, _, version = ref.partition(":")
    if version and not version.isdigit():
        raise SystemExit(f"torchyard: error: {ref!r}: the version after ':' is a number")
    return name, int(version) if version else None


def cmd_models(args: argparse.Namespace) -> int:
    from torchyard.sdk import RegistryError

    try:
        client = _registry(args)
        if args.models_command == "list":
            models = client.models(args.namespace)
            print(f"{'MODEL':30s} {'VERSIONS':>8s} {'LATEST':>6s}")
            for name, versions in sorted(models.items()):
                latest = str(versions[-1]) if versions else "-"
                print(f"{name:30s} {len(versions):8d} {latest:>6s}")
            return 0
        name, version = _model_ref(args.model)
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
            return 0
        if args.models_command == "download":
            dest = Path(args.output)
            m = client.download(args.namespace, name, version, dest)
            print(
                f"downloaded {m['model']} version {m['version']}: {len(m['files'])} file(s), "
                f"sha256 verified, into {dest}"
            )
            return 0
        m, bad = client.verify(args.namespace, name, version)
        if bad:
            print(
                f"{m['model']} version {m['version']}: {len(bad)} file(s) do not match "
                f"the manifest: {', '.join(bad)}",
                file=sys.stderr,
            )
            return 1
        print(
            f"{m['model']} version {m['version']}: all {len(m['files'])} file(s) match their sha256"
        )
        return 0
    except RegistryError as err:
        print(f"torchyard: error: {err}", file=sys.stderr)
        return 1


def cmd_runs_download(args: argparse.Namespace) -> int:
    from torchyard.sdk import RegistryError

    dest = Path(args.output or Path(args.path).name)
    try:
        _registry(args).download_run_file(args.namespace, args.run, args.path, dest)
    except RegistryError as err:
        print(f"torchyard: error: {err}", file=sys.stderr)
        return 1
    print(f"downloaded {args.run}/{args.path} to {dest}")
    return 0


def _registry_options(p: argparse.ArgumentParser) -> None:
    _kube_options(p)
    p.add_argument(
        "--registry-service",
        metavar="[http:]NS/NAME:PORT",
        default=DEFAULT_SERVICE,
        help="the registry Service, reached through the Kubernetes API's service proxy over "
        "HTTPS (needs get/create on services/proxy there; 'http:' first for a registry "
        f"without TLS; default: {DEFAULT_SERVICE})",
    )
    p.add_argument(
        "--registry-url",
        help="talk to the registry directly instead, e.g. from inside the cluster "
        "(default: $TORCHYARD_REGISTRY_URL)",
    )
    p.add_argument(
        "--registry-ca",
        metavar="FILE",
        help="with an https --registry-url: the CA certificate (PEM) that signed the "
        "registry's (default: $TORCHYARD_REGISTRY_CA_FILE, else the system's CAs)",
    )
    who = p.add_mutually_exclusive_group()
    who.add_argument(
        "--token-file",
        help="with --registry-url: a registry-audience token (default: $TORCHYARD_TOKEN)",
    )
    who.add_argument(
        "--service-account",
        metavar="NAME",
        help="the ServiceAccount whose 10-minute registry token (TokenRequest, audience "
        "torchyard-registry) the CLI mints; your kubeconfig's credentials never go to the "
        "registry. Needs create on serviceaccounts/token for it (default: the namespace's "
        "'default')",
    )


def _kube_options(p: argparse.ArgumentParser) -> None:
    """kubectl's conventions."""
    p.add_argument("-n", "--namespace", default=None, help="namespace (default: the context's)")
    p.add_argument("--context", help="the kubeconfig context to use")
    p.add_argument("--kubeconfig", help="path to the kubeconfig file (default: $KUBECONFIG)")


def _kubeconfig(args: argparse.Namespace) -> None:
    from torchyard import k8s

    if getattr(args, "kubeconfig", None) or getattr(args, "context", None):
        k8s.load(args.kubeconfig, args.context)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchyard",
        description="Train PyTorch models at scale on Kubernetes: Environments, distributed "
        "TrainingRuns and a model registry.",
    )
    parser.add_argument("--version", action="version", version=f"torchyard {torchyard.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("operator", help="run the operator (Kopf) against the current cluster")
    options.add_arguments(p)
    p.set_defaults(func=cmd_operator)

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
    p.set_defaults(func=cmd_run)

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
    _registry_options(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser(
        "wait",
        help="follow a run to its end: phase, nodes, logs (~ run.wait_for_completion)",
        description="Follow a TrainingRun: a line whenever its phase or a node changes, every "
        "node's log with [node n] [rank r] prefixes, then the outcome. Exit code 0 when it "
        "succeeded, 1 with the failing rank's traceback when it failed.",
    )
    p.add_argument("run")
    p.add_argument("-q", "--quiet", action="store_true", help="no logs, only the state")
    p.add_argument("--timeout", type=float, help="give up after this many seconds (exit 124)")
    _registry_options(p)  # for the archived logs when the live ones are not reachable
    p.set_defaults(func=cmd_wait)

    p = sub.add_parser("logs", help="a run's logs (live from the Pods, else the archive)")
    p.add_argument("run")
    p.add_argument("--node", type=int, help="only this node")
    p.add_argument("--rank", type=int, help="only this global rank")
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming")
    _registry_options(p)
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("get", help="list runs, envs or models (kubectl get style)")
    p.add_argument("kind", choices=["runs", "envs", "models"])
    p.add_argument("name", nargs="?", help="one of them")
    p.add_argument("-o", "--output", choices=["wide", "yaml", "json"], help="output format")
    _kube_options(p)
    p.set_defaults(func=cmd_get)

    p = sub.add_parser("describe", help="a run: nodes, conditions, failure, model and events")
    p.add_argument("run")
    _kube_options(p)
    p.set_defaults(func=cmd_describe)

    p = sub.add_parser("registry", help="the model registry service")
    reg = p.add_subparsers(dest="registry_command", metavar="COMMAND")
    p = reg.add_parser(
        "serve",
        help="serve the registry volume over HTTPS (registry-audience tokens checked "
        "with TokenReview, requests with SubjectAccessReview)",
    )
    p.add_argument("--root", required=True, help="the registry volume")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="serve HTTPS with this certificate (PEM, with its chain); reloaded when it "
        "changes. Without it: plain HTTP, with a warning",
    )
    p.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    p.add_argument(
        "--max-upload-bytes",
        type=_size,
        default=store.MAX_UPLOAD_BYTES,
        metavar="SIZE",
        help="largest run file accepted, in bytes or as 512Mi, 20Gi (default 20Gi); "
        "larger ones get 413",
    )
    p.add_argument(
        "--max-snapshot-bytes",
        type=_size,
        default=store.MAX_SNAPSHOT_BYTES,
        metavar="SIZE",
        help="largest source snapshot accepted (default 1Gi); larger ones get 413",
    )
    p.set_defaults(func=cmd_registry_serve)

    p = sub.add_parser("models", help="registered models: list, show, download, verify")
    models = p.add_subparsers(dest="models_command", metavar="COMMAND", required=True)
    p = models.add_parser("list", help="models and their versions")
    _registry_options(p)
    p.set_defaults(func=cmd_models)
    for name, text in (
        ("show", "a version's files, sha256, run and metrics"),
        ("verify", "check every file of a version against its sha256"),
        ("download", "download a version, verifying sha256"),
    ):
        p = models.add_parser(name, help=text)
        p.add_argument("model", metavar="NAME[:VERSION]", help="model (default: latest)")
        if name == "download":
            p.add_argument("-o", "--output", required=True, help="folder to download into")
        _registry_options(p)
        p.set_defaults(func=cmd_models)

    p = sub.add_parser("runs", help="archived run files")
    runs = p.add_subparsers(dest="runs_command", metavar="COMMAND", required=True)
    p = runs.add_parser("download", help="download an archived file (~ run.download_file)")
    p.add_argument("run")
    p.add_argument("path", help="outputs/... or logs/node-N/...")
    p.add_argument("-o", "--output", help="where to write it (default: its file name)")
    _registry_options(p)
    p.set_defaults(func=cmd_runs_download)

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
    if args.command != "submit" and hasattr(args, "context") and args.namespace is None:
        from torchyard import k8s

        args.namespace = k8s.default_namespace(args.kubeconfig, args.context)
    try:
        result: int = args.func(args)
    except (OSError, yaml.YAMLError) as err:
        print(f"torchyard: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return result
