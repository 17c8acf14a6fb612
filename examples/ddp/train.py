"""A minimal DistributedDataParallel run that shows the rank contract.

Every process prints the variables torchyard sets (``rank-contract {...}``), then the
ranks fit y = 3x + 2 together with DDP (gloo on CPU). ``--fail_rank N`` makes rank N
raise, to see how torchyard reports a failing rank. Used by examples/ddp (launch:
process, torchyard starts every rank) and examples/torchrun (launch: node, torchrun
starts them), and by the e2e tests.

With the TrainingRun's spec.checkpoints, every rank saves its state through
``torchyard.checkpoint`` (every ``interval`` steps, and once more when its Pod is being
stopped) and a restarted gang continues from the newest complete checkpoint
(TORCHYARD_RESUME_FROM); without it, nothing is saved.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

try:  # shipped with the launcher into every node Pod, and installed in local mode
    from torchyard import checkpoint
except ImportError:  # run by hand, outside torchyard: no checkpoints
    checkpoint = None
from torch import nn
from torch.nn.parallel import DistributedDataParallel

CONTRACT = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "TORCHYARD_OUTPUTS",
    "TORCHYARD_LOGS",
)


def say(line: str) -> None:
    """One line in one write: under torchrun a node's workers share one stdout, and with
    PYTHONUNBUFFERED (the launcher sets it) ``print`` writes the text and its newline
    separately, so two workers' lines could run together."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--fail_rank", type=int, default=-1, help="make this rank raise")
    parser.add_argument("--output_dir", default="./outputs")
    args = parser.parse_args()

    say("rank-contract " + json.dumps({k: os.environ.get(k) for k in CONTRACT}))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    start = 0
    resume = os.environ.get("TORCHYARD_RESUME_FROM")
    if resume:  # every rank's own state: the model, the optimizer and its data stream
        # This run's own file (older torch's weights_only loader refuses optimizer state).
        state = torch.load(Path(resume) / f"rank-{rank}.pt", weights_only=False)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        start = int(state["step"])
        say(f"rank {rank} resumed from step {start}")
    loss = None  # this attempt's last loss (none when it resumed at the last step)
    for step in range(start, args.steps):
        if step == 5:
            say(f"first training step done on rank {rank}")
        x = torch.rand(32, 1, generator=gen)
        loss = nn.functional.mse_loss(model(x), 3 * x + 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == args.fail_rank and step == 10:
            raise RuntimeError(f"rank {rank} failed on purpose: loss became NaN at step {step}")
        if checkpoint is not None and checkpoint.should_save(step + 1):
            state = {
                "model": model.module.state_dict(),
                "optimizer": opt.state_dict(),
                "generator": gen.get_state(),
                "step": step + 1,
            }
            torch.save(state, Path(checkpoint.save_dir(step + 1)) / f"rank-{rank}.pt")
            checkpoint.done(step + 1)
    weight, bias = (float(p.detach()) for p in model.module.parameters())
    if loss is None:  # resumed from the last step's checkpoint: nothing was left to train
        say(f"rank {rank} had nothing left to train (resumed at step {start} of {args.steps})")
    shown = "-" if loss is None else f"{loss.item():.4f}"
    say(f"rank {rank}/{world}: loss {shown} weight {weight:.3f} bias {bias:.3f}")
    if rank == 0:
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        torch.save(model.module.state_dict(), out / "model.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
