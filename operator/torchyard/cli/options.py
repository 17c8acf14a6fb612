"""What several commands share: kubectl's options (``-n``, ``--context``,
``--kubeconfig``), the registry's (``--registry-service``, ``--registry-url`` ...), the
registry client those options describe, and reading resource files.

Called by the command modules of ``torchyard.cli``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from torchyard.cli.errors import CliError
from torchyard.launch.contract import TORCHYARD_REGISTRY_URL
from torchyard.sdk import clusters
from torchyard.sdk.registry import DEFAULT_SERVICE, RegistryClient, RegistryError


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


def registry(args: argparse.Namespace) -> RegistryClient:
    """Direct when a URL is given (in the cluster, or a port-forward); else through the
    apiserver's service proxy. Either way the registry sees a token bound to its audience,
    never the kubeconfig's own credentials."""
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
    """The documents of a YAML file ('-': standard input), empty ones left out."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    return [d for d in yaml.safe_load_all(text) if d]


def pick(docs: list[dict[str, Any]], kind: str, name: str | None) -> dict[str, Any] | None:
    """The one document of ``kind`` (named ``name`` when given), None when there is none."""
    found = [d for d in docs if d.get("kind") == kind]
    if name is not None:
        found = [d for d in found if (d.get("metadata") or {}).get("name") == name]
    if len(found) > 1:
        names = ", ".join((d.get("metadata") or {}).get("name", "?") for d in found)
        raise CliError(f"several {kind}s ({names}): pick one with --name")
    return found[0] if found else None
