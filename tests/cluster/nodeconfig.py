"""The real test node's configuration, as pure functions: no I/O, tested without a node.

One builder per file the node's programs read: containerd's ``config.toml``, the CNI
network list, the kubelet's ``KubeletConfiguration``, CoreDNS's ``Corefile``,
kube-proxy's ``KubeProxyConfiguration``, the components' kubeconfigs and the RBAC
objects the cluster needs for them; plus ``NodeNetwork`` and the name checks that turn
bad input into an error saying what to use instead.

Called by ``tests/cluster/realnode.py``; tested by ``tests/unit/cluster/test_nodeconfig.py``.
"""

from __future__ import annotations

import ipaddress
import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POOL_LABEL = "torchyard.dev/pool"
# The harness's ranges (kube-apiserver --service-cluster-ip-range, KWOK --cidr): a Pod
# subnet must not overlap them.
SERVICE_CIDR = ipaddress.ip_network("10.96.0.0/16")
KWOK_CIDR = ipaddress.ip_network("10.0.0.0/16")
CLUSTER_DOMAIN = "cluster.local"
CNI_BIN_DIR = Path("/usr/lib/cni")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_IFNAME = re.compile(r"^[a-z][a-z0-9]{0,14}$")


@dataclass(frozen=True)
class NodeNetwork:
    """The node's Pod subnet, its bridge and the gateway address CoreDNS listens on."""

    subnet: str = "10.244.0.0/24"
    bridge: str = "torchyard0"

    def __post_init__(self) -> None:
        try:
            net = ipaddress.ip_network(self.subnet, strict=True)
        except ValueError as err:
            raise ValueError(f"Pod subnet {self.subnet!r}: {err}; use e.g. 10.244.0.0/24") from err
        if net.version != 4 or not net.is_private or not 16 <= net.prefixlen <= 28:
            raise ValueError(
                f"Pod subnet {self.subnet!r}: use a private IPv4 network from /16 to /28, "
                "e.g. 10.244.0.0/24"
            )
        for taken, what in ((SERVICE_CIDR, "the Service range"), (KWOK_CIDR, "KWOK's Pods")):
            if net.overlaps(taken):
                raise ValueError(
                    f"Pod subnet {self.subnet!r} overlaps {what} ({taken}); pick another, "
                    "e.g. 10.244.0.0/24"
                )
        if not _IFNAME.fullmatch(self.bridge):
            raise ValueError(
                f"bridge name {self.bridge!r}: use at most 15 lowercase letters and digits, "
                "starting with a letter (e.g. torchyard0)"
            )

    @property
    def network(self) -> ipaddress.IPv4Network:
        net = ipaddress.ip_network(self.subnet)
        assert isinstance(net, ipaddress.IPv4Network)
        return net

    @property
    def gateway(self) -> str:
        return str(next(self.network.hosts()))


def validate_node_name(name: str) -> str:
    if not DNS_LABEL.fullmatch(name):
        raise ValueError(
            f"node name {name!r}: use a DNS-1123 label (lowercase letters, digits and '-', "
            "at most 63 characters, e.g. real-0)"
        )
    return name


def containerd_config(work: Path, sandbox_image: str, runc: str) -> str:
    """containerd 1.6's config (version 2) with a private root, state, socket and CNI."""
    q = json.dumps  # a JSON string is a valid TOML basic string
    return textwrap.dedent(
        f"""\
        version = 2
        root = {q(str(work / "root"))}
        state = {q(str(work / "state"))}
        disabled_plugins = [
          "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
          "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
        ]

        [grpc]
          address = {q(str(work / "containerd.sock"))}

        [ttrpc]
          address = {q(str(work / "containerd-ttrpc.sock"))}

        [plugins."io.containerd.internal.v1.opt"]
          path = {q(str(work / "opt"))}

        [plugins."io.containerd.grpc.v1.cri"]
          sandbox_image = {q(sandbox_image)}
          # this VM withholds CAP_SYS_RESOURCE: a sandbox asking for oomScoreAdj -998
          # otherwise fails with "can't get final child's PID from pipe: EOF"
          restrict_oom_score_adj = true
          disable_apparmor = true
          enable_selinux = false
          stream_server_address = "127.0.0.1"
          stream_server_port = "0"

          [plugins."io.containerd.grpc.v1.cri".containerd]
            snapshotter = "overlayfs"
            default_runtime_name = "runc"

            [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
              runtime_type = "io.containerd.runc.v2"

              [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
                SystemdCgroup = false
                BinaryName = {q(runc)}

          [plugins."io.containerd.grpc.v1.cri".cni]
            bin_dir = {q(str(CNI_BIN_DIR))}
            conf_dir = {q(str(work / "net.d"))}
            max_conf_num = 1

          # one folder per registry host (registry_hosts_toml), read at every pull
          [plugins."io.containerd.grpc.v1.cri".registry]
            config_path = {q(str(work / "certs.d"))}
        """
    )


