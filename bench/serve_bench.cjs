// Serving benchmark client: C concurrent streaming chat requests against a running dsv4 serve,
// for each C given; prints aggregate generated tok/s, TTFT and time per output token (p50 / p99).
// Usage: node bench/serve_bench.cjs URL CONCURRENCY_LIST GEN_TOKENS PROMPT_WORDS [--json]
// (scripts/bench-serve.sh starts the server and calls this.) DSV4_BENCH_TEMPERATURE: sampled
// streams at that temperature (seeded per stream) instead of greedy ones. DSV4_BENCH_BODY: a JSON
// object merged into every request (e.g. '{"presence_penalty": 0.5}': picks on the host).
const temperature = Number(process.env.DSV4_BENCH_TEMPERATURE || 0);
const extra = JSON.parse(process.env.DSV4_BENCH_BODY || '{}');
const [url, list = '1,2,4,8,16', gen = '32', words = '64'] = process.argv.slice(2);
const json = process.argv.includes('--json');

function pct(xs, p) {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

async function one(i, c) {
  // Distinct prompts, so the prefix cache does not turn the prefill into a restore.
  const content = `Stream ${c}-${i}-${Date.now()}: ` + 'tell me more '.repeat(Number(words) / 3);
  const body = { messages: [{ role: 'user', content }], max_tokens: Number(gen), temperature, stream: true,
    stream_options: { include_usage: true }, thinking: { type: 'disabled' } };
  if (temperature > 0) body.seed = i + 1;
  Object.assign(body, extra);
  const t0 = performance.now();
  const res = await fetch(url + '/v1/chat/completions', { method: 'POST', body: JSON.stringify(body),
    headers: { 'Content-Type': 'application/json' } });
  if (res.status !== 200) throw new Error(`status ${res.status}: ${await res.text()}`);
  const times = [];
  let usage = null;
  let buf = '';
  const dec = new TextDecoder();
  for await (const part of res.body) {
    buf += dec.decode(part, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.usage) usage = j.usage;
      const d = j.choices?.[0]?.delta;
      if (d && (d.content || d.reasoning_content)) times.push(performance.now());
    }
  }
  const end = performance.now();
  return { t0, ttft: (times[0] ?? end) - t0, gaps: times.slice(1).map((t, k) => t - times[k]), tokens: usage?.completion_tokens ?? 0, end };
}

(async () => {
  const rows = [];
  for (const c of list.split(',').map(Number)) {
    const start = performance.now();
    const rs = await Promise.all(Array.from({ length: c }, (_, i) => one(i, c)));
    const wall = (Math.max(...rs.map((r) => r.end)) - start) / 1000;
    const tokens = rs.reduce((a, r) => a + r.tokens, 0);
    const ttft = rs.map((r) => r.ttft / 1000);
    const gaps = rs.flatMap((r) => r.gaps.map((g) => g / 1000));
    rows.push({ concurrency: c, tokens, wall_s: wall, tok_s: tokens / wall, ttft_p50: pct(ttft, 50), ttft_p99: pct(ttft, 99),
      tpot_p50: pct(gaps, 50), tpot_p99: pct(gaps, 99) });
  }
  if (json) return console.log(JSON.stringify(rows));
  const base = rows[0].tok_s;
  console.log('streams  tokens  wall s   tok/s  x1-stream  TTFT p50/p99 s   TPOT p50/p99 ms');
  for (const r of rows)
    console.log(`${String(r.concurrency).padStart(7)} ${String(r.tokens).padStart(7)} ${r.wall_s.toFixed(1).padStart(7)} ` +
      `${r.tok_s.toFixed(1).padStart(7)} ${(r.tok_s / base).toFixed(2).padStart(10)}   ` +
      `${r.ttft_p50.toFixed(2)} / ${r.ttft_p99.toFixed(2)}       ${(r.tpot_p50 * 1000).toFixed(0)} / ${(r.tpot_p99 * 1000).toFixed(0)}`);
})().catch((e) => { console.error('serve_bench:', e.message); process.exit(1); });
