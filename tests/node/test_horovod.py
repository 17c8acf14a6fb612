"""Horovod on the REAL node: ``examples/horovod`` (the guide's ``pytorch_horovod_mnist.py``
shape on generated data) as an MPI TrainingRun of 2 nodes x 2 slots, as its
``trainingrun.yaml`` says, in the ``pytorch-horovod`` image: Horovod 0.28.1 built from
PyPI's source against Debian's torch 1.13 and OpenMPI 4.1 (``tests/cluster/horovod_image.py``,
the recipe of the example's Environment), given to the run as a curated Environment.

Node 0's launcher runs mpirun over both node Pods (no sshd, user 1000); ``hvd.init()``
takes the ranks from OpenMPI. Everything is read back from the kubelet (``spec.nodeName``,
container states, ``pods/log``) and the registry stand-in. Fixtures come from
tests/node/conftest.py (``real_operator``, ``registry``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import environment
from tests.cluster import horovod_image
from tests.cluster import images as local_images
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.conftest import InProcessOperator
from tests.integration.helpers import run_pods, wait_status
from tests.integration.test_registry_service import Service
from tests.node.runs import RESOURCES, archived_run, container, explain, logs, on_real_node
from torchyard import k8s

pytestmark = pytest.mark.node

HOROVOD = Path(__file__).resolve().parents[2] / "examples" / "horovod"
RANK = re.compile(r"^\[rank (\d)\] horovod rank (\d) of (\d) \(local rank (\d)\)$", re.M)
SUMS = re.compile(r"^\[rank (\d)\] rank (\d) parameter-sum (\S+) average (\S+)$", re.M)
ACCURACY = re.compile(r"^\[rank 0\] Test set: Average loss: (\S+), Accuracy: (\S+)%$", re.M)


@pytest.fixture
def horovod_env(namespace: str, real_operator: RealNode) -> local_images.Image:
    """The curated Environment ``pytorch-horovod`` of the Horovod image, imported into the
    real node's containerd (made on this machine the first time: about 15 minutes)."""
    image = horovod_image.ensure_horovod_image()
    local_images.import_image(real_operator.containerd_socket, image)
    k8s.create(environment("pytorch-horovod", namespace, image=image.ref))
    wait_status(k8s.ENVIRONMENTS, namespace, "pytorch-horovod", lambda s: s.get("phase") == "Ready")
    return image


def example_run(namespace: str, node: RealNode) -> dict[str, Any]:
    """examples/horovod/trainingrun.yaml's TrainingRun, on the real node's pool."""
    docs = list(yaml.safe_load_all((HOROVOD / "trainingrun.yaml").read_text()))
    body: dict[str, Any] = next(d for d in docs if d["kind"] == "TrainingRun")
    body["metadata"]["namespace"] = namespace
    body["spec"].pop("source")  # torchyard submit --source puts the folder in a ConfigMap
    body["spec"].update(
        compute={"pool": node.pool}, resources=dict(RESOURCES), serviceAccountName="trainer"
    )
    return body


def test_the_horovod_example_trains_on_two_nodes_by_two_slots(
    cluster: Cluster,
    namespace: str,
    real_operator: RealNode,
    horovod_env: local_images.Image,
    operator: InProcessOperator,
    registry: tuple[Service, str, str],
    tmp_path: Path,
) -> None:
    ns, node = namespace, real_operator
    svc, url, _ = registry
    body = example_run(ns, node)
    name = body["metadata"]["name"]
    assert body["spec"]["distribution"] == {"type": "mpi", "nodeCount": 2, "processCountPerNode": 2}
    run, elapsed = archived_run(cluster, operator, url, body, HOROVOD, tmp_path, 420)
    print(f"\n[node] horovod 2x2 on real Pods: {run['status'].get('phase')} in {elapsed:.1f}s")
    assert run["status"]["phase"] == "Succeeded", explain(cluster, ns, name) + "\n".join(
        cluster.kubectl("logs", "-n", ns, f"{name}-{i}", check=False)[-3000:] for i in (0, 1)
    )
    pods = run_pods(ns, name)
    on_real_node(pods, node, 2)
    for pod in pods:
        assert pod["spec"]["containers"][0]["image"] == horovod_env.ref
        assert container(pod, "trainer")["state"]["terminated"]["exitCode"] == 0
        assert pod["spec"]["securityContext"]["runAsUser"] == 1000
    text = logs(cluster, ns, f"{name}-0")
    # hvd.init() under mpirun: each rank its Horovod rank of 4, two on each node Pod
    seen = {
        int(label): (int(r), int(size), int(local)) for label, r, size, local in RANK.findall(text)
    }
    assert seen == {r: (r, 4, r % 2) for r in range(4)}, text[-4000:]
    # DistributedOptimizer kept the four models equal: the same parameter sum everywhere
    sums = {int(label): (total, average) for label, _, total, average in SUMS.findall(text)}
    assert sorted(sums) == [0, 1, 2, 3] and len(set(sums.values())) == 1, sums
    accuracy = [float(a) for _, a in ACCURACY.findall(text)]
    assert len(accuracy) == 3 and accuracy[-1] >= 90, accuracy
    assert "mpirun: all ranks succeeded" in text
    assert "node 1: mpirun ended (exit code 0)" in logs(cluster, ns, f"{name}-1")
    archived = svc.root / ns / "runs" / name
    metrics = json.loads((archived / "outputs" / "metrics.json").read_text())
    assert metrics["world_size"] == 4 and metrics["test_accuracy"] >= 0.9, metrics
    assert run["status"]["model"] == {"name": "horovod-mnist", "version": 1}
