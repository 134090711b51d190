// dsv4 serve under mpirun (issue 15): the server on rank 0, the model split over the ranks
// (expert / tensor parallel). Every answer must be byte-identical to one process's, streamed or
// not, with n > 1 (fork) and a prefix-cache hit (snapshot / restore on every rank), and with
// speculative decoding (the MTP block's drafts and their rewinds on every rank). The model is
// the demo model made to draft right now and then (harness.cjs agreeingModel).
const test = require('node:test');
const assert = require('node:assert');
const { OpenAI } = require('openai');
const { startServer, collectChat, agreeingModel } = require('./harness.cjs');

const requests = [
  { messages: [{ role: 'user', content: 'Hello from rank zero' }], max_tokens: 12, temperature: 0.7, seed: 3 },
  { messages: [{ role: 'user', content: 'Two choices please' }], max_tokens: 8, temperature: 0.9, seed: 5, n: 2 },
  { messages: [{ role: 'user', content: 'Hello from rank zero' }, { role: 'assistant', content: 'Hi.' },
               { role: 'user', content: 'Again?' }], max_tokens: 8, temperature: 0, thinking: { type: 'disabled' } },
];

async function answers(ranks, mode, extra = []) {
  const srv = await startServer([...(mode ? ['--parallel', mode] : []), ...extra], ranks, agreeingModel());
  try {
    const client = new OpenAI({ baseURL: srv.base, apiKey: 'x', maxRetries: 0 });
    const out = [];
    for (const r of requests) {
      const full = await client.chat.completions.create({ model: 'demo', ...r });
      out.push(full.choices.map((c) => [c.message.reasoning_content, c.message.content]));
      const streamed = await collectChat(await client.chat.completions.create({ model: 'demo', ...r, stream: true }));
      out.push(streamed.choices.map((c) => [c.reasoning_content || undefined, c.content]));
      out.push(full.usage.prompt_tokens_details.cached_tokens > 0 || r === requests[0]);
    }
    return out;
  } finally {
    const { code, sig } = await srv.stop();
    assert.ok(code !== null || sig !== null);
  }
}

test('2 and 3 ranks serve exactly what one process serves', async () => {
  const one = await answers(1);
  for (const [ranks, mode, extra] of [[2, 'ep', ['--draft', '2']], [3, 'ep+tp', []]])
    assert.deepStrictEqual(await answers(ranks, mode, extra), one, `${ranks} ranks, ${mode} ${extra.join(' ')}`);
});
