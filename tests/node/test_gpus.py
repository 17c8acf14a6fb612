"""GPUs through the kubelet's device manager on the REAL node: the device-plugin stand-in
(``tests/cluster/deviceplugin.py``) registers ``nvidia.com/gpu`` with the kubelet, which
reports them as allocatable, admits Pods against them, asks the stand-in to allocate and
puts ``NVIDIA_VISIBLE_DEVICES`` into the container, as with NVIDIA's device plugin on a
GPU node (no GPU is touched: the ids are the stand-in's).

Every Pod is pinned to the real node by its pool label and checked to have run there.
Fixtures in ``tests/node/conftest.py``.
"""

from __future__ import annotations

import base64
import json
import re
import textwrap
from typing import Any

import pytest

from tests.cluster import deviceplugin
from tests.cluster.deviceplugin import RESOURCE, VISIBLE_DEVICES
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.node.helpers import Pods, terminated

pytestmark = pytest.mark.node

GPU_ID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
CHECKPOINT = deviceplugin.PLUGIN_DIR / "kubelet_internal_checkpoint"
PRINT_IDS = f"import os; print(os.environ.get({VISIBLE_DEVICES!r}, '<unset>'), flush=True)"
# prints its ids, then holds them until a test creates /tmp/done (kubectl exec)
HOLD_IDS = textwrap.dedent(
    f"""\
    import os, sys, time
    print(os.environ[{VISIBLE_DEVICES!r}], flush=True)
    deadline = time.time() + 180
    while not os.path.exists("/tmp/done"):
        if time.time() > deadline:
            sys.exit("nobody released me")
        time.sleep(0.1)
    """
)


def gpus(count: int) -> dict[str, Any]:
    return {"resources": {"limits": {RESOURCE: str(count)}}}


def on_real_node(pod: dict[str, Any], node: RealNode) -> None:
    assert pod["spec"].get("nodeName") == node.name, f"scheduled elsewhere: {pod['spec']}"


def visible(pods: Pods, name: str) -> list[str]:
    """The ids the container saw in NVIDIA_VISIBLE_DEVICES (its first log line)."""
    return pods.logs(name).splitlines()[0].strip().split(",")


def unschedulable(pods: Pods, name: str) -> str | None:
    """The scheduler's message while ``name`` cannot be placed (None otherwise)."""
    for condition in pods.get(name).get("status", {}).get("conditions", []):
        if (condition["type"], condition["status"]) == ("PodScheduled", "False"):
            return str(condition.get("message", ""))
    return None


def checkpoint_entries(uid: str) -> list[dict[str, Any]]:
    """The kubelet's device-manager checkpoint entries of the Pod ``uid``."""
    data = json.loads(CHECKPOINT.read_text())["Data"]
    return [e for e in data["PodDeviceEntries"] or [] if e["PodUID"] == uid]


def test_the_node_offers_the_advertised_gpus_as_allocatable(real_node: RealNode):
    node = real_node.node()
    assert len(real_node.gpus) == real_node.gpu_count == deviceplugin.DEFAULT_COUNT
    assert len(set(real_node.gpus)) == len(real_node.gpus)
    assert all(GPU_ID.fullmatch(i) for i in real_node.gpus), real_node.gpus
    assert node["status"]["capacity"][RESOURCE] == str(real_node.gpu_count)
    assert node["status"]["allocatable"][RESOURCE] == str(real_node.gpu_count)
    # the kubelet's own record of what the stand-in advertised
    registered = json.loads(CHECKPOINT.read_text())["Data"]["RegisteredDevices"]
    assert sorted(registered[RESOURCE]) == sorted(real_node.gpus)
    status = deviceplugin.read_status(real_node.device_plugin_status)
    assert status is not None and status["registrations"] >= 1 and status["watches"] >= 1


def test_a_pod_asking_two_gpus_sees_two_advertised_ids_the_kubelet_recorded(
    pods: Pods, real_node: RealNode
):
    # a Pod that asks for none sees none: the variable comes from the allocation
    pods.create(pods.manifest("none", PRINT_IDS))
    none = pods.finished("none")
    on_real_node(none, real_node)
    assert pods.logs("none").strip() == "<unset>"

    pods.create(pods.manifest("two", PRINT_IDS, container=gpus(2)))
    pod = pods.finished("two")
    on_real_node(pod, real_node)
    assert pod["status"]["phase"] == "Succeeded", pods.explain("two")
    assert terminated(pod)["exitCode"] == 0
    ids = visible(pods, "two")
    assert len(ids) == 2 and len(set(ids)) == 2, ids
    assert set(ids) <= set(real_node.gpus), (ids, real_node.gpus)

    # the kubelet's device manager made this allocation: its checkpoint has the Pod's
    # devices and the stand-in's answer, which decodes with our v1beta1 messages
    (entry,) = checkpoint_entries(pod["metadata"]["uid"])
    assert (entry["ContainerName"], entry["ResourceName"]) == ("main", RESOURCE)
    recorded = [i for per_numa in entry["DeviceIDs"].values() for i in per_numa]
    assert sorted(recorded) == sorted(ids)
    answer = deviceplugin.MESSAGES["ContainerAllocateResponse"].FromString(
        base64.b64decode(entry["AllocResp"])
    )
    assert dict(answer.envs) == {VISIBLE_DEVICES: ",".join(ids)}  # type: ignore[attr-defined]
    status = deviceplugin.read_status(real_node.device_plugin_status)
    assert status is not None and sorted(ids) in [sorted(a) for a in status["allocations"]]


