#!/usr/bin/env bash
# Qwen-VL image embeddings, tide vs llama.cpp's libmtmd (issue 25), for each pair of PAIRS:
# qwen3vl (the qwen3vlmoe text preset and the mmproj-qwen3vl tower), qwen2vl (qwen2vl and
# mmproj-qwen2vl), qwen25vl (qwen2vl and mmproj-qwen25vl), f32 matrices; synthetic images of
# several sizes: some whose sides are already multiples of patch * 2 (no resize on either side,
# so the towers alone are compared: patch embedding, position-table interpolation, 2-D rope,
# deepstack, window attention and the 2x2 merger), and some that need a resize (sides that are
# not multiples, images under min_pixels (20x90, 31x62 and 38x76 get another token count when
# the rules are computed in double rather than llama.cpp's float), and one over max_pixels: a third number is a token
# budget given to both, tide's max_image_tokens and libmtmd's image_max_tokens, so max_pixels is
# that budget's pixels), so the resize rules and the resampler are compared too. The relative
# RMS difference of the main embeddings and of each deepstack feature must be under 1e-3. For a
# resized image, the pixels themselves: libmtmd given tide's resized image (already of its size,
# so libmtmd only copies it) must return exactly the embeddings of its own resize.
# Then the greedy reply to a chat with an image (24 tokens, temperature 0) from the daemon
# and from libmtmd's helper (scripts/mtmd-greedy.c: the same ChatML text, the image between
# <|vision_start|> and <|vision_end|>, M-RoPE positions, deepstack) must be the same text (the
# qwen3vl and qwen25vl prompts' images need a resize, qwen2vl's does not).
# For qwen25vl each image's embeddings from both are also compared with a float64 numpy reference
# (scripts/qwen25vl-ref.py, run by NUMPY_PY, a python with numpy; skipped without one): printed,
# not judged; tide stays within 4e-7 of it, libmtmd's f16 patch embedding is most of its gap: on
# a CPU with AVX512-FP16 a native ggml-cpu sums that conv in half precision (docs/VISION.md);
# LD_LIBRARY_PATH=a ggml-cpu built without it (GGML_NATIVE=OFF, GGML_AVX512=ON) compares at f32 sums.
# Usage: LLAMA_DIR=/path/to/llama.cpp (built, with libmtmd) [PAIRS="qwen2vl ..."] [NUMPY_PY=python]
#        scripts/check-mtmd-parity.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LD="${LLAMA_DIR:-/tmp/llama.cpp}"
NUMPY_PY="${NUMPY_PY:-/usr/bin/python3}"
[ -e "$LD/build/bin/libmtmd.so" ] || { echo "no libmtmd in LLAMA_DIR=$LD"; exit 2; }
make -s build/tide build/tide-mkmodel build/libtide.a
tmp=$(mktemp -d); pid=; trap 'kill $pid 2>/dev/null || true; rm -rf "$tmp"' EXIT
cc -O2 -std=c11 scripts/mtmd-embd.c -I"$LD/include" -I"$LD/ggml/include" -I"$LD/tools/mtmd" -L"$LD/build/bin" \
  -lmtmd -lllama -lm -Wl,-rpath,"$LD/build/bin" -o "$tmp/mtmd-embd"
cc -O2 -std=c11 scripts/mtmd-greedy.c -I"$LD/include" -I"$LD/ggml/include" -I"$LD/tools/mtmd" -L"$LD/build/bin" \
  -lmtmd -lllama -lm -Wl,-rpath,"$LD/build/bin" -o "$tmp/mtmd-greedy"
cc -O2 -std=c11 -Isrc scripts/tide-embd.c build/libtide.a $(make -s print-gpu-ldlibs) -o "$tmp/tide-embd"
fail=0
for pair in ${PAIRS:-qwen3vl qwen2vl qwen25vl}; do
case $pair in # text preset, tower preset, text width, image sizes, the greedy prompt's image
  qwen3vl) text=qwen3vlmoe T=96 sizes=("64 48" "96 64" "32 80" "70 45" "21 13" "20 90" "200 150 64") gsize="70 45";;
  qwen2vl) text=qwen2vl T=128 sizes=("64 48" "96 64" "32 80" "70 45" "21 13" "20 90" "200 150 64") gsize="64 48";;
  qwen25vl) text=qwen2vl T=128 sizes=("112 56" "168 112" "252 140" "130 70" "40 20" "31 62" "38 76" "300 200 48") gsize="130 70";; # windows of 4x4 merged tokens
  *) echo "unknown pair $pair"; exit 2;;
esac
echo "== $pair"
build/tide-mkmodel --preset $text --type f32 --out "$tmp/text.gguf" >/dev/null
build/tide-mkmodel --preset mmproj-$pair --type f32 --out "$tmp/mmproj.gguf" >/dev/null
for size in "${sizes[@]}"; do
  "$tmp/mtmd-embd" "$tmp/text.gguf" "$tmp/mmproj.gguf" $size 2>/dev/null >"$tmp/ref.txt"
  TIDE_EMBD_PPM="$tmp/resized.ppm" "$tmp/tide-embd" "$tmp/mmproj.gguf" $size >"$tmp/ours.txt"
  resized=$(head -2 "$tmp/resized.ppm" | tail -1)
  if [ "$resized" != "$(echo $size | cut -d' ' -f1-2)" ]; then
    MTMD_EMBD_PPM="$tmp/resized.ppm" "$tmp/mtmd-embd" "$tmp/text.gguf" "$tmp/mmproj.gguf" 0 0 2>/dev/null >"$tmp/ref-px.txt"
    what="$(echo $size | cut -d' ' -f1-2 | tr ' ' x) resized to ${resized/ /x}"
    if cmp -s "$tmp/ref.txt" "$tmp/ref-px.txt"; then echo "same pixels: $what"
    else echo "DIFFERENT pixels: $what"; fail=1; fi
  fi
  python3 - "$tmp/ours.txt" "$tmp/ref.txt" "$size" $T <<'PY' || fail=1
