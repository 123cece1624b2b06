#!/usr/bin/env bash
# test_deploy.sh - the shipped deploy/ kit, run for real on loopback (issue 24).
#
# 1. Static: `promtool check config` / `check rules` on deploy/prometheus, `nginx -t` on
#    deploy/nginx/tide.conf, `systemd-analyze verify` on deploy/systemd/tide@.service (each a
#    silent pass; systemd-analyze is skipped with a message where it cannot run).
# 2. Three daemons ($TIDE_BIN, the default tiny model on one CPU device each, names tide-a/b/c)
#    behind Debian's nginx with the shipped config (only addresses, listen port and fail_timeout
#    rewritten), started as this script's own processes in a temp prefix, never the system service.
#    - kill: 30 streaming clients; SIGKILL tide-c. Only requests in flight on tide-c fail, later
#      ones go to tide-a/b; after a restart tide-c gets traffic again.
#    - drain: 30 streaming clients; SIGTERM tide-b: GET /ready turns 503 "draining", a new request
#      to it gets 503 + Retry-After, it exits 0, and no client sees an error.
#    - affinity: the shipped hash variant; turn 2 of each conversation lands where turn 1 did.
# 3. A real Prometheus with the shipped scrape config and rules (targets and intervals rewritten)
#    scrapes all three; sum(tide_expert_slots) equals the sum of the three /v1/vram totals.
# Every process is this script's own and is killed on exit.
# Usage: tests/e2e/test_deploy.sh   (env: TIDE_BIN, NGINX_BIN, PROMETHEUS_BIN, PROMTOOL_BIN)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

TIDE_BIN=$(realpath "${TIDE_BIN:-build/tide}")
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
PROMETHEUS_BIN=${PROMETHEUS_BIN:-$(command -v prometheus || echo /usr/bin/prometheus)}
PROMTOOL_BIN=${PROMTOOL_BIN:-$(command -v promtool || echo /usr/bin/promtool)}
CLIENTS="python3 $ROOT/tests/e2e/deploy_clients.py"
T0=$SECONDS
TMP=$(mktemp -d /tmp/tide-deploy.XXXXXX)
chmod 755 "$TMP"   # nginx workers (another user when run as root) read their config here
declare -A PID=()
NAMES=(tide-a tide-b tide-c)