def test_a_pod_waits_while_another_holds_the_gpus_and_gets_them_when_it_ends(
    cluster: Cluster, pods: Pods, real_node: RealNode, namespace: str
):
    assert len(real_node.gpus) == 4  # 3 + 3 > 4: the second Pod must wait for the first
    pods.create(pods.manifest("first", HOLD_IDS, container=gpus(3)))
    real_node.wait_for(
        "pod first running with its ids printed",
        lambda: pods.get("first")["status"].get("phase") == "Running" and pods.logs("first"),
        timeout=120,
    )
    held = visible(pods, "first")
    assert len(set(held)) == 3 and set(held) <= set(real_node.gpus), held

    pods.create(pods.manifest("second", PRINT_IDS, container=gpus(3)))
    # more than the node has at all: never placed, whatever is released
    pods.create(pods.manifest("greedy", PRINT_IDS, container=gpus(5)))
    for name in ("second", "greedy"):
        message = real_node.wait_for(
            f"the scheduler to find no room for {name}",
            lambda name=name: unschedulable(pods, name),
            timeout=60,
        )
        assert f"Insufficient {RESOURCE}" in message, message
    assert "nodeName" not in pods.get("second")["spec"]
    assert pods.get("first")["status"]["phase"] == "Running"

    # the first ends (Succeeded): its devices go back, and the second gets three of them
    cluster.kubectl(
        "exec", "-n", namespace, "first", "--", "python", "-c", "open('/tmp/done', 'w').close()"
    )
    first = pods.finished("first")
    assert first["status"]["phase"] == "Succeeded", pods.explain("first")
    second = pods.finished("second", timeout=120)
    on_real_node(second, real_node)
    assert second["status"]["phase"] == "Succeeded", pods.explain("second")
    got = visible(pods, "second")
    assert len(set(got)) == 3 and set(got) <= set(real_node.gpus), got
    # 3 of 4 devices twice: at least two of the first Pod's came back into use
    assert len(set(got) & set(held)) >= 2, (held, got)

    greedy = pods.get("greedy")
    assert "nodeName" not in greedy["spec"] and greedy["status"]["phase"] == "Pending"
    assert f"Insufficient {RESOURCE}" in (unschedulable(pods, "greedy") or "")


def test_the_kubelet_refuses_a_pod_bound_past_its_gpus(pods: Pods, real_node: RealNode):
    """Bypassing the scheduler (``nodeName`` set) reaches the kubelet's own admission,
    which counts the stand-in's devices: the Pod fails instead of running without them."""
    manifest = pods.manifest("bound", PRINT_IDS, container=gpus(len(real_node.gpus) + 1))
    manifest["spec"].pop("nodeSelector")
    manifest["spec"]["nodeName"] = real_node.name
    pods.create(manifest)
    pod = pods.finished("bound", timeout=60)
    status = pod["status"]
    assert status["phase"] == "Failed", pods.explain("bound")
    assert status["reason"] == "UnexpectedAdmissionError", status
    wanted = len(real_node.gpus) + 1
    assert (
        f"requested number of devices unavailable for {RESOURCE}. "
        f"Requested: {wanted}, Available: {len(real_node.gpus)}"
    ) in status["message"], status
    assert not status.get("containerStatuses"), "a container was started without its GPUs"


def test_the_stand_in_registers_again_when_the_kubelet_restarts(pods: Pods, real_node: RealNode):
    """A restarted kubelet empties its device-plugin folder (the stand-in's socket with
    it) and serves a new kubelet.sock: the stand-in must serve again and register again,
    or GPU Pods fail admission from then on."""
    before = deviceplugin.read_status(real_node.device_plugin_status)
    assert before is not None
    socket = deviceplugin.PLUGIN_DIR / deviceplugin.ENDPOINT
    old_socket = deviceplugin.socket_identity(socket)
    assert old_socket is not None
    real_node.restart_kubelet()
    after = real_node.wait_for(
        "the stand-in to register with the new kubelet and be watched by it",
        lambda: (
            (s := deviceplugin.read_status(real_node.device_plugin_status))
            and s["registrations"] > before["registrations"]
            and s["watches"] > before["watches"]
            and s
        ),
        timeout=60,
    )
    assert after["pid"] == before["pid"]  # the same process: it noticed by itself
    assert deviceplugin.socket_identity(socket) not in (None, old_socket)  # served anew
    pods.create(pods.manifest("after-restart", PRINT_IDS, container=gpus(1)))
    pod = pods.finished("after-restart")
    on_real_node(pod, real_node)
    assert pod["status"]["phase"] == "Succeeded", pods.explain("after-restart")
    (gpu,) = visible(pods, "after-restart")
    assert gpu in real_node.gpus
    assert real_node.allocatable() == str(len(real_node.gpus))
