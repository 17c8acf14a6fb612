"""What several commands share: kubectl's options (``-n``, ``--context``,
``--kubeconfig``), the registry's (``--registry-service``, ``--registry-url`` ...), the
registry client those options describe, the local switch of every read command
(``--local``, ``--registry DIR``: the local registry of ``torchyard run --local``, also
read when there is no kubeconfig at all, said in one line), the output formats every list
takes, and reading resource files (``sdk.documents``: read and checked once).

Called by the command modules of ``torchyard.cli``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from torchyard import api
from torchyard.cli.errors import BAD_INPUT, CliError
from torchyard.launch.contract import TORCHYARD_REGISTRY_URL
from torchyard.sdk import clusters, documents
from torchyard.sdk.local_registry import LocalRegistry
from torchyard.sdk.registry import DEFAULT_SERVICE, RegistryClient, RegistryError

# The formats of every list (``get``, ``runs list``, ``models list``, ``sweep get``):
# a table without -o; wide: with more columns where a list has them.
OUTPUTS = ("wide", "yaml", "json")
PHASES = [p.value for p in api.Phase]


def kube_options(p: argparse.ArgumentParser) -> None:
    """kubectl's conventions."""
    p.add_argument("-n", "--namespace", default=None, help="namespace (default: the context's)")
    p.add_argument("--context", help="the kubeconfig context to use")
    p.add_argument("--kubeconfig", help="path to the kubeconfig file (default: $KUBECONFIG)")


def registry_options(p: argparse.ArgumentParser) -> None:
    kube_options(p)
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


def port_number(text: str) -> int:
    """A ``--port`` value (0: a free one)."""
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535; got {text!r}")
    return int(text)


def connect(args: argparse.Namespace) -> None:
    """Use the command's --kubeconfig and --context, when given."""
    clusters.connect(getattr(args, "kubeconfig", None), getattr(args, "context", None))


def output_option(p: argparse.ArgumentParser, *formats: str) -> None:
    """``-o``: :data:`OUTPUTS` (or ``formats``, for what is not a list)."""
    shown = formats or OUTPUTS
    p.add_argument(
        "-o",
        "--output",
        choices=shown,
        help=f"output format: {', '.join(shown)} (default: a table)",
    )


def phase(text: str) -> str:
    """A ``--phase`` value, whatever its case (``failed`` is Failed)."""
    found = next((p for p in PHASES if p.lower() == text.lower()), None)
    if found is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a phase: {', '.join(PHASES)}")
    return found


def local_options(p: argparse.ArgumentParser) -> None:
    """The local switch of a read command."""
    p.add_argument(
        "--local",
        action="store_true",
        help="read the local registry of `torchyard run --local` instead of the cluster "
        "(also chosen, and said, when there is no kubeconfig at all)",
    )
    local_registry_option(p)


def local_registry_option(p: argparse.ArgumentParser) -> None:
    """``--registry DIR``: the local registry folder a --local command reads or writes."""
    p.add_argument(
        "--registry",
        metavar="DIR",
        help="with --local: the local registry folder (default: ~/.torchyard/registry or "
        "$TORCHYARD_REGISTRY)",
    )


def reads_local(args: argparse.Namespace) -> bool:
    """Whether a read command reads the local registry: --local, or no kubeconfig at all
    (no --kubeconfig, --context, $KUBECONFIG or ~/.kube/config, not in a Pod) and no
    --registry-url, said once on standard error."""
    if getattr(args, "registry", None) and not getattr(args, "local", False):
        raise CliError("--registry goes with --local", BAD_INPUT)
    if getattr(args, "local", False):
        return True
    url = getattr(args, "registry_url", None) or os.environ.get(TORCHYARD_REGISTRY_URL)
    if url or clusters.configured(
        getattr(args, "kubeconfig", None), getattr(args, "context", None)
    ):
        return False
    args.local = True
    print(
        f"torchyard: no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config): reading the "
        f"local registry {local_registry(args).root} (as --local does)",
        file=sys.stderr,
    )
    return True


def local_registry(args: argparse.Namespace) -> LocalRegistry:
    folder = getattr(args, "registry", None)
    return LocalRegistry(Path(folder).expanduser() if folder else None)


def registry(args: argparse.Namespace) -> RegistryClient | LocalRegistry:
    """The local registry (:func:`reads_local`); else the registry service: directly when
    a URL is given (in the cluster, or a port-forward), else through the apiserver's
    service proxy. Either way the service sees a token bound to its audience, never the
    kubeconfig's own credentials."""
    if reads_local(args):
        return local_registry(args)
    return service(args)


def service(args: argparse.Namespace) -> RegistryClient:
    """The registry service's client, as :func:`registry` says."""
    url = args.registry_url or os.environ.get(TORCHYARD_REGISTRY_URL)
    if not url:
        if args.registry_ca:
            raise RegistryError(
                "--registry-ca goes with --registry-url: through the apiserver's service "
                "proxy it is the apiserver that connects to the registry"
            )
        connect(args)
        client = RegistryClient.through_kubernetes(
            args.namespace, args.service_account, args.registry_service
        )
    elif args.service_account:
        connect(args)  # (the TokenRequest goes to the apiserver)
        client = RegistryClient.for_service_account(
            url, args.namespace, args.service_account, ca_file=args.registry_ca
        )
    else:
        token = Path(args.token_file).read_text().strip() if args.token_file else None
        client = RegistryClient(url, token, ca_file=args.registry_ca)
    client.progress = True
    return client


def load_documents(path: str) -> list[dict[str, Any]]:
    """The documents of a YAML file ('-': standard input), every torchyard.dev one checked
    as the operator parses it (``sdk.documents``: one verdict for every command)."""
    return [c.body for c in documents.check(documents.load(path))]


def pick(docs: list[dict[str, Any]], kind: str, name: str | None) -> dict[str, Any] | None:
    """The one document of ``kind`` (named ``name`` when given), None when there is none."""
    found = [d for d in docs if d.get("kind") == kind]
    if name is not None:
        found = [d for d in found if (d.get("metadata") or {}).get("name") == name]
    if len(found) > 1:
        names = ", ".join((d.get("metadata") or {}).get("name", "?") for d in found)
        raise CliError(f"several {kind}s ({names}): pick one with --name")
    return found[0] if found else None
