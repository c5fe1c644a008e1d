#!/usr/bin/env python3
"""serve_client.py - the client side of tests/cli_serve.sh (standard library only).

  text FILE                 print choices[0].text / message.content of a response
  sse FILE                  check an SSE stream and print its concatenated text
  bad PORT KEY CORPUS       malformed requests -> the listed 4xx + an OpenAI error object
  load PORT KEY CLIENTS N   CLIENTS threads x N requests; every answer must equal
                            its single-client answer; prints throughput
  disconnect PORT           a client that leaves mid-stream frees its slot
  queuefull PORT            a full queue answers 503
  features PORT KEY         the OpenAI / llama-server feature table (stop strings exact
                            under speculation, random seeds, logprobs, n, response_format,
                            penalties, logit_bias, tokenize, props, slots, CORS, n_predict)
  prometheus PORT KEY       /metrics parses as Prometheus text (histograms, gauges)
  slowloris PORT            slow clients cannot starve /health; they are cut at the deadline
  dropped PORT              dropped non-streamed requests (and a long prefill) free the slot
  soak PORT KEY N PID [MB]  N mixed requests with random disconnects: every answer equals its
                            single-client answer, the server's RSS stays within MB (16; 0: unchecked)
  drain PORT PID LEN        SIGTERM mid-stream: the stream ends with a finish_reason + [DONE]
  gguf_template IN OUT F    IN with tokenizer.chat_template = the text of F, as OUT
  hostile PORT KEY          error bodies stay valid UTF-8 whatever bytes the request held
  batch PORT KEY N          N concurrent streaming clients of different settings (greedy, seeded,
                            logprobs, penalties, logit_bias, a grammar, stop strings) get exactly the
                            text, logprobs and finish_reason each gets alone; engine steps batched rows
  same PORT_A PORT_B KEY    the batch mix on two servers (the engine, one context per slot) gives the
                            same choices (text, logprobs, finish_reason), streamed and not
  prefix PORT KEY           a repeated long prompt is served from the prefix cache (dspark.cached_tokens,
                            /metrics) with the same answer
  chat_tools PORT [JINJA]   tool calls and reasoning_content (grammar-steered replies), streamed
                            and not; JINJA 0: a --no-jinja server refuses tools

DSPARK_SERVE_SPEC=0 (features): the server decodes plain when asked for speculative decoding
(no drafter), so "speculative" in the answers must be false.
"""
import http.client
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
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


