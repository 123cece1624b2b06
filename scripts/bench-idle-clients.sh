#!/bin/bash
# bench-idle-clients.sh - daemon thread count with many idle streaming clients: one long
# request runs, N SSE clients wait in the queue behind it (keep-alive comments only), and
# ps -o nlwp counts the daemon's threads. Usage: scripts/bench-idle-clients.sh [BIN] [N]
set -u
BIN=${1:-build/tide}
N=${2:-200}
PORT=$((20000 + RANDOM % 20000))
CFG=$(mktemp /tmp/tide-bench-idle.XXXXXX.json)
# all N clients come from 127.0.0.1: lift the per-address connection limit (default 128)
echo "{\"model\":\"models/tide-moe.gguf\",\"context\":4096,\"queue_max\":$((N + 8)),\"http\":{\"max_connections_per_ip\":0}}" > "$CFG"
"$BIN" --config "$CFG" --port "$PORT" > /dev/null 2>&1 &
D=$!
trap 'kill $D 2>/dev/null; wait $D 2>/dev/null; rm -f "$CFG"' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break; sleep 0.1; done
echo "idle: $(ps -o nlwp= -p $D) threads"
URL="http://127.0.0.1:$PORT/v1/chat/completions"
MSG='"messages":[{"role":"user","content":"Hello"}],"temperature":0'
curl -s -o /dev/null "$URL" -H 'Content-Type: application/json' -d "{$MSG,\"max_tokens\":3500}" &
sleep 0.3
PIDS=()
for _ in $(seq "$N"); do
    curl -s -N -o /dev/null "$URL" -H 'Content-Type: application/json' -d "{$MSG,\"max_tokens\":1,\"stream\":true}" &
    PIDS+=($!)
done
sleep 1.5
echo "$N streams queued: $(ps -o nlwp= -p $D) threads, RSS $(ps -o rss= -p $D) KiB"
t0=$(date +%s.%N)
wait "${PIDS[@]}"
echo "all $N streams done after $(echo "$(date +%s.%N) - $t0" | bc) s more"
