#!/usr/bin/env bash
# Qwen3-VL image embeddings, tide vs llama.cpp's libmtmd (issue 25): the qwen3vlmoe text preset
# and the mmproj-qwen3vl tower (f32 matrices), synthetic images of several sizes whose sides are
# already multiples of 16 (no resize on either side, so the towers alone are compared: patch
# embedding, position-table interpolation, 2-D rope, deepstack and the 2x2 merger). The relative
# RMS difference of the main embeddings and of each deepstack feature must be under 1e-3.
# Usage: LLAMA_DIR=/path/to/llama.cpp (built, with libmtmd) scripts/check-mtmd-parity.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LD="${LLAMA_DIR:-/tmp/llama.cpp}"
[ -e "$LD/build/bin/libmtmd.so" ] || { echo "no libmtmd in LLAMA_DIR=$LD"; exit 2; }
make -s build/tide-mkmodel build/libtide.a
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cc -O2 -std=c11 scripts/mtmd-embd.c -I"$LD/include" -I"$LD/ggml/include" -I"$LD/tools/mtmd" -L"$LD/build/bin" \
  -lmtmd -lllama -lm -Wl,-rpath,"$LD/build/bin" -o "$tmp/mtmd-embd"
cc -O2 -std=c11 -Isrc scripts/tide-embd.c build/libtide.a $(make -s print-gpu-ldlibs) -o "$tmp/tide-embd"
build/tide-mkmodel --preset qwen3vlmoe --type f32 --out "$tmp/text.gguf" >/dev/null
build/tide-mkmodel --preset mmproj-qwen3vl --type f32 --out "$tmp/mmproj.gguf" >/dev/null
fail=0
for size in "64 48" "96 64" "32 80"; do
  "$tmp/mtmd-embd" "$tmp/text.gguf" "$tmp/mmproj.gguf" $size 2>/dev/null >"$tmp/ref.txt"
  "$tmp/tide-embd" "$tmp/mmproj.gguf" $size >"$tmp/ours.txt"
  python3 - "$tmp/ours.txt" "$tmp/ref.txt" "$size" <<'PY' || fail=1
import math, sys
a = open(sys.argv[1]).read().split(); b = open(sys.argv[2]).read().split()
if a[:2] != b[:2]:
    print(f"DIFFERENT: {sys.argv[3]}: tide {a[0]} tokens of {a[1]}, llama.cpp {b[0]} of {b[1]}"); sys.exit(1)
n, e = int(a[0]), int(a[1]); T = 96
a = [float(x) for x in a[2:]]; b = [float(x) for x in b[2:]]
worst, parts = 0.0, []
for p in range(e // T):
    idx = [i for i in range(n * e) if (i % e) // T == p]
    d = math.sqrt(sum((a[i] - b[i]) ** 2 for i in idx) / len(idx))
    r = math.sqrt(sum(b[i] ** 2 for i in idx) / len(idx))
    parts.append(d / r); worst = max(worst, d / r)
ok = worst < 1e-3
names = ["main"] + [f"deepstack {k}" for k in range(len(parts) - 1)]
print(f"{'same' if ok else 'DIFFERENT'}: {sys.argv[3].replace(' ', 'x')} image, {n} tokens: relative RMS " +
      ", ".join(f"{m} {v:.2e}" for m, v in zip(names, parts)))
sys.exit(0 if ok else 1)
PY
done
exit $fail
