"""The end of a local run, as the operator's Finalizing phase: node 0's ./outputs and
every node's ./logs archived into the local registry folder (the registry service's
layout), then ``outputs.register`` published as the model's next version with the
metadata every registration uses (``planning.models.promote_metadata``), after the path
is checked to stay inside node 0's folder and an exported ONNX model is run once. Called
by ``local.runs.LocalRun``; tested in tests/unit/test_local_mode.py and tests/e2e/.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from torchyard.api import Environment, TrainingRun
from torchyard.api.trainingruns import ModelOutput
from torchyard.local.checks import check_onnx, register_source
from torchyard.local.results import LocalResult
from torchyard.planning import models
from torchyard.registry import Store, Version


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
        metadata=models.promote_metadata(run, image=image, metrics=metrics, local=True),
    )
    say(
        f"registered model {reg.model} version {model.version} "
        f"({model.manifest['size']}) at {model.path}"
    )
    return model


__all__: list[str] = []  # used by local.runs and local.sweeps only
