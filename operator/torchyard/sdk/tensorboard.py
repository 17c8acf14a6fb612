"""A run's TensorBoard event files, kept in a folder on this machine for a real
``tensorboard`` to serve (``torchyard tensorboard``).

Every process of a run gets ``TORCHYARD_TENSORBOARD_DIR``, ``<TORCHYARD_OUTPUTS>/tensorboard``
(``launch.contract.TENSORBOARD_DIR_NAME``); by convention rank 0 writes there. A
:class:`Source` reads what is there now: node 0's Pod while the run runs (a tar stream
through the Kubernetes exec API, ``k8s.pod_exec_output``), the run's archive in the
registry service after it ended (node 0's outputs are archived), and in local mode the
node 0 working folder of a local run that is still running, else the local registry's
archive. :func:`sync` copies what changed into ``<folder>/<run>/``: an event file only
grows, so what is new is appended in place and a running TensorBoard reads on from where it
was. A file name from a Pod or an archive that is absolute, climbs out (``..``) or is not
a plain file is left out and said, never written.

Called by ``torchyard.cli.tensorboard``; tested in tests/unit/sdk/test_tensorboard.py and
tests/integration/tracking/test_tensorboard.py (a real TensorBoard over HTTP).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol

from torchyard import k8s
from torchyard.api import wire
from torchyard.launch.contract import TENSORBOARD_DIR_NAME
from torchyard.planning import names
from torchyard.records import MAX_LIMIT, Records
from torchyard.sdk.registry import RegistryClient, RegistryError
from torchyard.sdk.runs import TERMINAL, RunNotFound, node_pods

# The most a node Pod's event files may hold together (one tar stream).
MAX_TAR_BYTES = 1 << 30
# A path deeper than this, or longer, is not an event file of ours.
MAX_DEPTH = 16
MAX_PATH_CHARS = 1024
ARCHIVE_PREFIX = f"outputs/{TENSORBOARD_DIR_NAME}/"
# The command that writes node 0's event folder as a tar stream (exit 3: no such folder).
# Where the launcher put the outputs: $TORCHYARD_OUTPUTS, else ./outputs in the working
# directory, else (a working directory the user may not write: an image's code run as
# spec.runAsUser) the same name under the temporary directory (launch.ranks.writable_folder).
TAR_COMMAND = (
    "sh",
    "-c",
    f'for d in "${{TORCHYARD_OUTPUTS:-outputs}}/{TENSORBOARD_DIR_NAME}" '
    f'"${{TMPDIR:-/tmp}}/torchyard/outputs/{TENSORBOARD_DIR_NAME}"; do '
    '[ -d "$d" ] && exec tar -cf - -C "$d" .; done; exit 3',
)
NO_FOLDER_EXIT = 3
TRAINER = "trainer"  # the node Pod's container (planning.pods)
# A local run's working folder: <namespace>-<run>-<date>-<time>-<pid>[-n] (local.runs).
_WORKDIR = r"-\d{8}-\d{6}-(\d+)(?:-\d+)?"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class NoEventFiles(Exception):
    """A run that ended left no TensorBoard event files."""


class Source(Protocol):
    """Where one run's event files are now: ``where`` says it, ``live`` whether more may
    come; :meth:`read` returns the files whose size is not the one in ``known`` (path
    relative to the event folder -> its bytes), and what it left out."""

    where: str
    live: bool

    def read(self, known: Mapping[str, int]) -> tuple[dict[str, bytes], list[str]]: ...


def checked(name: str) -> str | None:
    """``name`` as a relative path inside the event folder, None when it is not one:
    absolute, with ``..``, control characters, too deep or too long (tar's ``./`` and
    empty parts are dropped)."""
    if not name or len(name) > MAX_PATH_CHARS or _CONTROL.search(name) or "\\" in name:
        return None
    if name.startswith("/"):
        return None
    parts = [p for p in PurePosixPath(name).parts if p not in ("", ".")]
    if not parts or ".." in parts or len(parts) > MAX_DEPTH:
        return None
    return "/".join(parts)


@dataclass
class FolderSource:
    """A folder on this machine (a local run's node 0, or the local registry's archive);
    links and other non-files are left out."""

    folder: Path
    where: str
    live: bool

    def read(self, known: Mapping[str, int]) -> tuple[dict[str, bytes], list[str]]:
        found: dict[str, bytes] = {}
        left: list[str] = []
        for dirpath, dirnames, filenames in os.walk(self.folder):
            base = Path(dirpath)
            dirnames[:] = [d for d in dirnames if not (base / d).is_symlink()]
            for name in filenames:
                path = base / name
                rel = checked(path.relative_to(self.folder).as_posix())
                if rel is None or path.is_symlink() or not path.is_file():
                    left.append(path.relative_to(self.folder).as_posix())
                    continue
                if path.stat().st_size != known.get(rel):
                    found[rel] = path.read_bytes()
        return found, left


@dataclass
class PodSource:
    """Node 0's event folder in its running Pod, as a tar stream (``TAR_COMMAND``)."""

    namespace: str
    pod: str
    where: str
    live: bool = True

    def read(self, known: Mapping[str, int]) -> tuple[dict[str, bytes], list[str]]:
        result = k8s.pod_exec_output(
            self.namespace, self.pod, TAR_COMMAND, container=TRAINER, limit_bytes=MAX_TAR_BYTES
        )
        if result.exit_code == NO_FOLDER_EXIT:
            return {}, []
        if result.exit_code != 0:
            raise OSError(
                f"cannot copy the event files out of Pod {self.namespace}/{self.pod} (exit "
                f"{result.exit_code}: {result.stderr or 'no message'}); its image needs "
                "'sh' and 'tar'"
            )
        return untar(result.stdout, known)


