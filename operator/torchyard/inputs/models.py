"""The ``model://<name>/<version>`` scheme: a ModelVersion of the torchyard registry.

The fetch reads the version's manifest from the registry service
(TORCHYARD_REGISTRY_URL, over https verified with TORCHYARD_REGISTRY_CA) with the
registry token of the reading ServiceAccount (TORCHYARD_REGISTRY_TOKEN_FILE: a projected
token for the registry's audience, never one for the Kubernetes API), then each file the
patterns keep, checked against its sha256. A file that is whole is not fetched again
after a killed fetch; a partial one is resumed with a Range request. Standard library
only; tested against a real registry service in tests/unit/inputs/test_models.py.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from torchyard.inputs import archives, patterns, transfer
from torchyard.inputs.base import (
    DNS1123_LABEL,
    FetchPod,
    InputError,
    InputScheme,
    RegistryService,
    Source,
)
from torchyard.inputs.cache import DATA, sha256_file
from torchyard.launch.contract import (
    TORCHYARD_NAMESPACE,
    TORCHYARD_REGISTRY_CA,
    TORCHYARD_REGISTRY_TOKEN_FILE,
    TORCHYARD_REGISTRY_URL,
)
from torchyard.variants import Rule

_MODEL = re.compile(r"^model://(" + DNS1123_LABEL + r")(?:/([1-9][0-9]{0,8}))?$")
# The registry token of the reading ServiceAccount, in the fetch Pod
TOKEN_DIR = "/var/run/secrets/torchyard/registry"
REVISION_RULE = (
    "revision is a model:// input's version, when its uri has none (model://birds with "
    "revision '3' is model://birds/3); an https input is pinned by sha256"
)


def model_of(uri: str) -> tuple[str, str]:
    """(model, version) of a model:// URI, the version '' when it names none (the
    latest, which the operator or local mode pins before the fetch); InputError when it
    is not one."""
    match = _MODEL.match(uri)
    if match is None:
        raise InputError(
            f"{uri!r} is not a model input: write model://<model>[/<version>], the model's "
            "name as registered (a DNS-1123 label) and a version number (e.g. model://birds/3; "
            "none: the latest)"
        )
    return match.group(1), match.group(3) or ""


def _context(env: Mapping[str, str]) -> ssl.SSLContext | None:
    pem = env.get(TORCHYARD_REGISTRY_CA, "")
    return ssl.create_default_context(cadata=pem) if pem.strip() else None


def _token(env: Mapping[str, str], uri: str) -> str:
    path = env.get(TORCHYARD_REGISTRY_TOKEN_FILE, "")
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as err:
        raise InputError(f"{uri}: no registry token to read the model with ({err})") from None


def _manifest(base: str, headers: Mapping[str, str], ctx: Any, source: Source, ns: str) -> Any:
    model, version = model_of(source.uri)
    request = urllib.request.Request(base, headers=dict(headers))
    try:
        with urllib.request.urlopen(request, timeout=transfer.TIMEOUT_SECONDS, context=ctx) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as err:
        fix = {
            404: f"model {model} has no version {version} in namespace {ns} "
            "(torchyard models list)",
            401: "the registry does not take the token",
            403: f"the run's ServiceAccount may not read models in {ns}: grant it get on "
            "modelversions",
        }.get(err.code, transfer.advice(err.code))
        raise InputError(f"{source.uri}: HTTP {err.code} {err.reason}: {fix}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise InputError(f"{source.uri}: cannot read the registry service ({err})") from None


def fetch(source: Source, staging: str, env: Mapping[str, str], max_bytes: int) -> int:
    """Fill ``staging/data`` with the version's files; the bytes received."""
    url = env.get(TORCHYARD_REGISTRY_URL, "").rstrip("/")
    if not url:
        raise InputError(
            f"{source.uri}: this cluster has no model registry service to read it from"
        )
    ns = env.get(TORCHYARD_NAMESPACE, "default")
    model, version = model_of(source.uri)
    if not version:
        raise InputError(
            f"{source.uri} names no version: the operator pins a model:// input to the "
            "model's latest version before its fetch"
        )
    base = f"{url}/v1/namespaces/{ns}/models/{model}/versions/{version}"
    headers = {"Authorization": "Bearer " + _token(env, source.uri)}
    ctx = _context(env)
    manifest = _manifest(base, headers, ctx, source, ns)
    files = [
        (archives.member_path(str(f["path"])), int(f["size"]), str(f["sha256"]))
        for f in manifest.get("files") or []
    ]
    kept = [f for f in files if f[0] and patterns.included(f[0], source.include, source.exclude)]
    if sum(size for _, size, _ in kept) > max_bytes:
        raise InputError(
            f"{source.uri} is {sum(s for _, s, _ in kept)} bytes, over the inputs cache's "
            f"limit of {max_bytes} bytes: narrow it with include patterns or ask for a "
            "larger cache"
        )
    received = 0
    for path, size, sha256 in kept:
        target = os.path.join(staging, DATA, path)
        if os.path.isfile(target) and os.path.getsize(target) == size:
            if sha256_file(target) == sha256:
                continue  # whole from a fetch that was killed after it
            os.unlink(target)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        quoted = urllib.parse.quote(path)
        received += transfer.download(
            f"{base}/files/{quoted}", target, max_bytes, headers, ctx, f"{source.uri} ({path})"
        )
        got = sha256_file(target)
        if got != sha256:
            os.unlink(target)
            raise InputError(
                f"{source.uri} ({path}): its sha256 is {got}, the manifest says {sha256}: "
                "the registry's copy is damaged (torchyard models verify)"
            )
    return received


