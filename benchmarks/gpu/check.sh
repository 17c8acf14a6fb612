#!/usr/bin/env bash
# The GPU check, run on a machine with one NVIDIA GPU, PyTorch and torchyard's dependencies:
#   1. the birds example trained on CUDA in local mode (torchyard run --local), then the same
#      run with CUDA hidden as the CPU baseline;
#   2. NCCL through torchyard's rank contract (all_reduce/broadcast agree, one timing);
#   3. a CUDA out-of-memory run (OOM_RUNS times, default 1): torchyard must fail it naming the
#      rank and the OOM traceback, classified CudaOOM with advice.
# Usage: benchmarks/gpu/check.sh [TORCHYARD_COMMAND...]  (default: python3 -m torchyard)
# Prints each step's wall time. Nothing in the test suite depends on it.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
ty=("$@"); [ ${#ty[@]} -gt 0 ] || ty=(python3 -m torchyard)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
export TORCHYARD_REGISTRY="$work/registry"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
step() { local name=$1; shift; local t0=$EPOCHREALTIME; "$@"; local rc=$?; echo "[gpu-check] $name: exit $rc in $(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t0}") s"; return $rc; }
status=0
step birds-cuda "${ty[@]}" run "$here/birds-cuda.yaml" --local --source "$repo/examples/birds" --workdir "$work/runs" || status=1
CUDA_VISIBLE_DEVICES= step birds-cpu-baseline "${ty[@]}" run "$here/birds-cuda.yaml" --local --source "$repo/examples/birds" --workdir "$work/runs" || status=1
ls -la "$work/registry"/*/models/birds-cuda/1 2>/dev/null
step nccl "${ty[@]}" run "$here/nccl-check.yaml" --name nccl-check --local --source "$here" --workdir "$work/runs" || status=1
# OOM_RUNS (default 1) times: each must fail naming the OOM traceback, classified CudaOOM
oom_runs=${OOM_RUNS:-1}; oom_named=0
for i in $(seq 1 "$oom_runs"); do
  if step cuda-oom "${ty[@]}" run "$here/nccl-check.yaml" --name cuda-oom --local --source "$here" --workdir "$work/runs" > "$work/oom.txt" 2>&1; then
    echo "[gpu-check] cuda-oom $i: the run should have failed"; status=1
  fi
  [ "$i" -eq 1 ] && cat "$work/oom.txt"
  if grep -q "OutOfMemoryError\|CUDA out of memory" "$work/oom.txt" && grep -q "^class: CudaOOM (not retryable)" "$work/oom.txt"; then
    oom_named=$((oom_named + 1))
  else
    echo "[gpu-check] cuda-oom $i: not reported as CudaOOM with its traceback:"; tail -20 "$work/oom.txt"
  fi
done
echo "[gpu-check] cuda-oom: traceback reported and classified CudaOOM with advice in $oom_named of $oom_runs runs"
[ "$oom_named" -eq "$oom_runs" ] || status=1
exit $status