def get(port, path, key=None, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
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
        elif body == "@ctrlbefore":                     # control bytes around a valid body: refused alike
            body = b"\x01" + json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
        elif body == "@ctrlafter":
            body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode() + b"\x01"
        elif body == "@rawctl":
            body = b'{"prompt": "a\tb", "max_tokens": 2}'
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


def answer_of(port, key, path, body, every=False):
    """The text of an answer (every choice's, as JSON, with every=True)."""
    st, out = post(port, path, body, key)
    if st != 200:
        raise AssertionError("status %d: %s" % (st, out[:200]))
    if body.get("stream"):
        return sse_text(out)[0]
    if every:
        return json.dumps([c["text"] if "text" in c else c["message"]["content"] for c in json.loads(out)["choices"]])
    return text_of(json.loads(out))


def answer(port, key, i):
    return answer_of(port, key, *MIX[i])


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


def metric(port, name, key=None):
    st, out = get(port, "/metrics", key)
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





# ---- the feature table ------------------------------------------------------------------

CHECKS = {"fail": 0}


def check(ok, name, detail=""):
    print("%s %s%s" % ("PASS" if ok else "FAIL", name, "" if ok else " " + str(detail)[:300]))
    if not ok:
        CHECKS["fail"] += 1
    return ok


def req_json(port, key, path, body, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    h = {"Content-Type": "application/json", "Authorization": "Bearer " + key}
    h.update(headers or {})
    c.request("POST", path, body=json.dumps(body), headers=h)
    r = c.getresponse()
    raw = r.read()
    c.close()
    return r.status, raw


def complete(port, key, body, path="/v1/completions"):
    st, raw = req_json(port, key, path, body)
    if st != 200:
        raise AssertionError("status %d: %s" % (st, raw[:300]))
    return json.loads(raw)


def stream_events(port, key, body, path="/v1/completions"):
    st, raw = req_json(port, key, path, dict(body, stream=True))
    if st != 200:
        raise AssertionError("status %d: %s" % (st, raw[:300]))
    text, final = sse_text(raw)
    events = [json.loads(e[6:]) for e in raw.decode().split("\n\n") if e.startswith("data: {")]
    return text, final, events


def logprobs_of(obj, chat):
    out = []
    for ch in obj["choices"]:
        lp = ch.get("logprobs")
        if lp:
            out += [(t["token"], t["logprob"]) for t in lp["content"]] if chat else list(zip(lp["tokens"], lp["token_logprobs"]))
    return out


SPEC = os.environ.get("DSPARK_SERVE_SPEC", "1") != "0"   # speculative requests run the drafter


def cmd_features(port, key):
    port = int(port)
    dspark = os.environ.get("DSPARK_BIN", "build/dspark")
    target = os.environ.get("DSPARK_TARGET", "models/dspark-tiny-q8_0.gguf")
    P = "It is a truth universally acknowledged, that"

    # stop strings: wherever the stop falls (inside an accepted block or at its
    # edge), speculative == plain: the same text, finish_reason, token count
    base = complete(port, key, {"prompt": P, "max_tokens": 40, "temperature": 0, "speculative": False})
    full = base["choices"][0]["text"]
    ok, n = True, 0
    quick = bool(os.environ.get("DSPARK_SAN"))          # the sanitizer pass: fewer stop positions
    for samp in ({"temperature": 0}, {"temperature": 0.9, "seed": 11}):
        ref = complete(port, key, dict(samp, prompt=P, max_tokens=40, speculative=False))["choices"][0]["text"]
        for at in range(2, len(ref) - 3, max(1, len(ref) // (3 if quick else 10))):
            stop = ref[at:at + 3]
            body = dict(samp, prompt=P, max_tokens=40, stop=[stop, "\u2603never"])
            a = complete(port, key, dict(body, speculative=True))
            b = complete(port, key, dict(body, speculative=False))
            st_text, st_final, _ = stream_events(port, key, dict(body, speculative=True))
            want = ref[:ref.find(stop)]
            same = (a["choices"][0]["text"] == b["choices"][0]["text"] == st_text == want and
                    a["choices"][0]["finish_reason"] == b["choices"][0]["finish_reason"] == "stop" ==
                    st_final["choices"][0]["finish_reason"] and a["usage"] == b["usage"] and
                    a["dspark"]["speculative"] == SPEC)
            ok &= same
            n += 1
            if not same:
                print("  stop %r: spec %r plain %r stream %r want %r" % (stop, a["choices"][0]["text"], b["choices"][0]["text"],
                                                                         st_text, want))
    check(ok, "stop_strings_spec_equals_plain_stream cases=%d" % n)

    # no seed: a random one, reported; temperature 1 twice gives two texts;
    # the reported seed replays the answer, here and in `dspark generate -s`
    r1 = complete(port, key, {"prompt": P, "max_tokens": 24, "temperature": 1})
    r2 = complete(port, key, {"prompt": P, "max_tokens": 24, "temperature": 1})
    seed = r1["dspark"]["seed"]
    r3 = complete(port, key, {"prompt": P, "max_tokens": 24, "temperature": 1, "seed": seed})
    # `generate` ends the text with ONE newline of its own (end_text); the
    # text itself may end in newlines too, so only that one is taken off
    def cli_text(out):
        t = out.decode("utf-8", "replace")
        return t[:-1] if t.endswith("\n") else t
    cli = cli_text(subprocess.run([dspark, "generate", "-m", target, "-p", P, "-n", "24", "--temp", "1", "-s", str(seed), "-t", "1"],
                                  capture_output=True).stdout)
    neg = complete(port, key, {"prompt": P, "max_tokens": 16, "temperature": 1, "seed": -7})
    cli_neg = cli_text(subprocess.run([dspark, "generate", "-m", target, "-p", P, "-n", "16", "--temp", "1", "-s", "-7", "-t", "1"],
                                      capture_output=True).stdout)
    check(r1["dspark"]["seed_random"] and r1["choices"][0]["text"] != r2["choices"][0]["text"] and
          r3["choices"][0]["text"] == r1["choices"][0]["text"] and cli == r1["choices"][0]["text"] and
          neg["dspark"]["seed"] == -7 and cli_neg == neg["choices"][0]["text"], "random_seed_reported_and_replayable",
          (r1["choices"][0]["text"], r2["choices"][0]["text"], cli))

    # logprobs: completions and chat, streamed == not, speculative == plain
    for chat in (False, True):
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body = ({"messages": [{"role": "user", "content": "Tell me about the sea."}], "logprobs": True, "top_logprobs": 3}
                if chat else {"prompt": P, "logprobs": 3})
        body.update({"max_tokens": 20, "temperature": 0.8, "seed": 3})
        a = complete(port, key, dict(body, speculative=True), path)
        b = complete(port, key, dict(body, speculative=False), path)
        _, _, ev = stream_events(port, key, dict(body, speculative=True), path)
        streamed = []
        for e in ev:
            if e["choices"] and e["choices"][0].get("logprobs"):
                lp = e["choices"][0]["logprobs"]
                streamed += [(t["token"], t["logprob"]) for t in lp["content"]] if chat else list(zip(lp["tokens"], lp["token_logprobs"]))
        la, lb = logprobs_of(a, chat), logprobs_of(b, chat)
        top_ok = all(len(t["top_logprobs"]) == 3 for t in a["choices"][0]["logprobs"]["content"]) if chat else \
            all(len(d) <= 3 for d in a["choices"][0]["logprobs"]["top_logprobs"])
        check(la == lb == streamed and len(la) == a["usage"]["completion_tokens"] and all(v <= 0 for _, v in la) and top_ok,
              "logprobs_%s_stream_and_spec_equal tokens=%d" % ("chat" if chat else "completions", len(la)), (len(la), len(lb), len(streamed)))

    # n > 1: choice k is the single request with seed + k; streamed alike
    nb = {"prompt": P, "max_tokens": 12, "temperature": 1, "seed": 40, "n": 3}
    multi = complete(port, key, nb)
    singles = [complete(port, key, {"prompt": P, "max_tokens": 12, "temperature": 1, "seed": 40 + k})["choices"][0]["text"] for k in range(3)]
    _, _, ev = stream_events(port, key, nb)
    st_texts = ["", "", ""]
    for e in ev:
        for ch in e["choices"]:
            st_texts[ch["index"]] += ch.get("text") or ""
    texts = [c["text"] for c in sorted(multi["choices"], key=lambda c: c["index"])]
    check(texts == singles == st_texts and len(set(texts)) > 1 and multi["usage"]["completion_tokens"] == 36,
          "n_choices_equal_single_requests", (texts, singles, st_texts))

    # response_format: json_object parses; json_schema validates; speculative == plain
    sch = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
           "required": ["name", "age"]}
    for rf in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "p", "schema": sch}}):
        body = {"messages": [{"role": "user", "content": "A person as JSON."}], "max_tokens": 60, "temperature": 0.7, "seed": 2,
                "response_format": rf}
        a = complete(port, key, dict(body, speculative=True), "/v1/chat/completions")
        b = complete(port, key, dict(body, speculative=False), "/v1/chat/completions")
        t = a["choices"][0]["message"]["content"]
        fin = a["choices"][0]["finish_reason"]
        valid = True
        if fin == "stop":
            o = json.loads(t)
            valid = isinstance(o, dict) and (rf["type"] == "json_object" or (set(o) == {"name", "age"} and isinstance(o["age"], int)))
        check(t == b["choices"][0]["message"]["content"] and valid and a["dspark"]["response_format"] == rf["type"],
              "response_format_%s finish=%s" % (rf["type"], fin), t)

    # penalties and logit_bias: speculative == plain, and they act
    plain = complete(port, key, {"prompt": P, "max_tokens": 30, "temperature": 0})["choices"][0]["text"]
    for extra in ({"frequency_penalty": 1.5}, {"presence_penalty": 1.5}, {"logit_bias": {"13": 30}}):
        body = dict(extra, prompt=P, max_tokens=30, temperature=0)
        a = complete(port, key, dict(body, speculative=True))["choices"][0]["text"]
        b = complete(port, key, dict(body, speculative=False))["choices"][0]["text"]
        check(a == b and a != plain, "processor_%s_spec_equals_plain_and_acts" % list(extra)[0], (a, plain))
    toks = json.loads(req_json(port, key, "/tokenize", {"content": " the"})[1])["tokens"]
    banned = complete(port, key, {"prompt": P, "max_tokens": 30, "temperature": 0, "logit_bias": {str(toks[0]): -100}})
    check(" the" in plain and len(toks) == 1 and " the" not in banned["choices"][0]["text"], "logit_bias_bans_a_token")

    # llama-server fields: n_predict, cache_prompt; unknown fields 400
    r = complete(port, key, {"prompt": P, "n_predict": 40, "ignore_eos": True, "temperature": 0, "cache_prompt": True})
    st, raw = req_json(port, key, "/v1/completions", {"prompt": P, "n_predict": 4, "frobnicate": 1})
    check(r["usage"]["completion_tokens"] == 40 and st == 400 and b"frobnicate" in raw, "llama_server_fields")

    # tokenize / detokenize / props / slots
    st, raw = req_json(port, key, "/tokenize", {"content": P, "with_pieces": True})
    pieces = json.loads(raw)["tokens"]
    st2, raw2 = req_json(port, key, "/detokenize", {"tokens": [p["id"] for p in pieces]})
    props = json.loads(get(port, "/props", key)[1])
    slots = json.loads(get(port, "/slots", key)[1])
    check(st == st2 == 200 and json.loads(raw2)["content"] == P and "".join(p["piece"] for p in pieces) == P and
          props["total_slots"] == len(slots) and props["default_generation_settings"]["n_ctx"] > 0 and
          all("is_processing" in sl for sl in slots), "tokenize_detokenize_props_slots")

    # CORS: a preflight from an allowed origin, one from another, the answer's header
    def options(origin):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("OPTIONS", "/v1/completions", headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                          "Access-Control-Request-Headers": "authorization, content-type"})
        r = c.getresponse()
        r.read()
        c.close()
        return r.status, dict((k.lower(), v) for k, v in r.getheaders())
    st_ok, h_ok = options("http://good.example")
    st_no, h_no = options("http://evil.example")
    st, raw = 0, b""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": P, "max_tokens": 2}),
              headers={"Content-Type": "application/json", "Authorization": "Bearer " + key, "Origin": "http://good.example"})
    resp = c.getresponse()
    resp.read()
    acao = resp.getheader("Access-Control-Allow-Origin")
    c.close()
    check(st_ok == 204 and h_ok.get("access-control-allow-origin") == "http://good.example" and
          "POST" in h_ok.get("access-control-allow-methods", "") and "authorization" in h_ok.get("access-control-allow-headers", "") and
          st_no == 204 and "access-control-allow-origin" not in h_no and acao == "http://good.example", "cors_preflight_and_origin",
          (st_ok, h_ok, st_no, h_no, acao))
    sys.exit(1 if CHECKS["fail"] else 0)


