#!/usr/bin/env bash
# The GPU check, run on a machine with one NVIDIA GPU, PyTorch and torchyard's dependencies:
#   1. the birds example trained on CUDA in local mode (torchyard run --local), then the same
#      run with CUDA hidden as the CPU baseline;
#   2. NCCL through torchyard's rank contract (all_reduce/broadcast agree; on one GPU a
#      one-rank smoke check, so no time or bandwidth is printed);
#   3. a CUDA out-of-memory run (OOM_RUNS times, default 1): torchyard must fail it naming the
#      rank and the OOM traceback, classified CudaOOM with advice;
#   4. a real NCCL watchdog timeout (TIMEOUT_RUNS times, default 1; nccl_timeout.py: a world of
#      size 1 whose all_reduce waits behind a ~60 s kernel, with a 10 s timeout): torchyard
#      must fail it quoting "Watchdog caught collective operation timeout", classified
#      CollectiveTimeout (retryable) with advice.
# Usage: [CHECKS="birds nccl cuda-oom collective-timeout"] benchmarks/gpu/check.sh
#        [TORCHYARD_COMMAND...]  (default: python3 -m torchyard; CHECKS picks the steps)
# Without a CUDA GPU visible to torch, every step is skipped with a message (exit 0).
# Prints each step's wall time, and writes the figures (each step's wall time and exit, each
# failing check's count) to benchmarks/results/gpu_check.json (RESULTS=FILE elsewhere,
# RESULTS=- nowhere) through benchmarks/record.py. Nothing in the test suite depends on it.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
ty=("$@"); [ ${#ty[@]} -gt 0 ] || ty=(python3 -m torchyard)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
started=$(date -u +%Y-%m-%dT%H:%M:%S+00:00); load_start=$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' ,)
figures="$work/figures.tsv"; : > "$figures"
export TORCHYARD_REGISTRY="$work/registry"
checks=" ${CHECKS:-birds nccl cuda-oom collective-timeout} "
wanted() { [[ "$checks" == *" $1 "* ]]; }
if ! python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  for name in $checks; do
    echo "[gpu-check] $name: skipped: no CUDA GPU here (python3 cannot import torch, or torch.cuda.is_available() is False)"
  done
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
versions=$(python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())')
echo "$versions"
step() {
  local name=$1; shift; local t0=$EPOCHREALTIME; "$@"; local rc=$?
  local took; took=$(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t0}")
  echo "[gpu-check] $name: exit $rc in $took s"
  printf '%s: wall time (exit %s)\t%s\ts\n' "$name" "$rc" "$took" >> "$figures"
  return $rc
}
status=0
if wanted birds; then
step birds-cuda "${ty[@]}" run "$here/birds-cuda.yaml" --local --source "$repo/examples/birds" --workdir "$work/runs" || status=1
CUDA_VISIBLE_DEVICES= step birds-cpu-baseline "${ty[@]}" run "$here/birds-cuda.yaml" --local --source "$repo/examples/birds" --workdir "$work/runs" || status=1
ls -la "$work/registry"/*/models/birds-cuda/1 2>/dev/null
fi
if wanted nccl; then
step nccl "${ty[@]}" run "$here/nccl-check.yaml" --name nccl-check --local --source "$here" --workdir "$work/runs" || status=1
fi
# failing NAME RUNS EVIDENCE CLASS: run the check NAME (a run that must fail) RUNS times;
# each must quote EVIDENCE and print the line "class: CLASS"
failing() {
  local name=$1 runs=$2 evidence=$3 klass=$4 named=0 i
  wanted "$name" || runs=0
  for i in $(seq 1 "$runs"); do
    if step "$name" timeout 300 "${ty[@]}" run "$here/nccl-check.yaml" --name "$name" --local --source "$here" --workdir "$work/runs" > "$work/$name.txt" 2>&1; then
      echo "[gpu-check] $name $i: the run should have failed"; status=1
    fi
    [ "$i" -eq 1 ] && cat "$work/$name.txt"
    if grep -q "$evidence" "$work/$name.txt" && grep -q "^class: $klass" "$work/$name.txt"; then
      named=$((named + 1))
    else
      echo "[gpu-check] $name $i: not reported as $klass quoting '$evidence':"; tail -20 "$work/$name.txt"
    fi
  done
  [ "$runs" -eq 0 ] || echo "[gpu-check] $name: reported with its evidence and classified $klass with advice in $named of $runs runs"
  [ "$runs" -eq 0 ] || printf '%s: reported quoting its evidence, classified %s\t%s/%s\t\tall\t%s\n' \
    "$name" "$klass" "$named" "$runs" "$([ "$named" -eq "$runs" ] && echo 1 || echo 0)" >> "$figures"
  [ "$named" -eq "$runs" ] || status=1
}
# OOM_RUNS (default 1) times: each must fail naming the OOM traceback, classified CudaOOM
failing cuda-oom "${OOM_RUNS:-1}" "OutOfMemoryError\|CUDA out of memory" "CudaOOM (not retryable)"
# TIMEOUT_RUNS (default 1) times: NCCL's watchdog must fire and the run be classified
# CollectiveTimeout (retryable), quoting the watchdog's line
failing collective-timeout "${TIMEOUT_RUNS:-1}" "Watchdog caught collective operation timeout" "CollectiveTimeout (retryable)"
if [ "${RESULTS:-}" != "-" ]; then
  python3 "$repo/benchmarks/record.py" gpu_check "$figures" --started "$started" --load-start "$load_start" \
    --command "CHECKS=\"$(echo $checks)\" OOM_RUNS=${OOM_RUNS:-1} TIMEOUT_RUNS=${TIMEOUT_RUNS:-1} bash benchmarks/gpu/check.sh" \
    --note "$versions" ${RESULTS:+--results "$RESULTS"} || status=1
fi
exit $status
