"""NCCL through the rank contract: all_reduce and broadcast agree; with two ranks or more,
a timed all_reduce. A world of one rank moves nothing between GPUs, so it is a smoke check
of the rank contract and NCCL's setup only: no time or bandwidth is printed for it."""

import os
import time

import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.full((64 << 20,), float(rank + 1), device="cuda")  # 256 MiB of float32
dist.all_reduce(x)
expected = world * (world + 1) / 2
assert torch.all(x == expected).item(), "all_reduce disagrees"
y = torch.full((1024,), float(rank), device="cuda")
dist.broadcast(y, src=0)
assert torch.all(y == 0).item(), "broadcast disagrees"
where = f"nccl {torch.cuda.nccl.version()} rank {rank}/{world} on {torch.cuda.get_device_name()}"
if world == 1:
    print(f"{where}: all_reduce and broadcast agree (one-rank smoke check, no bandwidth)")
else:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / 20
    # nccl-tests' bus bandwidth: what each link carries in a ring all_reduce.
    bus = x.numel() * x.element_size() / seconds * 2 * (world - 1) / world
    print(
        f"{where}: all_reduce of 256 MiB over {world} ranks {seconds * 1e3:.2f} ms "
        f"(bus bandwidth {bus / 1e9:.1f} GB/s)",
        flush=True,
    )
dist.destroy_process_group()
