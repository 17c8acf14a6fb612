"""Following TrainingRuns from a laptop: state, per-node Pods, logs, the outcome.

What ``torchyard wait``/``logs``/``get``/``describe`` (``torchyard.cli.follow``,
``torchyard.cli.inspect``) and the SDK's ``Run.wait_for_completion(show_output=True)``
share. Reads go through ``torchyard.k8s``; logs come from the apiserver (``pods/log``,
from the node's kubelet) while the Pods exist, else from the run's archive in the
registry service: node by node, every node whose live log did not deliver (the kubelet
unreachable, the Pod gone, the run over before its stream answered) gets its archived
log. Tested in ``tests/unit/sdk/test_azureml_wait.py`` (a run that ends within one poll)
and ``tests/integration/test_cli.py``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol, TextIO

from torchyard import k8s
from torchyard.api.times import parse_time
from torchyard.launch.contract import PROGRESS_TEXT
from torchyard.planning import names
from torchyard.sdk.registry import RegistryClient, RegistryError
from torchyard.status.failures import failure_message

TERMINAL = ("Succeeded", "Failed")
# How long, once the run has ended, the live log streams may take to finish (their
# containers have ended, so a working stream ends at once) before their nodes' archived
# logs are read instead.
LOG_GRACE_SECONDS = 10.0


class RunNotFound(Exception):
    pass


def get(namespace: str, name: str) -> dict[str, Any]:
    run = k8s.get_or_none(k8s.TRAININGRUNS, namespace, name)
    if run is None:
        raise RunNotFound(f"TrainingRun {namespace}/{name} not found")
    return run


def node_count(run: dict[str, Any]) -> int:
    """How many node Pods the run has (``spec.distribution.nodeCount``, default 1)."""
    dist = (run.get("spec") or {}).get("distribution") or {}
    return int(dist.get("nodeCount") or 1)


def node_rank(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["labels"][names.LABEL_NODE_RANK])


def node_pods(namespace: str, name: str) -> list[dict[str, Any]]:
    """The run's node Pods, by node rank (the current attempt's when several exist)."""
    pods = k8s.list_(k8s.PODS, namespace, label_selector=f"{names.LABEL_RUN}={name}")
    by_rank: dict[int, dict[str, Any]] = {}
    for pod in pods:
        labels = pod["metadata"].get("labels", {})
        if names.LABEL_NODE_RANK not in labels:
            continue
        rank = int(labels[names.LABEL_NODE_RANK])
        if rank not in by_rank or _created(pod) > _created(by_rank[rank]):
            by_rank[rank] = pod
    return [by_rank[r] for r in sorted(by_rank)]


def _created(obj: dict[str, Any]) -> str:
    return str(obj["metadata"].get("creationTimestamp", ""))


def pod_state(pod: dict[str, Any]) -> str:
    """Pending / Gated / Running / Succeeded / Failed (exit N) / Terminating."""
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    if pod["spec"].get("schedulingGates"):
        return "Gated"
    phase = pod.get("status", {}).get("phase", "Pending")
    if phase == "Failed":
        for cs in pod.get("status", {}).get("containerStatuses", []):
            term = cs.get("state", {}).get("terminated")
            if term:
                return f"Failed (exit {term.get('exitCode')})"
    return str(phase)


def elapsed(run: dict[str, Any], now: datetime | None = None) -> float:
    """Seconds since the run was created (until it finished)."""
    st = run.get("status", {})
    start = parse_time(run["metadata"].get("creationTimestamp"))
    end = parse_time(st.get("completionTime")) or now or datetime.now(timezone.utc)
    return max(0.0, (end - start).total_seconds()) if start else 0.0


def duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def failure_text(run: dict[str, Any]) -> str:
    """The failing rank, its Pod, its exit, and its traceback (status.failure), in the
    wording of the run's conditions (``status.failures.failure_message``)."""
    failure = run.get("status", {}).get("failure") or {}
    if not failure:
        conds = run.get("status", {}).get("conditions", [])
        failed = [c for c in conds if c.get("type") in ("Failed", "Ready") and c.get("message")]
        return failed[-1]["message"] if failed else "no failure details"
    return failure_message(failure, full=True, pod=True)


