#!/usr/bin/env bash
# soak.sh - mixed load against one daemon for a bounded time (issue 7), then a verdict.
#
#   scripts/soak.sh [SECONDS] [CLIENTS] [PORT]   (or env SECONDS / CLIENTS / PORT; default 90 s,
#                                                4 clients, a random port 20000-39999)
#
# Starts $TIDE_BIN (default build/tide) on its own config: one CPU device with a 12 MiB budget
# (so the vision hand-back and POST /v1/vram really shrink the expert cache), the default model
# and mmproj, vision idle_s 2 and vram_mib 4, conversation parking in 2 MiB of host RAM (full after
# a few requests, so the soak parks, restores and evicts all the time and the RSS check sees the
# budget hold). CLIENTS loops then send a random mix: chat and
# legacy completions, streamed chat, image requests (fresh random PNGs made here, sometimes
# one sent before: the embedding cache), streams the client drops part way, POST /v1/vram
# reserve then restore, and GET /v1/vram, /metrics, /health. One more client, alongside them,
# reserves VRAM and restores it every second (POST /v1/vram [k] then null, half a second
# each), so the caches shrink and regrow under the others all the time. The run is cut in cycles: BUSY_S
# (default 15) seconds of load, then an idle gap: every client parks, and the gap lasts until
# the encoder has unloaded and the caches have regrown (at most idle_s + 8 s).
#
# Checks (any failure: exit 1): the daemon never dies and exits 0 on SIGTERM at the end; no
# status other than 200 except the documented 503 (queue full, shutting down: counted, not
# failed); every answer well formed (JSON that parses with the right object, an SSE stream of
# JSON chunks ending in data: [DONE], no error event); every idle gap ends with the vision
# unloaded and the expert slots at full with no reserve; RSS (VmRSS from /proc/PID/status,
# sampled at the end of each gap) never exceeds the value after the warm-up (the first 2
# cycles) by more than RSS_LIMIT_MIB (default 8). bash, curl, jq, xxd, od; no Python.
DURATION=${1:-${SECONDS:-0}}   # bash counts SECONDS up from its environment value: read it first
set -u
[ "$DURATION" -gt 0 ] 2>/dev/null || DURATION=90
CLIENTS=${2:-${CLIENTS:-4}}
PORT=${3:-${PORT:-}}
BUSY_S=${BUSY_S:-15}
RSS_LIMIT_MIB=${RSS_LIMIT_MIB:-8}
IDLE_S=2
BIN=${TIDE_BIN:-build/tide}
MODEL=${TIDE_MODEL:-models/tide-moe.gguf}
MMPROJ=${TIDE_MMPROJ:-models/tide-mmproj.gguf}
for t in curl jq xxd od; do command -v $t >/dev/null || { echo "soak: needs $t"; exit 2; }; done
[ -x "$BIN" ] || { echo "soak: no daemon at $BIN (make first)"; exit 2; }

W=$(mktemp -d /tmp/tide-soak.XXXXXX)
[ -n "$PORT" ] || PORT=$((20000 + RANDOM % 20000))
[ "$PORT" -gt 0 ] 2>/dev/null && [ "$PORT" -lt 65536 ] || { echo "soak: bad port '$PORT'"; exit 2; }
[ "$CLIENTS" -gt 0 ] 2>/dev/null || { echo "soak: bad client count '$CLIENTS'"; exit 2; }
URL="http://127.0.0.1:$PORT"
cat > "$W/cfg.json" <<EOF
{"model":"$MODEL","mmproj":"$MMPROJ","context":1024,"port":$PORT,"queue_max":64,
 "devices":[{"backend":"cpu","vram_mib":12}],
 "vision":{"lazy":true,"idle_s":$IDLE_S,"vram_mib":4},"kv_host_mib":2}
