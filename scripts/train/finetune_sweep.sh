#!/bin/bash
# finetune_sweep.sh - runs finetune_tools.py in several variants side by side on one GPU (as
# sweep.sh does for train.py), then copies the best one's outputs (the two GGUFs, refs.json,
# vision_embd.bin, loss.csv, eval.json) to OUTDIR and every variant's log tail and evaluation to
# OUTDIR/summary.txt. Best: the highest sum of the PyTorch accuracies (the tool call, the
# round trip's number, "What is in this image?" with the tool offered and without, the count),
# among the variants that keep "What is in this image?" >= 0.95 and the count >= 0.90 (the bars
# of tests/model/test_model.py) when any does.
# Usage: finetune_sweep.sh OUTDIR SECONDS NAME:TRAIN_LR:TRAIN_TOOL_FRAC [...]   (from scripts/train)
#   e.g. finetune_sweep.sh $OUT 120 a:5e-4:0.55 b:1e-3:0.55 c:2e-4:0.55
set -u
out=$1 secs=$2
shift 2
work=${SWEEP_WORK:-/tmp/ftsweep}
mkdir -p "$out" "$work"
for v in "$@"; do
    IFS=: read -r name lr frac <<<"$v"
    TRAIN_LR=$lr TRAIN_TOOL_FRAC=$frac TRAIN_SECONDS=$secs TRAIN_SAMPLES=${TRAIN_SAMPLES:-64000} \
        PYTHONUNBUFFERED=1 python3 finetune_tools.py "$work/$name" 1000000 >"$work/$name.log" 2>&1 &
done
wait
best="" bestscore=-100
for v in "$@"; do
    IFS=: read -r name lr frac <<<"$v"
    {
        echo "=== $name lr=$lr tool_frac=$frac"
        grep -E '^(data|step)' "$work/$name.log" | awk 'NR % 10 == 1' | tail -n 12
        tail -n 60 "$work/$name.log"
    } >>"$out/summary.txt"
    [ -f "$work/$name/eval.json" ] || continue
    s=$(python3 -c "
import json, sys
e = json.load(open(sys.argv[1]))
s = e['tool call'] + e['tool result answer'] + e['tools offered, what'] + e['What is in this image?'] + \
    e['How many shapes are there?']
print(s - (10 if e['What is in this image?'] < 0.95 or e['How many shapes are there?'] < 0.90 else 0))" \
        "$work/$name/eval.json")
    echo "score $name $s" >>"$out/summary.txt"
    if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$s" "$bestscore"; then
        best=$name bestscore=$s
    fi
done
echo "best: $best ($bestscore)" >>"$out/summary.txt"
[ -n "$best" ] && cp "$work/$best"/{tide-shapes.gguf,tide-shapes-mmproj.gguf,refs.json,vision_embd.bin,loss.csv,eval.json} "$out/"
exit 0
