"""The guide's other two ways of running, end to end on the REAL node: per-node launch
with ``torchrun`` (``examples/torchrun``), and the Azure ML guide script itself
(``examples/azureml/train_at_scale.py``, only its imports changed) through
``torchyard.sdk``. (The birds run with its ONNX export is in test_trainingruns.py.)

The operator runs in-process with the torchyard image as its init image; the training
Pods run in the locally made PyTorch image (Debian's torch 1.13, CPU, gloo). Every test
checks that its Pods ran on the real node (``spec.nodeName``) and reads what the ranks
did from the kubelet (``pods/log``) or from the archive the node Pods uploaded, so none
passes on KWOK or with faked work.

Fixtures: ``real_operator``, ``env`` and ``registry`` (tests/node/conftest.py),
``oci_registry`` (tests/conftest.py) for the guide's Environment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.cluster.registry import OciRegistry, push_archive
from tests.conftest import InProcessOperator
from tests.integration.helpers import run_pods
from tests.integration.test_registry_service import Service, trainer_token
from tests.node import runs
from tests.node.test_trainingruns import CHECKSUM
from torchyard import api, k8s
from torchyard.planning import environments

pytestmark = pytest.mark.node


REPO = Path(__file__).resolve().parents[2]
TORCHRUN = REPO / "examples" / "torchrun"
GUIDE = REPO / "examples" / "azureml" / "train_at_scale.py"

RESULT = re.compile(
    r"^\[node (\d)\] rank (\d)/(\d): loss \S+ weight (\S+) bias (\S+)$", re.MULTILINE
)
CONTRACT = re.compile(r"^\[node (\d)\] rank-contract (\{.*\})$", re.MULTILINE)


def test_torchrun_per_node_launch_runs_two_nodes_by_two_processes(
    cluster: Cluster, env: str, real_node: RealNode, tmp_path: Path
) -> None:
    """examples/torchrun/trainingrun.yaml as it is (``launch: node``, the command
    ``torchrun train.py``, no arguments for torchrun), on the real node's pool."""
    ns = env
    body = yaml.safe_load((TORCHRUN / "trainingrun.yaml").read_text())
    name = body["metadata"]["name"]
    assert body["spec"]["distribution"]["launch"] == "node"
    assert body["spec"]["command"][0] == "torchrun"
    body["metadata"]["namespace"] = ns
    body["spec"].update(
        environment="pytorch",  # the curated training image instead of a pip build
        compute={"pool": real_node.pool},
        resources=dict(runs.RESOURCES),
        runAsUser=1000,
    )
    started = time.monotonic()
    runs.submit(cluster, tmp_path, body, source=TORCHRUN)
    run = runs.finished(ns, name, timeout=240)
    elapsed = time.monotonic() - started
    print(f"\n[node] torchrun 2 nodes x 2 on real Pods: {run['status']['phase']} in {elapsed:.1f}s")
    assert run["status"]["phase"] == "Succeeded", runs.explain(cluster, ns, name)
    pods = run_pods(ns, name)
    runs.on_real_node(pods, real_node, 2)
    master = f"{name}-0.{name}.{ns}.svc"
    results: dict[int, tuple[int, str, str]] = {}
    for node, pod in enumerate(pods):
        assert runs.container(pod, "trainer")["state"]["terminated"]["exitCode"] == 0
        text = runs.logs(cluster, ns, pod["metadata"]["name"])
        # torchrun started this node's two workers from the PET_* variables alone
        contracts = [json.loads(c) for n, c in CONTRACT.findall(text) if int(n) == node]
        assert len(contracts) == 2, text[-3000:]
        for contract in contracts:
            assert (contract["PET_NNODES"], contract["PET_NPROC_PER_NODE"]) == ("2", "2")
            assert contract["PET_NODE_RANK"] == str(node)
            assert contract["PET_MASTER_ADDR"] == master
            assert contract["WORLD_SIZE"] == "4"
        assert sorted(int(c["RANK"]) for c in contracts) == [2 * node, 2 * node + 1]
        for label, rank, world, weight, bias in RESULT.findall(text):
            assert int(label) == node
            results[int(rank)] = (int(world), weight, bias)
        assert f"[torchyard] the command of node {node} succeeded" in text, text[-3000:]
    # every rank of both Pods printed its result, and DDP made them agree
    assert sorted(results) == [0, 1, 2, 3], results
    assert {world for world, _, _ in results.values()} == {4}
    assert len({(weight, bias) for _, weight, bias in results.values()}) == 1, results


