#!/usr/bin/env python3
"""serve_client.py - the client side of tests/cli_serve.sh (standard library only).

  text FILE                 print choices[0].text / message.content of a response
  sse FILE                  check an SSE stream and print its concatenated text
  bad PORT KEY CORPUS       malformed requests -> the listed 4xx + an OpenAI error object
  load PORT KEY CLIENTS N   CLIENTS threads x N requests; every answer must equal
                            its single-client answer; prints throughput
  disconnect PORT           a client that leaves mid-stream frees its slot
  queuefull PORT            a full queue answers 503
"""
import http.client
import json
import re
import socket
import sys
import threading
import time


def post(port, path, body, key=None, raw=False, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = "Bearer " + key
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    c.request("POST", path, body=data, headers=h)
    r = c.getresponse()
    out = r.read()
    c.close()
    return r.status, out


def get(port, path, key=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path, headers={"Authorization": "Bearer " + key} if key else {})
    r = c.getresponse()
    out = r.read()
    c.close()
    return r.status, out


def text_of(obj):
    ch = obj["choices"][0]
    return ch["message"]["content"] if "message" in ch else ch["text"]


def sse_text(raw):
    """Parse an SSE body; check its shape; return (text, final_chunk)."""
    events = raw.decode("utf-8").split("\n\n")
    assert events[-1] == "", "stream does not end with a blank line"
    datas = [e[len("data: "):] for e in events[:-1] if e.startswith("data: ")]
    assert datas and datas[-1] == "[DONE]", "stream does not end with [DONE]"
    text, final = "", None
    for d in datas[:-1]:
        o = json.loads(d)
        if "error" in o:
            raise AssertionError("error event: %s" % d)
        if not o["choices"]:
            continue                                   # usage chunk
        ch = o["choices"][0]
        text += (ch.get("delta") or {}).get("content") or ch.get("text") or ""
        if ch.get("finish_reason"):
            final = o
    assert final is not None and "dspark" in final, "no final chunk with finish_reason and dspark stats"
    return text, final


def cmd_text(path):
    with open(path, "rb") as f:
        sys.stdout.write(text_of(json.loads(f.read())))


def cmd_sse(path):
    with open(path, "rb") as f:
        sys.stdout.write(sse_text(f.read())[0])


def cmd_bad(port, key, corpus):
    port = int(port)
    fails = n = 0
    with open(corpus, encoding="utf-8") as f:
        lines = [l.rstrip("\n") for l in f if l.strip() and not l.startswith("#")]
    for line in lines:
        want, method, path, body = line.split("|", 3)
        key_used = key
        if body == "@long":
            body = json.dumps({"prompt": "word " * 3000, "max_tokens": 4})
        elif body == "@big":
            body = json.dumps({"prompt": "x" * 100000})
        elif body == "@binary":
            body = b"\x00\xff\xfe{\x01"
        elif body == "@deep":
            body = "[" * 5000 + "]" * 5000
        elif body in ("@badkey", "@nokey"):
            key_used = "wrong" if body == "@badkey" else None
            body = json.dumps({"prompt": "hi", "max_tokens": 2})
        n += 1
        try:
            if method == "GET":
                st, out = get(port, path, key_used)
            else:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                h = {"Content-Type": "application/json"}
                if key_used:
                    h["Authorization"] = "Bearer " + key_used
                c.request(method, path, body=body, headers=h)
                r = c.getresponse()
                st, out = r.status, r.read()
                c.close()
            ok = st == int(want)
            err = json.loads(out)["error"] if ok else None
            ok = ok and isinstance(err["message"], str) and err["message"] and "type" in err
        except Exception as e:                          # noqa: BLE001
            ok, st, out = False, "exception", str(e).encode()
        if not ok:
            fails += 1
            print("FAIL bad request %r: want %s got %s %s" % (line[:80], want, st, out[:200]))
    st, out = get(port, "/health")
    if st != 200:
        fails += 1
        print("FAIL server not alive after the corpus")
    print("%s malformed_corpus requests=%d failures=%d server_alive=%s" % ("PASS" if not fails else "FAIL", n, fails, st == 200))
    sys.exit(1 if fails else 0)


# The load test's request mix: completions and chat, greedy and sampled,
# speculative and plain, streamed and not.
MIX = [
    ("/v1/completions", {"prompt": "The river", "max_tokens": 12, "temperature": 0}),
    ("/v1/completions", {"prompt": "It is a truth universally acknowledged, that", "max_tokens": 10,
                         "temperature": 0.9, "seed": 5, "top_p": 0.95}),
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.7, "seed": 9,
                         "speculative": False, "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me about the sea."}], "max_tokens": 10,
                              "temperature": 0}),
    ("/v1/completions", {"prompt": "The package", "max_tokens": 14, "temperature": 1.0, "seed": 3, "min_p": 0.05,
                         "stream": True}),
]


