// serve_openai.mjs — `dspark serve` through the official `openai` npm client
// (tests/cli_serve.sh installs it under build/ and copies this file next to
// its node_modules). argv: PORT KEY EXPECTED.json, where EXPECTED holds the
// texts curl got for the same requests: the client must see the same bytes,
// streamed or not.
import OpenAI from 'openai';
import { readFileSync } from 'node:fs';

const [port, key, expectedPath] = process.argv.slice(2);
let failed = 0;
const check = (ok, name, detail = '') => {
  console.log(`${ok ? 'PASS' : 'FAIL'} openai_${name}${ok ? '' : ' ' + detail}`);
  if (!ok) failed++;
};

// `drain PORT PID`: SIGTERM to the server while this client reads a stream;
// the stream must end the way a finished one does: a last chunk with a
// finish_reason, then the client's loop ends (no "terminated" error).
if (port === 'drain') {
  const [, p, pid] = process.argv.slice(2);
  const c = new OpenAI({ baseURL: `http://127.0.0.1:${p}/v1`, apiKey: 'unused', maxRetries: 0 });
  let n = 0, last = null, err = null;
  try {
    const stream = await c.chat.completions.create({ model: 'dspark-tiny', messages: [{ role: 'user', content: 'Tell me about the sea.' }],
      max_tokens: 200, temperature: 0, stream: true, ignore_eos: true });
    for await (const ch of stream) {
      if (++n === 3) process.kill(Number(pid), 'SIGTERM');
      if (ch.choices[0]?.finish_reason) last = ch.choices[0].finish_reason;
    }
  } catch (e) { err = String(e); }
  check(!err && last !== null, `drain_stream_final_chunk finish_reason=${last}`, err || 'no finish_reason');
  process.exit(failed ? 1 : 0);
}

const want = JSON.parse(readFileSync(expectedPath, 'utf8'));
// DSPARK_SERVE_SPEC=0: the server decodes plain when asked for speculative decoding (--gen engine)
const SPEC = process.env.DSPARK_SERVE_SPEC !== '0';
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: key, maxRetries: 0 });

const models = await client.models.list();
check(models.data.some((m) => m.id === 'dspark-tiny'), 'models_list', JSON.stringify(models.data));

const comp = { model: 'dspark-tiny', prompt: 'The river', max_tokens: 24, temperature: 0 };
const c = await client.completions.create(comp);
check(c.choices[0].text === want.completion, 'completion', JSON.stringify(c.choices[0].text));
check(c.dspark && c.dspark.kernels === 'canonical' && c.dspark.speculative === SPEC, 'completion_dspark_field');

let streamed = '';
for await (const ch of await client.completions.create({ ...comp, stream: true })) streamed += ch.choices[0]?.text ?? '';
check(streamed === want.completion, 'completion_stream', JSON.stringify(streamed));

const chat = { model: 'dspark-tiny', messages: [{ role: 'user', content: 'Tell me about the sea.' }], max_tokens: 20, temperature: 0 };
const r = await client.chat.completions.create(chat);
check(r.choices[0].message.content === want.chat && r.choices[0].message.role === 'assistant', 'chat',
  JSON.stringify(r.choices[0].message));

let chatStreamed = '';
for await (const ch of await client.chat.completions.create({ ...chat, stream: true }))
  chatStreamed += ch.choices[0]?.delta?.content ?? '';
check(chatStreamed === want.chat, 'chat_stream', JSON.stringify(chatStreamed));

const sampled = { ...comp, temperature: 0.9, seed: 5, top_p: 0.95, max_tokens: 20 };
const s1 = await client.completions.create(sampled);
const s2 = await client.completions.create({ ...sampled, speculative: false });
check(s1.choices[0].text === s2.choices[0].text && s1.dspark.speculative === SPEC && !s2.dspark.speculative,
  'sampled_spec_equals_plain');

