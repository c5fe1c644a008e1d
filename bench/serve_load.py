#!/usr/bin/env python3
"""serve_load.py - `dspark serve` under N concurrent streaming clients (bench/serve.sh).

  serve_load.py OUT.txt ROUNDS CONCURRENCY,... NAME=FLAGS ...

Every configuration NAME is one server (`dspark serve FLAGS --port 0`), all of
them up for the whole run. For each round, for each concurrency N, every
configuration in turn (the order rotated each round, so drifting machine load
falls on all of them alike) gets N clients, each sending PER requests one
after another: streamed completions of distinct prompts (no prefix-cache
hits between them), MAX_TOKENS tokens each (ignore_eos, so every answer is
the same length), greedy and seeded sampling alternating. Measured per run:
  tok_s     generated tokens / wall seconds of the run (all clients)
  req_s     requests / wall seconds
  ttft      seconds from sending a request to its first text chunk: p50, p99
  itl       mean seconds between a request's text chunks after the first
Per cell the median over the rounds, and each configuration's ratio to the
first one. The answers are checked too: every (prompt, settings) must give
the same text in every dspark configuration and round.
A configuration whose FLAGS begin with "peer:" is llama.cpp's llama-server
($LLAMA_SERVER) with the rest of FLAGS, on a free port, ready once /health
answers 200; its answers are checked against its own earlier rounds only
(another engine's arithmetic gives other text).
Environment: DSPARK_BIN (build/dspark), LLAMA_SERVER, PER (3), MAX_TOKENS (64).
"""
import http.client
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time

BIN = os.environ.get("DSPARK_BIN", "build/dspark")
PER = int(os.environ.get("PER", "3"))
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "64"))
TEXTS = ["The river", "It is a truth universally acknowledged, that", "Once upon a time", "The package", "In the morning",
         "The sea", "A list of colors:", "My grandmother used to say", "The old mill", "When the war ended",
         "Dear Sir,", "The function returns", "At the edge of the forest", "In 1848 the city", "The recipe calls for",
         "Chapter One.", "The committee decided", "Under the bridge", "Her letter began", "The train left"]


def start_peer(flags):
    import socket
    with socket.socket() as so:                     # a free port (llama-server takes no port 0)
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    exe = os.environ.get("LLAMA_SERVER", "llama-server")
    p = subprocess.Popen([exe, "--host", "127.0.0.1", "--port", str(port)] + shlex.split(flags),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while time.time() - t0 < 600:
        if p.poll() is not None:
            raise SystemExit("llama-server exited (%d): %s" % (p.returncode, flags))
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            ok = c.getresponse().status == 200
            c.close()
            if ok:
                return p, port
        except OSError:
            pass
        time.sleep(0.5)
    p.kill()
    raise SystemExit("llama-server did not become ready: %s" % flags)


def start(flags):
    if flags.startswith("peer:"):
        return start_peer(flags[5:])
    # leading NAME=value words are the server's environment (DSPARK_DRAFT_PASS=1 ...)
    words, env = shlex.split(flags), dict(os.environ)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    p = subprocess.Popen([BIN, "serve", "--port", "0"] + words, stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, text=True, env=env)
    while True:
        line = p.stderr.readline()
        if not line:
            raise SystemExit("server did not start: %s" % flags)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: p.stderr.read(), daemon=True).start()   # keep its stderr drained
            return p, int(m.group(1))


