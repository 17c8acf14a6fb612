"""``torchyard ui``: the web view of runs, sweeps, models, Environments and the queue,
served on 127.0.0.1 with the caller's kubeconfig (the caller's own RBAC: the view can read
and change only what the caller can) and, for metrics history, hang stacks and the records
of what is gone, the registry service as the other commands reach it.

Called by ``torchyard.cli.app``; the application is ``torchyard.web`` (imported when
the command runs, so ``torchyard --help`` stays fast). Tested in tests/unit/cli/test_ui.py
and in a browser in tests/integration/web/.
"""

from __future__ import annotations

import argparse
import copy
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from torchyard.cli.errors import CliError
from torchyard.cli.options import connect, port_number, registry_options, service
from torchyard.sdk.registry import RegistryClient

HOST = "127.0.0.1"
CLIENT_SECONDS = 300.0  # a registry client (and its token) is reused this long
T = TypeVar("T")


def cmd_ui(args: argparse.Namespace) -> int:
    from torchyard.web import access, app, front, source

    if args.address and not args.in_cluster:
        raise CliError(
            "--address goes with --in-cluster: otherwise the view listens on 127.0.0.1", 2
        )
    _each(front.allowed_name, [args.address] if args.address else [])
    hosts = _each(front.allowed_name, args.allowed_host)
    proxies = _each(front.network, args.trusted_proxy)
    tls = _tls(args.tls_cert, args.tls_key)
    key = _key(Path(args.csrf_key_file)) if args.csrf_key_file else None
    connect(args)
    clients: dict[str, tuple[float, RegistryClient]] = {}

    def archive_client(namespace: str) -> RegistryClient:
        """A registry client per namespace (its token is minted for it, or read from
        --token-file, which the kubelet refreshes): made again every few minutes."""
        made = clients.get(namespace)
        if made is None or time.monotonic() - made[0] > CLIENT_SECONDS:
            scoped = copy.copy(args)
            scoped.namespace = namespace
            client = service(scoped)
            client.progress = False
            made = clients[namespace] = (time.monotonic(), client)
        return made[1]

    reviews = access.kubernetes_reviews() if args.in_cluster else None
    live = source.LiveSource(archive_client)
    if not args.in_cluster:
        live.informers.start(args.namespace)  # the first page finds its runs listed
    web_app = app.make_app(
        live, namespace=args.namespace, reviews=reviews, hosts=hosts, key=key, proxies=proxies
    )
    host = (args.address or "0.0.0.0") if args.in_cluster else HOST

    def ready(url: str) -> None:
        print(f"torchyard ui: serving {url} (Ctrl-C stops it)", flush=True)

    try:
        app.serve(web_app, host, args.port, ready, tls)
    except OSError as err:
        raise CliError(f"cannot listen on {host}:{args.port}: {err.strerror or err}", 1) from None
    return 0


def _each(parse: Callable[[str], T], values: list[str] | None) -> list[T]:
    try:
        return [parse(v) for v in values or ()]
    except ValueError as err:
        raise CliError(str(err), 2) from None


def _tls(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    from torchyard.web import app

    if not cert and not key:
        return None
    if not (cert and key):
        raise CliError("--tls-cert and --tls-key go together", 2)
    try:
        return app.tls_context(cert, key)
    except (OSError, ssl.SSLError) as err:
        raise CliError(f"cannot serve TLS with {cert} and {key}: {err}", 2) from None


def _key(path: Path) -> bytes:
    """The key the pages' tokens are signed with (the same on every replica)."""
    from torchyard.web import csrf

    try:
        key = path.read_bytes().strip()
    except OSError as err:
        raise CliError(f"cannot read --csrf-key-file {path}: {err.strerror or err}", 2) from None
    if len(key) < csrf.KEY_BYTES:
        raise CliError(
            f"--csrf-key-file {path} holds {len(key)} bytes; the key needs at least "
            f"{csrf.KEY_BYTES} (e.g. `openssl rand -hex 32 > {path}`)",
            2,
        )
    return key


def add_ui(sub: Any) -> None:
    p = sub.add_parser(
        "ui",
        help="the web view of runs, sweeps, models, Environments and the queue, on 127.0.0.1",
        description="Serve the web view on 127.0.0.1 with your kubeconfig: it reads (and, "
        "with its buttons, suspends, resumes or cancels) only what your own RBAC allows. "
        "It prints the URL to open. Metrics history and hang stacks come from the runs' "
        "archives in the registry service, and runs, sweeps and Environments that are gone "
        "from their records there (the --registry-* options, as for 'torchyard logs'); "
        "without one the pages say so.",
    )
    p.add_argument(
        "--port", type=port_number, default=0, help="the port to listen on (default: a free one)"
    )
    p.add_argument(
        "--in-cluster",
        action="store_true",
        help="serve every caller who brings a Kubernetes token (pasted once on /login, kept "
        "in the browser's cookie, never on the server): each request is authorized for "
        "that identity by SubjectAccessReview, then read with this process's own "
        "ServiceAccount (the Helm chart's ui.enabled)",
    )
    p.add_argument(
        "--address",
        help="with --in-cluster: the address to listen on (default: 0.0.0.0); without it "
        "the view listens on 127.0.0.1 only",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="a Host name (or address, no port) the view answers for besides the loopback "
        "names and --address, e.g. an Ingress's host; any other Host gets 421 (repeat it "
        "for more)",
    )
    p.add_argument(
        "--trusted-proxy",
        action="append",
        metavar="CIDR",
        help="the network of a proxy in front of the view (an Ingress controller's Pods): "
        "only its X-Forwarded-Proto and X-Forwarded-Host are believed, so behind its TLS "
        "the cookies are Secure (repeat it for more)",
    )
    p.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--tls-key", metavar="FILE", help="and this private key (PEM)")
    p.add_argument(
        "--csrf-key-file",
        metavar="FILE",
        help="the key (at least 32 bytes) the pages' tokens are signed with: give every "
        "replica the same one (the Helm chart does, from a Secret); default: a new one for "
        "this process",
    )
    registry_options(p)
    p.set_defaults(func=cmd_ui)


__all__ = ["add_ui", "cmd_ui"]
