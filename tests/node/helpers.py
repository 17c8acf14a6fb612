"""Helpers of the node tests: Pods pinned to the real node, and their container states."""

from __future__ import annotations

from typing import Any

from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode


class Pods:
    """Creates Pods pinned to the real node (by its pool label, through the scheduler)
    and waits for them, with the Pod's events and the kubelet's log on failure."""

    def __init__(self, cluster: Cluster, node: RealNode, namespace: str) -> None:
        self.cluster, self.node, self.namespace = cluster, node, namespace

    def manifest(self, name: str, script: str, **spec: Any) -> dict[str, Any]:
        container: dict[str, Any] = {
            "name": "main",
            "image": self.node.images["python"].ref,
            "imagePullPolicy": "Never",
            "command": ["python", "-c", script],
        }
        container.update(spec.pop("container", {}))
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": spec.pop("labels", {})},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"torchyard.dev/pool": self.node.pool},
                "terminationGracePeriodSeconds": 2,
                "containers": [container],
                **spec,
            },
        }

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return self.post("pods", manifest)

    def post(self, plural: str, manifest: dict[str, Any]) -> dict[str, Any]:
        code, body = self.cluster.request(
            "POST", f"/api/v1/namespaces/{self.namespace}/{plural}", manifest
        )
        assert code == 201, f"creating {plural} {manifest['metadata']['name']}: {code} {body}"
        assert isinstance(body, dict)
        return body

    def get(self, name: str) -> dict[str, Any]:
        code, body = self.cluster.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{name}")
        assert code == 200, f"reading pod {name}: {code} {body}"
        assert isinstance(body, dict)
        return body

    def finished(self, name: str, timeout: float = 120) -> dict[str, Any]:
        """The Pod once its phase is Succeeded or Failed."""

        def done() -> dict[str, Any] | None:
            pod = self.get(name)
            return pod if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

        try:
            result: dict[str, Any] = self.node.wait_for(f"pod {name} to finish", done, timeout)
        except TimeoutError as err:
            raise AssertionError(f"{err}\n{self.explain(name)}") from None
        return result

    def logs(self, name: str) -> str:
        return self.cluster.kubectl("logs", "-n", self.namespace, name)

    def explain(self, name: str) -> str:
        status = self.get(name).get("status", {})
        events = self.cluster.kubectl(
            "get", "events", "-n", self.namespace, "--field-selector",
            f"involvedObject.name={name}", check=False,
        )  # fmt: skip
        kubelet = (self.node.root / "kubelet.log").read_text(errors="replace")[-3000:]
        return f"status: {status}\nevents:\n{events}\nkubelet log tail:\n{kubelet}"


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    """The first container's ``state.terminated``."""
    statuses = pod.get("status", {}).get("containerStatuses", [])
    assert statuses, f"no container status in {pod.get('status')}"
    state: dict[str, Any] = statuses[0].get("state", {}).get("terminated", {})
    assert state, f"container not terminated: {statuses[0]}"
    return state
