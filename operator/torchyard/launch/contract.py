"""What the launcher shares with the rest of torchyard: the name of every environment
variable, the rank contract, the launchers' names, the termination message, the progress
line, the failure classes' evidence patterns, the stuck-rank rule and the snapshot limits.

Standard library only, Python >= 3.8: the bottom of the launcher's modules, shipped with
them into every node Pod (``planning.pods.SHIPPED_MODULES``). The operator's own layers
import the names and rules from here rather than keep copies: the planner, local mode,
the commands' settings and the shipped ``checkpoint`` and ``progress`` (every variable's
name; no other module spells one out), ``planning.rank`` (``process_env``),
``api`` (``RANK_CONTRACT_VARIABLES``), ``launch.classes`` (``FAILURE_PATTERNS``),
``status.culprits`` (``culprit_rule``, ``waiting_words``), ``status.steps`` and
``status.failures`` (``PROGRESS_LINE``), ``registry.store`` and ``sdk.snapshots`` (the
snapshot limits), ``local.console`` (``write_bytes``) and ``torchyard.progress`` (the
progress line: ``parse_progress``, ``PHASE_NAMES``), ``api.policies`` and
``controller.options`` (the bounds of a rank's log), ``distributions`` (the launchers'
names). Tested in tests/unit/launcher/test_contract.py and through the launcher's tests
in tests/unit/launcher/.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any, TypeVar

TERMINATION_MESSAGE_LIMIT = 4096
# Where the container's termination message goes (its terminationMessagePath), unless
# TORCHYARD_TERMINATION_LOG says otherwise (local mode, the tests)
TERMINATION_LOG = "/dev/termination-log"
# Reasons a launcher's termination message gives beyond "Error" and "OOMKilled": a rank
# that made no progress past its stall timeout, and attempts that kept failing before
# getting past the checkpoint they resumed from (``torchyard.checkpoint``)
STALLED_REASON = "Stalled"
NO_PROGRESS_REASON = "NoProgress"
TAIL_LINES = 120  # launch: node: torchrun's 35-line summary comes after the rank's error


# -- the variables ----------------------------------------------------------------------
# Every environment variable torchyard sets or reads has its name here, once: the operator's
# planner writes them into node Pods and local mode into its launchers, the launcher and the
# shipped modules read them, and torchyard's own commands read their settings (tests keep
# any other literal out of the package: tests/unit/launch/test_contract.py).

# The rank contract (docs/concepts/rank-contract.md): what every training process sees.
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
WORLD_SIZE = "WORLD_SIZE"
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
NODE_RANK = "NODE_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
GROUP_RANK = "GROUP_RANK"
PET_NNODES = "PET_NNODES"  # torchrun's (launch: node)
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
PET_NODE_RANK = "PET_NODE_RANK"
PET_MASTER_ADDR = "PET_MASTER_ADDR"
PET_MASTER_PORT = "PET_MASTER_PORT"
TORCHYARD_OUTPUTS = "TORCHYARD_OUTPUTS"  # the folder archived as the run's outputs
TORCHYARD_LOGS = "TORCHYARD_LOGS"  # the folder of logs/rank-<r>.txt, archived
TORCHYARD_TENSORBOARD_DIR = "TORCHYARD_TENSORBOARD_DIR"  # <outputs>/tensorboard
# The run and the node, besides the contract: planning.rank.node_env
TORCHYARD_RUN = "TORCHYARD_RUN"
TORCHYARD_NAMESPACE = "TORCHYARD_NAMESPACE"
TORCHYARD_LAUNCH = "TORCHYARD_LAUNCH"  # process | node
TORCHYARD_NNODES = "TORCHYARD_NNODES"
TORCHYARD_NPROC_PER_NODE = "TORCHYARD_NPROC_PER_NODE"
TORCHYARD_EXPORT_ONNX = "TORCHYARD_EXPORT_ONNX"  # "1": outputs.register.exportOnnx
# Every variable torchyard sets starts so (a spec may not set one: ``api.endpoints``)
VARIABLE_PREFIX = "TORCHYARD_"
# An input's folder (``spec.inputs``): TORCHYARD_INPUT_<NAME>, which arguments may name
# too, as the guide's ``dataset.as_named_input('birds').as_mount()`` argument.
INPUT_VARIABLE_PREFIX = "TORCHYARD_INPUT_"
# A sweep trial's parameter: TORCHYARD_PARAM_<NAME> (``sweeps.sampling``)
PARAM_VARIABLE_PREFIX = "TORCHYARD_PARAM_"

# The launcher's configuration (``launch.main``'s docstring says each one), set by the
# planner (``planning.pods.launcher_env``, ``watch_env``, ``checkpoints.env``, the run's
# distribution type) or by local mode.
TORCHYARD_DISTRIBUTION = "TORCHYARD_DISTRIBUTION"  # the launcher class (launch.main.LAUNCHERS)
TORCHYARD_TERMINATION_LOG = "TORCHYARD_TERMINATION_LOG"
TORCHYARD_DNS_TIMEOUT = "TORCHYARD_DNS_TIMEOUT"
TORCHYARD_GRACE_PERIOD = "TORCHYARD_GRACE_PERIOD"
TORCHYARD_SHIPPED_PATH = "TORCHYARD_SHIPPED_PATH"
TORCHYARD_SOURCE_PATH = "TORCHYARD_SOURCE_PATH"  # a git source's path in the repository
TORCHYARD_GPUS_PER_NODE = "TORCHYARD_GPUS_PER_NODE"
TORCHYARD_CGROUP_ROOT = "TORCHYARD_CGROUP_ROOT"
TORCHYARD_NODE_COOKIE = "TORCHYARD_NODE_COOKIE"
TORCHYARD_PROGRESS_FILE = "TORCHYARD_PROGRESS_FILE"
TORCHYARD_PROGRESS_INTERVAL = "TORCHYARD_PROGRESS_INTERVAL"
TORCHYARD_STALL_TIMEOUT = "TORCHYARD_STALL_TIMEOUT"
TORCHYARD_STALL_FLOOR = "TORCHYARD_STALL_FLOOR"
TORCHYARD_STALL_BUDGETS = "TORCHYARD_STALL_BUDGETS"
TORCHYARD_STACKS_DIR = "TORCHYARD_STACKS_DIR"  # where a rank's stack hook writes
TORCHYARD_LOG_RULES = "TORCHYARD_LOG_RULES"
TORCHYARD_LOG_LIMIT_BYTES = "TORCHYARD_LOG_LIMIT_BYTES"
TORCHYARD_SNAPSHOT_MAX_BYTES = "TORCHYARD_SNAPSHOT_MAX_BYTES"
TORCHYARD_SNAPSHOT_MAX_FILES = "TORCHYARD_SNAPSHOT_MAX_FILES"
TORCHYARD_INPUTS_COPIES = "TORCHYARD_INPUTS_COPIES"  # inputs copied into outputs/logs
# The registry service: where a node archives (and an inputs fetch or the SDK reads)
TORCHYARD_REGISTRY_URL = "TORCHYARD_REGISTRY_URL"
TORCHYARD_REGISTRY_TOKEN_FILE = "TORCHYARD_REGISTRY_TOKEN_FILE"
TORCHYARD_REGISTRY_CA = "TORCHYARD_REGISTRY_CA"  # the CA's PEM itself
TORCHYARD_OUTPUTS_OPTIONAL = "TORCHYARD_OUTPUTS_OPTIONAL"
TORCHYARD_ARCHIVE_ATTEMPTS = "TORCHYARD_ARCHIVE_ATTEMPTS"
# MPI runs (``distributions.mpi``, ``launch.mpi_launcher``)
TORCHYARD_MPIRUN_ARGS = "TORCHYARD_MPIRUN_ARGS"
TORCHYARD_MPI_DOMAIN = "TORCHYARD_MPI_DOMAIN"
TORCHYARD_MPI_HOSTFILE = "TORCHYARD_MPI_HOSTFILE"
TORCHYARD_MPI_KEY_FILE = "TORCHYARD_MPI_KEY_FILE"
TORCHYARD_MPI_PORT = "TORCHYARD_MPI_PORT"
TORCHYARD_MPI_END_WAIT = "TORCHYARD_MPI_END_WAIT"
# The checkpoint folder (``planning.checkpoints``, ``torchyard.checkpoint``)
TORCHYARD_CHECKPOINT_DIR = "TORCHYARD_CHECKPOINT_DIR"
TORCHYARD_CHECKPOINT_ATTEMPT = "TORCHYARD_CHECKPOINT_ATTEMPT"
TORCHYARD_CHECKPOINT_INTERVAL = "TORCHYARD_CHECKPOINT_INTERVAL"
TORCHYARD_CHECKPOINT_KEEP = "TORCHYARD_CHECKPOINT_KEEP"
TORCHYARD_CHECKPOINT_MAX_STALLS = "TORCHYARD_CHECKPOINT_MAX_STALLS"
TORCHYARD_CHECKPOINT_SAVE_SECONDS = "TORCHYARD_CHECKPOINT_SAVE_SECONDS"
TORCHYARD_RESUME_FROM = "TORCHYARD_RESUME_FROM"  # what the ranks resume from
TORCHYARD_RESUME_STEP = "TORCHYARD_RESUME_STEP"
# In-place restarts (``launch.coordination``): node 0's coordinator ("host:port") and what
# the operator had counted against backoffLimit when the Pod started (JSON, ``Budget``)
TORCHYARD_COORDINATOR = "TORCHYARD_COORDINATOR"
TORCHYARD_RESTART_BUDGET = "TORCHYARD_RESTART_BUDGET"
COORDINATOR_PORT = 29411  # node 0's coordinator, in every node Pod of a coordinated run
# An Environment build's (``planning.environments`` sets them; ``envbuild`` reads them from
# this module's copy beside it in the build Pod)
TORCHYARD_INSECURE_REGISTRIES = "TORCHYARD_INSECURE_REGISTRIES"
TORCHYARD_REGISTRY_AUTH = "TORCHYARD_REGISTRY_AUTH"

# The settings of torchyard's own commands, not the launcher's: the operator's (the Helm
# chart sets them), the CLI's and the SDK's (the user's shell), local mode's folders.
TORCHYARD_INIT_IMAGE = "TORCHYARD_INIT_IMAGE"
TORCHYARD_GIT_IMAGE = "TORCHYARD_GIT_IMAGE"
TORCHYARD_RESOLVE_CURATED = "TORCHYARD_RESOLVE_CURATED"
TORCHYARD_REGISTRY_CA_FILE = "TORCHYARD_REGISTRY_CA_FILE"
TORCHYARD_INPUTS_ACCESS_MODE = "TORCHYARD_INPUTS_ACCESS_MODE"
TORCHYARD_INPUTS_CACHE_LIMIT = "TORCHYARD_INPUTS_CACHE_LIMIT"
TORCHYARD_INPUTS_CACHE_SIZE = "TORCHYARD_INPUTS_CACHE_SIZE"
TORCHYARD_INPUTS_STORAGE_CLASS = "TORCHYARD_INPUTS_STORAGE_CLASS"
TORCHYARD_MLFLOW_URI = "TORCHYARD_MLFLOW_URI"
TORCHYARD_MLFLOW_SECRET = "TORCHYARD_MLFLOW_SECRET"
TORCHYARD_KUEUE_INTEGRATION = "TORCHYARD_KUEUE_INTEGRATION"
TORCHYARD_METRICS_PORT = "TORCHYARD_METRICS_PORT"
TORCHYARD_PEERING_NAME = "TORCHYARD_PEERING_NAME"
TORCHYARD_RESYNC_SECONDS = "TORCHYARD_RESYNC_SECONDS"
TORCHYARD_TOKEN = "TORCHYARD_TOKEN"
TORCHYARD_TENSORBOARD = "TORCHYARD_TENSORBOARD"
TORCHYARD_REGISTRY = "TORCHYARD_REGISTRY"  # local mode's registry folder
TORCHYARD_LOCAL_RUNS = "TORCHYARD_LOCAL_RUNS"
TORCHYARD_INPUTS_CACHE = "TORCHYARD_INPUTS_CACHE"

# An OnlineEndpoint's serving process (``planning.endpoints`` sets them, the serving
# runtime ``torchyard.serving`` reads them; ``serving.contract`` has the rest of what they
# agree on). The guide's two: the model's folder and the scoring script.
AZUREML_MODEL_DIR = "AZUREML_MODEL_DIR"
AZUREML_ENTRY_SCRIPT = "AZUREML_ENTRY_SCRIPT"
TORCHYARD_MODEL_NAME = "TORCHYARD_MODEL_NAME"
TORCHYARD_MODEL_VERSION = "TORCHYARD_MODEL_VERSION"
TORCHYARD_ENDPOINT = "TORCHYARD_ENDPOINT"
TORCHYARD_MAX_BODY_BYTES = "TORCHYARD_MAX_BODY_BYTES"
TORCHYARD_REQUEST_TIMEOUT_SECONDS = "TORCHYARD_REQUEST_TIMEOUT_SECONDS"
TORCHYARD_CONCURRENCY = "TORCHYARD_CONCURRENCY"
TORCHYARD_DRAIN_SECONDS = "TORCHYARD_DRAIN_SECONDS"
# where the runtime asks whether a caller's token may call the endpoint (unset: public)
TORCHYARD_ENDPOINT_ACCESS_URL = "TORCHYARD_ENDPOINT_ACCESS_URL"
# another port (tests run several serving processes on one machine; a Pod sets none)
TORCHYARD_SERVING_PORT = "TORCHYARD_SERVING_PORT"

# The variables of the rank contract: torchyard sets them (a TrainingRun's env may not),
# and a command's arguments may name them, as in the Azure ML guide's tip
# (``arguments=['--local_rank', '$LOCAL_RANK']``): expanded per process.
RANK_CONTRACT_VARIABLES = (
    MASTER_ADDR,
    MASTER_PORT,
    WORLD_SIZE,
    RANK,
    LOCAL_RANK,
    NODE_RANK,
    LOCAL_WORLD_SIZE,
    GROUP_RANK,
    PET_NNODES,
    PET_NPROC_PER_NODE,
    PET_NODE_RANK,
    PET_MASTER_ADDR,
    PET_MASTER_PORT,
    TORCHYARD_OUTPUTS,
    TORCHYARD_LOGS,
    TORCHYARD_TENSORBOARD_DIR,
)
# Where a rank writes its TensorBoard event files (``TORCHYARD_TENSORBOARD_DIR``): this
# folder of its outputs, so that node 0's are archived with them and ``torchyard
# tensorboard`` finds them in the node Pod while the run runs and in the archive after.
TENSORBOARD_DIR_NAME = "tensorboard"
_NAMES = "|".join(RANK_CONTRACT_VARIABLES) + "|" + INPUT_VARIABLE_PREFIX + "[A-Z0-9_]+"
_CONTRACT_VAR = re.compile(r"\$(?:\{(" + _NAMES + r")\}|(" + _NAMES + r")\b)")


def expand_arguments(command: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``$RANK``/``${LOCAL_RANK}``/``$TORCHYARD_INPUT_BIRDS``... in arguments, replaced by
    this process's values. Only the rank contract's names and the inputs' are touched;
    any other ``$`` stays as it is."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return env.get(name, match.group(0))

    return [_CONTRACT_VAR.sub(value, arg) for arg in command]


class LaunchError(Exception):
    """The launcher cannot start the ranks (bad configuration, DNS never resolved)."""


def process_env(node_env: Mapping[str, str], local_rank: int) -> dict[str, str]:
    """The rank contract of one process: the node's variables plus RANK and LOCAL_RANK.

    Pure; shared with ``torchyard.planning`` (which computes ``node_env``).
    """
    nproc = int(node_env[TORCHYARD_NPROC_PER_NODE])
    node_rank = int(node_env[NODE_RANK])
    env = dict(node_env)
    env[LOCAL_RANK] = str(local_rank)
    env[RANK] = str(node_rank * nproc + local_rank)
    return env


def int_env(env: Mapping[str, str], name: str, default: int | None) -> int:
    """Variable ``name`` of ``env`` as an integer, ``default`` when it is unset or empty;
    LaunchError when it is not an integer, or unset without a default."""
    raw = env.get(name, "")
    if raw == "":
        if default is None:
            raise LaunchError(f"{name} is not set: is this running under torchyard?")
        return default
    try:
        return int(raw)
    except ValueError:
        raise LaunchError(f"{name} must be an integer, got {raw!r}") from None


# -- the termination message -------------------------------------------------------------


def traceback_tail(lines: Sequence[str]) -> str:
    """The last Python traceback in ``lines`` (or the last lines when there is none)."""
    lines = list(lines)
    start = None
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last)"):
            start = i
            break
    tail = lines[start:] if start is not None else lines[-20:]
    return "\n".join(line.rstrip("\n") for line in tail).strip()


def termination_message(info: Mapping[str, Any], limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
    """``info`` as JSON of at most ``limit`` bytes, cutting the message from the front."""
    info = dict(info)
    message = str(info.get("message") or "")
    while True:
        text = json.dumps(info, sort_keys=True)
        size = len(text.encode("utf-8"))
        if size <= limit or not message:
            return text
        # Cut in proportion to the escaped size (newlines and quotes count double).
        escaped = len(json.dumps(message).encode("utf-8"))
        message = message[len(message) * (size - limit) // max(escaped, 1) + 4 :]
        info["message"] = "..." + message


def write_termination(path: str, text: str) -> None:
    """``text`` into the file ``path`` (the termination message); a failure is said on
    stderr, never raised."""
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as err:
        sys.stderr.write(f"[torchyard] cannot write the termination message to {path}: {err}\n")


def write_bytes(sink: IO[str], data: bytes) -> None:
    """``data`` to a text stream: to its binary buffer when it has one (bytes as they
    came), else decoded; then flushed. Local mode's console writes the same way."""
    buffer = getattr(sink, "buffer", None)
    if buffer is not None:
        buffer.write(data)
    else:
        sink.write(data.decode("utf-8", "replace"))
    sink.flush()


