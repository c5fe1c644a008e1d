#!/bin/sh
# `dspark serve` on the shipped pair, with real clients on 127.0.0.1:
#   curl: health, models, auth (401), completions and chat, streamed and not
#     (the stream's text == the non-streamed text == `dspark generate`'s),
#     speculative == plain (greedy and sampled), the `dspark` field, metrics;
#   the feature table (serve_client.py features): stop strings exact under
#     speculative decoding wherever they fall, random seeds that replay (also
#     through `dspark generate -s`), logprobs, n > 1, response_format
#     json_object / json_schema, penalties, logit_bias, llama-server fields,
#     /tokenize /detokenize /props /slots, CORS; /metrics through a Prometheus
#     parser (histograms, KV gauges);
#   the official `openai` npm client (installed under build/ on first use;
#     SKIP only when npm cannot reach its registry): the same table, and a
#     SIGTERM mid-stream that must end with a final chunk; the Python `openai`
#     package when the machine has it (Debian does not: SKIP);
#   a corpus of malformed requests -> 4xx with an OpenAI error object, server alive;
#   a bounded load test (8 clients x 25 requests): nothing lost, every answer
#     identical to its single-client answer; a soak (2,000 mixed requests,
#     a tenth dropped mid-way): every answer equal, RSS flat;
#   the hazards: slow clients (150 sockets trickling bytes) cannot starve
#     /health and are cut at --request-timeout; dropped non-streamed requests
#     and a dropped long prefill free the slot at once; SIGTERM drains (a
#     stream finishes, exit 0) or cuts at --drain-timeout (finish_reason
#     "abort", [DONE], exit 1); NUL in a prompt is a 400;
#   chat templates read from a GGUF (a copy of the shipped target with one):
#     interpreted (Jinja) or a built-in family, --no-jinja, one neither takes;
#   tool calls and reasoning_content (grammar-steered replies of the tiny
#     model through a template with tools), streamed and not;
#   the batch engine (the default `--gen engine`, server A) against one context
#     per slot running the drafter (`--gen ctx`, server AC): the same answers
#     (engine == speculative == plain); concurrent streaming clients of
#     different settings get exactly what each gets alone, in batched steps;
#     a repeated long prompt is served from the prefix cache (/metrics);
#   a CPU server maps no CUDA library; `serve -v` starts without a
#     libmicrohttpd warning.
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
expect_err "serve --max-n above --queue" "max-n"        $D serve -m "$TGT" --max-n 9 --queue 4
expect_err "serve bad --request-timeout" "request-timeout" $D serve -m "$TGT" --request-timeout 0
expect_err "serve --port out of range" "out of range"   $D serve -m "$TGT" --port 70000
expect_err "serve --parallel 0"        "out of range"   $D serve -m "$TGT" --parallel 0
expect_err "serve unknown option"      "unknown option" $D serve -m "$TGT" --threads 4
expect_err "serve missing model"       "cannot open\|no such" $D serve -m "$T/nope.gguf"
expect_err "serve bad --host"          "--host"         $D serve -m "$TGT" --host 999.1.2.3.4
expect_err "serve empty --api-key"     "api-key"        $D serve -m "$TGT" --api-key ""
expect_err "serve unknown device"      "device"         $D serve -m "$TGT" --device tpu

KEY=secret-key
start A -m "$TGT" -md "$DR" --parallel 2 -t 1 --api-key "$KEY" --chat-template plain --max-body 65536 --max-tokens 64 \
    --cors-origins http://good.example
PA=$PORT_A
URL=http://127.0.0.1:$PA
AUTH="Authorization: Bearer $KEY"
cj() { curl -s -H "$AUTH" -H "Content-Type: application/json" "$@"; }