fail() { echo "FAIL test_deploy: $*"; exit 1; }
# stop PID: SIGTERM, up to 5 s, then SIGKILL; only ever PIDs this script started.
stop() {
  [ -n "${1:-}" ] || return 0
  kill "$1" 2>/dev/null || return 0
  for _ in $(seq 1 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() {
  rc=$?
  for k in "${!PID[@]}"; do stop "${PID[$k]}"; done
  if [ $rc -ne 0 ]; then
    for f in "$TMP"/*.log "$TMP"/nginx*/error.log; do
      [ -s "$f" ] && { echo "--- $f (tail)"; tail -n 8 "$f"; }
    done
  fi
  rm -rf "$TMP"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ -x "$TIDE_BIN" ] || fail "$TIDE_BIN is not an executable (run make first, or set TIDE_BIN)"
[ -x "$NGINX_BIN" ] || fail "nginx not found (scripts/install-deps.sh installs Debian's nginx)"
[ -x "$PROMETHEUS_BIN" ] || fail "prometheus not found (scripts/install-deps.sh installs Debian's prometheus)"
[ -x "$PROMTOOL_BIN" ] || fail "promtool not found"
[ -f models/tide-moe.gguf ] || fail "models/tide-moe.gguf missing (make builds it)"
command -v curl >/dev/null || fail "curl not found"

# --- 1. static checks of the shipped files -------------------------------------------------
quiet_ok() { # name cmd...: the command exits 0; its output is kept for the failure message
  local name=$1; shift
  "$@" >"$TMP/check.txt" 2>&1 || fail "$name: $(tr '\n' ' ' <"$TMP/check.txt" | head -c 400)"
}
quiet_ok "promtool check config" "$PROMTOOL_BIN" check config deploy/prometheus/prometheus.yml
quiet_ok "promtool check rules" "$PROMTOOL_BIN" check rules deploy/prometheus/tide-recording.yml \
  deploy/prometheus/tide-alerts.yml
mkdir -p "$TMP/sd"
sed "s#/usr/local/bin/tide#$TIDE_BIN#" deploy/systemd/tide@.service >"$TMP/sd/tide@0.service"
if command -v systemd-analyze >/dev/null && systemd-analyze --version >/dev/null 2>&1; then
  # verify exits 0 on warnings (an unknown key...): any output at all is a failure.
  (cd "$TMP/sd" && systemd-analyze verify ./tide@0.service) >"$TMP/check.txt" 2>&1 || true
  [ -s "$TMP/check.txt" ] && fail "systemd-analyze verify tide@.service: $(tr '\n' ' ' <"$TMP/check.txt")"
  echo "ok test_deploy: systemd-analyze verify deploy/systemd/tide@.service is silent"
else
  echo "SKIP test_deploy: systemd-analyze cannot run here; deploy/systemd/tide@.service not verified"
fi

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
PORTS=($(free_port) $(free_port) $(free_port))
NPORT=$(free_port); HPORT=$(free_port); PPORT=$(free_port)

# --- 2. three daemons ------------------------------------------------------------------------
cat >"$TMP/tide.json" <<EOF
{"model": "$ROOT/models/tide-moe.gguf", "context": 1024, "threads": 1, "queue_max": 64,
 "devices": [{"backend": "cpu", "vram_mib": 64}], "drain_timeout_s": 20}
EOF
# Every token takes >= 2 ms (the daemon's fault hook): a 32-token request lasts ~0.07 s on any
# machine, so a kill or a SIGTERM always finds requests running and queued.
start_daemon() { # i
  TIDE_FAULT_SLOW_TOKEN_MS=2 "$TIDE_BIN" --config "$TMP/tide.json" --port "${PORTS[$1]}" --name "${NAMES[$1]}" \
    >>"$TMP/${NAMES[$1]}.log" 2>&1 &
  PID[${NAMES[$1]}]=$!
}
wait_ready() { # i
  for _ in $(seq 1 100); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${PORTS[$1]}/ready" || true)" = 200 ] && return 0
    kill -0 "${PID[${NAMES[$1]}]}" 2>/dev/null || fail "${NAMES[$1]} exited at start-up"
    sleep 0.1
  done
  fail "${NAMES[$1]}: GET /ready not 200 after 10 s"
}
for i in 0 1 2; do start_daemon $i; done

# nginx: the shipped file with only the upstream addresses, the listen port and fail_timeout
# rewritten; `variant` = hash switches to the documented affinity variant.
render_nginx() { # dir listen_port variant
  local d=$1
  mkdir -p "$d"
  sed -e "s/127\.0\.0\.1:8081/127.0.0.1:${PORTS[0]}/; s/127\.0\.0\.1:8082/127.0.0.1:${PORTS[1]}/" \
      -e "s/127\.0\.0\.1:8083/127.0.0.1:${PORTS[2]}/; s/^\(\s*\)listen 8080;/\1listen 127.0.0.1:$2;/" \
      -e "s/fail_timeout=10s/fail_timeout=2s/" deploy/nginx/tide.conf >"$d/tide.conf"
  if [ "$3" = hash ]; then
    sed -i -e 's/^\(\s*\)least_conn;/\1# least_conn;/' -e 's/^\(\s*\)# hash \$tide_session_key consistent;/\1hash $tide_session_key consistent;/' "$d/tide.conf"
    grep -q '^\s*hash \$tide_session_key consistent;' "$d/tide.conf" || fail "tide.conf: no hash variant line to enable"
  fi
  for p in "${PORTS[@]}" "$2"; do grep -q "127.0.0.1:$p" "$d/tide.conf" || fail "tide.conf: address or listen line not found"; done
  grep -q 'fail_timeout=2s' "$d/tide.conf" || fail "tide.conf: no fail_timeout=10s to rewrite"
  local user=; [ "$(id -u)" = 0 ] && user="user $(id -un) $(id -gn);"
  cat >"$d/nginx.conf" <<EOF
$user
worker_processes 1;
pid $d/nginx.pid;
error_log $d/error.log warn;
events { worker_connections 1024; }
http {
  access_log $d/access.log;
  client_body_temp_path $d/body; proxy_temp_path $d/proxy; fastcgi_temp_path $d/fastcgi;
  uwsgi_temp_path $d/uwsgi; scgi_temp_path $d/scgi;
  include $d/tide.conf;
}
EOF
  quiet_ok "nginx -t ($3)" "$NGINX_BIN" -t -p "$d" -e "$d/error.log" -c "$d/nginx.conf"
}
start_nginx() { # dir name
  "$NGINX_BIN" -p "$1" -e "$1/error.log" -c "$1/nginx.conf" -g 'daemon off;' >>"$1/stdout.log" 2>&1 &
  PID[$2]=$!
}
render_nginx "$TMP/nginx" "$NPORT" least_conn
render_nginx "$TMP/nginx-hash" "$HPORT" hash
start_nginx "$TMP/nginx" nginx
start_nginx "$TMP/nginx-hash" nginx-hash

# Prometheus: the shipped config and rules, targets and intervals rewritten.
mkdir -p "$TMP/prom"
cp deploy/prometheus/tide-recording.yml deploy/prometheus/tide-alerts.yml "$TMP/prom/"
sed -e "s/127\.0\.0\.1:8081/127.0.0.1:${PORTS[0]}/; s/127\.0\.0\.1:8082/127.0.0.1:${PORTS[1]}/" \
    -e "s/127\.0\.0\.1:8083/127.0.0.1:${PORTS[2]}/; s/: 15s/: 1s/" \
    deploy/prometheus/prometheus.yml >"$TMP/prom/prometheus.yml"
quiet_ok "promtool check config (rewritten)" "$PROMTOOL_BIN" check config "$TMP/prom/prometheus.yml"
"$PROMETHEUS_BIN" --config.file="$TMP/prom/prometheus.yml" --storage.tsdb.path="$TMP/prom/data" \
  --web.listen-address="127.0.0.1:$PPORT" >"$TMP/prom.log" 2>&1 &
PID[prometheus]=$!

for i in 0 1 2; do wait_ready $i; done
for _ in $(seq 1 50); do curl -s -o /dev/null "http://127.0.0.1:$NPORT/health" && break; sleep 0.1; done
echo "test_deploy: 3 daemons, 2 nginx, prometheus up after $((SECONDS - T0)) s"

# analyse FILE MODE [times...]: python checks over the load records (see each mode).
analyse() { python3 - "$@" <<'PY'
import json, sys
path, mode, args = sys.argv[1], sys.argv[2], [float(a) for a in sys.argv[3:]]
recs = [json.loads(l) for l in open(path)]
fails = [r for r in recs if not r["ok"]]
by = lambda rs: {n: sum(1 for r in rs if r["instance"] == n) for n in ("tide-a", "tide-b", "tide-c")}
errs = []
if mode == "kill":
    t_before, t_kill, t_restart, t_back = args
    in_flight_c = [r for r in recs if r["instance"] == "tide-c" and r["start"] < t_kill and r["end"] > t_before]
    for r in fails:
        if not (r["instance"] == "tide-c" and r["start"] < t_kill):
            errs.append("a request not in flight on tide-c failed: %s" % json.dumps(r)[:300])
    if len(fails) > len(in_flight_c): errs.append("%d failed, %d were in flight on tide-c" % (len(fails), len(in_flight_c)))
    if not fails: errs.append("SIGKILL of tide-c under load failed no request: was it in flight at all?")
    # sent after the kill and before the restart: nginx can only have given them to tide-a/b
    between = [r for r in recs if t_kill + 0.5 < r["start"] < t_restart - 0.2]
    if not between: errs.append("no request between the kill and the restart")
    if any(r["instance"] == "tide-c" or not r["ok"] for r in between):
        errs.append("after the kill: %s, failed %d" % (by(between), sum(not r["ok"] for r in between)))
    back = [r for r in recs if r["start"] > t_back]
    if not by(back)["tide-c"]: errs.append("after the restart tide-c got no traffic: %s" % by(back))
    if any(not r["ok"] for r in back): errs.append("failures after the restart")
    print("kill: %d requests, %d failed (all on tide-c, of %d in flight there); between kill and restart %s; "
          "after restart %s" % (len(recs), len(fails), len(in_flight_c), by(between), by(back)))
elif mode == "drain":
    t_term, = args
    if fails: errs.append("%d client errors during the drain, e.g. %s" % (len(fails), json.dumps(fails[0])[:300]))
    finished_b = [r for r in recs if r["instance"] == "tide-b" and r["start"] < t_term < r["end"]]
    if not finished_b: errs.append("tide-b finished no request that was queued or running at SIGTERM")
    late_b = [r for r in recs if r["instance"] == "tide-b" and r["start"] > t_term + 0.2]
    if late_b: errs.append("%d requests sent after SIGTERM were answered by tide-b" % len(late_b))
    print("drain: %d requests, 0 failed; tide-b finished %d in flight at SIGTERM; after it %s"
          % (len(recs), len(finished_b), by([r for r in recs if r["start"] > t_term + 0.2])))
if errs:
    print("FAIL test_deploy: " + "; ".join(errs)); sys.exit(1)
PY
}

# --- kill: SIGKILL tide-c under 30 streaming clients ----------------------------------------
N="http://127.0.0.1:$NPORT"
$CLIENTS load "$N" 13 30 "$TMP/kill.jsonl" &
LOAD=$!; PID[load]=$LOAD
sleep 2.5
t_before=$(date +%s.%N)
kill -9 "${PID[tide-c]}"; wait "${PID[tide-c]}" 2>/dev/null || true
unset 'PID[tide-c]'
t_kill=$(date +%s.%N)
sleep 3.5
t_restart=$(date +%s.%N)
start_daemon 2; wait_ready 2
t_back=$(python3 -c "import time; print(time.time() + 2.5)")   # fail_timeout 2s, then one probe
wait $LOAD || fail "the kill load clients crashed"
unset 'PID[load]'
analyse "$TMP/kill.jsonl" kill "$t_before" "$t_kill" "$t_restart" "$t_back"

# --- drain: SIGTERM tide-b under 30 streaming clients ---------------------------------------
$CLIENTS load "$N" 6 30 "$TMP/drain.jsonl" &
LOAD=$!; PID[load]=$LOAD
B="http://127.0.0.1:${PORTS[1]}"
# SIGTERM once tide-b has a queue (>= 4 waiting), so that there is something to drain.
for _ in $(seq 1 100); do
  w=$(curl -s "$B/metrics" | awk '$1 == "tide_requests_waiting" {print $2}')
  [ "${w:-0}" -ge 4 ] && break
  sleep 0.03
done
[ "${w:-0}" -ge 4 ] || fail "tide-b never had 4 requests waiting under load (last: '$w')"
t_term=$(date +%s.%N)
kill -TERM "${PID[tide-b]}"
# "At once": as soon as the daemon's main thread has taken the signal (well within 1 s).
for _ in $(seq 1 50); do
  ready=$(curl -s -w ' %{http_code}' "$B/ready" || true)
  case "$ready" in *' 200') sleep 0.02;; *) break;; esac
