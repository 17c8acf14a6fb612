"""One MLflow run per TrainingRun on the REAL node: the birds example as 2 nodes x 2
processes, whose rank 0 logs with ``mlflow.log_metric`` itself, in the PyTorch image with an
MLflow client (``tests/node/mlflow/Dockerfile``, built once and cached by its inputs),
against a real ``mlflow server`` on an address of this machine the node's Pods reach. The
script's calls land in the one run the operator made and handed to every process: its
metrics beside torchyard's parameters, mirrored progress, tags and final status. A tracking
server that cannot be reached leaves a DDP script that logs from every rank training to
the end, and the run says so.

(What the operator mirrors, a sweep's parent run and a restart are tested against the
same server on the control plane alone: tests/integration/tracking/test_mlflow.py.)"""

from __future__ import annotations

import json
import re
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.builders import environment
from tests.cluster import buildah
from tests.cluster import images as local_images
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.conftest import InProcessOperator
from tests.integration.conftest import _host_address
from tests.integration.helpers import conditions, run_pods, wait_status
from tests.integration.tracking.test_mlflow import (
    _free_port,
    by_key,
    mlflow,
    mlflow_get,
    serving,
    tracking_to,
)
from tests.node.runs import ddp_run, explain, finished, logs, on_real_node, submit
from torchyard import k8s

pytestmark = pytest.mark.node

# Four ranks train one model with DDP over gloo; every rank's MLflow client logs that it
# ran (so a rank that opened a run of its own would show), rank 0 the loss per step.
TRAIN = textwrap.dedent(
    """\
    import os
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tracked = "MLFLOW_RUN_ID" in os.environ  # no tracking server: no MLflow calls
    if tracked:
        import mlflow
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        torch.manual_seed(100 * step + rank)
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean = mean.item() / world
        print(f"rank {rank} step {step} loss {mean!r}", flush=True)
        if tracked and rank == 0:
            mlflow.log_metric("loss", mean, step=step)
    if tracked:
        mlflow.log_metric(f"rank_{rank}_steps", 3)
    print(f"rank {rank} tracked {tracked}", flush=True)
    dist.destroy_process_group()
    """
)


BIRDS = Path(__file__).resolve().parents[2] / "examples" / "birds"
BIRDS_ARGS = ("--output_dir", "./outputs", "--pretrain_epochs", "1", "--num_epochs", "2")
BIRDS_ARGS += ("--images", "80")


@pytest.fixture(scope="module")
def mlflow_image(real_operator: RealNode) -> local_images.Image:
    """The PyTorch image with an MLflow client, in the real node's containerd."""
    image = buildah.ensure_project_image("pytorch-mlflow", base=real_operator.images["pytorch"])
    local_images.import_image(real_operator.containerd_socket, image)
    return image


@pytest.fixture
def tracking_server(tmp_path: Path) -> Iterator[str]:
    """The MLflow server on this machine's address that the node's Pods reach."""
    store = tmp_path / "mlflow"
    store.mkdir()
    with serving(store, _host_address()) as uri:
        yield uri


@pytest.fixture
def source(tmp_path: Path) -> Path:
    folder = tmp_path / "source"
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    return folder


def mlflow_env(namespace: str, image: local_images.Image) -> str:
    k8s.create(environment("pytorch", namespace, image=image.ref))
    wait_status(k8s.ENVIRONMENTS, namespace, "pytorch", lambda s: s.get("phase") == "Ready")
    return namespace


def ranks_said(cluster: Cluster, namespace: str, name: str) -> str:
    return "".join(
        logs(cluster, namespace, p["metadata"]["name"]) for p in run_pods(namespace, name)
    )


def history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    found = mlflow_get(uri, "metrics/get-history", {"run_id": run_id, "metric_key": key})
    return [(int(p["step"]), float(p["value"])) for p in found.get("metrics") or []]