# -- the progress line -------------------------------------------------------------------

PROGRESS_PREFIX = b"@@torchyard "  # a rank's progress line (``torchyard.progress.report``)
PROGRESS_TEXT = PROGRESS_PREFIX.decode()
PROGRESS_LINE = "[torchyard] progress "  # what the operator looks for in this Pod's log
# What a rank may say it is doing besides training (``torchyard.progress.PHASES``), each
# with its own stall budget: a checkpoint save or an evaluation may take far longer than
# a step. "training" (or a higher step without a phase) ends the phase.
PHASE_NAMES = {
    "initializing": "initializing",
    "initialising": "initializing",
    "saving": "saving",
    "evaluating": "evaluating",
    "training": None,
}
STALL_BUDGETS = {"initializing": 1800.0, "saving": 1800.0, "evaluating": 3600.0}


def parse_progress(line: bytes | str) -> dict[str, Any] | None:
    """The record of a rank's ``@@torchyard {...}`` line (bytes as the launcher reads them,
    undecodable ones replaced, or text), or None when ``line`` is not a valid one."""
    if isinstance(line, bytes):
        if not line.startswith(PROGRESS_PREFIX):
            return None
        body = line[len(PROGRESS_PREFIX) :].decode("utf-8", "replace")
    else:
        if not line.startswith(PROGRESS_TEXT):
            return None
        body = line[len(PROGRESS_TEXT) :]
    try:
        record = json.loads(body)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None
    return record


