"""Pods on a REAL kubelet node (containerd + runc + CNI, CoreDNS, kube-proxy): what KWOK
only pretends. Every Pod is scheduled by its pool label and each test checks that it ran
on the real node, so none passes on a fake one.

Fixtures in ``tests/node/conftest.py``; the node itself is ``tests/cluster/realnode.py``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import secrets
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import binaries
from tests.cluster.harness import Cluster
from tests.cluster.nodeconfig import SERVICE_CIDR
from tests.cluster.realnode import EGRESS_CHAIN, NodeError, RealNode
from tests.node.helpers import Pods, terminated

pytestmark = pytest.mark.node


def on_real_node(pod: dict[str, Any], node: RealNode) -> None:
    status = pod.get("status", {})
    assert pod["spec"].get("nodeName") == node.name, f"scheduled elsewhere: {pod['spec']}"
    ip = status.get("podIP", "")
    assert ip and ipaddress.ip_address(ip) in node.network.network, f"pod IP {ip!r}: {status}"


def test_the_node_is_a_real_kubelet_labelled_as_its_pool(cluster: Cluster, real_node: RealNode):
    node = real_node.node()
    info = node["status"]["nodeInfo"]
    assert node["metadata"]["labels"]["torchyard.dev/pool"] == "real"
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})
    assert info["kubeletVersion"] == binaries.KUBERNETES_VERSION
    assert info["kubeProxyVersion"] in ("", binaries.KUBERNETES_VERSION)
    assert info["containerRuntimeVersion"].startswith("containerd://")
    assert real_node.is_ready()
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == real_node.network.gateway


def test_a_python_pod_runs_and_kubectl_logs_returns_its_output(pods: Pods, real_node: RealNode):
    token = secrets.token_hex(8)
    script = textwrap.dedent(
        """\
        import os, socket, sys
        print(os.environ["TOKEN"], socket.gethostname(), "python%d.%d" % sys.version_info[:2])
        """
    )
    pods.create(
        pods.manifest("hello", script, container={"env": [{"name": "TOKEN", "value": token}]})
    )
    pod = pods.finished("hello")
    on_real_node(pod, real_node)
    assert pod["status"]["phase"] == "Succeeded", pods.explain("hello")
    assert terminated(pod)["exitCode"] == 0
    words = pods.logs("hello").split()
    assert words[:2] == [token, "hello"]  # the Pod's own hostname: it ran in the container
    assert words[2].startswith("python3.")


def test_the_kubelet_writes_the_termination_message(pods: Pods, real_node: RealNode):
    token = secrets.token_hex(8)
    env = {"env": [{"name": "TOKEN", "value": token}]}
    written = "import os; open('/dev/termination-log', 'w').write(os.environ['TOKEN'][::-1])"
    pods.create(pods.manifest("writes", written, container=env))
    # one stream (stderr): the runtime keeps no order between stdout and stderr lines
    raises = (
        "import os, sys; print('starting', file=sys.stderr); raise ValueError(os.environ['TOKEN'])"
    )
    policy = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    pods.create(pods.manifest("raises", raises, container={**env, **policy}))
    ok, failed = pods.finished("writes"), pods.finished("raises")
    on_real_node(ok, real_node)
    on_real_node(failed, real_node)
    assert terminated(ok).get("message") == token[::-1], ok["status"]
    assert failed["status"]["phase"] == "Failed"
    state = terminated(failed)
    assert state["exitCode"] == 1, state
    # the log's tail, as torchyard reports a failing rank: the traceback's last line
    assert state["message"].rstrip().endswith(f"ValueError: {token}")
    assert state["message"].startswith("starting\nTraceback (most recent call last)")


def test_a_pod_over_its_memory_limit_is_oom_killed_with_137(pods: Pods, real_node: RealNode):
    # touches 8 MiB at a time, up to 1 GiB: without a working limit it prints and exits 0
    script = textwrap.dedent(
        """\
        chunks = []
        for i in range(128):
            chunks.append(bytes([i % 250 + 1]) * (8 << 20))
        print("allocated", len(chunks) * 8, "MiB")
        """
    )
    limits = {"memory": "64Mi", "cpu": "500m"}
    resources = {"limits": limits, "requests": limits}
    pods.create(pods.manifest("hog", script, container={"resources": resources}))
    pod = pods.finished("hog")
    on_real_node(pod, real_node)
    state = terminated(pod)
    assert (state["reason"], state["exitCode"]) == ("OOMKilled", 137), pods.explain("hog")
    assert pod["status"]["phase"] == "Failed"


SERVER = textwrap.dedent(
    """\
    import hashlib, os, socket, time
    peer = os.environ["PEER"]
    srv = socket.create_server(("0.0.0.0", 7000))
    srv.settimeout(90)
    conn, (addr, _) = srv.accept()
    data = b""
    while not data.endswith(b"\\n"):
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    deadline = time.time() + 60
    while True:
        try:
            peer_ip = socket.gethostbyname(peer)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
    conn.sendall(hashlib.sha256(data.strip()).hexdigest().encode() + b"\\n")
    conn.close()
    print(json.dumps({"got": data.strip().decode(), "from": addr, "peer": peer_ip}))
    """
).replace("import hashlib,", "import json, hashlib,")

CLIENT = textwrap.dedent(
    """\
    import json, os, socket, time
    peer, port = os.environ["PEER"], int(os.environ.get("PORT", "7000"))
    deadline = time.time() + 90
    while True:
        try:
            ip = socket.gethostbyname(peer)
            conn = socket.create_connection((ip, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
    conn.sendall(os.environ["TOKEN"].encode() + b"\\n")
    reply = b""
    while not reply.endswith(b"\\n"):
        chunk = conn.recv(4096)
        if not chunk:
            break
        reply += chunk
    print(json.dumps({"reply": reply.strip().decode(), "peer": ip}))
    """
)


def test_two_pods_find_each_other_through_coredns_and_talk_tcp(
    pods: Pods, real_node: RealNode, namespace: str
):
    app = f"peers-{secrets.token_hex(3)}"
    pods.post(
        "services",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "peers"},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {"app": app},
                "ports": [{"name": "talk", "port": 7000}],
            },
        },
    )
    domain = f"peers.{namespace}.svc.cluster.local"
    token = secrets.token_hex(16)
    for name, script, env in (
        ("a", SERVER, {"PEER": f"b.{domain}"}),
        ("b", CLIENT, {"PEER": f"a.{domain}", "TOKEN": token}),
    ):
        container = {"env": [{"name": k, "value": v} for k, v in env.items()]}
        manifest = pods.manifest(
            name, script, container=container, labels={"app": app}, hostname=name, subdomain="peers"
        )
        pods.create(manifest)
    server, client = pods.finished("a"), pods.finished("b")
    for pod in (server, client):
        on_real_node(pod, real_node)
        assert pod["status"]["phase"] == "Succeeded", pods.explain(pod["metadata"]["name"])
    heard = json.loads(pods.logs("a"))
    answered = json.loads(pods.logs("b"))
    # each resolved the other's name to the other's Pod IP, and the bytes went through
    assert answered == {
        "reply": hashlib.sha256(token.encode()).hexdigest(),
        "peer": server["status"]["podIP"],
    }
    assert heard == {
        "got": token,
        "from": client["status"]["podIP"],
        "peer": client["status"]["podIP"],
    }


def test_a_cluster_ip_service_reaches_its_pod_through_kube_proxy(
    pods: Pods, real_node: RealNode, namespace: str
):
    app = f"echo-{secrets.token_hex(3)}"
    service = pods.post(
        "services",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "echo"},
            "spec": {"selector": {"app": app}, "ports": [{"port": 80, "targetPort": 7000}]},
        },
    )
    cluster_ip = service["spec"]["clusterIP"]
    token = secrets.token_hex(16)
    service_name = f"echo.{namespace}.svc.cluster.local"
    pods.create(
        pods.manifest(
            "server",
            SERVER,
            container={"env": [{"name": "PEER", "value": service_name}]},
            labels={"app": app},
        )
    )
    # A Service kube-proxy has not written yet is no route at all: this host would send
    # the packets out of its default route (where something may even accept them). Start
    # the client once the rules lead the virtual IP to the server.
    server_ip = real_node.wait_for(
        "the server's Pod IP", lambda: pods.get("server").get("status", {}).get("podIP")
    )
    real_node.wait_for(
        f"kube-proxy's rules from {cluster_ip}:80 to {server_ip}:7000",
        lambda: proxied(cluster_ip, 80, f"{server_ip}:7000"),
        timeout=30,
    )
    client_env = {"PEER": service_name, "PORT": "80", "TOKEN": token}
    pods.create(
        pods.manifest(
            "client",
            CLIENT,
            container={"env": [{"name": k, "value": v} for k, v in client_env.items()]},
        )
    )
    server, client = pods.finished("server"), pods.finished("client")
    for pod in (server, client):
        on_real_node(pod, real_node)
        assert pod["status"]["phase"] == "Succeeded", pods.explain(pod["metadata"]["name"])
    answered = json.loads(pods.logs("client"))
    heard = json.loads(pods.logs("server"))
    # the name resolved to the Service's virtual IP, which only kube-proxy's rules route
    # to the Pod (no masquerading inside the node's Pod subnet: the server sees the client)
    assert ipaddress.ip_address(cluster_ip) not in real_node.network.network
    assert answered == {"reply": hashlib.sha256(token.encode()).hexdigest(), "peer": cluster_ip}
    assert heard == {"got": token, "from": client["status"]["podIP"], "peer": cluster_ip}


def proxied(cluster_ip: str, port: int, endpoint: str) -> bool:
    """kube-proxy's iptables rules send ``cluster_ip:port`` to ``endpoint`` (ip:port)."""
    rules = subprocess.run(
        ["iptables-save", "-t", "nat"], capture_output=True, text=True, check=True
    ).stdout
    return (
        f"-d {cluster_ip}/32" in rules
        and f"--dport {port}" in rules
        and (f"--to-destination {endpoint}" in rules)
    )


def test_a_second_real_node_on_the_machine_is_refused_and_harms_none(
    cluster: Cluster, real_node: RealNode
):
    other = RealNode(cluster, name="real-1")
    try:
        with pytest.raises(NodeError, match="another real node runs on this machine"):
            other.start()
        # the refused start undid nothing of the running node's
        real_node.check_alive()
        assert real_node.is_ready()
        assert Path("/sys/class/net", real_node.network.bridge).exists()
        assert real_node.containerd_socket.exists()
        assert other.node() == {}, "the refused node registered nothing"
    finally:
        other.root.rmdir()


def test_nothing_from_the_pod_subnet_or_to_an_unrouted_service_address_leaves_the_machine(
    real_node: RealNode,
) -> None:
    """Test traffic stays here: the first mangle POSTROUTING rule sends every packet to the
    node's egress guard, which drops one still addressed to the Service range (a ClusterIP
    kube-proxy has no rule for yet) and one from a Pod to anything outside the Pod subnet."""
    saved = subprocess.run(
        ["iptables-save", "-t", "mangle"], capture_output=True, text=True, check=True
    ).stdout
    rules = [line for line in saved.splitlines() if line.startswith("-A ")]
    postrouting = [r for r in rules if r.startswith("-A POSTROUTING ")]
    assert postrouting[0] == f"-A POSTROUTING -j {EGRESS_CHAIN}"
    subnet = str(real_node.network.network)
    assert [r for r in rules if r.startswith(f"-A {EGRESS_CHAIN} ")] == [
        f"-A {EGRESS_CHAIN} -d {SERVICE_CIDR} -j DROP",
        f"-A {EGRESS_CHAIN} -s {subnet} ! -d {subnet} -j DROP",
    ]
