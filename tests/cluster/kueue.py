"""Kueue's controller manager beside the test control plane, built from its Go module.

Kueue (``sigs.k8s.io/kueue``, a pinned release) is built once like the other peers
(``tests/cluster/peers.py``: ``go mod download`` through the Go module proxy, ``go build``
into ``${TORCHYARD_CACHE:-~/.cache/torchyard}/kueue-<version>/kueue``) and run as a process
of the cluster, with its feature gates at their defaults (topology-aware scheduling on),
TrainingRun named as an external framework (torchyard creates and follows its Workloads:
``controller/workloads.py``) and only its plain-Pod integration among its own
(``integrations.frameworks: [pod]``: torchyard's fallback, plain Pod groups).
``Kueue(cluster, multikueue=True)`` also hands TrainingRuns to MultiKueue's generic
adapter (``multiKueue.externalFrameworks``), for a manager cluster.

``Kueue(cluster).start()`` applies the release's CRDs, serves its webhooks to the local
apiserver at ``https://127.0.0.1:<port>`` with the peers' certificate (Kueue's own
certificate management off, as its configuration allows; the Pod webhooks select only Pods
that name a queue, so no other Pod waits on them), and returns once the manager is ready
and its Pod webhook gates a Pod that names a queue (a dry-run create). Kueue reads its
metrics server's certificate from a fixed folder when its certificate management is off
(``/etc/kueue/metrics/certs``, no flag): the peers' certificate is put there, as a Pod would
have its Secret mounted.

Used by tests/integration/test_kueue.py (marker ``peers``: ``pytest --peers -m peers``);
``python tests/cluster/kueue.py`` only builds it.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

if __package__ in (None, ""):  # run as a script: python tests/cluster/kueue.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.cluster import peers
from tests.cluster.harness import Cluster, free_port

KUEUE = peers.Peer("kueue", "sigs.k8s.io/kueue", "v0.17.0", "./cmd/kueue", "kueue")
NAMESPACE = "kueue-system"
WEBHOOKS = "kueue-webhooks"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
# TrainingRun as Kueue's configuration names an external framework (Kind.version.group).
TRAININGRUN_GVK = "TrainingRun.v1alpha1.torchyard.dev"
# Kueue's CRDs carry this label too: taken away with Kueue (``Kueue.stop``), so that the
# tests after it meet a cluster without Kueue.
CRD_LABEL = "torchyard.dev/test-kueue"
# Where Kueue reads its metrics certificate when its certificate management is off.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")


def build() -> Path:
    return peers.build(KUEUE)


def webhooks(template: dict[str, Any], port: int, ca_bundle: str) -> dict[str, Any] | None:
    """The release's webhook configuration with only Kueue's own kinds' and the Pod
    webhooks (the other frameworks are off), each pointed at ``127.0.0.1:<port>``."""
    kept = [
        hook
        for hook in template["webhooks"]
        if "kueue-x-k8s-io" in hook["clientConfig"]["service"]["path"]
        or hook["clientConfig"]["service"]["path"].endswith("--v1-pod")
    ]
    if not kept:
        return None
    kind = "mutating" if template["kind"].startswith("Mutating") else "validating"
    return peers.webhook_configuration(
        {**template, "webhooks": kept}, f"{WEBHOOKS}-{kind}", port, ca_bundle, pods_of=QUEUE_LABEL
    )


def configuration(
    webhook_port: int, health_port: int, cert_dir: Path, *, multikueue: bool = False
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "integrations": {"frameworks": ["pod"], "externalFrameworks": [TRAININGRUN_GVK]},
        # No aggregated visibility API (it would bind a fixed port): nothing here reads it.
        "featureGates": {"VisibilityOnDemand": False},
    }
    if multikueue:
        config["multiKueue"] = {
            "externalFrameworks": [{"name": TRAININGRUN_GVK}],
            "gcInterval": "10s",
            "origin": "torchyard-manager",
        }
    return config


class Kueue:
    """Kueue's controller manager against ``cluster`` (a process of the cluster)."""

    def __init__(self, cluster: Cluster, *, multikueue: bool = False) -> None:
        self.cluster = cluster
        self.multikueue = multikueue
        self.health_port = 0
        self.webhook_port = 0

    def start(self) -> Kueue:
        build()
        source = peers.module_dir(KUEUE)
        pki = peers.pki_dir()
        ca_bundle = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
        self._apply_crds(source)
        self.cluster.create_namespace(NAMESPACE)
        self.health_port, self.webhook_port = free_port(), free_port()
        manifests = source / "config/components/webhook/manifests.yaml"
        for doc in yaml.safe_load_all(manifests.read_text()):
            if doc:
                hooks = webhooks(doc, self.webhook_port, ca_bundle)
                if hooks is not None:
                    self._apply(hooks)
        peers.mount_certs(pki, METRICS_CERT_DIR, ("tls.crt", "tls.key"))
        path = self.cluster.workdir / "kueue-config.yaml"
        config = configuration(self.webhook_port, self.health_port, pki, multikueue=self.multikueue)
        path.write_text(yaml.safe_dump(config))
        log = open(self.cluster.workdir / "kueue.log", "wb")  # noqa: SIM115
        self.cluster.processes[KUEUE.binary] = subprocess.Popen(
            [str(KUEUE.path), f"--config={path}", "--zap-devel=false"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, KUBECONFIG=str(self.cluster.kubeconfig)),
            cwd=self.cluster.workdir,
            start_new_session=True,
        )
        self.cluster.wait_for("kueue ready", self._ready, timeout=180, interval=0.5)
        self.cluster.wait_for("kueue's Pod webhook", self._gates_pods, timeout=120, interval=0.5)
        return self

    def stop(self, *, remove_crds: bool = True) -> None:
        """End Kueue, take its webhooks away and (``remove_crds``) its CRDs with every
        Workload and queue: the cluster is one without Kueue again."""
        peers.end_process(self.cluster, KUEUE.binary)
        peers.remove_webhooks(self.cluster)
        if remove_crds:
            self._drop_finalizers()
            self.cluster.kubectl(
                "delete", "crd", "-l", f"{CRD_LABEL}=true", "--ignore-not-found", "--wait=true"
            )

    def _drop_finalizers(self) -> None:
        """Kueue's finalizers taken off its objects (queues, flavors, Workloads in use):
        with Kueue ended nothing else would, and deleting its CRDs would wait for them."""
        crds = json.loads(
            self.cluster.kubectl("get", "crd", "-l", f"{CRD_LABEL}=true", "-o", "json")
        )
        for crd in crds.get("items", []):
            kind = f"{crd['spec']['names']['plural']}.{crd['spec']['group']}"
            found = json.loads(self.cluster.kubectl("get", kind, "-A", "-o", "json"))
            for obj in found.get("items", []):
                meta = obj["metadata"]
                if not meta.get("finalizers"):
                    continue
                where = ["-n", meta["namespace"]] if meta.get("namespace") else []
                self.cluster.kubectl(
                    "patch", kind, meta["name"], *where, "--type=merge",
                    "-p", '{"metadata":{"finalizers":null}}',
                )  # fmt: skip

    def log(self) -> str:
        path = self.cluster.workdir / "kueue.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    def _apply(self, doc: dict[str, Any]) -> None:
        self.cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "--field-manager=torchyard-peers",
            "-f", "-", input=json.dumps(doc),
        )  # fmt: skip

    def _apply_crds(self, source: Path) -> None:
        names = []
        for f in sorted((source / "config/components/crd/bases").glob("*.yaml")):
            for doc in yaml.safe_load_all(f.read_text()):
                if not doc:
                    continue
                labels = doc.setdefault("metadata", {}).setdefault("labels", {})
                labels["torchyard.dev/test-peer"] = "true"
                labels[CRD_LABEL] = "true"
                self._apply(doc)
                names.append(doc["metadata"]["name"])
        self.cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{n}" for n in names]
        )

    def _ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.health_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _gates_pods(self) -> bool:
        """Kueue's Pod webhook itself answers: a Pod naming a queue comes back gated."""
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "kueue-probe", "labels": {QUEUE_LABEL: "probe"}},
            "spec": {"containers": [{"name": "c", "image": "pause"}]},
        }
        code, answer = self.cluster.request(
            "POST", "/api/v1/namespaces/default/pods?dryRun=All", body
        )
        if code != 201 or not isinstance(answer, dict):
            return False
        gates = answer.get("spec", {}).get("schedulingGates") or []
        return ADMISSION_GATE in [g.get("name") for g in gates]


