"""The Helm chart's operator credentials for the tests' in-process operator.

The integration and node tiers run the operator in the tests' own process. It never runs
as the tests' admin: :func:`operator_client` renders the chart's operator RBAC (its
ServiceAccount, ClusterRole and ClusterRoleBinding, default values: cluster-wide) from
``charts/torchyard`` with the harness's helm (``binaries.TOOLS["helm"]``), applies it to
the session's control plane, mints a token of that ServiceAccount (TokenRequest) and
gives back a ``k8s.Client`` of its own with it, which ``tests.conftest``'s
``InProcessOperator`` hands to ``controller.operators.run``. The tests keep the shared
admin client (``k8s.get`` ...). So a path of the operator that needs a permission the
chart does not grant is refused by the apiserver, and :class:`RefusalsLogged` logs every
such refusal at ERROR (the operator retries some, and records Events at best effort), so
that the guard of tests/integration/operator_errors.py fails the test that caused it.

Also the chart's helm (:class:`Helm`) and :func:`operator_rbac`, which
tests/integration/test_chart.py, test_rbac.py and the node tier use.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from tests.cluster import binaries
from tests.cluster.harness import Cluster
from torchyard import k8s

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "torchyard"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
# The session's release of the chart's operator RBAC (its objects are named
# "<release>-torchyard-operator"), in a namespace of its own.
RELEASE = "session"
NAMESPACE = "torchyard-session"
SERVICE_ACCOUNT = f"{RELEASE}-torchyard-operator"
# Where the refusals are logged (a torchyard logger: the error guard keeps its records).
REFUSALS = logging.getLogger("torchyard.rbac")
# The authorizer's refusal (RBAC: 'User "system:serviceaccount:NS:SA" cannot list resource
# "pods" in API group "" at the cluster scope'); other 403s come from admission (a
# namespace being deleted refuses new objects, Pod Security refuses a Pod), which the
# operator handles as it does with any credentials.
UNAUTHORIZED = re.compile(r'User "[^"]*" cannot \S+ (resource|path) ')


class Helm:
    """The helm binary with its own config/cache folders (nothing written to $HOME)."""

    def __init__(self, home: Path) -> None:
        self.binary = str(binaries.TOOLS["helm"].path("helm"))
        self.env = dict(
            os.environ,
            HELM_CACHE_HOME=str(home / "cache"),
            HELM_CONFIG_HOME=str(home / "config"),
            HELM_DATA_HOME=str(home / "data"),
        )

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.binary, *args], capture_output=True, text=True, env=self.env, timeout=120
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
        return result

    def template(self, *args: str, namespace: str = "torchyard-system") -> list[dict[str, Any]]:
        out = self("template", "t", str(CHART), "--namespace", namespace, *args).stdout
        return [d for d in yaml.safe_load_all(out) if d]


def operator_rbac(helm: Helm, release: str, namespace: str, *values: str) -> list[dict[str, Any]]:
    """The chart's operator ServiceAccount and (Cluster)Roles and bindings, as rendered."""
    out = helm("template", release, str(CHART), "--namespace", namespace, *values).stdout
    return [
        d
        for d in yaml.safe_load_all(out)
        if d
        and d["kind"] in RBAC_KINDS
        and d["metadata"]["labels"].get("app.kubernetes.io/component") == "operator"
    ]


def apply_operator_rbac(cluster: Cluster, helm: Helm, *values: str) -> list[dict[str, Any]]:
    """The session release's operator RBAC, rendered with ``values`` and applied (a test
    that sets ``rbac.pushSecretNamespaces`` for its namespace adds that Role so)."""
    docs = operator_rbac(helm, RELEASE, NAMESPACE, *values)
    rendered = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    cluster.kubectl("apply", "--server-side", "-f", "-", input=rendered)
    return docs


def read_push_secrets(cluster: Cluster, namespace: str, home: Path) -> None:
    """The chart's ``rbac.pushSecretNamespaces`` naming ``namespace``, as an install whose
    Environments push with a ``registry.pushSecret`` there must: the session's operator
    may then get that namespace's Secrets (a Role; the namespace's deletion takes it)."""
    apply_operator_rbac(cluster, Helm(home), "--set", f"rbac.pushSecretNamespaces={{{namespace}}}")


