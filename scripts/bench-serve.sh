#!/usr/bin/env bash
# bench-serve.sh - many clients at once through the server (issue 20): tide, and llama-server when
# one is given, on the same Qwen3-30B-A3B-shaped q8_0 file on one H200.
#
#   CARRY=.dev-lead/gb scripts/bench-gpu-llama.sh build   # here: tide, tide-mkmodel, test-gpu + libs
#   then through the device tool, carry [".dev-lead"]:
#   CARRY=.dev-lead/gb OUT=$OUT scripts/bench-serve.sh    # there; summary.txt under $OUT
# Steps (each bounded by a timeout, logged to $OUT/summary.txt as it finishes):
#   test-gpu batch_* and bench_batch (batched steps vs the CPU; decode step time at B = 1, 8, 32);
#   the model written to /dev/shm (LAYERS, default 48; KEEP_MODEL=1 keeps it for the next run,
#   which then reuses it);
#   tide (each of VARIANTS, default "tide"; "label:VAR=v+VAR2=v" sets switches; "none": no tide) with parallel PARALLEL (default 64), context CTX (default 2048): scripts/bench-serve.py at
#   CLIENTS (default "1 8 32 64") clients, 128 tokens each, greedy, then temperature 1 at 32, then
#   32 clients sharing a 400-word system prompt; with EXTRAS=1 also temperature 1 with
#   presence_penalty PRESENCE (default 0.5) and logprobs with TOP_LOGPROBS (default 5) top ones, at
#   1 and 32 clients (issue 21: the sampler's extras on the device; run it with a variant
#   "extras:TIDE_DEVICE_SAMPLE_EXTRAS=1" next to "tide" to compare the host and device draws);
#   llama-server (LLAMA_SERVER=path, -np N -c N*CTX -ngl 99, its default flash attention) the same,
#   when given.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tide-bench-serve}
C=${CARRY:-build/gpu-bench}
LAYERS=${LAYERS:-48}
PARALLEL=${PARALLEL:-64}
CTX=${CTX:-2048}
CLIENTS=${CLIENTS:-"1 8 32 64"}
mkdir -p "$OUT"
S=$OUT/summary.txt
log() { echo "$*" | tee -a "$S"; }
export LD_LIBRARY_PATH=$PWD/$C/gpu-libs
log "== bench-serve $(date -u +%FT%TZ) LAYERS=$LAYERS PARALLEL=$PARALLEL CTX=$CTX"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee -a "$S"

[ -n "${SKIP_TESTS:-}" ] || { timeout 240 "$C/test-gpu" --bench --only batch; TIDE_ATTN_MMA=0 timeout 120 "$C/test-gpu" --only batch_big; } 2>&1 | tee "$OUT/test-gpu-batch.txt" | grep -E "PASS|FAIL|bench_batch|OK|FAILED" | tee -a "$S"

M=/dev/shm/bench-serve.gguf
if [ -n "${KEEP_MODEL:-}" ] && [ -s "$M" ]; then
    log "model: the one a run before kept ($(du -h "$M" | cut -f1))"
else
    t0=$(date +%s)
    timeout 300 "$C/tide-mkmodel" --preset qwen3-30b-a3b --layers "$LAYERS" --out "$M" >"$OUT/mkmodel.log" 2>&1 ||
        { log "mkmodel failed: $(tail -n 2 "$OUT/mkmodel.log")"; exit 1; }
    log "model written in $(( $(date +%s) - t0 )) s: $(du -h "$M" | cut -f1)"
fi

