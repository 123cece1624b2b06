#!/usr/bin/env bash
# test-gpu-2dev.sh - two logical devices on one GPU (issue 9, one-GPU part): a devices list that
# repeats CUDA index 0 with its own vram_mib cap each, the MoE split over both by layer_split.
#
#   scripts/test-gpu-daemon.sh build    # here (same binaries and libs as the daemon check)
#   then through the device tool, carry ["build/tide","build/tide-mkmodel","build/gpu-libs","models"]:
#   scripts/test-gpu-2dev.sh device     # there; logs and a summary under $OUT
# Checks (each prints PASS/FAIL): greedy output of the split equals one CUDA device and the CPU;
# POST /v1/vram [r0, r1] drops nvidia-smi used memory by at least both hand-backs together (the
# two logical devices share the GPU) with each device's slots down; null restores exactly the
# start-up slot counts; a lazy-vision cycle with vision.device = 1 (device 1 capped so that the
# encoder must hand back part of its cache) unloads and regrows device 1.
# SECOND_INDEX=1 puts the second device on GPU 1 (issue 9, on nvidia-h200-x2): the hand-back check
# then wants each GPU's own used memory down by at least its own reserve.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tide-gpu-2dev}
mkdir -p "$OUT"
[ "${1:-device}" = device ] || { echo "usage: $0 device (build with scripts/test-gpu-daemon.sh build)"; exit 2; }
B=${BUILD:-build} # where the carried binaries are
export LD_LIBRARY_PATH=$PWD/$B/gpu-libs
fails=0
S=$OUT/summary-2dev.txt
pass() { echo "PASS $*" | tee -a "$S"; }
fail() { echo "FAIL $*" | tee -a "$S"; fails=$((fails + 1)); }
I1=${SECOND_INDEX:-0} # the second device's CUDA index
used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "${1:-0}" | head -1; }
port=18556
start() { # config json
    echo "$1" >"$OUT/cfg-2dev.json"
    $B/tide --config "$OUT/cfg-2dev.json" >>"$OUT/daemon-2dev.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do curl -sf "localhost:$port/health" >/dev/null && return 0; sleep 0.1; done
    fail "daemon did not start: $(tail -3 "$OUT/daemon-2dev.log")"; return 1
}
stop() { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }
j() { python3 -c "import json,sys;d=json.load(sys.stdin);print($1)"; }
complete() { curl -s -H 'Content-Type: application/json' -d "$text" localhost:$port/v1/completions | j 'd["choices"][0]["text"]'; }
[ -f /tmp/big.gguf ] || $B/tide-mkmodel --preset big --out /tmp/big.gguf >/dev/null
[ -f /tmp/mmproj-1024.gguf ] || $B/tide-mkmodel --preset mmproj --text-embd 1024 --out /tmp/mmproj-1024.gguf >/dev/null
text='{"prompt":"Once upon a time","max_tokens":64,"temperature":0}'
base="\"model\":\"/tmp/big.gguf\",\"port\":$port,\"context\":1024"
start "{$base,\"devices\":[{\"backend\":\"cpu\"}]}" || exit 1
cpu=$(complete); stop
start "{$base,\"devices\":[{\"backend\":\"cuda\",\"index\":0}]}" || exit 1
one=$(complete); stop
dev2='"devices":[{"backend":"cuda","index":0,"vram_mib":700},{"backend":"cuda","index":'$I1',"vram_mib":299}],"layer_split":[3,5]'
start "{$base,$dev2,\"mmproj\":\"/tmp/mmproj-1024.gguf\",\"vision\":{\"lazy\":true,\"idle_s\":2,\"device\":1}}" || exit 1
grep -E "device [01]" "$OUT/daemon-2dev.log" | tail -2 | tee -a "$S"
two=$(complete)
[ -n "$cpu" ] && [ "$cpu" = "$one" ] && [ "$one" = "$two" ] && pass "greedy 64 tokens identical: cpu, one cuda device, split over two" ||
    fail "greedy differs: cpu [$cpu] one [$one] two [$two]"