def untar(data: bytes, known: Mapping[str, int]) -> tuple[dict[str, bytes], list[str]]:
    """The plain files of a tar stream whose size is not the one ``known``; links,
    devices and names that are not :func:`checked` are left out."""
    found: dict[str, bytes] = {}
    left: list[str] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                if member.isdir():
                    continue
                rel = checked(member.name)
                if rel is None or not member.isreg():
                    left.append(member.name)
                    continue
                if member.size != known.get(rel):
                    extracted = tar.extractfile(member)
                    found[rel] = extracted.read() if extracted else b""
    except tarfile.TarError as err:
        raise OSError(f"the Pod's tar stream cannot be read: {err}") from None
    return found, left


@dataclass
class ArchiveSource:
    """A run's archived ``outputs/tensorboard/...`` in the registry service (it does not
    change: each file is read once)."""

    client: RegistryClient
    namespace: str
    run: str
    where: str = "the run's archive in the registry"
    live: bool = False

    def read(self, known: Mapping[str, int]) -> tuple[dict[str, bytes], list[str]]:
        found: dict[str, bytes] = {}
        left: list[str] = []
        files = [f for f in self.client.run_files(self.namespace, self.run)]
        with tempfile.TemporaryDirectory(prefix="torchyard-tb-") as tmp:
            for path in files:
                if not path.startswith(ARCHIVE_PREFIX):
                    continue
                rel = checked(path[len(ARCHIVE_PREFIX) :])
                if rel is None:
                    left.append(path)
                    continue
                if rel in known:
                    continue
                dest = Path(tmp) / "file"
                quoted = "/".join(urllib.parse.quote(p) for p in path.split("/"))
                self.client.download_run_file(self.namespace, self.run, quoted, dest)
                found[rel] = dest.read_bytes()
        return found, left


# -- where a run's event files are ---------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it is there
        return True
    return True


def _workdirs(workroot: Path, namespace: str, run: str) -> list[tuple[Path, int]]:
    """A local run's working folders, newest first, with the pid of their ``torchyard run``."""
    pattern = re.compile(re.escape(f"{namespace}-{run}") + _WORKDIR + "$")
    found = []
    if workroot.is_dir():
        for entry in workroot.iterdir():
            match = pattern.match(entry.name)
            if match and entry.is_dir():
                found.append((entry, int(match.group(1))))
    return sorted(found, key=lambda f: f[0].stat().st_mtime, reverse=True)


def local_source(registry: Path, workroot: Path, namespace: str, run: str) -> Source:
    """A local run's event files: node 0's working folder while its ``torchyard run``
    lives, else the local registry's archive (else the newest working folder's, when
    the archive has none). :class:`RunNotFound` when there is neither."""
    workdirs = _workdirs(workroot, namespace, run)
    if workdirs and _alive(workdirs[0][1]):
        node0 = workdirs[0][0] / "node-0" / "outputs" / TENSORBOARD_DIR_NAME
        return FolderSource(node0, f"local run in {workdirs[0][0]} (running)", True)
    archived = registry / namespace / "runs" / run  # (registry.Store's layout)
    folder = archived / "outputs" / TENSORBOARD_DIR_NAME
    if folder.is_dir() or (archived.is_dir() and not workdirs):
        return FolderSource(folder, f"the local archive {archived}", False)
    if workdirs:
        node0 = workdirs[0][0] / "node-0" / "outputs" / TENSORBOARD_DIR_NAME
        return FolderSource(node0, f"local run in {workdirs[0][0]} (ended)", False)
    raise RunNotFound(
        f"no local run {namespace}/{run}: not in {workroot} and not archived in {registry}"
    )


