"""The Helm chart on the REAL node: ``helm install charts/torchyard`` with the images made
here, into namespaces enforcing Pod Security "restricted", and the operator and the model
registry then run as Pods, the way a user meets them.

The operator's own Pod (not the in-process one: the session's ``operator`` is stopped for
this module, and started again after it, so only the chart's operator reconciles) watches
one team namespace (``watchNamespaces``) with nothing but the chart's RBAC. It reaches the
apiserver through the ``kubernetes`` Service (the harness advertises this machine's
address, its serving certificate covers the Service's IP, and kube-proxy routes to it).
The registry Pod keeps its volume on a ``local`` PersistentVolume made here (a folder on
this machine, of a StorageClass name only this module uses, removed afterwards) and
serves HTTPS with the certificate the chart generates.

What is checked, each time from the kubelet (``spec.nodeName``, container states,
``pods/log``), so nothing passes on KWOK: both Pods Running and Ready on the real node; a
Pod reaching the registry's ``/healthz`` through its Service with the chart's CA (and
refused without it); a TrainingRun of the team namespace Succeeded on the real node, its
logs archived by the node Pod through the registry Service with its projected token, and
its outputs promoted by the chart's operator to a ModelVersion whose files are on the
volume; the web view's two replicas Ready, serving through their Service and through a
TLS proxy with another Host (``tests/node/web_ui.py``).

Fixtures: ``cluster``, ``operator`` (tests/conftest.py), ``real_node``
(tests/node/conftest.py); helm is the harness's (``tests/cluster/binaries.py``).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import TrainingRunBuilder
from tests.cluster import binaries
from tests.cluster.chart import CHART, Helm
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.conftest import InProcessOperator
from tests.integration.helpers import run_pods, wait_status
from tests.integration.test_chart import ServiceAccountReviews
from tests.node import web_ui
from torchyard import k8s

pytestmark = pytest.mark.node

RESTRICTED = (
    "pod-security.kubernetes.io/enforce=restricted",
    "pod-security.kubernetes.io/warn=restricted",
)
PVCS = k8s.Resource("", "v1", "persistentvolumeclaims")
# Small: the node has 2 CPUs, shared with the other tests' Pods.
SMALL = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "1Gi"}}


@dataclass
class Release:
    """The chart installed: its namespace, the team namespace its operator watches, the
    registry volume's folder on this machine."""

    name: str
    system: str
    team: str
    volume: Path
    cluster: Cluster
    node: RealNode

    def pods(self, component: str) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/component={component},app.kubernetes.io/instance={self.name}"
        return k8s.list_(k8s.PODS, self.system, label_selector=selector)

    def explain(self) -> str:
        """The Pods, ReplicaSets, claims and Events of both namespaces, and the kubelet's
        log tail, for a failed assertion."""
        kubectl = self.cluster.kubectl
        parts = []
        for ns in (self.system, self.team):
            parts.append(kubectl("get", "pods,rs,pvc", "-n", ns, "-o", "wide", check=False))
            parts.append(kubectl("get", "events", "-n", ns, check=False)[-4000:])
        for pod in self.pods("operator") + self.pods("registry") + self.pods("ui"):
            name = pod["metadata"]["name"]
            parts.append(f"--- log of {name}")
            parts.append(kubectl("logs", "-n", self.system, name, "--tail=40", check=False))
        parts.append(kubectl("get", "pv", check=False))
        kubelet = (self.node.root / "kubelet.log").read_text(errors="replace")[-3000:]
        return "\n".join([*parts, "--- kubelet log tail", kubelet])


