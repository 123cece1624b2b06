#!/usr/bin/env bash
# bench-cpu.sh - tide through its HTTP API against llama.cpp's llama-bench on the same GGUF, on
# the CPU (issue 26): prefill of PROMPT tokens at depth 0, decode of GEN tokens at each depth in
# DEPTHS (llama-bench's -d), at 1 and 2 threads, for f16, q8_0 and q4_0 files from tide-mkmodel
# (--preset big: Mixtral-style MoE, n_embd 1024, 8 layers, 16 experts top-2, vocab 771), and
# k-quant files: a TYPES entry that starts upper-case is a llama-quantize mix (Q4_K_M, Q5_K_M,
# Q6_K: tide-mkmodel --mix), a lower-case one a single type (q4_K, q6_K...).
# tide and llama-bench alternate, RUNS times, so a busy neighbour hits both sides alike.
#
#   LLAMA_BENCH=/tmp/llama.cpp/build/bin/llama-bench scripts/bench-cpu.sh
# Env: TYPES ("f16 q8_0 q4_0"), THREADS ("1 2"), RUNS (3), PROMPT (512), GEN (64), DEPTHS
# ("0,360"), MODELS (/tmp: where tide-bench-big-<type>.gguf is made if absent), MKARGS (more
# tide-mkmodel arguments, e.g. "--layers 16": part of the file's name), TIDE (build/tide: another
# build's daemon; then nothing is built), TIDE_BEFORE (a second daemon, run as side "before" in
# the same alternation: before, tide, llama), OUT
# (/tmp/tide-bench-cpu: raw.txt, every measurement, and summary.md, ranges per cell).
# TIDE_CPU_ISA=avx2 is passed through to the daemon (docs/CONFIG.md).
set -u -o pipefail
cd "$(dirname "$0")/.."
TYPES=${TYPES:-"f16 q8_0 q4_0"}
THREADS=${THREADS:-"1 2"}
RUNS=${RUNS:-3}
PROMPT=${PROMPT:-512}
GEN=${GEN:-64}
DEPTHS=${DEPTHS:-"0,360"}
MODELS=${MODELS:-/tmp}
OUT=${OUT:-/tmp/tide-bench-cpu}
LB=${LLAMA_BENCH:-/tmp/llama.cpp/build/bin/llama-bench}
PORT=${PORT:-18391}
MKARGS=${MKARGS:-}
TIDE=${TIDE:-build/tide}
TIDE_BEFORE=${TIDE_BEFORE:-}
SUFFIX=$(echo "$MKARGS" | tr -d ' -')
mkdir -p "$OUT"
RAW=$OUT/raw.txt
: >"$RAW"
make -s CUDA_HOME=/nonexistent build/tide-mkmodel || exit 1
[ "$TIDE" != build/tide ] || make -s CUDA_HOME=/nonexistent build/tide || exit 1
[ -x "$LB" ] || echo "llama-bench not found at $LB (set LLAMA_BENCH): tide numbers only"
echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) nproc=$(nproc)" \
     "load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$RAW"

tide_run() { # model threads [daemon] -> "pp512=... tg64@d0=... ..."
    "${3:-$TIDE}" -m "$1" -t "$2" -c 2048 -np 1 --port "$PORT" --host 127.0.0.1 >"$OUT/tide.log" 2>&1 &
    local pid=$! ok=
    for _ in $(seq 1 300); do
        curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health" 2>/dev/null | grep -q 200 && { ok=1; break; }
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if [ -n "$ok" ]; then
        TIDE_PID=$pid timeout 600 python3 scripts/bench-cpu.py "http://127.0.0.1:$PORT" 771 "$PROMPT" "$GEN" "$DEPTHS"
    else
        echo "tide did not start: $(tail -n 2 "$OUT/tide.log")"
    fi
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}

