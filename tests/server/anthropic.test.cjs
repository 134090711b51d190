// dsv4 serve's /v1/messages driven by the official `@anthropic-ai/sdk` client, with an API key.
const test = require('node:test');
const assert = require('node:assert');
const Anthropic = require('@anthropic-ai/sdk').default;
const { startServer } = require('./harness.cjs');

let srv, client;
test.before(async () => {
  srv = await startServer(['--api-key', 'sekrit']);
  client = new Anthropic({ baseURL: srv.url, apiKey: 'sekrit', maxRetries: 0 });
});
test.after(async () => srv && srv.stop());

const req = (extra = {}) => ({
  model: 'demo',
  max_tokens: 20,
  temperature: 0,
  messages: [{ role: 'user', content: 'Say something' }],
  ...extra,
});

const blocksText = (m) => m.content.map((b) => (b.type === 'text' ? b.text : b.type === 'thinking' ? '[T]' + b.thinking : '')).join('|');

test('non-streamed message == the streamed one (text)', async () => {
  const full = await client.messages.create(req());
  assert.strictEqual(full.type, 'message');
  assert.strictEqual(full.role, 'assistant');
  assert.ok(full.content.length >= 1);
  assert.strictEqual(full.stop_reason, 'max_tokens');
  assert.strictEqual(full.usage.output_tokens, 20);
  const streamed = await client.messages.stream(req()).finalMessage();
  assert.deepStrictEqual(streamed.content, full.content);
  assert.strictEqual(streamed.stop_reason, full.stop_reason);
  assert.strictEqual(streamed.usage.output_tokens, full.usage.output_tokens);
});

test('usage: the stream ends with the usage of the body, cached tokens included', async () => {
  const r = req({ messages: [{ role: 'user', content: 'Usage, please: the same prompt three times' }] });
  await client.messages.create(r);
  const again = await client.messages.create(r);  // its prompt is now in the prefix cache
  assert.ok(again.usage.cache_read_input_tokens > 0, JSON.stringify(again.usage));
  assert.strictEqual(again.usage.cache_creation_input_tokens, 0);
  // message_start goes out before the cache is looked up; message_delta carries the whole usage.
  const streamed = await client.messages.stream(r).finalMessage();
  assert.deepStrictEqual(streamed.usage, again.usage);
  const { max_tokens, temperature, ...countable } = r;
  const counted = await client.messages.countTokens(countable);
  assert.strictEqual(again.usage.input_tokens + again.usage.cache_read_input_tokens, counted.input_tokens);
});

test('a mid-conversation system message (as Claude Code sends) is taken', async () => {
  const r = req({ system: 'You are terse.', messages: [
    { role: 'user', content: 'Hello' }, { role: 'system', content: [{ type: 'text', text: 'Agents: none.' }] }] });
  const full = await client.messages.create(r);
  assert.strictEqual(full.usage.output_tokens, 20);
  await assert.rejects(client.messages.create(req({ messages: [{ role: 'system', content: 'x' }, { role: 'user', content: 'y' }] })),
    (e) => e.status === 400 && /messages\[0\]\.role/.test(e.message));
});

test('thinking enabled: a thinking block first, same in both forms', async () => {
  const r = req({ thinking: { type: 'enabled', budget_tokens: 1024 }, max_tokens: 12 });
  const full = await client.messages.create(r);
  assert.strictEqual(full.content[0].type, 'thinking');
  const streamed = await client.messages.stream(r).finalMessage();
  assert.strictEqual(blocksText(streamed), blocksText(full));
});

test('adaptive thinking with its text omitted: the signature carries it, and renders it back', async () => {
  const r = req({ thinking: { type: 'adaptive', display: 'omitted' }, output_config: { effort: 'high' }, max_tokens: 12 });
  const full = await client.messages.create(r);
  assert.strictEqual(full.content[0].type, 'thinking');
  assert.strictEqual(full.content[0].thinking, '');
  assert.match(full.content[0].signature, /^dsv4-reasoning:./s);
  const streamed = await client.messages.stream(r).finalMessage();
  assert.deepStrictEqual(streamed.content, full.content);
  // Sent back in a tool-use turn (where V4 keeps the reasoning), the block counts as its text.
  const reasoning = full.content[0].signature.slice('dsv4-reasoning:'.length);
  const tools = [{ name: 'get_time', input_schema: { type: 'object' } }];
  const history = (block) => ({ model: 'demo', tools, thinking: { type: 'adaptive' }, messages: [
    { role: 'user', content: 'What time is it?' },
    { role: 'assistant', content: [block, { type: 'tool_use', id: 'toolu_1', name: 'get_time', input: {} }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: '12:00' }] }] });
  const omitted = await client.messages.countTokens(history(full.content[0]));
  const shown = await client.messages.countTokens(history({ type: 'thinking', thinking: reasoning, signature: '' }));
  const none = await client.messages.countTokens(history({ type: 'text', text: '' }));
  assert.strictEqual(omitted.input_tokens, shown.input_tokens);
  assert.ok(omitted.input_tokens > none.input_tokens, `${omitted.input_tokens} vs ${none.input_tokens}`);
});