def cmd_prometheus(port, key):
    """/metrics through a Prometheus parser (python3-prometheus-client when it is
    installed; else the exposition format's rules checked here)."""
    port = int(port)
    st, raw = get(port, "/metrics", key)
    text = raw.decode()
    fams = {}
    try:
        from prometheus_client.parser import text_string_to_metric_families
        parser = "prometheus_client"
        for f in text_string_to_metric_families(text):
            fams[f.name] = (f.type, [(s.name, s.labels, s.value) for s in f.samples])
    except ImportError:
        parser = "builtin"
        types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
        for name, t in types.items():
            samples = [(m.group(1), m.group(2) or "", float(m.group(3))) for m in
                       re.finditer(r"^(%s(?:_bucket|_sum|_count)?)(\{[^}]*\})? (\S+)$" % re.escape(name), text, re.M)]
            fams[name] = (t, samples)
    ok = st == 200
    for h in ("dspark_request_duration_seconds", "dspark_time_to_first_token_seconds", "dspark_queue_wait_seconds",
              "dspark_time_per_output_token_seconds"):
        t, samples = fams.get(h, (None, []))
        buckets = [v for n, _, v in samples if n.endswith("_bucket")]
        count = [v for n, _, v in samples if n.endswith("_count")]
        ok &= t == "histogram" and buckets == sorted(buckets) and count and buckets[-1] == count[0] and count[0] > 0
    for g in ("dspark_kv_used_tokens", "dspark_kv_capacity_tokens", "dspark_kv_usage_ratio", "dspark_slots_busy", "dspark_queue_length"):
        ok &= fams.get(g, (None,))[0] == "gauge"
    check(ok, "prometheus_metrics_parse parser=%s families=%d" % (parser, len(fams)))
    sys.exit(1 if CHECKS["fail"] else 0)


