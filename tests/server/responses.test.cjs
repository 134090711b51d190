// dsv4 serve's Responses API (/v1/responses) driven by the official `openai` npm client: the
// answer whole == the SDK's own accumulation of the event stream (which checks every event
// against the items it names); the same conversation through chat completions gives the same
// text; previous_response_id == sending the conversation whole, from the prefix cache; kept
// responses retrieved, their input items listed, and deleted; structured output; counting input
// tokens; refusals.
const test = require('node:test');
const assert = require('node:assert');
const { OpenAI } = require('openai');
const { startServer, metric } = require('./harness.cjs');

let srv, client;
test.before(async () => {
  srv = await startServer(['--max-batch', '4']);
  client = new OpenAI({ baseURL: srv.base, apiKey: 'unused', maxRetries: 0 });
});
test.after(async () => srv && srv.stop());

const ask = (input, extra = {}) => ({ model: 'demo', input, max_output_tokens: 16, temperature: 0, ...extra });
// The answer's text from its message items (the SDK adds output_text to created responses only).
const textOf = (r) => r.output.filter((o) => o.type === 'message').map((o) => o.content.map((c) => c.text).join('')).join('');
const reasoningOf = (r) => r.output.filter((o) => o.type === 'reasoning').map((o) => o.content.map((c) => c.text).join('')).join('');

test('a response whole == its stream, in both modes', async () => {
  for (const effort of ['high', 'none']) {
    const req = ask('Hello there', { reasoning: { effort } });
    const full = await client.responses.create(req);
    assert.strictEqual(full.object, 'response');
    assert.strictEqual(full.status, 'incomplete', JSON.stringify(full));  // the random model runs to the limit
    assert.strictEqual(full.incomplete_details.reason, 'max_output_tokens');
    assert.strictEqual(full.usage.output_tokens, 16);
    if (effort === 'none') {
      assert.ok(full.output.every((o) => o.type === 'message'), JSON.stringify(full.output));
      assert.strictEqual(full.usage.output_tokens_details.reasoning_tokens, 0);
    } else {
      assert.strictEqual(full.output[0].type, 'reasoning');
      assert.ok(full.usage.output_tokens_details.reasoning_tokens > 0);
    }
    const stream = client.responses.stream(req);
    const types = [];
    for await (const e of stream) types.push(e.type);
    const streamed = await stream.finalResponse();
    assert.strictEqual(types[0], 'response.created');
    assert.strictEqual(types.at(-1), 'response.incomplete');
    assert.strictEqual(textOf(full), full.output_text);
    assert.strictEqual(textOf(streamed), full.output_text);
    assert.strictEqual(reasoningOf(streamed), reasoningOf(full));
    assert.deepStrictEqual(streamed.output.map((o) => o.type), full.output.map((o) => o.type));
  }
});

test('log-probabilities of the message text, streamed as not', async () => {
  const req = ask('Hello there', { reasoning: { effort: 'none' }, max_output_tokens: 8, top_logprobs: 2,
    include: ['message.output_text.logprobs'] });
  const full = await client.responses.create(req);
  const lp = full.output[0].content[0].logprobs;
  assert.strictEqual(lp.length, full.usage.output_tokens);  // chat mode: every token is text
  for (const t of lp) assert.ok(t.logprob <= 0 && t.top_logprobs.length === 2 && t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob);
  const stream = client.responses.stream(req);
  const fromDeltas = [];
  let last;
  for await (const e of stream) {
    if (e.type === 'response.output_text.delta') fromDeltas.push(...e.logprobs);
    last = e;
  }
  assert.deepStrictEqual(fromDeltas.map((t) => t.logprob), lp.map((t) => t.logprob));
  // (the SDK's accumulated snapshot keeps no logprobs; the final event's response has them)
  assert.strictEqual(last.type, 'response.incomplete');
  assert.deepStrictEqual(last.response.output[0].content[0].logprobs.map((t) => t.token), lp.map((t) => t.token));
});

test('the same conversation through chat completions gives the same answer', async () => {
  const history = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Name a color' }];
  for (const effort of ['high', 'none']) {
    const r = await client.responses.create({ model: 'demo', instructions: 'Be brief.', input: [history[1]],
      reasoning: { effort }, max_output_tokens: 12, temperature: 0 });
    const c = await client.chat.completions.create({ model: 'demo', messages: history, max_tokens: 12, temperature: 0,
      thinking: { type: effort === 'none' ? 'disabled' : 'enabled' } });
    assert.strictEqual(r.output_text, c.choices[0].message.content);
    assert.strictEqual(reasoningOf(r), c.choices[0].message.reasoning_content ?? '');
    assert.strictEqual(r.usage.input_tokens, c.usage.prompt_tokens);
  }
});

