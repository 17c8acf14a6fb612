"""The rank contract: the variables every training process sees
(docs/concepts/rank-contract.md).

``node_env`` is what a node's launcher gets; the launcher adds RANK and LOCAL_RANK per
process with :func:`torchyard.launch.contract.process_env`; the run's distribution type may
change them (``distributions``). Pure; used by the Pod planner and by local mode, so a run
sees exactly the same variables on a laptop and in a cluster.
"""

from __future__ import annotations

from torchyard import distributions
from torchyard.api import TrainingRun
from torchyard.launch.contract import (
    GROUP_RANK,
    LOCAL_WORLD_SIZE,
    MASTER_ADDR,
    MASTER_PORT,
    NODE_RANK,
    PET_MASTER_ADDR,
    PET_MASTER_PORT,
    PET_NNODES,
    PET_NODE_RANK,
    PET_NPROC_PER_NODE,
    TORCHYARD_EXPORT_ONNX,
    TORCHYARD_LAUNCH,
    TORCHYARD_LOGS,
    TORCHYARD_NAMESPACE,
    TORCHYARD_NNODES,
    TORCHYARD_NPROC_PER_NODE,
    TORCHYARD_OUTPUTS,
    TORCHYARD_RUN,
    WORLD_SIZE,
    process_env,
)
from torchyard.planning import names

OUTPUTS_DIR = "outputs"
LOGS_DIR = "logs"


def node_env(
    run: TrainingRun,
    node_rank: int,
    *,
    master_addr: str | None = None,
    master_port: int | None = None,
    workdir: str = ".",
) -> dict[str, str]:
    """The variables of node ``node_rank``'s launcher (and of ``launch: node`` commands)."""
    dist = run.spec.distribution
    if not 0 <= node_rank < dist.node_count:
        raise ValueError(f"node rank {node_rank} outside 0..{dist.node_count - 1}")
    addr = master_addr or names.master_addr(run.name, run.namespace)
    port = str(master_port or dist.master_port)
    nproc = dist.process_count_per_node
    env = {user.name: user.value for user in run.spec.env}
    env.update(
        {
            MASTER_ADDR: addr,
            MASTER_PORT: port,
            WORLD_SIZE: str(dist.world_size),
            NODE_RANK: str(node_rank),
            GROUP_RANK: str(node_rank),
            LOCAL_WORLD_SIZE: str(nproc),
            PET_NNODES: str(dist.node_count),
            PET_NPROC_PER_NODE: str(nproc),
            PET_NODE_RANK: str(node_rank),
            PET_MASTER_ADDR: addr,
            PET_MASTER_PORT: port,
            TORCHYARD_RUN: run.name,
            TORCHYARD_NAMESPACE: run.namespace,
            TORCHYARD_LAUNCH: dist.launch,
            TORCHYARD_NNODES: str(dist.node_count),
            TORCHYARD_NPROC_PER_NODE: str(nproc),
            TORCHYARD_OUTPUTS: f"{workdir}/{OUTPUTS_DIR}",
            TORCHYARD_LOGS: f"{workdir}/{LOGS_DIR}",
        }
    )
    # e.g. type none: no rendezvous. Mutants of this line are equivalent: no type's
    # node_env reads its spec argument.
    env = distributions.of(dist).node_env(dist, env)  # pragma: no mutate
    reg = run.spec.outputs.register_
    if reg is not None and reg.export_onnx:
        env[TORCHYARD_EXPORT_ONNX] = "1"
    return env


def rank_envs(
    run: TrainingRun,
    node_rank: int,
    *,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> list[dict[str, str]]:
    """Every process's variables on node ``node_rank`` (``launch: process``)."""
    base = node_env(run, node_rank, master_addr=master_addr, master_port=master_port)
    nproc = run.spec.distribution.process_count_per_node
    return [process_env(base, local) for local in range(nproc)]
