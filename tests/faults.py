"""Faults that break a distributed PyTorch run, as training scripts: one rank (the victim)
stuck in Python, in C with or without the GIL, on a lock, skipping a collective, deaf to
SIGTERM, or leaving early with status 0, in a DDP model (its peers wait inside
``loss.backward()``) or around an explicit ``all_reduce``. Used by
benchmarks/why_matrix.py (local mode) and tests/node/test_culprits_on_node.py (the real
node); the scripts need torch (gloo) and torchyard.progress. :func:`stalling`, rank 1
stuck at step 3 of a loop with no torch (the launcher's stall tests, local and on the
real node), needs only torchyard.progress."""

from __future__ import annotations

STEPS, AT = 40, 10

FAULTS = {
    "python": "while True:\n    pass",
    "gil": "while True:\n    ctypes.PyDLL(None).sleep(3600)",
    "nogil": "while True:\n    ctypes.CDLL(None).sleep(3600)",
    "lock": "held = threading.Lock()\nheld.acquire()\nheld.acquire()",
    "skip": "continue",
    "sigterm": "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(3600)",
    "exit0": "sys.exit(0)",
}
SHAPES = ("ddp", "allreduce", "torchrun")

HEAD = """\
import ctypes, os, signal, sys, threading, time
from datetime import timedelta
import torch
import torch.distributed as dist
from torchyard import progress
dist.init_process_group("gloo", timeout=timedelta(seconds=600))
rank = dist.get_rank()
torch.manual_seed(0)
"""
DDP = """\
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randn(32, 1)


def work():
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""
ALLREDUCE = """\
t = torch.ones(1024)


def work():
    dist.all_reduce(t)
"""


def script(fault: str, shape: str, victim: int) -> str:
    """The training script with ``fault`` on rank ``victim`` at step AT (``torchrun``: the
    DDP script, started by torchrun)."""
    stuck = "\n".join("        " + line for line in FAULTS[fault].splitlines())
    return (
        HEAD
        + (ALLREDUCE if shape == "allreduce" else DDP)
        + f"\nfor step in range(1, {STEPS + 1}):\n"
        + f"    if rank == {victim} and step == {AT}:\n{stuck}\n"
        + "    work()\n"
        + f"    progress.report(step, total={STEPS})\n"
        + "    time.sleep(0.1)\n"
        + "dist.barrier()\n"
    )


def stalling(stuck: str, pause: float) -> str:
    """A script whose rank 1 reports steps 1 to 3, every ``pause`` seconds, then runs
    ``stuck`` (a line: a sleep, a blocking C call), at line 7, while the others go on."""
    return (
        "import os, signal, time\n"
        "from torchyard import progress\n"
        "rank = int(os.environ['RANK'])\n"
        "for step in range(1, 100000):\n"
        "    progress.report(step)\n"
        "    if rank == 1 and step == 3:\n"
        f"        {stuck}\n"
        f"    time.sleep({pause})\n"
    )