def _values(node: RealNode, team: str, storage_class: str) -> dict[str, Any]:
    """The chart's values for this machine: the torchyard image made here (never pulled),
    the Pods on the real node, the registry volume of ``storage_class``, the curated
    PyTorch image made here, and no registry lookups of curated images (no network)."""
    repository, _, tag = node.images["torchyard"].ref.rpartition(":")
    on_real_node = {"torchyard.dev/pool": node.pool}
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "watchNamespaces": [team],
        "operator": {
            "resolveCuratedImages": "none",
            "nodeSelector": on_real_node,
            "resources": SMALL,
        },
        "registry": {
            "nodeSelector": on_real_node,
            "resources": SMALL,
            "persistence": {"storageClass": storage_class, "size": "1Gi", "keep": False},
        },
        "environments": {
            "curated": [{"name": "pytorch", "image": node.images["pytorch"].ref}],
        },
        # the web view as an Ingress would front it: two replicas, another Host, the
        # proxy's address (this machine's, on the node's bridge) trusted
        "ui": {
            "enabled": True,
            "replicas": 2,
            "nodeSelector": on_real_node,
            "resources": SMALL,
            "allowedHosts": [web_ui.PUBLIC],
            "trustedProxies": [f"{node.network.gateway}/32"],
        },
    }


def _local_volume(name: str, storage_class: str, path: Path, node: RealNode) -> dict[str, Any]:
    """A ``local`` PersistentVolume on the real node (the kubelet applies the Pod's fsGroup
    to it, as to a cloud disk, so the non-root registry can write)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": storage_class,
            "local": {"path": str(path)},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node.name],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def restricted_namespaces(cluster: Cluster, prefix: str, suffix: str) -> tuple[str, str]:
    """A system and a team namespace, both enforcing Pod Security "restricted"."""
    system = cluster.create_namespace(f"{prefix}-system-{suffix}")
    team = cluster.create_namespace(f"{prefix}-team-{suffix}")
    for ns in (system, team):
        cluster.kubectl("label", "namespace", ns, *RESTRICTED)
    return system, team


def delete_namespaces(cluster: Cluster, *namespaces: str) -> None:
    for ns in namespaces:
        cluster.delete_namespace(ns)
    cluster.wait_for(
        "the test namespaces to be gone",
        lambda: all(k8s.get_or_none(k8s.NAMESPACES, None, ns) is None for ns in namespaces),
        timeout=180,
    )


@pytest.fixture(scope="module")
def release(
    cluster: Cluster,
    real_node: RealNode,
    operator: InProcessOperator,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Release]:
    binaries.build(binaries.TOOLS["helm"])
    suffix = os.urandom(2).hex()
    system, team = restricted_namespaces(cluster, "ty", suffix)
    storage_class = f"torchyard-test-{suffix}"
    volume = tmp_path_factory.mktemp("registry-volume")
    pv = f"torchyard-registry-{suffix}"
    code, body = cluster.request(
        "POST", "/api/v1/persistentvolumes", _local_volume(pv, storage_class, volume, real_node)
    )
    assert code == 201, f"creating the PersistentVolume {pv}: {code} {body}"
    values = tmp_path_factory.mktemp("values") / "values.yaml"
    values.write_text(yaml.safe_dump(_values(real_node, team, storage_class)))
    helm = Helm(tmp_path_factory.mktemp("helm"))
    name = f"ty-{suffix}"
    kubeconfig = ["--kubeconfig", str(cluster.kubeconfig), "--namespace", system]
    # Only the chart's operator may reconcile the team namespace: the in-process one
    # watches every namespace, so it rests until this module is done.
    operator.stop()
    try:
        installed = helm("install", name, str(CHART), *kubeconfig, "--values", str(values))
        assert "violate PodSecurity" not in installed.stderr, installed.stderr
        yield Release(name, system, team, volume, cluster, real_node)
    finally:
        helm("uninstall", name, *kubeconfig, "--wait", "--timeout=120s", check=False)
        delete_namespaces(cluster, team, system)
        cluster.request("DELETE", f"/api/v1/persistentvolumes/{pv}")
        shutil.rmtree(volume, ignore_errors=True)
        operator.start()


def test_the_operator_and_the_registry_run_ready_on_the_real_node_under_restricted(
    release: Release, real_node: RealNode
) -> None:
    def ready(component: str) -> dict[str, Any] | None:
        pods = release.pods(component)
        return pods[0] if len(pods) == 1 and _ready(pods[0]) else None

    for component in ("operator", "registry"):
        try:
            pod = real_node.wait_for(
                f"the {component} Pod Ready", lambda c=component: ready(c), 240
            )
        except TimeoutError as err:
            raise AssertionError(f"{err}\n{release.explain()}") from None
        name = pod["metadata"]["name"]
        assert pod["spec"]["nodeName"] == real_node.name, f"{name} on {pod['spec']['nodeName']}"
        assert pod["status"]["phase"] == "Running"
        [status] = pod["status"]["containerStatuses"]
        assert status["ready"] is True and "running" in status["state"], status
        assert status["imageID"], status  # the kubelet ran the image from containerd
        assert status["image"] == real_node.images["torchyard"].ref
        # what "restricted" asks, as the kubelet ran it: non-root, no escalation, no caps
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 65532
        [container] = spec["containers"]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # the registry's volume: the claim bound to the local volume made here
    claim = k8s.get(PVCS, release.system, f"{release.name}-torchyard-registry")
    assert claim["status"]["phase"] == "Bound", claim["status"]
    _, pv = release.cluster.request(
        "GET", f"/api/v1/persistentvolumes/{claim['spec']['volumeName']}"
    )
    assert pv["spec"]["local"]["path"] == str(release.volume)
    # the operator's token is the chart's ServiceAccount's: namespaced to the team
    reviews = ServiceAccountReviews(
        release.cluster, release.system, f"{release.name}-torchyard-operator"
    )
    assert reviews.can("create", "pods", release.team)
    assert not reviews.can("create", "pods", "default")


# The registry Pod is Ready before its Service's endpoints reach kube-proxy and the
# name resolves: the first request is tried again for a minute while the connection
# fails (a certificate error is not tried again).
PROBE = """\
import ssl, sys, time, urllib.error, urllib.request
url = sys.argv[1]
context = ssl.create_default_context(cafile="/etc/registry-ca/ca.crt")
deadline = time.monotonic() + 60
while True:
    try:
        resp = urllib.request.urlopen(url, context=context, timeout=30)
        break
    except urllib.error.URLError as err:
        if isinstance(err.reason, ssl.SSLError) or time.monotonic() > deadline:
            raise
        time.sleep(1)
