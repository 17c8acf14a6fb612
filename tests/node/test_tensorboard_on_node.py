"""``torchyard tensorboard``'s live path on a REAL kubelet: node 0's event folder comes out
of its running Pod through the exec API as a tar stream (``sdk.tensorboard.PodSource``,
``k8s.pod_exec_output``): its plain files, never a link planted there; a file of a size
already had is not read again; a Pod that has no event folder yet has nothing. And the
whole of it as a user runs it: a TrainingRun training on the real node (its command alone,
as spec.runAsUser in an image whose working directory it may not write: the launcher keeps
the outputs under the temporary directory), ``torchyard tensorboard RUN`` with a real
TensorBoard, whose scalars API shows the run's steps and then the ones it writes after,
while it runs."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.integration.helpers import run_pods, wait_for, wait_status
from tests.node.helpers import Pods
from tests.node.test_failures import node_run
from tests.tensorboards import SCALARS_STDLIB, tensorboard
from tests.tensorboards import tensorboard_venv as tensorboard_venv  # (a fixture)
from torchyard import k8s
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


def test_a_training_runs_scalars_show_in_tensorboard_and_new_ones_as_it_writes_them(
    cluster: Cluster, env: str, real_node: RealNode, tmp_path: Path, tensorboard_venv: Path
) -> None:
    ns, name = env, "scalars"
    body = node_run(name, ns, real_node, SCALARS_STDLIB).obj()
    body["spec"]["command"] += ["600"]  # a step a second, until the test deletes the run
    k8s.create(body)
    wait_status(k8s.TRAININGRUNS, ns, name, lambda s: s.get("phase") == "Running", 180)
    [pod] = run_pods(ns, name)
    assert pod["spec"]["nodeName"] == real_node.name
    kube = {"KUBECONFIG": str(cluster.kubeconfig)}
    try:
        with tensorboard(tensorboard_venv, tmp_path / "kept", name, "-n", ns, env=kube) as served:
            try:
                first = wait_for("the run's first scalars", lambda: served.steps(name), 120)
            except AssertionError as err:  # (what torchyard tensorboard said, to see why)
                raise AssertionError(f"{err}\n{served.output()}") from None
            assert first == list(range(len(first))), first
            started = time.monotonic()
            later = wait_for(
                "scalars the run wrote after TensorBoard read its first ones",
                lambda: (got := served.steps(name)) and got[-1] > first[-1] + 2 and got,
                120,
            )
            print(f"\n[node] live TensorBoard: steps {first[-1]} -> {later[-1]} seen "
                  f"{time.monotonic() - started:.1f}s later")  # fmt: skip
            assert later == list(range(len(later))), later  # every step, in order
            assert f"{name}: event files from node Pod" in served.output(), served.output()
        assert k8s.get(k8s.TRAININGRUNS, ns, name)["status"]["phase"] == "Running"
    finally:
        k8s.delete(k8s.TRAININGRUNS, ns, name)