# ---- hazards -----------------------------------------------------------------------------

def health_latency(port, timeout=2):
    t0 = time.time()
    try:
        st, _ = get(port, "/health", timeout=timeout)
    except Exception:                                   # noqa: BLE001
        return None
    return time.time() - t0 if st == 200 else None


def open_slow(port, n, src="127.0.0.2"):
    """n connections from src that have sent one byte of a request."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.settimeout(5)
        try:
            s.bind((src, 0))
            s.connect(("127.0.0.1", port))
            s.sendall(b"G")
            socks.append(s)
        except OSError:
            s.close()
    return socks


def cmd_slowloris(port):
    """150 sockets from 127.0.0.2 trickling one header byte every 0.3 s: /health
    from 127.0.0.1 stays fast; the per-IP limit refuses the surplus at once; the
    request deadline shuts the rest down."""
    port = int(port)
    socks = open_slow(port, 150)
    lat, t0 = [], time.time()
    i = 0
    while time.time() - t0 < 3.0:
        for s in socks:
            try:
                s.sendall(b"ET /health HTTP/1.1\r\nX-a: b"[i % 20:i % 20 + 1])
            except OSError:
                pass
        lat.append(health_latency(port))
        i += 1
        time.sleep(0.3)
    # after the deadline every slow socket must be closed by the server
    closed = 0
    for s in socks:
        try:
            s.settimeout(0.5)
            closed += s.recv(1) == b""
        except OSError:
            closed += 1
        s.close()
    timed_out = metric(port, "dspark_connections_timed_out_total") or 0
    good = [x for x in lat if x is not None]
    ok = len(good) == len(lat) and max(good) < 1.0 and closed == len(socks) and timed_out >= 1
    print("%s slowloris_health_stays_up probes=%d max_probe_s=%.3f slow_sockets=%d closed=%d timed_out=%d" %
          ("PASS" if ok else "FAIL", len(lat), max(good) if good else -1, len(socks), closed, timed_out))
    sys.exit(0 if ok else 1)


def cmd_dropped(port):
    """Four non-streamed 500-token requests dropped right after sending, and one with
    a 480-token prompt dropped in its prefill: each is cancelled within a decode step
    or a prefill chunk, and the next request does not wait for them."""
    port = int(port)
    body = json.dumps({"prompt": "The river", "max_tokens": 500, "ignore_eos": True, "temperature": 0})
    base_c = metric(port, "dspark_generations_cancelled_total") or 0
    base_g = metric(port, "dspark_generated_tokens_total") or 0
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                   % (len(body), body)).encode())
        time.sleep(0.05)
        s.close()
    t0 = time.time()
    st, _ = post(port, "/v1/completions", {"prompt": "The river", "max_tokens": 4, "temperature": 0}, timeout=60)
    wait = time.time() - t0
    c = None
    for _ in range(100):
        c = metric(port, "dspark_generations_cancelled_total")
        if c is not None and c - base_c >= 4:
            break
        time.sleep(0.05)
    gen = (metric(port, "dspark_generated_tokens_total") or 0) - base_g
    # Under the sanitizers a socket can close before the server has read its
    # request at all (nothing started, nothing to cancel): there, at least one
    # cancellation and no dropped request running on are what is checked.
    need = 1 if os.environ.get("DSPARK_SAN") else 4
    # Each dropped request runs for the client's 0.05 s before its socket
    # closes, so what it makes scales with the machine's speed (about 230
    # tokens in all at 1,000 tok/s); uncancelled, the four would make 2,000.
    # Half that is the bound: a fast host does not fail it, a missed cancel does.
    ok = st == 200 and c - base_c >= need and gen < 4 * 500 // 2 and wait < 10
    print("%s dropped_non_streamed_cancelled cancelled=%d tokens_made=%d next_request_wait_s=%.2f" %
          ("PASS" if ok else "FAIL", c - base_c, gen, wait))
    # a long prompt dropped during its prefill
    long_prompt = " ".join(["river"] * 470)
    body = json.dumps({"prompt": long_prompt, "max_tokens": 4, "temperature": 0})
    t0 = time.time()
    post(port, "/v1/completions", json.loads(body), timeout=60)            # how long a prefill takes here
    full = time.time() - t0
    # the dropped one differs from its first word: no prefix-cache hit to
    # shorten its prefill
    # (64 tokens to make after the prefill: on a fast host the prefill can end
    # before the hang-up is seen, and a request that finished is not cancelled)
    body = json.dumps({"prompt": "sea " + long_prompt, "max_tokens": 64, "ignore_eos": True, "temperature": 0})
    base_c = metric(port, "dspark_generations_cancelled_total")
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
               % (len(body), body)).encode())
    time.sleep(0.02)
    t1 = time.time()
    s.close()
    cancelled = False
    while time.time() - t1 < 10 and not cancelled:
        cancelled = metric(port, "dspark_generations_cancelled_total") > base_c
        time.sleep(0.005)
    dt = time.time() - t1
    ok2 = cancelled and dt < max(0.5 * full, 0.05)
    print("%s cancel_reaches_inside_prefill cancel_to_done_s=%.3f full_prefill_s=%.3f" % ("PASS" if ok2 else "FAIL", dt, full))
    sys.exit(0 if ok and ok2 else 1)


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def cmd_soak(port, key, n, pid, rss_mb="16"):
    """N mixed requests from 6 clients, a tenth of them dropped mid-way: every
    finished answer equals its single-client answer and the server's RSS after
    the run is within RSS_MB of its RSS after the first tenth (0: not checked,
    as under AddressSanitizer, whose quarantine keeps freed memory)."""
    port, n, pid, rss_mb = int(port), int(n), int(pid), int(rss_mb)
    mix = [("/v1/completions", {"prompt": "The river", "max_tokens": 6, "temperature": 0}),
           ("/v1/completions", {"prompt": "It is a truth", "max_tokens": 5, "temperature": 0.9, "seed": 5, "stream": True}),
           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0}),
           ("/v1/completions", {"prompt": "Once", "max_tokens": 5, "temperature": 1, "seed": 9, "stop": [" the"], "logprobs": 1}),
           ("/v1/completions", {"prompt": "The package", "max_tokens": 4, "temperature": 0.5, "seed": 1, "n": 2}),
           ("/v1/completions", {"prompt": "The sea", "max_tokens": 6, "temperature": 0, "frequency_penalty": 0.5, "speculative": False})]

    def ans(i):
        return answer_of(port, key, mix[i][0], mix[i][1], every=True)

    ref = [ans(i) for i in range(len(mix))]
    rnd = random.Random(1)
    plan = [(rnd.randrange(len(mix)), rnd.random() < 0.1) for _ in range(n)]
    lock = threading.Lock()
    res = {"done": 0, "diff": 0, "err": 0, "dropped": 0}
    marks = {}

    def drop(i):
        path, body = mix[i]
        data = json.dumps(dict(body, max_tokens=200, ignore_eos=True))
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
                   "Content-Length: %d\r\n\r\n%s" % (path, key, len(data), data)).encode())
        time.sleep(0.01)
        s.close()

    def worker(w):
        for j in range(w, n, 6):
            i, dropped = plan[j]
            try:
                if dropped:
                    drop(i)
                    with lock:
                        res["dropped"] += 1
                else:
                    a = ans(i)
                    with lock:
                        res["done"] += 1
                        res["diff"] += a != ref[i]
            except Exception as e:                      # noqa: BLE001
                with lock:
                    res["err"] += 1
                    if res["err"] < 4:
                        print("  soak error:", e)
            if j == n // 10:
                marks["warm"] = rss_kb(pid)
    t0 = time.time()
    th = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    time.sleep(0.5)
    end = rss_kb(pid)
    warm = marks.get("warm", end)
    ok = res["err"] == 0 and res["diff"] == 0 and res["done"] + res["dropped"] == n and (not rss_mb or end - warm < rss_mb * 1024)
    print("%s soak requests=%d answered=%d dropped=%d differing=%d errors=%d wall_s=%.1f rss_warm_kb=%d rss_end_kb=%d" %
          ("PASS" if ok else "FAIL", n, res["done"], res["dropped"], res["diff"], res["err"], time.time() - t0, warm, end))
    sys.exit(0 if ok else 1)


def recv_all(s, got=b""):
    """Everything the peer sends until it closes."""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return got
        got += chunk


def cmd_drain(port, pid, n_tokens):
    """A stream is running when the server gets SIGTERM: it must end with a final
    chunk (finish_reason) and [DONE]."""
    port, pid, n_tokens = int(port), int(pid), int(n_tokens)
    body = json.dumps({"prompt": "The river", "max_tokens": n_tokens, "ignore_eos": True, "temperature": 0, "stream": True})
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
               "Connection: close\r\n\r\n%s" % (len(body), body)).encode())
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    os.kill(pid, signal.SIGTERM)
    got = recv_all(s, got)
    s.close()
    body = got.split(b"\r\n\r\n", 1)[1]
    # chunked transfer encoding: join the chunks
    data, rest = b"", body
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        k = int(size, 16)
        if k == 0:
            break
        data += rest[:k]
        rest = rest[k + 2:]
    _, final = sse_text(data)
    print("%s drain_stream_has_final_chunk finish_reason=%s tokens=%d" % ("PASS", final["choices"][0]["finish_reason"],
                                                                         final["dspark"]["generated_tokens"]))
    print(final["choices"][0]["finish_reason"])


def cmd_hostile(port, key):
    """Requests whose bytes end up in error messages (model names, URLs, methods,
    long multi-byte text cut by the message limit): every error body is valid
    UTF-8 JSON with an OpenAI error object."""
    port = int(port)
    cases = [
        ("POST", b"/v1/completions", b'{"model": "\xff\xfe caf\xc3", "prompt": "x"}'),
        ("POST", b"/v1/completions", b'{"model": "' + ("\u00e9" * 150).encode() + b'", "prompt": "x"}'),
        ("POST", b"/v1/completions", ('{"model": "' + "\u20ac" * 60 + '", "prompt": "x"}').encode()),
        ("GET", b"/v1/" + "\u00e9\u20ac".encode() * 80 + b"\xff", b""),
        ("GET", b"/\xc3", b""),
        ("DELETE", b"/v1/models", b""),
        ("POST", b"/v1/completions", b'{"prompt": "x", "' + "\u20ac".encode() * 40 + b'": 1}'),
        ("POST", b"/v1/completions", b'{"prompt": "x", "\xff\xfe": 1}'),
        ("POST", b"/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x", "\xe2\x82": 1}]}'),
    ]
    bad = 0
    for method, path, body in cases:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(method.encode() + b" " + path + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode() +
                  b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        raw = recv_all(s)
        s.close()
        head, _, payload = raw.partition(b"\r\n\r\n")
        status = int(head.split()[1]) if head else 0
        try:
            err = json.loads(payload.decode("utf-8"))["error"]     # strict UTF-8 decode
            ok = 400 <= status < 500 and isinstance(err["message"], str) and err["message"]
        except Exception as e:                          # noqa: BLE001
            ok, err = False, str(e)
        if not ok:
            bad += 1
            print("  hostile %s %r -> %d %r" % (method, path[:40], status, payload[:120]))
    print("%s error_bodies_valid_utf8 requests=%d bad=%d" % ("PASS" if not bad else "FAIL", len(cases), bad))
    sys.exit(1 if bad else 0)



def sse_parts(raw):
    """A streamed chat reply's parts: (reasoning, content, tool_calls, finish_reason)."""
    events = raw.decode("utf-8").split("\n\n")
    datas = [e[len("data: "):] for e in events[:-1] if e.startswith("data: ")]
    assert datas and datas[-1] == "[DONE]", "stream does not end with [DONE]"
    reasoning, content, calls, finish = "", "", [], None
    for d in datas[:-1]:
        o = json.loads(d)
        assert "error" not in o, "error event: %s" % d
        if not o["choices"]:
            continue
        ch = o["choices"][0]
        delta = ch.get("delta") or {}
        reasoning += delta.get("reasoning_content") or ""
        content += delta.get("content") or ""
        for c in delta.get("tool_calls") or []:
            assert c["index"] == len(calls), "tool call index %r" % c["index"]
            calls.append({k: c[k] for k in ("id", "type", "function")})
        finish = ch.get("finish_reason") or finish
    return reasoning, content, calls, finish