def test_a_2x2_birds_run_is_one_mlflow_run_with_the_scripts_metrics_and_torchyards(
    cluster: Cluster,
    namespace: str,
    real_operator: RealNode,
    mlflow_image: local_images.Image,
    operator: InProcessOperator,
    tracking_server: str,
    tmp_path: Path,
) -> None:
    ns, name, uri = mlflow_env(namespace, mlflow_image), "birds", tracking_server
    command = ["python", "pytorch_train.py", *BIRDS_ARGS]
    body = ddp_run(name, ns, real_operator).command(*command).obj()
    with tracking_to(operator, uri):
        started = time.monotonic()
        submit(cluster, tmp_path, body, source=BIRDS)
        run = finished(ns, name, timeout=300)
        done = wait_status(k8s.TRAININGRUNS, ns, name, lambda s: s.get("tracking", {}).get("ended"))
    elapsed = time.monotonic() - started
    print(f"\n[node] 2x2 birds tracked in MLflow: {run['status']['phase']} in {elapsed:.1f}s")
    assert run["status"]["phase"] == "Succeeded", explain(cluster, ns, name)
    pods = run_pods(ns, name)
    on_real_node(pods, real_operator, 2)
    ids = done["status"]["tracking"]
    # every process was handed the one run (the launcher passes its Pod's environment on)
    for pod in pods:
        [trainer] = [c for c in pod["spec"]["containers"] if c["name"] == "trainer"]
        env = {e["name"]: e.get("value") for e in trainer.get("env") or []}
        assert env["MLFLOW_RUN_ID"] == ids["runId"], pod["metadata"]["name"]
        assert env["MLFLOW_EXPERIMENT_ID"] == ids["experimentId"]

    # exactly one MLflow run in the experiment: the operator's, which the script logged into
    (only,) = mlflow(uri, "runs/search", {"experiment_ids": [ids["experimentId"]]})["runs"]
    info, data = only["info"], only["data"]
    assert info["run_id"] == ids["runId"]
    # the script's own metrics, as rank 0 printed them: each epoch's loss, and the summary
    said = ranks_said(cluster, ns, name)
    for phase, epochs in (("pretrain", 1), ("finetune", 2)):
        printed = [float(x) for x in re.findall(rf"{phase} epoch \d+/{epochs} loss (\S+)", said)]
        logged = history(uri, ids["runId"], f"{phase}_loss")
        assert len(printed) == epochs and len(logged) == epochs, (phase, logged, said[-3000:])
        first = 0 if phase == "pretrain" else 1
        assert [s for s, _ in logged] == list(range(first + 1, first + epochs + 1))
        assert [round(v, 4) for _, v in logged] == printed
    metrics = by_key(data["metrics"])
    [accuracy] = re.findall(r"val accuracy (\S+); saved", said)
    assert round(float(metrics["final_val_accuracy"]), 3) == float(accuracy)
    assert metrics["loss_final"] == history(uri, ids["runId"], "finetune_loss")[-1][1]
    # beside them what torchyard mirrored from the progress rank 0 reported at each epoch
    reported = {
        int(e): float(v) for e, v in re.findall(r"finetune epoch (\d)/2 .*val_accuracy (\S+)", said)
    }
    mirrored = history(uri, ids["runId"], "val_accuracy")
    assert mirrored and all(round(v, 3) == reported[step] for step, v in mirrored), mirrored
    # torchyard's parameters and tags, and the final status
    params, tags = by_key(data["params"]), by_key(data["tags"])
    assert json.loads(params["torchyard.command"]) == command
    assert params["torchyard.world_size"] == "4" and params["torchyard.nodes"] == "2"
    assert params["torchyard.image"] == mlflow_image.ref
    assert tags["torchyard.namespace"] == ns and tags["torchyard.run"] == name
    assert tags["torchyard.phase"] == "Succeeded" and tags["torchyard.attempt"] == "0"
    assert info["status"] == "FINISHED" and info["end_time"] >= info["start_time"]


def test_an_unreachable_tracking_server_leaves_the_run_training_and_says_so(
    cluster: Cluster,
    namespace: str,
    real_operator: RealNode,
    mlflow_image: local_images.Image,
    operator: InProcessOperator,
    source: Path,
    tmp_path: Path,
) -> None:
    ns, name = mlflow_env(namespace, mlflow_image), "untracked"
    uri = f"http://{_host_address()}:{_free_port()}"  # nothing listens there
    body = ddp_run(name, ns, real_operator).command("python", "train.py").nodes(1).obj()
    with tracking_to(operator, uri):
        submit(cluster, tmp_path, body, source=source)
        run = finished(ns, name, timeout=240)
    assert run["status"]["phase"] == "Succeeded", explain(cluster, ns, name)
    on_real_node(run_pods(ns, name), real_operator, 1)
    said = ranks_said(cluster, ns, name)
    assert "rank 1 step 2 loss" in said and "rank 0 tracked False" in said, said[-3000:]
    ready = conditions(run)["TrackingReady"]
    assert (ready["status"], ready["reason"]) == ("False", "TrackingServerError")
    assert uri in ready["message"] and "cannot be reached" in ready["message"]
