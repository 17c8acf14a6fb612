"""The real `torchyard` commands (subprocesses) against the real control plane: submitting
a folder (one snapshot for the same code, secrets refused, a large folder through the
registry service), following a run to its failure, following a run that is already over
(every node's log from the archive), get and describe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.builders import TrainingRunBuilder, environment
from tests.cluster.harness import Cluster
from tests.conftest import InProcessOperator
from tests.integration.conftest import ProxiedRegistry
from tests.integration.helpers import finish_pod, launcher_message, wait_status
from tests.integration.test_trainingruns import running
from torchyard import k8s
from torchyard.launch import node_files

REPO = Path(__file__).resolve().parents[2]


def torchyard(
    cluster: Cluster, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchyard", *args],
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def run_file(tmp_path: Path, name: str, namespace: str, env: str = "pytorch") -> Path:
    body = TrainingRunBuilder(name, namespace).environment(env).nodes(2).procs(1).pool("cpu").obj()
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def snapshot_configmaps(namespace: str) -> list[dict[str, object]]:
    return k8s.list_(k8s.CONFIGMAPS, namespace, label_selector="torchyard.dev/snapshot")


def test_submitting_the_same_folder_twice_makes_one_snapshot(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    for name in ("birds-a", "birds-b"):
        done = torchyard(
            cluster,
            "submit",
            str(run_file(tmp_path, name, namespace)),
            "--source",
            "examples/birds",
            "-n",
            namespace,
        )
        assert done.returncode == 0, done.stderr
        assert f"trainingrun.torchyard.dev/{name} applied" in done.stdout
    maps = snapshot_configmaps(namespace)
    assert len(maps) == 1
    assert "created" in done.stderr.splitlines()[-1] or "unchanged" in done.stderr
    assert "unchanged (the same code was submitted before)" in done.stderr
    assert "snapshot of" in done.stderr and "files" in done.stderr
    name = maps[0]["metadata"]["name"]  # type: ignore[index]
    for run in ("birds-a", "birds-b"):
        spec = k8s.get(k8s.TRAININGRUNS, namespace, run)["spec"]
        assert spec["source"] == {"configMap": name}


def test_a_folder_with_an_env_file_is_refused(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    (src / ".env").write_text("WANDB_API_KEY=secret\n")
    done = torchyard(
        cluster, "submit", str(run_file(tmp_path, "leaky", namespace)), "--source", str(src)
    )
    assert done.returncode == 2
    assert ".env" in done.stderr and "--include-secrets" in done.stderr
    assert snapshot_configmaps(namespace) == []
    assert k8s.get_or_none(k8s.TRAININGRUNS, namespace, "leaky") is None


def test_a_large_folder_goes_through_the_registry_service(
    cluster: Cluster, namespace: str, tmp_path: Path, behind_apiserver: ProxiedRegistry
) -> None:
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    (src / "train.py").write_text("print('big')\n")
    (src / "data" / "weights.bin").write_bytes(os.urandom(5 << 20))  # 5 MiB, incompressible
    args = [
        "submit",
        str(run_file(tmp_path, "big", namespace)),
        "--source",
        str(src),
        "-n",
        namespace,
        "--registry-service",
        behind_apiserver.ref,
        "--service-account",
        "trainer",
    ]
    done = torchyard(cluster, *args)
    assert done.returncode == 0, done.stderr
    assert "the registry service" in done.stderr and "uploaded" in done.stderr
    sha = k8s.get(k8s.TRAININGRUNS, namespace, "big")["spec"]["source"]["snapshot"]
    stored = behind_apiserver.service.root / namespace / "snapshots" / f"{sha}.tar.gz"
    assert stored.stat().st_size > 5 << 20
    assert snapshot_configmaps(namespace) == []
    # The same code again: nothing is sent.
    (tmp_path / "big.yaml").write_text((tmp_path / "big.yaml").read_text())
    again = torchyard(cluster, *args)
    assert again.returncode == 0 and "unchanged (the registry service has it)" in again.stderr
    # What a node Pod's launcher does with it before the ranks: fetch, check, unpack.
    token = tmp_path / "token"
    token.write_text(behind_apiserver.token)
    work = tmp_path / "work"
    os.environ.update(
        TORCHYARD_REGISTRY_URL=behind_apiserver.service.url,
        TORCHYARD_NAMESPACE=namespace,
        TORCHYARD_REGISTRY_TOKEN_FILE=str(token),
    )
    try:
        assert node_files.prepare(["--fetch", sha, str(work)]) == 0
    finally:
        for key in (
            "TORCHYARD_REGISTRY_URL",
            "TORCHYARD_NAMESPACE",
            "TORCHYARD_REGISTRY_TOKEN_FILE",
        ):
            os.environ.pop(key)
    assert (work / "data" / "weights.bin").read_bytes() == (
        src / "data" / "weights.bin"
    ).read_bytes()


def test_wait_on_a_failing_run_exits_non_zero_with_the_traceback(
    cluster: Cluster, operator: InProcessOperator, namespace: str, tmp_path: Path
) -> None:
    k8s.create(environment("pytorch", namespace, image="ghcr.io/acme/pytorch:2.15-cpu"))
    k8s.create(TrainingRunBuilder("gpt", namespace).environment("pytorch").nodes(2).procs(2).obj())
    running(namespace, "gpt")
    follower = subprocess.Popen(
        [sys.executable, "-m", "torchyard", "wait", "gpt", "-n", namespace],
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follower.stdout is not None
    first = follower.stdout.readline()  # the live view is up: the run is Running
    assert first.startswith("TrainingRun gpt: [") and "Running" in first, first
    assert "node 0: Running, node 1: Running" in first
    finish_pod(cluster, namespace, "gpt-1", 1, launcher_message(3, 1, "ValueError: loss is NaN"))
    rest, err = follower.communicate(timeout=120)
    assert follower.returncode == 1, first + rest + err
    assert "Failed" in rest
    assert "rank 3 (node 1, Pod gpt-1) failed (" in err and "exit code 1):" in err
    assert "ValueError: loss is NaN" in err and "Traceback" in err

    table = torchyard(cluster, "get", "runs", "-n", namespace, "-o", "wide")
    assert table.returncode == 0
    header, row = table.stdout.splitlines()[:2]
    assert header.split()[:5] == ["NAME", "PHASE", "QUEUE", "NODES", "READY"]
    assert row.split()[:4] == ["gpt", "Failed", "-", "2"] and "rank 3 exit 1" in row
    as_json = torchyard(cluster, "get", "runs", "gpt", "-n", namespace, "-o", "json")
    assert '"phase": "Failed"' in as_json.stdout

    described = torchyard(cluster, "describe", "gpt", "-n", namespace)
    assert described.returncode == 0
    assert "Phase:        Failed" in described.stdout
    assert "ValueError: loss is NaN" in described.stdout
    assert "Events:" in described.stdout
    wait_status(k8s.TRAININGRUNS, namespace, "gpt", lambda s: s.get("phase") == "Failed")
    missing = torchyard(cluster, "describe", "nope", "-n", namespace)
    assert missing.returncode == 1 and "not found" in missing.stderr


def test_the_cli_is_also_a_kubectl_plugin(cluster: Cluster, namespace: str) -> None:
    k8s.create(TrainingRunBuilder("plugged", namespace).environment("missing").obj())
    bindir = str(Path(sys.executable).parent)
    assert Path(bindir, "kubectl-torchyard").exists(), "installed with the package"
    done = subprocess.run(
        [cluster._bin("kubectl"), "torchyard", "get", "runs", "-n", namespace],
        env={
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "PATH": bindir + os.pathsep + os.environ["PATH"],
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].split()[0] == "plugged"


def archive_logs(registry: ProxiedRegistry, namespace: str, run: str, nodes: int) -> None:
    """What each node Pod's launcher uploads when it ends: logs/node-N/rank-R.txt."""
    for node in range(nodes):
        folder = registry.service.root / namespace / "runs" / run / "logs" / f"node-{node}"
        folder.mkdir(parents=True)
        (folder / f"rank-{node}.txt").write_text(f"epoch 1 on rank {node}\ndone {node}\n")


