// dsv4 serve driven by the official `openai` npm client: the answers, streamed and not, the
// batching invariants (a request in a batch == alone), n > 1 through fork, the prefix cache.
const test = require('node:test');
const assert = require('node:assert');
const { OpenAI } = require('openai');
const { startServer, metric, collectChat } = require('./harness.cjs');

let srv, client;
test.before(async () => {
  srv = await startServer(['--max-batch', '8']);
  client = new OpenAI({ baseURL: srv.base, apiKey: 'unused', maxRetries: 0 });
});
test.after(async () => srv && srv.stop());

const chat = (content, extra = {}) => ({
  model: 'demo',
  messages: [{ role: 'user', content }],
  max_tokens: 24,
  temperature: 0.8,
  seed: 7,
  ...extra,
});

test('models, health and metrics', async () => {
  const models = await client.models.list();
  assert.strictEqual(models.data.length, 1);
  assert.strictEqual(models.data[0].id, 'demo-model');
  assert.strictEqual((await client.models.retrieve('demo-model')).id, 'demo-model');
  await assert.rejects(client.models.retrieve('gpt-4'), (e) => e.status === 404 && e.code === 'model_not_found');
  const health = await (await fetch(srv.url + '/health')).json();
  assert.strictEqual(health.status, 'ok');
  const m = await (await fetch(srv.url + '/metrics')).text();
  assert.match(m, /# TYPE dsv4_time_to_first_token_seconds histogram/);
});

test('non-streamed answer == concatenated stream (thinking mode)', async () => {
  const full = await client.chat.completions.create(chat('Hello there'));
  const msg = full.choices[0].message;
  assert.ok(msg.content.length + msg.reasoning_content.length > 0, 'some text');
  const streamed = await collectChat(await client.chat.completions.create({ ...chat('Hello there'), stream: true,
    stream_options: { include_usage: true } }));
  assert.strictEqual(streamed.choices[0].content, msg.content);
  assert.strictEqual(streamed.choices[0].reasoning_content, msg.reasoning_content);
  assert.strictEqual(streamed.choices[0].finish_reason, full.choices[0].finish_reason);
  assert.strictEqual(streamed.usage.completion_tokens, full.usage.completion_tokens);
  assert.strictEqual(streamed.usage.prompt_tokens, full.usage.prompt_tokens);
  // Reasoning tokens (the tokens through </think>) and DeepSeek's cache fields, both forms alike.
  const r = full.usage.completion_tokens_details.reasoning_tokens;
  assert.ok(r > 0 && r <= full.usage.completion_tokens, JSON.stringify(full.usage));
  assert.strictEqual(streamed.usage.completion_tokens_details.reasoning_tokens, r);
  assert.strictEqual(full.usage.prompt_cache_hit_tokens + full.usage.prompt_cache_miss_tokens, full.usage.prompt_tokens);
  assert.strictEqual(full.usage.prompt_cache_hit_tokens, full.usage.prompt_tokens_details.cached_tokens);
  const plain = await client.chat.completions.create(chat('Hello there', { thinking: { type: 'disabled' } }));
  assert.strictEqual(plain.usage.completion_tokens_details.reasoning_tokens, 0);
});

test('chat mode has no reasoning; stop strings cut the text', async () => {
  const base = chat('Tell me something', { thinking: { type: 'disabled' }, temperature: 0, max_tokens: 16 });
  const a = await client.chat.completions.create(base);
  assert.strictEqual(a.choices[0].message.reasoning_content, undefined);
  const text = a.choices[0].message.content;
  assert.ok(text.length > 4, 'chat-mode text: ' + JSON.stringify(text));
  const stop = text.slice(2, 4);
  const b = await client.chat.completions.create({ ...base, stop: [stop] });
  assert.strictEqual(b.choices[0].message.content, text.slice(0, text.indexOf(stop)));
  assert.strictEqual(b.choices[0].finish_reason, 'stop');
  // chat_template_kwargs switches thinking too: same prompt as thinking: disabled.
  const c = await client.chat.completions.create({ ...chat('Tell me something', { temperature: 0, max_tokens: 16 }),
    chat_template_kwargs: { thinking: false } });
  assert.strictEqual(c.choices[0].message.content, text);
});

test('8 concurrent requests each equal the same request alone', async () => {
  // Some pick on the host (a penalty, log-probabilities, a bias): a step picks those rows on the
  // thread pool together.
  const host = [{}, { presence_penalty: 0.6 }, { frequency_penalty: 0.4 }, { logprobs: true, top_logprobs: 2 }];
  const reqs = Array.from({ length: 8 }, (_, i) => chat(`Question number ${i}: ${'why '.repeat(i)}?`,
    { seed: 100 + i, ...host[i % 4], ...(i === 4 ? { logit_bias: { 72: 2 } } : {}) }));
  const alone = [];
  for (const r of reqs) alone.push(await client.chat.completions.create(r));
  const before = await metric(srv.url, 'dsv4_steps_total');
  const together = await Promise.all(reqs.map((r, i) =>
    i % 2 ? client.chat.completions.create(r)
          : client.chat.completions.create({ ...r, stream: true }).then(collectChat)));
  for (let i = 0; i < 8; ++i) {
    const t = i % 2 ? together[i].choices[0].message : together[i].choices[0];
    assert.strictEqual(t.content, alone[i].choices[0].message.content, `request ${i}`);
    assert.strictEqual(t.reasoning_content, alone[i].choices[0].message.reasoning_content, `request ${i}`);
  }
  // They were batched: far fewer steps than 8 requests x 24 tokens.
  const steps = (await metric(srv.url, 'dsv4_steps_total')) - before;
  assert.ok(steps < 8 * 24, `steps ${steps}`);
});

test('n = 3: three choices from one prefill, each == a single request with its seed', async () => {
  const prompt = 'Pick three colours. '.repeat(8);
  const before = await metric(srv.url, 'dsv4_prefill_tokens_total');
  const three = await client.chat.completions.create(chat(prompt, { n: 3, seed: 40, max_tokens: 12 }));
  const fed = (await metric(srv.url, 'dsv4_prefill_tokens_total')) - before;
  assert.strictEqual(three.choices.length, 3);
  assert.ok(fed <= three.usage.prompt_tokens, `prefilled ${fed} tokens for a ${three.usage.prompt_tokens}-token prompt`);
  for (let i = 0; i < 3; ++i) {
    const one = await client.chat.completions.create(chat(prompt, { seed: 40 + i, max_tokens: 12 }));
    assert.strictEqual(three.choices[i].message.content, one.choices[0].message.content, `choice ${i}`);
    assert.strictEqual(three.choices[i].message.reasoning_content, one.choices[0].message.reasoning_content, `choice ${i}`);
  }
});

// Without log-probabilities a decode pick runs inside the engine's step (StepRequest::sampler: on
// cuda on the device); with them it is made from the logits. Both must pick the same tokens.
test('a pick inside the step == a pick from the logits (logprobs asked)', async () => {
  for (const extra of [{ seed: 11 }, { seed: 12, top_k: 40, top_p: 0.9 }, { temperature: 0 }]) {
    const r = chat('Name a river. '.repeat(3), { max_tokens: 16, ...extra });
    const inStep = await client.chat.completions.create(r);
    const fromLogits = await client.chat.completions.create({ ...r, logprobs: true });
    assert.ok(fromLogits.choices[0].logprobs.content.length > 1, 'log-probabilities came back');
    assert.strictEqual(inStep.choices[0].message.content, fromLogits.choices[0].message.content, JSON.stringify(extra));
    assert.strictEqual(inStep.choices[0].message.reasoning_content, fromLogits.choices[0].message.reasoning_content,
      JSON.stringify(extra));
  }
});

test('a repeated multi-turn conversation hits the prefix cache with identical output', async () => {
  const first = chat('Remember the number 42.', { temperature: 0, max_tokens: 10 });
  const r1 = await client.chat.completions.create(first);
  const turn2 = {
    ...first,
    messages: [...first.messages, { role: 'assistant', content: r1.choices[0].message.content,
      reasoning_content: r1.choices[0].message.reasoning_content }, { role: 'user', content: 'Which number?' }],
  };
  const a = await client.chat.completions.create(turn2);
  assert.ok(a.usage.prompt_tokens_details.cached_tokens > 0, 'second turn reuses the first turn');
  const b = await client.chat.completions.create(turn2);
  assert.ok(b.usage.prompt_tokens_details.cached_tokens >= a.usage.prompt_tokens - 1, 'the same request again: all but the last token cached');
  assert.strictEqual(b.choices[0].message.content, a.choices[0].message.content);
  assert.strictEqual(b.choices[0].message.reasoning_content, a.choices[0].message.reasoning_content);
});

test('completions endpoint: stream == non-stream, logprobs, echo', async () => {
  const req = { model: 'demo', prompt: 'The quick brown fox', max_tokens: 10, temperature: 0, logprobs: 2 };
  const full = await client.completions.create(req);
  assert.strictEqual(full.choices[0].logprobs.tokens.length, full.usage.completion_tokens);
  let text = '';
  for await (const c of await client.completions.create({ ...req, stream: true })) text += c.choices[0]?.text || '';
  assert.strictEqual(text, full.choices[0].text);
  const echo = await client.completions.create({ ...req, echo: true });
  assert.strictEqual(echo.choices[0].text, 'The quick brown fox' + full.choices[0].text);
  // suffix: fill in the middle (DeepSeek's FIM): the prompt between the FIM tokens, a different
  // answer; echo still gives the prompt as sent.
  const fim = await client.completions.create({ ...req, suffix: ' jumps over the dog', echo: true });
  assert.ok(fim.usage.prompt_tokens > full.usage.prompt_tokens + 3, JSON.stringify(fim.usage));
  assert.ok(fim.choices[0].text.startsWith('The quick brown fox'), fim.choices[0].text);
  assert.notStrictEqual(fim.choices[0].text, echo.choices[0].text);
});

test('chat logprobs: one entry per generated token, top_logprobs sorted', async () => {
  const r = await client.chat.completions.create(chat('Hi', { logprobs: true, top_logprobs: 3, max_tokens: 8 }));
  const lp = r.choices[0].logprobs.content;
  assert.strictEqual(lp.length, r.usage.completion_tokens);
  for (const e of lp) {
    assert.strictEqual(e.top_logprobs.length, 3);
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[2].logprob);
    assert.ok(e.logprob <= 0);
  }
});