test('previous_response_id == the conversation sent whole; kept responses are retrieved and deleted', async () => {
  const first = await client.responses.create(ask('Tell me a story', { reasoning: { effort: 'none' } }));
  const follow = await client.responses.create(ask('And then?', { reasoning: { effort: 'none' }, previous_response_id: first.id }));
  assert.strictEqual(follow.previous_response_id, first.id);
  assert.ok(follow.usage.input_tokens_details.cached_tokens > 0, JSON.stringify(follow.usage));
  const whole = await client.responses.create(ask([{ role: 'user', content: 'Tell me a story' }, ...first.output,
    { role: 'user', content: 'And then?' }], { reasoning: { effort: 'none' }, store: false }));
  assert.strictEqual(whole.output_text, follow.output_text);
  assert.strictEqual(whole.usage.input_tokens, follow.usage.input_tokens);
  assert.ok(await metric(srv.url, 'dsv4_kept_responses_bytes') > 0);
  const got = await client.responses.retrieve(first.id);
  assert.strictEqual(got.id, first.id);
  assert.strictEqual(got.output_text, first.output_text);
  await client.responses.delete(first.id);
  await assert.rejects(client.responses.retrieve(first.id), (e) => e.status === 404);
  await assert.rejects(client.responses.create(ask('x', { previous_response_id: first.id })),
    (e) => e.status === 404 && e.code === 'previous_response_not_found');
  // store: false keeps nothing.
  await assert.rejects(client.responses.retrieve(whole.id), (e) => e.status === 404);
});

test('a kept response lists the items it came from, page by page', async () => {
  const first = await client.responses.create(ask('Tell me a story', { reasoning: { effort: 'none' } }));
  const input = [
    { role: 'developer', content: 'Be brief.' },
    { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Oslo"}' },
    { type: 'function_call_output', call_id: 'call_1', output: 'sunny' },
    { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'And then?' }] },
  ];
  const follow = await client.responses.create(ask(input, { reasoning: { effort: 'none' }, previous_response_id: first.id }));
  // Oldest first, two per page: the SDK follows has_more with `after`.
  const all = [];
  for await (const item of client.responses.inputItems.list(follow.id, { order: 'asc', limit: 2 })) all.push(item);
  // The previous response's input, its output as returned, then this input.
  assert.deepStrictEqual(all.map((i) => i.type),
    ['message', ...first.output.map((o) => o.type), 'message', 'function_call', 'function_call_output', 'message']);
  assert.deepStrictEqual(all[0].content, [{ type: 'input_text', text: 'Tell me a story' }]);
  assert.strictEqual(all[0].role, 'user');
  assert.deepStrictEqual(all.slice(1, 1 + first.output.length), first.output);
  const mine = all.slice(1 + first.output.length);
  assert.deepStrictEqual(mine[0].content, [{ type: 'input_text', text: 'Be brief.' }]);
  assert.strictEqual(mine[0].role, 'developer');
  assert.deepStrictEqual([mine[1].call_id, mine[1].name, mine[1].arguments], ['call_1', 'get_weather', '{"city":"Oslo"}']);
  assert.deepStrictEqual([mine[2].call_id, mine[2].output], ['call_1', 'sunny']);
  assert.deepStrictEqual(mine[3].content, input[3].content);
  assert.ok(all.every((i) => typeof i.id === 'string' && i.id.length > 0), JSON.stringify(all));
  assert.strictEqual(new Set(all.map((i) => i.id)).size, all.length);
  // The default: newest first, 20 a page.
  const page = await client.responses.inputItems.list(follow.id);
  assert.deepStrictEqual(page.data.map((i) => i.id), all.map((i) => i.id).reverse());
  assert.strictEqual(page.has_more, false);
  const one = await client.responses.inputItems.list(follow.id, { limit: 1 });
  assert.deepStrictEqual([one.data.length, one.data[0].id, one.has_more], [1, all.at(-1).id, true]);
  assert.deepStrictEqual([one.body.object, one.body.first_id, one.body.last_id], ['list', all.at(-1).id, all.at(-1).id]);
  const next = await client.responses.inputItems.list(follow.id, { limit: 2, after: one.body.last_id });
  assert.deepStrictEqual(next.data.map((i) => i.id), [all.at(-2).id, all.at(-3).id]);
  // The first response's own items: its input alone.
  const own = await client.responses.inputItems.list(first.id);
  assert.deepStrictEqual(own.data.map((i) => i.id), [all[0].id]);
  await assert.rejects(client.responses.inputItems.list(follow.id, { limit: 101 }), (e) => e.status === 400 && e.param === 'limit');
  await assert.rejects(client.responses.inputItems.list(follow.id, { order: 'up' }), (e) => e.status === 400 && e.param === 'order');
  await assert.rejects(client.responses.inputItems.list(follow.id, { after: 'msg_nope' }), (e) => e.status === 400 && e.param === 'after');
  await assert.rejects(client.responses.inputItems.list('resp_nope'), (e) => e.status === 404);
  // Not kept (store: false): nothing to list.
  const gone = await client.responses.create(ask('x', { store: false, max_output_tokens: 1 }));
  await assert.rejects(client.responses.inputItems.list(gone.id), (e) => e.status === 404);
});