def answer(port, key, i):
    path, body = MIX[i]
    st, out = post(port, path, body, key)
    if st != 200:
        raise AssertionError("status %d: %s" % (st, out[:200]))
    if body.get("stream"):
        return sse_text(out)[0]
    return text_of(json.loads(out))


def cmd_load(port, key, clients, per):
    port, clients, per = int(port), int(clients), int(per)
    ref = [answer(port, key, i) for i in range(len(MIX))]
    results, errors = [], []
    lock = threading.Lock()

    def client(c):
        for j in range(per):
            i = (c + j) % len(MIX)
            try:
                t = answer(port, key, i)
                with lock:
                    results.append((i, t))
            except Exception as e:                      # noqa: BLE001
                with lock:
                    errors.append(str(e))

    t0 = time.time()
    th = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.time() - t0
    diff = sum(1 for i, t in results if t != ref[i])
    st, metrics = get(port, "/metrics", key)
    m = dict(re.findall(r"^(dspark_[a-z_]+) ([0-9.e+-]+)$", metrics.decode(), re.M))
    ok = not errors and len(results) == clients * per and diff == 0
    print("%s load clients=%d requests=%d answered=%d lost=%d differing=%d wall_s=%.2f req_s=%.2f "
          "server_tok_s=%s acceptance=%s" % ("PASS" if ok else "FAIL", clients, clients * per, len(results), len(errors),
                                             diff, wall, len(results) / wall, m.get("dspark_tokens_per_second"),
                                             m.get("dspark_spec_acceptance_ratio")))
    for e in errors[:5]:
        print("  error:", e)
    sys.exit(0 if ok else 1)


def metric(port, name):
    st, out = get(port, "/metrics")
    mm = re.search(r"^%s ([0-9.e+-]+)$" % name, out.decode(), re.M)
    return float(mm.group(1)) if mm else None


def cmd_disconnect(port):
    port = int(port)
    body = json.dumps({"prompt": "The river", "max_tokens": 500, "ignore_eos": True, "temperature": 0, "stream": True})
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
               % (len(body), body)).encode())
    got = b""
    while got.count(b"data: ") < 3:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    s.close()                                           # leave mid-stream
    t0 = time.time()
    cancelled = None
    while time.time() - t0 < 10:
        cancelled = metric(port, "dspark_generations_cancelled_total")
        if cancelled and cancelled >= 1:
            break
        time.sleep(0.05)
    gen = metric(port, "dspark_generated_tokens_total")
    # the single slot serves the next request
    st, out = post(port, "/v1/completions", {"prompt": "The river", "max_tokens": 4, "temperature": 0}, timeout=30)
    ok = cancelled == 1 and gen is not None and gen < 500 and st == 200
    print("%s disconnect_frees_slot cancelled=%s generated_before_stop=%s next_request_status=%d"
          % ("PASS" if ok else "FAIL", cancelled, gen, st))
    sys.exit(0 if ok else 1)


def cmd_queuefull(port):
    """One worker, a queue of one: of 4 simultaneous long requests, at
    least one is served and at least one gets 503 with a queue_full error
    (how many of each depends on when the worker takes the first one)."""
    port = int(port)
    body = {"prompt": "The river", "max_tokens": 200, "ignore_eos": True, "temperature": 0}
    out = []
    lock = threading.Lock()

    def one():
        st, raw = post(port, "/v1/completions", body)
        with lock:
            out.append((st, raw))

    th = [threading.Thread(target=one) for _ in range(4)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    codes = sorted(st for st, _ in out)
    busy = [raw for st, raw in out if st == 503]
    ok = codes.count(503) >= 1 and codes.count(200) >= 1 and set(codes) <= {200, 503} and \
        all(json.loads(r)["error"]["code"] == "queue_full" for r in busy)
    print("%s queue_full_503 statuses=%s" % ("PASS" if ok else "FAIL", codes))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"text": cmd_text, "sse": cmd_sse, "bad": cmd_bad, "load": cmd_load, "disconnect": cmd_disconnect,
     "queuefull": cmd_queuefull}[cmd](*args)
