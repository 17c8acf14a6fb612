"""Suspend and resume on the REAL node: the deterministic toy of test_checkpoints (2 node
Pods x 1 rank, gloo, float64) holds all 4 of the node's GPUs; ``torchyard suspend`` makes
both ranks save a just-in-time checkpoint and stop, the run queued behind it gets the GPUs
and runs to its end while the first is Suspended, and ``torchyard resume`` continues the
first run from the suspend step: its next losses equal the uninterrupted run's to 1e-6.
Checks ``spec.nodeName`` and reads the losses from the kubelet (``pods/log``).
"""

from __future__ import annotations

from pathlib import Path

from tests.builders import TrainingRunBuilder
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.integration.helpers import conditions, run_pods, wait_status
from tests.node import runs
from tests.node import test_checkpoints as toy
from torchyard import checkpoint, k8s

pytestmark = toy.pytestmark

volume = toy.volume


def test_suspend_then_resume_continues_from_the_suspend_step_and_frees_the_gpus(
    cluster: Cluster, env: str, real_node: RealNode, volume: tuple[str, Path]
) -> None:
    ns, name = env, "suspended"
    storage_class, host = volume
    steps = 90
    body = toy.toy_run(
        name, ns, real_node, storage_class, steps, backoffLimit=0,
        terminationGracePeriodSeconds=30,
    )  # fmt: skip
    body["spec"]["resources"]["gpusPerNode"] = 2  # 2 x 2: every GPU of the node
    k8s.create(body)
    cluster.wait_for("both ranks past step 8", lambda: toy.reported(host) >= 8, timeout=240)
    runs.on_real_node(run_pods(ns, name), real_node, 2)
    other = (
        TrainingRunBuilder("other", ns)
        .environment("pytorch")
        .command("python", "-c", "print('other ran', flush=True)")
        .nodes(1)
        .procs(1)
        .gpus(2)
        .pool(real_node.pool)
        .with_("spec.resources", {**runs.RESOURCES, "gpusPerNode": 2})
        .with_("spec.runAsUser", 1000)
        .obj()
    )
    k8s.create(other)
    wait_status(k8s.TRAININGRUNS, ns, "other", lambda s: s.get("phase") == "Queued")

    at_suspend = max(checkpoint.reported(str(host)).values())
    said = runs.torchyard(cluster, "suspend", name, "-n", ns)
    assert said.returncode == 0, said.stderr
    suspended = wait_status(
        k8s.TRAININGRUNS,
        ns,
        name,
        lambda s: (
            s.get("phase") == "Suspended"
            and conditions({"status": s})["Suspended"]["reason"] == "Suspended"
        ),
        timeout=120,
    )
    assert suspended["status"]["suspensions"] == 1
    saved = checkpoint.complete_steps(str(host))
    assert saved and saved[-1] > at_suspend, (saved, at_suspend)  # the just-in-time one
    print(f"\n[node] suspended after step {at_suspend}: checkpoint at step {saved[-1]}")

    # The GPUs it held went to the run queued behind it, which ran while it was suspended.
    done = runs.finished(ns, "other", timeout=240)
    assert done["status"]["phase"] == "Succeeded", runs.explain(cluster, ns, "other")
    runs.on_real_node(run_pods(ns, "other"), real_node, 1)
    log = cluster.kubectl("logs", "-n", ns, "other-0", "-c", "trainer")
    assert "other ran" in log
    still = k8s.get(k8s.TRAININGRUNS, ns, name)
    assert still["status"]["phase"] == "Suspended" and run_pods(ns, name) == []

    said = runs.torchyard(cluster, "resume", name, "-n", ns)
    assert said.returncode == 0, said.stderr
    run = runs.finished(ns, name, timeout=360)
    assert run["status"]["phase"] == "Succeeded", runs.explain(cluster, ns, name)
    assert run["status"].get("failedAttempts", 0) == 0
    runs.on_real_node(run_pods(ns, name), real_node, 2)
    resumed, losses = toy.final_losses(cluster, ns, name)
    assert resumed == saved[-1], (resumed, saved)  # continues from the suspend step
    expected = toy.reference_losses(steps)
    compared = range(resumed + 1, min(steps, resumed + 50) + 1)
    assert len(compared) == 50
    for step in compared:
        assert abs(losses[step] - expected[step]) < 1e-6, (step, losses[step], expected[step])
