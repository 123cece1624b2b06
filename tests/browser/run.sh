#!/usr/bin/env bash
# run.sh - the page at GET / in a real browser: Debian's chromium (headless, no sandbox) driven
# by playwright-core (npm, pinned by package-lock.json). Starts $TIDE_BIN on a free loopback port
# with an API key and models made here by tide-mkmodel (two CPU devices of 64 and 48 MiB, lazy
# vision) and runs page.mjs; screenshots go to tests/browser/out/. Usage: tests/browser/run.sh
# (env: TIDE_BIN, default build/tide; MKMODEL, default next to TIDE_BIN; CHROMIUM, /usr/bin/chromium)
set -euo pipefail
cd "$(dirname "$0")/../.."
TIDE_BIN=${TIDE_BIN:-build/tide}
MKMODEL=${MKMODEL:-$(dirname "$TIDE_BIN")/tide-mkmodel}
export CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
TMP=$(mktemp -d /tmp/tide-browser.XXXXXX)
PID=
cleanup() {
  rc=$?
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
  [ $rc -ne 0 ] && { echo "--- tide log (tail)"; tail -n 15 "$TMP/tide.log" || true; }
  rm -rf "$TMP"
  exit $rc
}
trap cleanup EXIT
fail() { echo "FAIL browser: $*"; exit 1; }
command -v node >/dev/null || fail "node not found (scripts/install-deps.sh installs nodejs)"
[ -x "$CHROMIUM" ] || fail "$CHROMIUM not found (scripts/install-deps.sh installs chromium)"
[ -x "$TIDE_BIN" ] || fail "$TIDE_BIN is not an executable (run make first)"
[ -x "$MKMODEL" ] || fail "$MKMODEL is not an executable (run make first)"
if [ ! -f tests/browser/node_modules/playwright-core/package.json ]; then
  (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error) || fail "npm ci failed (is the npm registry reachable?)"
fi
"$MKMODEL" --preset moe --out "$TMP/moe.gguf" >/dev/null
"$MKMODEL" --preset mmproj --text-embd 128 --out "$TMP/mmproj.gguf" >/dev/null
cat >"$TMP/tide.json" <<JSON
{ "model": "$TMP/moe.gguf", "mmproj": "$TMP/mmproj.gguf", "context": 1024, "threads": 2,
  "devices": [{"backend": "cpu", "vram_mib": 64}, {"backend": "cpu", "vram_mib": 48}],
  "layer_split": [0.5, 0.5], "vram_elastic": true,
  "vision": {"lazy": true, "idle_s": 120, "device": 0} }
JSON
KEY=browser-test-key
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
# every step at least 4 ms (the fault hook), so the page's 1 s poll sees the concurrent streams run
TIDE_FAULT_SLOW_TOKEN_MS=4 "$TIDE_BIN" --config "$TMP/tide.json" --host 127.0.0.1 --port "$PORT" --api-key "$KEY" >"$TMP/tide.log" 2>&1 &
PID=$!
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  kill -0 "$PID" 2>/dev/null || fail "tide exited at start-up"
  sleep 0.1
done
mkdir -p tests/browser/out
timeout 120 node tests/browser/page.mjs "http://127.0.0.1:$PORT" tests/browser/out "$KEY"