curl -s localhost:$port/v1/vram >"$OUT/2v0.json"
read -r c0 c1 f0 f1 s0 s1 < <(j '" ".join(str(d["devices"][i][k]) for k in ("expert_cache_mib","free_mib","expert_slots") for i in (0,1))' <"$OUT/2v0.json")
w0=$((c0 / 2)); w1=$((c1 / 2)); u0=$(used_mib 0); m0=$(used_mib "$I1")
curl -s -X POST -H 'Content-Type: application/json' -d "{\"reserve_mib\":[$((f0 + w0)),$((f1 + w1))]}" localhost:$port/v1/vram >"$OUT/2v1.json"
sleep 0.5; u1=$(used_mib 0); m1=$(used_mib "$I1")
read -r t0 t1 < <(j '" ".join(str(d["devices"][i]["expert_slots"]) for i in (0,1))' <"$OUT/2v1.json")
echo "hand-back [$w0, $w1] MiB of caches [$c0, $c1]: nvidia-smi used $u0 -> $u1 MiB, slots [$s0, $s1] -> [$t0, $t1]" | tee -a "$S"
if [ "$I1" = 0 ]; then # one GPU: both hand-backs show in its one total
    [ $((u0 - u1)) -ge $((w0 + w1 - 4)) ] && [ "$t0" -lt "$s0" ] && [ "$t1" -lt "$s1" ] &&
        pass "reserve [r0, r1] returned >= $((w0 + w1)) MiB to the GPU ($((u0 - u1)) MiB), both caches shrank" ||
        fail "used dropped $((u0 - u1)) MiB for [$w0, $w1], slots [$t0, $t1]"
else
    echo "GPU $I1: nvidia-smi used $m0 -> $m1 MiB" | tee -a "$S"
    [ $((u0 - u1)) -ge $((w0 - 4)) ] && [ $((m0 - m1)) -ge $((w1 - 4)) ] && [ "$t0" -lt "$s0" ] && [ "$t1" -lt "$s1" ] &&
        pass "each GPU got its own reserve back: GPU 0 $((u0 - u1)) >= $w0 MiB, GPU $I1 $((m0 - m1)) >= $w1 MiB" ||
        fail "GPU 0 dropped $((u0 - u1)) MiB for $w0, GPU $I1 $((m0 - m1)) MiB for $w1, slots [$t0, $t1]"
fi
[ "$(complete)" = "$cpu" ] && pass "greedy identical with half of each cache" || fail "greedy changed with half of each cache"
curl -s -X POST -H 'Content-Type: application/json' -d '{"reserve_mib":null}' localhost:$port/v1/vram >"$OUT/2v2.json"
read -r r0 r1 < <(j '" ".join(str(d["devices"][i]["expert_slots"]) for i in (0,1))' <"$OUT/2v2.json")
[ "$r0 $r1" = "$s0 $s1" ] && pass "null restores start-up slots [$s0, $s1]" || fail "restore gave [$r0, $r1], not [$s0, $s1]"
img=$(python3 -c "
import base64,struct,zlib
w=h=64
rows=b''.join(b'\x00'+bytes([200,30,30])*w for _ in range(h))
c=lambda t,d: struct.pack('>I',len(d))+t+d+struct.pack('>I',zlib.crc32(t+d)&0xffffffff)
print('data:image/png;base64,'+base64.b64encode(b'\x89PNG\r\n\x1a\n'+c(b'IHDR',struct.pack('>IIBBBBB',w,h,8,2,0,0,0))+c(b'IDAT',zlib.compress(rows))+c(b'IEND',b'')).decode())")
body="{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"What is this?\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"$img\"}}]}],\"max_tokens\":8,\"temperature\":0}"
code=$(curl -s -o "$OUT/img-2dev.json" -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" localhost:$port/v1/chat/completions)
st=$(curl -s localhost:$port/v1/vram | j 'd["vision"]["state"], d["devices"][1]["vision_mib"], d["devices"][0]["expert_slots"], d["devices"][1]["expert_slots"]')
echo "image: $code, then (state, dev1 vision_mib, slots0, slots1) $st" | tee -a "$S"
[ "$code" = 200 ] && pass "image request with vision.device 1" || fail "image request $code: $(head -c 200 "$OUT/img-2dev.json")"
read -r _ vm v0 v1 <<<"$st"
if python3 -c "import sys; sys.exit(0 if $f1 < $vm else 1)"; then # device 1 had less free than the encoder needs
    [ "$v0" = "$s0" ] && [ "$v1" -lt "$s1" ] && pass "the encoder's $vm MiB came from device 1's cache (free $f1 MiB, slots $s1 -> $v1), device 0 untouched" ||
        fail "while the encoder is loaded: slots [$v0, $v1] (want [$s0, < $s1]; device 1 free was $f1 MiB)"
else
    [ "$v0 $v1" = "$s0 $s1" ] && pass "device 1 had room for the encoder ($f1 MiB free): no cache touched" || fail "slots [$v0, $v1] moved with room to spare"
fi
sleep 4
st=$(curl -s localhost:$port/v1/vram | j 'd["vision"]["state"], d["devices"][0]["expert_slots"], d["devices"][1]["expert_slots"]')
case "$st" in "unloaded $s0 $s1") pass "vision unloaded, slots back to [$s0, $s1]" ;; *) fail "after idle: $st (want unloaded $s0 $s1)" ;; esac
grep -E "vision:" "$OUT/daemon-2dev.log" | tail -3 | tee -a "$S"
stop
echo "fails: $fails" | tee -a "$S"
[ "$fails" = 0 ]
