#!/usr/bin/env bash
# bench-gpu-llama.sh - tide and llama.cpp side by side on one H200 (issue 6): a Qwen3-30B-A3B-
# shaped qwen3moe GGUF in q8_0 with random weights, written on the device by tide-mkmodel.
#
#   scripts/bench-gpu-llama.sh build    # here: tide, tide-mkmodel, test-gpu (nvcc, static cudart)
#                                       #   from $BUILD, their Debian .so files, and llama.cpp's
#                                       #   llama-bench (stripped) from $LLAMA, all into $CARRY
#   then through the device tool, carry ["$CARRY"] (default build/gpu-bench):
#   scripts/bench-gpu-llama.sh device   # there; summary.txt and logs under $OUT
# Device part, each step bounded by a timeout and logged to $OUT/summary.txt as it finishes:
#   copy bandwidth (test-gpu bench_copy: device-to-device, pinned host-to-device);
#   the model (LAYERS, default 48) written to tmpfs when there is room, else to disk;
#   a) tide, everything resident: prefill tok/s of a 512-token prompt (time to first token)
#      and decode tok/s over 128 tokens (inter-token latency), both from /metrics deltas;
#   b) llama-bench -ngl 99 -p 512 -n 128 -r 3 on the same file (its default -fa: flash attention on);
#   c) about half the experts on the GPU: tide's expert cache cut to half by POST /v1/vram
#      (decode tok/s, hit rate from /v1/vram), llama-bench --n-cpu-moe LAYERS/2;
#   d) decode as a share of the HBM roofline: active bytes per token / measured d2d bandwidth.
# The model file stays where it was written (tmpfs); KEEP_MODEL=1 reuses it on the next run.
# BACKEND=cpu LAYERS=1 MKMODEL_ARGS="--embd 256 --heads 2 --kv-heads 1 --experts 8 --experts-used 2"
# runs the tide part on a CPU device with a small model (to check the script without a GPU).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tide-bench-llama}
C=${CARRY:-build/gpu-bench}
mkdir -p "$OUT"

