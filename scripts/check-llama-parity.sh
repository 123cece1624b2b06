#!/usr/bin/env bash
# Greedy parity with llama.cpp: the same generated GGUF, the same raw prompt, 24 tokens from
# tide's /v1/completions (temperature 0) and from llama.cpp's llama-simple; the texts must match.
# Usage: LLAMA_SIMPLE=/path/to/llama-simple scripts/check-llama-parity.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LS="${LLAMA_SIMPLE:-/tmp/llama.cpp/build/bin/llama-simple}"
[ -x "$LS" ] || { echo "llama-simple not found (set LLAMA_SIMPLE)"; exit 2; }
make -s all
P="The red square and the blue circle are"
tmp=$(mktemp -d); trap 'kill $pid 2>/dev/null; rm -rf "$tmp"' EXIT
fail=0
for preset in dense moe qwen3moe; do
  build/tide-mkmodel --preset $preset --type f32 --out "$tmp/$preset.gguf" >/dev/null
  ref=$("$LS" -m "$tmp/$preset.gguf" -n 24 "$P" 2>/dev/null | python3 -c 'import sys;print(sys.stdin.buffer.read().decode("utf-8","replace").rstrip("\n"))')
  port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  build/tide --port "$port" --model "$tmp/$preset.gguf" >"$tmp/log" 2>&1 & pid=$!
  for _ in $(seq 50); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 0.1; done
  ours=$(curl -s "localhost:$port/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\":\"$P\",\"max_tokens\":24,\"temperature\":0}" |
    python3 -c 'import json,sys;print(json.load(sys.stdin)["choices"][0]["text"])')
  kill $pid; wait $pid 2>/dev/null || true
  if [ "$P$ours" = "$ref" ]; then echo "same: $preset (24 greedy tokens)"; else echo "DIFFERENT: $preset"; echo " llama.cpp: $ref"; echo " tide:      $P$ours"; fail=1; fi
done
exit $fail