# The fields of a ``logs/metrics.jsonl`` record that are no metric: the progress line's
# own and the rank and time the launcher adds.
NOT_METRICS = frozenset({"step", "total", "phase", "rank", "time"})


def rank0_records(text: str) -> Iterator[dict[str, Any]]:
    """The records of a node's ``logs/metrics.jsonl`` text that rank 0 reported (or that
    name no rank), in order, as the status's progress keeps them; a line that is no JSON
    object is passed over."""
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("rank") in (0, None):
            yield record


# -- evidence: what lines of a rank's output say of a failure ----------------------------

# The patterns of the failure classes (``launch.classes``) that lines of any rank's output
# show, not only the failing rank's traceback: a GPU's Xid/ECC error (it comes before the
# traceback), CUDA out of memory, a segfault, the rendezvous store, NCCL's watchdog or
# gloo's transport timing out a collective. Searched in order: the first says it best.
FAILURE_PATTERNS: dict[str, tuple[str, ...]] = {
    "GpuXid": (
        r"NVRM: Xid \(",
        r"\bXid[: ]+\d+",
        r"uncorrectable ECC error",
        r"ECC error[s]? (detected|encountered)",
        r"CUDA error: uncorrectable ECC",
    ),
    "CudaOOM": (
        r"CUDA out of memory",
        r"torch\.(cuda\.)?OutOfMemoryError",
        r"CUDA error: out of memory",
    ),
    "Segfault": (r"Segmentation fault", r"Fatal Python error: Segmentation fault"),
    "RendezvousTimeout": (
        r"DistStoreError",
        r"DistNetworkError",
        r"RendezvousTimeoutError",
        r"RendezvousConnectionError",
        r"TCPStore\b.*([Tt]imed? ?out|[Ff]ailed|refused)",
        r"[Tt]imed out after \d+ seconds waiting for clients",
        r"Timed out initializing process group in store based barrier",
        # a TCPStore client (rank > 0, or rank 0 through the Service name) that never
        # reached the store: "TimeoutError: The client socket has timed out after 10s
        # while trying to connect to (<run>-0.<run>.<ns>.svc, <masterPort>)."
        r"client socket has timed out after \d+m?s while trying to connect to",
        r"Socket Timeout",
    ),
    "CollectiveTimeout": (
        # NCCL's watchdog: "[Rank 0] Watchdog caught collective operation timeout:
        # WorkNCCL(SeqNum=1, OpType=ALLREDUCE, ...) ran for 10006 milliseconds before timing out."
        r"Watchdog caught collective operation timeout",
        r"ProcessGroupNCCL.*[Tt]imeout",
        r"NCCL (communicator|watchdog).*(timed out|timeout)",
        # gloo's tcp transport (CPU), as Debian's torch 1.13 said it on the real node:
        # "RuntimeError: [./gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting
        # 15000ms for recv operation to complete"
        r"Timed out waiting \d+ms for (recv|send) operation to complete",
    ),
}
# What the launcher flags in any rank's output for those classes (``EVIDENCE``; kept in the
# termination message as ``evidence``): a few words that may say one of them, each with a
# literal word of EVIDENCE_WORDS. The operator classifies the flagged lines and the failing
# rank's traceback tail by FAILURE_PATTERNS (a flagged line may match none of them).
EVIDENCE_FLAGS: dict[str, tuple[str, ...]] = {
    "GpuXid": (r"NVRM: Xid", r"\bXid[: ]+\d+", r"ECC error"),
    "CudaOOM": (r"CUDA out of memory", r"OutOfMemoryError"),
    "CollectiveTimeout": (
        r"Watchdog caught collective",
        r"Timed out waiting \d+ms for (recv|send) operation",
    ),
    "RendezvousTimeout": (
        r"DistStoreError",
        r"DistNetworkError",
        r"Rendezvous\w*Error",
        r"TCPStore",
    ),
    "Segfault": (r"Segmentation fault",),
}
EVIDENCE = re.compile("|".join(p for flags in EVIDENCE_FLAGS.values() for p in flags))
EVIDENCE_MAX = 4  # lines, of at most EVIDENCE_CHARS each: the message is 4 KiB in all
EVIDENCE_CHARS = 200
# Literal words every EVIDENCE match contains (tests/unit/launcher/test_output.py keeps
# them in step): a read of a rank's output that holds none of them holds no evidence, and
# is not searched line by line (the regular expression alone reads ~30 MB/s).
EVIDENCE_WORDS = (
    b"Xid",
    b"ECC error",
    b"CUDA out of memory",
    b"OutOfMemoryError",
    b"Watchdog caught",
    b"Timed out waiting",
    b"DistStoreError",
    b"DistNetworkError",
    b"Rendezvous",
    b"TCPStore",
    b"Segmentation fault",
)