def gbnf_literal(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def cmd_chat_tools(port, jinja="1"):
    """Tool calls and reasoning_content end to end: the tiny model is steered by
    a grammar to write a Hermes <tool_call> block (or a think block), and the
    reply must come back as OpenAI tool_calls / reasoning_content, streamed
    and not, the stream adding up to the non-streamed message."""
    fails = 0

    def check(name, cond, detail=""):
        nonlocal fails
        print("%s %s%s" % ("PASS" if cond else "FAIL", name, "" if cond else ": " + str(detail)[:400]))
        fails += not cond

    tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    call_text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    base = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": tools, "max_tokens": 120,
            "temperature": 0, "grammar": "root ::= " + gbnf_literal(call_text)}
    st, out = post(port, "/v1/chat/completions", base)
    if jinja != "1":
        o = json.loads(out)
        check("tools_refused_without_jinja", st == 400 and o["error"]["param"] == "tools", out)
        sys.exit(1 if fails else 0)
    o = json.loads(out) if st == 200 else {}
    ch = (o.get("choices") or [{}])[0]
    msg = ch.get("message") or {}
    calls = msg.get("tool_calls") or []
    ok = (st == 200 and ch.get("finish_reason") == "tool_calls" and msg.get("content") is None and len(calls) == 1 and
          calls[0]["type"] == "function" and calls[0]["function"]["name"] == "get_weather" and
          json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"} and calls[0]["id"].startswith("call_"))
    check("tool_call_parsed", ok, out)
    st2, raw = post(port, "/v1/chat/completions", dict(base, stream=True))
    try:
        r, c, scalls, fin = sse_parts(raw)
        ok = st2 == 200 and r == "" and c == "" and fin == "tool_calls" and [x["function"] for x in scalls] == [x["function"] for x in calls]
    except Exception as e:                             # noqa: BLE001 - report, do not crash
        ok, scalls = False, str(e)
    check("tool_call_streamed_equals_whole", ok, raw)
    # the conversation continues: the assistant's call and the tool's answer go back through the template
    follow = {"messages": [{"role": "user", "content": "Weather in Oslo?"},
                           {"role": "assistant", "content": None, "tool_calls": calls},
                           {"role": "tool", "tool_call_id": calls[0]["id"] if calls else "x", "content": '{"temp_c": 3}'}],
              "tools": tools, "max_tokens": 8, "temperature": 0}
    st3, out3 = post(port, "/v1/chat/completions", follow)
    check("tool_result_turn_rendered", st3 == 200 and json.loads(out3)["choices"][0]["message"]["role"] == "assistant", out3)
    # reasoning: a think block at the start of the reply
    think = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 60, "temperature": 0,
             "grammar": "root ::= " + gbnf_literal("<think>\nplan it\n</think>\n\nHello there")}
    st4, out4 = post(port, "/v1/chat/completions", think)
    m4 = json.loads(out4)["choices"][0]["message"] if st4 == 200 else {}
    check("reasoning_content_split", m4.get("reasoning_content") == "plan it" and m4.get("content") == "Hello there", out4)
    st5, raw5 = post(port, "/v1/chat/completions", dict(think, stream=True))
    try:
        r, c, _, fin = sse_parts(raw5)
        ok = st5 == 200 and r == "plan it" and c == "Hello there" and fin == "stop"
    except Exception as e:                             # noqa: BLE001
        ok = False
    check("reasoning_content_streamed_equals_whole", ok, raw5)
    st6, out6 = post(port, "/v1/chat/completions", dict(think, reasoning_format="none"))
    m6 = json.loads(out6)["choices"][0]["message"] if st6 == 200 else {}
    check("reasoning_format_none_keeps_tags", m6.get("content") == "<think>\nplan it\n</think>\n\nHello there" and
          "reasoning_content" not in m6, out6)
    st7, out7 = post(port, "/v1/chat/completions", dict(base, tool_choice="required"))
    check("tool_choice_required_refused", st7 == 400 and json.loads(out7)["error"]["param"] == "tool_choice", out7)
    sys.exit(1 if fails else 0)