def guide_environment(namespace: str, repository: str) -> api.Environment:
    """The Environment the guide registers: its base image and conda file, pushed to the
    workspace's imageRepository (as ``torchyard.sdk.Environment`` writes it)."""
    base = re.search(r'docker\.base_image = "([^"]+)"', GUIDE.read_text())
    assert base, "the guide sets pytorch_env.docker.base_image"
    body = {
        "apiVersion": api.API_VERSION,
        "kind": "Environment",
        "metadata": {"name": "pytorch-1-6-gpu", "namespace": namespace},
        "spec": {
            "baseImage": base.group(1),
            "conda": (GUIDE.parent / "conda_dependencies.yml").read_text(),
            "registry": {"repository": repository, "insecure": True},
        },
    }
    return api.parse_environment(body)


def birds_accuracy(model_file: Path, count: int = 64) -> float:
    """The accuracy of a ``model.pt`` of examples/birds on ``count`` fresh birds."""
    import importlib

    import torch

    sys.path.insert(0, str(runs.BIRDS))
    try:
        birds_data = importlib.import_module("birds_data")
        train = importlib.import_module("pytorch_train")
    finally:
        sys.path.remove(str(runs.BIRDS))
    saved = torch.load(model_file, map_location="cpu")
    model = train.Classifier(train.Backbone(), len(saved["classes"]))
    model.load_state_dict(saved["state_dict"])
    model.eval()
    images, labels = birds_data.birds(count, seed=11)
    with torch.no_grad():
        predicted = model(torch.from_numpy(images)).argmax(1).numpy()
    return float((predicted == labels).mean())


