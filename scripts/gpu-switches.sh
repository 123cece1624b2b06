#!/usr/bin/env bash
# gpu-switches.sh - the GPU runs of the CUDA paths written without a GPU, each behind a switch
# (docs/CONFIG.md, "TIDE_ switches"; the thirteenth session's H100 run turned them all on by
# default, so "off" below means each =0). One device call a phase, each
# under the 600 s a call may take:
#   tests  every new test-gpu test (the switched paths against the CPU backend), and the whole
#          e2e / batch parity suites again with every switch on (~5 min)
#   bench  the switched kernels' benchmarks against the paths they would replace (~6 min)
#   serve  the daemon through HTTP at 1 / 8 / 32 clients with the switches off, then on
#          (Qwen3-30B-A3B-shaped q8_0 file; bench-serve.sh)
#   vision the Qwen3-VL-30B-A3B-shaped pair's cold / warm / cached image with TIDE_VISION_TC off,
#          =1, and =f16 with TIDE_F16_MMA=1 (bench-vision-gpu.sh)
#   q4km   the Q4_K_M file's prefill and decode with TIDE_KQ_MMA off and on (bench-gpu-llama.sh)
#
#   here:  CARRY=.dev-lead/gb BUILD=build/cuda LLAMA=/nonexistent scripts/bench-gpu-llama.sh build
#          (then strip the binaries: the carry limit is 64 MiB)
#   there: CARRY=.dev-lead/gb OUT=$OUT scripts/gpu-switches.sh tests    (device tool, carry [".dev-lead/gb"])
# Output: $OUT/<phase>.txt (the lines that matter), $OUT/<phase>-raw/ (everything).
# The switches (ALL_ON / ALL_OFF name them with =1 / =0) and what each turns on:
#   TIDE_CUDA_PAGED=1      paged KV cache on CUDA (attention_paged, the decode rows' paged ops), and
#                          gpt-oss's sink attention over f16 and paged caches
#   TIDE_KQ_MMA=1          q4_K / q5_K / q6_K prefill products and grouped MoE on int8 tensor cores
#   TIDE_VISION_TC=1|f16   the Qwen-VL towers' products in q8_0 / f16 and tensor-core attention
#   TIDE_F16_MMA=1         f16 / bf16 products of n >= 64 on the big-tile mma.sync kernel
#   TIDE_MOE_ROWS_MMA=1    a batched decode step's MoE on the grouped int8 tensor-core tiles
#   TIDE_DECODE_ATTN_SPLIT=1, TIDE_DECODE_QONCE=1, TIDE_MOE_ROUTE_ONCE=1   one stream's decode kernels
set -u -o pipefail
cd "$(dirname "$0")/.."
PHASE=${1:-tests}
OUT=${OUT:-/tmp/tide-gpu-switches}
C=${CARRY:-build/gpu-bench}
T=${TEST_GPU:-$C/test-gpu}
R=$OUT/$PHASE-raw
S=$OUT/$PHASE.txt
mkdir -p "$R"
export LD_LIBRARY_PATH=$PWD/$C/gpu-libs
ALL_ON=${ALL_ON:-"TIDE_CUDA_PAGED=1 TIDE_KQ_MMA=1 TIDE_F16_MMA=1 TIDE_MOE_ROWS_MMA=1 TIDE_DECODE_ATTN_SPLIT=1 TIDE_DECODE_QONCE=1 TIDE_MOE_ROUTE_ONCE=1"}
ALL_OFF=${ALL_OFF:-$(echo "$ALL_ON" | sed 's/=[0-9a-z]*/=0/g')}
t0=$(date +%s)
since() { echo $(( $(date +%s) - t0 )); }
log() { echo "$*" | tee -a "$S"; }
# one test-gpu run: label, time limit (s), environment ("" for none), test-gpu's arguments
tg() {
    local label=$1 lim=$2 envs=$3
    shift 3
    local f="$R/$label.txt"
    env $envs timeout "$lim" "$T" "$@" >"$f" 2>&1
    local rc=$?
    log "-- $label (${envs:-defaults}; $*): rc $rc at $(since) s"
    grep -E '^(PASS|FAIL)|bench_|OK:|FAILED' "$f" | cut -c1-220 | tee -a "$S"
}
log "== gpu-switches $PHASE $(date -u +%FT%TZ) $(git log -1 --format=%h 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee -a "$S"