llama_run() { # model threads -> the same keys, from llama-bench's jsonl, and tokens per CPU-second
    # of llama-bench (its children's rusage, no warm-up run, less that of a 1-token run: the model's
    # load and page faults, ~0.25 s of CPU on a 275 MB file, are not the benchmark's)
    python3 - "$LB" "$1" "$2" "$PROMPT" "$GEN" "$DEPTHS" <<'PY'
import json, resource, subprocess, sys
lb, model, t, prompt, gen, depths = sys.argv[1:]
out, cpu = [], []
def bench(args):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([lb, "-m", model, "-t", t, "-r", "1", "--no-warmup", "-o", "jsonl"] + args,
                       capture_output=True, text=True, timeout=900)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")], \
        (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
_, fixed = bench(["-p", "1", "-n", "0"])
rows, c = bench(["-p", prompt, "-n", "0"])
c -= fixed
for o in rows:
    out.append("pp%d=%.1f" % (o["n_prompt"], o["avg_ts"]))
    cpu.append("pp%dcpu=%.1f" % (o["n_prompt"], o["n_prompt"] / c))
for d in depths.split(","):
    rows, c = bench(["-p", "0", "-n", gen, "-d", d])
    c -= fixed
    for o in rows:
        out.append("tg%d@d%d=%.1f" % (o["n_gen"], o["n_depth"], o["avg_ts"]))
        if o["n_depth"] == 0:  # with a depth, the depth's prefill is in the CPU time too
            cpu.append("tg%d@d%dcpu=%.1f" % (o["n_gen"], o["n_depth"], o["n_gen"] / c))
print(" ".join(out + cpu))
PY
}

model_file() { echo "$MODELS/tide-bench-big$SUFFIX-$1.gguf"; }
for type in $TYPES; do
    M=$(model_file "$type")
    case $type in [A-Z]*) how=--mix ;; *) how=--type ;; esac
    # shellcheck disable=SC2086 # MKARGS is a list of arguments
    [ -f "$M" ] || build/tide-mkmodel --preset big "$how" "$type" $MKARGS --out "$M" >/dev/null || exit 1
done
for run in $(seq 1 "$RUNS"); do
    for type in $TYPES; do
        M=$(model_file "$type")
        for t in $THREADS; do
            [ -n "$TIDE_BEFORE" ] && echo "run=$run type=$type threads=$t side=before load=$(cut -d' ' -f1 /proc/loadavg) $(tide_run "$M" "$t" "$TIDE_BEFORE")" | tee -a "$RAW"
            echo "run=$run type=$type threads=$t side=tide load=$(cut -d' ' -f1 /proc/loadavg) $(tide_run "$M" "$t")" | tee -a "$RAW"
            [ -x "$LB" ] && echo "run=$run type=$type threads=$t side=llama load=$(cut -d' ' -f1 /proc/loadavg) $(llama_run "$M" "$t")" | tee -a "$RAW"
        done
    done
done

# ranges per (type, threads, measure), and the ratio range of each run's tide/llama pair
python3 - "$RAW" >"$OUT/summary.md" <<'PY'
import collections, sys
cells = collections.defaultdict(lambda: collections.defaultdict(dict))  # (type,t,key) -> side -> run -> v
for line in open(sys.argv[1]):
    if line.startswith("#"):
        continue
    kv = dict(f.split("=", 1) for f in line.split() if "=" in f)
    for k, v in kv.items():
        if k.startswith(("pp", "tg")):
            try:
                cells[(kv["type"], int(kv["threads"]), k)][kv["side"]][kv["run"]] = float(v)
            except ValueError:
                pass
sides = [sd for sd in ("before", "tide", "llama") if any(sd in c for c in cells.values())]
print("| type | threads | measure | " + " | ".join("%s tok/s" % sd for sd in sides) +
      "".join(" | %s/llama (per run)" % sd for sd in sides if sd != "llama") + " |")
print("|---|---:|---|" + "---:|" * (len(sides) + len([sd for sd in sides if sd != "llama"])))
rng = lambda d: "%.0f-%.0f" % (min(d.values()), max(d.values())) if d else "-"
for (ty, t, k), c in sorted(cells.items()):
    ll = c.get("llama", {})
    row = [rng(c.get(sd, {})) for sd in sides]
    for sd in sides:
        if sd == "llama":
            continue
        ratios = [c[sd][r] / ll[r] for r in c.get(sd, {}) if r in ll and ll[r] > 0]
        row.append("%.2f-%.2fx" % (min(ratios), max(ratios)) if ratios else "-")
    print("| %s | %d | %s | %s |" % (ty, t, k, " | ".join(row)))
PY
cat "$OUT/summary.md"
