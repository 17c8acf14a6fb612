"""Asks the GPU for twice its memory: torchyard must report this rank's CUDA OOM traceback."""

import torch

free, total = torch.cuda.mem_get_info()
print(f"GPU memory: {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB", flush=True)
blocks = [torch.empty(total // 4, dtype=torch.uint8, device="cuda") for _ in range(8)]
print("unreachable", len(blocks))
