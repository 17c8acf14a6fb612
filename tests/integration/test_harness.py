"""The test control plane itself (``tests/cluster/harness.py``), kept up by hand with
``python -m tests.cluster.harness``: a cluster handed out serves and validates every
torchyard CRD at once (the first write of a test is never refused for a CRD still being
set up), and SIGTERM stops every process the harness started and removes its folder.
With ``--real-node`` (marker ``node``, root) the kept cluster has the real kubelet node,
and SIGTERM or SIGINT also leaves nothing of the node on the host."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.builders import TrainingRunBuilder
from tests.cluster import binaries
from tests.processes import running

REPO = Path(__file__).resolve().parents[2]


def processes_using(folder: Path) -> list[int]:
    """The processes whose command line names ``folder`` (etcd, apiserver, ... of it)."""
    return [pid for pid, cmdline, _ in running() if str(folder) in cmdline]


class KeptCluster:
    """``python -m tests.cluster.harness`` in a process of its own."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster.harness"],
            cwd=REPO,
            env={k: v for k, v in os.environ.items() if k != "TORCHYARD_KEEP_CLUSTER_DIR"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.process.stdout is not None
        self.output: list[str] = []
        for line in self.process.stdout:
            self.output.append(line)
            if line.startswith("logs in "):
                break
        text = "".join(self.output)
        assert "control plane up" in text, text
        self.workdir = Path(text.split("logs in ", 1)[1].split(";", 1)[0].strip())
        self.kubeconfig = self.workdir / "kubeconfig"

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                str(binaries.TOOLS["kubernetes"].path("kubectl")),
                f"--kubeconfig={self.kubeconfig}",
                f"--cache-dir={self.workdir / 'test-kubectl-cache'}",
                *args,
            ],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture(scope="module")
def kept() -> Iterator[KeptCluster]:
    cluster = KeptCluster()
    yield cluster
    if cluster.process.poll() is None:
        cluster.process.kill()
        cluster.process.wait(30)
    for pid in processes_using(cluster.workdir):
        os.kill(pid, signal.SIGKILL)


def test_a_cluster_handed_out_validates_each_crd_at_once(kept: KeptCluster) -> None:
    # The very first requests, straight after "control plane up": each resource lists,
    # and an invalid TrainingRun is refused by its schema, naming the field.
    for plural in ("trainingruns", "environments", "modelversions"):
        listed = kept.kubectl("get", f"{plural}.torchyard.dev", "-A", "-o", "name")
        assert listed.returncode == 0, listed.stderr
    body = TrainingRunBuilder("zero", "default").procs(0).obj()
    refused = kept.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(body))
    assert refused.returncode != 0
    assert "spec.distribution.processCountPerNode" in refused.stderr, refused.stderr


def test_sigterm_stops_every_process_of_the_kept_cluster(kept: KeptCluster) -> None:
    started = processes_using(kept.workdir)
    assert len(started) >= 5, f"etcd, apiserver, controller manager, scheduler, KWOK: {started}"
    kept.process.send_signal(signal.SIGTERM)
    code = kept.process.wait(60)
    assert kept.process.stdout is not None
    assert code == 0, "".join(kept.output) + kept.process.stdout.read()
    deadline = time.monotonic() + 20
    while processes_using(kept.workdir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_using(kept.workdir) == [], "the harness left its processes running"
    assert not kept.workdir.exists(), "the harness left its folder behind"


@pytest.mark.node
def test_the_kept_cluster_with_the_real_node_stops_cleanly_on_ctrl_c() -> None:
    """``python -m tests.cluster.harness --real-node`` (root): a cluster with the real
    kubelet node Ready, and after SIGINT (Ctrl-C, as it says) nothing of either on the
    host. SIGTERM ends the same wait (one ``sigwait`` for both): the test above sends it
    to the cluster without the node. In the integration tier on purpose: it runs before
    the node tier's session node, as there is one real node per machine
    (``tests/cluster/realnode.py``)."""
    from tests.cluster import realnode

    chains_before = realnode.iptables_chains()
    paths_before = {p for p in realnode.HOST_PATHS if p.exists()}
    netns_before = realnode._netns()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.cluster.harness", "--real-node"],
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "TORCHYARD_KEEP_CLUSTER_DIR"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:  # ends at "logs in ...", or when the process exits
            output.append(line)
            if line.startswith("logs in "):
                break
        text = "".join(output)
        assert "; Ctrl-C to stop" in text, text
        kubeconfig = Path(text.split("export KUBECONFIG=", 1)[1].split()[0])
        cluster_dir, node_dir = text.split("logs in ", 1)[1].split(";", 1)[0].split(" and ")
        workdirs = [Path(cluster_dir.strip()), Path(node_dir.strip())]
        kubectl = [
            str(binaries.TOOLS["kubernetes"].path("kubectl")),
            f"--kubeconfig={kubeconfig}",
            f"--cache-dir={workdirs[1] / 'test-kubectl-cache'}",
        ]
        node = subprocess.run(
            [*kubectl, "get", "node", "real-0", "-o", "yaml"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        body = yaml.safe_load(node)
        assert body["metadata"]["labels"]["torchyard.dev/pool"] == "real"
        assert "kwok.x-k8s.io/node" not in body["metadata"].get("annotations", {})
        ready = {c["type"]: c["status"] for c in body["status"]["conditions"]}["Ready"]
        assert ready == "True", body["status"]["conditions"]
        assert len(processes_using(workdirs[1])) >= 4  # containerd, kubelet, kube-proxy, CoreDNS

        process.send_signal(signal.SIGINT)
        code = process.wait(180)
        output.append(process.stdout.read())
    finally:
        if process.poll() is None:
            # (a failed assertion, pytest-timeout): stopped as Ctrl-C stops it, so that
            # it removes the node; killed only when that hangs (its processes die with it)
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(180)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(30)
    text = "".join(output)
    assert code == 0, text
    assert "[node] stopped; nothing left on the host" in text, text
    # checked from outside too: no process of either folder, no folder, no bridge, no new
    # network namespace, chain or host folder, and the machine's node lock is free again
    deadline = time.monotonic() + 20
    while any(processes_using(w) for w in workdirs) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [processes_using(w) for w in workdirs] == [[], []], "processes left running"
    assert [w for w in workdirs if w.exists()] == [], "folders left behind"
    assert not realnode._link_exists(realnode.NodeNetwork().bridge)
    assert realnode._netns() - netns_before == set()
    assert [p for p in realnode.HOST_PATHS if p.exists() and p not in paths_before] == []
    for key, chains in realnode.iptables_chains().items():
        new = {c for c in chains - chains_before.get(key, set()) if realnode.OUR_CHAINS.match(c)}
        assert not new, f"{key}: chains left {new}"
    with realnode.lock_path().open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while a node holds it
        fcntl.flock(lock, fcntl.LOCK_UN)
