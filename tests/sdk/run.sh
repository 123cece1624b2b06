#!/usr/bin/env bash
# run.sh - the official OpenAI Node client (npm `openai`, pinned by package-lock.json) against a
# real tide: starts $TIDE_BIN with config/tide.json on a free loopback port with an API key,
# installs the client into tests/sdk/node_modules (npm ci, skipped when already there) and runs
# openai_client.mjs. Usage: tests/sdk/run.sh   (env: TIDE_BIN, default build/tide)
set -euo pipefail
cd "$(dirname "$0")/../.."
TIDE_BIN=${TIDE_BIN:-build/tide}
TMP=$(mktemp -d /tmp/tide-sdk.XXXXXX)
PID=
cleanup() {
  rc=$?
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
  [ $rc -ne 0 ] && { echo "--- tide log (tail)"; tail -n 15 "$TMP/tide.log" || true; }
  rm -rf "$TMP"
  exit $rc
}
trap cleanup EXIT
fail() { echo "FAIL sdk: $*"; exit 1; }
command -v node >/dev/null || fail "node not found (scripts/install-deps.sh installs nodejs)"
[ -x "$TIDE_BIN" ] || fail "$TIDE_BIN is not an executable (run make first)"
if [ ! -f tests/sdk/node_modules/openai/package.json ]; then
  (cd tests/sdk && npm ci --no-audit --no-fund --loglevel=error) || fail "npm ci failed (is the npm registry reachable?)"
fi
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
KEY=sdk-test-key
"$TIDE_BIN" --config config/tide.json --host 127.0.0.1 --port "$PORT" --api-key "$KEY" >"$TMP/tide.log" 2>&1 &
PID=$!
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  kill -0 "$PID" 2>/dev/null || fail "tide exited at start-up"
  sleep 0.1
done
node tests/sdk/openai_client.mjs "http://127.0.0.1:$PORT" "$KEY"
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || fail "/health after the client run"
echo "ok sdk: official OpenAI Node client $(node -p 'require("./tests/sdk/node_modules/openai/package.json").version')"
