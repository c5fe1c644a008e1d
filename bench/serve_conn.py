#!/usr/bin/env python3
"""serve_conn.py - the connection layer of `dspark serve` under slow clients and load.

  serve_conn.py OUT.txt REPS CONFIG=BINARY[:extra flags] ...

For each configuration (interleaved, REPS rounds, the order rotated each round):
  slowloris  150 sockets from 127.0.0.2 trickling one header byte every 0.3 s
             for 4 s; meanwhile /health from 127.0.0.1 every 0.2 s (2 s timeout):
             probes answered, and their median / worst latency
  load       8 clients x 15 small mixed requests: requests per second
Medians of the rounds side by side, with ratios to the first configuration.
The model is the shipped pair (models/); the server runs --parallel 2 -t 1.
"""
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import serve_client  # noqa: E402  (the test client's slow sockets and probes)

TGT, DR = "models/dspark-tiny-q8_0.gguf", "models/dspark-tiny-drafter-f16.gguf"
MIX = [("/v1/completions", {"prompt": "The river", "max_tokens": 8, "temperature": 0}),
       ("/v1/completions", {"prompt": "It is a truth", "max_tokens": 8, "temperature": 0.9, "seed": 5, "stream": True}),
       ("/v1/completions", {"prompt": "Once", "max_tokens": 6, "temperature": 1, "seed": 9})]


def start(binary, extra):
    p = subprocess.Popen([binary, "serve", "-m", TGT, "-md", DR, "--parallel", "2", "-t", "1", "--port", "0"] + extra,
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    line = p.stderr.readline()
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
    if not m:
        p.kill()
        raise SystemExit("server did not start: " + line)
    threading.Thread(target=p.stderr.read, daemon=True).start()       # drain its log
    return p, int(m.group(1))


def slowloris(port):
    socks = serve_client.open_slow(port, 150)
    lat, t0, i = [], time.time(), 0
    while time.time() - t0 < 4.0:
        if i % 2 == 0:
            for s in socks:
                try:
                    s.sendall(b"E")
                except OSError:
                    pass
        lat.append(serve_client.health_latency(port))
        i += 1
        time.sleep(0.2)
    for s in socks:
        s.close()
    good = [x for x in lat if x is not None]
    return len(good) / len(lat), statistics.median(good) if good else float("nan"), max(good) if good else float("nan")


def load(port):
    done = []

    def client(k):
        for j in range(15):
            path, body = MIX[(k + j) % len(MIX)]
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            c.close()
            done.append(r.status == 200)
    t0 = time.time()
    th = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return sum(done) / (time.time() - t0)


def main():
    out, reps, cfgs = sys.argv[1], int(sys.argv[2]), []
    for a in sys.argv[3:]:
        name, spec = a.split("=", 1)
        binary, _, flags = spec.partition(":")
        cfgs.append((name, binary, flags.split()))
    res = {n: {"ok": [], "p50": [], "max": [], "rps": []} for n, _, _ in cfgs}
    for r in range(reps):
        order = cfgs[r % len(cfgs):] + cfgs[:r % len(cfgs)]
        for name, binary, flags in order:
            p, port = start(binary, flags)
            time.sleep(0.3)
            ok, p50, mx = slowloris(port)
            time.sleep(0.5)
            rps = load(port)
            p.terminate()
            p.wait()
            for k, v in (("ok", ok), ("p50", p50), ("max", mx), ("rps", rps)):
                res[name][k].append(v)
            print("round=%d config=%s probes_answered=%.2f probe_p50_s=%.4f probe_max_s=%.3f load_req_s=%.1f" % (r, name, ok, p50, mx, rps),
                  flush=True)
    cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
    dev = subprocess.run([cfgs[-1][1], "devices"], capture_output=True, text=True).stdout
    simd = (re.search(r"device=cpu status=ok simd=(\S+)", dev) or re.search(r"()", "")).group(1)
    load_avg = open("/proc/loadavg").read().split()[:3]
    med = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in res.items()}
    base = cfgs[0][0]
    lines = ["# bench/serve_conn.py: %d interleaved rounds; cpu=%s (%d cores, simd=%s); load average at the end %s "
             "(other jobs shared the machine)" % (reps, cpu, os.cpu_count(), simd, " ".join(load_avg)),
             "# medians; ratios to %s" % base,
             "%-10s %16s %14s %14s %12s %10s" % ("config", "probes_answered", "probe_p50_s", "probe_max_s", "load_req_s", "req_s_x")]
    for n, _, flags in cfgs:
        m = med[n]
        lines.append("%-10s %16.2f %14.4f %14.3f %12.1f %10.2f" % (n, m["ok"], m["p50"], m["max"], m["rps"], m["rps"] / med[base]["rps"]))
    for n, _, flags in cfgs:
        lines.append("# %s: %s" % (n, " ".join(flags) or "(defaults)"))
    text = "\n".join(lines) + "\n"
    print(text, end="")
    with open(out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
