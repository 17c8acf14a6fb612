"""The real test node's configuration builders (tests/cluster/nodeconfig.py), no node."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

from tests.cluster import nodeconfig
from tests.cluster.nodeconfig import NodeNetwork


def test_the_default_network_is_a_private_24_with_its_gateway_first() -> None:
    net = NodeNetwork()
    assert (net.subnet, net.bridge, net.gateway) == ("10.244.0.0/24", "torchyard0", "10.244.0.1")


@pytest.mark.parametrize(
    ("subnet", "says"),
    [
        ("10.96.3.0/24", "overlaps the Service range"),
        ("10.0.7.0/24", "overlaps KWOK's Pods"),
        ("8.8.8.0/24", "private IPv4"),
        ("fd00::/64", "private IPv4"),
        ("10.244.0.0/30", "from /16 to /28"),
        ("10.0.0.0/8", "from /16 to /28"),
        ("10.244.0.1/24", "has host bits set"),
        ("10.244.0.0/24; rm -rf /", "does not appear to be an IPv4 or IPv6 network"),
        ("../../etc", "does not appear to be an IPv4 or IPv6 network"),
    ],
)
def test_a_bad_pod_subnet_is_refused_with_what_to_use(subnet: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape("e.g. 10.244.0.0/24")) as err:
        NodeNetwork(subnet=subnet)
    assert says in str(err.value)


@pytest.mark.parametrize("bridge", ["", "eth0;reboot", "Torchyard0", "a" * 16, "0bridge", "br/0"])
def test_a_bad_bridge_name_is_refused(bridge: str) -> None:
    with pytest.raises(ValueError, match="at most 15 lowercase letters and digits"):
        NodeNetwork(bridge=bridge)


@pytest.mark.parametrize("name", ["", "../x", "Real-0", "real_0", "-real", "a" * 64, "real.0"])
def test_a_node_name_must_be_a_dns_label(name: str) -> None:
    with pytest.raises(ValueError, match="DNS-1123 label"):
        nodeconfig.validate_node_name(name)


def test_containerd_runs_privately_with_cgroupfs_and_restricted_oom_score(tmp_path: Path) -> None:
    work = tmp_path / 'odd "name"\\ with quotes'  # a path TOML must quote correctly
    config = tomllib.loads(nodeconfig.containerd_config(work, "torchyard.local/pause:0", "/x/runc"))
    assert config["root"] == str(work / "root")
    assert config["state"] == str(work / "state")
    assert config["grpc"]["address"] == str(work / "containerd.sock")
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "torchyard.local/pause:0"
    assert cri["restrict_oom_score_adj"] is True
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["options"] == {"SystemdCgroup": False, "BinaryName": "/x/runc"}
    assert cri["cni"]["bin_dir"] == "/usr/lib/cni"
    assert cri["cni"]["conf_dir"] == str(work / "net.d")
    # no fixed ports that a second containerd (or anything else) could hold
    assert cri["stream_server_address"] == "127.0.0.1"
    assert cri["stream_server_port"] == "0"


def test_the_cni_network_is_a_bridge_on_the_node_subnet(tmp_path: Path) -> None:
    net = NodeNetwork(subnet="10.250.4.0/24", bridge="tybr1")
    conf = nodeconfig.cni_conflist(net, tmp_path / "ipam")
    bridge = conf["plugins"][0]
    assert (bridge["type"], bridge["bridge"], bridge["isGateway"]) == ("bridge", "tybr1", True)
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.250.4.0/24", "gateway": "10.250.4.1"}]]
    assert bridge["ipam"]["dataDir"] == str(tmp_path / "ipam")  # not /var/lib/cni
    assert [p["type"] for p in conf["plugins"]] == ["bridge", "portmap"]


def test_the_kubelet_config_has_the_settings_this_machine_needs(tmp_path: Path) -> None:
    net = NodeNetwork()
    config = nodeconfig.kubelet_config(
        network=net,
        port=11250,
        healthz_port=11251,
        ca_file=tmp_path / "ca.crt",
        runtime_socket=tmp_path / "c.sock",
        work=tmp_path,
    )
    assert config["failCgroupV1"] is False  # cgroup v1 here; 1.35+ refuses it otherwise
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["failSwapOn"] is False
    assert config["imagePullCredentialsVerificationPolicy"] == "NeverVerify"
    assert config["clusterDNS"] == [net.gateway]
    assert config["clusterDomain"] == "cluster.local"
    assert config["containerRuntimeEndpoint"] == f"unix://{tmp_path / 'c.sock'}"
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["authentication"]["webhook"] == {"enabled": True}
    assert config["authentication"]["x509"] == {"clientCAFile": str(tmp_path / "ca.crt")}
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["readOnlyPort"] == 0
    assert (config["address"], config["port"]) == (net.gateway, 11250)
    # nothing of the kubelet's own outside its folder
    for key in ("resolvConf", "podLogsDir", "volumePluginDir"):
        assert Path(config[key]).is_relative_to(tmp_path), key


def test_coredns_serves_cluster_local_on_the_gateway_only(tmp_path: Path) -> None:
    text = nodeconfig.corefile(NodeNetwork(), tmp_path / "kc", 9153)
    assert "bind 10.244.0.1" in text
    assert f"kubeconfig {tmp_path / 'kc'}" in text
    assert "kubernetes cluster.local in-addr.arpa ip6.arpa {" in text
    assert "ready 127.0.0.1:9153" in text


def test_kube_proxy_uses_iptables_and_leaves_host_tunables_alone(tmp_path: Path) -> None:
    config = nodeconfig.kube_proxy_config(
        network=NodeNetwork(), node="real-0", kubeconfig=tmp_path / "kc", healthz_port=1,
        metrics_port=2,
    )  # fmt: skip
    assert config["mode"] == "iptables"
    assert config["hostnameOverride"] == "real-0"
    assert config["clusterCIDR"] == "10.244.0.0/24"
    assert config["nodePortAddresses"] == ["10.244.0.1/32"]
    assert config["iptables"]["localhostNodePorts"] is False  # no route_localnet sysctl
    assert config["conntrack"]["maxPerCore"] == 0  # nf_conntrack_max as it is
    assert config["healthzBindAddress"] == "127.0.0.1:1"


def test_the_node_user_gets_system_node_and_coredns_only_reads() -> None:
    docs = {(m["kind"], m["metadata"]["name"]): m for m in nodeconfig.rbac_manifests("real-7")}
    node = docs["ClusterRoleBinding", "torchyard-test:node:real-7"]
    assert node["roleRef"]["name"] == "system:node"
    assert node["subjects"][0]["name"] == "system:node:real-7"
    role = docs["ClusterRole", "torchyard-test:coredns"]
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert verbs == {"list", "watch"}


def test_a_kubeconfig_names_the_component_user(tmp_path: Path) -> None:
    kc = nodeconfig.kubeconfig(
        "https://127.0.0.1:6443",
        tmp_path / "ca",
        tmp_path / "c",
        tmp_path / "k",
        "system:kube-proxy",
    )
    assert kc["users"][0]["name"] == "system:kube-proxy"
    assert kc["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"


def test_containerd_reads_registry_hosts_from_its_own_folder(tmp_path: Path) -> None:
    config = tomllib.loads(nodeconfig.containerd_config(tmp_path, "pause:1", "/usr/sbin/runc"))
    registry = config["plugins"]["io.containerd.grpc.v1.cri"]["registry"]
    assert registry == {"config_path": str(tmp_path / "certs.d")}


def test_a_test_registry_is_pulled_from_over_plain_http() -> None:
    hosts = tomllib.loads(nodeconfig.registry_hosts_toml("10.1.2.3:5000"))
    assert hosts == {
        "server": "http://10.1.2.3:5000",
        "host": {"http://10.1.2.3:5000": {"capabilities": ["pull", "resolve"]}},
    }


@pytest.mark.parametrize("host", ["10.1.2.3", "../../etc:1", "a b:1", 'x"]\n[evil]:1', ""])
def test_a_registry_host_must_be_host_and_port(host: str) -> None:
    with pytest.raises(ValueError, match="give host:port"):
        nodeconfig.registry_hosts_toml(host)
