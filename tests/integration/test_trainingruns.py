"""TrainingRuns on the real control plane with KWOK GPU nodes: Pods and Service as
specified, gang admission, exact failure reporting, restarts, platform failures and an
operator restart in the middle of a 64-node fan-out."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder, environment
from tests.cluster.harness import KWOK_NODE_ANNOTATION, Cluster, Pool, node_manifest
from tests.conftest import InProcessOperator
from tests.integration.helpers import (
    conditions,
    finish_pod,
    launcher_message,
    run_pods,
    wait_event,
    wait_for,
    wait_status,
)
from torchyard import k8s
from torchyard.launch import main
from torchyard.planning.pods import LAUNCHER_PATH, shipped_files


@pytest.fixture
def extra_pool(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Pool]:
    """A pool of fake nodes of this test's own (so shared pools stay predictable)."""
    nodes, gpus = request.param
    pool = Pool(f"p{time.monotonic_ns() % 10**8}", nodes=nodes, gpus=gpus, cpu="16", memory="64Gi")
    for i in range(nodes):
        k8s.create(node_manifest(pool, i))
    wait_for(
        "extra pool Ready",
        lambda: (
            len(
                [
                    n
                    for n in k8s.list_(k8s.NODES, label_selector=f"torchyard.dev/pool={pool.name}")
                    if any(
                        c["type"] == "Ready" and c["status"] == "True"
                        for c in n.get("status", {}).get("conditions", [])
                    )
                ]
            )
            == nodes
        ),
    )
    yield pool
    for i in range(nodes):
        k8s.delete(k8s.NODES, None, f"{pool.name}-{i}")


def all_nodes_running(status: dict[str, Any]) -> bool:
    """Running, with node Pods counted and every one of them running (a status without
    the counts is not: ``None == None`` is no proof)."""
    nodes = status.get("nodes") or {}
    total = nodes.get("total")
    return (
        status.get("phase") == "Running"
        and isinstance(total, int)
        and total > 0
        and nodes.get("running") == total
    )


def running(namespace: str, name: str, timeout: float = 30) -> dict[str, Any]:
    """Wait until the run is Running with every node Pod running."""
    return wait_status(k8s.TRAININGRUNS, namespace, name, all_nodes_running, timeout)