test('a long prompt leaves snapshots inside it: a prompt sharing its beginning reuses them', async () => {
  const doc = 'alpha beta gamma delta '.repeat(350);
  const a = await client.chat.completions.create(chat(doc + 'First question?', { temperature: 0, max_tokens: 2 }));
  assert.ok(a.usage.prompt_tokens > 1100, `prompt of ${a.usage.prompt_tokens} tokens`);
  const b = await client.chat.completions.create(chat(doc.slice(0, 6900) + ' Something else entirely?', { temperature: 0, max_tokens: 2 }));
  const cached = b.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= 1024 && cached < b.usage.prompt_tokens - 16, `cached ${cached} of ${b.usage.prompt_tokens}`);
});

// Token ids of the DeepSeek-V4 tokenizer: '"' 4, '}' 95, ']' 63, ':' 28, '0' 18, '</think>' 128822.
// Biased up, they make the random demo model close what it opens.
const closing = { 4: 100, 95: 100, 63: 100, 28: 100, 18: 100, 128822: 100 };

test('response_format json_object: every answer is one JSON object, streamed or not, in both modes', async () => {
  const json = { response_format: { type: 'json_object' }, logit_bias: closing, max_tokens: 64 };
  const isObject = (text) => {
    const v = JSON.parse(text);
    return v !== null && typeof v === 'object' && !Array.isArray(v);
  };
  const chatMode = chat('Answer in JSON', { ...json, thinking: { type: 'disabled' }, temperature: 0 });
  const a = await client.chat.completions.create(chatMode);
  assert.strictEqual(a.choices[0].finish_reason, 'stop', JSON.stringify(a.choices[0]));
  assert.ok(isObject(a.choices[0].message.content), a.choices[0].message.content);
  const s = await collectChat(await client.chat.completions.create({ ...chatMode, stream: true }));
  assert.strictEqual(s.choices[0].content, a.choices[0].message.content);
  assert.strictEqual(s.choices[0].finish_reason, 'stop');
  // Thinking mode: free reasoning, then the object.
  const t = await client.chat.completions.create(chat('Answer in JSON', { ...json, temperature: 0 }));
  assert.strictEqual(typeof t.choices[0].message.reasoning_content, 'string');
  assert.ok(isObject(t.choices[0].message.content), JSON.stringify(t.choices[0].message));
  // Sampled, several choices: each its own object.
  const n = await client.chat.completions.create(chat('Answer in JSON', { ...json, n: 3, temperature: 1, seed: 3,
    thinking: { type: 'disabled' } }));
  assert.strictEqual(n.choices.length, 3);
  for (const c of n.choices) assert.ok(c.finish_reason === 'stop' && isObject(c.message.content), JSON.stringify(c));
  // Without the bias the random model never closes its object within the limit, but what it
  // writes is an object's start: after at most 32 bytes of whitespace, '{'.
  const open = await client.chat.completions.create(chat('Answer in JSON', { response_format: { type: 'json_object' },
    max_tokens: 40, temperature: 0, thinking: { type: 'disabled' } }));
  assert.strictEqual(open.choices[0].finish_reason, 'length');
  assert.match(open.choices[0].message.content, /^[ \t\r\n]{0,32}\{/);
});

test('response_format beside tools: the object or a tool call, streamed as not', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  for (const thinking of ['disabled', 'enabled']) {
    const req = chat('Weather in Oslo as JSON, or look it up', { tools, response_format: { type: 'json_object' },
      logit_bias: closing, max_tokens: 80, temperature: 0, thinking: { type: thinking } });
    const a = await client.chat.completions.create(req);
    const m = a.choices[0].message;
    if (a.choices[0].finish_reason === 'tool_calls') {
      assert.ok(m.tool_calls.length > 0 && !/DSML/.test(m.content ?? ''), JSON.stringify(m));
    } else if (a.choices[0].finish_reason === 'stop') {
      assert.strictEqual(typeof JSON.parse(m.content), 'object', m.content);
    } else {  // (the random model may reason to the limit)
      assert.strictEqual(thinking, 'enabled', JSON.stringify(a.choices[0]));
    }
    const s = await collectChat(await client.chat.completions.create({ ...req, stream: true }));
    assert.strictEqual(s.choices[0].content, m.content ?? '');
    assert.strictEqual(s.choices[0].finish_reason, a.choices[0].finish_reason);
  }
  // A forced call is the answer itself: the format is for a later answer.
  const forced = await client.chat.completions.create(chat('Weather?', { tools, tool_choice: 'required',
    response_format: { type: 'json_object' }, max_tokens: 40, temperature: 0, thinking: { type: 'disabled' } }));
  assert.ok(['tool_calls', 'stop', 'length'].includes(forced.choices[0].finish_reason), JSON.stringify(forced.choices[0]));
});

