"""``distribution.type: none``: one plain process, no rendezvous. Registered by
``torchyard.distributions``; its rule reaches the CRD and the API's models."""

from __future__ import annotations

from torchyard.distributions.base import DistributionType, Rule, Spec
from torchyard.launch.contract import MASTER_ADDR, MASTER_PORT, PET_MASTER_ADDR, PET_MASTER_PORT

RENDEZVOUS = (MASTER_ADDR, MASTER_PORT, PET_MASTER_ADDR, PET_MASTER_PORT)


class NoDistribution(DistributionType):
    name = "none"
    rules = (
        Rule(
            {
                "rule": "self.type != 'none' || "
                "(self.nodeCount == 1 && self.processCountPerNode == 1)",
                "message": "distribution.type 'none' runs one process: nodeCount and "
                "processCountPerNode must be 1",
            },
            lambda d: d.type != "none" or (d.node_count == 1 and d.process_count_per_node == 1),
        ),
    )

    def node_env(self, spec: Spec, env: dict[str, str]) -> dict[str, str]:
        # One plain process: no rendezvous variables to confuse torch.distributed.
        return {k: v for k, v in env.items() if k not in RENDEZVOUS}
