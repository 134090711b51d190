// Starts `dsv4 serve` on the demo model (random weights, the real tokenizer) for the server
// tests, which drive it with the official client libraries. Environment (set by ctest):
//   DSV4_BIN        the dsv4 binary
//   DSV4_TOKENIZER  directory holding the real tokenizer.json
//   DSV4_TMP        scratch directory (the demo model is written there once)
const { spawn, execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const bin = process.env.DSV4_BIN;
const tokenizer = process.env.DSV4_TOKENIZER;
const tmp = process.env.DSV4_TMP || '/tmp/dsv4-server-tests';

function demoModel() {
  const dir = path.join(tmp, 'demo-model');
  if (fs.existsSync(path.join(dir, 'config.json'))) return dir;
  fs.mkdirSync(tmp, { recursive: true });
  // Test files run in parallel: write under a private name, then rename into place.
  const mine = `${dir}.tmp-${process.pid}`;
  execFileSync(bin, ['make-tiny', '--out', mine, '--preset', 'demo', '--tokenizer', tokenizer], { stdio: 'ignore' });
  try {
    fs.renameSync(mine, dir);
  } catch (e) {
    fs.rmSync(mine, { recursive: true, force: true });  // another file won the race
  }
  return dir;
}

// The demo model with its final norm and the MTP block's keeping only channels 0 and 1 (the
// other weights zero, those 128): both heads then see two numbers, so the MTP block's drafts
// agree with the model now and then (random weights never do), and speculative decoding's
// acceptance path runs. The same trick as tests/test_util.h mtp_agreeing_model_dir.
function agreeingModel() {
  const dir = path.join(tmp, 'demo-agreeing');
  if (fs.existsSync(path.join(dir, 'config.json'))) return dir;
  const mine = `${dir}.tmp-${process.pid}`;
  fs.cpSync(demoModel(), mine, { recursive: true });
  const file = path.join(mine, 'model.safetensors');
  const fd = fs.openSync(file, 'r+');
  const len = Buffer.alloc(8);
  fs.readSync(fd, len, 0, 8, 0);
  const n = Number(len.readBigUInt64LE(0));
  const head = Buffer.alloc(n);
  fs.readSync(fd, head, 0, n, 8);
  const header = JSON.parse(head.toString('utf8'));
  for (const name of ['norm.weight', 'mtp.0.norm.weight']) {
    const t = header[name];
    if (!t || t.dtype !== 'BF16') throw new Error(`${file}: ${name} is not a BF16 tensor`);
    const [begin, end] = t.data_offsets;
    const v = Buffer.alloc(end - begin);
    v.writeUInt16LE(0x4300, 0);
    v.writeUInt16LE(0x4300, 2);
    fs.writeSync(fd, v, 0, v.length, 8 + n + begin);
  }
  fs.closeSync(fd);
  try {
    fs.renameSync(mine, dir);
  } catch (e) {
    fs.rmSync(mine, { recursive: true, force: true });  // another file won the race
  }
  return dir;
}

// Resolves once the server prints its URL; rejects if it exits first. `ranks` > 1 starts it
// under mpirun (DSV4_MPIEXEC) as that many processes; rank 0 serves. With `listening` it resolves
// at the line printed once the port is bound, before the model loads (log() shows when "ready at"
// follows).
function startServer(extra = [], ranks = 1, model = demoModel(), { listening = false } = {}) {
  const args = ['serve', '--model', model, '--port', '0', '--threads', '1', ...extra];
  const [cmd, argv] = ranks > 1
    ? [process.env.DSV4_MPIEXEC, ['--allow-run-as-root', '--oversubscribe', '-np', String(ranks), bin, ...args]]
    : [bin, args];
  const proc = spawn(cmd, argv, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const exited = new Promise((resolve) => proc.on('exit', (code, sig) => resolve({ code, sig })));
  return new Promise((resolve, reject) => {
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(listening ? /listening on (http:\/\/\S+) / : /ready at (http:\/\/[^\s/]+)\/v1/);
      if (m && !proc.url) {
        proc.url = m[1];
        resolve({
          url: m[1],
          base: m[1] + '/v1',
          pid: proc.pid,
          log: () => log,
          exited,
          stop: async () => {
            proc.kill('SIGTERM');
            return exited;
          },
        });
      }
    });
    exited.then(({ code }) => reject(new Error(`dsv4 serve exited (${code}) before it was ready:\n${log}`)));
  });
}

async function metric(url, name) {
  const text = await (await fetch(url + '/metrics')).text();
  const line = text.split('\n').find((l) => l.startsWith(name + ' '));
  return line ? Number(line.split(' ')[1]) : NaN;
}

// Collects an OpenAI chat stream into the shape of a non-streamed response's choices.
async function collectChat(stream) {
  const choices = [];
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      const ch = (choices[c.index] ||= { content: '', reasoning_content: '', tool_calls: [], finish_reason: null });
      if (c.delta.content) ch.content += c.delta.content;
      if (c.delta.reasoning_content) ch.reasoning_content += c.delta.reasoning_content;
      for (const t of c.delta.tool_calls || []) {
        const call = (ch.tool_calls[t.index] ||= { id: t.id, name: '', arguments: '' });
        if (t.function?.name) call.name += t.function.name;
        if (t.function?.arguments) call.arguments += t.function.arguments;
      }
      if (c.finish_reason) ch.finish_reason = c.finish_reason;
    }
  }
  return { choices, usage };
}

module.exports = { startServer, metric, collectChat, demoModel, agreeingModel };