def cmd_gguf_template(src, dst, tmpl_file):
    """Copy a GGUF v3 file with tokenizer.chat_template set (the tensor data moves
    as a whole, so the tensor infos' offsets stay as they are)."""
    with open(tmpl_file, encoding="utf-8") as f:
        tmpl = f.read().encode()
    b = open(src, "rb").read()
    assert b[:4] == b"GGUF" and struct.unpack_from("<I", b, 4)[0] == 3
    n_t, n_kv = struct.unpack_from("<QQ", b, 8)
    o = 24
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip_val(o, t):
        if t == 8:
            return o + 8 + struct.unpack_from("<Q", b, o)[0]
        if t == 9:
            et, cnt = struct.unpack_from("<IQ", b, o)
            o += 12
            for _ in range(cnt):
                o = skip_val(o, et)
            return o
        return o + sizes[t]
    kvs, align = [], 32
    for _ in range(n_kv):
        k0 = o
        kl = struct.unpack_from("<Q", b, o)[0]
        name = b[o + 8:o + 8 + kl].decode()
        o += 8 + kl
        t = struct.unpack_from("<I", b, o)[0]
        o = skip_val(o + 4, t)
        if name == "general.alignment":
            align = struct.unpack_from("<I", b, o - 4)[0]
        if name != "tokenizer.chat_template":
            kvs.append(b[k0:o])
    t0 = o
    for _ in range(n_t):
        nl = struct.unpack_from("<Q", b, o)[0]
        o += 8 + nl
        nd = struct.unpack_from("<I", b, o)[0]
        o += 4 + 8 * nd + 4 + 8
    infos = b[t0:o]
    data_off = o + (align - o % align) % align
    kvs.append(struct.pack("<Q", 23) + b"tokenizer.chat_template" + struct.pack("<IQ", 8, len(tmpl)) + tmpl)
    head = b"GGUF" + struct.pack("<IQQ", 3, n_t, len(kvs)) + b"".join(kvs) + infos
    head += b"\0" * ((align - len(head) % align) % align)
    with open(dst, "wb") as f:
        f.write(head + b[data_off:])


