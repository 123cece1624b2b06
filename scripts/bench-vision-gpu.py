#!/usr/bin/env python3
"""bench-vision-gpu.py - a cold image request on the daemon, phase by phase (issues 6 and 25).

Starts build/tide on CUDA device 0 with the shipped tiny model (models/tide-shapes*.gguf) and
a lazy encoder (idle_s 3), then sends ROUNDS image requests, each a new picture (no embedding
cache hit) after the encoder has unloaded, so each pays hand-back, encoder load, encode,
prefill and the first token; then one warm request (encoder loaded, new picture) and, with
BENCH_CACHED=1, that picture once more (embedding cache hit). Phases come from /metrics
histogram sums (tide_vram_handback_seconds, tide_vision_load_seconds,
tide_vision_encode_seconds, tide_step_forward_seconds for the prefill: the request is alone
and max_tokens 1, so its forward steps are its prompt's chunks; tide_time_to_first_token_seconds);
"first token" is the time to first token less the other four (queueing, the image's decode
and resize, the steps' host work, sampling). GPU memory (nvidia-smi used) is read before,
while the encoder is loaded and after it unloads. Ends with a table of the cold median, warm
and cached rows (also in OUTDIR/table-LABEL.md), and a text-only prompt of about the warm
request's length prefilled the same way (the image rows' own share of the prefill).

usage: bench-vision-gpu.py LABEL OUTDIR [ROUNDS]   (env as for the daemon: TIDE_VISION_CPU=1
gives the CPU encoder; BENCH_TIGHT=1 reserves all free GPU memory first, so that the encoder's
memory comes from the expert cache's hand-back; BENCH_BACKEND=cpu checks the script without a GPU;
BENCH_MODEL / BENCH_MMPROJ another pair, BENCH_IMAGE=WxH the pictures' size (64x64),
BENCH_CONTEXT the context (4096), BENCH_CACHED=1 the cached request)"""
import base64, json, os, random, struct, subprocess, sys, time, urllib.request, zlib

label, out = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
port = 18561
base = f"http://127.0.0.1:{port}"


W, H = (int(v) for v in os.environ.get("BENCH_IMAGE", "64x64").split("x"))


