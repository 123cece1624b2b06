#!/usr/bin/env bash
# bench-vision-gpu.sh - the vision encoder on the GPU (issue 6): op and encoder parity with the
# CPU (test-gpu vision_ops, vision_encode), a LLaVA-1.5-sized encoder timed (bench_vision),
# compute-sanitizer on the encoder, a cold image request phase by phase with the GPU encoder
# and with the CPU encoder (bench-vision-gpu.py), and the daemon's GPU checks
# (test-gpu-daemon.sh: hand-back, greedy parity, the lazy-vision cycle).
#
#   scripts/bench-vision-gpu.sh build   # here: tide, tide-mkmodel, test-gpu (nvcc, static
#                                       #   cudart), their Debian .so files and these scripts into $CARRY
#   then through the device tool, carry ["$CARRY"] (a git-ignored folder of the checkout):
#   bash $CARRY/bench-vision-gpu.sh device   # there; summary.txt and logs under $OUT
#
#   bash $CARRY/bench-vision-gpu.sh qwen3vl  # there (issue 25): the Qwen3-VL-30B-A3B-shaped q8_0
#     pair written by tide-mkmodel (text preset qwen3-vl-30b-a3b, ~32 GB; tower mmproj-qwen3vl-30b,
#     27 blocks of 1152, deepstack after 8/16/24), tide on the GPU with a lazy encoder, then a
#     1024x768 image: ROUNDS cold requests (hand-back, encoder load, encode, prefill, first
#     token), one warm, one cached; the table in $OUT/summary.txt and $OUT/table-qwen3vl.md.
#     BACKEND=cpu runs it here on a CPU device with the small pair (presets
#     qwen3vlmoe and mmproj-qwen3vl, IMAGE=256x192 unless set) to check the script; MODEL_DIR
#     (default /dev/shm when it has room, else $OUT) holds the pair, ROUNDS (3) the cold rounds.
#     TIDE_VISION_TC=1 (or =f16) in the environment: the encoder on the tensor cores (docs/VISION.md).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tide-vision-gpu}
mkdir -p "$OUT"

case "${1:-device}" in
build)
    C=${CARRY:?set CARRY to the folder to fill}
    make -j"$(nproc)" build/tide build/tide-mkmodel build/test-gpu || exit 1
    rm -rf "$C" && mkdir -p "$C/gpu-libs"
    cp build/tide build/tide-mkmodel build/test-gpu scripts/bench-vision-gpu.sh scripts/bench-vision-gpu.py \
        scripts/test-gpu-daemon.sh "$C/"
    ldd build/tide | awk '$3 ~ /^\// {print $3}' | grep -vE '/(libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux)' |
        xargs -I{} cp -L {} "$C/gpu-libs/"
    du -sh "$C"
    ;;
device)
    # run from the carry folder: its binaries go where the scripts look for them (build/)
    C=$(basename "$(dirname "$(readlink -f "$0")")")
    mkdir -p build scripts
    cp -a "$C/tide" "$C/tide-mkmodel" "$C/test-gpu" "$C/gpu-libs" build/
    cp "$C/bench-vision-gpu.py" "$C/test-gpu-daemon.sh" scripts/
    export LD_LIBRARY_PATH=$PWD/build/gpu-libs
    S=$OUT/summary.txt
    rc=0
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$S"
    echo "== test-gpu vision_ops, vision_encode" | tee -a "$S"
    timeout 90 build/test-gpu --only vision_ 2>&1 | tee "$OUT/tests.log" | grep -vE "^SKIPPED" | tee -a "$S" || rc=1
    echo "== bench_vision" | tee -a "$S"
    timeout 120 build/test-gpu --bench --only bench_vision 2>&1 | grep -vE "^SKIPPED" | tee -a "$S" || rc=1
    if command -v compute-sanitizer >/dev/null; then
        echo "== compute-sanitizer memcheck vision_encode" | tee -a "$S"
        timeout 60 compute-sanitizer --tool memcheck --error-exitcode 3 build/test-gpu --only "vision_encode" 2>&1 |
            grep -E "PASS|FAIL|ERROR SUMMARY|Invalid" | tee -a "$S"
        [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    fi
    echo "== cold image request by phase" | tee -a "$S"
    timeout 60 python3 scripts/bench-vision-gpu.py gpu-encoder "$OUT" 3 || rc=1
    TIDE_VISION_CPU=1 timeout 60 python3 scripts/bench-vision-gpu.py cpu-encoder "$OUT" 3 || rc=1
    echo "== test-gpu-daemon.sh" | tee -a "$S"
    OUT=$OUT/daemon timeout 100 bash scripts/test-gpu-daemon.sh device >/dev/null 2>&1 || rc=1
    cat "$OUT/daemon/summary.txt" >>"$S" 2>/dev/null
    echo "exit $rc" | tee -a "$S"
    exit $rc
    ;;
qwen3vl)
    if [ -d "$(dirname "$(readlink -f "$0")")/gpu-libs" ]; then # run from the carry folder, as device
        C=$(basename "$(dirname "$(readlink -f "$0")")")
        mkdir -p build scripts
        cp -a "$C/tide" "$C/tide-mkmodel" "$C/gpu-libs" build/
        cp "$C/bench-vision-gpu.py" scripts/
        export LD_LIBRARY_PATH=$PWD/build/gpu-libs
    fi
    S=$OUT/summary.txt
    BACKEND=${BACKEND:-cuda}
    ROUNDS=${ROUNDS:-3}
    D=${MODEL_DIR:-}
    if [ -z "$D" ]; then
        D=$OUT
        [ "$BACKEND" != cpu ] && [ "$(df --output=avail -k /dev/shm 2>/dev/null | tail -1)" -gt 40000000 ] 2>/dev/null &&
            D=/dev/shm/tide-bench-qwen3vl
    fi
    mkdir -p "$D"
    echo "== bench-vision-gpu qwen3vl $(date -u +%FT%TZ), BACKEND=$BACKEND, pair in $D" | tee -a "$S"
    t0=$(date +%s.%N)
    if [ "$BACKEND" = cpu ]; then
        IMAGE=${IMAGE:-256x192}
        build/tide-mkmodel --preset qwen3vlmoe --out "$D/text.gguf" | tee -a "$S" &&
            build/tide-mkmodel --preset mmproj-qwen3vl --out "$D/mmproj.gguf" | tee -a "$S" || exit 1
    else
        IMAGE=${IMAGE:-1024x768}
        build/tide-mkmodel --preset qwen3-vl-30b-a3b --type q8_0 --out "$D/text.gguf" | tee -a "$S" &&
            build/tide-mkmodel --preset mmproj-qwen3vl-30b --type q8_0 --out "$D/mmproj.gguf" | tee -a "$S" || exit 1
    fi
    echo "pair written in $(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $t0}") s" | tee -a "$S"
    BENCH_MODEL=$D/text.gguf BENCH_MMPROJ=$D/mmproj.gguf BENCH_IMAGE=$IMAGE BENCH_CACHED=1 BENCH_BACKEND=$BACKEND \
        timeout 1200 python3 scripts/bench-vision-gpu.py qwen3vl "$OUT" "$ROUNDS"
    rc=$?
    [ -z "${MODEL_DIR:-}" ] && rm -rf "$D/text.gguf" "$D/mmproj.gguf"
    echo "exit $rc" | tee -a "$S"
    exit $rc
    ;;
*)
    echo "usage: $0 build|device|qwen3vl"; exit 2 ;;
esac