# Concurrent clients of different settings: each one's stream must be what it
# gets alone (the engine batches their rows into shared steps; a row's bits
# are its own sequence's alone).
BATCH_MIX = [
    {"prompt": "The river", "max_tokens": 24, "temperature": 0},
    {"prompt": "It is a truth universally acknowledged, that", "max_tokens": 20, "temperature": 0.9, "seed": 5, "top_p": 0.95},
    {"prompt": "Once upon a time", "max_tokens": 18, "temperature": 0.7, "seed": 9, "logprobs": 3},
    {"prompt": "The package", "max_tokens": 22, "temperature": 1.0, "seed": 3, "min_p": 0.05, "presence_penalty": 0.6,
     "frequency_penalty": 0.4},
    {"prompt": "In the morning", "max_tokens": 16, "temperature": 0, "logit_bias": {"13": -100, "11": 5}, "logprobs": 2},
    {"prompt": "The sea", "max_tokens": 20, "temperature": 1.1, "seed": 21, "top_k": 40, "stop": [" the", "\n"]},
    {"prompt": "A list:", "max_tokens": 16, "temperature": 0, "n": 2},
    {"prompt": "Write JSON:", "max_tokens": 20, "temperature": 0.8, "seed": 2, "response_format": {"type": "json_object"}},
]


