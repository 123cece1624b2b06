#!/usr/bin/env bash
# moe-prefill branch, call 2: the f32 prefill GEMM (router) + grouped experts; tests, bench, daemon, memcheck
set -u -o pipefail
C=.dev-moe
export LD_LIBRARY_PATH=$PWD/$C/gpu-libs
S=$OUT/summary.txt
log() { echo "$*" | tee -a "$S"; }
log "== $(date -u +%FT%TZ)"
t0=$(date +%s)
timeout 60 $C/test-gpu --only matmul > $OUT/t_matmul.log 2>&1; log "matmul rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^(PASS|FAIL)|rel err|error" $OUT/t_matmul.log | tee -a "$S"
timeout 60 $C/test-gpu --only e2e > $OUT/t_e2e.log 2>&1; log "e2e rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^(PASS|FAIL)|OK:|FAILED" $OUT/t_e2e.log | cut -c1-150 | tee -a "$S"
timeout 30 $C/test-gpu --only moe_prefill > $OUT/t_mp.log 2>&1; grep -E "^(PASS|FAIL)|moe_ffn_batch" $OUT/t_mp.log | tee -a "$S"
timeout 100 $C/test-gpu --bench --only bench_prefill > $OUT/bench_prefill.log 2>&1; log "bench rc $? ($(( $(date +%s) - t0 )) s)"
grep -vE "^SKIPPED|copy:|bench_copy" $OUT/bench_prefill.log | tee -a "$S"
M=/dev/shm/q.gguf
timeout 60 $C/tide-mkmodel --preset qwen3-30b-a3b --layers 48 --out $M > $OUT/mk.log 2>&1; log "model rc $? ($(( $(date +%s) - t0 )) s)"
port=18557
echo "{\"model\":\"$M\",\"port\":$port,\"context\":2048,\"devices\":[{\"backend\":\"cuda\",\"index\":0}]}" > $OUT/cfg.json
$C/tide --config $OUT/cfg.json > $OUT/daemon.log 2>&1 &
pid=$!
for _ in $(seq 1 600); do curl -sf localhost:$port/health >/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
log "daemon up ($(( $(date +%s) - t0 )) s)"
timeout 40 python3 - <<'PY' 2>&1 | tee -a "$S"
import json, time, urllib.request
base = "http://localhost:18557"
def get(p): return urllib.request.urlopen(base + p, timeout=30).read().decode()
def post(p, b):
    r = urllib.request.Request(base + p, json.dumps(b).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(r, timeout=30).read())
def metrics():
    m = {}
    for l in get("/metrics").splitlines():
        if l and not l.startswith("#") and " " in l:
            k, v = l.rsplit(" ", 1); m[k] = float(v)
    return m
words = ["red", "blue", "green", "black", "white", "orange"]
def run(i, mt):
    m0 = metrics()
    r = post("/v1/completions", {"prompt": words[i] + " one two three four five six seven eight nine ten" * 51,
                                 "max_tokens": mt, "temperature": 0, "seed": i})
    m1 = metrics()
    return r, m1["tide_time_to_first_token_seconds_sum"] - m0.get("tide_time_to_first_token_seconds_sum", 0)
run(0, 4)
pf = []
for i in range(1, 5):
    r, ttft = run(i, 1)
    pf.append(r["usage"]["prompt_tokens"] / ttft)
    print(f"prefill {r['usage']['prompt_tokens']} tokens ttft {ttft*1e3:.1f} ms = {pf[-1]:.1f} tok/s; text {r['choices'][0]['text']!r}")
print(f"PREFILL mean {sum(pf)/len(pf):.1f} tok/s")
PY
kill $pid; wait $pid 2>/dev/null
grep -iE "error|fail" $OUT/daemon.log | head -3 | tee -a "$S"
timeout 70 compute-sanitizer --tool memcheck --print-limit 5 $C/test-gpu --only moe_prefill > $OUT/memcheck.log 2>&1; log "memcheck rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "ERROR SUMMARY|^(PASS|FAIL)|Invalid|=========  " $OUT/memcheck.log | head -12 | tee -a "$S"
log "done ($(( $(date +%s) - t0 )) s)"
