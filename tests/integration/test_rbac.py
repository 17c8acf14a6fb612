"""RBAC proved sufficient: the happy path (a curated Environment, a 2-node TrainingRun
that KWOK runs to success, and a one-trial Sweep that makes its trial and names it best)
with the operator authenticated as the chart's ServiceAccount
and nothing else, cluster-wide and namespaced.

The chart's ServiceAccount and operator (Cluster)Roles are rendered by Helm and applied;
the operator runs as ``python -m torchyard.controller`` in a process of its own, with a
kubeconfig that holds a TokenRequest token of that ServiceAccount (it IS the
ServiceAccount, not an admin impersonating it), with ``--namespace`` in the namespaced
mode. The session's in-process operator (the chart's ServiceAccount too, cluster-wide:
``tests/cluster/chart.py``) is stopped meanwhile, so the run can only have been driven by
the process. That the session's operator has the chart's RBAC and no more is proved last.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.builders import SweepBuilder, TrainingRunBuilder, environment
from tests.cluster import binaries, chart
from tests.cluster.chart import Helm, operator_rbac, service_account_kubeconfig
from tests.cluster.harness import Cluster, free_port
from tests.cluster.registry import OciRegistry
from tests.conftest import InProcessOperator
from tests.integration.helpers import (
    OperatorProcess,
    finish_pod,
    run_pods,
    sample,
    scrape,
    wait_event,
    wait_for,
    wait_status,
)
from tests.integration.test_envbuild import push_base_image
from torchyard import api, k8s
from torchyard.planning import environments
from torchyard.planning import shipped as shipped_names


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    binaries.build(binaries.TOOLS["helm"])
    return Helm(tmp_path_factory.mktemp("helm"))


def happy_path(cluster: Cluster, ns: str, metrics_port: int) -> dict[str, Any]:
    """A curated Environment and a 2-node run that KWOK finishes: the Succeeded run."""
    k8s.create(environment("pytorch", ns, image="ghcr.io/acme/pytorch:2.15-cuda12"))
    wait_status(k8s.ENVIRONMENTS, ns, "pytorch", lambda s: s.get("phase") == "Ready", timeout=90)
    run = TrainingRunBuilder("happy", ns).environment("pytorch").nodes(2).gpus(1).pool("a100")
    k8s.create(run.obj())
    wait_status(
        k8s.TRAININGRUNS,
        ns,
        "happy",
        lambda s: s.get("phase") == "Running" and s["nodes"]["running"] == 2,
        timeout=60,
    )
    for pod in run_pods(ns, "happy"):
        finish_pod(cluster, ns, pod["metadata"]["name"], 0)
    done = wait_status(
        k8s.TRAININGRUNS, ns, "happy", lambda s: s.get("phase") == "Succeeded", timeout=60
    )
    # The restricted operator's own metrics and Events, too.
    page = scrape(f"http://127.0.0.1:{metrics_port}/metrics")
    assert sample(page, "torchyard_pods_created_total", namespace=ns) == 2
    wait_event(
        ns,
        "happy",
        "the restricted operator's Succeeded Event",
        lambda e: e["reason"] == "Succeeded" and e.get("reportingComponent") == k8s.FIELD_MANAGER,
    )
    tuned = one_trial_sweep(cluster, ns)
    assert tuned["status"]["best"]["name"] == "tune-t0"
    return done


def one_trial_sweep(cluster: Cluster, ns: str) -> dict[str, Any]:
    """A Sweep of one trial: its trial TrainingRun and ledger made, its status written."""
    trial = TrainingRunBuilder("t").environment("pytorch").gpus(1).pool("a100")
    k8s.create(SweepBuilder("tune", ns).trial(trial).trials(1, 1).seed(1).obj())
    wait_status(k8s.SWEEPS, ns, "tune", lambda s: s.get("trials", {}).get("created") == 1)
    wait_status(k8s.TRAININGRUNS, ns, "tune-t0", lambda s: s.get("phase") == "Running", 60)
    progress = {"step": 1, "metrics": {"best_val_acc": 0.9}}
    finish_pod(cluster, ns, "tune-t0-0", 0, json.dumps({"progress": progress}))
    return wait_status(k8s.SWEEPS, ns, "tune", lambda s: s.get("phase") == "Succeeded", timeout=60)


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_the_happy_path_runs_with_only_the_charts_service_account(
    cluster: Cluster,
    helm: Helm,
    namespace: str,
    stopped_operator: None,
    tmp_path: Path,
    mode: str,
) -> None:
    ns, release = namespace, f"rbac-{namespace[-4:]}"
    values = ["--set", f"watchNamespaces={{{ns}}}"] if mode == "namespaced" else []
    docs = operator_rbac(helm, release, ns, *values)
    kinds = sorted(d["kind"] for d in docs)
    expected = ["ClusterRole", "ClusterRoleBinding", "ServiceAccount"]
    assert kinds == sorted(expected + (["Role", "RoleBinding"] if values else []))
    rendered = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    cluster.kubectl("apply", "--server-side", "-f", "-", input=rendered)
    sa = f"{release}-torchyard-operator"
    kubeconfig = service_account_kubeconfig(cluster, ns, sa, tmp_path / "kubeconfig")
    port = free_port()
    args = ["--metrics-port", str(port)] + (["--namespace", ns] if values else [])
    try:
        with OperatorProcess(kubeconfig, tmp_path / "operator.log", *args) as proc:
            try:
                run = happy_path(cluster, ns, port)
            except AssertionError as err:
                raise AssertionError(f"{err}\n--- operator log:\n{proc.text()[-4000:]}") from None
            assert proc.process.poll() is None, proc.text()
        assert proc.process.returncode == 0, proc.text()[-3000:]  # a graceful stop
    finally:
        for kind in ("clusterrolebinding", "clusterrole"):
            cluster.kubectl("delete", kind, sa, "--ignore-not-found")
    log = proc.text()
    assert chart.forbidden_lines(log) == [], "\n".join(chart.forbidden_lines(log))
    [manager] = [m for m in run["metadata"]["managedFields"] if m["manager"] == k8s.FIELD_MANAGER]
    assert manager["subresource"] == "status"
    # the launcher's ConfigMap, applied by that ServiceAccount before the node Pods
    [shipped] = [
        c
        for c in k8s.list_(k8s.CONFIGMAPS, ns)
        if c["metadata"]["name"].startswith(shipped_names.NAME_PREFIX)
    ]
    [writer] = [m for m in shipped["metadata"]["managedFields"] if m["operation"] == "Apply"]
    assert writer["manager"] == k8s.FIELD_MANAGER


def _secret_mounting_pod(namespace: str) -> str:
    """A Pod that would print a Secret of its namespace (held back from scheduling)."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "reads-a-secret", "namespace": namespace},
            "spec": {
                "schedulingGates": [{"name": "torchyard.dev/test"}],
                "containers": [
                    {
                        "name": "cat",
                        "image": "busybox",
                        "command": ["cat", "/secret/password"],
                        "volumeMounts": [{"name": "s", "mountPath": "/secret"}],
                    }
                ],
                "volumes": [{"name": "s", "secret": {"secretName": "db-password"}}],
            },
        }
    )


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_creating_pods_is_reading_the_secrets_of_those_namespaces(
    cluster: Cluster, helm: Helm, namespace: str, tmp_path: Path, mode: str
) -> None:
    """What the chart's RBAC comment says, proved: the operator may not `get` a Secret,
    yet may create a Pod that mounts it, in every namespace unless watchNamespaces
    narrows that to the listed ones (the recommended production setting)."""
    ns, release = namespace, f"rbac-{namespace[-4:]}"
    other = cluster.create_namespace(f"{ns[:50]}-other")
    values = ["--set", f"watchNamespaces={{{ns}}}"] if mode == "namespaced" else []
    rendered = json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": operator_rbac(helm, release, ns, *values)}
    )
    cluster.kubectl("apply", "--server-side", "-f", "-", input=rendered)
    sa = f"{release}-torchyard-operator"
    kubeconfig = service_account_kubeconfig(cluster, ns, sa, tmp_path / "kubeconfig")
    try:
        for where in (ns, other):
            k8s.create(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "db-password", "namespace": where},
                    "stringData": {"password": "hunter2"},
                }
            )

        def as_operator(*args: str, input: str | None = None) -> str:
            return cluster.kubectl("--kubeconfig", str(kubeconfig), *args, input=input, check=False)

        def can_create_the_pod(where: str) -> bool:
            out = as_operator(
                "create", "--dry-run=server", "-f", "-", input=_secret_mounting_pod(where)
            )
            return "created (server dry run)" in out

        # The bindings are in place once the operator may create Pods where it works.
        cluster.wait_for("the operator's RBAC", lambda: can_create_the_pod(ns), 30)
        # No `get` on Secrets cluster-wide (a watched namespace's Role has it, for
        # registry.pushSecret), yet a Pod that mounts one is allowed wherever the operator
        # may create Pods: every namespace unless watchNamespaces narrows it.
        watched = mode == "namespaced"
        assert ("forbidden" in as_operator("get", "secret", "db-password", "-n", ns).lower()) is (
            not watched
        )
        assert "forbidden" in as_operator("get", "secret", "db-password", "-n", other).lower()
        assert can_create_the_pod(other) is (not watched)
    finally:
        for kind in ("clusterrolebinding", "clusterrole"):
            cluster.kubectl("delete", kind, sa, "--ignore-not-found")
        cluster.delete_namespace(other)