def local_trials(registry: Path, workroot: Path, namespace: str, sweep: str) -> list[str]:
    """The trials (``<sweep>-t<i>``) of a local sweep, archived or with a working folder."""
    pattern = re.compile(re.escape(sweep) + r"-t\d+")
    found: set[str] = set()
    runs_dir = registry / namespace / "runs"
    if runs_dir.is_dir():
        found |= {e.name for e in runs_dir.iterdir() if pattern.fullmatch(e.name)}
    prefix = re.compile(re.escape(f"{namespace}-") + f"({pattern.pattern})" + _WORKDIR + "$")
    if workroot.is_dir():
        found |= {m.group(1) for e in workroot.iterdir() if (m := prefix.match(e.name))}
    return sorted(found, key=lambda n: int(n.rsplit("-t", 1)[1]))


def cluster_source(namespace: str, run: str, archive: Callable[[], RegistryClient]) -> Source:
    """A run's event files: node 0's Pod while the run runs, else its archive.
    :class:`RunNotFound` when the run is neither in the cluster nor archived."""
    body = k8s.get_or_none(k8s.TRAININGRUNS, namespace, run)
    if body is not None and (body.get("status") or {}).get("phase") not in TERMINAL:
        node0 = [
            p["metadata"]["name"]
            for p in node_pods(namespace, run)
            if p["metadata"]["labels"].get(names.LABEL_NODE_RANK) == "0" and _running(p)
        ]
        if node0:
            return PodSource(namespace, node0[0], f"node Pod {node0[0]} (running)")
        return _Waiting(f"TrainingRun {namespace}/{run} (its node 0 Pod is not running yet)")
    source = ArchiveSource(archive(), namespace, run)
    if body is None:
        try:
            source.client.run_files(namespace, run)
        except RegistryError as err:
            if err.status == 404:
                raise RunNotFound(
                    f"TrainingRun {namespace}/{run} not found, nor an archive of it"
                ) from None
            raise
    return source


def cluster_trials(namespace: str, sweep: str) -> list[str]:
    """The trials (TrainingRuns) of a Sweep in the cluster, by name."""
    runs = k8s.list_(k8s.TRAININGRUNS, namespace, label_selector=f"{wire.LABEL_SWEEP}={sweep}")
    return sorted(r["metadata"]["name"] for r in runs)


def recorded_trials(records: Records, namespace: str, sweep: str, since: str | None) -> list[str]:
    """The trials of a Sweep that the registry keeps records of, their TrainingRuns deleted
    (by their TTL) or not: those labelled with its name and created ``since`` it was (an
    earlier Sweep of the same name had its own), by name, every page read."""
    found: set[str] = set()
    token: str | None = None
    while True:
        page = records.list_records(
            namespace,
            label_selector=f"{wire.LABEL_SWEEP}={sweep}",
            since=since,
            limit=MAX_LIMIT,
            continue_token=token,
        )
        found |= {str(s.get("name")) for s in page.items if s.get("name")}
        token = page.continue_token
        if not token:
            return sorted(found)


def trial_order(names: Iterable[str]) -> list[str]:
    """Trial names (``<sweep>-t<i>``, planning.sweeps) in their index's order."""

    def index(name: str) -> tuple[int, str]:
        tail = name.rsplit("-t", 1)[-1]
        return (int(tail) if tail.isdigit() else -1, name)

    return sorted(set(names), key=index)


def _running(pod: Mapping[str, object]) -> bool:
    status = pod.get("status")
    return isinstance(status, dict) and status.get("phase") == "Running"


@dataclass
class _Waiting:
    """A run whose node 0 Pod is not running yet: nothing to read, more to come."""

    where: str
    live: bool = True

    def read(self, known: Mapping[str, int]) -> tuple[dict[str, bytes], list[str]]:
        return {}, []


# -- the folder TensorBoard reads ----------------------------------------------------------