class ModelScheme(InputScheme):
    """``model://<name>[/<version>]``: a ModelVersion of the torchyard registry, read with
    the run's ServiceAccount (part of the key); no version: the latest, pinned before the
    fetch (``revision``)."""

    TYPE = "model"
    SUMMARY = (
        "model://<model>[/<version>] (a ModelVersion of the model registry, read with the "
        "run's ServiceAccount; no version: the latest when the run is prepared)"
    )
    FORM = "model://<model>/<version>"
    PATTERN = "model://" + DNS1123_LABEL + "(/[1-9][0-9]{0,8})?"
    READS_REGISTRY = True
    RULES = (
        Rule(
            {
                "rule": "!has(self.revision) || self.uri.matches(r'^model://[^/]+$')",
                "message": REVISION_RULE,
                "fieldPath": ".revision",
            },
            lambda i: i.revision is None or (i.scheme == "model" and i.uri.count("/") == 2),
        ),
    )

    def check(self, uri: str, sha256: str) -> None:
        model_of(uri)

    def fetch(self, source: Source, staging: str, env: Mapping[str, str], max_bytes: int) -> int:
        return fetch(source, staging, env, max_bytes)

    def revision(self, source: Source) -> str:
        return model_of(source.uri)[1]

    def key_parts(self, source: Source) -> dict[str, str]:
        return {"reader": source.reader}

    def unversioned(self, uri: str) -> bool:
        return not model_of(uri)[1]

    def fetch_pod(self, source: Source, namespace: str, registry: RegistryService) -> FetchPod:
        """The registry's address and the reader's registry token (for the registry's
        audience only), and the reader's ServiceAccount."""
        env = [
            {"name": TORCHYARD_REGISTRY_URL, "value": registry.url},
            {"name": TORCHYARD_NAMESPACE, "value": namespace},
            {"name": TORCHYARD_REGISTRY_TOKEN_FILE, "value": f"{TOKEN_DIR}/token"},
        ]
        if registry.ca:
            env.append({"name": TORCHYARD_REGISTRY_CA, "value": registry.ca})
        token = {"audience": registry.audience, "expirationSeconds": 3600, "path": "token"}
        return FetchPod(
            env=tuple(env),
            mounts=({"name": "registry-token", "mountPath": TOKEN_DIR, "readOnly": True},),
            volumes=(
                {
                    "name": "registry-token",
                    "projected": {"sources": [{"serviceAccountToken": token}]},
                },
            ),
            service_account=source.reader,
        )
