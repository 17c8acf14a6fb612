"""``torchyard tensorboard``'s live path on a REAL kubelet: node 0's event folder comes out
of its running Pod through the exec API as a tar stream (``sdk.tensorboard.PodSource``,
``k8s.pod_exec_output``): its plain files, never a link planted there; a file of a size
already had is not read again; a Pod that has no event folder yet has nothing."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from tests.cluster.realnode import RealNode
from tests.integration.helpers import wait_for
from tests.node.helpers import Pods
from torchyard.sdk import tensorboard as tb

pytestmark = pytest.mark.node

WRITER = textwrap.dedent(
    """\
    import os, pathlib, time
    folder = pathlib.Path(os.environ["TORCHYARD_OUTPUTS"]) / "tensorboard"
    if os.environ.get("WRITE"):
        (folder / "train").mkdir(parents=True)
        (folder / "train" / ".part").write_bytes(b"first")
        os.symlink("/etc/hostname", folder / "leak")
        os.rename(folder / "train" / ".part", folder / "train" / "events.out.tfevents.1")
    time.sleep(600)
    """
)


def trainer(pods: Pods, name: str, write: bool) -> dict[str, Any]:
    env = [{"name": "TORCHYARD_OUTPUTS", "value": "/tmp/outputs"}]
    if write:
        env.append({"name": "WRITE", "value": "1"})
    manifest = pods.manifest(name, WRITER, container={"name": tb.TRAINER, "env": env})
    pods.create(manifest)
    return dict(
        wait_for(
            f"Pod {name} running",
            lambda: (p := pods.get(name)).get("status", {}).get("phase") == "Running" and p,
            120,
        )
    )


def test_a_running_pods_event_files_come_out_as_plain_files_only(
    pods: Pods, real_node: RealNode, namespace: str
) -> None:
    pod = trainer(pods, "tb-0", write=True)
    assert pod["spec"]["nodeName"] == real_node.name
    source = tb.PodSource(namespace, "tb-0", "node Pod tb-0 (running)")
    event = "train/events.out.tfevents.1"
    found, left = wait_for("the event file", lambda: (r := source.read({}))[0] and r, 60)
    assert found == {event: b"first"}
    assert [name.removeprefix("./") for name in left] == ["leak"]
    assert source.read({event: 5})[0] == {}  # its size already had: not read again

    trainer(pods, "tb-none", write=False)
    assert tb.PodSource(namespace, "tb-none", "node Pod tb-none").read({}) == ({}, [])