test('text.format json_schema: the answer parses as the schema', async () => {
  // A schema that fixes every token but whitespace ends even with the random model.
  const schema = { type: 'object', properties: { unit: { enum: ['C', 'F'] } }, required: ['unit'], additionalProperties: false };
  const req = { model: 'demo', input: 'Units?', reasoning: { effort: 'none' }, max_output_tokens: 300, temperature: 0,
    text: { format: { type: 'json_schema', name: 'units', schema, strict: true } } };
  const r = await client.responses.parse(req);
  assert.strictEqual(r.status, 'completed', JSON.stringify(r));
  assert.ok(['C', 'F'].includes(r.output_parsed.unit), r.output_text);
  const s = await client.responses.stream(req).finalResponse();
  assert.strictEqual(textOf(s), r.output_text);
  await assert.rejects(client.responses.create({ ...req, text: { format: { type: 'json_schema', name: 'u',
    schema: { ...schema, minProperties: 1 } } } }), (e) => e.status === 400 && /text\.format\.schema\.minProperties/.test(e.message));
});

test('input tokens are counted as the request would render them; refusals name the field', async () => {
  const tools = [{ type: 'function', name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } }];
  const req = ask('Weather in Oslo?', { instructions: 'Use tools.', tools, max_output_tokens: 2 });
  const counted = await client.responses.inputTokens.count({ model: 'demo', input: req.input, instructions: req.instructions, tools });
  const r = await client.responses.create(req);
  assert.strictEqual(counted.input_tokens, r.usage.input_tokens);
  assert.strictEqual(r.tools[0].name, 'get_weather');  // echoed as sent
  await assert.rejects(client.responses.create(ask('x', { tools: [{ type: 'file_search', vector_store_ids: ['vs'] }] })),
    (e) => e.status === 400 && e.param === 'tools[0].type');
  // As Codex sends them: functions in a namespace (counted as their NAMESPACE__NAME functions)
  // and web_search (left out: the prompt is that of the functions alone).
  const spaced = [{ type: 'namespace', name: 'weather', description: 'Weather tools.', tools: [{ ...tools[0], name: 'get' }] },
    { type: 'web_search', external_web_access: false }];
  const flat = [{ ...tools[0], name: 'weather__get', description: 'Weather tools.\n\n' }];
  const a = await client.responses.inputTokens.count({ model: 'demo', input: req.input, tools: spaced });
  const b = await client.responses.inputTokens.count({ model: 'demo', input: req.input, tools: flat });
  assert.strictEqual(a.input_tokens, b.input_tokens);
  const n = await client.responses.create(ask('x', { tools: spaced, max_output_tokens: 2 }));
  assert.deepStrictEqual(n.tools, spaced);
  await assert.rejects(client.responses.create(ask([{ type: 'item_reference', id: 'x' }])),
    (e) => e.status === 400 && e.param === 'input[0].type');
  // /metrics counts requests by route, never by raw path (a client could grow the label set).
  // A request is counted once its answer is sent (cpp-httplib's logger), so a /metrics asked
  // right after may not have it yet: asked again for up to 5 s.
  assert.strictEqual((await fetch(srv.url + '/v1/no-such-path-' + Date.now())).status, 404);
  let text = '';
  for (let i = 0; i < 50; ++i) {
    text = await (await fetch(srv.url + '/metrics')).text();
    if (/endpoint="other",status="404"/.test(text)) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.match(text, /dsv4_requests_total\{endpoint="other",status="404"\} [1-9]/);
  assert.match(text, /dsv4_requests_total\{endpoint="\/v1\/responses\/input_tokens",status="200"\} 3/);
  assert.match(text, /dsv4_requests_total\{endpoint="\/v1\/responses\/\{id\}\/input_items",status="200"\} [1-9]/);  // (the test before)
  assert.doesNotMatch(text, /no-such-path/);
});