def test_wait_on_a_run_that_is_already_over_prints_every_node_from_the_archive(
    cluster: Cluster,
    operator: InProcessOperator,
    namespace: str,
    behind_apiserver: ProxiedRegistry,
) -> None:
    """The extreme of a run that ends within one poll: the first look finds it Succeeded,
    its log streams only just started (KWOK serves no Pod logs)."""
    ns = namespace
    k8s.create(environment("pytorch", ns, image="ghcr.io/acme/pytorch:2.15-cpu"))
    k8s.create(TrainingRunBuilder("quick", ns).environment("pytorch").nodes(2).pool("cpu").obj())
    running(ns, "quick")
    archive_logs(behind_apiserver, ns, "quick", 2)
    for node in range(2):
        finish_pod(cluster, ns, f"quick-{node}", 0)
    wait_status(k8s.TRAININGRUNS, ns, "quick", lambda s: s.get("phase") == "Succeeded")
    registry = ["--registry-service", behind_apiserver.ref, "--service-account", "trainer"]

    done = torchyard(cluster, "wait", "quick", "-n", ns, *registry)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "TrainingRun quick succeeded" in out
    assert "(live logs were not available: node 0: " in out and "; node 1: " in out
    for node in range(2):
        for line in (f"epoch 1 on rank {node}", f"done {node}"):
            assert out.count(f"[node {node}] [rank {node}] {line}\n") == 1, out

    # torchyard logs: the same, node by node; --node and --rank pick one.
    logs = torchyard(cluster, "logs", "quick", "-n", ns, *registry)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.splitlines() == [
        "[node 0] [rank 0] epoch 1 on rank 0",
        "[node 0] [rank 0] done 0",
        "[node 1] [rank 1] epoch 1 on rank 1",
        "[node 1] [rank 1] done 1",
    ]
    one = torchyard(cluster, "logs", "quick", "-n", ns, "--node", "1", "--rank", "1", *registry)
    assert one.returncode == 0, one.stderr
    assert one.stdout.splitlines() == [
        "[node 1] [rank 1] epoch 1 on rank 1",
        "[node 1] [rank 1] done 1",
    ]
    none = torchyard(cluster, "logs", "quick", "-n", ns, "--node", "1", "--rank", "0", *registry)
    assert none.returncode == 1 and "no logs of quick found" in none.stderr
