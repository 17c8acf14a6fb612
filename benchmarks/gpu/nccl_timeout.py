"""A real NCCL watchdog timeout on one GPU (benchmarks/gpu/check.sh): a world of size 1
whose ``all_reduce`` is queued behind a kernel that spins for about a minute, while
init_process_group's timeout is 10 s. The work cannot finish in time, so NCCL's watchdog
reports "Watchdog caught collective operation timeout" and ends the process; torchyard
must classify the failure CollectiveTimeout."""

import datetime
import os

import torch
import torch.distributed as dist

SLEEP_SECONDS = 60

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=10))
t = torch.ones(1, device="cuda")
dist.all_reduce(t)  # the communicator is set up and works
torch.cuda.synchronize()
# cycles of the SM clock for about a minute (clock_rate is in kHz where torch reports it)
khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 0) or 2_000_000
cycles = int(khz * 1000 * SLEEP_SECONDS)
print(f"rank {dist.get_rank()}: spinning {cycles} cycles, then all_reduce", flush=True)
torch.cuda._sleep(cycles)  # on the current stream: the all_reduce below waits for it
dist.all_reduce(t)
torch.cuda.synchronize()
print("unreachable: the all_reduce finished before the watchdog's 10 s", flush=True)