def test_two_by_two_run_gets_its_pods_and_service_on_the_gpu_pool(
    cluster: Cluster, env: str
) -> None:
    ns = env
    k8s.create(
        TrainingRunBuilder("bert", ns)
        .environment("pytorch")
        .nodes(2)
        .procs(2)
        .gpus(2)
        .pool("a100")
        .with_("spec.resources.memory", "32Gi")
        .obj()
    )
    run = running(ns, "bert")
    assert run["status"]["nodes"]["ready"] == "2/2"
    pods = run_pods(ns, "bert")
    assert [p["metadata"]["name"] for p in pods] == ["bert-0", "bert-1"]
    services = k8s.list_(k8s.SERVICES, ns)
    assert [s["metadata"]["name"] for s in services] == ["bert"]
    assert services[0]["spec"]["clusterIP"] == "None"
    # It names node 0 alone (MASTER_ADDR), so its EndpointSlice does not change with
    # every Pod of a gang as they start.
    slices = k8s.Resource("discovery.k8s.io", "v1", "endpointslices")

    def endpoints() -> list[str]:
        found = k8s.list_(slices, ns, label_selector="kubernetes.io/service-name=bert")
        return sorted(e["targetRef"]["name"] for s in found for e in s.get("endpoints") or [])

    assert wait_for("the Service's endpoints", endpoints) == ["bert-0"]
    for node, p in enumerate(pods):
        assert p["spec"]["nodeName"].startswith("a100-")
        assert "schedulingGates" not in p["spec"]
        trainer = p["spec"]["containers"][0]
        assert trainer["image"] == "ghcr.io/acme/pytorch:2.15-cuda12"
        assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "2"
        env_vars = {e["name"]: e["value"] for e in trainer["env"]}
        assert env_vars["MASTER_ADDR"] == f"bert-0.bert.{ns}.svc"
        assert env_vars["MASTER_PORT"] == "6105"
        assert env_vars["WORLD_SIZE"] == "4"
        assert env_vars["NODE_RANK"] == env_vars["PET_NODE_RANK"] == str(node)
        assert env_vars["LOCAL_WORLD_SIZE"] == "2"
        assert p["spec"]["nodeSelector"] == {"torchyard.dev/pool": "a100"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in p["spec"][
            "tolerations"
        ]
        # No shmSize: half of the 32Gi memory limit (a memory-backed /dev/shm counts there).
        [dshm] = [v for v in p["spec"]["volumes"] if v["name"] == "dshm"]
        assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    for p in pods:
        finish_pod(cluster, ns, p["metadata"]["name"], 0)
    cluster.kubectl("wait", "--for=condition=Succeeded", "tr/bert", "-n", ns, "--timeout=30s")


@pytest.mark.parametrize("extra_pool", [(2, 8)], indirect=True)
def test_run_stays_queued_with_the_reason_until_capacity_frees(
    cluster: Cluster, env: str, extra_pool: Pool
) -> None:
    ns, pool = env, extra_pool.name
    k8s.create(
        TrainingRunBuilder("first", ns)
        .environment("pytorch")
        .nodes(2)
        .procs(8)
        .gpus(8)
        .pool(pool)
        .obj()
    )
    running(ns, "first")
    k8s.create(
        TrainingRunBuilder("second", ns)
        .environment("pytorch")
        .nodes(1)
        .procs(4)
        .gpus(4)
        .pool(pool)
        .obj()
    )
    queued = wait_status(k8s.TRAININGRUNS, ns, "second", lambda s: s.get("phase") == "Queued")
    admitted = conditions(queued)["Admitted"]
    assert admitted["reason"] == "Queued"
    assert admitted["message"] == f"needs 1 node(s) with 4 nvidia.com/gpu in pool {pool}; 0 fit now"
    assert all("schedulingGates" in p["spec"] for p in run_pods(ns, "second"))
    for p in run_pods(ns, "first"):
        finish_pod(cluster, ns, p["metadata"]["name"], 0)
    running(ns, "second")


@pytest.mark.parametrize("extra_pool", [(4, 8)], indirect=True)
def test_two_runs_that_fit_alone_never_end_up_half_scheduled(
    cluster: Cluster, env: str, extra_pool: Pool, operator: InProcessOperator
) -> None:
    ns, pool = env, extra_pool.name
    both_placed: list[dict[str, int]] = []
    stop = threading.Event()

    def watch() -> None:
        # The pool holds one of the two gangs: never may both have Pods on nodes.
        while not stop.is_set():
            bound = {
                run: sum(1 for p in run_pods(ns, run) if p["spec"].get("nodeName"))
                for run in ("left", "right")
            }
            if all(bound.values()):
                both_placed.append(bound)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for name in ("left", "right"):
            k8s.create(
                TrainingRunBuilder(name, ns)
                .environment("pytorch")
                .nodes(3)
                .procs(8)
                .gpus(8)
                .pool(pool)
                .obj()
            )
        wait_for(
            "one run Running, the other Queued",
            lambda: (
                sorted(
                    k8s.get(k8s.TRAININGRUNS, ns, n).get("status", {}).get("phase", "")
                    for n in ("left", "right")
                )
                == ["Queued", "Running"]
            ),
        )
        # the watcher keeps looking until the operator has reconciled both runs as they are
        # now with nothing due for either: any later placement would need a new event
        for name in ("left", "right"):
            operator.caught_up("TrainingRun", ns, name)
    finally:
        stop.set()
        watcher.join()
    assert both_placed == []
    phases = {n: k8s.get(k8s.TRAININGRUNS, ns, n)["status"]["phase"] for n in ("left", "right")}
    waiting = next(n for n, phase in phases.items() if phase == "Queued")
    assert all("schedulingGates" in p["spec"] for p in run_pods(ns, waiting))


def test_failing_rank_fails_the_run_with_rank_exit_code_and_traceback(
    cluster: Cluster, env: str
) -> None:
    ns = env
    k8s.create(
        TrainingRunBuilder("gpt", ns)
        .environment("pytorch")
        .nodes(3)
        .procs(2)
        .gpus(2)
        .pool("a100")
        .obj()
    )
    running(ns, "gpt")
    node_name = k8s.get(k8s.PODS, ns, "gpt-1")["spec"]["nodeName"]
    finish_pod(cluster, ns, "gpt-1", 1, launcher_message(3, 1, "ValueError: loss is NaN"))
    failed = wait_status(k8s.TRAININGRUNS, ns, "gpt", lambda s: s.get("phase") == "Failed")
    assert failed["status"]["failure"] == {
        "rank": 3,
        "node": 1,
        "pod": "gpt-1",
        "exitCode": 1,
        "reason": "Error",
        "message": 'Traceback (most recent call last):\n  File "train.py", line 9\n'
        "ValueError: loss is NaN",
        "class": "PythonException",  # launch.classes: retried within backoffLimit
        "retryable": True,
        "advice": failed["status"]["failure"]["advice"],
        "nodeName": node_name,  # the Node the failing rank ran on
    }
    assert failed["status"]["failure"]["advice"].endswith("(matched: ValueError: loss is NaN)")
    assert (
        conditions(failed)["Failed"]["message"]
        == "rank 3 (node 1) failed (Error, exit code 1): ValueError: loss is NaN"
    )
    # The surviving ranks do not burn GPUs: their Pods are gone within seconds.
    wait_for(
        "siblings deleted",
        lambda: [p["metadata"]["name"] for p in run_pods(ns, "gpt")] == ["gpt-1"],
        timeout=10,
    )
    wait_event(
        ns,
        "gpt",
        "the Error Event naming rank 3",
        lambda e: e["reason"] == "Error" and "rank 3" in e["message"],
    )


def test_backoff_limit_restarts_the_whole_gang_once(cluster: Cluster, env: str) -> None:
    ns = env
    k8s.create(
        TrainingRunBuilder("retry", ns)
        .environment("pytorch")
        .nodes(2)
        .gpus(1)
        .pool("a100")
        .with_("spec.policy.backoffLimit", 1)
        .obj()
    )
    running(ns, "retry")
    first_uids = {p["metadata"]["uid"] for p in run_pods(ns, "retry")}
    finish_pod(cluster, ns, "retry-0", 2, launcher_message(0, 0, "OSError: disk full"))
    wait_status(
        k8s.TRAININGRUNS,
        ns,
        "retry",
        lambda s: s.get("restarts") == 1 and s.get("phase") == "Running",
    )
    pods = run_pods(ns, "retry")
    assert len(pods) == 2 and not first_uids & {p["metadata"]["uid"] for p in pods}
    assert {p["metadata"]["labels"]["torchyard.dev/attempt"] for p in pods} == {"1"}
    finish_pod(cluster, ns, "retry-1", 3, launcher_message(1, 1, "OSError: disk full"))
    failed = wait_status(k8s.TRAININGRUNS, ns, "retry", lambda s: s.get("phase") == "Failed")
    assert failed["status"]["restarts"] == 1
    assert failed["status"]["failedAttempts"] == 1
    assert failed["status"]["failure"]["exitCode"] == 3


@pytest.mark.parametrize("extra_pool", [(1, 8)], indirect=True)
def test_a_lost_node_is_a_platform_failure_that_does_not_use_backoff(
    cluster: Cluster, env: str, extra_pool: Pool
) -> None:
    ns, pool = env, extra_pool.name
    k8s.create(
        TrainingRunBuilder("lost", ns).environment("pytorch").nodes(1).gpus(8).pool(pool).obj()
    )
    running(ns, "lost")
    k8s.delete(k8s.NODES, None, f"{pool}-0")
    # The Pod goes with its node (PodGC); the gang is restarted without counting against
    # backoffLimit (0 here), and waits for capacity again.
    queued = wait_status(
        k8s.TRAININGRUNS,
        ns,
        "lost",
        lambda s: s.get("restarts") == 1 and s.get("phase") == "Queued",
        timeout=120,
    )
    assert "failedAttempts" not in queued["status"]
    k8s.create(node_manifest(extra_pool, 0))
    running(ns, "lost", timeout=60)


@pytest.mark.parametrize("extra_pool", [(2, 8)], indirect=True)
def test_a_lost_node_with_no_platform_restart_left_fails_the_run_naming_pod_and_node(
    cluster: Cluster, env: str, extra_pool: Pool
) -> None:
    ns, pool = env, extra_pool.name
    k8s.create(
        TrainingRunBuilder("stranded", ns)
        .environment("pytorch")
        .nodes(2)
        .gpus(8)
        .pool(pool)
        .with_("spec.policy.platformRestartLimit", 0)
        .obj()
    )
    running(ns, "stranded")
    lost_node = k8s.get(k8s.PODS, ns, "stranded-1")["spec"]["nodeName"]
    k8s.delete(k8s.NODES, None, lost_node)
    failed = wait_status(
        k8s.TRAININGRUNS, ns, "stranded", lambda s: s.get("phase") == "Failed", timeout=60
    )
    failure = failed["status"]["failure"]
    assert (failure["reason"], failure["pod"], failure["node"]) == ("NodeLost", "stranded-1", 1)
    assert failure["message"].startswith("node Pod stranded-1 (node rank 1) ")
    assert failure["message"].endswith(
        "no platform restart left (0 of policy.platformRestartLimit 0 used)"
    )
    assert failed["status"]["restarts"] == 0
    assert conditions(failed)["Failed"]["reason"] == "NodeLost"
    # The Event names the node; the survivor does not burn its GPUs.
    wait_event(
        ns,
        "stranded",
        "the NodeLost Event naming the node",
        lambda e: e["reason"] == "NodeLost" and f"node {lost_node} was deleted" in e["message"],
    )
    wait_for("the survivor deleted", lambda: run_pods(ns, "stranded") == [], timeout=15)


def test_node_pods_run_as_the_runs_service_account_and_wait_for_it(
    cluster: Cluster, env: str
) -> None:
    ns = env
    k8s.create(
        TrainingRunBuilder("as-trainer", ns)
        .environment("pytorch")
        .pool("cpu")
        .with_("spec.serviceAccountName", "trainer")
        .obj()
    )
    waiting = wait_status(
        k8s.TRAININGRUNS,
        ns,
        "as-trainer",
        lambda s: any(c.get("reason") == "ServiceAccountNotFound" for c in s.get("conditions", [])),
    )
    assert waiting["status"]["phase"] == "Pending"
    admitted = conditions(waiting)["Admitted"]
    assert f"kubectl create serviceaccount trainer -n {ns}" in admitted["message"]
    k8s.create(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "trainer", "namespace": ns},
        }
    )
    running(ns, "as-trainer", timeout=40)
    [pod] = run_pods(ns, "as-trainer")
    assert pod["spec"]["serviceAccountName"] == "trainer"
    assert pod["spec"]["automountServiceAccountToken"] is False
    # The apiserver mounted no API token; the registry token is the operator's to add.
    containers = pod["spec"]["containers"] + pod["spec"].get("initContainers", [])
    mounts = [m["mountPath"] for c in containers for m in c.get("volumeMounts", [])]
    assert "/var/run/secrets/kubernetes.io/serviceaccount" not in mounts
    assert not [v for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access")]

    k8s.create(
        TrainingRunBuilder("with-api-token", ns)
        .environment("pytorch")
        .pool("cpu")
        .with_("spec.automountServiceAccountToken", True)
        .obj()
    )
    running(ns, "with-api-token")
    [pod] = run_pods(ns, "with-api-token")
    assert pod["spec"]["serviceAccountName"] == "default"
    mounts = [m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]]
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in mounts