done
newreq=$(curl -s -D - -o /dev/null -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}' "$B/v1/chat/completions" | tr -d '\r' || true)
case "$ready" in *'"status":"draining"'*' 503') ;; *) fail "GET /ready on tide-b right after SIGTERM: $ready";; esac
echo "$newreq" | grep -q '^HTTP/1.1 503' || fail "a new request during the drain: $(echo "$newreq" | head -1)"
echo "$newreq" | grep -qi '^Retry-After: [0-9]' || fail "a new request during the drain: no Retry-After"
rc=0; wait "${PID[tide-b]}" || rc=$?
unset 'PID[tide-b]'
t_exit=$(date +%s.%N)
[ $rc -eq 0 ] || fail "tide-b exited $rc after SIGTERM, not 0"
grep -q 'drained' "$TMP/tide-b.log" || fail "tide-b did not log 'drained'"
wait $LOAD || fail "the drain load clients crashed"
unset 'PID[load]'
analyse "$TMP/drain.jsonl" drain "$t_term"
echo "drain: tide-b exited 0, $(python3 -c "print('%.2f' % ($t_exit - $t_term))") s after SIGTERM"
start_daemon 1; wait_ready 1

# --- affinity: the hashed variant keeps a conversation on one daemon ------------------------
$CLIENTS affinity "http://127.0.0.1:$HPORT" 12 >"$TMP/affinity.txt"
python3 - "$TMP/affinity.txt" <<'PY' || exit 1
import sys
rows = [l.split() for l in open(sys.argv[1])]
bad = [r for r in rows if len(r) != 3 or r[1] != r[2]]
used = {r[1] for r in rows}
if len(rows) != 12 or bad or len(used) < 2:
    print("FAIL test_deploy: affinity: %d conversations, moved or failed: %s; daemons used %s" % (len(rows), bad, used))
    sys.exit(1)