case $PHASE in
tests)
    # each path's own tests (they turn their switch on themselves where they need it)
    tg paged 90 "" --only paged
    tg sinks 60 "" --only attention_sinks
    tg kqmma 120 "" --only kqmma
    tg moe_prefill 60 "" --only moe_prefill
    tg moe_rows_mma 120 "" --only moe_rows_mma
    tg f16_mma 90 "" --only f16_mma
    tg vision_tc 120 "" --only _tc
    tg decode 90 "" --only decode_
    # the ninth session's two batch tests under their new limits
    tg batch_gptoss_ds2 60 "" --only batch_gptoss
    tg batch_deepseek2 60 "" --only batch_deepseek2
    # the parity suites again with every switch on (each reads its switch once, at start-up)
    tg batch_all_on 120 "$ALL_ON" --only batch_
    tg rows_all_on 60 "$ALL_ON" --only rows
    tg e2e_all_on 150 "$ALL_ON" --only e2e_
    ;;
bench)
    tg bench_moe_rows 120 "" --bench --only bench_moe_rows
    tg bench_decode_opts 90 "" --bench --only bench_decode_opts
    tg bench_kqmma 90 "" --bench --only bench_kqmma
    tg bench_f16_mma 90 "" --bench --only bench_f16_mma
    tg bench_qwenvl 120 "TIDE_F16_MMA=1" --bench --only bench_qwenvl
    for B in 8 32; do
        tg bench_batch_B$B 60 "TIDE_BENCH_BATCH_PRESET=qwen3-30b-a3b TIDE_BENCH_BATCH_LAYERS=4 TIDE_BENCH_BATCH_B=$B" \
            --bench --only bench_batch
        tg bench_batch_B${B}_on 60 "$ALL_ON TIDE_BENCH_BATCH_PRESET=qwen3-30b-a3b TIDE_BENCH_BATCH_LAYERS=4 TIDE_BENCH_BATCH_B=$B" \
            --bench --only bench_batch
    done
    ;;
serve)
    on=$(echo "$ALL_ON" | tr ' ' '+') off=$(echo "$ALL_OFF" | tr ' ' '+')
    KEEP_MODEL=1 SKIP_TESTS=1 CLIENTS=${CLIENTS:-"1 8 32"} CARRY=$C OUT=$R VARIANTS="off:$off on:$on" \
        timeout 560 bash scripts/bench-serve.sh 2>&1 | grep -E 'label|steps|written|kept|--' | cut -c1-330 | tee -a "$S"
    ;;
vision)
    mkdir -p build && cp -a "$C/tide" "$C/tide-mkmodel" "$C/gpu-libs" build/ # bench-vision-gpu.sh runs build/'s
    for v in 0 1 f16; do
        TIDE_VISION_TC=$v TIDE_F16_MMA=1 CARRY=$C OUT=$R/tc-$v timeout 180 bash scripts/bench-vision-gpu.sh qwen3vl 2>&1 |
            grep -E 'cold|warm|cached|encode|FAIL' | sed "s/^/TIDE_VISION_TC=$v: /" | cut -c1-260 | tee -a "$S"
    done
    ;;
q4km)
    for v in 0 1; do
        TIDE_KQ_MMA=$v KEEP_MODEL=1 MIX=Q4_K_M CARRY=$C OUT=$R/kq-$v LLAMA=/nonexistent timeout 270 \
            bash scripts/bench-gpu-llama.sh device 2>&1 | grep -E 'tide (prefill|decode)|model:|FAIL' |
            sed "s/^/TIDE_KQ_MMA=$v: /" | cut -c1-250 | tee -a "$S"
    done
    ;;
*)
    echo "usage: gpu-switches.sh tests|bench|serve|vision|q4km" >&2
    exit 2
    ;;
esac
log "== done at $(since) s"
