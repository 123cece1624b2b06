#!/usr/bin/env bash
# test_prometheus.sh - a real Prometheus scrapes a real tide and agrees with /v1/vram.
#
# Starts $TIDE_BIN (default build/tide; this script builds nothing) on a free loopback port
# with two 256 MiB CPU devices and a 50/50 layer split merged over config/tide.json, checks
# `promtool check metrics` is silent on the live /metrics, then starts Debian's prometheus on
# another free loopback port (1 s scrape interval, temporary storage), waits for a scrape and
# checks through its query API that tide_expert_slots == /v1/vram totals.expert_slots ==
# sum(tide_device_expert_slots). The daemon has an api_key: /metrics without it must answer 401,
# and Prometheus scrapes with the bearer token of docs/METRICS.md's `authorization` block. Prints SKIP and exits 0 only when /v1/vram answers 404 (the
# endpoint not built yet); anything else that goes wrong is a FAIL. Both servers are killed on
# exit. Usage: tests/e2e/test_prometheus.sh   (env: TIDE_BIN, PROMETHEUS_BIN, PROMTOOL_BIN)
set -euo pipefail
cd "$(dirname "$0")/../.."

TIDE_BIN=${TIDE_BIN:-build/tide}
PROMETHEUS_BIN=${PROMETHEUS_BIN:-$(command -v prometheus || echo /usr/bin/prometheus)}
PROMTOOL_BIN=${PROMTOOL_BIN:-$(command -v promtool || echo /usr/bin/promtool)}
T0=$SECONDS
TMP=$(mktemp -d /tmp/tide-prom.XXXXXX)
TIDE_PID=
PROM_PID=

