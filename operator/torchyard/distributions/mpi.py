"""``distribution.type: mpi`` (OpenMPI; docs/how-to/mpi-horovod.md): its API rules, the hostfile,
the mpirun arguments, the launcher's variables, the key Secret's mount and the channel's
port; registered by ``torchyard.distributions``, tested in tests/unit/planning/test_mpi.py.

Node 0's launcher (``launch.mpi_launcher.MpiLauncher``, this type's ``launcher``) runs
``mpirun`` with these arguments plus ``--hostfile`` and ``--mca plm_rsh_agent`` (itself,
``--rsh``): no sshd anywhere. The launchers of the other nodes listen on
:func:`agent_port` and start what mpirun's agent asks for (OpenMPI's ``orted``) after an
HMAC challenge with the key of the run's Secret (``needs_key``: made by the controller).
Local mode starts one launcher, whose mpirun runs every rank on this machine.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence

from torchyard.distributions.base import DistributionType, Place, PodParts, Rule, Spec
from torchyard.launch.contract import (
    MPI_LAUNCHER,
    TORCHYARD_MPI_DOMAIN,
    TORCHYARD_MPI_HOSTFILE,
    TORCHYARD_MPI_KEY_FILE,
    TORCHYARD_MPI_PORT,
    TORCHYARD_MPIRUN_ARGS,
)

NAME = "mpi"
IMPLEMENTATIONS = ("openmpi",)
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


def _is_mpi(spec: Spec) -> bool:
    return spec.type == NAME


# The CEL rules of type mpi (the CRD) and the same rules in Python (the models).
RULES: tuple[Rule[Spec], ...] = (
    Rule(
        {
            "rule": "!has(self.implementation) || self.type == 'mpi'",
            "message": "distribution.implementation applies to type mpi only: leave it out or "
            "set type: mpi",
            "fieldPath": ".implementation",
        },
        lambda d: d.implementation is None or _is_mpi(d),
    ),
    Rule(
        {
            "rule": "!has(self.implementation) || self.implementation == 'openmpi'",
            "message": "distribution.implementation: only 'openmpi' is supported (MPICH and "
            "Intel MPI start their daemons differently and torchyard does not launch them): "
            "use an image with OpenMPI and set implementation: openmpi (or leave it out)",
            "fieldPath": ".implementation",
        },
        lambda d: d.implementation is None or d.implementation in IMPLEMENTATIONS,
    ),
    Rule(
        {
            "rule": "!has(self.mpirunArgs) || self.type == 'mpi'",
            "message": "distribution.mpirunArgs applies to type mpi only: leave it out or set "
            "type: mpi",
            "fieldPath": ".mpirunArgs",
        },
        lambda d: d.mpirun_args is None or _is_mpi(d),
    ),
    Rule(
        {
            "rule": "self.type != 'mpi' || self.launch == 'process'",
            "message": "distribution.launch 'node' does not combine with type mpi: mpirun "
            "starts processCountPerNode processes on every node; leave launch out",
            "fieldPath": ".launch",
        },
        lambda d: not _is_mpi(d) or d.launch == "process",
    ),
    Rule(
        {
            "rule": "self.type != 'mpi' || self.masterPort <= 65534",
            "message": "type mpi uses masterPort+1 for the launchers' MPI channel: masterPort "
            "must be at most 65534",
            "fieldPath": ".masterPort",
        },
        lambda d: not _is_mpi(d) or d.master_port <= 65534,
    ),
)


def agent_port(spec: Spec) -> int:
    """Where the launchers of nodes >= 1 wait for mpirun's agent (the API keeps it valid)."""
    return spec.master_port + 1


def hostfile(spec: Spec, hosts: Sequence[str] | None = None) -> str:
    """OpenMPI's hostfile: every node Pod (``hosts``, node 0 first) with
    processCountPerNode slots; None (local mode): this machine with all of them."""
    if hosts is None:
        return f"localhost slots={spec.world_size}\n"
    return "".join(f"{host} slots={spec.process_count_per_node}\n" for host in hosts)


def mpirun_args(spec: Spec) -> list[str]:
    """mpirun's arguments before the command (the launcher adds the hostfile and agent)."""
    args = ["-np", str(spec.world_size), "--map-by", "slot", "--bind-to", "none", "--tag-output"]
    args.append("--leave-session-attached")
    for name, value in MCA:
        args += ["--mca", name, value]
    return [*args, *(spec.mpirun_args or [])]


class Mpi(DistributionType):
    name = NAME
    rules = RULES
    launcher = MPI_LAUNCHER  # node 0's runs mpirun (launch.mpi_launcher.MpiLauncher)
    needs_key = True
    names_every_node = True  # the hostfile names every node Pod

    def launcher_env(self, spec: Spec, place: Place | None) -> dict[str, str]:
        """What the launcher needs besides the rank contract. Ranks get
        OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK and _LOCAL_SIZE from mpirun;
        MASTER_ADDR/MASTER_PORT, TORCHYARD_OUTPUTS and TORCHYARD_LOGS come from the rank
        contract as for every run."""
        env = {
            TORCHYARD_MPI_HOSTFILE: hostfile(spec, None if place is None else place.hosts),
            TORCHYARD_MPIRUN_ARGS: json.dumps(mpirun_args(spec)),
        }
        if place is not None:
            env[TORCHYARD_MPI_PORT] = str(agent_port(spec))
            env[TORCHYARD_MPI_KEY_FILE] = KEY_FILE
            env[TORCHYARD_MPI_DOMAIN] = place.domain
        return env

    def pod_parts(self, spec: Spec, place: Place) -> PodParts:
        """The key of the launchers' MPI channel (read-only, never in a variable), and the
        port it listens on."""
        return PodParts(
            ports=({"name": "mpi-agent", "containerPort": agent_port(spec)},),
            mounts=({"name": KEY_VOLUME, "mountPath": KEY_DIR, "readOnly": True},),
            volumes=(
                {
                    "name": KEY_VOLUME,
                    "secret": {"secretName": place.key_secret, "defaultMode": 0o444},
                },
            ),
        )

    def local_launchers(self, spec: Spec, path: str) -> tuple[int, str | None]:
        """One launcher: node 0's mpirun runs every rank over this machine's slots."""
        if shutil.which("mpirun", path=path) is None:
            raise FileNotFoundError(
                "distribution.type mpi runs the local mpirun, and none is installed: "
                "apt-get install openmpi-bin (and python3-mpi4py for mpi4py scripts), "
                "or brew install open-mpi"
            )
        return 1, f"MPI: node 0 runs mpirun over {spec.world_size} slots on this machine"