test('response_format json_schema: the answer is an instance of the schema', async () => {
  const schema = { type: 'object', properties: { city: { type: 'string', maxLength: 12 },
    days: { type: 'integer', minimum: 1, maximum: 14 }, unit: { enum: ['C', 'F'] },
    station: { type: 'string', pattern: '^[A-Z]{3}-\\d$' } },
  required: ['city', 'days', 'unit', 'station'], additionalProperties: false };
  const req = chat('Weather as JSON', { response_format: { type: 'json_schema', json_schema: { name: 'weather', schema } },
    logit_bias: closing, max_tokens: 120, temperature: 0, thinking: { type: 'disabled' } });
  const a = await client.chat.completions.create(req);
  assert.strictEqual(a.choices[0].finish_reason, 'stop', JSON.stringify(a.choices[0]));
  const v = JSON.parse(a.choices[0].message.content);
  assert.deepStrictEqual(Object.keys(v).sort(), ['city', 'days', 'station', 'unit']);
  assert.match(v.station, /^[A-Z]{3}-\d$/);
  assert.strictEqual(typeof v.city, 'string');
  assert.ok([...v.city].length <= 12, JSON.stringify(v));
  assert.ok(Number.isInteger(v.days) && v.days >= 1 && v.days <= 14, JSON.stringify(v));
  assert.ok(['C', 'F'].includes(v.unit), JSON.stringify(v));
  const s = await collectChat(await client.chat.completions.create({ ...req, stream: true }));
  assert.strictEqual(s.choices[0].content, a.choices[0].message.content);
  // The completions endpoint too; a schema that fixes every token but whitespace (at most 32
  // bytes in a row) ends even unbiased.
  const unit = { type: 'object', properties: { unit: { enum: ['C', 'F'] } }, required: ['unit'], additionalProperties: false };
  const c = await client.completions.create({ model: 'demo', prompt: 'Units:', max_tokens: 300, temperature: 0,
    response_format: { type: 'json_schema', json_schema: { name: 'u', schema: unit } } });
  assert.strictEqual(c.choices[0].finish_reason, 'stop');
  assert.ok(['C', 'F'].includes(JSON.parse(c.choices[0].text).unit), c.choices[0].text);
  // What the grammar cannot enforce is refused, naming the keyword.
  await assert.rejects(client.chat.completions.create({ ...req, response_format: { type: 'json_schema', json_schema: {
    name: 'w', schema: { ...schema, properties: { ...schema.properties, days: { type: 'integer', multipleOf: 7 } } } } } }),
  (e) => e.status === 400 && /json_schema\.schema\.properties\.days\.multipleOf/.test(e.message));
});

test('logit_bias moves the picks', async () => {
  const base = chat('Tell me something', { thinking: { type: 'disabled' }, temperature: 0, max_tokens: 6 });
  const plain = await client.chat.completions.create(base);
  const quoted = await client.chat.completions.create({ ...base, logit_bias: { 4: 100 } });
  assert.notStrictEqual(quoted.choices[0].message.content, plain.choices[0].message.content);
  assert.strictEqual(quoted.choices[0].message.content, '"'.repeat(6));
});
