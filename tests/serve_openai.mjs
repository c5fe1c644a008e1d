// serve_openai.mjs — `dspark serve` through the official `openai` npm client
// (tests/cli_serve.sh installs it under build/ and copies this file next to
// its node_modules). argv: PORT KEY EXPECTED.json, where EXPECTED holds the
// texts curl got for the same requests: the client must see the same bytes,
// streamed or not.
import OpenAI from 'openai';
import { readFileSync } from 'node:fs';

const [port, key, expectedPath] = process.argv.slice(2);
const want = JSON.parse(readFileSync(expectedPath, 'utf8'));
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: key, maxRetries: 0 });
let failed = 0;
const check = (ok, name, detail = '') => {
  console.log(`${ok ? 'PASS' : 'FAIL'} openai_${name}${ok ? '' : ' ' + detail}`);
  if (!ok) failed++;
};

const models = await client.models.list();
check(models.data.some((m) => m.id === 'dspark-tiny'), 'models_list', JSON.stringify(models.data));

const comp = { model: 'dspark-tiny', prompt: 'The river', max_tokens: 24, temperature: 0 };
const c = await client.completions.create(comp);
check(c.choices[0].text === want.completion, 'completion', JSON.stringify(c.choices[0].text));
check(c.dspark && c.dspark.kernels === 'canonical' && c.dspark.speculative === true, 'completion_dspark_field');

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
check(s1.choices[0].text === s2.choices[0].text && s1.dspark.speculative && !s2.dspark.speculative, 'sampled_spec_equals_plain');

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
