"""MPI TrainingRuns (``distribution.type: mpi``) on the REAL node: node 0's launcher runs
OpenMPI's mpirun (the ``pytorch`` test image carries Debian's openmpi-bin and
python3-mpi4py) over both node Pods, with the torchyard launcher as mpirun's agent in
place of ssh: no sshd, the Pods run as user 1000 with no added capabilities. The run's
key Secret is made by the in-process operator; everything is read back from the kubelet
(``spec.nodeName``, container states, ``pods/log``) and the registry stand-in.

Fixtures come from tests/node/conftest.py (``env``, ``registry``,
``real_operator``).
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

from tests.builders import TrainingRunBuilder, environment
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.conftest import InProcessOperator
from tests.integration.helpers import run_pods, wait_status
from tests.integration.test_registry_service import Service, trainer_token
from tests.node.runs import (
    RESOURCES,
    archived_run,
    container,
    explain,
    finished,
    logs,
    on_real_node,
    operator_with,
    submit,
)
from torchyard import k8s

pytestmark = pytest.mark.node

MPI = Path(__file__).resolve().parents[2] / "examples" / "mpi"
GUIDE_MPI = MPI.parent / "azureml" / "train_with_mpi.py"
RANK_LINE = re.compile(r"^\[rank (\d)\] mpi-rank (\{.*\})$", re.MULTILINE)


def mpi_run(name: str, namespace: str, node: RealNode, *args: str) -> TrainingRunBuilder:
    """examples/mpi as 2 nodes x 2 slots on the real node's pool, as user 1000."""
    return (
        TrainingRunBuilder(name, namespace)
        .environment("pytorch")
        .command("python", "-m", "mpi4py", "train.py", "--steps", "40", *args)
        .with_("spec.distribution.type", "mpi")
        .nodes(2)
        .procs(2)
        .pool(node.pool)
        .with_("spec.resources", dict(RESOURCES))
        .with_("spec.runAsUser", 1000)
    )


