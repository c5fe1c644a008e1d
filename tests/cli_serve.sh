#!/bin/sh
# `dspark serve` on the shipped pair, with real clients on 127.0.0.1:
#   curl: health, models, auth (401), completions and chat, streamed and not
#     (the stream's text == the non-streamed text == `dspark generate`'s),
#     speculative == plain (greedy and sampled), the `dspark` field, metrics;
#   the official `openai` npm client (installed under build/ on first use;
#     SKIP only when npm cannot reach its registry);
#   a corpus of malformed requests -> 4xx with an OpenAI error object, server alive;
#   a bounded load test (8 clients x 25 requests): nothing lost, every answer
#     identical to its single-client answer;
#   a client that disconnects mid-stream frees the only slot;
#   chat without a known template -> 400; a full queue -> 503; SIGTERM stops
#   the server.
# Servers listen on port 0 (the kernel picks a free port; the server prints
# it), and the trap stops every server this script started.
set -u
B=${BUILD:-build}
D=$B/dspark
TGT=models/dspark-tiny-q8_0.gguf
[ -f "$TGT" ] || TGT=models/dspark-tiny-f16.gguf
DR=models/dspark-tiny-drafter-f16.gguf
PY="python3 tests/serve_client.py"
T=$(mktemp -d)
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    for p in $PIDS; do wait "$p" 2>/dev/null; done
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
fail=0
ok()  { echo "PASS $1"; }
bad() { echo "FAIL $1"; fail=1; }

# start NAME ARGS...: start a server, wait for its "listening" line, set PORT.
start() {
    name=$1; shift
    $D serve "$@" --port 0 > "$T/$name.log" 2>&1 &
    pid=$!
    PIDS="$PIDS $pid"
    eval "PID_$name=$pid"
    i=0
    while ! grep -q "listening on" "$T/$name.log" 2>/dev/null; do
        i=$((i + 1))
        if [ $i -gt 600 ] || ! kill -0 "$pid" 2>/dev/null; then
            echo "FAIL server $name did not start:"; cat "$T/$name.log"; exit 1
        fi
        sleep 0.1
    done
    PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$T/$name.log")
    eval "PORT_$name=$PORT"
}

# ---- user errors: one line, exit 2 --------------------------------------------
. tests/lib_cli.sh   # expect_err
expect_err "serve without -m"          "no model"       $D serve
expect_err "serve bad --chat-template" "chat-template"  $D serve -m "$TGT" --chat-template jinja
expect_err "serve --port out of range" "out of range"   $D serve -m "$TGT" --port 70000
expect_err "serve --parallel 0"        "out of range"   $D serve -m "$TGT" --parallel 0
expect_err "serve unknown option"      "unknown option" $D serve -m "$TGT" --threads 4
expect_err "serve missing model"       "cannot open\|no such" $D serve -m "$T/nope.gguf"
expect_err "serve bad --host"          "--host"         $D serve -m "$TGT" --host 999.1.2.3.4
expect_err "serve empty --api-key"     "api-key"        $D serve -m "$TGT" --api-key ""
expect_err "serve unknown device"      "device"         $D serve -m "$TGT" --device tpu

KEY=secret-key
start A -m "$TGT" -md "$DR" --parallel 2 -t 1 --api-key "$KEY" --chat-template plain --max-body 65536 --max-tokens 64
PA=$PORT_A
URL=http://127.0.0.1:$PA
AUTH="Authorization: Bearer $KEY"
cj() { curl -s -H "$AUTH" -H "Content-Type: application/json" "$@"; }

expect_err "serve on a port in use" "cannot listen" $D serve -m "$TGT" --port "$PA"

# ---- basics -----------------------------------------------------------------
[ "$(curl -s "$URL/health")" = '{"status":"ok"}' ] && ok health || bad health
code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/models")
[ "$code" = 401 ] && ok models_without_key_401 || bad "models_without_key_401 (got $code)"
cj "$URL/v1/models" | grep -q '"id":"dspark-tiny"' && ok models_list || bad models_list

# ---- completions: non-streamed == streamed == dspark generate ----------------------
$D generate -m "$TGT" -md "$DR" -p "The river" -n 24 -t 1 2>/dev/null | head -c -1 > "$T/cli.txt"
cj "$URL/v1/completions" -d '{"model":"dspark-tiny","prompt":"The river","max_tokens":24,"temperature":0}' > "$T/c.json"
$PY text "$T/c.json" > "$T/c.txt" || bad completion_json
cmp -s "$T/c.txt" "$T/cli.txt" && ok completion_equals_dspark_generate || bad completion_equals_dspark_generate
grep -q '"dspark":{"kernels":"canonical","speculative":true' "$T/c.json" && grep -q '"accept_hist":\[' "$T/c.json" \
    && ok completion_dspark_field || bad completion_dspark_field
cj -N "$URL/v1/completions" -d '{"prompt":"The river","max_tokens":24,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' > "$T/s.txt"
$PY sse "$T/s.txt" > "$T/s_text.txt" && cmp -s "$T/s_text.txt" "$T/cli.txt" && grep -q '"usage":{"prompt_tokens"' "$T/s.txt" \
    && ok completion_stream_equals_non_stream || bad completion_stream_equals_non_stream

