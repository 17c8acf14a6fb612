"""The workload of benchmarks/launch_overhead.py: DDP (gloo) on a small MLP.

Prints ``first-step <unix time>`` after its first optimizer step and ``done <unix time>``
at the end, so the benchmark can tell launch overhead from training time. Runs the same
under torchyard's launcher and under torchrun.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 64), torch.randn(64, 1)
    for step in range(args.steps):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 0:
            print(f"first-step {time.time():.6f}", flush=True)
    print(f"done {time.time():.6f}", flush=True)
    # every rank leaves together: gloo can abort a process ("terminate called without an
    # active exception") that tears its group down while a peer's connection still closes
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
