#!/usr/bin/env bash
# test-gpu.sh - the GPU tests: CUDA vs CPU op parity, end-to-end parity on the tiny models,
# VMM hand-back/regrow, compute-sanitizer, and (bench) bandwidth and decode timings.
#
# How a run is done: the device machine (a lent H200) has nvcc but none of our Debian
# packages, so the test binary is built HERE and carried:
#   scripts/test-gpu.sh build          # here: make build/test-gpu (nvcc -arch=sm_90, static cudart;
#                                      #   the binary needs only libc, libm, libstdc++)
#   then, through the device tool's run verb, with carry ["build/test-gpu"]:
#   scripts/test-gpu.sh device         # there: tests, benchmarks, sanitizer; logs under $OUT
# On a machine without a GPU (CI), `make gpu-tests` builds and runs the same binary, which
# prints every test as SKIPPED with the reason and exits 0.
set -u -o pipefail
cd "$(dirname "$0")/.."
BIN=build/test-gpu
OUT=${OUT:-/tmp/tide-gpu-out}
mkdir -p "$OUT"

case "${1:-device}" in
build)
    make -j"$(nproc)" "$BIN"
    ls -l "$BIN"
    ;;
device)
    [ -x "$BIN" ] || { echo "no $BIN: run 'scripts/test-gpu.sh build' here and carry it"; exit 2; }
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
    rc=0
    echo "== tests"
    timeout 300 "$BIN" 2>&1 | tee "$OUT/tests.log" || rc=1
    echo "== benchmarks"
    timeout 300 "$BIN" --bench --only bench 2>&1 | tee "$OUT/bench.log" || rc=1
    if command -v compute-sanitizer >/dev/null; then
        echo "== compute-sanitizer memcheck (short run)"
        # (attention also runs paged_attention: --only matches names that contain it)
        for t in matmul_q8_0 matmul_f16 matmul_mmq matmul_q4_K matmul_q6_K _kq moe_prefill attention attention_chunk paged_rows batch_paged_moe e2e_qwen3moe vision_encode; do
            TIDE_TEST_QUICK=1 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$BIN" --only "$t" 2>&1 |
                grep -E "PASS|FAIL|ERROR SUMMARY|Invalid|error" | tee -a "$OUT/sanitizer.log"
            [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
        done
    fi
    exit $rc
    ;;
*)
    echo "usage: $0 build|device"; exit 2 ;;
esac
