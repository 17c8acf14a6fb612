"""Fit y = 3x + 2 with plain SGD, in the standard library only: the smallest run that shows
what local mode does around a script, in seconds and without torch.

Every rank fits its own copy from the same seed (so they agree) and reports its loss at
each step (``torchyard.progress``: the progress line, ``metrics.jsonl``, a sweep's
objective). With the TrainingRun's spec.checkpoints it saves its state every
``interval`` steps (``torchyard.checkpoint``) and resumes from the newest complete
checkpoint (TORCHYARD_RESUME_FROM); rank 0 writes outputs/model.json. Used by
examples/linefit/trainingrun.yaml and sweep.yaml, and by docs/getting-started/local.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

try:  # shipped with the launcher into every node Pod, and installed in local mode
    from torchyard import checkpoint, progress
except ImportError:  # run by hand, outside torchyard
    checkpoint = progress = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--step_seconds", type=float, default=0.0, help="pause after each step")
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    weight, bias, start = 0.0, 0.0, 0
    resume = os.environ.get("TORCHYARD_RESUME_FROM")
    if resume:
        state = json.loads((Path(resume) / f"rank-{rank}.json").read_text())
        weight, bias, start = state["weight"], state["bias"], state["step"]
        print(f"rank {rank} resumed from step {start}", flush=True)
    loss = None
    for step in range(start, args.steps):
        rng = random.Random(step)  # the same data at a step, whether resumed or not
        xs = [rng.random() for _ in range(32)]
        errors = [weight * x + bias - (3 * x + 2) for x in xs]
        loss = sum(e * e for e in errors) / len(xs)
        weight -= args.lr * 2 * sum(e * x for e, x in zip(errors, xs, strict=True)) / len(xs)
        bias -= args.lr * 2 * sum(errors) / len(xs)
        if progress is not None:
            progress.report(step + 1, total=args.steps, loss=loss)
        if checkpoint is not None and checkpoint.should_save(step + 1):
            folder = Path(checkpoint.save_dir(step + 1))
            state = {"weight": weight, "bias": bias, "step": step + 1}
            (folder / f"rank-{rank}.json").write_text(json.dumps(state))
            checkpoint.done(step + 1)
        time.sleep(args.step_seconds)
    shown = "-" if loss is None else f"{loss:.4f}"  # (resumed at the last step: none)
    print(f"rank {rank}: loss {shown} weight {weight:.3f} bias {bias:.3f}", flush=True)
    if rank == 0:
        out = Path(os.environ.get("TORCHYARD_OUTPUTS", "outputs"))
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.json").write_text(json.dumps({"weight": weight, "bias": bias}))


if __name__ == "__main__":
    main()
