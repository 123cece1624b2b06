#!/usr/bin/env bash
# test-gpu-daemon.sh - the daemon itself on a GPU: elastic expert cache on real VRAM, CPU/CUDA
# greedy parity through the HTTP API, and a lazy-vision cycle with the GPU as vision device.
#
#   scripts/test-gpu-daemon.sh build    # here: build/tide + build/tide-mkmodel (nvcc, static
#                                       #   cudart) and build/gpu-libs/ (the Debian .so files
#                                       #   they need, which the device machine lacks)
#   then through the device tool, carry ["build/tide","build/tide-mkmodel","build/gpu-libs","models"]:
#   scripts/test-gpu-daemon.sh device   # there; logs and a summary under $OUT
# Checks (each prints PASS/FAIL): a reserve raises the GPU's free memory (nvidia-smi) by at
# least the reserve's hand-back; restore brings the slots back to full; greedy output on CUDA
# equals the CPU's; lazy vision hands back and regrows on the GPU; decode tok/s both ways.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tide-gpu-daemon}
mkdir -p "$OUT"

case "${1:-device}" in
build)
    make -j"$(nproc)" build/tide build/tide-mkmodel models
    rm -rf build/gpu-libs && mkdir -p build/gpu-libs
    ldd build/tide | awk '$3 ~ /^\// {print $3}' | grep -vE '/(libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux)' |
        xargs -I{} cp -L {} build/gpu-libs/
    du -sh build/gpu-libs
    ;;
