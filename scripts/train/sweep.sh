#!/bin/bash
# sweep.sh - trains several variants of tide's model side by side on one GPU (each run is
# bound by Python's launch overhead, so four share an H200 at nearly full speed each), then
# copies the best one (by "What is in this image?" + count accuracy) to OUTDIR/best and the
# logs and evaluations of all of them to OUTDIR/summary.txt.
# Usage: sweep.sh OUTDIR SECONDS NAME:TIDE_MODEL_CFG:TRAIN_AUX [...]
#   e.g. sweep.sh $OUT 400 a:P=8:0.5 b:P=4:0.5      (run from scripts/train)
set -u
out=$1 secs=$2
shift 2
work=${SWEEP_WORK:-/tmp/sweep}
mkdir -p "$out/best" "$work"
for v in "$@"; do
    IFS=: read -r name cfg aux <<<"$v"
    TIDE_MODEL_CFG=$cfg TRAIN_AUX=$aux TRAIN_SECONDS=$secs TRAIN_SAMPLES=${TRAIN_SAMPLES:-240000} \
        PYTHONUNBUFFERED=1 python3 train.py "$work/$name" 1000000 >"$work/$name.log" 2>&1 &
done
wait
best="" bestscore=-1
for v in "$@"; do
    IFS=: read -r name cfg aux <<<"$v"
    {
        echo "=== $name cfg=$cfg aux=$aux"
        grep -E '^step' "$work/$name.log" | awk 'NR % 40 == 1' | tail -n 12
        tail -n 40 "$work/$name.log"
    } >>"$out/summary.txt"
    [ -f "$work/$name/eval.json" ] || continue
    s=$(python3 -c "import json,sys; e=json.load(open(sys.argv[1])); print(e['What is in this image?'] + e['How many shapes are there?'])" "$work/$name/eval.json")
    echo "score $name $s" >>"$out/summary.txt"
    if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$s" "$bestscore"; then
        best=$name bestscore=$s
    fi
done
echo "best: $best ($bestscore)" >>"$out/summary.txt"
[ -n "$best" ] && cp "$work/$best"/{weights.npz,refs.npz,loss.csv,eval.json,cfg.json} "$out/best/"
exit 0