# ---- speculative == plain, greedy and sampled ----------------------------------
for params in '"temperature":0' '"temperature":0.9,"seed":5,"top_p":0.95' '"temperature":1.1,"seed":8,"top_k":40,"min_p":0.05'; do
    cj "$URL/v1/completions" -d "{\"prompt\":\"It is a truth universally acknowledged, that\",\"max_tokens\":40,$params}" > "$T/sp.json"
    cj "$URL/v1/completions" -d "{\"prompt\":\"It is a truth universally acknowledged, that\",\"max_tokens\":40,$params,\"speculative\":false}" > "$T/pl.json"
    if [ "$($PY text "$T/sp.json")" = "$($PY text "$T/pl.json")" ] && grep -q '"speculative":true' "$T/sp.json" \
        && grep -q '"speculative":false' "$T/pl.json"; then ok "spec_equals_plain {$params}"; else bad "spec_equals_plain {$params}"; fi
done

# ---- chat (plain template on this model) ----------------------------------------
CHAT='{"messages":[{"role":"user","content":"Tell me about the sea."}],"max_tokens":20,"temperature":0}'
cj "$URL/v1/chat/completions" -d "$CHAT" > "$T/chat.json"
cj -N "$URL/v1/chat/completions" -d "$(echo "$CHAT" | sed 's/}$/,"stream":true}/')" > "$T/chat_s.txt"
$PY text "$T/chat.json" > "$T/chat.txt" && $PY sse "$T/chat_s.txt" > "$T/chat_s_text.txt" && cmp -s "$T/chat.txt" "$T/chat_s_text.txt" \
    && grep -q '"object":"chat.completion"' "$T/chat.json" && grep -q '"role":"assistant"' "$T/chat_s.txt" \
    && ok chat_stream_equals_non_stream || bad chat_stream_equals_non_stream
printf 'User: Tell me about the sea.\nAssistant:' > "$T/chat_prompt.txt"
$D generate -m "$TGT" -f "$T/chat_prompt.txt" -n 20 -t 1 2>/dev/null | head -c -1 > "$T/chat_cli.txt"
cmp -s "$T/chat.txt" "$T/chat_cli.txt" && ok chat_plain_template_equals_generate || bad chat_plain_template_equals_generate

# ---- the official openai client --------------------------------------------------
NPM_DIR=build/npm-openai                  # one cache for the plain and sanitizer runs
if [ -n "${DSPARK_SAN:-}" ]; then
    echo "SKIP openai_client (sanitizer run: the plain run covers it)"
elif [ ! -f "$NPM_DIR/node_modules/openai/package.json" ]; then
    mkdir -p "$NPM_DIR"
    timeout 120 npm install --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error openai@5 > "$T/npm.log" 2>&1 || true
fi
if [ -n "${DSPARK_SAN:-}" ]; then :
elif [ -f "$NPM_DIR/node_modules/openai/package.json" ]; then
    cp tests/serve_openai.mjs "$NPM_DIR/serve_openai.mjs"
    python3 -c "import json,sys; print(json.dumps({'completion': open(sys.argv[1]).read(), 'chat': open(sys.argv[2]).read()}))" \
        "$T/cli.txt" "$T/chat.txt" > "$T/expected.json"
    node "$NPM_DIR/serve_openai.mjs" "$PA" "$KEY" "$T/expected.json" || fail=1
else
    echo "SKIP openai_client (npm cannot reach the registry: $(tail -n 1 "$T/npm.log"))"
fi

# ---- malformed requests ------------------------------------------------------------
$PY bad "$PA" "$KEY" tests/data/serve_bad_requests.txt || fail=1

# ---- load: 8 clients x 25 requests ---------------------------------------------------
# (under the sanitizers: 8 clients x 3 requests, for the races, not the numbers)
if [ -n "${DSPARK_SAN:-}" ]; then $PY load "$PA" "$KEY" 8 3 || fail=1; else $PY load "$PA" "$KEY" 8 25 || fail=1; fi

# ---- metrics ---------------------------------------------------------------------------
cj "$URL/metrics" > "$T/metrics.txt"
for k in dspark_requests_total dspark_generated_tokens_total dspark_tokens_per_second dspark_spec_acceptance_ratio \
         'dspark_responses_total{code="400"}' dspark_queue_length; do
    grep -q "^$k" "$T/metrics.txt" || { bad "metrics has $k"; }
done
awk '/^dspark_generated_tokens_total/ { exit !($2 > 200) }' "$T/metrics.txt" && ok metrics_counts || bad metrics_counts

# ---- one slot, a client that leaves mid-stream; chat without a template -----------------
start C -m "$TGT" -md "$DR" --parallel 1 -t 1
$PY disconnect "$PORT_C" || fail=1
code=$(curl -s -o "$T/nochat.json" -w '%{http_code}' "http://127.0.0.1:$PORT_C/v1/chat/completions" -d "$CHAT")
[ "$code" = 400 ] && grep -q 'chat_template_unsupported' "$T/nochat.json" && ok chat_without_template_400 || bad "chat_without_template_400 ($code)"

# ---- a full queue: 503 ------------------------------------------------------------
start Q -m "$TGT" --parallel 1 -t 1 --queue 1
$PY queuefull "$PORT_Q" || fail=1

# ---- SIGTERM stops the server ------------------------------------------------------------
kill -TERM "$PID_C"
i=0
while kill -0 "$PID_C" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
wait "$PID_C" 2>/dev/null
rc=$?
[ $i -lt 100 ] && [ $rc -eq 0 ] && ok sigterm_stops_server || bad "sigterm_stops_server (rc=$rc)"
[ "$fail" -eq 0 ]