def test_the_environments_python_runs_the_launcher_from_the_shipped_config_map(
    cluster: Cluster, env: str
) -> None:
    ns = env
    k8s.create(
        environment("conda", ns, image="ghcr.io/acme/conda:1", python="/opt/conda/bin/python")
    )
    wait_status(k8s.ENVIRONMENTS, ns, "conda", lambda s: s.get("phase") == "Ready")
    k8s.create(TrainingRunBuilder("conda-run", ns).environment("conda").pool("cpu").obj())
    running(ns, "conda-run")
    [pod] = run_pods(ns, "conda-run")
    assert "initContainers" not in pod["spec"]
    trainer = pod["spec"]["containers"][0]
    assert trainer["command"][:2] == ["/opt/conda/bin/python", LAUNCHER_PATH]
    # the operator applied the ConfigMap the Pod mounts, with this tree's launcher in it
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "torchyard"]
    shipped = k8s.get(k8s.CONFIGMAPS, ns, volume["configMap"]["name"])
    assert shipped["data"]["launch.main.py"] == shipped_files()["launch/main.py"]
    assert shipped["data"]["launch.main.py"].startswith(Path(main.__file__).read_text()[:200])
    assert shipped["immutable"] is True


def test_specs_the_apiserver_cannot_refuse_are_reported_as_conditions(
    cluster: Cluster, env: str, caplog: pytest.LogCaptureFixture, operator: InProcessOperator
) -> None:
    ns = env
    caplog.set_level(logging.INFO)
    k8s.create(TrainingRunBuilder("no-env", ns).environment("missing").obj())
    k8s.create(TrainingRunBuilder("no-pool", ns).environment("pytorch").pool("h100").obj())
    no_env = wait_status(k8s.TRAININGRUNS, ns, "no-env", lambda s: s.get("phase") == "Preparing")
    assert conditions(no_env)["EnvironmentReady"]["reason"] == "EnvironmentNotFound"
    no_pool = wait_status(k8s.TRAININGRUNS, ns, "no-pool", lambda s: s.get("phase") == "Queued")
    assert "no Ready node matches" in conditions(no_pool)["Admitted"]["message"]
    # Nothing crashed, nothing loops: the operator reconciled the run as it is and
    # wrote nothing more (a loop would have changed it again).
    rv = operator.caught_up("TrainingRun", ns, "no-pool")
    assert k8s.get(k8s.TRAININGRUNS, ns, "no-pool")["metadata"]["resourceVersion"] == rv
    assert not [
        r for r in caplog.records if r.name.startswith("torchyard") and r.levelno >= logging.ERROR
    ]


