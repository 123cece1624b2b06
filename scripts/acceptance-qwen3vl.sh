#!/usr/bin/env bash
# acceptance-qwen3vl.sh - the shared lazy-vision acceptance check (../shared/acceptance/
# lazy-vision.sh) with a small qwen3vlmoe pair configured instead of the shipped model (issue 25):
# the Qwen3-VL tower is handed VRAM from the expert cache on the first image, unloads after
# idle_s, and the cache regrows, with the encoder's reserve taken from its mmproj header.
# The check runs in a scratch "checkout" whose config/tide.json names the pair and whose build/
# is this tree's (the check's own `make` is a no-op there). Usage: scripts/acceptance-qwen3vl.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
check=${ACCEPTANCE_DIR:-$root/../shared/acceptance}/lazy-vision.sh
[ -f "$check" ] || { echo "acceptance-qwen3vl: no $check (the shared acceptance checks)"; exit 2; }
make -s build/tide build/tide-mkmodel
tmp=$(mktemp -d /tmp/acc-qwen3vl.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/config"
# experts wide enough (16 of 512, 19 MB in all) that half the cache is MiBs, as the check's budget assumes
build/tide-mkmodel --preset qwen3vlmoe --ff 512 --experts 16 --out "$tmp/qwen3vlmoe.gguf" >/dev/null
build/tide-mkmodel --preset mmproj-qwen3vl --out "$tmp/mmproj-qwen3vl.gguf" >/dev/null
python3 - "$root/config/tide.json" "$tmp" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["model"], c["mmproj"] = sys.argv[2] + "/qwen3vlmoe.gguf", sys.argv[2] + "/mmproj-qwen3vl.gguf"
json.dump(c, open(sys.argv[2] + "/config/tide.json", "w"), indent=1)
PY
ln -s "$root/build" "$tmp/build"
printf 'all:\n\t@true\n' >"$tmp/Makefile"
cd "$tmp" && bash "$check"