fail() { echo "FAIL test_prometheus: $*"; exit 1; }
# stop PID: SIGTERM, up to 5 s, then SIGKILL; only ever the two PIDs this script started.
stop() {
  [ -n "$1" ] || return 0
  kill "$1" 2>/dev/null || return 0
  for _ in $(seq 1 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() {
  rc=$?
  stop "$PROM_PID"
  stop "$TIDE_PID"
  if [ $rc -ne 0 ]; then
    echo "--- tide log (tail)"; tail -n 15 "$TMP/tide.log" 2>/dev/null || true
    echo "--- prometheus log (tail)"; tail -n 15 "$TMP/prom.log" 2>/dev/null || true
  fi
  rm -rf "$TMP"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ -x "$TIDE_BIN" ] || fail "$TIDE_BIN is not an executable (run make first, or set TIDE_BIN)"
[ -x "$PROMETHEUS_BIN" ] || fail "prometheus not found (scripts/install-deps.sh installs Debian's prometheus)"
[ -x "$PROMTOOL_BIN" ] || fail "promtool not found (scripts/install-deps.sh installs Debian's prometheus)"
command -v curl >/dev/null || fail "curl not found"
command -v python3 >/dev/null || fail "python3 not found"

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

# Config: config/tide.json with model paths made absolute, the two-device layout merged over it.
python3 - "$TMP/tide.json" <<'PY' || fail "cannot write a config from config/tide.json"
import json, os, sys
c = json.load(open("config/tide.json"))
for k in ("model", "mmproj"):
    if c.get(k) and not os.path.isabs(c[k]):
        c[k] = os.path.abspath(c[k])
c.update({"devices": [{"backend": "cpu", "vram_mib": 256}, {"backend": "cpu", "vram_mib": 256}],
          "layer_split": [0.5, 0.5], "api_key": "prom-test-key"})
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY

KEY=prom-test-key
AUTH="Authorization: Bearer $KEY"
TPORT=$(free_port)
"$TIDE_BIN" --config "$TMP/tide.json" --host 127.0.0.1 --port "$TPORT" >"$TMP/tide.log" 2>&1 &
TIDE_PID=$!
T="http://127.0.0.1:$TPORT"
for _ in $(seq 1 100); do
  code=$(curl -s -o /dev/null -w '%{http_code}' "$T/health" 2>/dev/null || true)
  [ "$code" = 200 ] && break
  kill -0 "$TIDE_PID" 2>/dev/null || fail "tide exited at start-up: $(tail -n 2 "$TMP/tide.log" | tr '\n' ' ')"
  sleep 0.1
done
[ "$code" = 200 ] || fail "tide not healthy after 10 s (last /health: $code)"

code=$(curl -s -o "$TMP/vram.json" -w '%{http_code}' -H "$AUTH" "$T/v1/vram")
if [ "$code" = 404 ]; then
  echo "SKIP test_prometheus: GET /v1/vram answers 404 (not built yet)"
  exit 0
fi
[ "$code" = 200 ] || fail "GET /v1/vram answered $code"

# One short generation, so token counters and latency histograms hold something real.
code=$(curl -s -o "$TMP/chat.json" -w '%{http_code}' -H "$AUTH" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0}' \
  "$T/v1/chat/completions")
[ "$code" = 200 ] || fail "chat completion answered $code: $(head -c 200 "$TMP/chat.json")"

# promtool on the live text: exit 0 and not one line of output (lint warnings count).
# With an api_key, /metrics is behind it (issue 27): the series tell what was sent before.
code=$(curl -s -o /dev/null -w '%{http_code}' "$T/metrics")
[ "$code" = 401 ] || fail "GET /metrics without the key answered $code, not 401"
curl -s -o "$TMP/metrics.txt" -D "$TMP/metrics.hdr" -H "$AUTH" "$T/metrics" || fail "GET /metrics failed"
grep -qi '^content-type: text/plain; version=0.0.4' "$TMP/metrics.hdr" \
  || fail "/metrics content type: $(grep -i '^content-type' "$TMP/metrics.hdr" | tr -d '\r')"
if ! "$PROMTOOL_BIN" check metrics <"$TMP/metrics.txt" >"$TMP/promtool.txt" 2>&1 \
   || [ -s "$TMP/promtool.txt" ]; then
  fail "promtool check metrics: $(head -n 5 "$TMP/promtool.txt" | tr '\n' ' ')"
fi

# A real Prometheus, scraping tide every second into a throw-away TSDB, with the bearer token
# from a file as docs/METRICS.md shows.
PPORT=$(free_port)
printf '%s' "$KEY" >"$TMP/tide.key"
cat >"$TMP/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: tide
    metrics_path: /metrics
    authorization:
      type: Bearer
      credentials_file: $TMP/tide.key
    static_configs:
      - targets: ["127.0.0.1:$TPORT"]
EOF
"$PROMTOOL_BIN" check config "$TMP/prometheus.yml" >"$TMP/checkcfg.txt" 2>&1 \
  || fail "promtool check config: $(tr '\n' ' ' <"$TMP/checkcfg.txt")"
"$PROMETHEUS_BIN" --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/data" \
  --web.listen-address="127.0.0.1:$PPORT" >"$TMP/prom.log" 2>&1 &
PROM_PID=$!
P="http://127.0.0.1:$PPORT"

# query EXPR: prints the value of the single sample of an instant query, or nothing yet.
query() {
  curl -s -G --data-urlencode "query=$1" "$P/api/v1/query" 2>/dev/null | python3 -c '
import json, sys
try:
    d = json.load(sys.stdin)
except ValueError:
    sys.exit(0)
r = d.get("data", {}).get("result", [])
if d.get("status") == "success" and len(r) == 1:
    print(r[0]["value"][1])'
}

got=
for _ in $(seq 1 150); do
  kill -0 "$PROM_PID" 2>/dev/null || fail "prometheus exited: $(tail -n 2 "$TMP/prom.log" | tr '\n' ' ')"
  kill -0 "$TIDE_PID" 2>/dev/null || fail "tide exited while being scraped"
  got=$(query 'tide_expert_slots{job="tide"}' || true)
  [ -n "$got" ] && break
  [ $((SECONDS - T0)) -lt 25 ] || break
  sleep 0.1
done
[ -n "$got" ] || fail "no tide_expert_slots sample in Prometheus after $((SECONDS - T0)) s"
up=$(query 'up{job="tide"}')
[ "$up" = 1 ] || fail "up{job=\"tide\"} is '$up', not 1"
per=$(query 'sum(tide_device_expert_slots{job="tide"})')
ndev=$(query 'count(tide_device_expert_slots{job="tide"})')

# Nothing resizes the caches between the GET /v1/vram above and the scrape, so every view of
# the slot count must agree exactly.
python3 - "$TMP/vram.json" "$TMP/metrics.txt" "$got" "$per" "$ndev" <<'PY' || exit 1
import json, re, sys
vram = json.load(open(sys.argv[1]))
text = open(sys.argv[2]).read()
prom_total, prom_sum, prom_n = float(sys.argv[3]), float(sys.argv[4] or "nan"), sys.argv[5]
want = vram["totals"]["expert_slots"]
devs = vram["devices"]
live_agg = float(re.search(r"^tide_expert_slots (\S+)$", text, re.M).group(1))
live_per = {int(d): float(v) for d, v in
            re.findall(r'^tide_device_expert_slots\{device="(\d+)"\} (\S+)$', text, re.M)}
errs = []
if len(devs) != 2: errs.append("/v1/vram lists %d devices, the config has 2" % len(devs))
if prom_n != str(len(devs)): errs.append("Prometheus sees %s device series, /v1/vram %d" % (prom_n, len(devs)))
if prom_total != want: errs.append("Prometheus tide_expert_slots %g != /v1/vram totals %g" % (prom_total, want))
if prom_sum != want: errs.append("Prometheus sum(tide_device_expert_slots) %g != %g" % (prom_sum, want))
if live_agg != sum(live_per.values()): errs.append("live /metrics: aggregate %g != device sum %s" % (live_agg, live_per))
for d in devs:
    if live_per.get(d["index"]) != d["expert_slots"]:
        errs.append("device %d: /metrics %s, /v1/vram %s" % (d["index"], live_per.get(d["index"]), d["expert_slots"]))
if want <= 0: errs.append("no expert slots at all (%s)" % want)
# The one chat request above went through the queue, prefill and decode: its latencies are in.
def val(series):
    m = re.search("^" + re.escape(series) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")
gen = val("tide_generation_tokens_total")
if not gen >= 1: errs.append("tide_generation_tokens_total %g after a chat request" % gen)
for h in ("tide_queue_time_seconds", "tide_time_to_first_token_seconds", "tide_request_duration_seconds"):
    if not val(h + "_count") >= 1: errs.append("%s_count %g after a chat request" % (h, val(h + "_count")))
if gen >= 2 and not val("tide_inter_token_latency_seconds_count") >= 1:
    errs.append("no inter-token latency after %g tokens" % gen)
# each generated token came out of a scheduler step, and each step with a forward is timed twice
steps = val("tide_step_forward_seconds_count")
if not steps >= 1 or val("tide_step_host_seconds_count") != steps:
    errs.append("tide_step_forward_seconds_count %g (tokens %g), tide_step_host_seconds_count %g"
                % (steps, gen, val("tide_step_host_seconds_count")))
if errs:
    print("FAIL test_prometheus: " + "; ".join(errs))
    sys.exit(1)
print("ok test_prometheus: tide_expert_slots %g == /v1/vram totals == sum over %d devices %s; "
      "promtool clean" % (prom_total, len(devs), sorted(live_per.items())))
PY
echo "test_prometheus: $((SECONDS - T0)) s"