port=18080
# tide's mean step times over one run, from /metrics deltas (forward on the device vs the host's share)
steps() { curl -s "$1/metrics" | awk '/^tide_step_(forward|host)_seconds_(sum|count)/ {printf "%s=%s ", $1, $2}'; }
step_delta() { # before after
    python3 -c 'import sys
a = dict(kv.split("=") for kv in sys.argv[1].split()); b = dict(kv.split("=") for kv in sys.argv[2].split())
d = lambda k: float(b.get(k, 0)) - float(a.get(k, 0))
n = d("tide_step_forward_seconds_count")
if n > 0: print("  steps %d: forward %.2f ms, host %.2f ms a step" % (n, 1e3 * d("tide_step_forward_seconds_sum") / n, 1e3 * d("tide_step_host_seconds_sum") / max(d("tide_step_host_seconds_count"), 1)))' "$1" "$2"
}
serve_runs() { # label url
    for n in $CLIENTS; do
        s0=$(steps "$2")
        timeout 300 python3 scripts/bench-serve.py "$2" "$n" --label "$1" --out "$OUT/runs.jsonl" | tee -a "$S"
        step_delta "$s0" "$(steps "$2")" | tee -a "$S"
    done
    timeout 300 python3 scripts/bench-serve.py "$2" 32 --temperature 1 --label "$1" --out "$OUT/runs.jsonl" | tee -a "$S"
    timeout 300 python3 scripts/bench-serve.py "$2" 32 --shared 400 --label "$1" --out "$OUT/runs.jsonl" | tee -a "$S"
    if [ -n "${EXTRAS:-}" ]; then
        for n in 1 32; do
            timeout 300 python3 scripts/bench-serve.py "$2" "$n" --temperature 1 --presence-penalty "${PRESENCE:-0.5}" \
                --logprobs "${TOP_LOGPROBS:-5}" --label "$1" --out "$OUT/runs.jsonl" | tee -a "$S"
        done
    fi
}
wait_health() { # url pid log
    for _ in $(seq 1 600); do
        curl -s -o /dev/null -w '%{http_code}' "$1/health" 2>/dev/null | grep -q 200 && return 0
        kill -0 "$2" 2>/dev/null || { log "server exited: $(tail -n 3 "$3")"; return 1; }
        sleep 0.5
    done
    log "server not healthy after 300 s"; return 1
}

cat >"$OUT/tide.json" <<EOF
{"model": "$M", "mmproj": null, "context": $CTX, "port": $port, "parallel": $PARALLEL, "queue_max": 256,
 "devices": [{"backend": "cuda", "index": 0}]}
EOF
# VARIANTS: tide runs one after another, each "label" or "label:VAR=v+VAR2=v" (environment switches)
for variant in ${VARIANTS:-tide}; do
    [ "$variant" = none ] && continue
    label=${variant%%:*}
    envs=()
    [ "$label" = "$variant" ] || IFS=+ read -r -a envs <<<"${variant#*:}"
    # BIN=name runs $C/name instead of $C/tide; KV=f16 passes --kv-type f16; the rest is environment
    bin=tide; args=(); e2=()
    for kv in "${envs[@]}"; do
        case $kv in BIN=*) bin=${kv#BIN=} ;; KV=*) args=(--kv-type "${kv#KV=}") ;; *) e2+=("$kv") ;; esac
    done
    log "-- $label ${envs[*]:-}"
    env "${e2[@]}" "$C/$bin" --config "$OUT/tide.json" "${args[@]}" >"$OUT/$label.log" 2>&1 &
    pid=$!
    if wait_health "http://127.0.0.1:$port" $pid "$OUT/$label.log"; then
        grep -E "ready in|device 0:" "$OUT/$label.log" | tee -a "$S"
        serve_runs "$label" "http://127.0.0.1:$port"
    fi
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
done

if [ -n "${LLAMA_SERVER:-}" ] && [ -x "$LLAMA_SERVER" ]; then
    maxn=$(echo $CLIENTS | tr ' ' '\n' | sort -n | tail -n1)
    "$LLAMA_SERVER" -m "$M" -ngl 99 -np "$maxn" -c $((maxn * CTX)) --port $((port + 1)) >"$OUT/llama.log" 2>&1 &
    pid=$!
    if wait_health "http://127.0.0.1:$((port + 1))" $pid "$OUT/llama.log"; then
        serve_runs llama-server "http://127.0.0.1:$((port + 1))"
    fi
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
fi
[ -n "${KEEP_MODEL:-}" ] || rm -f "$M"
log "== done $(date -u +%FT%TZ)"
