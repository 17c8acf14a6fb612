"""spec.checkpoints: the claim the operator creates, the volume, mount and variables of every
node Pod, the grace period, and the combinations the API refuses."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import api
from torchyard.planning import checkpoints, pods


def run_with(checkpoints_spec: dict[str, Any] | None, nodes: int = 1, **policy: Any) -> Any:
    builder = TrainingRunBuilder("toy", "ml").nodes(nodes)
    if checkpoints_spec is not None:
        builder = builder.with_("spec.checkpoints", checkpoints_spec)
    for key, value in policy.items():
        builder = builder.with_(f"spec.policy.{key}", value)
    body = builder.obj()
    body["metadata"]["uid"] = "uid-7"
    return api.parse_trainingrun(body)


def env_of(manifest: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in manifest["spec"]["containers"][0]["env"]}


def test_a_created_claim_is_owned_by_the_run_and_mounted_in_every_node_pod() -> None:
    run = run_with({"size": "5Gi", "storageClassName": "fast", "interval": 100, "keep": 2}, 2)
    claim = checkpoints.claim(run, pods.owner_reference(run))
    assert claim is not None
    assert claim["metadata"]["name"] == "toy-checkpoints"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "uid-7"
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],  # two nodes share the folder
        "resources": {"requests": {"storage": "5Gi"}},
        "storageClassName": "fast",
    }
    for node in range(2):
        manifest = pods.pod(run, node, image="img")
        volumes = {v["name"]: v for v in manifest["spec"]["volumes"]}
        assert volumes["checkpoints"] == {
            "name": "checkpoints",
            "persistentVolumeClaim": {"claimName": "toy-checkpoints"},
        }
        mounts = manifest["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "checkpoints", "mountPath": checkpoints.MOUNT_PATH} in mounts
        env = env_of(manifest)
        assert env["TORCHYARD_CHECKPOINT_DIR"] == checkpoints.MOUNT_PATH
        assert env["TORCHYARD_CHECKPOINT_INTERVAL"] == "100"
        assert env["TORCHYARD_CHECKPOINT_KEEP"] == "2"
        assert env["TORCHYARD_CHECKPOINT_MAX_STALLS"] == "3"
        assert env["TORCHYARD_CHECKPOINT_ATTEMPT"] == "uid-7-0"
    restarted = pods.pod(run, 1, image="img", attempt=3)
    assert env_of(restarted)["TORCHYARD_CHECKPOINT_ATTEMPT"] == "uid-7-3"


def test_one_node_gets_a_read_write_once_claim_by_default() -> None:
    claim = checkpoints.claim(run_with({"size": "1Gi"}), {"uid": "x"})
    assert claim is not None and claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "storageClassName" not in claim["spec"]


def test_a_named_claim_is_mounted_but_not_created() -> None:
    run = run_with({"claimName": "team-ckpt"})
    assert checkpoints.claim(run, pods.owner_reference(run)) is None
    manifest = pods.pod(run, 0, image="img")
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "team-ckpt"}} in (
        manifest["spec"]["volumes"]
    )
    assert "TORCHYARD_CHECKPOINT_INTERVAL" not in env_of(manifest)


def test_without_checkpoints_nothing_is_added() -> None:
    run = run_with(None)
    manifest = pods.pod(run, 0, image="img")
    assert all(v["name"] != "checkpoints" for v in manifest["spec"]["volumes"])
    assert not any(k.startswith("TORCHYARD_CHECKPOINT") for k in env_of(manifest))
    assert manifest["spec"]["terminationGracePeriodSeconds"] == 30


def test_the_grace_period_comes_from_the_spec_and_bounds_the_just_in_time_save() -> None:
    run = run_with({"size": "1Gi"}, terminationGracePeriodSeconds=120)
    manifest = pods.pod(run, 0, image="img")
    assert manifest["spec"]["terminationGracePeriodSeconds"] == 120
    # 120 s less the launcher's own 10 s to stop its ranks, less 2 s to report.
    assert env_of(manifest)["TORCHYARD_CHECKPOINT_SAVE_SECONDS"] == "108"
    short = run_with({"size": "1Gi"}, terminationGracePeriodSeconds=5)
    assert env_of(pods.pod(short, 0, image="img"))["TORCHYARD_CHECKPOINT_SAVE_SECONDS"] == "1"


@pytest.mark.parametrize(
    ("spec", "nodes", "message"),
    [
        ({}, 1, "exactly one of claimName"),
        ({"claimName": "a", "size": "1Gi"}, 1, "exactly one of claimName"),
        ({"claimName": "a", "storageClassName": "fast"}, 1, "set them with size"),
        ({"claimName": "a", "accessMode": "ReadWriteOnce"}, 1, "set them with size"),
        ({"size": "1Gi", "accessMode": "ReadWriteOnce"}, 2, "must be ReadWriteMany"),
        ({"size": "1Gi", "keep": 0}, 1, "keep"),
        ({"size": "lots"}, 1, "size"),
    ],
)
def test_combinations_that_do_not_work_are_refused_with_what_to_do(
    spec: dict[str, Any], nodes: int, message: str
) -> None:
    with pytest.raises(api.InvalidSpec, match=message):
        run_with(spec, nodes)
