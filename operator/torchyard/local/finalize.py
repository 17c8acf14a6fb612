"""The end of a local run, as the operator's Finalizing phase: node 0's ./outputs and
every node's ./logs archived into the local registry folder (the registry service's
layout), then ``outputs.register`` published as the model's next version with the
metadata every registration uses (``planning.models.promote_metadata``), after the path
is checked to stay inside node 0's folder and an exported ONNX model is run once; and the
run's record (``torchyard.records``) written beside its archive. Called
by ``local.runs.LocalRun``; tested in tests/unit/local/test_mode.py and tests/e2e/.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from torchyard import records
from torchyard.api import Environment, TrainingRun, wire
from torchyard.api.trainingruns import ModelOutput
from torchyard.launch.contract import PROGRESS_TEXT
from torchyard.local.checks import check_onnx, register_source
from torchyard.local.results import LocalResult, NodeResult
from torchyard.planning import models as model_plans
from torchyard.records import build
from torchyard.registry import Store, Version
from torchyard.status import failures


def archive_and_register(
    run: TrainingRun,
    environment: Environment | None,
    store: Store,
    nodes: Sequence[Path],
    result: LocalResult,
    say: Callable[[str], None],
) -> None:
    """Archive the run's folders (``nodes``: each node's working folder), then register
    its model when it succeeded. OSError or RuntimeError say what went wrong."""
    node0 = nodes[0]
    result.archive = store.archive_run(
        run.namespace,
        run.name,
        outputs=node0 / "outputs",
        logs={n: folder / "logs" for n, folder in enumerate(nodes)},
    )
    say(f"archived outputs and logs to {result.archive}")
    reg = run.spec.outputs.register_
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
        say("outputs/model.onnx runs (onnxruntime)")
    result.model = publish(run, environment, store, node0, reg, say)


def publish(
    run: TrainingRun,
    environment: Environment | None,
    store: Store,
    node0: Path,
    reg: ModelOutput,
    say: Callable[[str], None],
) -> Version:
    """Publish ``reg.path`` of ``run``'s node 0 folder as ``reg.model``'s next version,
    with the metadata every registration has and the metrics of its outputs/metrics.json
    (a local run's ``outputs.register``, a local sweep's ``registerBest``)."""
    metrics: dict[str, float] = {}
    with contextlib.suppress(OSError, ValueError):
        raw = json.loads((node0 / "outputs" / "metrics.json").read_text())
        metrics = {k: float(v) for k, v in raw.items() if isinstance(v, int | float)}
    image = (environment.spec.image if environment is not None else None) or ""
    model = store.publish(
        run.namespace,
        reg.model,
        register_source(node0, reg.path),
        metadata=model_plans.promote_metadata(run, image=image, metrics=metrics, local=True),
    )
    say(
        f"registered model {reg.model} version {model.version} "
        f"({model.manifest['size']}) at {model.path}"
    )
    return model


def record(
    run: TrainingRun,
    result: LocalResult,
    nodes: Sequence[Path],
    store_root: Path,
    started: datetime,
    say: Callable[[str], None],
    uid: str = "",
) -> Path:
    """The run's record (``torchyard.records``) in the local registry, as the operator
    writes it for a run in a cluster, with the metric reports of its archive (``uid``:
    this execution's, else the run's own or a new one)."""
    now = datetime.now(timezone.utc)
    status: dict[str, Any] = {
        "phase": "Succeeded" if result.succeeded else "Failed",
        "startTime": build.timestamp(started),
        "completionTime": build.timestamp(now),
        "failure": failures.public_failure(result.failure) if result.failure else None,
        "progress": result.progress,
    }
    if result.model is not None:
        status["model"] = {"name": result.model.model, "version": result.model.version}
    body = {
        "kind": "TrainingRun",
        "metadata": {
            **run.metadata,
            "namespace": run.namespace,  # "default" when the YAML names none, as the archive
            "uid": uid or str(run.metadata.get("uid") or uuid.uuid4()),
            "creationTimestamp": build.timestamp(started),
        },
        "spec": run.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
        "status": {k: v for k, v in status.items() if v is not None},
    }
    pods = [_node_pod(run.name, n) for n in result.nodes]
    tails = {n.node: _tail(nodes[n.node] / "logs") for n in result.nodes if n.node < len(nodes)}
    made = records.trainingrun_record(body, pods, [], tails, now)
    reason = (result.failure or {}).get("reason")
    if reason == INTERRUPTED and made.get("attempts"):
        made["attempts"][-1]["outcome"] = INTERRUPTED  # stopped, not failed of itself
    folder = records.FolderRecords(store_root).write(made, result.archive)
    say(f"recorded the run in {folder}")
    return folder


def record_model(store_root: Path, run: TrainingRun, uid: str, model: Version) -> None:
    """The record of run ``run`` (this ``uid``) names ``model``, which was registered from
    it after it ended (a local sweep's ``registerBest``), as ``status.model`` would."""
    folder = records.FolderRecords(store_root)
    found = folder.get_record(run.namespace, run.name, uid)
    if found is None:
        return
    ref = {"name": model.model, "version": model.version}
    found["model"] = ref  # type: ignore[typeddict-item]
    found["status"] = {**(found.get("status") or {}), "model": ref}
    folder.write(found, Store(store_root).run_dir(run.namespace, run.name))


# The failure reason of a local run that Ctrl-C (or SIGTERM, SIGHUP) stopped.
INTERRUPTED = "Interrupted"


def _node_pod(run: str, node: NodeResult) -> dict[str, Any]:
    """A node as the record's builder reads a node Pod: its rank, phase and exit."""
    ended = {
        "exitCode": node.exit_code,
        "reason": node.termination.get("reason"),
        "startedAt": build.timestamp(node.started_at) if node.started_at else None,
        "finishedAt": build.timestamp(node.finished_at) if node.finished_at else None,
    }
    return {
        "metadata": {
            "name": f"{run}-{node.node}",
            "labels": {wire.LABEL_NODE_RANK: str(node.node)},
        },
        "spec": {"nodeName": "localhost"},
        "status": {
            "phase": "Succeeded" if node.exit_code == 0 else "Failed",
            "containerStatuses": [{"name": "trainer", "state": {"terminated": ended}}],
        },
    }


def _tail(logs: Path) -> list[str]:
    """The last lines of a node's rank logs (``logs/rank-*.txt``), rank by rank, without
    the ranks' progress lines (``@@torchyard {...}``: what the progress line showed)."""
    lines: list[str] = []
    for path in sorted(logs.glob("rank-*.txt")):
        with contextlib.suppress(OSError):
            rank = path.stem.replace("-", " ")
            text = path.read_text(errors="replace").splitlines()
            lines += [f"[{rank}] {line}" for line in text if not line.startswith(PROGRESS_TEXT)]
    return lines[-build.TAIL_LINES :]


__all__: list[str] = []  # used by local.runs and local.sweeps only
