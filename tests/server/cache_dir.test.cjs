// The prefix cache on disk (--cache-dir), driven by the official `openai` client: a restarted
// server reads a long prompt from the files the first one saved (same answer, cached tokens,
// /metrics counts the load); a damaged file is deleted and does not stop it; another model's
// files are left alone; a directory that cannot be made is refused at start.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { OpenAI } = require('openai');
const { startServer, metric, agreeingModel } = require('./harness.cjs');

const tmp = process.env.DSV4_TMP || '/tmp/dsv4-server-tests';
const dir = path.join(tmp, `cache-dir-${process.pid}`);
test.after(() => fs.rmSync(dir, { recursive: true, force: true }));

const request = {
  model: 'demo',
  max_tokens: 12,
  temperature: 0,
  messages: [
    { role: 'system', content: 'You are a careful assistant who answers briefly. '.repeat(20) },
    { role: 'user', content: 'What is a prefix cache?' },
  ],
};

async function ask(srv) {
  const client = new OpenAI({ baseURL: srv.base, apiKey: 'unused', maxRetries: 0 });
  const r = await client.chat.completions.create(request);
  return { text: r.choices[0].message.content + '|' + (r.choices[0].message.reasoning_content || ''), usage: r.usage };
}

test('a restarted server reads the prompt from its files', async () => {
  const first = await startServer(['--cache-dir', dir]);
  let a;
  try {
    a = await ask(first);
    assert.strictEqual(a.usage.prompt_tokens_details.cached_tokens, 0);
  } finally {
    await first.stop();
  }
  const files = fs.readdirSync(path.join(dir, 'plain'));
  assert.ok(files.length >= 1 && files.every((f) => f.endsWith('.dsv4snap')), files.join(' '));
  // They hold the conversation's tokens: the owner's alone.
  assert.strictEqual(fs.statSync(path.join(dir, 'plain')).mode & 0o777, 0o700);
  for (const f of files) assert.strictEqual(fs.statSync(path.join(dir, 'plain', f)).mode & 0o777, 0o600);

  const second = await startServer(['--cache-dir', dir]);
  try {
    assert.match(second.log(), /prefix cache on disk: \d+ snapshots/);
    const b = await ask(second);
    assert.strictEqual(b.usage.prompt_tokens_details.cached_tokens, a.usage.prompt_tokens - 1);
    assert.strictEqual(b.text, a.text);
    assert.strictEqual(await metric(second.url, 'dsv4_prefix_cache_disk_loads_total'), 1);
  } finally {
    await second.stop();
  }
});

test('a prefix two prompts shared is kept: a new conversation after a restart reuses it', async () => {
  // An agent's conversations share their system prompt and tools, then differ. The snapshot at
  // position 1024 inside the first prompt is saved once the second prompt restores it.
  const shared = path.join(tmp, `cache-dir-shared-${process.pid}`);
  const convo = (q) => ({ ...request, max_tokens: 2, messages: [
    { role: 'system', content: 'Tools and rules of a long agent harness, line after line. '.repeat(130) },
    { role: 'user', content: q.repeat(6) }] });  // long enough that one end cannot be cut back to the other
  const chat = async (srv, q) => new OpenAI({ baseURL: srv.base, apiKey: 'unused', maxRetries: 0 }).chat.completions.create(convo(q));
  const first = await startServer(['--cache-dir', shared]);
  try {
    const a = await chat(first, 'First conversation: list the files.');
    assert.ok(a.usage.prompt_tokens > 1100, `${a.usage.prompt_tokens} prompt tokens`);
    const b = await chat(first, 'Second conversation: count the lines.');
    assert.strictEqual(b.usage.prompt_tokens_details.cached_tokens, 1024);  // from memory
  } finally {
    await first.stop();
  }
  const second = await startServer(['--cache-dir', shared]);
  try {
    const c = await chat(second, 'Third conversation: something else entirely.');
    assert.strictEqual(c.usage.prompt_tokens_details.cached_tokens, 1024);  // from the file
  } finally {
    await second.stop();
    fs.rmSync(shared, { recursive: true, force: true });
  }
});

test('damaged files are deleted, other models\' files left alone, a bad directory refused', async () => {
  const plain = path.join(dir, 'plain');
  fs.mkdirSync(plain, { recursive: true });
  const victim = path.join(plain, '0000000000000000-5.dsv4snap');
  fs.writeFileSync(victim, 'DSV4SNAP but not really');
  const other = await startServer(['--cache-dir', dir], 1, agreeingModel());
  try {
    assert.match(other.log(), /deleting .*0000000000000000-5\.dsv4snap/);
    assert.ok(!fs.existsSync(victim));
    const kept = fs.readdirSync(plain).length;
    if (kept > 0) assert.match(other.log(), /of another model or build left alone/);
    const r = await ask(other);
    assert.strictEqual(r.usage.prompt_tokens_details.cached_tokens, 0);  // not the demo model's state
  } finally {
    await other.stop();
  }
  await assert.rejects(startServer(['--cache-dir', '/proc/dsv4-no-such-dir']), /cache-dir \/proc\/dsv4-no-such-dir\/plain: cannot create it/);
});
