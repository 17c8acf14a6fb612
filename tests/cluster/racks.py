"""KWOK nodes laid out as a network: blocks of racks of nodes, labelled as a cloud labels
them, for topology-aware placement (Kueue's TAS and torchyard's own gang admission).

``Racks(pool, blocks=2, racks_per_block=4, nodes_per_rack=4)`` names node ``<pool>-<i>``
with ``kubernetes.io/hostname``, ``example.com/block`` (``b<n>``) and ``example.com/rack``
(``b<n>-r<m>``: rack names unique across blocks), ``torchyard.dev/pool=<pool>``; ``create``
makes them (KWOK keeps them Ready), ``delete`` removes them. ``kueue_topology`` is the
Kueue ``Topology`` of those levels, ``busy_pod`` background work that fills a node. Used
by tests/integration/test_kueue.py, tests/integration/test_placement.py and
benchmarks/placement.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.cluster.harness import Cluster, Pool, node_manifest

BLOCK = "example.com/block"
RACK = "example.com/rack"
HOST = "kubernetes.io/hostname"


@dataclass(frozen=True)
class Racks:
    """A pool of KWOK nodes in blocks and racks."""

    pool: str
    blocks: int = 2
    racks_per_block: int = 4
    nodes_per_rack: int = 4
    gpus: int = 8
    cpu: str = "96"
    memory: str = "1Ti"

    @property
    def size(self) -> int:
        return self.blocks * self.racks_per_block * self.nodes_per_rack

    def name(self, index: int) -> str:
        return f"{self.pool}-{index}"

    def block_of(self, index: int) -> str:
        return f"b{index // (self.racks_per_block * self.nodes_per_rack)}"

    def rack_of(self, index: int) -> str:
        return f"{self.block_of(index)}-r{(index // self.nodes_per_rack) % self.racks_per_block}"

    def nodes_of_rack(self, rack: str) -> list[str]:
        return [self.name(i) for i in range(self.size) if self.rack_of(i) == rack]

    def racks_by_rank(self, pods: list[dict[str, Any]]) -> list[str]:
        """Each node rank's rack, from the node its Pod (of ``pods``, one run's) is bound to."""
        index = {self.name(i): i for i in range(self.size)}
        ranked = sorted(pods, key=lambda p: int(p["metadata"]["labels"]["torchyard.dev/node-rank"]))
        return [self.rack_of(index[p["spec"]["nodeName"]]) for p in ranked]

    def node(self, index: int) -> dict[str, Any]:
        manifest = node_manifest(
            Pool(self.pool, nodes=self.size, gpus=self.gpus, cpu=self.cpu, memory=self.memory),
            index,
        )
        labels = manifest["metadata"]["labels"]
        labels[BLOCK] = self.block_of(index)
        labels[RACK] = self.rack_of(index)
        return manifest

    def create(self, cluster: Cluster) -> None:
        for i in range(self.size):
            code, body = cluster.request("POST", "/api/v1/nodes", self.node(i))
            if code not in (201, 409):
                raise RuntimeError(f"creating node {self.name(i)}: {code} {body}")

        def ready() -> bool:
            code, body = cluster.request(
                "GET", f"/api/v1/nodes?labelSelector=torchyard.dev/pool={self.pool}"
            )
            return (
                code == 200
                and sum(
                    1
                    for n in body.get("items", [])
                    if any(
                        c["type"] == "Ready" and c["status"] == "True"
                        for c in n.get("status", {}).get("conditions", [])
                    )
                )
                == self.size
            )

        cluster.wait_for(f"the {self.size} nodes of pool {self.pool} Ready", ready, timeout=60)

    def delete(self, cluster: Cluster) -> None:
        cluster.kubectl(
            "delete", "nodes", "-l", f"torchyard.dev/pool={self.pool}", "--ignore-not-found"
        )


def busy_pod(node: str, namespace: str, gpus: int = 8) -> dict[str, Any]:
    """A plain Pod bound to ``node`` holding ``gpus`` of its GPUs (background work: neither
    torchyard's nor Kueue's, which both count it as usage of the node)."""
    limits = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"busy-{node}", "namespace": namespace},
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {"name": "c", "image": "pause", "resources": {"requests": limits, "limits": limits}}
            ],
        },
    }


def occupy(cluster: Cluster, namespace: str, nodes: list[str]) -> None:
    """A :func:`busy_pod` on each of ``nodes``, running."""
    for node in nodes:
        code, body = cluster.request(
            "POST", f"/api/v1/namespaces/{namespace}/pods", busy_pod(node, namespace)
        )
        if code != 201:
            raise RuntimeError(f"creating the busy Pod of {node}: {code} {body}")

    def running() -> bool:
        for node in nodes:
            code, body = cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods/busy-{node}")
            if code != 200 or (body.get("status") or {}).get("phase") != "Running":
                return False
        return True

    cluster.wait_for(f"the busy Pods of {len(nodes)} node(s) running", running, timeout=60)


def kueue_topology(name: str) -> dict[str, Any]:
    """Kueue's Topology of blocks, racks and hosts."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": HOST}]},
    }