if __name__ == "__main__":
    try:
        build()
    except subprocess.CalledProcessError as err:
        print(f"error: go build failed ({err})", file=sys.stderr)
        sys.exit(1)


# -- Kueue's objects, as a cluster administrator makes them ------------------------------

API = "kueue.x-k8s.io/v1beta2"


def create(cluster: Cluster, *docs: dict[str, Any]) -> None:
    """Create each of ``docs`` (one that exists already will do)."""
    for doc in docs:
        group_version, kind = doc["apiVersion"], doc["kind"]
        plural = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues",
                  "LocalQueue": "localqueues", "Topology": "topologies",
                  "AdmissionCheck": "admissionchecks", "MultiKueueConfig": "multikueueconfigs",
                  "MultiKueueCluster": "multikueueclusters",
                  "PriorityClass": "priorityclasses"}[kind]  # fmt: skip
        prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
        ns = doc["metadata"].get("namespace")
        path = f"{prefix}/namespaces/{ns}/{plural}" if ns else f"{prefix}/{plural}"
        code, answer = cluster.request("POST", path, doc)
        if code not in (201, 409):
            raise RuntimeError(f"creating {kind} {doc['metadata']['name']}: {code} {answer}")


def resource_flavor(
    name: str, *, node_labels: dict[str, str] | None = None, topology: str | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if node_labels:
        spec["nodeLabels"] = node_labels
    if topology:
        spec["topologyName"] = topology
    return {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": spec}


def cluster_queue(
    name: str,
    flavor: str,
    *,
    gpus: int,
    cpu: str = "1000",
    memory: str = "10Ti",
    admission_checks: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A ClusterQueue of ``gpus`` nvidia.com/gpu (and plenty of cpu and memory) in
    ``flavor``, open to every namespace, preempting lower priorities within itself."""
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "preemption": {"withinClusterQueue": "LowerPriority"},
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                "flavors": [
                    {
                        "name": flavor,
                        "resources": [
                            {"name": "cpu", "nominalQuota": cpu},
                            {"name": "memory", "nominalQuota": memory},
                            {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)},
                        ],
                    }
                ],
            }
        ],
    }
    if admission_checks:
        spec["admissionChecksStrategy"] = {
            "admissionChecks": [{"name": check} for check in admission_checks]
        }
    return {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def local_queue(namespace: str, name: str, cq: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cq},
    }


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }
