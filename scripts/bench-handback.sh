#!/usr/bin/env bash
# bench-handback.sh - hand-back (shrink) and regrow (grow + refill) time per GiB on a CPU device
# with a warm cache: before every shrink a greedy decode fills the cache, so regrow really maps
# fresh memory and copies the experts it held back in from host RAM.
# Model: tide-mkmodel --preset big --experts 64 (1536 MiB of experts, 48 MiB segments).
# Usage: scripts/bench-handback.sh [rounds]   (env: PORT, THREADS, TIDE=path to the binary)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-3}"; PORT="${PORT:-18432}"; THREADS="${THREADS:-2}"; TIDE="${TIDE:-build/tide}"
MODEL=/tmp/tide-big64.gguf
[ -x "$TIDE" ] || make NVCC= -j2
[ -f "$MODEL" ] || "$(dirname "$TIDE")/tide-mkmodel" --preset big --experts 64 --out "$MODEL"
W=$(mktemp -d)
cat > "$W/c.json" <<E
{"host":"127.0.0.1","port":$PORT,"model":"$MODEL","mmproj":null,"context":1024,"threads":$THREADS,
 "devices":[{"backend":"cpu","index":0,"vram_mib":8192}],"vram_reserve_mib":[0]}
E
"$TIDE" --config "$W/c.json" > "$W/log" 2>&1 & PID=$!
trap 'kill $PID 2>/dev/null || true; rm -rf "$W"' EXIT
for i in $(seq 100); do curl -sf "localhost:$PORT/v1/vram" >/dev/null && break; sleep 0.2; done
python3 - "$PORT" "$ROUNDS" "$W/log" <<'PY'
import json, re, sys, time, urllib.request
port, rounds, logf = sys.argv[1], int(sys.argv[2]), sys.argv[3]
B = f"http://127.0.0.1:{port}"
def get(): return json.load(urllib.request.urlopen(B + "/v1/vram"))["devices"][0]
def post(p, d):
    r = urllib.request.Request(B + p, json.dumps(d).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(r).read()
def copied():
    t = urllib.request.urlopen(B + "/metrics").read().decode()
    return sum(float(l.split()[-1]) for l in t.splitlines() if l.startswith("tide_expert_cache_copied_bytes_total{"))
def last_apply():
    lines = [l for l in open(logf) if "reserve applied in" in l]
    m = re.search(r"applied in ([0-9.]+) ms, expert cache ([0-9.]+) -> ([0-9.]+) MiB", lines[-1])
    return float(m.group(1)), float(m.group(2)), float(m.group(3))
print("round,op,ms,cache_mib_before,cache_mib_after,gib_moved,refilled_mib,ms_per_gib,post_wall_ms")
for r in range(rounds):
    # fill: every token routes 2 of 64 experts in each of 8 layers; 384 tokens touch nearly all
    post("/v1/completions", {"prompt": f"Round {r}: the shapes", "max_tokens": 384, "temperature": 0})
    d = get(); full = d["expert_cache_full_mib"]
    t = time.monotonic(); post("/v1/vram", {"reserve_mib": [int(d["free_mib"] + full + 1)]})
    wall = (time.monotonic() - t) * 1e3
    ms, a, b = last_apply(); g = (a - b) / 1024
    print(f"{r},shrink,{ms:.1f},{a:.0f},{b:.0f},{g:.2f},0,{ms/g:.1f},{wall:.1f}", flush=True)
    c0 = copied()
    t = time.monotonic(); post("/v1/vram", {"reserve_mib": None})
    wall = (time.monotonic() - t) * 1e3
    ms, a, b = last_apply(); g = (b - a) / 1024
    refilled = (copied() - c0) / 2**20
    print(f"{r},regrow,{ms:.1f},{a:.0f},{b:.0f},{g:.2f},{refilled:.0f},{ms/g:.1f},{wall:.1f}", flush=True)
PY