expect_err "serve on a port in use" "cannot listen" $D serve -m "$TGT" --port "$PA"
# the prompt chunk defaults to the device's (64 on the CPU) and never exceeds the step
grep -q " batch=512 ubatch=64 " "$T/A.log" && ok serve_ubatch_default_device_chunk || bad "serve_ubatch_default_device_chunk ($(grep -o 'batch=[0-9]* ubatch=[0-9]*' "$T/A.log"))"
PA_SAVE=$PORT
start U -m "$TGT" --parallel 1 -t 1 -b 32
grep -q " batch=32 ubatch=32 " "$T/U.log" && ok serve_ubatch_within_batch || bad "serve_ubatch_within_batch ($(grep -o 'batch=[0-9]* ubatch=[0-9]*' "$T/U.log"))"
kill "$PID_U" 2>/dev/null; wait "$PID_U" 2>/dev/null
PORT=$PA_SAVE

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
# (the engine runs batched speculative rounds: the same tokens as plain)
grep -q '"dspark":{"kernels":"canonical","speculative":true' "$T/c.json" && grep -q '"cached_tokens":' "$T/c.json" \
    && ok completion_dspark_field || bad completion_dspark_field
cj -N "$URL/v1/completions" -d '{"prompt":"The river","max_tokens":24,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' > "$T/s.txt"
$PY sse "$T/s.txt" > "$T/s_text.txt" && cmp -s "$T/s_text.txt" "$T/cli.txt" && grep -q '"usage":{"prompt_tokens"' "$T/s.txt" \
    && ok completion_stream_equals_non_stream || bad completion_stream_equals_non_stream

# ---- one context per slot with the drafter (--gen ctx): speculative == plain == the engine ----
# (under the sanitizers one sampled case: that pass hunts memory errors)
start AC -m "$TGT" -md "$DR" --gen ctx --parallel 2 -t 1 --api-key "$KEY" --chat-template plain --max-body 65536 --max-tokens 64 \
    --cors-origins http://good.example
URLC=http://127.0.0.1:$PORT_AC
grep -q 'gen=ctx speculative=yes' "$T/AC.log" && grep -q 'gen=engine speculative=yes' "$T/A.log" && ok serve_gen_modes || bad serve_gen_modes
cj "$URLC/v1/completions" -d '{"model":"dspark-tiny","prompt":"The river","max_tokens":24,"temperature":0}' > "$T/cc.json"
$PY text "$T/cc.json" | cmp -s - "$T/cli.txt" && grep -q '"dspark":{"kernels":"canonical","speculative":true' "$T/cc.json" \
    && grep -q '"accept_hist":\[' "$T/cc.json" && ok ctx_completion_dspark_field || bad ctx_completion_dspark_field
SWEEP='"temperature":0.9,"seed":5,"top_p":0.95'
[ -z "${DSPARK_SAN:-}" ] && SWEEP='"temperature":0 "temperature":0.9,"seed":5,"top_p":0.95 "temperature":1.1,"seed":8,"top_k":40,"min_p":0.05'
for params in $SWEEP; do
    body="{\"prompt\":\"It is a truth universally acknowledged, that\",\"max_tokens\":40,$params"
    cj "$URLC/v1/completions" -d "$body}" > "$T/sp.json"
    cj "$URLC/v1/completions" -d "$body,\"speculative\":false}" > "$T/pl.json"
    cj "$URL/v1/completions" -d "$body}" > "$T/en.json"
    if [ "$($PY text "$T/sp.json")" = "$($PY text "$T/pl.json")" ] && [ "$($PY text "$T/en.json")" = "$($PY text "$T/pl.json")" ] \
        && grep -q '"speculative":true' "$T/sp.json" && grep -q '"speculative":false' "$T/pl.json" && grep -q '"speculative":true' "$T/en.json"
    then ok "spec_equals_plain_equals_engine {$params}"; else bad "spec_equals_plain_equals_engine {$params}"; fi
done
# the engine's answers (processors, logprobs, n, grammars, stop strings) == one context's
$PY same "$PA" "$PORT_AC" "$KEY" || fail=1
# the feature table with the drafter running (stop strings inside accepted blocks, ...)
if [ -z "${DSPARK_SAN:-}" ]; then DSPARK_BIN=$D DSPARK_TARGET=$TGT $PY features "$PORT_AC" "$KEY" || fail=1; fi
kill -TERM "$PID_AC"