device)
    export LD_LIBRARY_PATH=$PWD/build/gpu-libs
    fails=0
    pass() { echo "PASS $*" | tee -a "$OUT/summary.txt"; }
    fail() { echo "FAIL $*" | tee -a "$OUT/summary.txt"; fails=$((fails + 1)); }
    used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -1; }
    port=18555
    start() { # config json
        echo "$1" >"$OUT/cfg.json"
        build/tide --config "$OUT/cfg.json" >>"$OUT/daemon.log" 2>&1 &
        pid=$!
        for _ in $(seq 1 600); do curl -sf "localhost:$port/health" >/dev/null && return 0; sleep 0.1; done
        fail "daemon did not start: $(tail -3 "$OUT/daemon.log")"; return 1
    }
    stop() { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }
    j() { python3 -c "import json,sys;d=json.load(sys.stdin);print($1)"; }
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
    [ -f /tmp/big.gguf ] || build/tide-mkmodel --preset big --out /tmp/big.gguf >/dev/null
    [ -f /tmp/mmproj-1024.gguf ] || build/tide-mkmodel --preset mmproj --text-embd 1024 --out /tmp/mmproj-1024.gguf >/dev/null
    text='{"prompt":"Once upon a time","max_tokens":64,"temperature":0}'
    # CPU reference
    start "{\"model\":\"/tmp/big.gguf\",\"port\":$port,\"context\":1024,\"devices\":[{\"backend\":\"cpu\"}]}" || exit 1
    cpu=$(curl -s -H 'Content-Type: application/json' -d "$text" localhost:$port/v1/completions | j 'd["choices"][0]["text"]')
    t0=$(date +%s.%N); curl -s -H 'Content-Type: application/json' -d "${text/64/256}" localhost:$port/v1/completions >/dev/null; t1=$(date +%s.%N)
    echo "cpu: 256 tokens in $(python3 -c "print(round($t1 - $t0, 3))") s" | tee -a "$OUT/summary.txt"
    stop
    # CUDA
    start "{\"model\":\"/tmp/big.gguf\",\"port\":$port,\"context\":1024,\"devices\":[{\"backend\":\"cuda\",\"index\":0}],\"mmproj\":\"/tmp/mmproj-1024.gguf\",\"vision\":{\"lazy\":true,\"idle_s\":2}}" || exit 1
    grep "device 0" "$OUT/daemon.log" | tail -1 | tee -a "$OUT/summary.txt"
    gpu=$(curl -s -H 'Content-Type: application/json' -d "$text" localhost:$port/v1/completions | j 'd["choices"][0]["text"]')
    [ -n "$cpu" ] && [ "$cpu" = "$gpu" ] && pass "greedy 64 tokens identical on cpu and cuda" || fail "greedy differs: cpu [$cpu] cuda [$gpu]"
    t0=$(date +%s.%N); curl -s -H 'Content-Type: application/json' -d "${text/64/256}" localhost:$port/v1/completions >/dev/null; t1=$(date +%s.%N)
    echo "cuda: 256 tokens in $(python3 -c "print(round($t1 - $t0, 3))") s" | tee -a "$OUT/summary.txt"
    curl -s localhost:$port/v1/vram >"$OUT/v0.json"
    cache=$(j 'd["devices"][0]["expert_cache_mib"]' <"$OUT/v0.json"); free0=$(j 'd["devices"][0]["free_mib"]' <"$OUT/v0.json")
    slots0=$(j 'd["devices"][0]["expert_slots"]' <"$OUT/v0.json")
    u0=$(used_mib)
    want=$((cache / 2))
    tb=$(date +%s.%N)
    curl -s -X POST -H 'Content-Type: application/json' -d "{\"reserve_mib\":$((free0 + want))}" localhost:$port/v1/vram >"$OUT/v1.json"
    te=$(date +%s.%N)
    sleep 0.5; u1=$(used_mib)
    slots1=$(j 'd["devices"][0]["expert_slots"]' <"$OUT/v1.json")
    echo "hand-back: cache $cache MiB, asked $want MiB, nvidia-smi used $u0 -> $u1 MiB, slots $slots0 -> $slots1, POST $(python3 -c "print(round(($te - $tb) * 1000, 1))") ms" | tee -a "$OUT/summary.txt"
    [ $((u0 - u1)) -ge $((want - 2)) ] && pass "reserve returned >= $want MiB to the GPU ($((u0 - u1)) MiB)" || fail "GPU used only dropped $((u0 - u1)) MiB for a $want MiB hand-back"
    gpu2=$(curl -s -H 'Content-Type: application/json' -d "$text" localhost:$port/v1/completions | j 'd["choices"][0]["text"]')
    [ "$gpu2" = "$cpu" ] && pass "greedy identical with half the cache" || fail "greedy changed with half the cache"
    tb=$(date +%s.%N)
    curl -s -X POST -H 'Content-Type: application/json' -d '{"reserve_mib":null}' localhost:$port/v1/vram >"$OUT/v2.json"
    te=$(date +%s.%N)
    slots2=$(j 'd["devices"][0]["expert_slots"]' <"$OUT/v2.json"); u2=$(used_mib)
    echo "regrow: slots $slots2, used $u2 MiB, POST $(python3 -c "print(round(($te - $tb) * 1000, 1))") ms" | tee -a "$OUT/summary.txt"
    [ "$slots2" = "$slots0" ] && pass "restore back to $slots0 slots" || fail "restore gave $slots2 slots, not $slots0"
    grep "vram: reserve applied" "$OUT/daemon.log" | tail -2 | tee -a "$OUT/summary.txt"
    # lazy vision on the GPU device
    img=$(python3 -c "
import base64,struct,zlib
w=h=64
rows=b''.join(b'\x00'+bytes([200,30,30])*w for _ in range(h))
c=lambda t,d: struct.pack('>I',len(d))+t+d+struct.pack('>I',zlib.crc32(t+d)&0xffffffff)
print('data:image/png;base64,'+base64.b64encode(b'\x89PNG\r\n\x1a\n'+c(b'IHDR',struct.pack('>IIBBBBB',w,h,8,2,0,0,0))+c(b'IDAT',zlib.compress(rows))+c(b'IEND',b'')).decode())")
    body="{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"What is this?\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"$img\"}}]}],\"max_tokens\":8,\"temperature\":0}"
    code=$(curl -s -o "$OUT/img.json" -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" localhost:$port/v1/chat/completions)
    st=$(curl -s localhost:$port/v1/vram | j 'd["vision"]["state"], d["devices"][0]["vision_mib"], d["devices"][0]["expert_slots"]')
    echo "image: $code, then $st" | tee -a "$OUT/summary.txt"
    [ "$code" = 200 ] && pass "image request on the GPU device" || fail "image request $code: $(head -c 200 "$OUT/img.json")"
    sleep 4
    st=$(curl -s localhost:$port/v1/vram | j 'd["vision"]["state"], d["devices"][0]["expert_slots"]')
    echo "after idle: $st" | tee -a "$OUT/summary.txt"
    case "$st" in "unloaded $slots0") pass "vision unloaded, slots back to $slots0" ;; *) fail "after idle: $st (want unloaded $slots0)" ;; esac
    grep -E "vision:" "$OUT/daemon.log" | tail -3 | tee -a "$OUT/summary.txt"
    stop
    echo "fails: $fails" | tee -a "$OUT/summary.txt"
    [ "$fails" = 0 ]
    ;;
*)
    echo "usage: $0 build|device"; exit 2 ;;
esac
