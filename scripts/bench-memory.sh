#!/usr/bin/env bash
# bench-memory.sh - decode tok/s and expert-cache hit rate vs cache share (POST /v1/vram reserves),
# on the generated `big` preset, one CPU device (vram_mib 8192), context 512, greedy, 128 tokens.
# Usage: scripts/bench-memory.sh   (env: PORT, THREADS, MAXTOK). Writes docs/bench/memory.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${PORT:-18431}"; THREADS="${THREADS:-2}"; MAXTOK="${MAXTOK:-128}"
MODEL=/tmp/tide-big.gguf
[ -x build/tide ] || make NVCC= -j2
[ -f "$MODEL" ] || build/tide-mkmodel --preset big --out "$MODEL"
W=$(mktemp -d)
cat > "$W/c.json" <<E
{"host":"127.0.0.1","port":$PORT,"model":"$MODEL","mmproj":null,"context":512,"threads":$THREADS,
 "devices":[{"backend":"cpu","index":0,"vram_mib":8192}],"vram_reserve_mib":[0]}
E
build/tide --config "$W/c.json" > "$W/log" 2>&1 & PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for i in $(seq 50); do curl -sf "localhost:$PORT/v1/vram" >/dev/null && break; sleep 0.2; done
cat > "$W/b.py" <<'PY'
import json, sys, time, urllib.request
port, maxtok = sys.argv[1], int(sys.argv[2]); B = f"http://127.0.0.1:{port}"
def get(): return json.load(urllib.request.urlopen(B + "/v1/vram"))["devices"][0]
def post(p, d):
    r = urllib.request.Request(B + p, json.dumps(d).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(r)
def decode():
    r = post("/v1/completions", {"prompt": "The red square and the blue circle are", "max_tokens": maxtok,
             "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    ts, text, usage = [], "", None
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]": continue
        o = json.loads(line[6:])
        if o.get("usage"): usage = o["usage"]
        for c in o["choices"]:
            if c["finish_reason"] is None: ts.append(time.monotonic()); text += c["text"]
    n = usage["completion_tokens"]
    return (n - 1) / (ts[-1] - ts[0]), text, n
d0 = get(); free, full = d0["free_mib"], d0["expert_cache_full_mib"]
print("share,reserve_mib,expert_slots,expert_cache_mib,tokens,decode_tok_s,hits,misses,hit_rate")
texts = []
for share in [1.0, 0.75, 0.5, 0.25, 0.125, 0.0]:
    res = int(free + (1 - share) * full + 0.5)
    post("/v1/vram", {"reserve_mib": [res]}).read()
    d = get(); decode()  # warm-up
    a = get(); tps, text, n = decode(); b = get()
    h, m = b["expert_hits"] - a["expert_hits"], b["expert_misses"] - a["expert_misses"]
    texts.append(text)
    print(f"{share},{res},{d['expert_slots']},{d['expert_cache_mib']},{n},{tps:.1f},{h},{m},{h/(h+m):.3f}", flush=True)
print("# generated text identical at every cache size:" , "yes" if len(set(texts)) == 1 else "NO", file=sys.stderr)
PY
python3 "$W/b.py" "$PORT" "$MAXTOK" | tee docs/bench/memory.csv
grep "vram: reserve applied" "$W/log" || true
