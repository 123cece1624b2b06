#!/usr/bin/env bash
# bench-sampler.sh - the host sampler's time per token (scripts/bench-sampler.c) at logit
# spreads from flat to peaked. Usage: scripts/bench-sampler.sh [SPREAD | gSIGMA ...]
set -eu
cd "$(dirname "$0")/.."
mkdir -p build
cc -O2 -std=c11 -Isrc -o build/bench-sampler scripts/bench-sampler.c src/engine/sample.c -lm
[ $# -gt 0 ] || set -- 0.1 2 6 20 g0.5 g2 g8
build/bench-sampler "$@"
