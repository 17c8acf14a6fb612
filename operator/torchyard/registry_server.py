"""The registry service's entry point (``torchyard registry serve``): its options, and the
service with its Kubernetes authorizer wired in.

The service and the registry's authorization policy live in ``torchyard.registry``
(``service``, ``auth``), which lies below ``torchyard.k8s`` in the layers and so cannot ask
the apiserver itself. This module can: it sits beside ``torchyard.controller`` in the
layers (pyproject.toml's import-linter contract), above ``k8s`` and ``registry`` and below
the CLI, and its only job is to hand ``torchyard.k8s``'s TokenReview, SubjectAccessReview
and TrainingRun reads to ``registry.auth.ReviewAuthorizer`` (:func:`kubernetes_authorizer`)
and start the service. It is to ``registry serve`` what ``controller.operators`` is to
``torchyard operator``: the CLI parses with :func:`add_arguments` and calls
:func:`main_from_args`. Importing it is cheap (no aiohttp, no Kubernetes client) so that
``torchyard --help`` stays fast; :func:`main_from_args` imports the server parts.

Tested in tests/unit/registry/test_auth.py and test_tls_and_tokens.py (bad options, the
authorizer over a patched ``k8s``) and tests/integration/test_registry_service.py,
test_registry_tls.py (the process against the real apiserver).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchyard.api import quantities
from torchyard.registry import store

if TYPE_CHECKING:
    from torchyard.registry.auth import ReviewAuthorizer


class OptionError(ValueError):
    """Options that cannot be served: the message says what to pass instead."""


def size(text: str) -> int:
    """An argparse type: bytes, or a quantity such as 512Mi or 20Gi."""
    try:
        value = int(quantities.quantity(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give bytes or a size such as 20Gi") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the limit must be at least 1 byte")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``torchyard registry serve``."""
    parser.add_argument("--root", required=True, help="the registry volume")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="serve HTTPS with this certificate (PEM, with its chain); reloaded when it "
        "changes. Without it: plain HTTP, with a warning",
    )
    parser.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    parser.add_argument(
        "--max-upload-bytes",
        type=size,
        default=store.MAX_UPLOAD_BYTES,
        metavar="SIZE",
        help="largest run file accepted, in bytes or as 512Mi, 20Gi (default 20Gi); "
        "larger ones get 413",
    )
    parser.add_argument(
        "--max-snapshot-bytes",
        type=size,
        default=store.MAX_SNAPSHOT_BYTES,
        metavar="SIZE",
        help="largest source snapshot accepted (default 1Gi); larger ones get 413",
    )


def kubernetes_authorizer() -> ReviewAuthorizer:
    """The registry's policy over the apiserver: ``torchyard.k8s``'s reviews, looked up at
    each call (so tests that patch ``k8s`` see their stand-ins)."""
    from torchyard import k8s
    from torchyard.registry import auth

    def review_token(token: str, audiences: list[str]) -> dict[str, Any] | None:
        return k8s.review_token(token, audiences)

    def allowed(user: dict[str, Any], verb: str, namespace: str, resource: str) -> bool:
        return k8s.allowed(user, verb, namespace, resource)

    def training_run(namespace: str, name: str) -> dict[str, Any] | None:
        return k8s.get_or_none(k8s.TRAININGRUNS, namespace, name)

    def allowed_named(user: dict[str, Any], verb: str, namespace: str, res: str, name: str) -> bool:
        return k8s.allowed(user, verb, namespace, res, name=name)

    return auth.ReviewAuthorizer(auth.Reviews(review_token, allowed, training_run, allowed_named))


def main_from_args(args: argparse.Namespace) -> int:
    """Serve until interrupted; :class:`OptionError` (before anything is served or
    written) when the TLS files do not go together or do not load."""
    from torchyard.registry import service

    if bool(args.tls_cert) != bool(args.tls_key):
        raise OptionError(
            "--tls-cert and --tls-key go together (the certificate and its private key, "
            "PEM); pass both, or neither to serve plain HTTP"
        )
    tls = None
    if args.tls_cert:
        try:
            tls = service.TLSFiles(Path(args.tls_cert), Path(args.tls_key))
        except ValueError as err:
            raise OptionError(str(err)) from None
    service.serve(
        Path(args.root),
        kubernetes_authorizer(),
        host=args.host,
        port=args.port,
        tls=tls,
        limits=service.Limits(args.max_upload_bytes, args.max_snapshot_bytes),
    )
    return 0