@dataclass
class Mirror:
    """``folder``/<run>/... as the sources last showed them (sizes), and what was left out."""

    folder: Path
    sizes: dict[str, dict[str, int]] = field(default_factory=dict)
    left_out: set[str] = field(default_factory=set)

    def files(self, run: str) -> int:
        return len(self.sizes.get(run, {}))

    def sync(self, run: str, source: Source) -> list[str]:
        """Read ``source`` and write what changed under ``folder/run``; the names it
        left out that were not said before."""
        known = self.sizes.setdefault(run, {})
        found, left = source.read(known)
        root = self.folder / run
        for rel, data in sorted(found.items()):
            write(root, rel, data)
            known[rel] = len(data)
        new = [f"{run}: {name}" for name in left if f"{run}: {name}" not in self.left_out]
        self.left_out.update(new)
        return new


def write(root: Path, rel: str, data: bytes) -> None:
    """``data`` as ``root/rel``: only what is beyond the file's present end when the file
    holds its start (an event file grew), else all of it; never through a link."""
    parts = rel.split("/")
    folder = root
    root.mkdir(parents=True, exist_ok=True)
    for part in parts[:-1]:
        folder = folder / part
        if folder.is_symlink():
            raise OSError(f"{folder} is a link: no event file is written through it")
        folder.mkdir(exist_ok=True)
    path = folder / parts[-1]
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "r+b") as f:
        have = f.read()
        if len(have) <= len(data) and data[: len(have)] == have:
            f.write(data[len(have) :])
        else:
            f.seek(0)
            f.truncate()
            f.write(data)


@dataclass
class Session:
    """The runs shown (one, or a sweep's trials), where each one's event files are now
    (``resolve``, asked again every round: a run that ended is read from its archive),
    and the folder they are kept in."""

    runs: list[str]
    resolve: Callable[[str], Source]
    mirror: Mirror
    where: dict[str, str] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)  # runs read whole from a source that ended

    def step(self) -> tuple[bool, list[str]]:
        """One round: every run synced; whether any is live, and what to say (where a
        run's files come from when that changed, names left out, files copied)."""
        said: list[str] = []
        live = False
        for run in self.runs:
            if run in self.done:
                continue
            source = self.resolve(run)
            live = live or source.live
            if self.where.get(run) != source.where:
                self.where[run] = source.where
                said.append(f"{run}: event files from {source.where}")
            before = sum(self.mirror.sizes.get(run, {}).values())
            left = self.mirror.sync(run, source)
            said += [f"left out (not a plain file inside the event folder): {n}" for n in left]
            if not source.live:
                self.done.add(run)
            grown = sum(self.mirror.sizes.get(run, {}).values()) - before
            if grown:
                said.append(f"{run}: {self.mirror.files(run)} event file(s), +{grown} bytes")
        return live, said

    def check_found(self, live: bool) -> None:
        """:class:`NoEventFiles` when no run is live and none left event files."""
        if not live and not any(self.mirror.files(r) for r in self.runs):
            shown = "; ".join(f"{r}: {w}" for r, w in self.where.items())
            raise NoEventFiles(
                f"no TensorBoard event files ({shown}): a training script writes them to "
                "$TORCHYARD_TENSORBOARD_DIR (rank 0, e.g. torch.utils.tensorboard."
                "SummaryWriter(os.environ[TORCHYARD_TENSORBOARD_DIR]))"
            )


# -- the TensorBoard process ---------------------------------------------------------------


def tensorboard_command(binary: str, folder: Path, port: int, host: str) -> list[str]:
    """A real TensorBoard over ``folder``, reloading every second (a live run's new
    scalars show within seconds), with its pure-Python loader (no TensorFlow needed)."""
    return [
        binary,
        "--logdir",
        str(folder),
        "--host",
        host,
        "--port",
        str(port),
        "--reload_interval",
        "1",
        "--load_fast",
        "false",
    ]


def start_tensorboard(
    command: list[str], url: str, log: Path, timeout: float = 120
) -> subprocess.Popen[bytes]:
    """Start TensorBoard and wait until it answers at ``url`` (OSError when it ends
    first or does not answer within ``timeout`` seconds: its log's end says why)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:].strip()
            raise OSError(f"TensorBoard ended (exit {proc.returncode}): {tail}")
        try:
            with urllib.request.urlopen(f"{url}/data/runs", timeout=2):
                return proc
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    proc.terminate()
    raise OSError(f"TensorBoard did not answer at {url} within {timeout:.0f}s (log: {log})")


__all__ = [
    "ArchiveSource",
    "FolderSource",
    "Mirror",
    "NoEventFiles",
    "PodSource",
    "Session",
    "Source",
    "checked",
    "cluster_source",
    "cluster_trials",
    "local_source",
    "local_trials",
    "start_tensorboard",
    "tensorboard_command",
    "untar",
    "write",
]