def test_an_mpi_run_of_two_nodes_by_two_slots_trains_and_archives_its_model(
    cluster: Cluster,
    env: str,
    real_node: RealNode,
    operator: InProcessOperator,
    registry: tuple[Service, str, str],
    tmp_path: Path,
) -> None:
    ns, name = env, "mpi"
    svc, url, _ = registry
    body = (
        mpi_run(name, ns, real_node)
        .register("mpi-linear", path="outputs")
        .with_("spec.serviceAccountName", "trainer")
        .obj()
    )
    run, elapsed = archived_run(cluster, operator, url, body, MPI, tmp_path, 300)
    print(f"\n[node] mpi 2x2 on real Pods: {run['status'].get('phase')} in {elapsed:.1f}s")
    assert run["status"]["phase"] == "Succeeded", explain(cluster, ns, name) + "\n".join(
        cluster.kubectl("logs", "-n", ns, f"{name}-{i}", check=False)[-3000:] for i in (0, 1)
    )
    pods = run_pods(ns, name)
    on_real_node(pods, real_node, 2)
    for pod in pods:
        assert container(pod, "trainer")["state"]["terminated"]["exitCode"] == 0
        assert pod["spec"]["securityContext"]["runAsUser"] == 1000
        mount = next(
            m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "mpi-key"
        )
        assert mount["readOnly"] is True
    secret = k8s.get(k8s.SECRETS, ns, f"{name}-mpi")
    assert secret["metadata"]["ownerReferences"][0]["uid"] == run["metadata"]["uid"]
    # mpirun on node 0 gathers every rank's output: each reports its MPI rank and size
    text = logs(cluster, ns, f"{name}-0")
    seen = {int(label): json.loads(body) for label, body in RANK_LINE.findall(text)}
    assert sorted(seen) == [0, 1, 2, 3], text[-4000:]
    for rank, info in seen.items():
        assert (info["rank"], info["size"]) == (rank, 4)
        assert info["OMPI_COMM_WORLD_RANK"] == str(rank)
        assert info["NODE_RANK"] == str(rank // 2)  # ranks 2 and 3 ran in node 1's Pod
        assert info["MASTER_ADDR"] == f"{name}-0.{name}.{ns}.svc"
        assert f"[rank {rank}] allreduce rank {rank} of 4: 10" in text
    trained = re.findall(r"^\[rank \d\] trained rank \d weight (\S+) bias (\S+)", text, re.M)
    assert len(trained) == 4 and len(set(trained)) == 1, trained
    worker = logs(cluster, ns, f"{name}-1")
    assert "node 1: waiting for mpirun on port 6106" in worker
    assert "node 1: mpirun ended (exit code 0)" in worker  # node 0 told it
    assert "refused" not in worker
    assert "mpirun: all ranks succeeded" in text
    # per-rank logs and the model were archived; the model was registered
    archived = svc.root / ns / "runs" / name
    assert sorted(p.name for p in (archived / "logs" / "node-0").glob("rank-*.txt")) == [
        f"rank-{r}.txt" for r in range(4)
    ]
    metrics = json.loads((archived / "outputs" / "metrics.json").read_text())
    assert metrics["world_size"] == 4 and metrics["loss"] < metrics["first_loss"]
    # every rank's torchyard.progress lines reached node 0's launcher through mpirun, and
    # from there status.progress (rank 0's metrics), as for PyTorch runs
    progress = run["status"]["progress"]
    assert (progress["step"], progress["total"], progress["slowestRankLag"]) == (40, 40, 0)
    assert progress["metrics"]["loss"] == pytest.approx(metrics["loss"], rel=1e-6), progress
    ranks = {
        json.loads(line)["rank"]
        for line in (archived / "logs" / "node-0" / "metrics.jsonl").read_text().splitlines()
    }
    assert ranks == {0, 1, 2, 3}
    assert run["status"]["model"] == {"name": "mpi-linear", "version": 1}
    mv = k8s.get(k8s.MODELVERSIONS, ns, "mpi-linear-v1")
    assert {f["path"] for f in mv["spec"]["files"]} == {"model.pt", "metrics.json"}


def test_an_mpi_run_whose_rank_3_raises_fails_naming_rank_3_and_its_exception(
    cluster: Cluster,
    env: str,
    real_node: RealNode,
    tmp_path: Path,
) -> None:
    ns, name = env, "mpi-fails"
    submit(cluster, tmp_path, mpi_run(name, ns, real_node, "--fail_rank", "3").obj(), source=MPI)
    run = finished(ns, name, timeout=300)
    assert run["status"]["phase"] == "Failed", explain(cluster, ns, name)
    failure = run["status"]["failure"]
    assert (failure["rank"], failure["node"], failure["pod"], failure["exitCode"]) == (
        3,
        1,
        f"{name}-1",
        1,
    ), failure
    assert failure["message"].startswith("Traceback (most recent call last)"), failure
    assert failure["message"].endswith("RuntimeError: rank 3 failed on purpose"), failure
    # The node rank 3 ran on (its own Pod's, not node 0's that reported it): bad-node
    # exclusion blames that one. (Its Pod, still running when the run failed, was
    # stopped at once: the failure names its node.)
    assert failure["nodeName"] == real_node.name, failure
    pod = k8s.get(k8s.PODS, ns, f"{name}-0")
    on_real_node([pod], real_node, 1)
    written = json.loads(container(pod, "trainer")["state"]["terminated"]["message"])
    assert (written["rank"], written["rankNode"]) == (3, 1)
    text = logs(cluster, ns, f"{name}-0")
    # mpirun named rank 3 itself (python -m mpi4py aborts on the exception)
    assert "MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD" in text

    def all_stopped() -> bool:
        live = [p for p in run_pods(ns, name) if p["status"].get("phase") in ("Pending", "Running")]
        return not live

    cluster.wait_for("every node Pod of the failed MPI run to stop", all_stopped, timeout=120)


def test_the_guides_mpi_configuration_runs_the_mpi4py_example_through_the_sdk(
    cluster: Cluster,
    namespace: str,
    real_operator: RealNode,
    operator: InProcessOperator,
    registry: tuple[Service, str, str],
    tmp_path: Path,
) -> None:
    """examples/azureml/train_with_mpi.py, the guide's MPI code with only its imports
    changed, run by a user (a process with a kubeconfig): the curated Environment by its
    Azure name, ``MpiConfiguration(process_count_per_node=2, node_count=2)``,
    ``ScriptRunConfig(source_directory="./src", script="train.py", ...,
    distributed_job_config=distr_config)``, submit and wait_for_completion(show_output=True).
    ./src is examples/mpi; the curated Environment is the test image with OpenMPI."""
    ns, node = namespace, real_operator
    _, url, ref = registry
    token_file = tmp_path / "operator-token"
    token_file.write_text(trainer_token(ns))
    curated = "azureml-pytorch-1-6-gpu"  # Environment.get(name="AzureML-PyTorch-1.6-GPU")
    k8s.create(environment(curated, ns, image=node.images["pytorch"].ref))
    wait_status(k8s.ENVIRONMENTS, ns, curated, lambda s: s.get("phase") == "Ready")
    root = tmp_path / "project"
    shutil.copytree(MPI, root / "src")
    shutil.copy(GUIDE_MPI, root / "train_with_mpi.py")
    (root / ".torchyard").mkdir()
    (root / ".torchyard" / "config.json").write_text(
        json.dumps(
            {
                "namespace": ns,
                "computeTargets": {"gpu-cluster": node.pool},
                "serviceAccount": "trainer",
                "registryService": ref,
            }
        )
    )
    user_env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_REGISTRY")}
    with operator_with(
        operator, TORCHYARD_REGISTRY_URL=url, TORCHYARD_REGISTRY_TOKEN_FILE=str(token_file)
    ):
        started = time.monotonic()
        user = subprocess.run(
            [sys.executable, "train_with_mpi.py"],
            cwd=root,
            env={**user_env, "KUBECONFIG": str(cluster.kubeconfig)},
            capture_output=True,
            text=True,
            timeout=420,
        )
        elapsed = time.monotonic() - started
    out = user.stdout + user.stderr
    listed = k8s.list_(k8s.TRAININGRUNS, ns)
    assert len(listed) == 1, out
    name = listed[0]["metadata"]["name"]
    print(f"\n[node] the guide's MpiConfiguration through the SDK: exit {user.returncode} "
          f"in {elapsed:.1f}s")  # fmt: skip
    assert user.returncode == 0, out + explain(cluster, ns, name)
    run = k8s.get(k8s.TRAININGRUNS, ns, name)
    assert run["status"]["phase"] == "Succeeded"
    assert run["spec"]["environment"] == curated
    assert run["spec"]["command"] == ["python3", "train.py"]
    dist = run["spec"]["distribution"]
    assert (dist["type"], dist["nodeCount"], dist["processCountPerNode"]) == ("mpi", 2, 2)
    pods = run_pods(ns, name)
    on_real_node(pods, node, 2)
    for pod in pods:
        assert pod["spec"]["containers"][0]["image"] == node.images["pytorch"].ref
        assert container(pod, "trainer")["state"]["terminated"]["exitCode"] == 0
    # mpirun on node 0 ran the four ranks over both Pods: each its MPI rank of 4
    text = logs(cluster, ns, f"{name}-0")
    seen = {int(label): json.loads(body) for label, body in RANK_LINE.findall(text)}
    assert sorted(seen) == [0, 1, 2, 3], text[-4000:]
    for rank, info in seen.items():
        assert (info["rank"], info["size"], info["NODE_RANK"]) == (rank, 4, str(rank // 2))
        assert f"[rank {rank}] allreduce rank {rank} of 4: 10" in text
    trained = re.findall(r"^\[rank \d\] trained rank \d weight (\S+) bias (\S+)", text, re.M)
    assert len(trained) == 4 and len(set(trained)) == 1, trained
    assert "mpirun: all ranks succeeded" in text
    assert "node 1: mpirun ended (exit code 0)" in logs(cluster, ns, f"{name}-1")
    # show_output=True printed every rank's lines to the user
    for rank in range(4):
        assert f"allreduce rank {rank} of 4: 10" in out, out[-4000:]