print("affinity: 12 conversations, turn 2 on turn 1's daemon each time; spread over %s" % sorted(used))
PY

# --- Prometheus: all three scraped, tide_expert_slots summed over them ----------------------
P="http://127.0.0.1:$PPORT"
query() {
  curl -s -G --data-urlencode "query=$1" "$P/api/v1/query" 2>/dev/null | python3 -c '
import json, sys
try: d = json.load(sys.stdin)
except ValueError: sys.exit(0)
r = d.get("data", {}).get("result", [])
if d.get("status") == "success" and len(r) == 1: print(r[0]["value"][1])'
}
want=0
for i in 0 1 2; do
  s=$(curl -s "http://127.0.0.1:${PORTS[$i]}/v1/vram" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["instance"]; print(int(d["totals"]["expert_slots"]))') \
    || fail "GET /v1/vram on ${NAMES[$i]}: no instance or totals"
  want=$((want + s))
done
got=; up=; rec=; names=
for _ in $(seq 1 100); do
  kill -0 "${PID[prometheus]}" 2>/dev/null || fail "prometheus exited"
  up=$(query 'count(up{job="tide"} == 1)'); got=$(query 'sum(tide_expert_slots{job="tide"})')
  rec=$(query 'job:tide_expert_slots:sum{job="tide"}'); names=$(query 'count(count by (instance_name) (tide_instance_info))')
  [ "$up" = 3 ] && [ "$got" = "$want" ] && [ "$rec" = "$want" ] && [ "$names" = 3 ] && break
  sleep 0.2
done
[ "$up" = 3 ] && [ "$got" = "$want" ] && [ "$rec" = "$want" ] && [ "$names" = 3 ] \
  || fail "prometheus: up targets '$up' (want 3), sum(tide_expert_slots) '$got', recording rule '$rec' (want $want), instance names '$names'"
echo "prometheus: 3 targets up, sum(tide_expert_slots) = job:tide_expert_slots:sum = $want = sum of /v1/vram totals"
echo "ok test_deploy: $((SECONDS - T0)) s"
