"""A minimal DistributedDataParallel run that shows the rank contract.

Every process prints the variables torchyard sets (``rank-contract {...}``), then the
ranks fit y = 3x + 2 together with DDP (gloo on CPU). ``--fail_rank N`` makes rank N
raise, to see how torchyard reports a failing rank. Used by examples/ddp (launch:
process, torchyard starts every rank) and examples/torchrun (launch: node, torchrun
starts them), and by the e2e tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
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
    for step in range(args.steps):
        if step == 5:
            say(f"first training step done on rank {rank}")
        x = torch.rand(32, 1, generator=gen)
        loss = nn.functional.mse_loss(model(x), 3 * x + 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == args.fail_rank and step == 10:
            raise RuntimeError(f"rank {rank} failed on purpose: loss became NaN at step {step}")
    weight, bias = (float(p.detach()) for p in model.module.parameters())
    say(f"rank {rank}/{world}: loss {loss.item():.4f} weight {weight:.3f} bias {bias:.3f}")
    if rank == 0:
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        torch.save(model.module.state_dict(), out / "model.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