# -- the stuck rank ----------------------------------------------------------------------

Suspect = TypeVar("Suspect")


def culprit_rule(
    suspects: Sequence[Suspect],
    first: Suspect | None,
    waiting: Callable[[Suspect], bool],
    place: Callable[[Suspect], Any],
    step: Callable[[Suspect], Any] = lambda _: None,
) -> Suspect | None:
    """Which of ``suspects`` (stalled ranks, in order; ``first``: the one idle longest) the
    others wait for, by those whose stacks say where they are (``waiting`` for the others,
    or at a ``place`` in the script; a dump with no frame of the script at all, as of a
    rank dumped while it unwound or in a garbage collection, says neither): the only ones
    not ``waiting`` for the others (outside ``torch.distributed``: a rank that sleeps,
    loops or blocks in a C call) while others are, ``first`` if it is one of them, else
    the first of them; else, of three or more, the one whose ``place`` in the script
    differs from where all the others are (it skipped a collective and waits in another
    one); else, of three or more, the one whose last ``step`` (None: unknown) differs from
    the step all the others reported (a step ahead: it skipped a collective; behind: it
    stopped before its report); else ``first``.
    A node's launcher applies it to its own ranks (``stalls.culprit``), the
    operator to those of every node (``status.culprits.pick``)."""
    told = [s for s in suspects if waiting(s) or place(s) is not None]
    outside = [s for s in told if not waiting(s)]
    if outside and len(outside) < len(told):
        return first if first in outside else outside[0]
    return _odd_one(told, place) or _odd_one(suspects, step) or first


