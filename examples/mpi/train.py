"""mpi4py + PyTorch on generated data: torchyard's tested MPI path (distribution.type: mpi).

Every rank prints its MPI rank and world size as mpirun set them (``mpi-rank {...}``),
checks that an all-reduce of rank+1 over all ranks gives size*(size+1)/2, then the ranks
fit y = 3x + 2 together, averaging their gradients with MPI all-reduces; rank 0 writes
outputs/model.pt and outputs/metrics.json. Every rank reports its step and loss with
``torchyard.progress`` (status.progress). ``--fail_rank N`` makes rank N raise, to see
how torchyard names a failing MPI rank. ``--no_torch`` stops after the MPI checks (for a
Python that has mpi4py but no PyTorch, as the e2e test's Debian python3).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from mpi4py import MPI

try:  # shipped with the launcher into every node Pod: progress into status.progress
    from torchyard import progress
except ImportError:  # run by hand, outside torchyard
    progress = None


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def train(comm: MPI.Comm, steps: int, outputs: Path) -> None:
    import torch
    from torch import nn

    rank, size = comm.Get_rank(), comm.Get_size()
    torch.manual_seed(0)  # the same initial model on every rank
    model = nn.Linear(1, 1)
    generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    x = torch.rand(256, 1, generator=generator)
    y = 3 * x + 2 + 0.01 * torch.randn(256, 1, generator=generator)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = torch.tensor(0.0)
    first = None
    for step in range(1, steps + 1):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        for param in model.parameters():  # average the gradients over all ranks
            assert param.grad is not None
            flat = param.grad.reshape(-1)
            for i in range(flat.numel()):
                flat[i] = comm.allreduce(float(flat[i]), op=MPI.SUM) / size
        optimizer.step()
        first = float(loss) if first is None else first
        if progress is not None:  # every rank reports; mpirun gathers them on node 0
            progress.report(step, total=steps, loss=float(loss))
    weight, bias = float(model.weight.reshape(-1)[0]), float(model.bias.reshape(-1)[0])
    every = comm.allgather((round(weight, 6), round(bias, 6)))
    if len(set(every)) != 1:
        raise RuntimeError(f"ranks diverged: {every}")
    say(f"trained rank {rank} weight {weight:.4f} bias {bias:.4f} loss {float(loss):.6f}")
    if rank == 0:
        outputs.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), outputs / "model.pt")
        metrics = {"world_size": size, "first_loss": first, "loss": float(loss)}
        metrics.update(weight=weight, bias=bias)
        (outputs / "metrics.json").write_text(json.dumps(metrics))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--fail_rank", type=int, default=-1, help="make this rank raise")
    parser.add_argument("--no_torch", action="store_true", help="only the MPI checks")
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    seen = {
        "rank": rank,
        "size": size,
        "OMPI_COMM_WORLD_RANK": os.environ.get("OMPI_COMM_WORLD_RANK"),
        "OMPI_COMM_WORLD_SIZE": os.environ.get("OMPI_COMM_WORLD_SIZE"),
        "OMPI_COMM_WORLD_LOCAL_RANK": os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK"),
        "NODE_RANK": os.environ.get("NODE_RANK"),
        "MASTER_ADDR": os.environ.get("MASTER_ADDR"),
        "TORCHYARD_OUTPUTS": os.environ.get("TORCHYARD_OUTPUTS"),
    }
    say("mpi-rank " + json.dumps(seen, sort_keys=True))
    total = comm.allreduce(rank + 1, op=MPI.SUM)
    if total != size * (size + 1) // 2:
        raise RuntimeError(f"all-reduce gave {total}, not {size * (size + 1) // 2}")
    say(f"allreduce rank {rank} of {size}: {total}")
    if rank == args.fail_rank:
        raise RuntimeError(f"rank {rank} failed on purpose")
    if not args.no_torch:
        train(comm, args.steps, Path(os.environ.get("TORCHYARD_OUTPUTS", "outputs")))


if __name__ == "__main__":
    main()
