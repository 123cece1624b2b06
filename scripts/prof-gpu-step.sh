#!/usr/bin/env bash
# prof-gpu-step.sh - where a batched decode step's time goes on the GPU (issue 20), on the served
# shape: test-gpu's bench_batch on LAYERS (default 4) layers of the Qwen3-30B-A3B preset (q8_0,
# every expert resident, each sequence at position 512), B sequences a step, timed plainly and
# then under Nsight Compute (one metric, gpu__time_duration.sum, one pass a kernel), summed per
# kernel by scripts/ncu-summary.py. The served step is 48 such layers plus the head.
#
#   here:  CARRY=.dev-lead/gb BUILD=build/cuda scripts/bench-gpu-llama.sh build
#   there (device tool, carry [".dev-lead"]):  CARRY=.dev-lead/gb OUT=$OUT scripts/prof-gpu-step.sh
# Env: BS (default "8 32"), LAYERS. Output: $OUT/prof-B<B>.txt (timings and the kernel table),
# $OUT/ncu-B<B>.log (ncu's own report).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tide-prof-step}
C=${CARRY:-build/gpu-bench}
T=${TEST_GPU:-$C/test-gpu}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$C/gpu-libs
export TIDE_BENCH_BATCH_PRESET=qwen3-30b-a3b TIDE_BENCH_BATCH_LAYERS=${LAYERS:-4}
for B in ${BS:-8 32}; do
    P=$OUT/prof-B$B.txt
    TIDE_BENCH_BATCH_B=$B timeout 120 "$T" --bench --only bench_batch 2>&1 | grep -E 'bench_batch' | tee "$P"
    TIDE_BENCH_BATCH_B=$B timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum \
        --print-summary per-kernel "$T" --bench --only bench_batch >"$OUT/ncu-B$B.log" 2>&1
    echo "ncu rc=$?" | tee -a "$P"
    python3 scripts/ncu-summary.py "$OUT/ncu-B$B.log" 25 | tee -a "$P"
done