def _odd_one(suspects: Sequence[Suspect], key: Callable[[Suspect], Any]) -> Suspect | None:
    """Of three or more ``suspects``, the one whose ``key`` differs from the one ``key``
    (not None) of all the others; None when there is no such one."""
    if len(suspects) < 3:
        return None
    keys = [key(s) for s in suspects]
    for i, one in enumerate(suspects):
        others = {k for j, k in enumerate(keys) if j != i}
        if len(others) == 1 and keys[i] not in others and None not in others:
            return one
    return None


def waiting_words(collective: str) -> str:
    """How a message says where a rank waits (``stalls.waiting_in``'s answer), on
    a node and in the operator's ``status.culprits`` alike."""
    if collective == "backward":
        return "waiting in backward: the gradient all-reduce"
    return f"in torch.distributed {collective}"


# -- which launcher runs a node ----------------------------------------------------------

# The launcher of a node, by TORCHYARD_DISTRIBUTION: the ``launcher`` of the run's
# distribution type (``torchyard.distributions``; the planner sets the variable unless it
# is the node launcher's), a key of ``launch.main.LAUNCHERS``. A type with a launcher of
# its own is one name here and one entry there.
NODE_LAUNCHER = ""
MPI_LAUNCHER = "mpi"

# Every process a node's ranks start inherits TORCHYARD_NODE_COOKIE (the launcher sets it
# to a random value of its own, or keeps the one local mode gave it): when the ranks ended,
# whatever still carries it is theirs (a helper in a session of its own, a daemon) and is
# ended, as is whatever still holds their output pipes open.