def png(seed):
    """a W x H picture: a coloured square on grey with noise, different bytes per seed"""
    r = random.Random(seed)
    col = [r.randrange(256) for _ in range(3)]
    x0, y0, side = r.randrange(W // 8, W // 2), r.randrange(H // 8, H // 2), max(1, min(W, H) * 3 // 8)
    noise = bytes(r.randrange(13) for _ in range(4096))
    rows = []
    for y in range(H):
        row = bytearray(b"\x00")
        for x in range(W):
            inside = x0 <= x < x0 + side and y0 <= y < y0 + side
            for c in range(3):
                v = (col[c] if inside else 128) + noise[(y * W + x) * 3 + c & 4095] - 6
                row.append(max(0, min(255, v)))
        rows.append(bytes(row))
    rows = b"".join(rows)
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(data).decode()


def get(path):
    with urllib.request.urlopen(base + path, timeout=30) as f:
        return f.read().decode()


def post(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as f:
        return json.loads(f.read())


def metrics():
    m = {}
    for line in get("/metrics").splitlines():
        if line.startswith("#") or " " not in line:
            continue
        k, v = line.rsplit(" ", 1)
        try:
            m[k] = float(v)
        except ValueError:
            pass
    return m


def used_mib():
    try:
        return int(subprocess.check_output(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                            "-i", "0"]).decode().split()[0])
    except Exception:
        return -1


def vstate():
    v = json.loads(get("/v1/vram"))
    return v["vision"]["state"], v["devices"][0].get("vision_mib")


cfg = {"model": os.environ.get("BENCH_MODEL", "models/tide-shapes.gguf"),
       "mmproj": os.environ.get("BENCH_MMPROJ", "models/tide-shapes-mmproj.gguf"), "port": port,
       "context": int(os.environ.get("BENCH_CONTEXT", "4096")),
       "devices": [{"backend": os.environ.get("BENCH_BACKEND", "cuda"), "index": 0}],
       # idle_s 3: the warm request must reach the encoder before it unloads, and the readings
       # after a request (nvidia-smi among them) took over 1 s on an H100
       "vision": {"lazy": True, "idle_s": 3, "device": 0}}
cached = os.environ.get("BENCH_CACHED") == "1"
os.makedirs(out, exist_ok=True)
cfgp = os.path.join(out, f"vision-{label}.json")
json.dump(cfg, open(cfgp, "w"))
log = open(os.path.join(out, f"vision-{label}-daemon.log"), "w")
d = subprocess.Popen(["build/tide", "--config", cfgp], stdout=log, stderr=subprocess.STDOUT)
summary = open(os.path.join(out, "summary.txt"), "a")


def say(s):
    print(s, flush=True)
    summary.write(s + "\n")
    summary.flush()


try:
    for _ in range(6000):  # a 30 GB model takes a while to load
        try:
            get("/health")
            break
        except Exception:
            if d.poll() is not None:
                raise SystemExit(f"{label}: tide exited ({d.returncode}); see {log.name}")
            time.sleep(0.1)
    if os.environ.get("BENCH_TIGHT"):
        # every byte the GPU has free is reserved by the operator (POST /v1/vram), so the
        # encoder's memory can only come from the expert cache: a real hand-back each time
        free = json.loads(get("/v1/vram"))["devices"][0]["free_mib"]
        r = post("/v1/vram", {"reserve_mib": free})
        say(f"{label}: reserve {free} MiB (all free memory): {r.get('status')}, expert cache "
            f"{r['devices'][0]['expert_cache_mib']} MiB, {r['devices'][0]['expert_slots']} slots")
    # one text request first: the text path's first-use costs are not the encoder's
    post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0})
    keys = {"handback": "tide_vram_handback_seconds_sum", "load": "tide_vision_load_seconds_sum",
            "encode": "tide_vision_encode_seconds_sum", "prefill": "tide_step_forward_seconds_sum",
            "ttft": "tide_time_to_first_token_seconds_sum"}
    rows = []
    u_idle = used_mib()
    for i in range(rounds + 1 + cached):
        warm, kind = i >= rounds, "cold" if i < rounds else "warm" if i == rounds else "cached"
        if not warm:
            for _ in range(100):  # wait for the idle unload
                if vstate()[0] == "unloaded":
                    break
                time.sleep(0.1)
        st0 = vstate()[0]
        m0 = metrics()
        body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is in this image?"},
                                                          {"type": "image_url", "image_url": {"url": png(min(i, rounds) + 1)}}]}],
                "max_tokens": 1, "temperature": 0}
        t0 = time.time()
        r = post("/v1/chat/completions", body)
        wall = time.time() - t0
        m1 = metrics()
        ph = {k: (m1.get(v, 0) - m0.get(v, 0)) * 1e3 for k, v in keys.items()}
        ph["first"] = ph["ttft"] - ph["handback"] - ph["load"] - ph["encode"] - ph["prefill"]
        ph["wall"] = wall * 1e3
        st1, vmib = vstate()
        slots = json.loads(get("/v1/vram"))["devices"][0]["expert_slots"]
        u_loaded = used_mib()
        ph["prompt"] = r["usage"]["prompt_tokens"]
        rows.append((kind, ph))
        if kind != "cold" and ph["load"] > 0:
            say(f"WARNING {label} {kind} #{i}: the encoder unloaded before this request reached it (load "
                f"{ph['load']:.1f} ms): not a {kind} request")
        say(f"{label} {kind} #{i}: state {st0} -> {st1}, "
            f"hand-back {ph['handback']:.2f} ms, load {ph['load']:.2f} ms, encode {ph['encode']:.2f} ms, "
            f"prefill {ph['prefill']:.2f} ms, first token {ph['first']:.2f} ms, time to first token {ph['ttft']:.2f} ms, "
            f"request {ph['wall']:.2f} ms; prompt tokens {ph['prompt']}; "
            f"nvidia-smi used {u_idle} -> {u_loaded} MiB, vision {vmib} MiB, expert slots {slots}")
    cold = [ph for k, ph in rows if k == "cold"]
    med = {k: sorted(x[k] for x in cold)[len(cold) // 2] for k in cold[0]}
    table = [f"| {label}: {W}x{H} image | hand-back ms | encoder load ms | encode ms | prefill ms | first token ms "
             "| TTFT ms | request ms | prompt tokens |", "|---|---|---|---|---|---|---|---|---|"]
    for name, ph in [(f"cold (median of {rounds})", med)] + [(k, ph) for k, ph in rows if k != "cold"]:
        table.append(f"| {name} | " + " | ".join(f"{ph[k]:.1f}" for k in ("handback", "load", "encode", "prefill",
                                                                          "first", "ttft", "wall"))
                     + f" | {ph['prompt']:.0f} |")
    for line in table:
        say(line)
    with open(os.path.join(out, f"table-{label}.md"), "w") as f:
        f.write("\n".join(table) + "\n")
    # a text-only prompt of about the image prompt's length, prefilled the same way: how much of
    # the image request's prefill is its length, and how much its image rows (M-RoPE, deepstack)
    warm_ph = next(ph for k, ph in rows if k == "warm")
    n_img, pf_img = warm_ph["prompt"], warm_ph["prefill"]
    words = " ".join(f"w{(i * 7919) % 10007}" for i in range(int(n_img) // 5))  # ~5 tokens a word
    m0 = metrics()
    r = post("/v1/chat/completions", {"messages": [{"role": "user", "content": words}], "max_tokens": 1,
                                      "temperature": 0})
    pf = (metrics().get(keys["prefill"], 0) - m0.get(keys["prefill"], 0)) * 1e3
    say(f"{label} text only: {r['usage']['prompt_tokens']} prompt tokens prefilled in {pf:.1f} ms "
        f"(the image prompt: {n_img:.0f} in {pf_img:.1f} ms)")
    for _ in range(50):
        if vstate()[0] == "unloaded":
            break
        time.sleep(0.1)
    time.sleep(0.5)
    say(f"{label} after unload: state {vstate()[0]}, nvidia-smi used {used_mib()} MiB (idle before: {u_idle}), "
        f"expert slots {json.loads(get('/v1/vram'))['devices'][0]['expert_slots']}")
finally:
    d.terminate()
    d.wait()
    log.close()
    for line in open(os.path.join(out, f"vision-{label}-daemon.log")):
        if "vision:" in line and ("ready" in line or "runs on" in line or "GPU" in line):
            summary.write(line)