test('system prompt, multi-turn and tool results are accepted', async () => {
  const r = req({
    system: 'You are terse.',
    tools: [{ name: 'get_time', description: 'time now', input_schema: { type: 'object', properties: { tz: { type: 'string' } } } }],
    messages: [
      { role: 'user', content: 'What time is it?' },
      { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'get_time', input: { tz: 'UTC' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: '12:00' }] },
    ],
  });
  const full = await client.messages.create(r);
  assert.ok(full.usage.input_tokens + (full.usage.cache_read_input_tokens || 0) > 20);
  // count_tokens (what coding agents ask before sending) counts the prompt the request renders;
  // it needs no max_tokens.
  const { max_tokens, temperature, ...countable } = r;
  const counted = await client.messages.countTokens(countable);
  assert.strictEqual(counted.input_tokens, full.usage.input_tokens + (full.usage.cache_read_input_tokens || 0));
  await assert.rejects(client.messages.countTokens({ model: 'demo', messages: [{ role: 'tool', content: 'x' }] }),
    (e) => e.status === 400 && e.error?.type === 'error' && /role/.test(e.message));
});

test('a wrong API key is refused with 401', async () => {
  const bad = new Anthropic({ baseURL: srv.url, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.messages.create(req()), (e) => e.status === 401 && e.error?.type === 'error');
  const res = await fetch(srv.base + '/chat/completions', { method: 'POST', body: '{}' });
  assert.strictEqual(res.status, 401);
  const ok = await fetch(srv.base + '/models', { headers: { Authorization: 'Bearer sekrit' } });
  assert.strictEqual(ok.status, 200);
});

test('bad requests get Anthropic error bodies', async () => {
  await assert.rejects(client.messages.create({ model: 'demo', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e.status === 400 && /max_tokens/.test(e.message));
  await assert.rejects(client.messages.create(req({ messages: [{ role: 'system', content: 'x' }] })),
    (e) => e.status === 400 && /role/.test(e.message));
});

// A schema that fixes every token but whitespace (at most 32 bytes in a row): even the random
// demo model ends its object within the limit.
const unitSchema = { type: 'object', properties: { unit: { enum: ['C', 'F'] } }, required: ['unit'], additionalProperties: false };

test('structured output (output_config.format, output_format): the text is an instance of the schema', async () => {
  const m = await client.messages.create(req({ max_tokens: 300, output_config: { format: { type: 'json_schema', schema: unitSchema } } }));
  assert.strictEqual(m.stop_reason, 'end_turn');
  const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  assert.ok(['C', 'F'].includes(JSON.parse(text).unit), text);
  // The beta form is the same request.
  const beta = await client.messages.create(req({ max_tokens: 300, output_format: { type: 'json_schema', schema: unitSchema } }));
  assert.strictEqual(beta.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), text);
  // With thinking: a thinking block, then the instance.
  const t = await client.messages.create(req({ max_tokens: 300, thinking: { type: 'enabled', budget_tokens: 1024 },
    output_config: { format: { type: 'json_schema', schema: unitSchema } } }));
  assert.strictEqual(t.content[0].type, 'thinking');
  // (the random model may think to the limit; what it writes after is an instance's start)
  const after = t.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  assert.match(after, /^([ \t\r\n]{0,32}\{[\s\S]*)?$/);
  await assert.rejects(client.messages.create(req({ output_config: { format: { type: 'json_schema',
    schema: { ...unitSchema, properties: { unit: { type: 'string', pattern: '(?=C)' } } } } } })),
  (e) => e.status === 400 && /output_config\.format\.schema\.properties\.unit\.pattern.*lookaround/.test(e.message));
});