def test_active_deadline_fails_a_run_that_runs_too_long(cluster: Cluster, env: str) -> None:
    ns = env
    k8s.create(
        TrainingRunBuilder("slow", ns)
        .environment("pytorch")
        .nodes(2)
        .pool("cpu")
        .with_("spec.policy.activeDeadlineSeconds", 2)
        .obj()
    )
    running(ns, "slow")
    failed = wait_status(
        k8s.TRAININGRUNS, ns, "slow", lambda s: s.get("phase") == "Failed", timeout=20
    )
    assert failed["status"]["failure"]["reason"] == "DeadlineExceeded"
    wait_for("the ranks stopped", lambda: run_pods(ns, "slow") == [], timeout=10)


def test_ttl_cleans_up_pods_and_service_but_keeps_the_run(cluster: Cluster, env: str) -> None:
    ns = env
    k8s.create(
        TrainingRunBuilder("brief", ns)
        .environment("pytorch")
        .nodes(2)
        .pool("cpu")
        .with_("spec.policy.ttlSecondsAfterFinished", 1)
        .obj()
    )
    running(ns, "brief")
    for p in run_pods(ns, "brief"):
        finish_pod(cluster, ns, p["metadata"]["name"], 0)
    wait_status(k8s.TRAININGRUNS, ns, "brief", lambda s: s.get("phase") == "Succeeded")
    wait_for(
        "Pods and Service cleaned up",
        lambda: not run_pods(ns, "brief") and not k8s.list_(k8s.SERVICES, ns),
        timeout=15,
    )
    assert k8s.get(k8s.TRAININGRUNS, ns, "brief")["status"]["phase"] == "Succeeded"


