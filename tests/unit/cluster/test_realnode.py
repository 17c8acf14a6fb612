"""The real node's host bookkeeping without starting one (tests/cluster/realnode.py):
one node per machine, processes found by their folder, binaries pinned like the
control plane's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster import binaries, realnode
from tests.cluster.realnode import NodeError, RealNode

GO = Path(binaries.__file__).resolve().parent / "go"


class NoCluster:
    """A stand-in that fails loudly if the code under test talks to a cluster."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the cluster was used: {name}")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHYARD_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_bad_node_name_is_refused_before_anything_is_created(cache: Path) -> None:
    before = set(realnode.WORKDIR_PARENT.glob(realnode.WORKDIR_PREFIX + "*"))
    with pytest.raises(ValueError, match="DNS-1123"):
        RealNode(NoCluster(), name="../../etc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="DNS-1123"):
        RealNode(NoCluster(), pool="Real Pool")  # type: ignore[arg-type]
    assert set(realnode.WORKDIR_PARENT.glob(realnode.WORKDIR_PREFIX + "*")) == before


def test_a_second_node_is_refused_and_stops_without_touching_the_host(
    cache: Path, tmp_path: Path
) -> None:
    first = RealNode(NoCluster(), workdir=tmp_path / "first")  # type: ignore[arg-type]
    second = RealNode(NoCluster(), workdir=tmp_path / "second")  # type: ignore[arg-type]
    first._acquire_lock()
    try:
        holder = json.loads(realnode.lock_path().read_text())
        assert holder["workdir"] == str(tmp_path / "first")
        with pytest.raises(NodeError, match="another real node runs on this machine"):
            second.start()  # refused first thing: NoCluster would fail on any other step
        assert second._lock is None
        second.stop()  # a no-op: it owns nothing
    finally:
        first._release_lock()
    assert realnode.lock_path().read_text() == ""  # a clean stop leaves no stale entry


def test_a_stale_lock_entry_outside_the_node_folders_is_never_cleaned(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "data").write_text("keep me")
    realnode.lock_path().parent.mkdir(parents=True)
    realnode.lock_path().write_text(json.dumps({"pid": 1, "workdir": str(victim)}))
    node = RealNode(NoCluster(), workdir=tmp_path / "node")  # type: ignore[arg-type]
    node._acquire_lock()
    node._release_lock()
    assert (victim / "data").read_text() == "keep me"
    assert "not a node folder" in capsys.readouterr().out


def test_processes_are_found_by_their_folder_not_a_sibling_with_the_same_prefix(
    tmp_path: Path,
) -> None:
    mine, other = tmp_path / "torchyard-node-ab", tmp_path / "torchyard-node-abc"
    code = "import time; time.sleep(60)"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(d / "x")]) for d in (mine, other)]
    try:
        program = Path(sys.executable).name
        found = realnode._pids_mentioning(mine, program)
        assert found == [procs[0].pid]
        assert realnode._pids_mentioning(mine, "containerd") == []
        realnode._terminate(procs[0].pid, timeout=5)
        assert procs[0].wait(timeout=5) is not None
        assert procs[1].poll() is None
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_node_binaries_share_the_control_planes_pin_but_not_its_cache_folder() -> None:
    node, plane = binaries.TOOLS["kubernetes-node"], binaries.TOOLS["kubernetes"]
    assert (node.version, node.module_dir, node.ldflags) == (
        plane.version,
        plane.module_dir,
        plane.ldflags,
    )
    assert node.cache_dir != plane.cache_dir  # adding them rebuilds none of the control plane
    assert set(node.commands) == {"kubelet", "kube-proxy"}
    assert binaries.TOOLS["coredns"].version == "v1.15.0"
    assert realnode.binary("crictl").endswith("cri-tools-v1.37.0/crictl")


def test_a_bare_make_tools_builds_only_the_control_plane(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    monkeypatch.setattr(binaries, "build", lambda tool, **_: built.append(tool.name) or Path())
    binaries.build_all()
    assert built and not set(built) & set(binaries.NODE_TOOLS)
    built.clear()
    binaries.build_all(["coredns"])
    assert built == ["coredns"]


def test_the_go_modules_pin_every_node_command_for_a_readonly_build() -> None:
    tools_go = (GO / "kubernetes" / "tools.go").read_text()
    assert '_ "k8s.io/kubernetes/cmd/kubelet"' in tools_go
    assert '_ "k8s.io/kubernetes/cmd/kube-proxy"' in tools_go
    go_sum = (GO / "kubernetes" / "go.sum").read_text()
    # the modules only the kubelet and kube-proxy import (-mod=readonly needs their sums)
    for module in (
        "k8s.io/cri-streaming v0.37.2 h1:",
        "go.opentelemetry.io/contrib/instrumentation/github.com/emicklei/go-restful/otelrestful",
        "sigs.k8s.io/knftables",
    ):
        assert module in go_sum, module
    for module_dir, require in (
        ("coredns", "github.com/coredns/coredns v1.15.0"),
        ("critools", "sigs.k8s.io/cri-tools v1.37.0"),
    ):
        assert f"require {require}" in (GO / module_dir / "go.mod").read_text()
        assert (GO / module_dir / "go.sum").stat().st_size > 0


SAVED = """\
# Generated by iptables-save v1.8.9 (nf_tables)
*filter
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-OLD - [0:0]
:MINE - [0:0]
-A INPUT -j KUBE-FIREWALL
-A INPUT -j KUBE-OLD
-A OUTPUT -p tcp -m comment --comment "keep: mine, not a node's" -j MINE
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block localnet" -j DROP
COMMIT
*nat
:POSTROUTING ACCEPT [0:0]
:CNI-0a1b2c - [0:0]
-A POSTROUTING -s 10.244.0.5/32 -m comment --comment "name: \\"ty\\" id: \\"x\\"" -j CNI-0a1b2c
-A CNI-0a1b2c -d 10.244.0.0/24 -j ACCEPT
COMMIT
"""


def test_only_chains_the_node_added_are_removed_jumps_first() -> None:
    before = {("iptables", "filter"): {"INPUT", "OUTPUT", "KUBE-OLD", "MINE"}}
    removals = realnode.chain_removals(SAVED, before, "iptables")
    assert removals == [
        ["-t", "filter", "-D", "INPUT", "-j", "KUBE-FIREWALL"],
        ["-t", "filter", "-F", "KUBE-FIREWALL"],
        ["-t", "filter", "-X", "KUBE-FIREWALL"],
        ["-t", "nat", "-D", "POSTROUTING", "-s", "10.244.0.5/32", "-m", "comment",
         "--comment", 'name: "ty" id: "x"', "-j", "CNI-0a1b2c"],
        ["-t", "nat", "-F", "CNI-0a1b2c"],
        ["-t", "nat", "-X", "CNI-0a1b2c"],
    ]  # fmt: skip
    # what was there before, and chains of other names, are never touched
    flat = [arg for command in removals for arg in command]
    assert "KUBE-OLD" not in flat and "MINE" not in flat
