"""The torchyard launcher: starts the ranks of one node and reports exactly which failed.

Standard library only, Python >= 3.8. This module is the entry point (:func:`main`) of
the ``torchyard.launch`` package, whose other modules it runs (``contract`` at the bottom,
``output``, ``tracker``, ``stalls``, ``ranks``, ``node_files``, ``node_launcher``,
``mpi_launcher``); they import only the standard library and each other. They reach any
training image together, as a read-only ConfigMap volume (a ``torchyard/`` package folder
with the other shipped modules), and the node Pod runs ``python
.../torchyard/launch/main.py [--copy SRC DIR | --fetch SHA256 DIR] -- <command...>`` (or
``python -m torchyard.launch -- <command...>`` where torchyard is installed):
``--copy``/``--fetch`` put the source into the working folder first
(``node_files.prepare``). Run as a file, it imports the package from the folder above its
own, whatever else the image has installed. Local mode runs the very same file once per
node.

It reads its configuration from variables that ``torchyard.planning`` sets:

    TORCHYARD_LAUNCH           process | node
    TORCHYARD_DISTRIBUTION     which launcher class runs the node (:data:`LAUNCHERS`, as the
                               run's distribution type says: unset, the node launcher;
                               mpi, ``mpi_launcher.MpiLauncher``)
    TORCHYARD_NPROC_PER_NODE   processes on this node
    NODE_RANK, MASTER_ADDR, MASTER_PORT, WORLD_SIZE, ...   the rank contract
    TORCHYARD_LOGS             folder for logs/rank-<r>.txt (default ./logs)
    TORCHYARD_OUTPUTS          folder the ranks write their outputs to (default ./outputs);
                               either one that cannot be created (a working directory
                               this user may not write) moves under the temporary
                               directory, and the launcher says so
    (it sets TORCHYARD_TENSORBOARD_DIR, every process's, to <TORCHYARD_OUTPUTS>/tensorboard:
    the TensorBoard event files that ``torchyard tensorboard`` serves)
    TORCHYARD_TERMINATION_LOG  JSON termination message (default /dev/termination-log)
    TORCHYARD_DNS_TIMEOUT      seconds to wait for MASTER_ADDR to resolve (default 300)
    TORCHYARD_GRACE_PERIOD     seconds between SIGTERM and SIGKILL of the others (default 10)
    TORCHYARD_REGISTRY_URL, TORCHYARD_REGISTRY_TOKEN_FILE
                               where to archive ./logs and ./outputs, and the token to show
    TORCHYARD_OUTPUTS_OPTIONAL "1": a failed archive upload does not fail the node
    TORCHYARD_SNAPSHOT_MAX_BYTES, TORCHYARD_SNAPSHOT_MAX_FILES
                               what ``--copy``/``--fetch`` may unpack (default 1 GiB,
                               100000 entries)
    TORCHYARD_SHIPPED_PATH     the folder holding the shipped ``torchyard`` package: put
                               first on the ranks' PYTHONPATH (unset: a folder linking
                               the launcher's own package, so that every process the
                               ranks start, torchrun's workers too, imports torchyard)
    TORCHYARD_MPI_END_WAIT     MPI runs: seconds a worker node waits, after its orted ended,
                               for node 0 to say how mpirun ended (default 30)
    TORCHYARD_CGROUP_ROOT      where the container's cgroups are mounted (default
                               /sys/fs/cgroup): the OOM killer's count and the memory limit
    TORCHYARD_PROGRESS_INTERVAL  seconds between the node's ``[torchyard] progress`` lines
                               (default 5), from the ranks' ``@@torchyard`` lines
    TORCHYARD_STALL_TIMEOUT    seconds without progress that fail a rank (default adaptive:
                               max(TORCHYARD_STALL_FLOOR (300), 5 x the slowest step))
    TORCHYARD_STALL_BUDGETS    JSON ``{"initializing"|"saving"|"evaluating": seconds}``: the
                               stall timeout while a rank says it is in that phase
                               (``progress.report(phase=...)``; defaults STALL_BUDGETS)
    TORCHYARD_LOG_RULES        JSON ``[{"pattern", "action"}]``: policy.logRules
    TORCHYARD_LOG_LIMIT_BYTES  the most each rank's ``logs/rank-<r>.txt`` holds (default
                               64 MiB; 0: no limit): policy.logLimitBytes; more keeps its
                               first and last half and says what was dropped between
    TORCHYARD_PROGRESS_FILE    local mode: the node's progress summaries go to this file,
                               one JSON a line, instead of ``[torchyard] progress`` lines,
                               and the ranks' ``@@torchyard`` lines are not shown
    TORCHYARD_NODE_COOKIE      marks every process the ranks start (default: a random
                               value; local mode sets its own): once the ranks ended, what
                               carries it, or still holds their output pipes, is ended
    TORCHYARD_GPUS_PER_NODE    > 0: PyTorch's NCCL flight recorder is switched on
    TORCHYARD_CHECKPOINT_DIR   the run's shared checkpoint folder (``torchyard.checkpoint``):
                               the ranks get TORCHYARD_RESUME_FROM/STEP of the newest
                               complete checkpoint; node 0 writes COMPLETE.json, keeps the
                               newest TORCHYARD_CHECKPOINT_KEEP and, after a failure with
                               no progress, quarantines the checkpoint it resumed from
                               (TORCHYARD_CHECKPOINT_MAX_STALLS of them: reason NoProgress);
                               on SIGTERM the ranks first save at one agreed step, for at
                               most TORCHYARD_CHECKPOINT_SAVE_SECONDS

and then:
- waits until MASTER_ADDR resolves (headless-Service DNS appears a moment after the Pod);
- ``launch: process`` starts TORCHYARD_NPROC_PER_NODE children with RANK, LOCAL_RANK,
  ...; ``launch: node`` starts the command once (e.g. ``torchrun``, which reads PET_*);
- tees every line of every rank to ``logs/rank-<r>.txt`` (within TORCHYARD_LOG_LIMIT_BYTES)
  and to its own output with a ``[rank r]`` prefix, whole lines, from one writer thread
  that never makes a rank wait: a reader slower than the ranks write loses rank lines
  from this output (a line says how many), never the launcher's own;
- once the ranks ended, ends whatever they started that still runs (a helper in a
  session of its own, a daemon: TORCHYARD_NODE_COOKIE), so that it neither outlives the
  node nor holds it;
- fails fast: the first rank to exit non-zero decides; the others get SIGTERM, then
  SIGKILL after the grace period; the launcher exits with that rank's code;
- forwards SIGTERM/SIGINT to the ranks;
- writes a JSON termination message (at most 4 KiB): rank, exit code or signal, the
  tail of that rank's traceback, and when it exited (``exitedAt``, Unix time), so that
  the operator can name the rank that failed first when its peers on other nodes fail
  a moment later because they lost it. A rank SIGKILLed while the kernel's OOM killer
  struck in this container's memory cgroup (its ``oom_kill`` count went up) is reported
  with reason ``OOMKilled``, the container's memory limit and what to do;
- archives the logs (and node 0's outputs) to the registry service; when that fails
  after the ranks succeeded, the termination message says ArchiveFailed with the HTTP
  status and what to fix, and the launcher exits with ARCHIVE_FAILED_EXIT (3), unless
  the outputs are optional.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

if not __package__:  # run as a file: the package is imported from the folder above its own
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from torchyard.launch.contract import (
    MPI_LAUNCHER,
    NODE_LAUNCHER,
    TERMINATION_LOG,
    TORCHYARD_DISTRIBUTION,
    TORCHYARD_TERMINATION_LOG,
    LaunchError,
    termination_message,
    write_termination,
)
from torchyard.launch.mpi_launcher import MpiLauncher, rsh_agent
from torchyard.launch.node_files import SOURCE_OPTIONS, copy_inputs, prepare
from torchyard.launch.node_launcher import Launcher
from torchyard.launch.ranks import become_subreaper

# The launcher class of a node, by the launcher its run's distribution type names
# (``DistributionType.launcher``, which planning puts in TORCHYARD_DISTRIBUTION); a type
# with a launcher of its own is one entry here and one name in ``contract``.
LAUNCHERS: dict[str, type[Launcher]] = {NODE_LAUNCHER: Launcher, MPI_LAUNCHER: MpiLauncher}


def launcher_class() -> type[Launcher]:
    """The class that launches this node: ``LAUNCHERS[TORCHYARD_DISTRIBUTION]``; unset or
    not a key there (a run's own ``env`` may set it), the node launcher."""
    return LAUNCHERS.get(os.environ.get(TORCHYARD_DISTRIBUTION, NODE_LAUNCHER), Launcher)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        sys.stdout.write(__doc__ or "")
        return 0
    if args and args[0] in SOURCE_OPTIONS:
        if args[3:4] != ["--"]:
            sys.stderr.write(
                "[torchyard] error: usage: main.py [--copy SRC DIR | --fetch SHA256 DIR]"
                " -- <command> [args...]\n"
            )
            return 2
        code = prepare(args[:3], os.environ.get(TORCHYARD_TERMINATION_LOG, TERMINATION_LOG))
        if code:
            return code
        args = args[3:]
    if args and args[0] == "--rsh":
        return rsh_agent(args[1:])
    if args and args[0] == "--":
        args = args[1:]
    try:
        copied = copy_inputs(os.environ)
        if copied:
            sys.stderr.write(f"[torchyard] copied the inputs to download: {copied} files\n")
        become_subreaper()  # what the ranks start and orphan is this process's to end
        return int(launcher_class()(args).run())
    except LaunchError as err:
        sys.stderr.write(f"[torchyard] error: {err}\n")
        write_termination(
            os.environ.get(TORCHYARD_TERMINATION_LOG, TERMINATION_LOG),
            termination_message({"reason": "LaunchError", "exitCode": 2, "message": str(err)}),
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
