// A recording proxy for scripts/agent-check.sh: forwards requests to dsv4 serve, writes each
// request and answer to LOG_DIR (NNN-req.json, NNN-res-STATUS.txt) and caps the answer length
// (max_tokens / max_output_tokens) so a random demo model answers quickly.
// Once per run it answers the first agent request that offers its shell tool itself, with a call
// of that tool (FAKE_COMMAND): a random model never calls one, and the agent's next request,
// which sends the call and its result back, is the one worth checking.
// Usage: node agent-proxy.cjs LISTEN_PORT TARGET_PORT LOG_DIR MAX_TOKENS
const http = require('http');
const fs = require('fs');
const path = require('path');

const [, , listenPort, targetPort, logDir, cap] = process.argv;
const fakeCommand = process.env.FAKE_COMMAND || 'ls';
let n = 0;
let faked = false;

const sse = (type, data) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;

// The shell tool's call in the agent's own API: Anthropic (Claude Code's Bash) or Responses
// (Codex's exec_command). Chat-completions agents are not faked.
function fakeAnswer(url, body) {
  const names = (body.tools || []).map((t) => t.name);
  if (url.startsWith('/v1/messages') && !url.includes('count_tokens') && names.includes('Bash')) {
    // With thinking on, a thinking block first, as dsv4 serve writes one (its signature empty):
    // the agent should send it back with the call (V4 keeps reasoning beside tool calls).
    const thinking = body.thinking && body.thinking.type !== 'disabled';
    const at = thinking ? 1 : 0;
    const call = { type: 'tool_use', id: 'toolu_agentcheck', name: 'Bash', input: {} };
    return sse('message_start', { message: { id: 'msg_agentcheck', type: 'message', role: 'assistant', content: [],
      model: body.model, stop_reason: null, stop_sequence: null, usage: { input_tokens: 1, output_tokens: 0 } } }) +
      (thinking ? sse('content_block_start', { index: 0, content_block: { type: 'thinking', thinking: '', signature: '' } }) +
        sse('content_block_delta', { index: 0, delta: { type: 'thinking_delta', thinking: 'agent-check reasoning' } }) +
        sse('content_block_stop', { index: 0 }) : '') +
      sse('content_block_start', { index: at, content_block: call }) +
      sse('content_block_delta', { index: at, delta: { type: 'input_json_delta',
        partial_json: JSON.stringify({ command: fakeCommand, description: 'agent-check' }) } }) +
      sse('content_block_stop', { index: at }) +
      sse('message_delta', { delta: { stop_reason: 'tool_use', stop_sequence: null }, usage: { output_tokens: 1 } }) +
      sse('message_stop', {});
  }
  if (url === '/v1/responses' && names.includes('exec_command')) {
    // A reasoning item first, as dsv4 serve writes one (the text in encrypted_content too when
    // the client includes it): the agent should send it back with the call.
    const reasoning = { id: 'rs_agentcheck', type: 'reasoning', summary: [],
      content: [{ type: 'reasoning_text', text: 'agent-check reasoning' }], encrypted_content: 'agent-check reasoning' };
    const item = { id: 'fc_agentcheck', type: 'function_call', status: 'completed', call_id: 'call_agentcheck',
      name: 'exec_command', arguments: JSON.stringify({ cmd: fakeCommand }) };
    const resp = { id: 'resp_agentcheck', object: 'response', created_at: 0, status: 'completed', model: body.model,
      output: [reasoning, item], usage: { input_tokens: 1, input_tokens_details: { cached_tokens: 0 }, output_tokens: 1,
        output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 2 } };
    return sse('response.created', { response: { ...resp, status: 'in_progress', output: [] }, sequence_number: 0 }) +
      sse('response.output_item.added', { output_index: 0, item: { ...reasoning, content: [] }, sequence_number: 1 }) +
      sse('response.output_item.done', { output_index: 0, item: reasoning, sequence_number: 2 }) +
      sse('response.output_item.added', { output_index: 1, item: { ...item, status: 'in_progress', arguments: '' }, sequence_number: 3 }) +
      sse('response.output_item.done', { output_index: 1, item, sequence_number: 4 }) +
      sse('response.completed', { response: resp, sequence_number: 5 });
  }
  return null;
}

http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const id = String(++n).padStart(3, '0');
    let text = Buffer.concat(chunks).toString();
    let body = null;
    try {
      body = JSON.parse(text);
      for (const k of ['max_tokens', 'max_output_tokens', 'max_completion_tokens'])
        if (body[k] !== undefined && body[k] > +cap) body[k] = +cap;
      if (req.url === '/v1/responses' && body.max_output_tokens === undefined) body.max_output_tokens = +cap;
      text = JSON.stringify(body);
    } catch (e) { /* not JSON: forwarded as it is */ }
    fs.writeFileSync(path.join(logDir, `${id}-req.json`), JSON.stringify({ method: req.method, url: req.url, body: text }, null, 1));
    const fake = !faked && body && req.method === 'POST' ? fakeAnswer(req.url, body) : null;
    if (fake) {
      faked = true;
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(fake);
      fs.writeFileSync(path.join(logDir, `${id}-res-faked.txt`), fake);
      return;
    }
    const headers = { ...req.headers, 'content-length': Buffer.byteLength(text) };
    delete headers['accept-encoding'];
    const up = http.request({ host: '127.0.0.1', port: targetPort, method: req.method, path: req.url, headers }, (r) => {
      res.writeHead(r.statusCode, r.headers);
      const out = [];
      r.on('data', (c) => { out.push(c); res.write(c); });
      r.on('end', () => {
        res.end();
        fs.writeFileSync(path.join(logDir, `${id}-res-${r.statusCode}.txt`), Buffer.concat(out));
      });
    });
    up.on('error', (e) => { res.writeHead(502); res.end(String(e)); });
    up.end(text);
  });
}).listen(+listenPort, '127.0.0.1');
