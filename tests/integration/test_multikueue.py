"""MultiKueue on two control planes of the test bed: a TrainingRun with
``spec.managedBy: kueue.x-k8s.io/multikueue`` on the manager (the session's cluster, its
in-process operator) is dispatched to a worker cluster (a second control plane with KWOK
GPU nodes, its own Kueue and a torchyard operator of its own, ``python -m
torchyard.controller``), runs and succeeds there, its status mirrored onto the manager's
object; deleting a run on the manager deletes its copy on the worker.

Kueue's MultiKueue reaches the worker as a ServiceAccount of it, bound to the chart's
ClusterRole for Kueue on TrainingRuns (``kueue.rbac``) and to Kueue's own objects (as
Kueue's documentation has a worker's kubeconfig made).

    flock /tmp/ty-cluster.lock .venv/bin/python -m pytest tests/integration/test_multikueue.py
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import TrainingRunBuilder, environment
from tests.cluster import chart
from tests.cluster import kueue as kq
from tests.cluster.harness import Cluster, Pool
from tests.cluster.kueue import Kueue
from tests.integration.helpers import OperatorProcess, finish_pod, wait_for, wait_status
from torchyard import k8s

WORKER_POOL = Pool("mkw", nodes=2, gpus=2, cpu="16", memory="64Gi")
MULTIKUEUE_SA = "multikueue"
KUEUE_NS = "kueue-system"
# What MultiKueue's ServiceAccount on the worker needs of Kueue's own objects (Kueue's
# documentation has the same made for a worker's kubeconfig).
KUEUE_OBJECTS_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": "multikueue-kueue-objects"},
    "rules": [
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["workloads"],
            "verbs": ["create", "delete", "get", "list", "watch", "update", "patch"],
        },
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["workloads/status"],
            "verbs": ["get", "patch", "update"],
        },
        # MultiKueue watches the kind of each of the manager's Kueue integrations on a
        # worker: the test bed's Kueue has its Pod integration on (torchyard's fallback)
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["create", "delete", "get", "list", "watch"],
        },
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get"]},
    ],
}


class Worker:
    """The worker cluster: its control plane, Kueue and torchyard operator."""

    def __init__(self, cluster: Cluster, kueue: Kueue, operator: OperatorProcess) -> None:
        self.cluster = cluster
        self.kueue = kueue
        self.operator = operator

    def get(self, kind: str, ns: str, name: str) -> dict[str, Any] | None:
        out = self.cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None

    def apply(self, doc: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(doc))


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    started = time.monotonic()
    with Cluster(pools=(WORKER_POOL,)) as cluster:
        kueue = Kueue(cluster).start()
        log = tmp_path_factory.mktemp("worker") / "torchyard.log"
        with OperatorProcess(cluster.kubeconfig, log) as operator:
            print(
                f"\n[worker] control plane, Kueue, torchyard in {time.monotonic() - started:.0f}s"
            )
            yield Worker(cluster, kueue, operator)
        kueue.stop(remove_crds=False)


@pytest.fixture(scope="module")
def manager_kueue(cluster: Cluster) -> Iterator[Kueue]:
    k = Kueue(cluster, multikueue=True).start()
    yield k
    k.stop()


def worker_kubeconfig(worker: Worker, home: Path) -> str:
    """A kubeconfig of MultiKueue's ServiceAccount on the worker (token and CA inline, as
    MultiKueue wants them), with the chart's ClusterRole for Kueue on TrainingRuns."""
    w = worker.cluster
    w.create_namespace(KUEUE_NS)
    w.kubectl("create", "serviceaccount", MULTIKUEUE_SA, "-n", KUEUE_NS)
    subjects = f"kueue.rbac.subjects[0].name={MULTIKUEUE_SA}"
    docs = chart.Helm(home).template(
        "--set", "kueue.rbac.create=true", "--set", subjects,
        "--set", f"kueue.rbac.subjects[0].namespace={KUEUE_NS}",
        "--set", "kueue.rbac.subjects[0].kind=ServiceAccount",
    )  # fmt: skip
    rbac = [d for d in docs if d["metadata"]["name"].endswith("-kueue")]
    assert [d["kind"] for d in rbac] == ["ClusterRole", "ClusterRoleBinding"], rbac
    for doc in [*rbac, KUEUE_OBJECTS_ROLE]:
        worker.apply(doc)
    w.kubectl(
        "create", "clusterrolebinding", "multikueue-kueue-objects",
        "--clusterrole=multikueue-kueue-objects", f"--serviceaccount={KUEUE_NS}:{MULTIKUEUE_SA}",
    )  # fmt: skip
    token = w.kubectl("create", "token", MULTIKUEUE_SA, "-n", KUEUE_NS, "--duration=2h").strip()
    ca = base64.b64encode((w.workdir / "ca.crt").read_bytes()).decode()
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "worker",
                    "cluster": {"server": w.server, "certificate-authority-data": ca},
                }
            ],
            "users": [{"name": MULTIKUEUE_SA, "user": {"token": token}}],
            "contexts": [
                {"name": "worker", "context": {"cluster": "worker", "user": MULTIKUEUE_SA}}
            ],
            "current-context": "worker",
        }
    )