# ---- the engine: concurrent streams == alone, batched; the prefix cache -------------------
$PY batch "$PA" "$KEY" 16 || fail=1
$PY prefix "$PA" "$KEY" || fail=1
# a pool of 12 pages (192 positions) for 8 sequences: preemption (recompute), the same answers;
# a prompt the pool can never hold is a 400, not a failure
start KV -m "$TGT" --parallel 8 -t 1 --kv-pages 12
$PY batch "$PORT_KV" "" 16 || fail=1
curl -s "http://127.0.0.1:$PORT_KV/metrics" | awk '/^dspark_engine_preemptions_total/ { p = $2 } /^dspark_generations_failed_total/ { f = $2 }
    END { exit !(p > 0 && f == 0) }' && ok "small_pool_preempts_nothing_failed" || bad small_pool_preempts_nothing_failed
python3 -c "import json; print(json.dumps({'prompt': ' '.join(['river'] * 300), 'max_tokens': 8}))" > "$T/big.json"
code=$(curl -s -o "$T/big_out.json" -w '%{http_code}' "http://127.0.0.1:$PORT_KV/v1/completions" -d @"$T/big.json")
[ "$code" = 400 ] && grep -q 'pool holds 12' "$T/big_out.json" && ok small_pool_prompt_too_big_400 || bad "small_pool_prompt_too_big_400 ($code)"
kill -TERM "$PID_KV"

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

# ---- the feature table, /metrics through a Prometheus parser ------------------------
DSPARK_BIN=$D DSPARK_TARGET=$TGT $PY features "$PA" "$KEY" || fail=1
$PY prometheus "$PA" "$KEY" || fail=1

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

if python3 -c "import openai" 2>/dev/null; then
    python3 - "$PA" "$KEY" "$T/cli.txt" <<'PYEOF' || fail=1