EOF
"$BIN" --config "$W/cfg.json" 2> "$W/daemon.log" > /dev/null &
D=$!
CPIDS=()
cleanup() {
    echo stop > "$W/phase"
    for p in "${CPIDS[@]}"; do kill "$p" 2>/dev/null; done
    kill "$D" 2>/dev/null
    wait 2>/dev/null
    [ -n "${KEEP:-}" ] && echo "soak: kept $W" || rm -rf "$W"
}
trap cleanup EXIT
for _ in $(seq 200); do curl -sf "$URL/health" > /dev/null && break; sleep 0.1; done
curl -sf "$URL/health" > /dev/null || { echo "soak: daemon did not start"; tail "$W/daemon.log"; exit 1; }
FULL=$(curl -s "$URL/v1/vram" | jq '.totals.expert_slots_full')

# ---- PNGs: stored (uncompressed) deflate, CRC-32 and Adler-32 computed here -----------------
CRC_T=()
for ((n = 0; n < 256; n++)); do
    c=$n
    for ((k = 0; k < 8; k++)); do
        if ((c & 1)); then c=$((0xEDB88320 ^ (c >> 1))); else c=$((c >> 1)); fi
    done
    CRC_T[n]=$c
done
crc32_hex() {
    local h=$1 c=$((0xFFFFFFFF)) i
    for ((i = 0; i < ${#h}; i += 2)); do c=$((CRC_T[(c ^ 16#${h:i:2}) & 255] ^ (c >> 8))); done
    printf '%08x' $((c ^ 0xFFFFFFFF))
}
chunk() { printf '%08x%s%s%s' $((${#2} / 2)) "$1" "$2" "$(crc32_hex "$1$2")"; }
# png_b64 W H: a W x H RGB PNG of random pixels, base64
png_b64() {
    local w=$1 h=$2 raw="" y i v a=1 b=0
    local px
    px=$(od -An -v -tx1 -N $((w * h * 3)) /dev/urandom | tr -d ' \n')
    for ((y = 0; y < h; y++)); do raw+="00${px:y*w*6:w*6}"; done
    for ((i = 0; i < ${#raw}; i += 2)); do
        v=$((16#${raw:i:2})); a=$(((a + v) % 65521)); b=$(((b + a) % 65521))
    done
    local n=$((${#raw} / 2)) nn
    nn=$((n ^ 0xFFFF))
    local z
    z=$(printf '780101%02x%02x%02x%02x%s%08x' $((n & 255)) $((n >> 8)) $((nn & 255)) $((nn >> 8)) "$raw" $(((b << 16) | a)))
    { printf '89504e470d0a1a0a'
      chunk 49484452 "$(printf '%08x%08x0802000000' "$w" "$h")"
      chunk 49444154 "$z"
      chunk 49454e44 ""; } | xxd -r -p | base64 -w0
}

# ---- one client ------------------------------------------------------------------------------
PROMPTS=("Hello there" "Count with me: one two" "Tell me about the sea" "What is a tide?" "abc def ghi")
# check_json FILE JQ-EXPR: the reply parses and the expression holds
check_json() { jq -e "$2" "$1" > /dev/null 2>&1; }
# check_sse FILE: every data line but the last is a JSON chunk without an error, the last [DONE]
check_sse() {
    [ "$(grep '^data: ' "$1" | tail -n 1)" = "data: [DONE]" ] || return 1
    grep '^data: ' "$1" | grep -v '^data: \[DONE\]$' | sed 's/^data: //' |
        jq -e -s 'length > 0 and all(.[]; has("error") | not) and all(.[]; .object == "chat.completion.chunk")' \
            > /dev/null 2>&1
}
post() { # post OUT BODYFILE PATH [curl args...] -> prints the HTTP code
    local out=$1 body=$2 path=$3
    shift 3
    curl -s -o "$out" -w '%{http_code}' --max-time 120 -H 'Content-Type: application/json' \
        --data-binary @"$body" "$@" "$URL$path"
}
one_request() {
    local i=$1 r=$((RANDOM % 100)) o="$W/out.$i" bf="$W/body.$i" kind code v=ok
    local p=${PROMPTS[RANDOM % ${#PROMPTS[@]}]} mt=$((4 + RANDOM % 44)) t
    t=$([ $((RANDOM % 2)) = 0 ] && echo 0 || echo 0.8)
    if ((r < 28)); then
        kind=text
        printf '{"messages":[{"role":"user","content":"%s"}],"max_tokens":%d,"temperature":%s,"seed":%d}' \
            "$p" $mt "$t" $RANDOM > "$bf"
        code=$(post "$o" "$bf" /v1/chat/completions)
        [ "$code" != 200 ] || check_json "$o" '.object == "chat.completion" and (.choices[0].message.content | type) == "string" and .usage.completion_tokens > 0' || v=bad_json
    elif ((r < 35)); then
        kind=completion
        printf '{"prompt":"%s","max_tokens":%d,"temperature":%s}' "$p" $mt "$t" > "$bf"
        code=$(post "$o" "$bf" /v1/completions)
        [ "$code" != 200 ] || check_json "$o" '.object == "text_completion" and (.choices[0].text | type) == "string"' || v=bad_json
    elif ((r < 58)); then
        kind=stream
        printf '{"messages":[{"role":"user","content":"%s"}],"max_tokens":%d,"temperature":%s,"stream":true,"stream_options":{"include_usage":%s}}' \
            "$p" $mt "$t" "$([ $((RANDOM % 2)) = 0 ] && echo true || echo false)" > "$bf"
        code=$(post "$o" "$bf" /v1/chat/completions -N)
        [ "$code" != 200 ] || check_sse "$o" || v=bad_sse
    elif ((r < 74)); then
        kind=image
        local img
        if [ -s "$W/img.$i" ] && ((RANDOM % 4 == 0)); then img=$(cat "$W/img.$i"); else
            img=$(png_b64 $((4 + RANDOM % 21)) $((4 + RANDOM % 21))); echo "$img" > "$W/img.$i"; fi
        printf '{"messages":[{"role":"user","content":[{"type":"text","text":"%s"},{"type":"image_url","image_url":{"url":"data:image/png;base64,%s"}}]}],"max_tokens":%d,"temperature":0%s}' \
            "$p" "$img" $((2 + RANDOM % 10)) "$([ $((RANDOM % 2)) = 0 ] && echo ',"stream":true')" > "$bf"
        code=$(post "$o" "$bf" /v1/chat/completions -N)
        if [ "$code" = 200 ]; then
            if grep -q '^data: ' "$o"; then check_sse "$o" || v=bad_sse
            else check_json "$o" '.object == "chat.completion" and .usage.prompt_tokens > 64' || v=bad_json; fi
        fi
    elif ((r < 84)); then
        kind=disconnect # a long stream the client drops after 0.2-1.1 s
        printf '{"messages":[{"role":"user","content":"%s"}],"max_tokens":600,"stream":true}' "$p" > "$bf"
        code=$(post "$o" "$bf" /v1/chat/completions -N --max-time "0.$((2 + RANDOM % 8))")
        [ "$code" = 000 ] && code=200 # cut before the headers: nothing to check
    elif ((r < 93)); then
        kind=vram # reserve, let the others run on the smaller cache, restore
        printf '{"reserve_mib":[%d]}' $((RANDOM % 11)) > "$bf"
        code=$(post "$o" "$bf" /v1/vram)
        [ "$code" != 200 ] || check_json "$o" '(.status == "ok" or .status == "partial") and (.devices | length) == 1' || v=bad_json
        sleep "0.$((RANDOM % 10))"
        if [ "$code" = 200 ] && [ $v = ok ]; then
            echo '{"reserve_mib":null}' > "$bf"
            code=$(post "$o" "$bf" /v1/vram)
            [ "$code" != 200 ] || check_json "$o" '.status == "ok" and .devices[0].reserve_mib == 0' || v=bad_json
        fi
    else
        kind=get
        code=$(curl -s -o "$o" -w '%{http_code}' --max-time 30 "$URL/v1/vram")
        [ "$code" != 200 ] || check_json "$o" '.totals.expert_slots_full > 0' || v=bad_json
        if [ "$code" = 200 ] && [ $v = ok ]; then
            code=$(curl -s -o "$o" -w '%{http_code}' --max-time 30 "$URL/metrics")
            [ "$code" != 200 ] || grep -q '^tide_requests_total' "$o" || v=bad_metrics
        fi
        if [ "$code" = 200 ] && [ $v = ok ]; then
            code=$(curl -s -o "$o" -w '%{http_code}' --max-time 30 "$URL/health")
            [ "$code" != 200 ] || check_json "$o" '.status == "ok"' || v=bad_json
        fi
    fi
    if [ "$code" != 200 ] && [ "$code" != 503 ]; then v=bad_code; fi
    if [ $v != ok ]; then cp "$o" "$W/bad.$i.$RANDOM" 2>/dev/null; fi
    echo "$kind $code $v" >> "$W/log.$i"
}
client() {
    local i=$1 p
    while :; do
        read -r p < "$W/phase" || p=0
        [ "$p" = stop ] && return
        if ((p % 2)); then one_request "$i"; else echo "$p" > "$W/parked.$i.t" && mv "$W/parked.$i.t" "$W/parked.$i"; sleep 0.1; fi
    done
}
# The reserver: while the others run, reserve k MiB and restore every second; it parks with them.
reserver() {
    local o="$W/out.vram" bf="$W/body.vram" p code v
    while :; do
        read -r p < "$W/phase" || p=0
        [ "$p" = stop ] && return
        if ((p % 2 == 0)); then echo "$p" > "$W/parked.vram.t" && mv "$W/parked.vram.t" "$W/parked.vram"; sleep 0.1; continue; fi
        v=ok
        printf '{"reserve_mib":[%d]}' $((1 + RANDOM % 8)) > "$bf"
        code=$(post "$o" "$bf" /v1/vram)
        [ "$code" != 200 ] || check_json "$o" '(.status == "ok" or .status == "partial") and (.devices | length) == 1' || v=bad_json
        sleep 0.5
        echo '{"reserve_mib":null}' > "$bf"
        local code2
        code2=$(post "$o" "$bf" /v1/vram)
        [ "$code2" != 200 ] || check_json "$o" '.status == "ok" and .devices[0].reserve_mib == 0' || v=bad_json
        [ "$code" = 200 ] || [ "$code" = 503 ] || v=bad_code
        [ "$code2" = 200 ] || [ "$code2" = 503 ] || { v=bad_code; code=$code2; }
        if [ $v != ok ]; then cp "$o" "$W/bad.vram.$RANDOM" 2>/dev/null; fi
        echo "reserver $code $v" >> "$W/log.vram"
        sleep 0.5
    done
}
set_phase() { echo "$1" > "$W/phase.t" && mv "$W/phase.t" "$W/phase"; }

# ---- the run ---------------------------------------------------------------------------------
set_phase 0
for ((i = 0; i < CLIENTS; i++)); do client $i & CPIDS+=($!); done
reserver & CPIDS+=($!)
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$D/status" 2>/dev/null || echo 0; }
RSS0=$(rss_kib)
FAIL=()
T0=$(date +%s)
cycle=0 cycles_ok=0 rss_warm=0 rss_max=0 rss_end=0 gap_max=0
while (( $(date +%s) - T0 + IDLE_S + 4 < DURATION )); do
    left=$((DURATION - ($(date +%s) - T0) - IDLE_S - 4))
    set_phase $((2 * cycle + 1))
    sleep $((left < BUSY_S ? left : BUSY_S))
    ph=$((2 * cycle + 2))
    set_phase $ph
    t_idle=$(date +%s.%N)
    for i in $(seq 0 $((CLIENTS - 1))) vram; do
        for _ in $(seq 1500); do [ "$(cat "$W/parked.$i" 2>/dev/null)" = $ph ] && break; sleep 0.1; done
        [ "$(cat "$W/parked.$i" 2>/dev/null)" = $ph ] || FAIL+=("cycle $cycle: client $i did not finish its request in 150 s")
    done
    kill -0 $D 2>/dev/null || { FAIL+=("the daemon died (cycle $cycle)"); break; }
    ok=0
    for _ in $(seq $(((IDLE_S + 8) * 10))); do
        v=$(curl -s --max-time 10 "$URL/v1/vram")
        if echo "$v" | jq -e ".vision.state == \"unloaded\" and .totals.expert_slots == $FULL and .totals.reserve_mib == 0" > /dev/null 2>&1; then ok=1; break; fi
        sleep 0.1
    done
    gap=$(echo "$(date +%s.%N) - $t_idle" | bc)
    if [ $ok = 1 ]; then cycles_ok=$((cycles_ok + 1)); else
        FAIL+=("cycle $cycle: after the idle gap: $(echo "$v" | jq -c '{state: .vision.state, slots: .totals.expert_slots, full: .totals.expert_slots_full, reserve: .totals.reserve_mib}' 2>/dev/null || echo "$v")")
    fi
    (( $(echo "$gap > $gap_max" | bc) )) && gap_max=$gap
    rss=$(rss_kib)
    rss_end=$rss
    if ((cycle == 1)); then rss_warm=$rss; fi
    if ((cycle >= 2 && rss > rss_max)); then rss_max=$rss; fi
    cycle=$((cycle + 1))
done
set_phase stop
for p in "${CPIDS[@]}"; do wait "$p" 2>/dev/null; done
CPIDS=()
METRICS=$(curl -s --max-time 10 "$URL/metrics")
ELAPSED=$(($(date +%s) - T0))
if kill -0 $D 2>/dev/null; then
    kill -TERM $D
    wait $D
    rc=$?
    [ $rc = 0 ] || FAIL+=("the daemon exited $rc on SIGTERM")
else
    wait $D; FAIL+=("the daemon was not running at the end (exit $?)")
fi

# ---- report ----------------------------------------------------------------------------------
cat "$W"/log.* 2>/dev/null > "$W/all"
total=$(wc -l < "$W/all")
echo "soak: ${ELAPSED} s, $CLIENTS clients and the reserver, port $PORT, busy cycles of ${BUSY_S} s, vision idle_s $IDLE_S, expert slots full $FULL"
echo "requests: $total"
awk '{k[$1]++; c[$1" "$2]++} END {for (x in k) {printf "  %-10s %6d  codes:", x, k[x]; for (y in c) {split(y, a, " "); if (a[1] == x) printf " %s x%d", a[2], c[y]}; printf "\n"}}' "$W/all" | sort
n503=$(awk '$2 == 503' "$W/all" | wc -l)
nbad=$(awk '$3 != "ok"' "$W/all" | wc -l)
echo "errors: $nbad malformed or unexpected (by kind/code/verdict below), $n503 documented 503s"
awk '$3 != "ok" {print "  " $0}' "$W/all" | sort | uniq -c | head -20
[ "$nbad" = 0 ] || FAIL+=("$nbad requests with an unexpected status or a malformed answer")
[ "$total" -gt 0 ] || FAIL+=("no requests were made")
loads=$(echo "$METRICS" | awk '/^tide_vision_loads_total/ {print $2}')
unloads=$(echo "$METRICS" | awk '/^tide_vision_unloads_total/ {print $2}')
echo "idle cycles: $cycle, $cycles_ok ended with vision unloaded and slots $FULL/$FULL, reserve 0 (longest gap ${gap_max} s); vision loads ${loads:-?}, unloads ${unloads:-?}"
[ "$cycle" -gt 0 ] || FAIL+=("no idle cycle ran (SECONDS too short)")
mib() { echo "scale=1; $1 / 1024" | bc; }
if ((cycle >= 3)); then
    echo "RSS: start $(mib "$RSS0") MiB, after the 2 warm-up cycles $(mib "$rss_warm") MiB, max after $(mib "$rss_max") MiB, end $(mib "$rss_end") MiB (limit: warm-up + $RSS_LIMIT_MIB MiB)"
    ((rss_max <= rss_warm + RSS_LIMIT_MIB * 1024)) || FAIL+=("RSS grew from $(mib "$rss_warm") to $(mib "$rss_max") MiB after the warm-up")
else
    echo "RSS: start $(mib "$RSS0") MiB, end $(mib "$rss_end") MiB (fewer than 3 cycles: growth not checked)"
fi
if [ ${#FAIL[@]} -gt 0 ]; then
    printf 'FAIL: %s\n' "${FAIL[@]}"
    echo "daemon log (last lines):"
    tail -n 15 "$W/daemon.log"
    exit 1
fi
echo "soak: PASS"
