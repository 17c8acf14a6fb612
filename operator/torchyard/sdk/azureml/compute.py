"""``AmlCompute`` and ``ComputeTarget``: a node pool (nodes labelled
``torchyard.dev/pool=<name>``), or an alias of one in the workspace's ``computeTargets``.
Pools are made by the platform team, so ``ComputeTarget.create`` finds an existing pool,
checks it against what ``AmlCompute.provisioning_configuration`` asked for, and explains
when it cannot be what was asked. Used by ``Workspace.compute_targets`` and
``Experiment.submit``; tested in tests/unit/sdk/test_azureml_arguments.py.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from torchyard import k8s
from torchyard.planning import pods
from torchyard.sdk.azureml.common import ComputeTargetException, TorchyardSdkError

if TYPE_CHECKING:
    from torchyard.sdk.azureml.workspaces import Workspace


# AmlCompute.provisioning_configuration's arguments and their defaults (Azure ML SDK v1).
PROVISIONING_DEFAULTS: dict[str, Any] = {
    "vm_size": "",
    "vm_priority": "dedicated",
    "min_nodes": 0,
    "max_nodes": None,
    "idle_seconds_before_scaledown": None,
    "admin_username": None,
    "admin_user_password": None,
    "admin_user_ssh_key": None,
    "vnet_resourcegroup_name": None,
    "vnet_name": None,
    "subnet_name": None,
    "tags": None,
    "description": None,
    "remote_login_port_public_access": "NotSpecified",
    "identity_type": None,
    "identity_id": None,
    "location": None,
    "enable_node_public_ip": True,
}
# What ComputeTarget.create can check against an existing pool; the rest would shape
# nodes that torchyard never makes.
PROVISIONING_CHECKED = ("vm_size", "min_nodes", "max_nodes")
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


class AmlCompute:
    @staticmethod
    def provisioning_configuration(**kwargs: Any) -> dict[str, Any]:
        """What was asked for, by Azure's argument names. torchyard never creates nodes:
        ``ComputeTarget.create`` finds an existing pool and checks it against ``vm_size``,
        ``min_nodes`` and ``max_nodes``; any other setting raises there."""
        unknown = sorted(set(kwargs) - set(PROVISIONING_DEFAULTS))
        if unknown:
            raise TorchyardSdkError(
                f"AmlCompute.provisioning_configuration got unknown argument(s) "
                f"{', '.join(unknown)}; it takes {', '.join(PROVISIONING_DEFAULTS)}"
            )
        return {k: v for k, v in kwargs.items() if v != PROVISIONING_DEFAULTS[k]}


class ComputeTarget:
    def __init__(self, workspace: Workspace, name: str) -> None:
        self.workspace = workspace
        self.name = name
        self.pool = workspace.compute_target_aliases.get(name, name)
        try:
            nodes = k8s.list_(k8s.NODES, label_selector=f"{pods.POOL_LABEL}={self.pool}")
        except k8s.Unreachable as err:
            raise ComputeTargetException(
                f"compute target {name!r}: {err}; to run on this machine instead, use "
                "ScriptRunConfig(..., compute_target='local')"
            ) from None
        if not nodes:
            raise ComputeTargetException(
                f"no node pool {self.pool!r}: no node is labelled {pods.POOL_LABEL}={self.pool}"
                + (f" (alias {name!r})" if self.pool != name else "")
                + "; ask your platform team for one, or map the name to an existing pool "
                'in .torchyard/config.json, e.g. "computeTargets": {"' + name + '": "a100"}'
            )
        self.nodes = nodes
        gpus = [
            int(n.get("status", {}).get("allocatable", {}).get(pods.GPU_RESOURCE, 0)) for n in nodes
        ]
        self.gpus_per_node = min(gpus) if gpus else 0

    @staticmethod
    def create(
        workspace: Workspace, name: str, provisioning_configuration: dict[str, Any]
    ) -> ComputeTarget:
        """The existing pool ``name``, when it is what ``provisioning_configuration`` asks
        for (torchyard never creates or scales nodes)."""
        target = ComputeTarget(workspace, name)
        asked = dict(provisioning_configuration or {})
        never = sorted(k for k in asked if k not in PROVISIONING_CHECKED)
        if never:
            raise ComputeTargetException(
                f"{', '.join(never)} would shape nodes that torchyard never creates or scales: "
                f"leave them out (the pool {target.pool!r} is made by your platform team), "
                f"or use ComputeTarget(ws, {name!r}) as it is"
            )
        count = len(target.nodes)
        if asked.get("min_nodes") and count < int(asked["min_nodes"]):
            raise ComputeTargetException(
                f"node pool {target.pool!r} has {count} node(s), fewer than "
                f"min_nodes={asked['min_nodes']}; torchyard never adds nodes: ask your "
                "platform team for a larger pool"
            )
        if asked.get("max_nodes") is not None and count > int(asked["max_nodes"]):
            raise ComputeTargetException(
                f"node pool {target.pool!r} has {count} nodes, more than "
                f"max_nodes={asked['max_nodes']}; torchyard never removes nodes: leave "
                "max_nodes out (a run uses only the nodes its node_count asks for)"
            )
        if asked.get("vm_size"):
            types = {
                str(n["metadata"].get("labels", {}).get(INSTANCE_TYPE_LABEL, ""))
                for n in target.nodes
            }
            if {t.lower() for t in types} != {str(asked["vm_size"]).lower()}:
                shown = ", ".join(sorted(t or "(none)" for t in types))
                raise ComputeTargetException(
                    f"node pool {target.pool!r} is not all vm_size={asked['vm_size']!r} "
                    f"(its nodes' {INSTANCE_TYPE_LABEL}: {shown}); torchyard never creates "
                    f"nodes: leave vm_size out, or name a pool of that size"
                )
        return target

    def _ready(self) -> list[dict[str, Any]]:
        return [
            n
            for n in self.nodes
            if any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in n.get("status", {}).get("conditions", [])
            )
        ]

    def wait_for_completion(
        self,
        show_output: bool = False,
        min_node_count: int | None = None,
        timeout_in_minutes: float = 25,
        is_delete_operation: bool = False,
    ) -> None:
        """Until ``min_node_count`` nodes of the pool are Ready (at most
        ``timeout_in_minutes``); at once when no count is asked for."""
        if is_delete_operation:
            raise ComputeTargetException(
                "torchyard never deletes node pools: is_delete_operation=True has nothing "
                "to wait for"
            )
        deadline = time.monotonic() + timeout_in_minutes * 60
        while True:
            ready = self._ready()
            if not min_node_count or len(ready) >= min_node_count:
                break
            if time.monotonic() >= deadline:
                raise ComputeTargetException(
                    f"node pool {self.pool} has {len(ready)} ready nodes, fewer than "
                    f"{min_node_count}, after {timeout_in_minutes:g} minutes"
                )
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
            self.nodes = k8s.list_(k8s.NODES, label_selector=f"{pods.POOL_LABEL}={self.pool}")
        if show_output:
            print(f"node pool {self.pool}: {len(ready)}/{len(self.nodes)} nodes ready")

    def get_status(self) -> dict[str, Any]:
        return {"nodeCount": len(self.nodes), "gpusPerNode": self.gpus_per_node}

    def __repr__(self) -> str:
        return f"ComputeTarget(pool={self.pool!r}, nodes={len(self.nodes)})"


__all__ = ["AmlCompute", "ComputeTarget"]