def summary_line(run: dict[str, Any], pods: list[dict[str, Any]]) -> str:
    st = run.get("status", {})
    nodes = ", ".join(f"node {i}: {pod_state(p)}" for i, p in enumerate(pods)) or "no Pods yet"
    shown = progress_text(st.get("progress"), bar=True)
    return f"[{duration(elapsed(run))}] {st.get('phase', 'Pending')}  ({nodes})" + (
        f"  {shown}" if shown else ""
    )


def progress_text(progress: Any, *, bar: bool = False, width: int = 20) -> str:
    """``status.progress`` in a few characters: ``[#####...] 120/3000 4% ETA 4m10s``
    (``bar``), else ``120/3000 4%``; "" when there is none."""
    if not isinstance(progress, dict) or not isinstance(progress.get("step"), int):
        return ""
    step, total = progress["step"], progress.get("total")
    if not isinstance(total, int) or total < 1:
        return f"step {step}"
    fraction = min(step / total, 1.0)
    text = f"{step}/{total} {int(fraction * 100)}%"
    if bar:
        text = f"[{'#' * int(fraction * width):.<{width}}] {text}"
        if progress.get("eta"):
            text += f" ETA {progress['eta']}"
    return text


def restarts_text(status: Any) -> str:
    """A run's restarts in a few words: ``1 gang, 3 in place (4 of backoffLimit used)``,
    ``0`` for none."""
    if not isinstance(status, dict):
        return "0"
    gang, in_place = int(status.get("restarts") or 0), int(status.get("inPlaceRestarts") or 0)
    if not in_place:
        return str(gang)
    failed = int(status.get("failedAttempts") or 0)
    return f"{gang} gang, {in_place} in place ({failed} of backoffLimit used)"


@dataclass
class NodeStream:
    """One node Pod's live log stream, as the follower saw it."""

    pod: str
    lines: int = 0
    error: str | None = None
    done: bool = False


class LogFollower:
    """One thread per node Pod, streaming its log with a ``[node n]`` prefix (the
    launcher already prefixes each line with ``[rank r]``). :meth:`finish` joins them and
    says which nodes' live logs did not deliver."""

    def __init__(self, namespace: str, out: TextIO) -> None:
        self.namespace = namespace
        self.out = out
        self.lock = threading.Lock()
        self.streams: dict[str, NodeStream] = {}
        self.latest: dict[int, str] = {}  # node -> its current attempt's Pod
        self.threads: dict[str, threading.Thread] = {}
        self.muted = False

    def follow(self, pod: dict[str, Any], node: int) -> None:
        name = pod["metadata"]["name"]
        with self.lock:
            self.latest[node] = name
            if name in self.streams:
                return
            self.streams[name] = NodeStream(name)
        thread = threading.Thread(target=self._stream, args=(name, node), daemon=True)
        self.threads[name] = thread
        thread.start()

    def _stream(self, pod: str, node: int) -> None:
        stream = self.streams[pod]
        try:
            for line in k8s.pod_log_lines(self.namespace, pod, container="trainer", follow=True):
                with self.lock:
                    if self.muted:
                        return
                    self.out.write(f"[node {node}] {line}\n")
                    self.out.flush()
                    stream.lines += 1
        except (k8s.ApiError, k8s.Unreachable, OSError) as err:
            reason = err.message if isinstance(err, k8s.ApiError) else str(err)
            with self.lock:
                stream.error = (reason.splitlines() or [type(err).__name__])[0][:200]
        finally:
            with self.lock:
                stream.done = True

    def finish(self, nodes: int, grace: float = LOG_GRACE_SECONDS) -> dict[int, str]:
        """Wait (at most ``grace`` seconds) for the streams to end, then stop printing;
        {node: why} for each of ``nodes`` whose live log did not deliver."""
        deadline = time.monotonic() + grace
        for thread in list(self.threads.values()):
            thread.join(max(0.0, deadline - time.monotonic()))
        missing: dict[int, str] = {}
        with self.lock:
            self.muted = True
            for node in range(nodes):
                pod = self.latest.get(node)
                stream = self.streams.get(pod) if pod else None
                if stream is None:
                    missing[node] = "its Pod was not seen running"
                elif stream.error:
                    missing[node] = stream.error
                elif not stream.done:
                    missing[node] = f"no end of the stream within {grace:g}s"
                elif not stream.lines:
                    missing[node] = "the live log was empty"
        return missing