with resp:
    print("with the chart's CA:", resp.status, resp.read().decode(), flush=True)
try:
    urllib.request.urlopen(url, context=ssl.create_default_context(), timeout=30)
    print("without the CA: accepted", flush=True)
except urllib.error.URLError as err:
    print("without the CA:", err.reason, flush=True)
"""


def test_a_pod_reaches_the_registry_through_its_service_with_the_charts_tls(
    release: Release, real_node: RealNode
) -> None:
    real_node.wait_for(
        "the registry Pod Ready", lambda: [p for p in release.pods("registry") if _ready(p)], 240
    )
    tls = k8s.get(k8s.SECRETS, release.system, f"{release.name}-torchyard-registry-tls")
    ca = base64.b64decode(tls["data"]["ca.crt"]).decode()
    ns = release.team
    k8s.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "registry-ca", "namespace": ns},
            "data": {"ca.crt": ca},
        }
    )
    url = f"https://torchyard-registry.{release.system}.svc:8080/healthz"
    mount = {"name": "ca", "mountPath": "/etc/registry-ca"}
    ca_volume = {"name": "ca", "configMap": {"name": "registry-ca"}}
    log = probe_pod(release, "probe", ["python3", "-c", PROBE, url], [mount], [ca_volume])
    assert "with the chart's CA: 200 ok" in log, log
    # and the certificate is what made it trusted: without the chart's CA it is refused
    assert "without the CA: [SSL: CERTIFICATE_VERIFY_FAILED]" in log, log


RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def probe_pod(
    release: Release,
    name: str,
    command: list[str],
    mounts: Sequence[dict[str, Any]] = (),
    volumes: Sequence[dict[str, Any]] = (),
) -> str:
    """Run ``command`` in a Pod of the team namespace on the real node (the Python image,
    Pod Security "restricted"); its log once it exited 0."""
    ns = release.team
    k8s.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"torchyard.dev/pool": release.node.pool},
                "terminationGracePeriodSeconds": 2,
                "containers": [
                    {
                        "name": "probe",
                        "image": release.node.images["python"].ref,
                        "imagePullPolicy": "Never",
                        "command": command,
                        "securityContext": RESTRICTED_CONTAINER,
                        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                        "volumeMounts": list(mounts),
                    }
                ],
                "volumes": list(volumes),
            },
        }
    )

    def finished() -> dict[str, Any] | None:
        pod = k8s.get(k8s.PODS, ns, name)
        return pod if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    try:
        pod = release.node.wait_for(f"the {name} Pod to finish", finished, 180)
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{release.explain()}") from None
    log = release.cluster.kubectl("logs", "-n", ns, name)
    assert pod["spec"]["nodeName"] == release.node.name
    [status] = pod["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 0, f"{status}\n{log}"
    return log


TRAIN = """\
import os, pathlib
outputs = pathlib.Path(os.environ["TORCHYARD_OUTPUTS"])
outputs.mkdir(parents=True, exist_ok=True)
(outputs / "model.txt").write_text("weights of rank " + os.environ["RANK"])
print("hello from rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], flush=True)
"""


def test_the_charts_operator_runs_a_training_run_and_promotes_its_model(
    release: Release, real_node: RealNode, operator: InProcessOperator
) -> None:
    ns, name = release.team, "hello"
    assert operator.thread is not None and not operator.thread.is_alive()  # only the chart's
    # the node Pod archives to the registry within seconds of its creation: the registry
    # must be Ready first (the first test waits for it too; this one may run alone)
    try:
        real_node.wait_for(
            "the registry Pod Ready",
            lambda: next((p for p in release.pods("registry") if _ready(p)), None),
            240,
        )
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{release.explain()}") from None
    # the chart made the curated Environment, its operator found it Ready
    try:
        env = wait_status(k8s.ENVIRONMENTS, ns, "pytorch", lambda s: s.get("phase") == "Ready", 240)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{release.explain()}") from None
    assert env["spec"]["image"] == real_node.images["pytorch"].ref
    done, _, log = run_hello(release, "pytorch", TRAIN, register="hello-model")
    assert done["status"]["model"] == {"name": "hello-model", "version": 1}
    # the node Pod archived through the registry Service (TLS, its projected token)
    assert "[torchyard] archived" in log, log
    # the chart's operator promoted the outputs: the ModelVersion, and its file on the
    # registry Pod's volume (this machine's folder behind the local PersistentVolume)
    mv = k8s.get(k8s.MODELVERSIONS, ns, "hello-model-v1")
    files = {f["path"]: f for f in mv["spec"]["files"]}
    assert sorted(files) == ["model.txt"], files
    assert mv["spec"]["run"]["uid"] == done["metadata"]["uid"]
    stored = release.volume / ns / "models" / "hello-model" / "1" / "model.txt"
    assert stored.read_text() == "weights of rank 0"
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == files["model.txt"]["sha256"]
    # and it was the operator's Pod that did it: its log, kept by the kubelet, says so
    [op] = release.pods("operator")
    op_log = release.cluster.kubectl("logs", "-n", release.system, op["metadata"]["name"])
    promoted = f"TrainingRun {ns}/{name} registered hello-model version 1"
    assert promoted in op_log, op_log[-3000:]


def run_hello(
    release: Release, environment: str, train: str, register: str | None = None
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The TrainingRun ``hello`` (1 x 1) of the script ``train`` in ``environment`` of the
    team namespace, on the real node as user 1000, Succeeded: its object, its Pod and
    the trainer's log."""
    ns, name = release.team, "hello"
    k8s.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "hello-src", "namespace": ns},
            "data": {"train.py": train},
        }
    )
    run = (
        TrainingRunBuilder(name, ns)
        .environment(environment)
        .source(configMap="hello-src")
        .command("python", "train.py")
        .nodes(1)
        .procs(1)
        .pool(release.node.pool)
        .with_("spec.resources", {"cpu": "100m", "memory": "512Mi", "shmSize": "64Mi"})
        .with_("spec.runAsUser", 1000)  # Pod Security "restricted" in the team namespace
    )
    k8s.create((run.register(register, path="outputs") if register else run).obj())
    try:
        done = wait_status(
            k8s.TRAININGRUNS, ns, name, lambda s: s.get("phase") in ("Succeeded", "Failed"), 300
        )
    except AssertionError as err:
        raise AssertionError(f"{err}\n{release.explain()}") from None
    assert done["status"]["phase"] == "Succeeded", f"{done['status']}\n{release.explain()}"
    [pod] = run_pods(ns, name)
    assert pod["spec"]["nodeName"] == release.node.name
    trainer = next(s for s in pod["status"]["containerStatuses"] if s["name"] == "trainer")
    assert trainer["state"]["terminated"]["exitCode"] == 0, trainer
    log = release.cluster.kubectl("logs", "-n", ns, pod["metadata"]["name"], "-c", "trainer")
    assert "hello from rank 0 of 1" in log, log
    return done, pod, log