def body_of(i):
    b = {"prompt": "%s (%d)" % (TEXTS[i % len(TEXTS)], i), "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True}
    b.update({"temperature": 0} if i % 2 == 0 else {"temperature": 0.9, "seed": 100 + i, "top_p": 0.95})
    return b


def one(port, i):
    """(text, tokens, ttft, inter-token gap mean) of one streamed request."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.time()
    c.request("POST", "/v1/completions", body=json.dumps(body_of(i)), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit("status %d: %s" % (r.status, r.read()[:200]))
    text, times, buf = "", [], b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: {"):
                continue
            o = json.loads(ev[6:])
            for ch in o.get("choices", []):
                if ch.get("text"):
                    text += ch["text"]
                    times.append(time.time())
            if o.get("usage"):
                pass
    c.close()
    ttft = times[0] - t0 if times else float("nan")
    itl = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else float("nan")
    return text, ttft, itl


def run(port, n, base):
    """N clients x PER requests; returns (tok_s, req_s, ttfts, itls, answers)."""
    res, lock = [], threading.Lock()

    def client(c):
        for j in range(PER):
            i = base + c * PER + j
            t, ttft, itl = one(port, i)
            with lock:
                res.append((i, t, ttft, itl))

    t0 = time.time()
    th = [threading.Thread(target=client, args=(c,)) for c in range(n)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.time() - t0
    return (n * PER * MAX_TOKENS / wall, n * PER / wall, [r[2] for r in res], [r[3] for r in res], {r[0]: r[1] for r in res})


def pct(xs, q):
    xs = sorted(x for x in xs if x == x)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] if xs else float("nan")


def main():
    out, rounds, conc = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")]
    cfgs = [a.split("=", 1) for a in sys.argv[4:]]
    servers = [(name, *start(flags)) for name, flags in cfgs]
    for _, _, port in servers:                      # warm-up (first pages, first allocations): not measured
        run(port, 2, 10 ** 6)
    cell = {}                                       # (name, n) -> list of (tok_s, req_s, ttft p50, p99, itl)
    answers = {}                                    # (engine, request) -> (text, first configuration)
    mismatch, pairs = 0, {}
    try:
        for r in range(rounds):
            for n in conc:
                order = servers[r % len(servers):] + servers[:r % len(servers)]
                for name, _, port in order:
                    tok_s, req_s, ttfts, itls, ans = run(port, n, 1000 * n)
                    cell.setdefault((name, n), []).append((tok_s, req_s, pct(ttfts, 0.5), pct(ttfts, 0.99),
                                                          statistics.mean(x for x in itls if x == x)))
                    peer = dict(cfgs)[name].startswith("peer:")
                    for i, t in ans.items():
                        t0, first = answers.setdefault((name if peer else "", i), (t, name))
                        if t0 != t:
                            mismatch += 1
                            k = (first, name, "greedy" if i % 2 == 0 else "seeded")
                            pairs[k] = pairs.get(k, 0) + 1
                    print("round %d n=%d %s: %.1f tok/s ttft p50 %.3f s" % (r + 1, n, name, tok_s, pct(ttfts, 0.5)),
                          file=sys.stderr, flush=True)
    finally:
        for _, p, _ in servers:
            p.terminate()
            p.wait()
    lines = ["clients  config      tok/s   x%-8s req/s  ttft_p50_s  ttft_p99_s  x%-8s itl_ms" % (cfgs[0][0], cfgs[0][0])]
    for n in conc:
        base = [statistics.median(v[k] for v in cell[(cfgs[0][0], n)]) for k in range(5)]
        for name, _ in cfgs:
            med = [statistics.median(v[k] for v in cell[(name, n)]) for k in range(5)]
            lines.append("%7d  %-10s %7.1f  %7.2fx  %6.2f  %10.3f  %10.3f  %7.2fx  %6.2f" %
                         (n, name, med[0], med[0] / base[0], med[1], med[2], med[3], base[2] / med[2] if med[2] else 0,
                          1000 * med[4]))
    lines.append("answers checked: %d distinct (engine, request) pairs, %d differing between dspark configurations or rounds"
                 % (len(answers), mismatch))
    for (a, b, kind), c in sorted(pairs.items()):
        lines.append("  differing: %d %s requests, first answered by %s, then otherwise by %s" % (c, kind, a, b))
    lines.append("(tok/s and ttft: medians of %d rounds; x: ratio to %s, ttft as speed-up; %d requests x %d tokens per client)"
                 % (rounds, cfgs[0][0], PER, MAX_TOKENS))
    with open(out, "a") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(1 if mismatch else 0)


if __name__ == "__main__":
    main()
