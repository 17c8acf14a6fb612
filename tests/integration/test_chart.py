"""The Helm chart against Helm itself (built from Go modules like the control plane) and
a real apiserver: it lints, its schema refuses bad values, its rendering is accepted by
``kubectl apply --dry-run=server``, it installs into a Pod Security "restricted"
namespace, its RBAC grants the operator exactly what torchyard's code calls (checked by
SubjectAccessReview), and the Argo CD health checks judge real status objects that the
in-process operator wrote.

The cluster's harness has applied torchyard's CRDs already: ``helm install`` skips the
chart's copies of them (Helm never overwrites an existing CRD) and installs only Kopf's
peering CRDs, which the peering test uses.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import TrainingRunBuilder, environment, model_version
from tests.cluster import binaries
from tests.cluster.chart import CHART, REPO, Helm
from tests.cluster.harness import Cluster
from tests.conftest import InProcessOperator
from tests.integration.helpers import finish_pod, launcher_message, run_pods, wait_for, wait_status
from tests.unit.test_chart import health
from torchyard import k8s
from torchyard.controller import options
from torchyard.launch import contract

# What torchyard's code and Kopf call, per (API group, resource): the operator's
# ClusterRole in cluster-wide mode must grant exactly this, nothing more.
OPERATOR_NEEDS: dict[tuple[str, str], set[str]] = {
    # Kopf watches them; workqueue.reconcile_key gets them; environments.reconcile lists runs,
    # sweeps.reconcile a Sweep's trials; sweeps.reconcile applies (makes, and suspends) them.
    ("torchyard.dev", "trainingruns"): {"get", "list", "watch", "create", "patch"},
    ("torchyard.dev", "sweeps"): {"get", "list", "watch"},
    ("torchyard.dev", "environments"): {"get", "list", "watch"},
    # Kopf watches them; endpoints.reconcile; environments.reconcile and the inputs cache's
    # eviction (inputs._pinned) list them.
    ("torchyard.dev", "onlineendpoints"): {"get", "list", "watch"},
    ("torchyard.dev", "onlineendpoints/status"): {"patch"},
    ("torchyard.dev", "onlineendpoints/finalizers"): {"update"},
    # endpoints.reconcile: serving Deployments (Kopf watches them), the autoscaler, and
    # KServe's InferenceService (backend KServe); the Service of each is applied, another
    # backend's deleted.
    ("apps", "deployments"): {"list", "watch", "create", "patch", "delete"},
    ("autoscaling", "horizontalpodautoscalers"): {"list", "create", "patch", "delete"},
    ("serving.kserve.io", "inferenceservices"): {"list", "create", "patch", "delete"},
    # context.write: server-side apply of the status subresource.
    ("torchyard.dev", "trainingruns/status"): {"patch"},
    ("torchyard.dev", "sweeps/status"): {"patch"},
    ("torchyard.dev", "environments/status"): {"patch"},
    # finalize.register: the new ModelVersion's Available condition.
    ("torchyard.dev", "modelversions/status"): {"patch"},
    # owner references with blockOwnerDeletion (planning.pods.owner_reference,
    # planning.sweeps.owner_reference).
    ("torchyard.dev", "trainingruns/finalizers"): {"update"},
    ("torchyard.dev", "sweeps/finalizers"): {"update"},
    # finalize.register: server-side apply creates the ModelVersion.
    ("torchyard.dev", "modelversions"): {"create", "list", "patch"},  # list: model:// latest
    # recording: the registry asks SubjectAccessReview whether the writer of a run record
    # may create runrecords (no object has this resource).
    ("torchyard.dev", "runrecords"): {"create"},
    # node Pods: applied, listed (per run, cluster-wide for admission), watched, deleted.
    ("", "pods"): {"list", "watch", "create", "patch", "delete"},
    ("", "services"): {"get", "list", "create", "patch", "delete"},
    # mpi_keys.ensure: an MPI run's key Secret, created once and never read back.
    ("", "secrets"): {"create"},
    # checkpoints: a run's own checkpoint claim, applied before its Pods; a named one
    # looked up (references.missing).
    ("", "persistentvolumeclaims"): {"get", "create", "patch"},
    # controller.progress: the tail of a running node Pod's log, read at most every 10 s.
    ("", "pods/log"): {"get"},
    # applied: an Environment build's recipe, the launcher's ConfigMap of node Pods and a
    # Sweep's ledger (read back); a run's source.configMap looked up (references.missing);
    # the inputs cache's index, one entry each: listed, applied, deleted on eviction (inputs)
    ("", "configmaps"): {"get", "list", "create", "patch", "delete"},
    # references.missing: a run's scheduling.queueName, Kueue's LocalQueue
    ("kueue.x-k8s.io", "localqueues"): {"get"},
    # controller.workloads: a queued run's Workload, created, read, watched by Kopf,
    # deactivated while suspended, adopted on a MultiKueue worker; its status written
    # (Finished, the admission cleared after an eviction)
    ("kueue.x-k8s.io", "workloads"): {"get", "list", "watch", "create", "patch"},
    ("kueue.x-k8s.io", "workloads/status"): {"patch"},
    # record_event; recording.events_of: a run's own Events, into its record.
    ("", "events"): {"create", "list"},
    # Environment build and inputs fetch Jobs; a fetch Job that failed before a new run
    # asked is deleted to try again (inputs.prepare)
    ("batch", "jobs"): {"get", "list", "watch", "create", "patch", "delete"},
    # Kopf; references.missing: is Kueue installed (its LocalQueue CRD)
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
    # references.missing: a run's compute.priorityClassName (its Workload's priority)
    ("scheduling.k8s.io", "priorityclasses"): {"get"},
    # controller.workloads: the levels above a placement's, an admission's flavors
    ("kueue.x-k8s.io", "topologies"): {"get", "list", "watch"},
    ("kueue.x-k8s.io", "resourceflavors"): {"get", "list", "watch"},
    ("", "namespaces"): {"list", "watch"},
    ("", "nodes"): {"list", "watch"},
}
CLUSTER_SCOPED = (
    "customresourcedefinitions",
    "priorityclasses",
    "topologies",
    "resourceflavors",
    "namespaces",
    "nodes",
)
FORBIDDEN_VERBS = {"*", "escalate", "bind", "impersonate"}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Helm]:
    binaries.build(binaries.TOOLS["helm"])
    yield Helm(tmp_path_factory.mktemp("helm"))


def _rbac_rules(docs: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (d["kind"], d["metadata"]["name"], rule)
        for d in docs
        if d["kind"] in ("ClusterRole", "Role")
        for rule in d.get("rules", [])
    ]


def _grants(docs: list[dict[str, Any]], kind: str, name: str) -> dict[tuple[str, str], set[str]]:
    grants: dict[tuple[str, str], set[str]] = {}
    for k, n, rule in _rbac_rules(docs):
        if (k, n) == (kind, name):
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    grants.setdefault((group, resource), set()).update(rule["verbs"])
    return grants


# -- without a cluster -------------------------------------------------------------------


def test_helm_lint_passes_strictly(helm: Helm) -> None:
    result = helm("lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout
    for values in (
        ["--set", "watchNamespaces={team-a,team-b}", "--set", "operator.peering=true"],
        ["--set", "registry.enabled=false", "--set", "networkPolicy.enabled=true"],
        ["--set", "registry.tls.enabled=false", "--set", "networkPolicy.enabled=true"],
        ["--set", "registry.tls.existingSecret=mine", "--set", "networkPolicy.enabled=true"],
    ):
        helm("lint", "--strict", str(CHART), *values)


VALUE_SETS = {
    "defaults": [],
    "namespaced with peering": [
        "--set",
        "watchNamespaces={team-a,team-b}",
        "--set",
        "operator.peering=true",
        "--set",
        "operator.replicas=2",
        "--set",
        "rbac.pushSecretNamespaces={team-c}",
    ],
    "cluster-wide with peering and push secrets": [
        "--set",
        "operator.peering=true",
        "--set",
        "operator.replicas=2",
        "--set",
        "rbac.pushSecretNamespaces={team-a,team-b}",
        "--set",
        "registry.trainerNamespaces={team-a}",
    ],
    "with the web view": ["--set", "ui.enabled=true"],
}


def test_the_web_view_gets_reads_the_reviews_and_its_two_changes_only(helm: Helm) -> None:
    """``ui.enabled``: its ClusterRole is what ``torchyard.web`` calls (``web.source``,
    ``web.access``), and it reads run archives as itself with a registry token."""
    assert not [d for d in helm.template() if d["metadata"]["name"].endswith("-ui")]
    docs = helm.template("--set", "ui.enabled=true")
    assert _grants(docs, "ClusterRole", "t-torchyard-ui") == {
        ("torchyard.dev", "trainingruns"): {"get", "list", "patch"},
        ("torchyard.dev", "sweeps"): {"get", "list", "patch"},
        ("torchyard.dev", "environments"): {"get", "list"},
        ("torchyard.dev", "modelversions"): {"get", "list"},
        ("torchyard.dev", "onlineendpoints"): {"get", "list"},
        ("", "pods"): {"get", "list"},
        ("", "events"): {"get", "list"},
        ("", "configmaps"): {"get", "list"},
        ("", "nodes"): {"get", "list"},
        ("", "pods/log"): {"get"},
        ("authentication.k8s.io", "tokenreviews"): {"create"},
        ("authorization.k8s.io", "subjectaccessreviews"): {"create"},
    }
    ui = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "t-torchyard-ui"
    )
    args = ui["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["ui", "--in-cluster"]
    assert "https://torchyard-registry.torchyard-system.svc:8080" in args
    assert "--token-file" in args and "--registry-ca" in args


def _ui_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [ui] = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "t-torchyard-ui"
    ]
    return ui


def _ui(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """The web view's Pod spec, its container's args and its Service."""
    ui = _ui_deployment(docs)
    [svc] = [
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "t-torchyard-ui"
    ]
    pod = ui["spec"]["template"]["spec"]
    return pod, pod["containers"][0]["args"], svc


def _pairs(args: list[str], option: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == option]


def test_the_web_view_answers_its_services_names_signs_with_one_key_and_is_probed_on_healthz(
    helm: Helm,
) -> None:
    """Every replica mounts the same key (a Secret made once, or the caller's); the view
    answers its Service's names and ``ui.allowedHosts``, believes ``ui.trustedProxies``,
    serves TLS from ``ui.tls.secretName``; the kubelet probes ``/healthz``."""
    docs = helm.template("--set", "ui.enabled=true")
    pod, args, svc = _ui(docs)
    [key] = [
        d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "t-torchyard-ui-key"
    ]
    assert len(base64.b64decode(key["data"]["key"])) == 64
    assert _pairs(args, "--csrf-key-file") == ["/var/run/secrets/torchyard/ui-key/key"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "ui-key"]
    assert volume["secret"]["secretName"] == "t-torchyard-ui-key"
    # (a new key rolls the Pods onto it)
    annotations = _ui_deployment(docs)["spec"]["template"]["metadata"]["annotations"]
    checksum = hashlib.sha256(key["data"]["key"].encode()).hexdigest()
    assert annotations["checksum/ui-key"] == checksum
    names = "t-torchyard-ui", "torchyard-system", "svc", "cluster.local"
    assert _pairs(args, "--allowed-host") == [".".join(names[:n]) for n in range(1, 5)]
    assert _pairs(args, "--trusted-proxy") == [] and "--tls-cert" not in args
    container = pod["containers"][0]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http", "scheme": "HTTP"}
    docs = helm.template(
        "--set", "ui.enabled=true",
        "--set", "ui.allowedHosts={ui.example.com}",
        "--set", "ui.trustedProxies={10.0.0.0/8,192.168.1.1}",
        "--set", "ui.tls.secretName=ui-cert",
        "--set", "ui.keySecret=my-ui-key",
    )  # fmt: skip
    pod, args, svc = _ui(docs)
    assert not [d for d in docs if d["metadata"]["name"] == "t-torchyard-ui-key"]
    assert "annotations" not in _ui_deployment(docs)["spec"]["template"]["metadata"]
    assert _pairs(args, "--allowed-host")[-1] == "ui.example.com"
    assert _pairs(args, "--trusted-proxy") == ["10.0.0.0/8", "192.168.1.1"]
    assert _pairs(args, "--tls-cert") == ["/var/run/secrets/torchyard/ui-tls/tls.crt"]
    assert _pairs(args, "--tls-key") == ["/var/run/secrets/torchyard/ui-tls/tls.key"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets["ui-key"] == "my-ui-key" and secrets["ui-tls"] == "ui-cert"
    probe = pod["containers"][0]["readinessProbe"]["httpGet"]
    assert probe == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert svc["spec"]["ports"] == [{"name": "https", "port": 8080, "targetPort": "https"}]


def test_the_trainer_role_is_bound_to_the_service_accounts_node_pods_run_as(helm: Helm) -> None:
    """Node Pods run as the run's spec.serviceAccountName: the chart binds the trainer role
    to every ServiceAccount named in registry.trainerServiceAccounts (default: `default`)."""

    def subjects(*values: str) -> dict[str, list[str]]:
        docs = helm.template("--set", "registry.trainerNamespaces={team-a,team-b}", *values)
        return {
            d["metadata"]["namespace"]: [s["name"] for s in d["subjects"]]
            for d in docs
            if d["kind"] == "RoleBinding" and d["metadata"]["name"].endswith("-trainer")
        }

    assert subjects() == {"team-a": ["default"], "team-b": ["default"]}
    named = subjects("--set", "registry.trainerServiceAccounts={default,trainer}")
    assert named == {"team-a": ["default", "trainer"], "team-b": ["default", "trainer"]}
    refused = helm(
        "template",
        "t",
        str(CHART),
        "--set",
        "registry.trainerServiceAccounts={Not_A_Name}",
        check=False,
    )
    assert refused.returncode != 0 and "trainerServiceAccounts" in refused.stderr


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rbac_rule_is_explicit_and_no_clusterrole_reads_secrets(
    helm: Helm, values: list[str]
) -> None:
    docs = helm.template(*values)
    rules = _rbac_rules(docs)
    assert rules
    for kind, name, rule in rules:
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule.get(key, []), f"{kind} {name}: wildcard in {key}: {rule}"
        assert not FORBIDDEN_VERBS & set(rule["verbs"]), f"{kind} {name}: {rule}"
        if "secrets" in rule["resources"] and rule["verbs"] != ["create"]:  # create reads none
            assert kind == "Role", f"{kind} {name} grants Secrets: {rule}"
            assert rule["verbs"] == ["get"], rule
    # Every binding points at a role of the chart (no built-in admin/edit roles).
    roles = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"].endswith("Role")}
    for d in docs:
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            assert (d["roleRef"]["kind"], d["roleRef"]["name"]) in roles, d["roleRef"]


def test_the_cluster_wide_operator_gets_exactly_what_its_code_calls(helm: Helm) -> None:
    docs = helm.template()
    assert _grants(docs, "ClusterRole", "t-torchyard-operator") == OPERATOR_NEEDS
    assert not [d for d in docs if d["kind"] == "Role" and "operator" in d["metadata"]["name"]]
    assert _grants(docs, "ClusterRole", "t-torchyard-registry") == {
        ("authentication.k8s.io", "tokenreviews"): {"create"},
        ("authorization.k8s.io", "subjectaccessreviews"): {"create"},
        # ReviewAuthorizer.training_run: whose ServiceAccount may write a run's archive.
        ("torchyard.dev", "trainingruns"): {"get"},
    }


def test_a_namespaced_operator_gets_roles_in_its_namespaces_and_cluster_reads_only(
    helm: Helm,
) -> None:
    docs = helm.template("--set", "watchNamespaces={team-a,team-b}")
    cluster_wide = _grants(docs, "ClusterRole", "t-torchyard-operator")
    assert cluster_wide == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
        ("scheduling.k8s.io", "priorityclasses"): {"get"},
        ("kueue.x-k8s.io", "topologies"): {"get", "list", "watch"},
        ("kueue.x-k8s.io", "resourceflavors"): {"get", "list", "watch"},
        ("", "namespaces"): {"list", "watch"},
        ("", "nodes"): {"list", "watch"},
        ("", "pods"): {"list"},  # gang admission counts every Pod on the pool's nodes
    }
    namespaced_needs = {
        key: verbs for key, verbs in OPERATOR_NEEDS.items() if key[1] not in CLUSTER_SCOPED
    }
    for ns in ("team-a", "team-b"):
        role = next(
            d
            for d in docs
            if d["kind"] == "Role"
            and d["metadata"]["name"] == "t-torchyard-operator"
            and d["metadata"]["namespace"] == ns
        )
        assert _grants([role], "Role", "t-torchyard-operator") == {
            **namespaced_needs,
            ("", "secrets"): {"get", "create"},
        }
    operator = next(
        d for d in docs if d["kind"] == "Deployment" and "operator" in d["metadata"]["name"]
    )
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args


def test_pods_are_restricted_and_the_operator_gets_its_settings(helm: Helm) -> None:
    docs = helm.template()
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert set(deployments) == {"t-torchyard-operator", "t-torchyard-registry"}
    for deployment in deployments.values():
        spec = deployment["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 65532
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in spec["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    registry = deployments["t-torchyard-registry"]["spec"]["template"]["spec"]
    assert registry["securityContext"]["fsGroup"] == 65532
    assert registry["containers"][0]["args"] == [
        "registry",
        "serve",
        "--root",
        "/data",
        "--port",
        "8080",
        "--max-upload-bytes",  # registry.maxUploadBytes
        "20Gi",
        "--max-snapshot-bytes",  # registry.maxSnapshotBytes
        "1Gi",
        "--tls-cert",
        "/etc/torchyard/tls/tls.crt",
        "--tls-key",
        "/etc/torchyard/tls/tls.key",
    ]
    operator = deployments["t-torchyard-operator"]["spec"]["template"]["spec"]["containers"][0]
    assert operator["args"] == [
        "operator",
        "--liveness=http://0.0.0.0:8080/healthz",
        f"--default-log-limit-bytes={contract.LOG_LIMIT_BYTES}",  # the launcher's
    ]
    env = {e["name"]: e.get("value") for e in operator["env"]}
    assert env["TORCHYARD_METRICS_PORT"] == "9090"
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in operator["ports"]
    assert env["TORCHYARD_REGISTRY_URL"] == "https://torchyard-registry.torchyard-system.svc:8080"
    assert env["TORCHYARD_REGISTRY_TOKEN_FILE"] == "/var/run/secrets/torchyard/registry/token"
    assert env["TORCHYARD_INIT_IMAGE"] == "ghcr.io/torchyard/torchyard:0.1.0"
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    # The SDK's default registry service is torchyard-system/torchyard-registry:8080.
    assert services["torchyard-registry"]["spec"]["ports"][0]["port"] == 8080
    metrics = services["t-torchyard-metrics"]["spec"]
    assert metrics["ports"][0]["port"] == 9090
    assert metrics["selector"]["app.kubernetes.io/component"] == "operator"
    environments = [d for d in docs if d["kind"] == "Environment"]
    assert [(e["metadata"]["name"], e["metadata"]["namespace"]) for e in environments] == [
        ("pytorch-cpu", "torchyard-system"),
        ("pytorch-cuda", "torchyard-system"),
    ]
    assert not [d for d in docs if d["kind"] == "NetworkPolicy"]  # off by default


BAD_VALUES = {
    "replicas as a word": (["--set", "operator.replicas=two"], "/operator/replicas"),
    "unknown top-level key": (["--set", "replica=2"], "additional properties 'replica'"),
    "unknown access mode": (
        ["--set", "registry.persistence.accessMode=RWO"],
        "/registry/persistence/accessMode",
    ),
    "root user": (["--set", "operator.runAsUser=0"], "/operator/runAsUser"),
    "zero replicas": (["--set", "operator.replicas=0"], "/operator/replicas"),
    "registry with a scheme": (["--set", "imageRegistry=https://mirror.example"], "/imageRegistry"),
    "registry with a tag": (["--set", "imageRegistry=mirror.example/ml:1"], "/imageRegistry"),
    "a log limit too small for the dropped note": (
        ["--set", "operator.defaultLogLimitBytes=4095"],
        "/operator/defaultLogLimitBytes",
    ),
    "a log limit over 1 TiB": (
        ["--set", "operator.defaultLogLimitBytes=1099511627777"],
        "/operator/defaultLogLimitBytes",
    ),
    "a log limit as a quantity": (
        ["--set", "operator.defaultLogLimitBytes=64Mi"],
        "/operator/defaultLogLimitBytes",
    ),
}


def _image_refs(docs: list[dict[str, Any]]) -> dict[str, str]:
    """Every image the rendered chart names: containers, the operator's image settings,
    the curated Environments."""
    refs = {}
    for doc in docs:
        if doc["kind"] == "Environment":
            refs[f"Environment {doc['metadata']['name']}"] = doc["spec"]["image"]
        if doc["kind"] != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            refs[f"{doc['metadata']['name']} container"] = container["image"]
            for env in container.get("env", []):
                if env["name"].endswith("_IMAGE"):
                    refs[env["name"]] = env["value"]
    return refs


def test_image_registry_replaces_the_registry_of_every_image_the_chart_names(helm: Helm) -> None:
    default = _image_refs(helm.template())
    mirrored = _image_refs(helm.template("--set", "imageRegistry=mirror.example:5000/ml"))
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert default == {
        "t-torchyard-operator container": f"ghcr.io/torchyard/torchyard:{version}",
        "t-torchyard-registry container": f"ghcr.io/torchyard/torchyard:{version}",
        "TORCHYARD_INIT_IMAGE": f"ghcr.io/torchyard/torchyard:{version}",
        "TORCHYARD_GIT_IMAGE": "alpine/git:2.47.2",
        "Environment pytorch-cpu": "ghcr.io/torchyard/pytorch:2.15-cpu",
        "Environment pytorch-cuda": "ghcr.io/torchyard/pytorch:2.15-cuda13",
    }
    # a host (first part with a "." or ":") is replaced; a Docker Hub name gets one
    expected = {
        k: "mirror.example:5000/ml/" + v.removeprefix("ghcr.io/") for k, v in default.items()
    }
    assert mirrored == expected
    # an explicit initImage is mirrored too; a digest stays the digest
    digest = "sha256:" + "0" * 64
    pinned = _image_refs(
        helm.template(
            "--set", "imageRegistry=mirror.example",
            "--set", "operator.initImage=quay.io/acme/init:1",
            "--set", f"image.digest={digest}",
        )
    )  # fmt: skip
    assert pinned["TORCHYARD_INIT_IMAGE"] == "mirror.example/acme/init:1"
    assert (
        pinned["t-torchyard-operator container"] == f"mirror.example/torchyard/torchyard@{digest}"
    )


@pytest.mark.parametrize("value", ["4096", "1099511627776", "1048576"])
def test_the_default_log_limit_reaches_the_operator_as_whole_bytes(helm: Helm, value: str) -> None:
    """Helm holds numbers as floats: the flag gets the integer, never 1.048576e+06."""
    docs = helm.template("--set", f"operator.defaultLogLimitBytes={value}")
    operator = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-operator")
    )
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--default-log-limit-bytes={value}" in args
    assert options.log_limit(value) == int(value)  # what the operator's option takes


@pytest.mark.parametrize("values, error", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_bad_values_fail_with_a_schema_error(helm: Helm, values: list[str], error: str) -> None:
    result = helm("template", "t", str(CHART), *values, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert error in result.stderr, result.stderr


@pytest.mark.parametrize(
    "values, kind, name",
    [
        ([], "ClusterKopfPeering", "t-torchyard"),
        (["--set", "watchNamespaces={team-a}"], "KopfPeering", "t-torchyard"),
        (["--set", "operator.peeringName=ml.peering"], "ClusterKopfPeering", "ml.peering"),
    ],
    ids=["cluster-wide", "namespaced", "named"],
)
def test_peering_renders_one_name_for_the_flag_the_object_and_the_rbac(
    helm: Helm, values: list[str], kind: str, name: str
) -> None:
    docs = helm.template("--set", "operator.peering=true", "--set", "operator.replicas=2", *values)
    [peering] = [d for d in docs if d["apiVersion"] == "kopf.dev/v1"]
    assert (peering["kind"], peering["metadata"]["name"]) == (kind, name)
    operator = next(
        d for d in docs if d["kind"] == "Deployment" and "operator" in d["metadata"]["name"]
    )
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--peering-name={name}" in args and "--peering" not in args
    plural = kind.lower() + "s"
    patch_rules = [
        rule
        for _, _, rule in _rbac_rules(docs)
        if plural in rule["resources"] and "patch" in rule["verbs"]
    ]
    assert patch_rules and all(rule["resourceNames"] == [name] for rule in patch_rules)
    # Without peering: no peering object, no flag.
    plain = helm.template(*values)
    assert not [d for d in plain if d["apiVersion"] == "kopf.dev/v1"]


def test_two_replicas_without_peering_are_refused(helm: Helm) -> None:
    result = helm("template", "t", str(CHART), "--set", "operator.replicas=2", check=False)
    assert result.returncode != 0
    assert "operator.replicas > 1 needs operator.peering=true" in result.stderr


# -- the registry's TLS -------------------------------------------------------------------

CA_MOUNT = "/var/run/secrets/torchyard/registry-ca"


def _registry_parts(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The registry and operator containers and Pod specs, the registry Service, and the
    registry-client Role's proxy rule."""
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    registry = deployments["t-torchyard-registry"]["spec"]["template"]["spec"]
    operator = deployments["t-torchyard-operator"]["spec"]["template"]["spec"]
    [client] = [
        d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-client")
    ]
    [service] = [
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "torchyard-registry"
    ]
    return {
        "registry": registry,
        "operator": operator,
        "registry_container": registry["containers"][0],
        "operator_env": {e["name"]: e.get("value") for e in operator["containers"][0]["env"]},
        "service": service,
        "proxy_names": client["rules"][0]["resourceNames"],
    }


def _secret_volume(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    [volume] = [v for v in pod_spec["volumes"] if v["name"] == name]
    secret: dict[str, Any] = volume["secret"]
    return secret


def _openssl_verify(tmp_path: Path, ca: bytes, cert: bytes, host: str) -> str:
    (tmp_path / "ca.crt").write_bytes(ca)
    (tmp_path / "tls.crt").write_bytes(cert)
    done = subprocess.run(
        ["openssl", "verify", "-CAfile", "ca.crt", "-verify_hostname", host, "tls.crt"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    return done.stdout + done.stderr


def test_the_chart_generates_the_registry_certificate_by_default(
    helm: Helm, tmp_path: Path
) -> None:
    docs = helm.template()
    assert not [d for d in docs if d["apiVersion"].startswith("cert-manager.io/")]
    [secret] = [d for d in docs if d["kind"] == "Secret"]
    assert secret["metadata"]["name"] == "t-torchyard-registry-tls"
    assert secret["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert set(data) == {"ca.crt", "tls.crt", "tls.key"}
    for host in ("torchyard-registry.torchyard-system.svc", "localhost"):
        assert _openssl_verify(tmp_path, data["ca.crt"], data["tls.crt"], host).endswith(
            "tls.crt: OK\n"
        ), host
    # Refused for the one reason that counts: openssl that failed otherwise (missing, a
    # bad file) says something else.
    refused = _openssl_verify(tmp_path, data["ca.crt"], data["tls.crt"], "evil.example")
    assert "hostname mismatch" in refused and not refused.endswith("tls.crt: OK\n"), refused
    parts = _registry_parts(docs)
    # The registry serves HTTPS with the Secret's certificate and key (not the CA's key,
    # which the chart never writes anywhere).
    assert _secret_volume(parts["registry"], "tls") == {
        "secretName": "t-torchyard-registry-tls",
        "defaultMode": 0o440,
        "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}],
    }
    container = parts["registry_container"]
    assert {"name": "tls", "mountPath": "/etc/torchyard/tls", "readOnly": True} in container[
        "volumeMounts"
    ]
    assert container["ports"] == [{"name": "https", "containerPort": 8080, "protocol": "TCP"}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    assert parts["service"]["spec"]["ports"][0]["targetPort"] == "https"
    # The operator gets the CA only, verifies the registry with it and hands it on.
    assert _secret_volume(parts["operator"], "registry-ca") == {
        "secretName": "t-torchyard-registry-tls",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    assert parts["operator_env"]["TORCHYARD_REGISTRY_CA_FILE"] == f"{CA_MOUNT}/ca.crt"
    assert parts["operator_env"]["TORCHYARD_REGISTRY_URL"].startswith("https://")
    # Users' proxy path names the scheme: https:NAME:PORT.
    assert parts["proxy_names"] == ["https:torchyard-registry:8080"]


def test_an_existing_secret_is_used_as_it_is(helm: Helm) -> None:
    docs = helm.template("--set", "registry.tls.existingSecret=my-registry-tls")
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert not [d for d in docs if d["apiVersion"].startswith("cert-manager.io/")]
    parts = _registry_parts(docs)
    assert _secret_volume(parts["registry"], "tls")["secretName"] == "my-registry-tls"
    assert _secret_volume(parts["operator"], "registry-ca")["secretName"] == "my-registry-tls"


def test_cert_manager_issues_the_certificate_when_asked_and_present(helm: Helm) -> None:
    on = ["--set", "registry.tls.certManager.enabled=true"]
    # Without cert-manager's API the chart says what to do instead of failing on install.
    refused = helm("template", "t", str(CHART), *on, check=False)
    assert refused.returncode != 0
    assert "needs cert-manager (API cert-manager.io/v1)" in refused.stderr
    assert "registry.tls.certManager.enabled=false" in refused.stderr
    docs = helm.template(*on, "--api-versions", "cert-manager.io/v1")
    assert not [d for d in docs if d["kind"] == "Secret"]  # cert-manager writes it
    issued = {
        (d["kind"], d["metadata"]["name"]): d for d in docs if "cert-manager" in d["apiVersion"]
    }
    assert set(issued) == {
        ("Issuer", "t-torchyard-selfsigned"),
        ("Certificate", "t-torchyard-registry-ca"),
        ("Issuer", "t-torchyard-registry-ca"),
        ("Certificate", "t-torchyard-registry-tls"),
    }
    assert issued[("Certificate", "t-torchyard-registry-ca")]["spec"]["isCA"] is True
    serving = issued[("Certificate", "t-torchyard-registry-tls")]["spec"]
    assert serving["secretName"] == "t-torchyard-registry-tls"
    assert "torchyard-registry.torchyard-system.svc" in serving["dnsNames"]
    assert serving["issuerRef"] == {
        "name": "t-torchyard-registry-ca",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    assert _secret_volume(_registry_parts(docs)["registry"], "tls")["secretName"] == (
        "t-torchyard-registry-tls"
    )
    # An issuer of yours: only the serving Certificate.
    mine = helm.template(
        *on,
        "--api-versions",
        "cert-manager.io/v1",
        "--set",
        "registry.tls.certManager.issuerRef.name=corp-ca",
        "--set",
        "registry.tls.certManager.issuerRef.kind=ClusterIssuer",
    )
    [certificate] = [d for d in mine if "cert-manager" in d["apiVersion"]]
    assert certificate["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


def test_without_tls_the_registry_is_plain_http_everywhere(helm: Helm) -> None:
    docs = helm.template("--set", "registry.tls.enabled=false")
    assert not [d for d in docs if d["kind"] == "Secret"]
    parts = _registry_parts(docs)
    assert "--tls-cert" not in parts["registry_container"]["args"]
    assert parts["registry_container"]["livenessProbe"]["httpGet"]["scheme"] == "HTTP"
    assert not [v for v in parts["registry"]["volumes"] if v["name"] == "tls"]
    assert not [v for v in parts["operator"]["volumes"] if v["name"] == "registry-ca"]
    assert "TORCHYARD_REGISTRY_CA_FILE" not in parts["operator_env"]
    assert parts["operator_env"]["TORCHYARD_REGISTRY_URL"] == (
        "http://torchyard-registry.torchyard-system.svc:8080"
    )
    assert parts["proxy_names"] == ["http:torchyard-registry:8080"]


# -- against the cluster -----------------------------------------------------------------


def _review(cluster: Cluster, user: str, groups: list[str], **attributes: str) -> bool:
    code, body = cluster.request(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": attributes},
        },
    )
    assert code == 201, body
    return bool(body["status"].get("allowed"))


class ServiceAccountReviews:
    """SubjectAccessReviews for one ServiceAccount (as the apiserver authorises its token)."""

    def __init__(self, cluster: Cluster, namespace: str, name: str) -> None:
        self.cluster = cluster
        self.user = f"system:serviceaccount:{namespace}:{name}"
        self.groups = [
            "system:serviceaccounts",
            f"system:serviceaccounts:{namespace}",
            "system:authenticated",
        ]

    def can(
        self, verb: str, resource: str, namespace: str = "", group: str = "", name: str = ""
    ) -> bool:
        resource, _, sub = resource.partition("/")
        attrs = {"verb": verb, "resource": resource, "group": group}
        if sub:
            attrs["subresource"] = sub
        if namespace:
            attrs["namespace"] = namespace
        if name:
            attrs["name"] = name
        return _review(self.cluster, self.user, self.groups, **attrs)


def _install(
    helm: Helm, cluster: Cluster, release: str, namespace: str, *values: str
) -> subprocess.CompletedProcess[str]:
    return helm(
        "install",
        release,
        str(CHART),
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--namespace",
        namespace,
        *values,
    )


def _uninstall(helm: Helm, cluster: Cluster, release: str, namespace: str) -> None:
    helm("uninstall", release, "--kubeconfig", str(cluster.kubeconfig), "-n", namespace)


def test_the_rendering_is_accepted_by_a_server_side_dry_run(
    helm: Helm, cluster: Cluster, namespace: str
) -> None:
    for values in (
        [],
        ["--set", f"watchNamespaces={{{namespace}}}", "--set", "networkPolicy.enabled=true"],
        ["--set", "ui.enabled=true"],
    ):
        manifests = helm("template", f"dry-{namespace}", str(CHART), "-n", namespace, *values)
        out = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=manifests.stdout)
        assert "deployment.apps/" in out and "(server dry run)" in out
        assert "environment.torchyard.dev/pytorch-cpu created (server dry run)" in out


def test_install_into_a_restricted_namespace_and_rbac_allows_what_the_code_calls(
    helm: Helm, cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns, release = namespace, f"ty-{namespace[-4:]}"
    cluster.kubectl(
        "label",
        "namespace",
        ns,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/warn=restricted",
    )
    result = _install(
        helm, cluster, release, ns,
        "--set", f"registry.trainerNamespaces={{{ns}}}", "--set", "ui.enabled=true",
    )  # fmt: skip
    try:
        assert "violate PodSecurity" not in result.stderr, result.stderr
        assert "torchyard --help" in result.stdout  # NOTES.txt

        # The ReplicaSets' Pods pass Pod Security "restricted" (else: FailedCreate, no Pod).
        def pods_of(component: str) -> list[dict[str, Any]]:
            return k8s.list_(
                k8s.PODS, ns, label_selector=f"app.kubernetes.io/component={component}"
            )

        def replicaset_failures() -> str:
            return cluster.kubectl("get", "replicasets", "-n", ns, "-o", "json")

        for component in ("operator", "registry", "ui"):
            try:
                wait_for(f"the {component} Pod", lambda c=component: pods_of(c), timeout=30)
            except AssertionError:
                raise AssertionError(replicaset_failures()) from None
        claim = k8s.get(
            k8s.Resource("", "v1", "persistentvolumeclaims"), ns, f"{release}-torchyard-registry"
        )
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
        assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        curated = k8s.get(k8s.ENVIRONMENTS, ns, "pytorch-cpu")
        assert curated["spec"]["image"] == "ghcr.io/torchyard/pytorch:2.15-cpu"
        # The registry's certificate: generated at install for the Service's name, and
        # kept by an upgrade (lookup), so the CA the operator hands out stays valid.
        tls = f"{release}-torchyard-registry-tls"
        generated = k8s.get(k8s.SECRETS, ns, tls)["data"]
        ca, cert = (base64.b64decode(generated[k]) for k in ("ca.crt", "tls.crt"))
        verified = _openssl_verify(tmp_path, ca, cert, f"torchyard-registry.{ns}.svc")
        assert verified.endswith("tls.crt: OK\n"), verified
        # the web view's key likewise: every replica, before and after, signs alike
        ui_key = k8s.get(k8s.SECRETS, ns, f"{release}-torchyard-ui-key")["data"]
        helm(
            "upgrade", release, str(CHART), "--kubeconfig", str(cluster.kubeconfig),
            "--namespace", ns, "--reuse-values",
        )  # fmt: skip
        assert k8s.get(k8s.SECRETS, ns, tls)["data"] == generated
        assert k8s.get(k8s.SECRETS, ns, f"{release}-torchyard-ui-key")["data"] == ui_key

        operator = ServiceAccountReviews(cluster, ns, f"{release}-torchyard-operator")
        elsewhere = "default"
        for (group, resource), verbs in OPERATOR_NEEDS.items():
            for verb in verbs:
                cluster_scoped = resource in CLUSTER_SCOPED
                where = "" if cluster_scoped else elsewhere
                assert operator.can(verb, resource, where, group), (verb, group, resource, where)
        assert not operator.can("get", "secrets", elsewhere)
        assert not operator.can("list", "secrets")
        assert not operator.can("get", "pods", elsewhere)  # the code never reads one Pod
        assert not operator.can("update", "trainingruns", elsewhere, "torchyard.dev")
        assert not operator.can("create", "tokenreviews", group="authentication.k8s.io")

        registry = ServiceAccountReviews(cluster, ns, f"{release}-torchyard-registry")
        assert registry.can("create", "tokenreviews", group="authentication.k8s.io")
        assert registry.can("create", "subjectaccessreviews", group="authorization.k8s.io")
        assert registry.can("get", "trainingruns", elsewhere, "torchyard.dev")
        assert not registry.can("list", "trainingruns", elsewhere, "torchyard.dev")
        assert not registry.can("get", "secrets", elsewhere)
        assert not registry.can("list", "pods", elsewhere)
        # Node Pods of a trainer namespace upload as its default ServiceAccount.
        trainer = ServiceAccountReviews(cluster, ns, "default")
        assert trainer.can("create", "modelversions", ns, "torchyard.dev")
        assert not trainer.can("create", "modelversions", elsewhere, "torchyard.dev")
    finally:
        _uninstall(helm, cluster, release, ns)
    assert cluster.kubectl("get", "clusterroles", "-o", "name").count(f"/{release}-") == 0


def test_a_namespaced_operator_with_peering_installs_with_kopf_peering(
    helm: Helm, cluster: Cluster, namespace: str
) -> None:
    ns, release = namespace, f"ty-{namespace[-4:]}"
    _install(
        helm,
        cluster,
        release,
        ns,
        "--set",
        f"watchNamespaces={{{ns}}}",
        "--set",
        "operator.peering=true",
        "--set",
        "operator.replicas=2",
    )
    try:
        # crds/: torchyard's CRDs existed (skipped), Kopf's peering CRDs were installed;
        # the peering object is named after the release (operator.peeringName's default).
        name = f"{release}-torchyard"
        peering = json.loads(cluster.kubectl("get", "kopfpeering", name, "-n", ns, "-o", "json"))
        assert peering["kind"] == "KopfPeering"
        deployment = json.loads(
            cluster.kubectl(
                "get", "deployment", f"{release}-torchyard-operator", "-n", ns, "-o", "json"
            )
        )
        spec = deployment["spec"]
        assert spec["replicas"] == 2
        assert spec["strategy"]["type"] == "RollingUpdate"
        args = spec["template"]["spec"]["containers"][0]["args"]
        assert f"--namespace={ns}" in args and f"--peering-name={name}" in args
        operator = ServiceAccountReviews(cluster, ns, f"{release}-torchyard-operator")
        assert operator.can("watch", "kopfpeerings", ns, "kopf.dev")
        assert operator.can("patch", "kopfpeerings", ns, "kopf.dev", name=name)
        assert not operator.can("patch", "kopfpeerings", ns, "kopf.dev", name="default")
        assert operator.can("create", "pods", ns)
        assert not operator.can("create", "pods", "default")
        assert operator.can("get", "secrets", ns)
        assert not operator.can("get", "secrets", "default")
        assert operator.can("list", "pods")  # admission: every Pod of the cluster
    finally:
        _uninstall(helm, cluster, release, ns)


def test_bad_values_create_nothing(helm: Helm, cluster: Cluster, namespace: str) -> None:
    result = helm(
        "install",
        "bad",
        str(CHART),
        "--kubeconfig",
        str(cluster.kubeconfig),
        "-n",
        namespace,
        "--set",
        "operator.replicas=two",
        check=False,
    )
    assert result.returncode != 0
    assert "/operator/replicas" in result.stderr
    assert k8s.list_(k8s.Resource("apps", "v1", "deployments"), namespace) == []
    assert (
        "bad" not in helm("list", "--kubeconfig", str(cluster.kubeconfig), "-n", namespace).stdout
    )


# -- Argo CD health checks on real status objects ----------------------------------------


def test_health_checks_judge_the_status_the_operator_wrote(
    cluster: Cluster, namespace: str, operator: InProcessOperator
) -> None:
    ns = namespace
    k8s.create(environment("pytorch", ns, image="ghcr.io/acme/pytorch:2.15-cuda12"))
    env = wait_status(k8s.ENVIRONMENTS, ns, "pytorch", lambda s: s.get("phase") == "Ready")
    assert health("Environment", env) == {
        "status": "Healthy",
        "message": "prebuilt image, used as it is",
    }

    def gpu_run(name: str, nodes: int = 1, pool: str = "a100", env_name: str = "pytorch") -> None:
        run = TrainingRunBuilder(name, ns).environment(env_name).nodes(nodes).procs(1).gpus(1)
        k8s.create(run.pool(pool).obj())

    gpu_run("no-env", env_name="missing")
    preparing = wait_status(k8s.TRAININGRUNS, ns, "no-env", lambda s: s.get("phase") == "Preparing")
    assert health("TrainingRun", preparing) == {
        "status": "Progressing",
        "message": f"spec.environment: Environment missing does not exist in namespace {ns}; "
        "the run waits for it",
    }

    gpu_run("queued", nodes=2, pool="nowhere")  # a pool without nodes: never admitted
    queued = wait_status(k8s.TRAININGRUNS, ns, "queued", lambda s: s.get("phase") == "Queued")
    result = health("TrainingRun", queued)
    assert result["status"] == "Suspended"
    assert "pool nowhere" in result["message"]

    gpu_run("ok")
    gpu_run("bad")
    for name in ("ok", "bad"):
        running = wait_status(
            k8s.TRAININGRUNS,
            ns,
            name,
            lambda s: s.get("phase") == "Running" and s["nodes"]["running"] == 1,
        )
        assert health("TrainingRun", running) == {
            "status": "Progressing",
            "message": "1/1 node(s) running",
        }
    finish_pod(cluster, ns, run_pods(ns, "ok")[0]["metadata"]["name"], 0)
    message = launcher_message(0, 0, "RuntimeError: loss is NaN")
    finish_pod(cluster, ns, run_pods(ns, "bad")[0]["metadata"]["name"], 1, message)
    succeeded = wait_status(k8s.TRAININGRUNS, ns, "ok", lambda s: s.get("phase") == "Succeeded")
    assert health("TrainingRun", succeeded) == {
        "status": "Healthy",
        "message": "all 1 node(s) succeeded",
    }
    failed = wait_status(k8s.TRAININGRUNS, ns, "bad", lambda s: s.get("phase") == "Failed")
    assert health("TrainingRun", failed) == {
        "status": "Degraded",
        "message": "rank 0 (node 0) failed (Error, exit code 1): RuntimeError: loss is NaN",
    }

    k8s.create(model_version("birds-v1", ns, "birds", 1))
    mv = k8s.get(k8s.MODELVERSIONS, ns, "birds-v1")
    assert health("ModelVersion", mv) == {
        "status": "Healthy",
        "message": "Model birds version 1 (3 B, 1 file(s))",
    }
    k8s.delete(k8s.TRAININGRUNS, ns, "queued")


def test_the_gitops_example_builds_and_is_accepted_by_a_server_side_dry_run(
    cluster: Cluster,
) -> None:
    manifests = cluster.kubectl("kustomize", str(REPO / "examples" / "gitops"))
    docs = [d for d in yaml.safe_load_all(manifests) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["CustomResourceDefinition"] * len(list((REPO / "crds").glob("*.yaml")))
        + ["Namespace", "RoleBinding", "ConfigMap", "Environment", "TrainingRun"]
    )
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    assert configmap["metadata"]["name"] == "ddp-src"
    assert configmap["data"]["train.py"] == (REPO / "examples" / "ddp" / "train.py").read_text()
    # The team namespace must exist for a dry run of what lives in it.
    cluster.create_namespace("ml-team")
    try:
        out = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=manifests)
        assert "trainingrun.torchyard.dev/ddp created (server dry run)" in out
        assert "environment.torchyard.dev/pytorch-cpu created (server dry run)" in out
    finally:
        cluster.delete_namespace("ml-team")


def _operator_env(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (operator,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-operator")
    ]
    return list(operator["spec"]["template"]["spec"]["containers"][0]["env"])


def test_the_tracking_server_and_its_credentials_reach_the_operator_only_when_set(
    helm: Helm,
) -> None:
    assert not [e for e in _operator_env(helm.template()) if "MLFLOW" in e["name"]]
    env = _operator_env(
        helm.template(
            "--set",
            "tracking.mlflow.uri=http://mlflow.mlflow:5000",
            "--set",
            "tracking.mlflow.credentialsSecret=mlflow-credentials",
        )
    )
    by_name = {e["name"]: e for e in env}
    assert by_name["TORCHYARD_MLFLOW_URI"]["value"] == "http://mlflow.mlflow:5000"
    assert by_name["TORCHYARD_MLFLOW_SECRET"]["value"] == "mlflow-credentials"
    for key in ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        ref = by_name[key]["valueFrom"]["secretKeyRef"]  # by reference, never a value
        assert ref == {"name": "mlflow-credentials", "key": key, "optional": True}
    # a URI the operator cannot call: refused with where, by the values' schema
    refused = helm(
        "template", "t", str(CHART), "--set", "tracking.mlflow.uri=file:///x", check=False
    )
    assert refused.returncode != 0 and "/tracking/mlflow/uri" in refused.stderr
