#!/usr/bin/env bash
# bench-cpu.sh - CPU prefill/decode throughput on the generated `big` preset.
#
# Skeleton: builds the model with tide-mkmodel, then times a prefill and a short decode
# through a tiny C driver compiled against libtide (no server in the loop, so the numbers
# are the engine's alone). Usage: scripts/bench-cpu.sh [threads]
# MODEL=path picks the file (default /tmp/tide-big.gguf, made if absent); MKMODEL_ARGS adds
# options when it is made, e.g. MODEL=/tmp/big-q4km.gguf MKMODEL_ARGS='--mix Q4_K_M'.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${1:-0}"
MODEL="${MODEL:-/tmp/tide-big.gguf}"
make -s build/libtide.a build/tide-mkmodel
[ -f "$MODEL" ] || build/tide-mkmodel --preset big ${MKMODEL_ARGS:-} --out "$MODEL"

DRV=$(mktemp -d)/bench.c
cat > "$DRV" <<'C'
#include "engine/forward.h"
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv)
{
    struct model m;
    char err[256];
    if (model_load(&m, argv[1], err, sizeof(err)) < 0) { fprintf(stderr, "%s\n", err); return 1; }
    struct backend be;
    backend_cpu_init(&be, atoi(argv[2]));
    struct forward_state f;
    if (forward_init(&f, &m, be, 1024) < 0) return 1;
    int n_prompt = 256, n_gen = 128, toks[512];
    for (int i = 0; i < 512; i++) toks[i] = (i * 7 + 1) % (int)m.cfg.n_vocab;
    /* one untimed pass first, as llama-bench does: the first touch of each mmapped expert
     * page is a page fault, not inference */
    if (forward_eval(&f, toks, n_prompt, 0) < 0) return 1;
    for (int i = 0; i < n_gen; i++)
        if (forward_eval(&f, toks + i, 1, n_prompt + i) < 0) return 1;
    double t0 = tide_now();
    if (forward_eval(&f, toks, n_prompt, 0) < 0) return 1;
    /* decode from an empty context, like llama-bench's tg test */
    double t1 = tide_now();
    for (int i = 0; i < n_gen; i++)
        if (forward_eval(&f, toks + i, 1, getenv("AT_END") ? n_prompt + i : i) < 0) return 1;
    double t2 = tide_now();
    printf("prefill %.1f tok/s  decode %.1f tok/s\n", n_prompt / (t1 - t0), n_gen / (t2 - t1));
    forward_free(&f);
    backend_cpu_free(&be);
    model_free(&m);
    return 0;
}
C
# libtide.a holds the CUDA backend when nvcc built it: link what it needs (static cudart)
gcc -std=c11 -D_GNU_SOURCE -O2 -Isrc -pthread "$DRV" build/libtide.a $(make -s print-gpu-ldlibs) -o "${DRV%.c}"
"${DRV%.c}" "$MODEL" "$THREADS"

# llama.cpp side by side, when a build is at hand (LLAMA_BENCH=path/to/llama-bench, or the
# default /tmp/llama.cpp/build/bin/llama-bench): same file, same threads, same sizes.
LB="${LLAMA_BENCH:-/tmp/llama.cpp/build/bin/llama-bench}"
if [ -x "$LB" ]; then
  T="$THREADS"; [ "$T" = 0 ] && T=$(nproc)
  "$LB" -m "$MODEL" -t "$T" -p 256 -n 128 -r 2
else
  echo "llama-bench not found (set LLAMA_BENCH): tide numbers only"
fi