# -- rank logs ---------------------------------------------------------------------------

# TORCHYARD_LOG_LIMIT_BYTES: the most one rank's log file (logs/rank-<r>.txt) may hold
# (``output.CappedLog``): a run's spec.policy.logLimitBytes, else the operator's
# ``--default-log-limit-bytes``, else LOG_LIMIT_BYTES. The spec and the operator's option
# keep within LOG_LIMIT_MIN and LOG_LIMIT_MAX.
LOG_LIMIT_BYTES = 64 << 20
LOG_LIMIT_MIN = 4096  # a smaller limit would hold little more than the dropped note
LOG_LIMIT_MAX = 1 << 40


# -- source snapshots --------------------------------------------------------------------

SNAPSHOT = "source.tar.gz"
# What one source snapshot may hold once unpacked, as the registry service's snapshot limit
# (1 GiB) and ``torchyard.sdk.snapshots`` (which refuses a bigger folder before sending it).
SNAPSHOT_MAX_BYTES = 1 << 30
SNAPSHOT_MAX_FILES = 100000


def snapshot_limits(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(bytes, entries) one snapshot may unpack to: ``TORCHYARD_SNAPSHOT_MAX_BYTES`` and
    ``TORCHYARD_SNAPSHOT_MAX_FILES``, else the defaults above."""
    env = os.environ if env is None else env
    limits = []
    for name, default in (
        (TORCHYARD_SNAPSHOT_MAX_BYTES, SNAPSHOT_MAX_BYTES),
        (TORCHYARD_SNAPSHOT_MAX_FILES, SNAPSHOT_MAX_FILES),
    ):
        value = int_env(env, name, default)
        if value < 1:
            raise LaunchError(f"{name} must be a positive integer, got {value}")
        limits.append(value)
    return limits[0], limits[1]
