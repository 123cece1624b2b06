#!/usr/bin/env bash
# bench-serve-peer.sh - tide and llama-server through HTTP on one H200 in ONE device call, with
# llama.cpp's default CUDA build made in that same call (its binaries are too big to carry back).
#
#   here:  CARRY=.dev-lead/gb BUILD=build/cuda scripts/bench-gpu-llama.sh build
#          git -C <llama.cpp git dir> archive HEAD -- . ':!models' ':!docs' ':!tests' ':!media' \
#              ':!gguf-py' ':!tools/server/public*' ':!tools/server/webui' | xz > .dev-lead/llama-src.tar.xz
#   there (device tool, carry [".dev-lead"]): CARRY=.dev-lead/gb OUT=$OUT scripts/bench-serve-peer.sh
# While llama.cpp builds on cores 4-15 (cmake defaults: GGML_CUDA on, flash attention compiled
# in, native arch), the GPU side runs on cores 0-3: test-gpu's whole suite (unless SKIP_TESTS),
# then scripts/bench-serve.sh for tide; after the build, the same runs for llama-server
# (-np = the most clients, its default -fa) and llama-bench -p 512 -n 128 (default -fa).
# Output: $OUT/tests.log, $OUT/llbuild.log, $OUT/serve/* (summary.txt has every line).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tide-bench-peer}
C=${CARRY:-.dev-lead/gb}
SRC=${LLAMA_SRC:-.dev-lead/llama-src.tar.xz}
LL=/tmp/llama-peer
mkdir -p "$OUT" "$LL"
export LD_LIBRARY_PATH=$PWD/$C/gpu-libs
t_start=$(date +%s)
since() { echo $(( $(date +%s) - t_start )); }

build_llama() {
    tar xJf "$SRC" -C "$LL" &&
        cmake -S "$LL" -B "$LL/build" -DGGML_CUDA=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF &&
        cmake --build "$LL/build" --target llama-server llama-bench -j 12
}
if [ -x "$LL/build/bin/llama-server" ]; then
    echo "llama.cpp: built before"
    bpid=
else
    taskset -c 4-15 bash -c "$(declare -f build_llama); LL=$LL SRC=$SRC; build_llama" >"$OUT/llbuild.log" 2>&1 &
    bpid=$!
fi

if [ -z "${SKIP_TESTS:-}" ]; then
    taskset -c 0-3 timeout "${TEST_S:-150}" "$C/test-gpu" >"$OUT/tests.log" 2>&1
    echo "test-gpu rc=$? at $(since) s: $(grep -cE '^PASS' "$OUT/tests.log") PASS, $(grep -cE '^FAIL' "$OUT/tests.log") FAIL"
    grep -E '^FAIL' "$OUT/tests.log"
fi
KEEP_MODEL=1 SKIP_TESTS=1 CARRY=$C OUT=$OUT/serve taskset -c 0-3 bash scripts/bench-serve.sh

if [ -n "$bpid" ]; then
    wait "$bpid"
    echo "llama.cpp build rc=$? at $(since) s"
    tail -n 3 "$OUT/llbuild.log"
fi
M=/dev/shm/bench-serve.gguf
if [ -x "$LL/build/bin/llama-server" ]; then
    KEEP_MODEL=1 SKIP_TESTS=1 VARIANTS=none LLAMA_SERVER=$LL/build/bin/llama-server CARRY=$C OUT=$OUT/serve \
        bash scripts/bench-serve.sh
    echo "== llama-bench (default -fa) at $(since) s" | tee -a "$OUT/serve/summary.txt"
    timeout 180 "$LL/build/bin/llama-bench" -m "$M" -ngl 99 -p 512 -n 128 -r 3 2>&1 |
        grep -E '^\|' | tee -a "$OUT/serve/summary.txt"
fi
[ -n "${KEEP_MODEL:-}" ] || rm -f "$M"
echo "done at $(since) s"