def service_account_kubeconfig(
    cluster: Cluster, namespace: str, name: str, path: Path, seconds: int = 3600
) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount itself (a TokenRequest token),
    not as an admin impersonating it."""
    token = k8s.request_token(namespace, name, [], seconds=seconds)
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": admin["clusters"],
                "users": [{"name": name, "user": {"token": token}}],
                "contexts": [
                    {
                        "name": name,
                        "context": {
                            "cluster": admin["clusters"][0]["name"],
                            "user": name,
                            "namespace": namespace,
                        },
                    }
                ],
                "current-context": name,
            }
        )
    )
    return path


class RefusalsLogged(ApiClient):
    """The operator's client in the tests: each answer 403 (Forbidden) of the authorizer
    is logged at ERROR on ``torchyard.rbac`` before the operator sees it."""

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        try:
            response = super().call_api(method, url, *args, **kwargs)
        except ApiException as exc:
            if exc.status == 403:
                _refused(method, url, str(exc.body))
            raise
        if response.status == 403:
            body: bytes = response.read()  # (kept: the caller reads it again)
            _refused(method, url, body.decode(errors="replace"))
        return response


def forbidden_lines(log: str) -> list[str]:
    """Lines of an operator process's log that say the apiserver refused it something. A
    namespace another test deleted refuses new Events for a while ("being terminated"):
    not RBAC. A 403 inside a longer number (a random port such as 54403) is no refusal."""
    return [
        line
        for line in log.splitlines()
        if (re.search(r"(?<!\d)403(?!\d)", line) or "forbidden" in line.lower())
        and "being terminated" not in line
    ]


@contextlib.contextmanager
def namespaced_operator(
    cluster: Cluster, namespace: str, workdir: Path, *values: str
) -> Iterator[Path]:
    """A kubeconfig of the chart's operator ServiceAccount of a release in ``namespace``
    that watches only it (``watchNamespaces``; ``values`` add to them), its RBAC applied,
    for ``python -m torchyard.controller --namespace NAMESPACE`` (a process of its own);
    the release's cluster-wide objects are deleted on the way out."""
    release = f"p{namespace[-4:]}"
    workdir.mkdir(parents=True, exist_ok=True)
    helm = Helm(workdir / "helm")
    watched = ("--set", f"watchNamespaces={{{namespace}}}")
    docs = operator_rbac(helm, release, namespace, *watched, *values)
    rendered = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    cluster.kubectl("apply", "--server-side", "-f", "-", input=rendered)
    account = f"{release}-torchyard-operator"
    path = service_account_kubeconfig(cluster, namespace, account, workdir / "kubeconfig")
    _wait_bound(cluster, path, "create", "pods", "-n", namespace)
    try:
        yield path
    finally:
        for kind in ("clusterrolebinding", "clusterrole"):
            cluster.kubectl("delete", kind, account, "--ignore-not-found")


def _wait_bound(cluster: Cluster, kubeconfig: Path, *can_i: str) -> None:
    """Until the apiserver's authorizer (fed by a watch) has the new binding."""

    def bound() -> bool:
        out = cluster.kubectl("--kubeconfig", str(kubeconfig), "auth", "can-i", *can_i, check=False)
        return out.split()[:1] == ["yes"]

    cluster.wait_for(f"the operator's RBAC ({' '.join(can_i)})", bound, 30)


def _refused(method: str, url: str, body: str) -> None:
    try:
        message = json.loads(body).get("message", body)
    except ValueError:
        message = body
    if not UNAUTHORIZED.search(str(message)):
        return
    REFUSALS.error(
        "the apiserver refused the operator (the chart's RBAC): %s %s: %s",
        method,
        url.split("://", 1)[-1].partition("/")[2],
        message,
    )


def operator_client(cluster: Cluster, workdir: Path) -> k8s.Client:
    """The chart's operator ServiceAccount, with its RBAC applied to ``cluster``: a client
    of its own that authenticates as it (a token valid for a day: the whole session)."""
    binaries.build(binaries.TOOLS["helm"], log=False)
    workdir.mkdir(parents=True, exist_ok=True)
    helm = Helm(workdir / "helm")
    cluster.create_namespace(NAMESPACE)
    apply_operator_rbac(cluster, helm)
    path = service_account_kubeconfig(
        cluster, NAMESPACE, SERVICE_ACCOUNT, workdir / "kubeconfig", seconds=86400
    )
    _wait_bound(cluster, path, "list", "pods", "-A")
    own = k8s.configure(str(path))
    return k8s.Client(RefusalsLogged(configuration=own.configuration))
