"""The Azure ML guide's code, with only its imports changed (examples/azureml/
train_at_scale.py), against the real control plane: a Workspace from a config file, a
compute target, an Environment from a conda file (built in the cluster), a ScriptRunConfig
with PyTorchConfiguration(process_count=4, node_count=2), submit, wait_for_completion,
register_model and download_file.

KWOK runs the Pods, so the test plays the kubelet's part: it pushes the Environment's
image when the build Job runs, and when the node Pods run it runs each node's launcher
here, with the Pod's own environment, a registry token of the ServiceAccount the Pod runs
as (the workspace's ``serviceAccount``, through ``spec.serviceAccountName``) and the code
unpacked from the run's snapshot ConfigMap, so outputs and logs reach the registry
service as they would from the Pods. KWOK serves no Pod logs, and the run may end
between two of the SDK's polls: ``show_output`` must still print every rank, from the
archive.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.harness import Cluster
from tests.cluster.registry import OciRegistry
from tests.conftest import InProcessOperator
from tests.integration.conftest import ProxiedRegistry, operator_archiving_to
from tests.integration.helpers import (
    finish_pod,
    local_node_env,
    run_pods,
    wait_for,
    wait_status,
)
from tests.integration.test_envbuild import push_base_image
from tests.integration.test_environments import running_build_pod
from torchyard import k8s
from torchyard.launch import main, node_files
from torchyard.planning import environments

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "examples" / "azureml" / "train_at_scale.py"
# Stands in for the guide's pytorch_train.py (the real one trains for minutes): the same
# arguments, the rank contract read from the environment, outputs/model.pt from rank 0.
TRAIN = """\
import argparse, json, os, pathlib
p = argparse.ArgumentParser()
p.add_argument("--num_epochs", type=int)
p.add_argument("--output_dir")
a = p.parse_args()
print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "epochs", a.num_epochs)
if os.environ["RANK"] == "0":
    out = pathlib.Path(a.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.pt").write_bytes(b"birds" * 4096)
    (out / "metrics.json").write_text(json.dumps({"best_val_acc": 0.86}))
"""


@pytest.fixture
def archiving(
    operator: InProcessOperator,
    behind_apiserver: ProxiedRegistry,
    tmp_path: Path,
) -> Iterator[ProxiedRegistry]:
    """The operator restarted to archive to the registry service behind the apiserver."""
    service = behind_apiserver.service
    with operator_archiving_to(operator, service.url, behind_apiserver.token, tmp_path):
        yield behind_apiserver


def project(tmp_path: Path, namespace: str, oci: OciRegistry, registry: ProxiedRegistry) -> Path:
    """What a user has: the guide's script, its conda file, the training folder, and the
    workspace config (the one file Azure's config.json becomes)."""
    root = tmp_path / "project"
    (root / "pytorch-birds").mkdir(parents=True)
    shutil.copy(GUIDE, root / "train_at_scale.py")
    shutil.copy(GUIDE.parent / "conda_dependencies.yml", root / "conda_dependencies.yml")
    (root / "pytorch-birds" / "pytorch_train.py").write_text(TRAIN)
    (root / ".torchyard").mkdir()
    (root / ".torchyard" / "config.json").write_text(
        json.dumps(
            {
                "namespace": namespace,
                "imageRepository": f"{oci.host}/envs",
                "insecureRegistry": True,
                "computeTargets": {"gpu-cluster": "a100"},
                "serviceAccount": "trainer",
                "registryService": registry.ref,
            }
        )
    )
    return root


def run_node(pod: dict[str, Any], work: Path) -> subprocess.CompletedProcess[str]:
    """A node Pod as a local process: its launcher unpacks the snapshot ConfigMap (the
    Pod's ``--copy``, with this machine's folders), then runs the Pod's command with the
    Pod's environment."""
    ns = pod["metadata"]["namespace"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "source")
    configmap = k8s.get(k8s.CONFIGMAPS, ns, volume["configMap"]["name"])
    mounted = work / "configmap"
    mounted.mkdir(parents=True)
    for key, data in configmap["binaryData"].items():
        (mounted / key).write_bytes(base64.b64decode(data))
    code = work / "code"
    container = pod["spec"]["containers"][0]
    _python, _launcher, copy, source, workdir, separator, *command = container["command"]
    assert (copy, source, workdir, separator) == ("--copy", "/torchyard/source", "/workspace", "--")
    assert node_files.prepare(["--copy", str(mounted), str(code)]) == 0
    # The token of the ServiceAccount the Pod really runs as: one without the registry's
    # permissions would be refused here, as it would be in a cluster.
    env = local_node_env(pod, code, pod["spec"]["serviceAccountName"])
    command = [sys.executable if c in ("python", "python3") else c for c in command]
    return subprocess.run(
        [sys.executable, main.__file__, "--", *command],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_guide_runs_with_only_its_imports_changed(
    cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    oci_registry: OciRegistry,
    archiving: ProxiedRegistry,
) -> None:
    code = [line for line in GUIDE.read_text().splitlines() if not line.startswith("#")]
    imports = [line for line in code if line.startswith(("from ", "import "))]
    assert imports and all(line.startswith("from torchyard.sdk import ") for line in imports)
    root = project(tmp_path, namespace, oci_registry, archiving)
    user = subprocess.Popen(
        [sys.executable, "train_at_scale.py"],
        cwd=root,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # The Environment from the conda file is built in the cluster: one build Job;
        # the test pushes the image the builder would have pushed.
        env = wait_for(
            "the Environment's content hash",
            lambda: (
                (k8s.get_or_none(k8s.ENVIRONMENTS, namespace, "pytorch-1-6-gpu") or {})
                .get("status", {})
                .get("hash")
                and k8s.get(k8s.ENVIRONMENTS, namespace, "pytorch-1-6-gpu")
            ),
            60,
        )
        assert env["spec"]["baseImage"].startswith("mcr.microsoft.com/azureml/openmpi")
        assert "torch==2.15.0" in env["spec"]["conda"]
        build = running_build_pod(namespace)
        push_base_image(oci_registry, "envs", environments.image_tag(env["status"]["hash"]))
        finish_pod(cluster, namespace, build, 0)

        # Two node Pods of 2 processes on the pool behind "gpu-cluster", 2 GPUs each.
        run = wait_for(
            "the TrainingRun",
            lambda: k8s.list_(k8s.TRAININGRUNS, namespace),
            60,
        )[0]
        name = run["metadata"]["name"]
        assert name.startswith("tutorial-pytorch-birds-")
        dist = run["spec"]["distribution"]
        assert (dist["nodeCount"], dist["processCountPerNode"], dist["launch"]) == (2, 2, "process")
        assert run["spec"]["command"] == [
            "python3",
            "pytorch_train.py",
            "--num_epochs",
            "30",
            "--output_dir",
            "./outputs",
        ]
        assert run["spec"]["compute"]["pool"] == "a100"
        assert run["spec"]["resources"]["gpusPerNode"] == 2
        # The workspace's serviceAccount is the one the node Pods run as.
        assert run["spec"]["serviceAccountName"] == "trainer"
        wait_status(
            k8s.TRAININGRUNS,
            namespace,
            name,
            lambda s: s.get("phase") == "Running" and s.get("nodes", {}).get("running") == 2,
            60,
        )
        for pod in run_pods(namespace, name):
            assert pod["spec"]["serviceAccountName"] == "trainer"
            node = run_node(pod, tmp_path / pod["metadata"]["name"])
            assert node.returncode == 0, node.stdout + node.stderr
            assert "epochs 30" in node.stdout
        for pod in run_pods(namespace, name):
            finish_pod(cluster, namespace, pod["metadata"]["name"], 0)
        out, _ = user.communicate(timeout=120)
    finally:
        if user.poll() is None:
            user.kill()
            print(user.communicate()[0])  # what the user saw, when the test failed
    assert user.returncode == 0, out
    assert "Found existing compute target" in out
    assert f"TrainingRun {name}: [" in out and "Succeeded" in out
    assert "pytorch-birds\tpytorch-birds:1\t1" in out
    # show_output=True: every rank's log, here from the archive (KWOK has no kubelet logs),
    # each once, though the run ended within one poll of the SDK.
    assert "(live logs were not available: node 0: " in out
    for rank in range(4):
        line = f"[node {rank // 2}] [rank {rank}] rank {rank} of 4 epochs 30"
        assert out.count(line) == 1, out

    # register_model made version 1 from the run's model.pt, recorded as a ModelVersion.
    mv = k8s.get(k8s.MODELVERSIONS, namespace, "pytorch-birds-v1")
    assert mv["spec"]["run"]["name"] == name
    assert [f["path"] for f in mv["spec"]["files"]] == ["model.pt"]
    assert mv["spec"]["environmentImage"].startswith(f"{oci_registry.host}/envs@sha256:")
    available = {c["type"]: c for c in mv["status"]["conditions"]}["Available"]
    assert available["status"] == "True"
    # download_file fetched it, byte for byte.
    assert (root / "model.pt").read_bytes() == b"birds" * 4096
