"""``distribution.type: mpi``: the hostfile, the mpirun arguments, the variables and the
per-run key of an OpenMPI run (docs/how-to/mpi-horovod.md).

Pure builders, called by the Pod planner (``pods.pod``), by the controller (the key's
Secret, created once per run) and by local mode (``mpi_env(..., local=True)``); tested in
tests/unit/planning/test_mpi.py. Node 0's launcher runs ``mpirun`` with these arguments
plus ``--hostfile`` and ``--mca plm_rsh_agent`` (itself, ``--rsh``): no sshd anywhere.
The launchers of the other nodes listen on ``agent_port`` and start what mpirun's agent
asks for (OpenMPI's ``orted``) after an HMAC challenge with the key of the run's Secret.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from torchyard.api import TrainingRun
from torchyard.planning import names

KEY_DIR = "/var/run/secrets/torchyard/mpi"
KEY_FILE = f"{KEY_DIR}/key"
KEY_VOLUME = "mpi-key"

# OpenMPI 4.1 in containers (Debian 12's openmpi-bin), each setting and why:
# - btl tcp,self,vader: TCP between Pods, shared memory within one; no InfiniBand probing.
# - btl_vader_single_copy_mechanism none: CMA (process_vm_readv) needs ptrace rights that
#   a container without added capabilities does not have; copy through /dev/shm instead.
# - plm_rsh_no_tree_spawn 1: mpirun on node 0 starts every node's orted itself, so only
#   node 0 needs the agent (no worker launches another one).
# - leave-session-attached: without it (and with no tree spawn) mpirun starts orted with
#   --daemonize: it would leave the agent's session, so the worker launcher could neither
#   see it end nor stop it, and would end (its Pod with it) under a running orted.
# - orte_base_help_aggregate 0: mpirun's aggregation of help messages races with an
#   MPI_Abort in 4.1 ("ORTE_ERROR_LOG: Data unpack would read past end of buffer in
#   show_help.c"): the report naming the aborting rank is lost, and mpirun sometimes hangs
#   with every rank gone. Each message is printed as it comes instead.
# - map-by slot: ranks fill node 0's slots, then node 1's, ... so rank r runs on node
#   r // processCountPerNode (named in status.failure).
# - bind-to none: a Pod's CPUs are a cgroup quota, not cores of its own to pin to.
# - tag-output: every line says its rank ([job,rank]<stderr>:), so the launcher keeps
#   logs/rank-<r>.txt and the failing rank's traceback.
# orted reaches back to mpirun over the Pod network (oob tcp, any interface but lo);
# hostnames are shortened to the Pod's own (orte_keep_fqdn_hostnames stays no), so node 0
# finds itself in the hostfile and the agent adds the Service's domain back.
MCA: tuple[tuple[str, str], ...] = (
    ("btl", "tcp,self,vader"),
    ("btl_vader_single_copy_mechanism", "none"),
    ("plm_rsh_no_tree_spawn", "1"),
    ("orte_base_help_aggregate", "0"),
)


def agent_port(run: TrainingRun) -> int:
    """Where the launchers of nodes >= 1 wait for mpirun's agent (the API keeps it valid)."""
    return run.spec.distribution.master_port + 1


def hosts(run: TrainingRun) -> list[str]:
    """Node Pods by their headless-Service names (``<pod>.<service>``), node 0 first."""
    return [
        f"{names.pod(run.name, i)}.{names.service(run.name)}"
        for i in range(run.spec.distribution.node_count)
    ]


def hostfile(run: TrainingRun, *, local: bool = False) -> str:
    """OpenMPI's hostfile: every node Pod with processCountPerNode slots (local mode: this
    machine with all of them)."""
    dist = run.spec.distribution
    if local:
        return f"localhost slots={dist.world_size}\n"
    return "".join(f"{host} slots={dist.process_count_per_node}\n" for host in hosts(run))


def mpirun_args(run: TrainingRun) -> list[str]:
    """mpirun's arguments before the command (the launcher adds the hostfile and agent)."""
    dist = run.spec.distribution
    args = ["-np", str(dist.world_size), "--map-by", "slot", "--bind-to", "none", "--tag-output"]
    args.append("--leave-session-attached")
    for name, value in MCA:
        args += ["--mca", name, value]
    return [*args, *(dist.mpirun_args or [])]


def mpi_env(run: TrainingRun, *, local: bool = False) -> dict[str, str]:
    """What the launcher needs besides the rank contract. Ranks get OMPI_COMM_WORLD_RANK,
    _SIZE, _LOCAL_RANK and _LOCAL_SIZE from mpirun; MASTER_ADDR/MASTER_PORT,
    TORCHYARD_OUTPUTS and TORCHYARD_LOGS come from ``rank.node_env`` as for every run."""
    env = {
        "TORCHYARD_DISTRIBUTION": "mpi",
        "TORCHYARD_MPI_HOSTFILE": hostfile(run, local=local),
        "TORCHYARD_MPIRUN_ARGS": json.dumps(mpirun_args(run)),
    }
    if not local:
        env["TORCHYARD_MPI_PORT"] = str(agent_port(run))
        env["TORCHYARD_MPI_KEY_FILE"] = KEY_FILE
        env["TORCHYARD_MPI_DOMAIN"] = names.service(run.name)
    return env


def secret(run: TrainingRun, key: str, owner: dict[str, Any]) -> dict[str, Any]:
    """The run's MPI key (``key``: random, made once by the controller), owned by the run,
    mounted read-only into its node Pods; never in an environment variable."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": names.mpi_secret(run.name),
            "namespace": run.namespace,
            "labels": {names.LABEL_RUN: run.name, "app.kubernetes.io/managed-by": "torchyard"},
            "ownerReferences": [owner],
        },
        "data": {"key": base64.b64encode(key.encode()).decode()},
    }


def key_volume(run: TrainingRun) -> dict[str, Any]:
    return {
        "name": KEY_VOLUME,
        "secret": {"secretName": names.mpi_secret(run.name), "defaultMode": 0o444},
    }


def key_mount() -> dict[str, Any]:
    return {"name": KEY_VOLUME, "mountPath": KEY_DIR, "readOnly": True}
