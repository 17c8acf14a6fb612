"""Local mode: run a TrainingRun on this machine with exactly the cluster's rank contract.

``torchyard run FILE.yaml --local`` calls :func:`run_local`. Each of the run's
``nodeCount`` nodes becomes one launcher process (the very launcher file an init
container copies into a cluster Pod) in its own working folder holding a copy of the
source files the caller selected (the CLI selects them as ``torchyard submit`` snapshots
a folder: ``torchyard.sdk.snapshots.collect``, with the runs folder and the registry
left out), with the variables of ``torchyard.planning.node_env`` and MASTER_ADDR
127.0.0.1 on a free port. Output streams live with a ``[rank r]`` prefix; one progress
line per node says when it starts and ends. A failing node stops the others (as the
operator deletes sibling Pods) and its termination message names the failing rank and
quotes its traceback. At the end ./outputs of node 0 and every node's ./logs are
archived into a local registry folder with the registry service's layout, and
``outputs.register`` publishes version N+1 of the model, when the path it names, resolved,
stays inside node 0's working folder (:func:`register_source`).

Tested in ``tests/unit/test_local_mode.py`` (files, register path) and ``tests/e2e/``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

import torchyard.launcher
from torchyard.api import Environment, TrainingRun
from torchyard.planning import node_env
from torchyard.registry import Store, Version
from torchyard.status.trainingruns import failure_message

LAUNCHER_FILE = Path(torchyard.launcher.__file__)


def default_registry() -> Path:
    return Path(os.environ.get("TORCHYARD_REGISTRY", "~/.torchyard/registry")).expanduser()


def default_workroot() -> Path:
    return Path(os.environ.get("TORCHYARD_LOCAL_RUNS", "~/.torchyard/runs")).expanduser()


@dataclass
class NodeResult:
    node: int
    exit_code: int
    seconds: float
    termination: dict[str, Any] = field(default_factory=dict)


@dataclass
class LocalResult:
    """What a local run did: exit code, failure, where its files went."""

    exit_code: int
    workdir: Path
    nodes: list[NodeResult]
    archive: Path | None = None
    model: Version | None = None
    failure: dict[str, Any] | None = None
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0


def register_source(node0: Path, path: str) -> Path:
    """The file or folder ``outputs.register.path`` names in node 0's working folder.

    The API refuses absolute paths and ``..``; this checks the path as the file system
    resolves it (links followed, a folder's links too), so a spec that bypassed validation
    or a link the run made cannot register a file from elsewhere on this machine."""
    root = node0.resolve()
    target = (root / path).resolve()

    def outside(resolved: Path, what: str) -> RuntimeError:
        return RuntimeError(
            f"outputs.register.path {path!r}: {what} resolves to {resolved}, outside node 0's "
            f"working folder {root}; nothing was registered. Name a file or folder the run "
            "writes, relative to its working folder (e.g. outputs/model.pt)"
        )

    if not target.is_relative_to(root):
        raise outside(target, "it")
    if target.is_dir():
        for inner in sorted(target.rglob("*")):
            if inner.is_symlink() and not inner.resolve().is_relative_to(root):
                raise outside(inner.resolve(), f"the link {inner.relative_to(root)}")
    return target


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def missing_packages(env: Environment | None) -> list[str]:
    """The Environment's pip packages that are not installed in this Python."""
    if env is None:
        return []
    missing = []
    for requirement in env.spec.pip:
        match = _REQ_NAME.match(requirement)
        if not match:
            continue
        try:
            importlib.metadata.distribution(match.group(1))
        except importlib.metadata.PackageNotFoundError:
            missing.append(requirement)
    return missing


def check_onnx(path: Path) -> str:
    """Run an exported ONNX model once on zeros; '' when fine, else what went wrong."""
    try:
        import numpy as np
        import onnxruntime as ort  # type: ignore[import-untyped]
    except ImportError:
        return ""  # nothing to check with; the file's presence was checked already
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {}
        for inp in session.get_inputs():
            shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
            dtype = np.int64 if "int64" in inp.type else np.float32
            feeds[inp.name] = np.zeros(shape, dtype=dtype)
        session.run(None, feeds)
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return ""


class LocalRun:
    """One local execution of a TrainingRun (see the module docstring)."""

    def __init__(
        self,
        run: TrainingRun,
        source: Path,
        *,
        files: Sequence[str],
        registry: Path | None = None,
        workroot: Path | None = None,
        environment: Environment | None = None,
        out: IO[str] | None = None,
        grace_seconds: int = 10,
    ) -> None:
        self.run = run
        self.source = source.resolve()
        # Relative /-separated paths under source; nothing else is copied.
        self.files = list(files)
        self.store_root = (registry or default_registry()).expanduser().resolve()
        # Absolute: the launchers run in the node folders, and their TORCHYARD_OUTPUTS
        # and TORCHYARD_LOGS are paths under it (a relative --workdir nested them).
        self.workroot = (workroot or default_workroot()).expanduser().resolve()
        self.environment = environment
        self.out = out or sys.stderr
        self.grace = grace_seconds
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.workdir = self.workroot / f"{run.namespace}-{run.name}-{stamp}-{os.getpid()}"
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def say(self, text: str) -> None:
        self.out.write(f"[torchyard] {text}\n")
        self.out.flush()

    def node_dir(self, node: int) -> Path:
        return self.workdir / f"node-{node}"

    def _check_source(self) -> None:
        """Every file to copy is a regular file (or a link to one) under the source folder."""
        if not self.source.is_dir():
            raise FileNotFoundError(f"source folder {self.source} does not exist")
        for rel in self.files:
            parts = PurePosixPath(rel).parts
            if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
                raise ValueError(f"source file {rel!r} is not a path inside {self.source}")
            if not (self.source / rel).is_file():  # a link to a file is copied as the file
                raise FileNotFoundError(f"source file {self.source / rel} is not a regular file")

    def _claim_workdir(self) -> None:
        """Create this run's folder; '-2', '-3'... when a run of the same second has it."""
        self.workroot.mkdir(parents=True, exist_ok=True)
        base, n = self.workdir, 1
        while True:
            try:
                self.workdir.mkdir()
                return
            except FileExistsError:
                n += 1
                self.workdir = base.with_name(f"{base.name}-{n}")

    def _prepare(self) -> list[str]:
        warnings = []
        missing = missing_packages(self.environment)
        if missing:
            warnings.append(
                f"Environment {self.run.spec.environment}: not installed in this Python "
                f"({sys.executable}): {', '.join(missing)}; the run may fail to import them"
            )
        for node in range(self.run.spec.distribution.node_count):
            self.node_dir(node).mkdir()
            for rel in self.files:
                target = self.node_dir(node) / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(self.source / rel, target)
        return warnings

    def _env(self, node: int, port: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            node_env(
                self.run,
                node,
                master_addr="127.0.0.1",
                master_port=port,
                workdir=str(self.node_dir(node)),
            )
        )
        env["TORCHYARD_TERMINATION_LOG"] = str(self.node_dir(node) / "termination-log.json")
        env["TORCHYARD_GRACE_PERIOD"] = str(self.grace)
        # The current interpreter's scripts (torchrun, ...) come first, as in its venv.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        return env

    def _start(self) -> None:
        port = free_port()
        for node in range(self.run.spec.distribution.node_count):
            self.procs[node] = subprocess.Popen(
                [sys.executable, str(LAUNCHER_FILE), "--", *self.run.spec.command],
                cwd=self.node_dir(node),
                env=self._env(node, port),
                start_new_session=True,
            )
            nproc = self.run.spec.distribution.process_count_per_node
            what = (
                f"{nproc} process(es)"
                if self.run.spec.distribution.launch == "process"
                else "the command once (launch: node)"
            )
            self.say(f"node {node} started: {what}, pid {self.procs[node].pid}")

    def _stop_all(self, signum: int = signal.SIGTERM) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signum)

    def _wait(self, started: float) -> list[NodeResult]:
        done: dict[int, NodeResult] = {}
        stop_deadline: float | None = None
        while len(done) < len(self.procs):
            for node, proc in self.procs.items():
                code = proc.poll()
                if code is None or node in done:
                    continue
                result = NodeResult(node, code, time.monotonic() - started, self._termination(node))
                done[node] = result
                verdict = "succeeded" if code == 0 else f"failed (exit code {code})"
                self.say(f"node {node} {verdict} after {result.seconds:.1f}s")
                if code != 0 and stop_deadline is None:
                    self.say("stopping the other nodes")
                    self._stop_all()
                    stop_deadline = time.monotonic() + self.grace + 5
            if stop_deadline is not None and time.monotonic() > stop_deadline:
                self._stop_all(signal.SIGKILL)
            time.sleep(0.05)
        return [done[n] for n in sorted(done)]

    def _termination(self, node: int) -> dict[str, Any]:
        path = self.node_dir(node) / "termination-log.json"
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return data

    def _first_failure(self, nodes: Sequence[NodeResult]) -> dict[str, Any] | None:
        failed = [n for n in nodes if n.exit_code != 0]
        if not failed:
            return None
        # The node whose failure came first; nodes stopped by us report 'Terminated'. Peers
        # of a failing rank die of it a moment later ("Connection closed by peer"): the
        # launcher's exitedAt (when its first rank failed) orders them, run time breaks ties.
        real = [n for n in failed if n.termination.get("reason") != "Terminated"] or failed
        first = min(real, key=lambda n: (_exited_at(n.termination), n.seconds))
        info = dict(first.termination)
        info["node"] = info.pop("nodeRank", first.node)
        info.setdefault("exitCode", first.exit_code)
        return info

    def _finalize(self, result: LocalResult) -> None:
        store = Store(self.store_root)
        ns, name = self.run.namespace, self.run.name
        node0 = self.node_dir(0)
        result.archive = store.archive_run(
            ns,
            name,
            outputs=node0 / "outputs",
            logs={n: self.node_dir(n) / "logs" for n in range(len(self.procs))},
        )
        self.say(f"archived outputs and logs to {result.archive}")
        reg = self.run.spec.outputs.register_
        if reg is None or not result.succeeded:
            return
        if reg.export_onnx:
            onnx = node0 / "outputs" / "model.onnx"
            if not onnx.is_file():
                raise RuntimeError(
                    "outputs.register.exportOnnx is set but the run wrote no outputs/model.onnx "
                    "(the script exports when TORCHYARD_EXPORT_ONNX=1)"
                )
            problem = check_onnx(onnx)
            if problem:
                raise RuntimeError(f"outputs/model.onnx does not run: {problem}")
            self.say("outputs/model.onnx runs (onnxruntime)")
        metrics: dict[str, float] = {}
        with contextlib.suppress(OSError, ValueError):
            raw = json.loads((node0 / "outputs" / "metrics.json").read_text())
            metrics = {k: float(v) for k, v in raw.items() if isinstance(v, int | float)}
        dist = self.run.spec.distribution
        result.model = store.publish(
            ns,
            reg.model,
            register_source(node0, reg.path),
            metadata={
                "run": {
                    "name": name,
                    "namespace": ns,
                    "uid": str(self.run.metadata.get("uid", "")),
                },
                "command": list(self.run.spec.command),
                "nodeCount": dist.node_count,
                "processCountPerNode": dist.process_count_per_node,
                "environment": self.run.spec.environment,
                "environmentImage": (
                    self.environment.spec.image if self.environment is not None else None
                ),
                "metrics": metrics,
                "mode": "local",
            },
        )
        self.say(
            f"registered model {reg.model} version {result.model.version} "
            f"({result.model.manifest['size']}) at {result.model.path}"
        )

    def execute(self) -> LocalResult:
        dist = self.run.spec.distribution
        self._check_source()
        self._claim_workdir()
        self.say(
            f"TrainingRun {self.run.namespace}/{self.run.name}: {dist.node_count} node(s) x "
            f"{dist.process_count_per_node} process(es) = world size {dist.world_size}, "
            f"launch: {dist.launch}, locally in {self.workdir}"
        )
        started = time.monotonic()
        warnings = self._prepare()
        for warning in warnings:
            self.say(f"warning: {warning}")
        try:
            self._start()
            nodes = self._wait(started)
        except KeyboardInterrupt:
            self.say("interrupted: stopping every node")
            self._stop_all()
            for proc in self.procs.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(self.grace + 5)
            self._stop_all(signal.SIGKILL)
            raise
        failure = self._first_failure(nodes)
        exit_code = 0 if failure is None else int(failure.get("exitCode") or 1)
        result = LocalResult(exit_code, self.workdir, nodes, failure=failure, warnings=warnings)
        try:
            self._finalize(result)
        except (OSError, RuntimeError) as err:
            self.say(f"finalizing failed: {err}")
            result.exit_code = result.exit_code or 1
            result.failure = result.failure or {"reason": "FinalizeFailed", "message": str(err)}
        result.seconds = time.monotonic() - started
        return result


def _exited_at(termination: dict[str, Any]) -> float:
    """The launcher's ``exitedAt`` (Unix time) as a number; unknown or bad: infinity."""
    try:
        value = float(termination.get("exitedAt", math.inf))
    except (TypeError, ValueError):
        return math.inf
    return value if math.isfinite(value) else math.inf


def describe_failure(failure: dict[str, Any]) -> str:
    """'rank 3 (node 1) failed (Error, exit code 1):' followed by the whole traceback."""
    return failure_message(failure, full=True)


def run_local(run: TrainingRun, source: Path, files: Sequence[str], **options: Any) -> LocalResult:
    """Run ``run`` on this machine with ``files`` of ``source`` in every node's folder
    (see :class:`LocalRun` for the options)."""
    return LocalRun(run, source, files=files, **options).execute()


__all__ = [
    "LocalResult",
    "LocalRun",
    "NodeResult",
    "describe_failure",
    "register_source",
    "run_local",
]
