#!/usr/bin/env bash
# bench-serve-cpu.sh - issue 20's CPU target: CLIENTS (4) concurrent streamed chat requests of
# 128 tokens through the server, tide (-np CLIENTS) against llama-server (-np CLIENTS, its
# context CLIENTS x 2048) on the same random-weight MoE (tide-mkmodel --preset big: n_embd 1024,
# 8 layers, 16 experts top-2), at THREADS (2) threads, for each of TYPES (f16 q8_0); the two
# servers alternate RUNS (3) times so a busy neighbour hits both alike. Every request bans the
# vocabulary's byte tokens (bench-serve.py --ban 128-255: llama-server refuses replies that are
# not valid UTF-8), the same for both servers. SHARED=N gives every request the same N-word system
# prompt before its own question (bench-serve.py --shared).
#
#   LLAMA_SERVER=/tmp/llama.cpp/build/bin/llama-server scripts/bench-serve-cpu.sh
# Output: $OUT/runs.jsonl (every run) and the lines printed (also $OUT/summary.txt).
set -u -o pipefail
cd "$(dirname "$0")/.."
TYPES=${TYPES:-"f16 q8_0"}
THREADS=${THREADS:-2}
CLIENTS=${CLIENTS:-4}
RUNS=${RUNS:-3}
SHARED=${SHARED:-0}
MODELS=${MODELS:-/tmp}
OUT=${OUT:-/tmp/tide-bench-serve-cpu}
LS=${LLAMA_SERVER:-/tmp/llama.cpp/build/bin/llama-server}
PORT=${PORT:-18393}
mkdir -p "$OUT"
S=$OUT/summary.txt
make -s CUDA_HOME=/nonexistent build/tide build/tide-mkmodel || exit 1
[ -x "$LS" ] || { echo "no llama-server at $LS (set LLAMA_SERVER)"; exit 1; }
log() { echo "$*" | tee -a "$S"; }
log "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) nproc=$(nproc) threads=$THREADS clients=$CLIENTS shared=$SHARED"

serve() { # label type cmd...: start, wait for /health, run the clients, stop
    local label=$1 type=$2
    shift 2
    "$@" >"$OUT/$label.log" 2>&1 &
    local pid=$! ok=
    for _ in $(seq 1 600); do
        curl -s "http://127.0.0.1:$PORT/health" 2>/dev/null | grep -q ok && { ok=1; break; }
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if [ -n "$ok" ]; then
        timeout 300 python3 scripts/bench-serve.py "http://127.0.0.1:$PORT" 1 --max-tokens 8 --ban 128-255 >/dev/null # warm-up
        log "$(timeout 300 python3 scripts/bench-serve.py "http://127.0.0.1:$PORT" "$CLIENTS" --ban 128-255 \
            --shared "$SHARED" --label "$label-$type" --out "$OUT/runs.jsonl") load=$(cut -d' ' -f1 /proc/loadavg)"
    else
        log "$label did not start: $(tail -n 2 "$OUT/$label.log")"
    fi
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}

for type in $TYPES; do
    M=$MODELS/tide-bench-big-$type.gguf
    [ -f "$M" ] || build/tide-mkmodel --preset big --type "$type" --out "$M" >/dev/null || exit 1
    for r in $(seq 1 "$RUNS"); do
        serve tide "$type" build/tide -m "$M" -t "$THREADS" -c 2048 -np "$CLIENTS" --port "$PORT" --host 127.0.0.1
        serve llama "$type" "$LS" -m "$M" -t "$THREADS" -c $((CLIENTS * 2048)) -np "$CLIENTS" --port "$PORT" \
            --host 127.0.0.1
    done
done
