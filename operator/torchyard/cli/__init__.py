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
from torchyard.controller import options
from torchyard.sdk.registry import DEFAULT_SERVICE


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
    source = Path(args.source) if args.source else Path(args.file).resolve().parent
    result = local.run_local(
        run,
        source,
        registry=Path(args.registry).expanduser() if args.registry else None,
        workroot=Path(args.workdir).expanduser() if args.workdir else None,
        environment=environment,
    )
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
    """Apply the file's Environments and TrainingRuns; --dry-run prints what the operator
    would create for each run (its Service and node Pods), from the operator's planner."""
    from torchyard.planning import pods

    docs = _load_documents(args.file)
    runs = [d for d in docs if d.get("kind") == "TrainingRun"]
    if not runs:
        print(f"torchyard: error: no TrainingRun in {args.file}", file=sys.stderr)
        return 2
    envs = {
        (d.get("metadata") or {}).get("name"): d for d in docs if d.get("kind") == "Environment"
    }
    try:
        for body in runs + list(envs.values()):
            body.setdefault("metadata", {})
            if args.namespace:
                body["metadata"]["namespace"] = args.namespace
            body["metadata"].setdefault("namespace", "default")
            (api.parse_trainingrun if body["kind"] == "TrainingRun" else api.parse_environment)(
                body
            )
    except api.InvalidSpec as err:
        print(f"torchyard: error: invalid resource: {err}", file=sys.stderr)
        return 2
    if args.dry_run:
        out: list[dict[str, Any]] = []
        for body in runs:
            run = api.parse_trainingrun(body)
            env = envs.get(run.spec.environment, {}).get("spec", {})
            image = env.get("image") or f"<image of Environment {run.spec.environment}>"
            out += [body, pods.service(run)]
            out += pods.pods(run, image=image, python=env.get("python", "python3"))
        print(yaml.safe_dump_all(out, sort_keys=False), end="")
        return 0
    from torchyard import k8s

    try:
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
    return 0


AUDIENCE = "torchyard-registry"


class KubernetesAuthorizer:
    """The registry service's Authorizer: TokenReview and SubjectAccessReview."""

    def user(self, token: str) -> dict[str, Any] | None:
        """Pod tokens are minted for the registry's audience; a user's own token (sent by
        ``torchyard models ...`` through the service proxy) has the apiserver's."""
        from torchyard import k8s

        return k8s.review_token(token, [AUDIENCE]) or k8s.review_token(token, [])

    def allowed(self, user: dict[str, Any], verb: str, namespace: str) -> bool:
        from torchyard import k8s

        return k8s.allowed(user, verb, namespace, "modelversions")


def cmd_registry_serve(args: argparse.Namespace) -> int:
    from torchyard.registry import service

    service.serve(Path(args.root), KubernetesAuthorizer(), host=args.host, port=args.port)
    return 0


def _registry(args: argparse.Namespace) -> Any:
    """Direct when a URL is given (in the cluster, or a port-forward); else through the
    apiserver's service proxy with the kubeconfig's credentials."""
    import os

    from torchyard.sdk import RegistryClient

    url = args.registry_url or os.environ.get("TORCHYARD_REGISTRY_URL")
    if not url:
        _kubeconfig(args)
        return RegistryClient.through_kubernetes(
            args.namespace, args.service_account, args.registry_service
        )
    if args.service_account:
        return RegistryClient.for_service_account(url, args.namespace, args.service_account)
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    return RegistryClient(url, token)


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
        metavar="NS/NAME:PORT",
        default=DEFAULT_SERVICE,
        help="the registry Service, reached through the Kubernetes API's service proxy "
        f"(needs get/create on services/proxy there; default: {DEFAULT_SERVICE})",
    )
    p.add_argument(
        "--registry-url",
        help="talk to the registry directly instead, e.g. from inside the cluster "
        "(default: $TORCHYARD_REGISTRY_URL)",
    )
    who = p.add_mutually_exclusive_group()
    who.add_argument(
        "--token-file",
        help="with --registry-url: a bearer token for the registry (default: $TORCHYARD_TOKEN)",
    )
    who.add_argument(
        "--service-account",
        metavar="NAME",
        help="use a 10-minute token of this ServiceAccount (TokenRequest; needs create on "
        "serviceaccounts/token). Default: the kubeconfig's own bearer token, or the "
        "namespace's 'default' ServiceAccount when the kubeconfig uses a client certificate",
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
        help="folder with the training code (default: the YAML file's folder)",
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
        help="apply a TrainingRun (and its Environment) to the cluster, or print what the "
        "operator would create (--dry-run)",
    )
    p.add_argument("file", help="YAML with TrainingRuns and Environments ('-' for stdin)")
    p.add_argument("-n", "--namespace", help="namespace (default: the file's, else default)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the run, its headless Service and node Pods; change nothing",
    )
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("registry", help="the model registry service")
    reg = p.add_subparsers(dest="registry_command", metavar="COMMAND")
    p = reg.add_parser(
        "serve",
        help="serve the registry volume over HTTP (tokens checked "
        "with TokenReview, requests with SubjectAccessReview)",
    )
    p.add_argument("--root", required=True, help="the registry volume")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8080)
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
    if hasattr(args, "context") and getattr(args, "namespace", "") is None:
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