def test_the_azure_ml_guide_trains_and_registers_through_the_sdk_on_real_pods(
    cluster: Cluster,
    namespace: str,
    real_operator: RealNode,
    operator: InProcessOperator,
    oci_registry: OciRegistry,
    registry: tuple[Service, str, str],
    tmp_path: Path,
) -> None:
    """The guide's script, unchanged but for its imports, run by a user (a process with
    a kubeconfig): Workspace.from_config, the compute target (the real node's pool), an
    Environment from its conda file, PyTorchConfiguration(process_count=4, node_count=2),
    submit, wait_for_completion(show_output=True), register_model, download_file.

    The guide's conda Environment is found already built (its image, the training image,
    is in the workspace's registry under the recipe's content hash, as after an earlier
    build), so the operator pulls no base image from the internet; building one for real
    is tested on its own. The node Pods pull that image from the registry through the
    node's containerd."""
    ns, node = namespace, real_operator
    svc, url, ref = registry
    token_file = tmp_path / "operator-token"
    token_file.write_text(trainer_token(ns))  # ServiceAccount trainer, the workspace's
    repository = f"{oci_registry.host}/envs"
    recipe = guide_environment(ns, repository)
    tag = environments.image_tag(environments.content_hash(recipe))
    push_archive(oci_registry, node.images["pytorch"].archive, "envs", tag)

    root = tmp_path / "project"
    shutil.copytree(runs.BIRDS, root / "pytorch-birds")  # the guide's ./pytorch-birds
    shutil.copy(GUIDE, root / "train_at_scale.py")
    shutil.copy(GUIDE.parent / "conda_dependencies.yml", root / "conda_dependencies.yml")
    (root / ".torchyard").mkdir()
    (root / ".torchyard" / "config.json").write_text(
        json.dumps(
            {
                "namespace": ns,
                "imageRepository": repository,
                "insecureRegistry": True,
                "computeTargets": {"gpu-cluster": node.pool},
                "serviceAccount": "trainer",
                "registryService": ref,
            }
        )
    )
    user_env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_REGISTRY")}
    with runs.operator_with(
        operator, TORCHYARD_REGISTRY_URL=url, TORCHYARD_REGISTRY_TOKEN_FILE=str(token_file)
    ):
        started = time.monotonic()
        user = subprocess.run(
            [sys.executable, "train_at_scale.py"],
            cwd=root,
            env={**user_env, "KUBECONFIG": str(cluster.kubeconfig)},
            capture_output=True,
            text=True,
            timeout=540,
        )
        elapsed = time.monotonic() - started
    out = user.stdout + user.stderr
    listed = k8s.list_(k8s.TRAININGRUNS, ns)
    assert len(listed) == 1, out
    name = listed[0]["metadata"]["name"]
    print(f"\n[node] the Azure ML guide through the SDK on real Pods: exit {user.returncode} "
          f"in {elapsed:.1f}s")  # fmt: skip
    assert user.returncode == 0, out + runs.explain(cluster, ns, name)
    assert "Found existing compute target" in out
    assert "pytorch-birds\tpytorch-birds:1\t1" in out, out

    # The Environment was the cached image, and the node Pods ran it on the real node.
    environment = k8s.get(k8s.ENVIRONMENTS, ns, "pytorch-1-6-gpu")
    assert environment["status"]["phase"] == "Ready", environment["status"]
    image = environment["status"]["image"]
    assert image.startswith(f"{repository}@sha256:"), image
    run = k8s.get(k8s.TRAININGRUNS, ns, name)
    assert run["status"]["phase"] == "Succeeded"
    dist = run["spec"]["distribution"]
    assert (dist["nodeCount"], dist["processCountPerNode"]) == (2, 2)
    assert run["spec"]["command"][-4:] == ["--num_epochs", "30", "--output_dir", "./outputs"]
    pods = run_pods(ns, name)
    runs.on_real_node(pods, node, 2)
    checksums: dict[int, str] = {}
    for pod in pods:
        # the Pod names the Environment's image; the kubelet pulled and ran that manifest
        assert pod["spec"]["containers"][0]["image"] == image
        trainer = runs.container(pod, "trainer")
        assert trainer["imageID"].endswith(image.split("@", 1)[1]), trainer
        assert trainer["state"]["terminated"]["exitCode"] == 0
        text = runs.logs(cluster, ns, pod["metadata"]["name"])
        for label, rank, digest in CHECKSUM.findall(text):
            assert label == rank
            checksums[int(rank)] = digest
    # four ranks over both Pods, the same parameters at the end (DDP over gloo)
    assert sorted(checksums) == [0, 1, 2, 3] and len(set(checksums.values())) == 1, checksums
    # show_output=True printed every rank's log (live from the kubelet or the archive)
    for rank in range(4):
        assert f"[rank {rank}] param-checksum rank {rank} {checksums[rank]}" in out

    # The training converged: rank 0's metrics, archived by node 0 through the Service
    archived = svc.root / ns / "runs" / name / "outputs"
    metrics = json.loads((archived / "metrics.json").read_text())
    assert metrics["world_size"] == 4
    assert metrics["loss_final"] < 0.75 * metrics["loss_first"], metrics
    assert metrics["val_accuracy"] >= 0.85, metrics  # two classes: chance is 0.5
    # register_model made version 1 of model.pt; download_file fetched it, and it sorts
    # birds it never saw
    mv = k8s.get(k8s.MODELVERSIONS, ns, "pytorch-birds-v1")
    assert mv["spec"]["run"]["name"] == name
    assert [f["path"] for f in mv["spec"]["files"]] == ["model.pt"]
    assert mv["spec"]["environmentImage"] == image
    available = {c["type"]: c for c in mv["status"]["conditions"]}["Available"]
    assert available["status"] == "True"
    downloaded = root / "model.pt"
    assert downloaded.read_bytes() == (archived / "model.pt").read_bytes()
    accuracy = birds_accuracy(downloaded)
    print(f"[node] the guide's model: {accuracy:.2f} accuracy on 64 unseen birds")
    assert accuracy >= 0.85, accuracy