def wait(
    namespace: str,
    name: str,
    *,
    show_output: bool = True,
    out: TextIO | None = None,
    poll: float = 1.0,
    timeout: float | None = None,
    on_change: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None = None,
    registry: Callable[[], RegistryClient] | None = None,
    log_grace: float = LOG_GRACE_SECONDS,
) -> dict[str, Any]:
    """Until the run Succeeds or Fails: a line whenever its phase or a node's state
    changes, and (``show_output``) every node's log: live while the Pods run; for every
    node whose live log did not deliver (the kubelet unreachable, the Pod already gone,
    the run over before the stream answered: joined for ``log_grace`` seconds) the
    archive in the registry service."""
    out = out or sys.stdout
    follower = LogFollower(namespace, out) if show_output else None
    deadline = time.monotonic() + timeout if timeout else None
    # On a terminal the current line is redrawn every poll (its clock running) until the
    # state changes; elsewhere (CI logs, pipes) a line per change.
    live = bool(getattr(out, "isatty", lambda: False)())
    last, drawn = "", False
    while True:
        run = get(namespace, name)
        pods = node_pods(namespace, name)
        line = summary_line(run, pods) + _waiting_on(run)
        state = line.split("] ", 1)[1]
        phase = run.get("status", {}).get("phase")
        with follower.lock if follower else contextlib.nullcontext():
            if state != last:
                out.write(("\n" if drawn else "") + f"TrainingRun {name}: {line}")
                drawn = live and phase not in ("Running", *TERMINAL)
                if not drawn:
                    out.write("\n")
            elif drawn:
                out.write(f"\rTrainingRun {name}: {line}")
            out.flush()
        if state != last:
            last = state
            if on_change:
                on_change(run, pods)
        if follower:
            for pod in pods:
                if pod.get("status", {}).get("phase") in ("Running", "Succeeded", "Failed"):
                    follower.follow(pod, node_rank(pod))
        if phase in TERMINAL:
            break
        if deadline and time.monotonic() > deadline:
            raise TimeoutError(f"TrainingRun {name} did not finish within {timeout:.0f}s")
        time.sleep(poll)
    if follower:
        # The run may end within one poll: the streams just started have not yet said
        # whether they deliver. Join them first, then read the archive for the others.
        missing = follower.finish(node_count(run), log_grace)
        if missing:
            out.write(fallback_note(missing) + "\n")
            write_archived(out, registry, namespace, name, set(missing))
    return run


def fallback_note(missing: dict[int, str]) -> str:
    why = "; ".join(f"node {n}: {reason}" for n, reason in sorted(missing.items()))
    return f"(live logs were not available: {why}; the archived logs follow)"


def write_archived(
    out: TextIO,
    registry: Callable[[], RegistryClient] | None,
    namespace: str,
    name: str,
    nodes: Collection[int],
) -> int:
    """The archived logs of ``nodes``, each line to ``out``; how many lines, and a note
    for every node the archive has nothing of."""
    shown: dict[int, int] = dict.fromkeys(nodes, 0)
    try:
        if registry is None:
            raise RegistryError("no registry client")
        for node, line in archived_log_lines(registry(), namespace, name, nodes):
            out.write(line + "\n")
            shown[node] += 1
    except (RegistryError, k8s.ApiError, k8s.Unreachable, OSError) as err:
        # (no registry, no token for it, or it refused: said, never a crash)
        why = err.message if isinstance(err, k8s.ApiError) else str(err)
        out.write(f"(nor the archived logs: {why}; try: torchyard logs {name})\n")
        return sum(shown.values())
    for node in sorted(n for n, count in shown.items() if not count):
        out.write(f"(node {node}: no archived log either)\n")
    return sum(shown.values())


class RunFiles(Protocol):
    """What reads a run's archive: the registry service's client, the local registry."""

    def run_files(self, namespace: str, run: str) -> list[str]: ...

    def read_run_file(self, namespace: str, run: str, path: str, uid: str | None = None) -> str: ...