def test_the_charts_web_view_is_ready_and_serves_through_its_service_and_a_tls_proxy(
    release: Release, real_node: RealNode, tmp_path: Path
) -> None:
    """Both replicas Ready (the kubelet's probe, Host: the Pod's IP); through the Service
    by its DNS name from a Pod, the probe and the sign-in page answer and another Host
    gets 421, and a Pod's X-Forwarded-Proto (not a trusted proxy) makes no cookie Secure;
    a page of one replica is good on the other (the chart's key); through a TLS proxy
    with another Host a caller signs in with Secure cookies, a foreign Origin changes
    nothing and the view's own origin suspends and resumes a run."""

    def both_ready() -> list[dict[str, Any]] | None:
        pods = release.pods("ui")
        return pods if len(pods) == 2 and all(_ready(p) for p in pods) else None

    try:
        pods = real_node.wait_for("both web view Pods Ready", both_ready, 240)
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{release.explain()}") from None
    for pod in pods:
        assert pod["spec"]["nodeName"] == real_node.name
        [status] = pod["status"]["containerStatuses"]
        assert status["ready"] is True and status["image"] == real_node.images["torchyard"].ref
    key = k8s.get(k8s.SECRETS, release.system, f"{release.name}-torchyard-ui-key")
    assert len(base64.b64decode(key["data"]["key"])) >= 32
    service = f"{release.name}-torchyard-ui.{release.system}.svc"
    seen = web_ui.from_a_pod(lambda command: probe_pod(release, "ui-client", command), service)
    assert seen["healthz"] == [200, "ok"], seen
    assert seen["login"][0] == 200 and "torchyard-ui-csrf=" in seen["login"][1], seen
    assert "Secure" not in seen["login"][1], seen  # (a Pod is no trusted proxy)
    assert seen["other host"][0] == 421, seen
    run = web_ui.idle_run(release.team)
    editor = web_ui.editor_token(release.team)
    a, b = (p["status"]["podIP"] for p in pods)
    web_ui.replicas_share_the_key(a, b, f"{service}:8080", editor, release.team, run)
    ip = k8s.get(k8s.SERVICES, release.system, f"{release.name}-torchyard-ui")["spec"]["clusterIP"]
    with web_ui.TlsProxy(f"http://{ip}:8080", tmp_path) as proxy:
        web_ui.behind_the_proxy(proxy, editor, release.team, run)