_HOST_PORT = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?:[0-9]{1,5}$")


def registry_hosts_toml(host: str) -> str:
    """containerd's ``certs.d/<host>/hosts.toml`` for a plain-HTTP registry ``host:port``
    (a test registry: containerd otherwise speaks HTTPS to every registry)."""
    if not _HOST_PORT.fullmatch(host):
        raise ValueError(
            f"registry {host!r}: give host:port (e.g. 10.1.2.3:5000); containerd keys its "
            "registry folders by it"
        )
    q = json.dumps
    return textwrap.dedent(
        f"""\
        server = {q("http://" + host)}

        [host.{q("http://" + host)}]
          capabilities = ["pull", "resolve"]
        """
    )


def cni_conflist(network: NodeNetwork, ipam_dir: Path) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "torchyard",
        "plugins": [
            {
                "type": "bridge",
                "bridge": network.bridge,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": network.subnet, "gateway": network.gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(
    *,
    network: NodeNetwork,
    port: int,
    healthz_port: int,
    ca_file: Path,
    runtime_socket: Path,
    work: Path,
) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": network.gateway,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        # this machine has cgroup v1 (hybrid): kubelet >= 1.35 refuses it unless told
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "imageServiceEndpoint": f"unix://{runtime_socket}",
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [network.gateway],
        "resolvConf": str(work / "resolv.conf"),
        "podLogsDir": str(work / "pod-logs"),
        "volumePluginDir": str(work / "volume-plugins"),
        # a small shared disk: never evict or collect images because of it
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # otherwise a Pod with imagePullPolicy: Never can meet ErrImageNeverPull
        "imagePullCredentialsVerificationPolicy": "NeverVerify",
        "serializeImagePulls": False,
        "registerNode": True,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "nodeStatusUpdateFrequency": "2s",
        "syncFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "maxPods": 110,
    }


def corefile(network: NodeNetwork, kubeconfig: Path, ready_port: int) -> str:
    return textwrap.dedent(
        f"""\
        .:53 {{
            bind {network.gateway}
            errors
            ready 127.0.0.1:{ready_port}
            kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
                kubeconfig {kubeconfig}
                pods insecure
                ttl 5
                fallthrough in-addr.arpa ip6.arpa
            }}
            forward . /etc/resolv.conf
        }}
        """
    )


def kube_proxy_config(
    *, network: NodeNetwork, node: str, kubeconfig: Path, healthz_port: int, metrics_port: int
) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "hostnameOverride": node,
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "clusterCIDR": network.subnet,
        "detectLocalMode": "ClusterCIDR",
        "nodePortAddresses": [f"{network.gateway}/32"],
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        # leave the host's conntrack table sizes and timeouts as they are
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"localhostNodePorts": False, "syncPeriod": "30s", "minSyncPeriod": "0s"},
    }


def kubeconfig(server: str, ca: Path, cert: Path, key: Path, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "torchyard-test",
                "cluster": {"server": server, "certificate-authority": str(ca)},
            }
        ],
        "users": [
            {"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}
        ],
        "contexts": [{"name": "default", "context": {"cluster": "torchyard-test", "user": user}}],
        "current-context": "default",
    }


def rbac_manifests(node: str) -> list[dict[str, Any]]:
    """The kubelet's node user gets ClusterRole system:node (the cluster authorises with
    RBAC only, no Node authorizer); CoreDNS gets the read access it needs."""
    meta = {"labels": {"app.kubernetes.io/part-of": "torchyard-test"}}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"torchyard-test:node:{node}", **meta},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:node",
            },
            "subjects": [
                {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "User",
                    "name": f"system:node:{node}",
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "torchyard-test:coredns", **meta},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "torchyard-test:coredns", **meta},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "torchyard-test:coredns",
            },
            "subjects": [
                {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "User",
                    "name": "torchyard-test:coredns",
                }
            ],
        },
    ]