def archived_logs(
    client: RunFiles, namespace: str, name: str, nodes: Collection[int] | None = None
) -> Iterator[str]:
    """Every archived log line (of ``nodes``, default all), prefixed ``[node n] [rank r]``
    (node by node)."""
    for _node, line in archived_log_lines(client, namespace, name, nodes):
        yield line


def archived_log_lines(
    client: RunFiles, namespace: str, name: str, nodes: Collection[int] | None = None
) -> Iterator[tuple[int, str]]:
    """(node, line) for every archived log line of ``nodes`` (default all)."""
    for path in client.run_files(namespace, name):
        parts = path.split("/")  # logs/node-N/rank-R.txt
        if len(parts) != 3 or parts[0] != "logs" or not parts[1].startswith("node-"):
            continue
        try:
            node = int(parts[1].removeprefix("node-"))
        except ValueError:
            continue
        if nodes is not None and node not in nodes:
            continue
        prefix = f"[node {node}] [{parts[2].removesuffix('.txt').replace('-', ' ')}]"
        for line in client.read_run_file(namespace, name, path).splitlines():
            if not line.startswith(PROGRESS_TEXT):  # a rank's progress report, not output
                yield node, f"{prefix} {line}"


def logs(
    namespace: str,
    name: str,
    *,
    out: TextIO,
    notes: TextIO,
    node: int | None = None,
    rank: int | None = None,
    follow: bool = False,
    registry: Callable[[], RegistryClient] | None = None,
) -> int:
    """A run's logs to ``out``, node by node, each line ``[node n] [rank r] ...`` (only
    ``node``'s, only ``rank``'s when given): live from the node's Pod; for every node whose
    live log did not deliver (the kubelet unreachable, the Pod gone, an empty log) and, with
    no run and no Pods, for every archived node, from the archive in the registry service.
    Why a live log was unavailable goes to ``notes``. How many lines were shown."""
    run = k8s.get_or_none(k8s.TRAININGRUNS, namespace, name)
    pods = {node_rank(p): p for p in node_pods(namespace, name)}
    nodes = set(pods) | set(range(node_count(run) if run else 0))
    if node is not None:
        nodes = {node}
    shown, missing = 0, set()
    for n in sorted(nodes):
        live = 0
        if n in pods:
            pod = pods[n]["metadata"]["name"]
            try:
                for line in k8s.pod_log_lines(namespace, pod, container="trainer", follow=follow):
                    live += 1  # the node delivered, whichever ranks are shown
                    if rank is None or line.startswith(f"[rank {rank}]"):
                        out.write(f"[node {n}] {line}\n")
                        shown += 1
            except k8s.ApiError as err:
                notes.write(f"(node {n}: live log unavailable: {err.message[:200]})\n")
        if not live:
            missing.add(n)
    if missing or not nodes:
        if registry is None:
            raise RegistryError("no registry client for the archived logs")
        wanted = sorted(missing) if nodes else None
        for line in archived_logs(registry(), namespace, name, wanted):
            if rank is None or f"[rank {rank}] " in line:
                out.write(line + "\n")
                shown += 1
    return shown


def events(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The Events about the run, oldest first."""
    meta = run["metadata"]
    return k8s.events_of(meta["namespace"], meta["name"], meta.get("uid"))


def _waiting_on(run: dict[str, Any]) -> str:
    """While the run waits for its Environment: what that Environment is doing."""
    if run.get("status", {}).get("phase") not in (None, "Pending", "Preparing"):
        return ""
    env_name = run.get("spec", {}).get("environment", "")
    env = k8s.get_or_none(k8s.ENVIRONMENTS, run["metadata"]["namespace"], env_name)
    if env is None:
        return f"; environment {env_name} not found"
    return f"; environment {env_name}: {env.get('status', {}).get('phase', 'Pending')}"


def outcome(run: dict[str, Any]) -> tuple[int, str]:
    """(exit code, the closing text) of a finished run."""
    st = run.get("status", {})
    took = duration(elapsed(run))
    name = run["metadata"]["name"]
    if st.get("phase") == "Succeeded":
        text = f"TrainingRun {name} succeeded in {took}"
        if st.get("model"):
            text += f"; model {st['model'].get('name')} version {st['model'].get('version')}"
        return 0, text
    return 1, f"TrainingRun {name} failed after {took}: {failure_text(run)}"
