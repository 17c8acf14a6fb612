"""One MLflow run per TrainingRun on the REAL node: a 2 nodes x 2 processes DDP run whose
script logs with ``mlflow.log_metric`` itself, in the PyTorch image with an MLflow client
(``tests/node/mlflow/Dockerfile``, built once and cached by its inputs), against a real
``mlflow server`` on an address of this machine the node's Pods reach. Every process's
MLflow calls land in the one run the operator made: the script's metrics beside
torchyard's parameters, tags and final status. A tracking server that cannot be reached
leaves the same script training to the end, and the run says so.

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
from tests.node.test_trainingruns import (  # noqa: F401 (fixtures)
    ddp_run,
    explain,
    finished,
    logs,
    on_real_node,
    real_operator,
    submit,
)
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


LOSS_LINE = re.compile(r"^\[rank 0\] rank 0 step (\d) loss (\S+)$", re.MULTILINE)


@pytest.fixture(scope="module")
def mlflow_image(real_operator: RealNode) -> local_images.Image:  # noqa: F811
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


def test_a_2x2_run_whose_script_logs_to_mlflow_is_one_mlflow_run(
    cluster: Cluster,
    namespace: str,
    real_operator: RealNode,  # noqa: F811
    mlflow_image: local_images.Image,
    operator: InProcessOperator,
    tracking_server: str,
    source: Path,
    tmp_path: Path,
) -> None:
    ns, name, uri = mlflow_env(namespace, mlflow_image), "birds", tracking_server
    body = ddp_run(name, ns, real_operator).command("python", "train.py").obj()
    with tracking_to(operator, uri):
        started = time.monotonic()
        submit(cluster, tmp_path, body, source=source)
        run = finished(ns, name, timeout=240)
        done = wait_status(k8s.TRAININGRUNS, ns, name, lambda s: s.get("tracking", {}).get("ended"))
    elapsed = time.monotonic() - started
    print(f"\n[node] 2x2 logging to MLflow: {run['status']['phase']} in {elapsed:.1f}s")
    assert run["status"]["phase"] == "Succeeded", explain(cluster, ns, name)
    on_real_node(run_pods(ns, name), real_operator, 2)
    said = ranks_said(cluster, ns, name)
    assert all(f"rank {r} tracked True" in said for r in range(4)), said[-3000:]
    ids = done["status"]["tracking"]

    (only,) = mlflow(uri, "runs/search", {"experiment_ids": [ids["experimentId"]]})["runs"]
    info, data = only["info"], only["data"]
    assert info["run_id"] == ids["runId"]
    # the script's own metrics: rank 0's loss at each step, as it printed it, and a
    # metric from every one of the four processes
    printed = {int(step): float(loss) for step, loss in LOSS_LINE.findall(said)}
    assert history(uri, ids["runId"], "loss") == sorted(printed.items()) and len(printed) == 3
    metrics = by_key(data["metrics"])
    assert {k for k in metrics if k.startswith("rank_")} == {f"rank_{r}_steps" for r in range(4)}
    # torchyard's parameters and tags, and the final status
    params, tags = by_key(data["params"]), by_key(data["tags"])
    assert json.loads(params["torchyard.command"]) == ["python", "train.py"]
    assert params["torchyard.world_size"] == "4" and params["torchyard.nodes"] == "2"
    assert params["torchyard.image"] == mlflow_image.ref
    assert tags["torchyard.namespace"] == ns and tags["torchyard.run"] == name
    assert tags["torchyard.phase"] == "Succeeded" and tags["torchyard.attempt"] == "0"
    assert info["status"] == "FINISHED" and info["end_time"] >= info["start_time"]


def test_an_unreachable_tracking_server_leaves_the_run_training_and_says_so(
    cluster: Cluster,
    namespace: str,
    real_operator: RealNode,  # noqa: F811
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
