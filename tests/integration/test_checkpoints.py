"""spec.checkpoints on the real control plane (KWOK nodes): the claim the operator creates is
owned by the run and bound, every node Pod of every attempt mounts the same one with the
checkpoint variables, and the apiserver's CEL rules refuse what does not combine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.builders import TrainingRunBuilder
from tests.cluster.harness import Cluster
from tests.integration.helpers import (
    finish_pod,
    launcher_message,
    run_pods,
    static_volume,
    wait_for,
    wait_status,
)
from torchyard import k8s
from torchyard.planning import checkpoints

PVCS = k8s.PERSISTENTVOLUMECLAIMS


@pytest.fixture
def volume(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A statically provisioned volume of a storage class of this test's own."""
    name = f"ckpt-{namespace}"[:63]
    static_volume(cluster, name, name)
    yield name
    cluster.kubectl("delete", "pv", name, "--wait=false", check=False)


def test_the_created_claim_is_owned_bound_and_mounted_by_every_attempt(
    cluster: Cluster, env: str, volume: str
) -> None:
    ns = env
    created = k8s.create(
        TrainingRunBuilder("toy", ns)
        .environment("pytorch")
        .nodes(2)
        .gpus(1)
        .pool("a100")
        .with_("spec.policy.backoffLimit", 1)
        .with_(
            "spec.checkpoints",
            {"size": "1Gi", "storageClassName": volume, "interval": 50, "keep": 2},
        )
        .obj()
    )
    claim = wait_for(
        "the checkpoint claim bound",
        lambda: next(
            (
                c
                for c in k8s.list_(PVCS, ns)
                if c["metadata"]["name"] == "toy-checkpoints"
                and c.get("status", {}).get("phase") == "Bound"
            ),
            None,
        ),
        timeout=60,
    )
    [owner] = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("TrainingRun", created["metadata"]["uid"])
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["volumeName"] == volume

    def mounted(pods: list[dict[str, object]]) -> None:
        assert len(pods) == 2
        for pod in pods:
            spec = pod["spec"]
            assert isinstance(spec, dict)
            volumes = {v["name"]: v for v in spec["volumes"]}
            assert volumes["checkpoints"]["persistentVolumeClaim"] == {
                "claimName": "toy-checkpoints"
            }
            env_vars = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
            assert env_vars["TORCHYARD_CHECKPOINT_DIR"] == checkpoints.MOUNT_PATH
            assert env_vars["TORCHYARD_CHECKPOINT_INTERVAL"] == "50"
            assert spec["terminationGracePeriodSeconds"] == 30

    wait_status(k8s.TRAININGRUNS, ns, "toy", lambda s: s.get("phase") == "Running", timeout=60)
    mounted(run_pods(ns, "toy"))
    finish_pod(cluster, ns, "toy-0", 1, launcher_message(0, 0, "RuntimeError: boom"))
    wait_status(
        k8s.TRAININGRUNS,
        ns,
        "toy",
        lambda s: s.get("restarts") == 1 and s.get("phase") == "Running",
        timeout=60,
    )
    mounted(run_pods(ns, "toy"))
    again = [c for c in k8s.list_(PVCS, ns) if c["metadata"]["name"] == "toy-checkpoints"]
    assert [c["metadata"]["uid"] for c in again] == [claim["metadata"]["uid"]]


@pytest.mark.parametrize(
    ("checkpoints_spec", "nodes", "message"),
    [
        ({"size": "1Gi", "claimName": "mine"}, 1, "exactly one of claimName"),
        ({"keep": 2}, 1, "exactly one of claimName"),
        ({"claimName": "mine", "storageClassName": "fast"}, 1, "set them with size"),
        ({"size": "1Gi", "accessMode": "ReadWriteOnce"}, 2, "must be ReadWriteMany"),
    ],
)
def test_the_apiserver_refuses_what_does_not_combine(
    namespace: str, checkpoints_spec: dict[str, object], nodes: int, message: str
) -> None:
    body = (
        TrainingRunBuilder("bad", namespace)
        .nodes(nodes)
        .with_("spec.checkpoints", checkpoints_spec)
        .obj()
    )
    with pytest.raises(k8s.ApiError) as err:
        k8s.create(body)
    assert err.value.status == 422
    assert message in err.value.message
