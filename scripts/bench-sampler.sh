#!/usr/bin/env bash
# bench-sampler.sh - the host sampler's time per token (scripts/bench-sampler.c) at logit
# spreads from flat to peaked. Usage: scripts/bench-sampler.sh [SPREAD | gSIGMA ...]
set -eu
cd "$(dirname "$0")/.."
mkdir -p build
make -s build/libtide.a # the sampler and what it calls (argmax.c, sample_rows.c, the JSON mask...)
cc -O2 -std=c11 -Isrc -o build/bench-sampler scripts/bench-sampler.c build/libtide.a -lmicrohttpd -lcjson -lpcre2-8 -lnettle -lm -pthread
[ $# -gt 0 ] || set -- 0.1 2 6 20 g0.5 g2 g8
build/bench-sampler "$@"