def test_deleting_a_run_removes_its_children(cluster: Cluster, env: str) -> None:
    ns = env
    k8s.create(TrainingRunBuilder("doomed", ns).environment("pytorch").nodes(2).pool("cpu").obj())
    running(ns, "doomed")
    k8s.delete(k8s.TRAININGRUNS, ns, "doomed")
    wait_for(
        "children garbage-collected",
        lambda: not run_pods(ns, "doomed") and not k8s.list_(k8s.SERVICES, ns),
        timeout=30,
    )


@pytest.fixture
def no_resync(operator: InProcessOperator) -> Iterator[None]:
    """The operator restarted with a resync period far longer than the test: whatever
    it does in the test, it does on watch events."""
    operator.stop()
    os.environ["TORCHYARD_RESYNC_SECONDS"] = "3600"
    try:
        operator.start()
        yield
    finally:
        operator.stop()
        os.environ.pop("TORCHYARD_RESYNC_SECONDS", None)
        operator.start()


def one_gpu_node_run(ns: str, name: str, pool: str) -> None:
    k8s.create(
        TrainingRunBuilder(name, ns)
        .environment("pytorch")
        .nodes(1)
        .procs(8)
        .gpus(8)
        .pool(pool)
        .obj()
    )


def queue_of(ns: str, name: str) -> dict[str, Any] | None:
    place: dict[str, Any] | None = (
        k8s.get(k8s.TRAININGRUNS, ns, name).get("status", {}).get("queue")
    )
    return place