case "${1:-device}" in
build)
    B=${BUILD:-build}
    LLAMA=${LLAMA:-/tmp/llama.cpp/build-cuda}
    make -j"$(nproc)" BUILD="$B" "$B/tide" "$B/tide-mkmodel" "$B/test-gpu" || exit 1
    rm -rf "$C" && mkdir -p "$C/gpu-libs"
    cp "$B/tide" "$B/tide-mkmodel" "$B/test-gpu" "$C/"
    ldd "$B/tide" | awk '$3 ~ /^\// {print $3}' | grep -vE '/(libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux)' |
        xargs -I{} cp -L {} "$C/gpu-libs/"
    if [ -x "$LLAMA/bin/llama-bench" ]; then
        # stripped and xz-compressed (48 -> 26 MB: the carry limit is 64 MiB with the tree);
        # cuBLAS/cudart come from the device's pip packages, libcuda from its driver; OpenMP from here
        strip -o "$C/llama-bench" "$LLAMA/bin/llama-bench"
        ldd "$C/llama-bench" | awk '$3 ~ /libgomp/ {print $3}' | xargs -r -I{} cp -L {} "$C/gpu-libs/"
        ldd "$C/llama-bench" | grep -E "not found|cublas|cudart" || true
        xz -T0 -6 -f "$C/llama-bench"
    else
        echo "no $LLAMA/bin/llama-bench: the llama.cpp steps will be skipped"
    fi
    du -sh "$C" "$C"/*
    ;;
device)
    S=$OUT/summary.txt
    log() { echo "$*" | tee -a "$S"; }
    LAYERS=${LAYERS:-48}
    BACKEND=${BACKEND:-cuda}
    export LD_LIBRARY_PATH=$PWD/$C/gpu-libs
    # llama-bench links cuBLAS/cudart dynamically: the pip copies on the device machine
    nv=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)/nvidia
    LLAMA_LIBS=$(find "$nv" -name 'libcublas.so.13*' -o -name 'libcublasLt.so.13*' -o -name 'libcudart.so.13*' 2>/dev/null |
        xargs -r -n1 dirname | sort -u | paste -sd:)
    log "== bench-gpu-llama $(date -u +%FT%TZ), LAYERS=$LAYERS BACKEND=$BACKEND"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee -a "$S"
    log "host: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo) RAM"
    # bandwidth
    d2d=0
    if [ -x "$C/test-gpu" ] && [ "$BACKEND" = cuda ]; then
        timeout 60 "$C/test-gpu" --bench --only bench_copy 2>&1 | tee "$OUT/copy.log" | grep -E "copy:" | tee -a "$S"
        d2d=$(grep -oE 'device-to-device [0-9]+' "$OUT/copy.log" | grep -oE '[0-9]+$' || echo 0)
    fi
    # the model: tmpfs (RAM) when it has room, so the write is not bound by the disk
    need=$((LAYERS * 640 + 700)) # MiB, q8_0
    dir=/tmp
    if [ "$(df -m --output=avail /dev/shm 2>/dev/null | tail -1)" -gt $((need + 1024)) ] 2>/dev/null; then
        dir=/dev/shm
    elif mkdir -p /mnt/tide-bench && mount -t tmpfs -o size=$((need + 2048))m tmpfs /mnt/tide-bench 2>/dev/null; then
        dir=/mnt/tide-bench
    fi
    # MIX=Q4_K_M (or another tide-mkmodel --mix) writes that k-quant mix instead of q8_0
    M=$dir/qwen3-30b-a3b-L$LAYERS-${MIX:-q8_0}.gguf
    t0=$(date +%s.%N)
    if [ -n "${KEEP_MODEL:-}" ] && [ -s "$M" ]; then # KEEP_MODEL=1: a file a run before left is reused
        log "model: $M from a run before ($(du -h "$M" | cut -f1))"
    else
        timeout 300 "$C/tide-mkmodel" --preset qwen3-30b-a3b --layers "$LAYERS" ${MIX:+--mix "$MIX"} ${MKMODEL_ARGS:-} --out "$M" | tee -a "$S" || { log "FAIL model write"; exit 1; }
        log "model: $M written in $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s ($dir)"
    fi
    # a) + c) tide
    port=18557
    dev="{\"backend\":\"$BACKEND\",\"index\":0}"
    echo "{\"model\":\"$M\",\"port\":$port,\"context\":2048,\"devices\":[$dev]}" >"$OUT/cfg.json"
    t0=$(date +%s.%N)
    "$C/tide" --config "$OUT/cfg.json" >"$OUT/daemon.log" 2>&1 &
    pid=$!
    up=0
    for _ in $(seq 1 3000); do
        curl -sf "localhost:$port/health" >/dev/null && { up=1; break; }
        kill -0 $pid 2>/dev/null || break
        sleep 0.1
    done
    if [ $up = 1 ]; then
        log "tide: up in $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s; $(grep -E "device 0" "$OUT/daemon.log" | tail -1)"
        PORT=$port LAYERS=$LAYERS D2D=$d2d timeout 400 python3 - 2>&1 <<'EOF' | tee -a "$S"
import json, os, time, urllib.request
port = int(os.environ["PORT"]); base = f"http://localhost:{port}"
def get(p):
    return urllib.request.urlopen(base + p, timeout=120).read().decode()
def post(p, body):
    r = urllib.request.Request(base + p, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(r, timeout=300).read())
def metrics():
    m = {}
    for line in get("/metrics").splitlines():
        if line and not line.startswith("#") and " " in line:
            k, v = line.rsplit(" ", 1)
            m[k] = float(v)
    return m
def vram():
    return json.loads(get("/v1/vram"))["devices"][0]
# every prompt starts with a different word, so no request reuses another's KV prefix
words = ["red", "blue", "green", "black", "white", "orange", "yellow", "purple", "grey", "pink"]
def prompt(i, n_words):
    return words[i % len(words)] + " one two three four five six seven eight nine ten" * (n_words // 10)
def run(i, n_words, max_tokens, temp=0):
    m0 = metrics(); t0 = time.time()
    r = post("/v1/completions", {"prompt": prompt(i, n_words), "max_tokens": max_tokens, "temperature": temp,
                                 "seed": i})
    wall = time.time() - t0; m1 = metrics()
    d = lambda k: m1.get(k, 0) - m0.get(k, 0)
    ttft = d("tide_time_to_first_token_seconds_sum")
    itl_n, itl_s = d("tide_inter_token_latency_seconds_count"), d("tide_inter_token_latency_seconds_sum")
    return r["usage"], ttft, itl_n, itl_s, wall
def hm():
    v = vram(); return v["expert_hits"], v["expert_misses"]
P = 510  # words: 1 + 510 = 511 + ... tokens; the real count is read from usage
run(0, P, 16)  # warm-up: the expert cache fills
pf = []
for i in range(1, 4):
    u, ttft, _, _, _ = run(i, P, 1)
    pf.append(u["prompt_tokens"] / ttft)
    print(f"tide prefill: {u['prompt_tokens']} tokens, time to first token {ttft * 1e3:.1f} ms = {pf[-1]:.1f} tok/s")
def decode(tag, runs, start, temp=0):
    out = []
    tag += " greedy" if temp == 0 else f" sampled (temperature {temp})"
    for i in range(start, start + runs):
        h0, m0 = hm()
        u, ttft, n, s, wall = run(i, 10, 128, temp)
        h1, m1 = hm()
        hits, miss = h1 - h0, m1 - m0
        out.append((n / s, hits / max(1, hits + miss)))
        print(f"tide decode {tag}: {u['completion_tokens']} tokens (prompt {u['prompt_tokens']}), "
              f"{n:.0f} gaps {s * 1e3:.1f} ms = {n / s:.1f} tok/s; expert hits {hits:.0f} misses {miss:.0f} "
              f"({100 * out[-1][1]:.1f}% hit)")
    return out
# greedy decoding of random weights falls into short loops of tokens, whose experts an LRU
# cache keeps; sampled tokens (like llama-bench's random ones) route like fresh text
dr = decode("resident", 3, 4)
drs = decode("resident", 2, 20, 1.0)
v = vram()
full_slots, cache = v["expert_slots"], v["expert_cache_mib"]
print(f"tide resident: expert slots {full_slots}, cache {cache} MiB, vram {json.dumps(v)}")
# c) about half the experts: hand back half the cache (the same cache a vram_mib cap would size)
r = post("/v1/vram", {"reserve_mib": [v["free_mib"] + cache // 2]})
v = vram()
print(f"tide capped: expert slots {v['expert_slots']} of {full_slots} "
      f"({100 * v['expert_slots'] / full_slots:.1f}%), cache {v['expert_cache_mib']} MiB")
decode("capped warm-up", 1, 7, 1.0)
dcs = decode("capped", 3, 30, 1.0)
dc = decode("capped", 2, 8)
# regrow: the reserve lifted; the engine maps the segments back and refills them from the pinned
# host copies (it waits for the copies, so the logged time includes them)
t = time.time(); post("/v1/vram", {"reserve_mib": None}); wall = time.time() - t
v2 = vram()
print(f"tide restore: expert slots {v2['expert_slots']} of {full_slots}, POST answered in {wall * 1e3:.1f} ms")
avg = lambda xs, k: sum(x[k] for x in xs) / len(xs)
res = {"prefill_tok_s": sum(pf) / len(pf), "decode_tok_s": avg(dr, 0), "decode_sampled_tok_s": avg(drs, 0),
       "capped_sampled_tok_s": avg(dcs, 0), "capped_sampled_hit": avg(dcs, 1),
       "capped_greedy_tok_s": avg(dc, 0), "capped_greedy_hit": avg(dc, 1),
       "capped_slot_share": v["expert_slots"] / full_slots, "slots": full_slots}
print("TIDE " + json.dumps(res))
EOF
    else
        log "FAIL tide did not start: $(tail -5 "$OUT/daemon.log")"
    fi
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    grep -E "pinning|expert cache|device 0|error" "$OUT/daemon.log" | tail -6 | tee -a "$S"
    # b) + c) llama.cpp
    LB=${LLAMA_BENCH:-/tmp/llama-bench} # LLAMA_BENCH: a llama-bench built on the device machine
    [ -z "${LLAMA_BENCH:-}" ] && [ -f "$C/llama-bench.xz" ] && python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
        "$C/llama-bench.xz" "$LB" && chmod +x "$LB"
    if [ -x "$LB" ] && [ "$BACKEND" = cuda ]; then
        export LD_LIBRARY_PATH=${LLAMA_LIBS:-}:$LD_LIBRARY_PATH
        log "llama-bench libraries: ${LLAMA_LIBS:-none found}; $(ldd "$LB" | grep -c 'not found') not found"
        cmd="llama-bench -m $M -ngl 99 -p 512 -n 128 -r 3"
        log "\$ $cmd"
        timeout 240 "$LB" -m "$M" -ngl 99 -p 512 -n 128 -r 3 -o jsonl -oe md 2>"$OUT/llama-resident.txt" |
            tee "$OUT/llama.jsonl" | python3 -c "
import json, sys
for l in sys.stdin:
    d = json.loads(l); print('LLAMA', d['n_prompt'], d['n_gen'], round(d['avg_ts'], 1), round(d['stddev_ts'], 1))" | tee -a "$S"
        grep -E "^\|" "$OUT/llama-resident.txt" | tee -a "$S"
        ncm=$((LAYERS / 2))
        cmd="llama-bench -m $M -ngl 99 -p 0 -n 128 -r 3 --n-cpu-moe $ncm"
        log "\$ $cmd"
        timeout 240 "$LB" -m "$M" -ngl 99 -p 0 -n 128 -r 3 --n-cpu-moe "$ncm" -o jsonl -oe md 2>"$OUT/llama-cpumoe.txt" |
            tee -a "$OUT/llama.jsonl" | python3 -c "
import json, sys
for l in sys.stdin:
    d = json.loads(l); print('LLAMA_CPUMOE', d['n_prompt'], d['n_gen'], round(d['avg_ts'], 1), round(d['stddev_ts'], 1), d.get('n_threads'))" | tee -a "$S"
        grep -E "^\|" "$OUT/llama-cpumoe.txt" | tee -a "$S"
    else
        log "llama-bench skipped (no $LB or BACKEND=$BACKEND)"
    fi
    # d) roofline: bytes a decode step must read, over the measured copy bandwidth
    LAYERS=$LAYERS D2D=$d2d python3 - <<'EOF' | tee -a "$S"
import json, os
L, d2d = int(os.environ["LAYERS"]), float(os.environ["D2D"])
q8 = 34 / 32  # bytes per q8_0 weight
E, Q, KV, F, X, K, V = 2048, 4096, 512, 768, 128, 8, 151936
attn = (E * Q + 2 * E * KV + Q * E) * q8
experts = K * 3 * E * F * q8
router = E * X * 4
head = E * V * q8
kv_per_pos = 2 * KV * 4 * L  # K and V, f32 in tide (llama.cpp's default is f16), every layer
pos = 64                      # mean position of a 128-token decode from an empty context
active = L * (attn + experts + router) + head + pos * kv_per_pos
line = f"roofline: active bytes per token {active / 1e9:.3f} GB ({L} layers: attention {L * attn / 1e9:.3f}, experts {L * experts / 1e9:.3f}, router {L * router / 1e9:.3f}, output head {head / 1e9:.3f}, KV at position {pos} {pos * kv_per_pos / 1e6:.1f} MB)"
print(line)
if d2d:
    print(f"roofline: d2d {d2d:.0f} GB/s -> {active / (d2d * 1e9) * 1e3:.3f} ms/token = {d2d * 1e9 / active:.1f} tok/s bound")
    print("ROOF " + json.dumps({"active_bytes": active, "d2d_gbs": d2d, "bound_tok_s": d2d * 1e9 / active}))
EOF
    free -g | head -2 | tee -a "$S"
    log "== done $(date -u +%FT%TZ)"
    ;;
*)
    echo "usage: $0 build|device"; exit 2 ;;
esac