@pytest.fixture(scope="module")
def dispatching(
    cluster: Cluster,
    worker: Worker,
    manager_kueue: Kueue,
    tmp_path_factory: pytest.TempPathFactory,
) -> str:
    """MultiKueue on the manager pointing at the worker; the manager's ClusterQueue
    (with the MultiKueue admission check) by name."""
    kubeconfig = worker_kubeconfig(worker, tmp_path_factory.mktemp("helm"))
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "worker-kubeconfig", "namespace": KUEUE_NS},
        "data": {"kubeconfig": base64.b64encode(kubeconfig.encode()).decode()},
    }
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(secret))
    api = kq.API
    kq.create(
        cluster,
        {
            "apiVersion": api,
            "kind": "MultiKueueCluster",
            "metadata": {"name": "worker"},
            "spec": {
                "clusterSource": {
                    "kubeConfig": {"locationType": "Secret", "location": "worker-kubeconfig"}
                }
            },
        },
        {
            "apiVersion": api,
            "kind": "MultiKueueConfig",
            "metadata": {"name": "workers"},
            "spec": {"clusters": ["worker"]},
        },
        {
            "apiVersion": api,
            "kind": "AdmissionCheck",
            "metadata": {"name": "multikueue"},
            "spec": {
                "controllerName": "kueue.x-k8s.io/multikueue",
                "parameters": {
                    "apiGroup": "kueue.x-k8s.io",
                    "kind": "MultiKueueConfig",
                    "name": "workers",
                },
            },
        },
        kq.resource_flavor("mk-default"),
        kq.cluster_queue("mk-manager", "mk-default", gpus=4, admission_checks=("multikueue",)),
    )

    said: list[dict[str, Any]] = []

    def active() -> bool:
        body = k8s.rest.call("GET", "/apis/kueue.x-k8s.io/v1beta2/multikueueclusters/worker")
        said[:] = body.get("status", {}).get("conditions", [])
        return any(c["type"] == "Active" and c["status"] == "True" for c in said)

    try:
        wait_for("the worker's MultiKueueCluster Active", active, timeout=120)
    except AssertionError as err:
        raise AssertionError(f"{err}; its conditions: {said}") from None
    return "mk-manager"


def both_namespaces(cluster: Cluster, worker: Worker, ns: str) -> None:
    """The queue on each side; the run's Environment on the worker (which runs it)."""
    kq.create(cluster, kq.local_queue(ns, "team-a", "mk-manager"))
    worker.cluster.create_namespace(ns)
    kq.create(
        worker.cluster,
        kq.resource_flavor("mk-worker", node_labels={"torchyard.dev/pool": WORKER_POOL.name}),
        kq.cluster_queue("mk-worker", "mk-worker", gpus=4),
        kq.local_queue(ns, "team-a", "mk-worker"),
    )
    worker.apply(environment("pytorch", ns, image="ghcr.io/acme/pytorch:2.15-cuda12"))


def dispatched_run(ns: str, name: str) -> dict[str, Any]:
    return (
        TrainingRunBuilder(name, ns)
        .environment("pytorch")
        .nodes(2)
        .procs(1)
        .gpus(1)
        .pool(WORKER_POOL.name)
        .with_("spec.scheduling.queueName", "team-a")
        .with_("spec.managedBy", "kueue.x-k8s.io/multikueue")
        .obj()
    )