@pytest.mark.parametrize("extra_pool", [(1, 8)], indirect=True)
def test_a_freed_slot_is_refilled_by_the_next_gang_without_a_resync(
    cluster: Cluster, env: str, extra_pool: Pool, no_resync: None
) -> None:
    ns, pool = env, extra_pool.name
    one_gpu_node_run(ns, "first", pool)
    running(ns, "first", timeout=120)
    for name in ("second", "third"):
        one_gpu_node_run(ns, name, pool)
    wait_for(
        "second 1st, third 2nd in the pool's queue",
        lambda: (
            (queue_of(ns, "second"), queue_of(ns, "third"))
            == ({"pool": pool, "position": 1}, {"pool": pool, "position": 2})
        ),
        timeout=120,
    )
    table = cluster.kubectl("get", "tr", "third", "-n", ns)
    assert table.split()[:6] == ["NAME", "PHASE", "NODES", "PROCESSES", "QUEUE", "MODEL"]
    assert table.splitlines()[1].split()[:5] == ["third", "Queued", "0/1", "8", "2"]
    # Deleting a run sends the operator no event of its own that names the waiting runs:
    # only its Pods' deletion, which the admission pass acts on.
    k8s.delete(k8s.TRAININGRUNS, ns, "first")
    second = running(ns, "second", timeout=45)
    assert "queue" not in second["status"]
    assert all("schedulingGates" not in p["spec"] for p in run_pods(ns, "second"))
    wait_for(
        "third 1st", lambda: queue_of(ns, "third") == {"pool": pool, "position": 1}, timeout=45
    )


@pytest.mark.parametrize("extra_pool", [(2, 8)], indirect=True)
def test_a_node_that_becomes_not_ready_takes_its_capacity_out_of_admission(
    cluster: Cluster, env: str, extra_pool: Pool, no_resync: None
) -> None:
    ns, pool = env, extra_pool.name
    node = f"{pool}-1"
    # KWOK lets go of the node, which then says NotReady (as a kubelet that lost its GPUs).
    cluster.node_not_ready(node)
    # ... and the node lifecycle controller taints it (NoExecute on its next pass): once the
    # node is Ready again, only the taint's removal may follow (a taint put on late, on a
    # loaded machine, failed the gang admitted meanwhile).
    not_ready = ("node.kubernetes.io/not-ready", "NoExecute")
    wait_for(
        "the not-ready NoExecute taint",
        lambda: (
            not_ready
            in [
                (t["key"], t["effect"])
                for t in k8s.get(k8s.NODES, None, node)["spec"].get("taints", [])
            ]
        ),
    )
    k8s.create(
        TrainingRunBuilder("pair", ns)
        .environment("pytorch")
        .nodes(2)
        .procs(8)
        .gpus(8)
        .pool(pool)
        .obj()
    )
    queued = wait_status(k8s.TRAININGRUNS, ns, "pair", lambda s: s.get("phase") == "Queued")
    assert (
        "the pool cannot hold it even when idle (1 matching node(s))"
        in (conditions(queued)["Admitted"]["message"])
    )
    assert queued["status"]["queue"] == {"pool": pool, "position": 1}
    assert all("schedulingGates" in p["spec"] for p in run_pods(ns, "pair"))
    # KWOK takes the node back and says Ready: the Node's events alone admit the gang.
    cluster.kubectl("annotate", "node", node, f"{KWOK_NODE_ANNOTATION}=fake")
    pair = running(ns, "pair", timeout=90)
    assert sorted(p["spec"]["nodeName"] for p in run_pods(ns, "pair")) == [f"{pool}-0", node]
    assert "queue" not in pair["status"]


@pytest.mark.parametrize("extra_pool", [(1, 8)], indirect=True)
def test_gpus_that_another_pod_frees_are_refilled_without_a_resync(
    cluster: Cluster, env: str, extra_pool: Pool, no_resync: None, operator: InProcessOperator
) -> None:
    ns, pool = env, extra_pool.name
    k8s.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "someone-else", "namespace": ns},
            "spec": {
                "nodeSelector": {"torchyard.dev/pool": pool},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                "containers": [
                    {
                        "name": "c",
                        "image": "busybox",
                        "resources": {"limits": {"nvidia.com/gpu": "8"}},
                    }
                ],
            },
        }
    )
    wait_for(
        "someone else's Pod running",
        lambda: k8s.get(k8s.PODS, ns, "someone-else").get("status", {}).get("phase") == "Running",
        timeout=120,
    )
    one_gpu_node_run(ns, "after", pool)
    queued = wait_status(k8s.TRAININGRUNS, ns, "after", lambda s: s.get("phase") == "Queued")
    assert conditions(queued)["Admitted"]["message"].endswith("; 0 fit now")
    # The events of the run's own creation (its Pods, its status) are behind it: the
    # operator caught up with the queued run, so the deletion is the one event that can
    # admit it (an operator that polled its waiting runs would miss it).
    operator.caught_up("TrainingRun", ns, "after")
    k8s.delete(k8s.PODS, ns, "someone-else", grace_period_seconds=0)
    running(ns, "after", timeout=45)