// the feature table through the official client
const P = 'It is a truth universally acknowledged, that';
const plain = (await client.completions.create({ model: 'dspark-tiny', prompt: P, max_tokens: 40, temperature: 0 })).choices[0].text;
const stopAt = plain.slice(12, 15);
const stopped = await client.completions.create({ model: 'dspark-tiny', prompt: P, max_tokens: 40, temperature: 0, stop: [stopAt] });
check(stopped.choices[0].text === plain.slice(0, plain.indexOf(stopAt)) && stopped.choices[0].finish_reason === 'stop', 'stop',
  JSON.stringify([stopped.choices[0].text, stopAt]));
let stStop = '', stFinish = null;
for await (const ch of await client.chat.completions.create({ ...chat, stop: ['sea'], stream: true, max_tokens: 30 })) {
  stStop += ch.choices[0]?.delta?.content ?? '';
  if (ch.choices[0]?.finish_reason) stFinish = ch.choices[0].finish_reason;
}
const nsStop = await client.chat.completions.create({ ...chat, stop: ['sea'], max_tokens: 30 });
check(stStop === nsStop.choices[0].message.content && stFinish === nsStop.choices[0].finish_reason, 'stop_stream_equals_non_stream');
const r1 = await client.completions.create({ model: 'dspark-tiny', prompt: P, max_tokens: 16, temperature: 1 });
const r2 = await client.completions.create({ model: 'dspark-tiny', prompt: P, max_tokens: 16, temperature: 1 });
const r3 = await client.completions.create({ model: 'dspark-tiny', prompt: P, max_tokens: 16, temperature: 1, seed: r1.dspark.seed });
check(r1.choices[0].text !== r2.choices[0].text && r3.choices[0].text === r1.choices[0].text, 'random_seed_then_replay');
const lp = await client.chat.completions.create({ ...chat, logprobs: true, top_logprobs: 2, max_tokens: 8 });
check(lp.choices[0].logprobs.content.length === 8 && lp.choices[0].logprobs.content.every((t) => t.logprob <= 0 && t.top_logprobs.length === 2),
  'chat_logprobs');
const many = await client.completions.create({ model: 'dspark-tiny', prompt: P, max_tokens: 8, temperature: 1, seed: 3, n: 3 });
const one2 = await client.completions.create({ model: 'dspark-tiny', prompt: P, max_tokens: 8, temperature: 1, seed: 5 });
check(many.choices.length === 3 && many.choices.find((c) => c.index === 2).text === one2.choices[0].text, 'n_choices');
const js = await client.chat.completions.create({ ...chat, max_tokens: 40, temperature: 0.5, seed: 1,
  response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] } } } });
let jsOk = js.choices[0].finish_reason !== 'stop';
try { if (!jsOk) jsOk = Number.isInteger(JSON.parse(js.choices[0].message.content).a); } catch { jsOk = false; }
check(jsOk, 'response_format_json_schema', js.choices[0].message.content);
const pen = await client.completions.create({ model: 'dspark-tiny', prompt: P, max_tokens: 30, temperature: 0, frequency_penalty: 1.5,
  presence_penalty: 0.5, logit_bias: { 13: -100 } });
const penPlain = await client.completions.create({ model: 'dspark-tiny', prompt: P, max_tokens: 30, temperature: 0, frequency_penalty: 1.5,
  presence_penalty: 0.5, logit_bias: { 13: -100 }, speculative: false });
check(pen.choices[0].text === penPlain.choices[0].text && pen.choices[0].text !== plain.slice(0, pen.choices[0].text.length), 'penalties_bias_spec_equals_plain');
try {
  await client.completions.create({ model: 'dspark-tiny', prompt: P, max_tokens: 4, not_a_field: 1 });
  check(false, 'unknown_field_400', 'no error');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.status === 400 && /not_a_field/.test(e.message), 'unknown_field_400', String(e));
}

try {
  await client.completions.create({ ...comp, max_tokens: 'many' });
  check(false, 'bad_request_400', 'no error');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.status === 400, 'bad_request_400', String(e));
}
try {
  await new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'wrong', maxRetries: 0 }).completions.create(comp);
  check(false, 'wrong_key_401', 'no error');
} catch (e) {
  check(e instanceof OpenAI.AuthenticationError && e.status === 401, 'wrong_key_401', String(e));
}
process.exit(failed ? 1 : 0);