import sys, openai
c = openai.OpenAI(base_url="http://127.0.0.1:%s/v1" % sys.argv[1], api_key=sys.argv[2], max_retries=0)
t = c.completions.create(model="dspark-tiny", prompt="The river", max_tokens=24, temperature=0).choices[0].text
ok = t == open(sys.argv[3]).read()
print("%s python_openai_completion" % ("PASS" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PYEOF
else
    echo "SKIP python_openai (no Python openai package here; Debian does not package it)"
fi

# ---- malformed requests ------------------------------------------------------------
$PY bad "$PA" "$KEY" tests/data/serve_bad_requests.txt || fail=1
$PY hostile "$PA" "$KEY" || fail=1

# ---- load: 8 clients x 25 requests ---------------------------------------------------
# (under the sanitizers: 8 clients x 3 requests, for the races, not the numbers)
if [ -n "${DSPARK_SAN:-}" ]; then $PY load "$PA" "$KEY" 8 3 || fail=1; else $PY load "$PA" "$KEY" 8 25 || fail=1; fi

# ---- soak: 2,000 mixed requests, a tenth dropped mid-way -------------------------------
# (under the sanitizers: 100 requests and no RSS bound: ASan's quarantine keeps freed memory)
if [ -n "${DSPARK_SAN:-}" ]; then $PY soak "$PA" "$KEY" 100 "$PID_A" 0 || fail=1; else $PY soak "$PA" "$KEY" 2000 "$PID_A" 16 || fail=1; fi

# ---- no CUDA library linked or mapped for the CPU (a CUDA build loads its module only for
# --device cuda; in a CPU-only build this holds trivially) ----------------------------------
if ldd "$D" "$B/libdspark.so" 2>/dev/null | grep -qi 'libcuda\|libcudart\|libcublas'; then bad "binary_links_no_cuda: $(ldd "$D" | grep -i cud)"
else ok "binary_links_no_cuda (dspark, libdspark.so)"; fi
if [ -f "$B/libdspark-cuda.so" ]; then
    DSPARK_CUDA_MODULE=/nonexistent/libdspark-cuda.so $D devices 2>&1 | grep -q 'device=cuda status=unavailable reason="cuda: the CUDA module' \
        && ok cuda_module_missing_said || bad cuda_module_missing_said
fi
if grep -qi 'libcuda\|libcudart\|libcublas\|libnvrtc' "/proc/$PID_A/maps"; then bad "cpu_server_maps_no_cuda"
else ok "cpu_server_maps_no_cuda ($(grep -c . "/proc/$PID_A/maps") mappings, none CUDA)"; fi

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
$PY dropped "$PORT_C" || fail=1
code=$(curl -s -o "$T/nochat.json" -w '%{http_code}' "http://127.0.0.1:$PORT_C/v1/chat/completions" -d "$CHAT")
[ "$code" = 400 ] && grep -q 'chat_template_unsupported' "$T/nochat.json" && ok chat_without_template_400 || bad "chat_without_template_400 ($code)"

# ---- a full queue: 503 ------------------------------------------------------------
if [ -z "${DSPARK_SAN:-}" ]; then
    start Q -m "$TGT" --parallel 1 -t 1 --queue 1
    $PY queuefull "$PORT_Q" || fail=1
fi

# ---- slow clients: from 127.0.0.2, under a per-IP limit, cut at the deadline -------------
start S -m "$TGT" --parallel 1 -t 1 --request-timeout 2 --max-connections-per-ip 64
$PY slowloris "$PORT_S" || fail=1

# ---- chat templates from a GGUF: one it renders, one it refuses ---------------------------
printf '%s' "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}" > "$T/chatml.jinja"
printf '%s' "{% for m in messages %}Human: {{ m['content'] }}{% endfor %}" > "$T/odd.jinja"
$PY gguf_template "$TGT" "$T/chatml.gguf" "$T/chatml.jinja" && $PY gguf_template "$TGT" "$T/odd.gguf" "$T/odd.jinja" || bad gguf_template_copy
start TPL -m "$T/chatml.gguf" --parallel 1 -t 1
grep -q 'chat_template=chatml' "$T/TPL.log" && ok chat_template_detected_from_gguf || bad chat_template_detected_from_gguf
curl -s "http://127.0.0.1:$PORT_TPL/v1/chat/completions" -d "$CHAT" > "$T/tpl.json"
printf '<|im_start|>user\nTell me about the sea.<|im_end|>\n<|im_start|>assistant\n' > "$T/tpl_prompt.txt"
$D generate -m "$T/chatml.gguf" -f "$T/tpl_prompt.txt" -n 20 -t 1 2>/dev/null | head -c -1 > "$T/tpl_cli.txt"
$PY text "$T/tpl.json" > "$T/tpl.txt" && cmp -s "$T/tpl.txt" "$T/tpl_cli.txt" && ok chat_template_gguf_equals_generate || bad chat_template_gguf_equals_generate
grep -q 'chat_template_source=jinja family=chatml' "$T/TPL.log" && ok chat_template_source_logged || bad chat_template_source_logged
# a family no built-in knows: the interpreted template renders it (== generate on
# its text); with --no-jinja it is refused, as is a template neither path handles
start ODD -m "$T/odd.gguf" --parallel 1 -t 1
curl -s "http://127.0.0.1:$PORT_ODD/v1/chat/completions" -d "$CHAT" > "$T/odd.json"
printf 'Human: Tell me about the sea.' > "$T/odd_prompt.txt"
$D generate -m "$T/odd.gguf" -f "$T/odd_prompt.txt" -n 20 -t 1 2>/dev/null | head -c -1 > "$T/odd_cli.txt"
$PY text "$T/odd.json" > "$T/odd.txt" && cmp -s "$T/odd.txt" "$T/odd_cli.txt" && grep -q 'chat_template_source=jinja family=none' "$T/ODD.log" \
    && ok chat_template_jinja_renders_unknown_family || bad chat_template_jinja_renders_unknown_family
start ODDNJ -m "$T/odd.gguf" --parallel 1 -t 1 --no-jinja
code=$(curl -s -o "$T/odd.json" -w '%{http_code}' "http://127.0.0.1:$PORT_ODDNJ/v1/chat/completions" -d "$CHAT")
[ "$code" = 400 ] && grep -q 'chat_template_unsupported' "$T/odd.json" && grep -q 'chat requests will be refused' "$T/ODDNJ.log" \
    && ok chat_template_unknown_refused_no_jinja || bad "chat_template_unknown_refused_no_jinja ($code)"
printf '%s' "{% filter upper %}{% for m in messages %}Q: {{ m['content'] }}{% endfor %}{% endfilter %}" > "$T/macro.jinja"
$PY gguf_template "$TGT" "$T/macro.gguf" "$T/macro.jinja" || bad gguf_template_copy
start MAC -m "$T/macro.gguf" --parallel 1 -t 1
code=$(curl -s -o "$T/mac.json" -w '%{http_code}' "http://127.0.0.1:$PORT_MAC/v1/chat/completions" -d "$CHAT")
[ "$code" = 400 ] && grep -q 'chat_template_unsupported' "$T/mac.json" && grep -q 'jinja_unused=".*filter' "$T/MAC.log" \
    && grep -q 'chat requests will be refused' "$T/MAC.log" && ok chat_template_uninterpretable_refused || bad "chat_template_uninterpretable_refused ($code)"
kill -TERM "$PID_TPL" "$PID_ODD" "$PID_ODDNJ" "$PID_MAC" "$PID_S"

# ---- tool calls and reasoning_content through a GGUF template with tools ---------------------
$PY gguf_template "$TGT" "$T/tools.gguf" tests/data/chatml_tools.jinja || bad gguf_template_copy
start TOOLS -m "$T/tools.gguf" -md "$DR" --parallel 1 -t 1
$PY chat_tools "$PORT_TOOLS" || fail=1
if [ -z "${DSPARK_SAN:-}" ] && [ -f "$NPM_DIR/node_modules/openai/package.json" ]; then
    node "$NPM_DIR/serve_openai.mjs" tools "$PORT_TOOLS" || fail=1
fi
start TOOLSNJ -m "$T/tools.gguf" --parallel 1 -t 1 --no-jinja
$PY chat_tools "$PORT_TOOLSNJ" 0 || fail=1
kill -TERM "$PID_TOOLS" "$PID_TOOLSNJ"

# ---- SIGTERM: a stream drains (exit 0), or is cut at --drain-timeout (exit 1) ---------------
start D1 -m "$TGT" -md "$DR" --parallel 1 -t 1
fin=$($PY drain "$PORT_D1" "$PID_D1" 100 | tail -n 1)
wait "$PID_D1"; rc=$?
[ "$fin" = length ] && [ $rc -eq 0 ] && grep -q 'cut=0' "$T/D1.log" && ok "sigterm_drains_stream (finish=$fin rc=$rc)" \
    || bad "sigterm_drains_stream (finish=$fin rc=$rc)"
# (0.02 s: a 480-token stream cannot end inside it; at 0.2 s the engine on a quiet CPU sometimes finished first)
start D2 -m "$TGT" -md "$DR" --parallel 1 -t 1 --drain-timeout 0.02
fin=$($PY drain "$PORT_D2" "$PID_D2" 480 | tail -n 1)
wait "$PID_D2"; rc=$?
[ "$fin" = abort ] && [ $rc -eq 1 ] && grep -q 'cut=1' "$T/D2.log" && ok "sigterm_cuts_at_drain_timeout (finish=$fin rc=$rc)" \
    || bad "sigterm_cuts_at_drain_timeout (finish=$fin rc=$rc)"
if [ -z "${DSPARK_SAN:-}" ] && [ -f "$NPM_DIR/node_modules/openai/package.json" ]; then
    start D3 -m "$TGT" --parallel 1 -t 1 --chat-template plain
    node "$NPM_DIR/serve_openai.mjs" drain "$PORT_D3" "$PID_D3" || fail=1
    wait "$PID_D3"
fi

# ---- serve -v: no libmicrohttpd warning at start -------------------------------------------
start V -m "$TGT" --parallel 1 -t 1 -v
sleep 0.2
grep -q '^mhd:' "$T/V.log" && bad "serve_v_no_mhd_warning: $(grep '^mhd:' "$T/V.log" | head -n 1)" || ok serve_v_no_mhd_warning
kill -TERM "$PID_V"

# ---- SIGTERM stops the server ------------------------------------------------------------
kill -TERM "$PID_C"
i=0
while kill -0 "$PID_C" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
wait "$PID_C" 2>/dev/null
rc=$?
[ $i -lt 100 ] && [ $rc -eq 0 ] && ok sigterm_stops_server || bad "sigterm_stops_server (rc=$rc)"
[ "$fail" -eq 0 ]