def stream_view(port, key, body, path):
    """What a streaming client sees: every choice's text, logprobs and finish_reason."""
    st, raw = req_json(port, key, path, dict(body, stream=True))
    if st != 200:
        raise AssertionError("status %d: %s" % (st, raw[:300]))
    sse_text(raw)                                       # the stream's shape
    view = {}
    for e in raw.decode().split("\n\n"):
        if not e.startswith("data: {"):
            continue
        o = json.loads(e[6:])
        for ch in o["choices"]:
            v = view.setdefault(ch["index"], ["", [], None])
            v[0] += (ch.get("delta") or {}).get("content") or ch.get("text") or ""
            lp = ch.get("logprobs")
            if lp:
                v[1] += list(zip(lp["tokens"], lp["token_logprobs"], [json.dumps(t, sort_keys=True) for t in lp["top_logprobs"]]))
            if ch.get("finish_reason"):
                v[2] = ch["finish_reason"]
    return json.dumps(sorted(view.items()))


def cmd_batch(port, key, n):
    port, n = int(port), int(n)
    path = "/v1/completions"
    ref = [stream_view(port, key, b, path) for b in BATCH_MIX]
    alone = [stream_view(port, key, b, path) for b in BATCH_MIX]
    steps0 = metric(port, "dspark_engine_steps_total", key)
    rows0 = metric(port, "dspark_batch_rows_sum", key)
    got, errors = [None] * n, []

    def client(c):
        try:
            got[c] = stream_view(port, key, BATCH_MIX[c % len(BATCH_MIX)], path)
        except Exception as e:                          # noqa: BLE001
            errors.append(str(e))

    th = [threading.Thread(target=client, args=(c,)) for c in range(n)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    diff = [c for c in range(n) if got[c] != ref[c % len(BATCH_MIX)]]
    steps = metric(port, "dspark_engine_steps_total", key) - steps0
    rows = metric(port, "dspark_batch_rows_sum", key) - rows0
    ok = ref == alone and not errors and not diff and steps > 0 and rows / steps > 1.5
    print("%s concurrent_streams_equal_alone clients=%d differing=%d errors=%d steps=%d rows_per_step=%.2f" %
          ("PASS" if ok else "FAIL", n, len(diff), len(errors), steps, rows / steps if steps else 0))
    for c in diff[:3]:
        print("  client %d: got %s\n    alone %s" % (c, got[c][:300], ref[c % len(BATCH_MIX)][:300]))
    for e in errors[:3]:
        print("  error:", e)
    sys.exit(0 if ok else 1)


def cmd_same(port_a, port_b, key):
    port_a, port_b = int(port_a), int(port_b)
    diff = 0
    for b in BATCH_MIX:
        keep = ("index", "text", "logprobs", "finish_reason")
        ca = [{k: c.get(k) for k in keep} for c in complete(port_a, key, dict(b, speculative=False))["choices"]]
        cb = [{k: c.get(k) for k in keep} for c in complete(port_b, key, dict(b, speculative=False))["choices"]]
        sa = stream_view(port_a, key, dict(b, speculative=False), "/v1/completions")
        sb = stream_view(port_b, key, dict(b, speculative=False), "/v1/completions")
        if ca != cb or sa != sb:
            diff += 1
            print("  %r:\n    A %s\n    B %s" % (b, json.dumps(ca)[:300], json.dumps(cb)[:300]))
    print("%s engine_equals_one_context requests=%d differing=%d" % ("PASS" if not diff else "FAIL", len(BATCH_MIX), diff))
    sys.exit(1 if diff else 0)


def cmd_prefix(port, key):
    port = int(port)
    words = ("the river runs past the old mill and the people of the town come down to it in the evening to talk "
             "about the weather and the harvest and the news from the city ").split()
    prompt = " ".join(words[i % len(words)] + ("," if i % 13 == 12 else "") for i in range(300))
    body = {"prompt": prompt, "max_tokens": 16, "temperature": 0}
    hit0 = metric(port, "dspark_prefix_cache_hit_tokens_total", key)
    a = complete(port, key, body)
    b = complete(port, key, body)
    c = complete(port, key, dict(body, stream=False, temperature=0.8, seed=4))
    hit = metric(port, "dspark_prefix_cache_hit_tokens_total", key) - hit0
    ratio = metric(port, "dspark_prefix_cache_hit_ratio", key)
    n = a["usage"]["prompt_tokens"]
    ok = (text_of(a) == text_of(b) and a["dspark"]["cached_tokens"] == 0 and b["dspark"]["cached_tokens"] >= n - 16 and
          c["dspark"]["cached_tokens"] >= n - 16 and hit >= 2 * (n - 16) and ratio > 0)
    print("%s prefix_cache_hit prompt_tokens=%d cached=%d,%d,%d hit_tokens=%d hit_ratio=%.3f first_prefill_s=%.4f "
          "cached_prefill_s=%.4f" % ("PASS" if ok else "FAIL", n, a["dspark"]["cached_tokens"], b["dspark"]["cached_tokens"],
                                     c["dspark"]["cached_tokens"], hit, ratio, a["dspark"]["prefill_s"], b["dspark"]["prefill_s"]))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"text": cmd_text, "sse": cmd_sse, "bad": cmd_bad, "load": cmd_load, "disconnect": cmd_disconnect,
     "queuefull": cmd_queuefull, "features": cmd_features, "prometheus": cmd_prometheus, "slowloris": cmd_slowloris,
     "dropped": cmd_dropped, "soak": cmd_soak, "drain": cmd_drain, "gguf_template": cmd_gguf_template,
     "hostile": cmd_hostile, "batch": cmd_batch, "prefix": cmd_prefix, "same": cmd_same,
     "chat_tools": cmd_chat_tools}[cmd](*args)
