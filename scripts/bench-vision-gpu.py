#!/usr/bin/env python3
"""bench-vision-gpu.py - a cold image request on the daemon, phase by phase (issue 6).

Starts build/tide on CUDA device 0 with the shipped tiny model (models/tide-shapes*.gguf) and
a lazy encoder (idle_s 1), then sends ROUNDS image requests, each a new picture (no embedding
cache hit) after the encoder has unloaded, so each pays hand-back, encoder load, encode,
prefill and the first token; then one warm request (encoder loaded, new picture). Phases come
from /metrics histogram sums (tide_vram_handback_seconds, tide_vision_load_seconds,
tide_vision_encode_seconds, tide_time_to_first_token_seconds); prefill + first token is the
time to first token less the three vision phases. GPU memory (nvidia-smi used) is read
before, while the encoder is loaded and after it unloads.

usage: bench-vision-gpu.py LABEL OUTDIR [ROUNDS]   (env as for the daemon: TIDE_VISION_CPU=1
gives the CPU encoder; BENCH_TIGHT=1 reserves all free GPU memory first, so that the encoder's
memory comes from the expert cache's hand-back; BENCH_BACKEND=cpu checks the script without a GPU)"""
import base64, json, os, random, struct, subprocess, sys, time, urllib.request, zlib

label, out = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
port = 18561
base = f"http://127.0.0.1:{port}"


def png(seed):
    """a 64x64 picture: a coloured square on grey with noise, different bytes per seed"""
    r = random.Random(seed)
    col = [r.randrange(256) for _ in range(3)]
    x0, y0 = r.randrange(8, 32), r.randrange(8, 32)
    rows = b""
    for y in range(64):
        row = bytearray(b"\x00")
        for x in range(64):
            inside = x0 <= x < x0 + 24 and y0 <= y < y0 + 24
            for c in range(3):
                v = (col[c] if inside else 128) + r.randrange(-6, 7)
                row.append(max(0, min(255, v)))
        rows += bytes(row)
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 64, 64, 8, 2, 0, 0, 0)) + \
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


cfg = {"model": "models/tide-shapes.gguf", "mmproj": "models/tide-shapes-mmproj.gguf", "port": port,
       "context": 4096, "devices": [{"backend": os.environ.get("BENCH_BACKEND", "cuda"), "index": 0}],
       "vision": {"lazy": True, "idle_s": 1, "device": 0}}
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
    for _ in range(300):
        try:
            get("/health")
            break
        except Exception:
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
            "encode": "tide_vision_encode_seconds_sum", "ttft": "tide_time_to_first_token_seconds_sum"}
    rows = []
    u_idle = used_mib()
    for i in range(rounds + 1):
        warm = i == rounds
        if not warm:
            for _ in range(100):  # wait for the idle unload
                if vstate()[0] == "unloaded":
                    break
                time.sleep(0.1)
        st0 = vstate()[0]
        m0 = metrics()
        body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is in this image?"},
                                                          {"type": "image_url", "image_url": {"url": png(i + 1)}}]}],
                "max_tokens": 1, "temperature": 0}
        t0 = time.time()
        r = post("/v1/chat/completions", body)
        wall = time.time() - t0
        m1 = metrics()
        ph = {k: (m1.get(v, 0) - m0.get(v, 0)) * 1e3 for k, v in keys.items()}
        ph["prefill+first"] = ph["ttft"] - ph["handback"] - ph["load"] - ph["encode"]
        ph["wall"] = wall * 1e3
        st1, vmib = vstate()
        slots = json.loads(get("/v1/vram"))["devices"][0]["expert_slots"]
        u_loaded = used_mib()
        rows.append(ph)
        say(f"{label} {'warm' if warm else 'cold'} #{i}: state {st0} -> {st1}, "
            f"hand-back {ph['handback']:.2f} ms, load {ph['load']:.2f} ms, encode {ph['encode']:.2f} ms, "
            f"prefill+first token {ph['prefill+first']:.2f} ms, time to first token {ph['ttft']:.2f} ms, "
            f"request {ph['wall']:.2f} ms; prompt tokens {r['usage']['prompt_tokens']}; "
            f"nvidia-smi used {u_idle} -> {u_loaded} MiB, vision {vmib} MiB, expert slots {slots}")
    cold = rows[:rounds]
    med = {k: sorted(x[k] for x in cold)[len(cold) // 2] for k in cold[0]}
    say(f"{label} cold median of {rounds}: hand-back {med['handback']:.2f} ms | load {med['load']:.2f} ms | "
        f"encode {med['encode']:.2f} ms | prefill+first token {med['prefill+first']:.2f} ms | "
        f"TTFT {med['ttft']:.2f} ms | request {med['wall']:.2f} ms")
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