@pytest.mark.expected_operator_errors(
    r'cannot get resource "secrets"',
    reason="the chart grants no get on Secrets outside rbac.pushSecretNamespaces until the "
    "test adds this namespace",
)
def test_the_in_process_operator_has_the_charts_rbac_and_no_more(
    cluster: Cluster,
    oci_registry: OciRegistry,
    operator: InProcessOperator,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    """The session's operator (``tests/cluster/chart.py``) is the chart's ServiceAccount,
    not the tests' admin: an Environment's registry.pushSecret is refused to it until the
    chart's values name the namespace in rbac.pushSecretNamespaces, as they must in a
    real install; then the same Environment gets Ready."""
    ns = namespace
    k8s.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": "push", "namespace": ns},
            "stringData": {".dockerconfigjson": json.dumps({"auths": {}})},
        }
    )
    registry = {"repository": f"{oci_registry.host}/envs", "insecure": True, "pushSecret": "push"}
    body = environment("pushed", ns, baseImage="python:3.11-slim", pip=["six"], registry=registry)
    hash_ = environments.content_hash(api.parse_environment(body))
    push_base_image(oci_registry, "envs", environments.image_tag(hash_))
    k8s.create(body)

    def refused() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == chart.REFUSALS.name and f'namespace "{ns}"' in r.getMessage()
        ]

    [first, *_] = wait_for("the operator's get of the Secret refused", refused)
    assert f'"system:serviceaccount:{chart.NAMESPACE}:{chart.SERVICE_ACCOUNT}"' in first
    assert k8s.get(k8s.ENVIRONMENTS, ns, "pushed").get("status", {}).get("phase") != "Ready"
    chart.read_push_secrets(cluster, ns, tmp_path)
    k8s.apply(  # an event, so that the operator reconciles it at once (not after backoff)
        {
            "apiVersion": f"{api.GROUP}/{api.VERSION}",
            "kind": "Environment",
            "metadata": {"name": "pushed", "namespace": ns, "labels": {"granted": "yes"}},
        },
        field_manager="test",
    )
    env = wait_status(k8s.ENVIRONMENTS, ns, "pushed", lambda s: s.get("phase") == "Ready")
    assert env["status"]["image"].startswith(f"{oci_registry.host}/envs@sha256:")