import math, sys
a = open(sys.argv[1]).read().split(); b = open(sys.argv[2]).read().split()
size = sys.argv[3].split()
label = "x".join(size[:2]) + " image" + (f" (budget {size[2]} tokens)" if len(size) > 2 else "")
if a[:2] != b[:2]:
    print(f"DIFFERENT: {label}: tide {a[0]} tokens of {a[1]}, llama.cpp {b[0]} of {b[1]}"); sys.exit(1)
n, e = int(a[0]), int(a[1]); T = int(sys.argv[4])
a = [float(x) for x in a[2:]]; b = [float(x) for x in b[2:]]
worst, parts = 0.0, []
for p in range(e // T):
    idx = [i for i in range(n * e) if (i % e) // T == p]
    d = math.sqrt(sum((a[i] - b[i]) ** 2 for i in idx) / len(idx))
    r = math.sqrt(sum(b[i] ** 2 for i in idx) / len(idx))
    parts.append(d / r); worst = max(worst, d / r)
ok = worst < 1e-3
names = ["main"] + [f"deepstack {k}" for k in range(len(parts) - 1)]
print(f"{'same' if ok else 'DIFFERENT'}: {label}, {n} tokens: relative RMS " +
      ", ".join(f"{m} {v:.2e}" for m, v in zip(names, parts)))
sys.exit(0 if ok else 1)
PY
  if [ $pair = qwen25vl ] && "$NUMPY_PY" -c 'import numpy' 2>/dev/null; then # which side is off
    "$NUMPY_PY" scripts/qwen25vl-ref.py "$tmp/mmproj.gguf" "$tmp/resized.ppm" "$tmp/f64.txt"
    "$NUMPY_PY" scripts/qwen25vl-ref.py --cmp "$tmp/f64.txt" "$tmp/ours.txt" "$tmp/ref.txt" |
      awk '{v[NR] = $(NF - 2)} END {print " float64 reference: tide " v[1] ", libmtmd " v[2]}'
  fi
done
Q=$'What is this?'
"$tmp/mtmd-greedy" "$tmp/text.gguf" "$tmp/mmproj.gguf" $gsize $'<|im_start|>user\n<__media__>'"$Q"$'<|im_end|>\n<|im_start|>assistant\n' 24 \
  2>/dev/null >"$tmp/ref-text"
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
build/tide --port "$port" --model "$tmp/text.gguf" --mmproj "$tmp/mmproj.gguf" >"$tmp/log" 2>&1 & pid=$!
for _ in $(seq 50); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 0.1; done
python3 - "$Q" $gsize >"$tmp/req.json" <<'PY'
import base64, json, struct, sys
w, h = int(sys.argv[2]), int(sys.argv[3])
rows = b''
for y in range(h - 1, -1, -1):  # a 24-bit BMP: rows bottom-up, BGR; the pixels of mtmd-greedy.c
    r = b''.join(bytes([(x * 37 + y * 91 + c * 53 + (x * y) % 17) & 255 for c in (2, 1, 0)]) for x in range(w))
    rows += r + b'\0' * ((4 - len(r) % 4) % 4)
bmp = b'BM' + struct.pack('<IHHI', 54 + len(rows), 0, 0, 54) + \
      struct.pack('<IiiHHIIiiII', 40, w, h, 1, 24, 0, len(rows), 2835, 2835, 0, 0) + rows
url = "data:image/bmp;base64," + base64.b64encode(bmp).decode()
print(json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                  {"type": "text", "text": sys.argv[1]}]}], "max_tokens": 24, "temperature": 0}))
PY
curl -s "localhost:$port/v1/chat/completions" -H 'Content-Type: application/json' -d @"$tmp/req.json" >"$tmp/ours.json"
kill $pid; wait $pid 2>/dev/null || true
python3 - "$tmp/ours.json" "$tmp/ref-text" "$gsize" <<'PY' || fail=1
import json, sys
ours = json.load(open(sys.argv[1]))["choices"][0]["message"]["content"]
ref = open(sys.argv[2], "rb").read().decode("utf-8", "replace").rstrip("\n")
# a partial UTF-8 character at the end: tide holds it back, llama.cpp prints its bytes
strip = lambda t: t.rstrip("\ufffd")
ok = strip(ours) == strip(ref) and len(ours) > 0
print(f"{'same' if ok else 'DIFFERENT'}: greedy reply to a {sys.argv[3].replace(' ', 'x')} image prompt (24 tokens)")
if not ok:
    print(" llama.cpp:", repr(ref)); print(" tide:     ", repr(ours))
sys.exit(0 if ok else 1)
PY
done
exit $fail