def worker_status(worker: Worker, ns: str, name: str, check: Any, timeout: float) -> Any:
    def found() -> Any:
        run = worker.get("trainingrun", ns, name)
        return run if run is not None and check(run.get("status") or {}) else None

    return wait_for(f"the worker's copy of {name}", found, timeout=timeout)


def test_a_run_is_dispatched_to_the_worker_succeeds_there_and_its_status_shows_here(
    cluster: Cluster, worker: Worker, dispatching: str, namespace: str
) -> None:
    ns = namespace
    both_namespaces(cluster, worker, ns)
    k8s.create(dispatched_run(ns, "far"))

    copy = worker_status(worker, ns, "far", lambda s: s.get("phase") == "Running", 180)
    assert "managedBy" not in copy["spec"]  # MultiKueue's copy: the worker's torchyard runs it
    origin = copy["metadata"]["labels"]["kueue.x-k8s.io/multikueue-origin"]
    assert origin == "torchyard-manager"
    # The manager runs nothing: no Pods here, its Workload is the one MultiKueue copied
    assert k8s.list_(k8s.PODS, ns, label_selector="torchyard.dev/run=far") == []
    (wl,) = k8s.list_(k8s.WORKLOADS, ns)
    assert (
        copy["metadata"]["labels"]["kueue.x-k8s.io/prebuilt-workload-name"]
        == (wl["metadata"]["name"])
    )
    assert wl["status"].get("clusterName") == "worker"
    mirrored = wait_status(
        k8s.TRAININGRUNS, ns, "far", lambda s: s.get("phase") == "Running", timeout=60
    )
    assert mirrored["status"]["nodes"]["running"] == 2

    for pod in ("far-0", "far-1"):
        finish_pod(worker.cluster, ns, pod, 0)
    worker_status(worker, ns, "far", lambda s: s.get("phase") == "Succeeded", 120)
    done = wait_status(
        k8s.TRAININGRUNS, ns, "far", lambda s: s.get("phase") == "Succeeded", timeout=120
    )
    succeeded = next(c for c in done["status"]["conditions"] if c["type"] == "Succeeded")
    assert succeeded["status"] == "True"


def test_deleting_the_run_on_the_manager_deletes_its_copy_on_the_worker(
    cluster: Cluster, worker: Worker, dispatching: str, namespace: str
) -> None:
    ns = namespace
    both_namespaces(cluster, worker, ns)
    k8s.create(dispatched_run(ns, "gone"))
    worker_status(worker, ns, "gone", lambda s: s.get("phase") == "Running", 180)
    k8s.delete(k8s.TRAININGRUNS, ns, "gone")
    wait_for(
        "the worker's copy deleted",
        lambda: worker.get("trainingrun", ns, "gone") is None,
        timeout=120,
    )

    def pods_gone() -> bool:
        out = worker.cluster.kubectl(
            "get", "pods", "-n", ns, "-l", "torchyard.dev/run=gone", "-o", "name"
        )
        return not out.strip()

    wait_for("the worker's Pods of the run gone", pods_gone, timeout=120)


def test_before_a_worker_takes_it_the_manager_says_what_it_waits_for(
    cluster: Cluster, worker: Worker, dispatching: str, namespace: str
) -> None:
    """A run whose queue has no room on the worker: on the manager it is Queued, saying
    that MultiKueue dispatches it, with Kueue's words."""
    ns = namespace
    both_namespaces(cluster, worker, ns)
    big = dispatched_run(ns, "big")
    big["spec"]["distribution"]["nodeCount"] = 8  # more than either ClusterQueue's quota
    k8s.create(big)
    waiting = wait_status(
        k8s.TRAININGRUNS, ns, "big", lambda s: s.get("phase") == "Queued", timeout=60
    )["status"]
    admitted = next(c for c in waiting["conditions"] if c["type"] == "Admitted")
    assert admitted["reason"] == "MultiKueue"
    assert admitted["message"].startswith("dispatched by MultiKueue (spec.managedBy)")
    assert worker.get("trainingrun", ns, "big") is None
