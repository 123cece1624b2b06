#!/usr/bin/env bash
# Greedy parity with llama.cpp: the same generated GGUF, the same raw prompt, 24 tokens from
# tide's /v1/completions (temperature 0) and from llama.cpp's llama-simple; the texts must match.
# Step 0's logits too: the 5 most likely first tokens' log-probabilities from tide (top_logprobs,
# at most 5 on /v1/completions)
# and from llama.cpp (scripts/llama-logits.c, built here against the llama.cpp build in
# LLAMA_DIR, f32 KV cache, no flash attention) must agree within 1e-4 (the same tokens, the same
# values). The greedy texts come from both programs' default KV cache (f16 on both); the step-0
# logits from tide with --kv-type f32, as llama-logits' cache.
# Usage: LLAMA_SIMPLE=/path/to/llama-simple LLAMA_DIR=/path/to/llama.cpp [PRESETS="gpt-oss ..."] scripts/check-llama-parity.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LS="${LLAMA_SIMPLE:-/tmp/llama.cpp/build/bin/llama-simple}"
LD="${LLAMA_DIR:-/tmp/llama.cpp}"
[ -x "$LS" ] || { echo "llama-simple not found (set LLAMA_SIMPLE)"; exit 2; }
make -s all
P="The red square and the blue circle are"
tmp=$(mktemp -d); trap 'kill $pid 2>/dev/null || true; rm -rf "$tmp"' EXIT # set -e: a failed kill in the trap would turn the exit status into 1
pid=
LL=
if [ -f "$LD/include/llama.h" ] && [ -e "$LD/build/bin/libllama.so" ]; then
  cc -O2 -std=c11 scripts/llama-logits.c -I"$LD/include" -I"$LD/ggml/include" -L"$LD/build/bin" -lllama -lm \
    -Wl,-rpath,"$LD/build/bin" -o "$tmp/llama-logits" && LL="$tmp/llama-logits"
fi
[ -n "$LL" ] || echo "(no libllama in LLAMA_DIR=$LD: greedy texts only, no step-0 logits)"
# both texts lose a tail of control bytes and U+FFFD: a last token that is part of a UTF-8
# character is raw bytes in llama.cpp's output and held back by tide (the tokens are the same)
TAIL='import json,sys;junk="".join(map(chr,range(32)))+"\ufffd";'
fail=0
for preset in ${PRESETS:-dense moe qwen3moe qwen2moe gpt-oss olmoe granitemoe granitemoe-shared qwen3vlmoe qwen2vl deepseek2}; do
  # PRESET:TYPE runs a preset in another type (gpt-oss:mxfp4); the default is f32
  type=f32; case $preset in *:*) type=${preset#*:}; preset=${preset%%:*};; esac
  build/tide-mkmodel --preset $preset --type $type --out "$tmp/$preset.gguf" >/dev/null
  # deepseek2: llama-simple's f16 KV cache flips a near tie at token 16 (0.022 apart; with the
  # f32 cache llama.cpp's 24 tokens are tide's), so its greedy reference is llama-logits' (f32 KV)
  gen=("$LS" -m "$tmp/$preset.gguf" -n 24 "$P")
  [ "$preset" = deepseek2 ] && [ -n "$LL" ] && gen=("$LL" "$tmp/$preset.gguf" "$P" 5 24)
  ref=$("${gen[@]}" 2>/dev/null | python3 -c "$TAIL"'print(sys.stdin.buffer.read().decode("utf-8","replace").rstrip(junk))')
  port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  build/tide --port "$port" --model "$tmp/$preset.gguf" >"$tmp/log" 2>&1 & pid=$!
  for _ in $(seq 50); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 0.1; done
  ours=$(curl -s "localhost:$port/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\":\"$P\",\"max_tokens\":24,\"temperature\":0}" |
    python3 -c "$TAIL"'print(json.load(sys.stdin)["choices"][0]["text"].rstrip(junk))')
  kill $pid; wait $pid 2>/dev/null || true
  if [ -n "$LL" ]; then
    build/tide --port "$port" --model "$tmp/$preset.gguf" --kv-type f32 >"$tmp/log" 2>&1 & pid=$!
    for _ in $(seq 50); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 0.1; done
    curl -s "localhost:$port/v1/completions" -H 'Content-Type: application/json' \
      -d "{\"prompt\":\"$P\",\"max_tokens\":1,\"temperature\":0,\"logprobs\":5}" >"$tmp/ours.json"
    kill $pid; wait $pid 2>/dev/null || true
    "$LL" "$tmp/$preset.gguf" "$P" 5 >"$tmp/ref.json"
  fi
  if [ "$P$ours" = "$ref" ]; then echo "same: $preset (24 greedy tokens)"; else echo "DIFFERENT: $preset"; echo " llama.cpp: $ref"; echo " tide:      $P$ours"; fail=1; fi
  if [ -n "$LL" ]; then
    # values compared in rank order (token texts of partial UTF-8 pieces differ in spelling),
    # and by token text where both spell it the same
    python3 - "$tmp/ours.json" "$tmp/ref.json" "$preset" <<'EOF' || fail=1
import json, sys
# top_logprobs is keyed by text: tide keeps the first (likeliest) of tokens spelled alike (partial
# UTF-8 pieces all read "\ufffd"), so llama.cpp's list is reduced the same way
first = lambda pairs: {k: v for k, v in reversed(pairs)}
ours = json.load(open(sys.argv[1]), object_pairs_hook=first)["choices"][0]["logprobs"]["top_logprobs"][0]
ref = json.loads(open(sys.argv[2], "rb").read().decode("utf-8", "replace"), object_pairs_hook=first)
a, b = sorted(ours.values(), reverse=True), sorted(ref.values(), reverse=True)
n = min(len(a), len(b))
d = max(abs(x - y) for x, y in zip(a[:n], b[:n]))
common = [t for t in ours if t in ref and "\ufffd" not in t]
dk = max((abs(ours[t] - ref[t]) for t in common), default=0.0)
ok = n >= 4 and len(a) == len(b) and d < 1e-4 and dk < 1e-4 and len(common) >= 3
print(f"{'same' if ok else 'DIFFERENT'}: {sys.argv[3]} step-0 top-{n} logprobs: max |diff| {d:.2e} by rank, "
      f"{dk:.2e} by token ({len(common)} tokens compared by text)")
sys.exit(0 if ok else 1)
EOF
  fi
done
exit $fail
