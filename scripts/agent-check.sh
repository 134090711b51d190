#!/usr/bin/env bash
# Runs real coding agents against `dsv4 serve` on the demo model and checks that the server
# takes every request they send: Claude Code (/v1/messages), Codex (/v1/responses) and opencode
# (/v1/chat/completions), installed from npm at their latest versions (or AGENT_VERSIONS, e.g.
# "@anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0 opencode-ai@1.18.33").
#
# The agents' requests pass through scripts/agent-proxy.cjs, which records them (and the
# answers) under tmp/agent-check/log, caps their answer length, and answers the first request
# offering a shell tool itself with a call of that tool: the random demo model never calls one,
# and the agent's next request, carrying the call and its output back, is the one to check.
# Passes when each agent made requests and every /v1 request was answered 200.
#
# Not run by CI: it downloads the agents (~300 MB) and their behaviour changes with each release,
# which is the point: rerun it when an agent updates. Agents write to a scratch HOME under
# tmp/agent-check; nothing is sent beyond 127.0.0.1 except the npm install (and opencode's
# own fetch of its provider package).
#
# Usage: scripts/agent-check.sh [claude] [codex] [opencode]     (default: all three)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
agents=("$@")
[ ${#agents[@]} -gt 0 ] || agents=(claude codex opencode)
work=$root/tmp/agent-check
port=${DSV4_AGENT_PORT:-18091}
proxy_port=$((port + 1))
cap=${AGENT_MAX_TOKENS:-48}

[ -x build/dsv4 ] || scripts/build.sh
scripts/fetch-tokenizer.sh build/deps/tokenizer
[ -f tmp/demo-model/config.json ] ||
  build/dsv4 make-tiny --out tmp/demo-model --preset demo --tokenizer build/deps/tokenizer --seed 1

mkdir -p "$work/npm" "$work/project"
echo "agent-check: installing ${AGENT_VERSIONS:-the latest agents} (npm)" >&2
(cd "$work/npm" && [ -f package.json ] || npm init -y >/dev/null)
(cd "$work/npm" && npm install --no-audit --no-fund --loglevel=error \
  ${AGENT_VERSIONS:-@anthropic-ai/claude-code @openai/codex opencode-ai} >/dev/null)
bin=$work/npm/node_modules/.bin
echo "a file for the agents to list" > "$work/project/README.txt"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
build/dsv4 serve --model tmp/demo-model --port "$port" --model-name deepseek-v4 --quiet > "$work/serve.log" 2>&1 &
pids+=($!)
# (node, which the agents need anyway, asks /health: curl may not be installed)
healthy() { node -e 'fetch(process.argv[1]).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))' \
  "http://127.0.0.1:$port/health"; }
for _ in $(seq 100); do healthy && break; sleep 0.2; done
healthy || { echo "agent-check: the server did not start:" >&2; cat "$work/serve.log" >&2; exit 1; }

failed=0
for agent in "${agents[@]}"; do
  log=$work/log/$agent
  rm -rf "$log" "$work/home-$agent"
  mkdir -p "$log" "$work/home-$agent"
  home=$work/home-$agent
  FAKE_COMMAND="ls $work/project" node scripts/agent-proxy.cjs "$proxy_port" "$port" "$log" "$cap" &
  proxy=$!
  sleep 0.5
  base=http://127.0.0.1:$proxy_port
  echo "agent-check: $agent ..." >&2
  set +e
  case $agent in
    claude)
      (cd "$work/project" && HOME=$home ANTHROPIC_BASE_URL=$base ANTHROPIC_API_KEY=unused ANTHROPIC_MODEL=deepseek-v4 \
        ANTHROPIC_SMALL_FAST_MODEL=deepseek-v4 DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
        timeout 300 "$bin/claude" -p "List the files here" --allowedTools Bash > "$log/agent.out" 2>&1) ;;
    codex)
      mkdir -p "$home/.codex"
      printf 'model = "deepseek-v4"\nmodel_provider = "dsv4"\n[model_providers.dsv4]\nname = "dsv4"\nbase_url = "%s/v1"\nwire_api = "responses"\nenv_key = "DSV4_KEY"\n' \
        "$base" > "$home/.codex/config.toml"
      (cd "$work/project" && HOME=$home CODEX_HOME=$home/.codex DSV4_KEY=unused \
        timeout 300 "$bin/codex" exec --skip-git-repo-check "List the files here" > "$log/agent.out" 2>&1 < /dev/null) ;;
    opencode)
      mkdir -p "$home/.config/opencode"
      printf '{"provider": {"dsv4": {"npm": "@ai-sdk/openai-compatible", "name": "dsv4", "options": {"baseURL": "%s/v1", "apiKey": "unused"}, "models": {"deepseek-v4": {"name": "deepseek-v4"}}}}, "model": "dsv4/deepseek-v4", "autoupdate": false, "share": "disabled"}\n' \
        "$base" > "$home/.config/opencode/opencode.json"
      (cd "$work/project" && HOME=$home XDG_CONFIG_HOME=$home/.config \
        timeout 300 "$bin/opencode" run "List the files here" > "$log/agent.out" 2>&1 < /dev/null) ;;
    *) echo "agent-check: unknown agent '$agent' (claude, codex, opencode)" >&2; exit 2 ;;
  esac
  set -e
  kill "$proxy" 2>/dev/null || true
  wait "$proxy" 2>/dev/null || true
  # Every /v1 request answered 200 (the recorded answers are named by status).
  answered=0 bad=()
  for req in "$log"/*-req.json; do
    [ -e "$req" ] || continue
    url=$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).url)' "$req")
    case $url in /v1/*) ;; *) continue ;; esac
    res=$(ls "${req%-req.json}"-res-* 2>/dev/null | head -1)
    case $res in *-res-200.txt) answered=$((answered + 1)) ;; *-res-faked.txt) ;; *) bad+=("$(basename "$req") $url -> ${res##*-res-}") ;; esac
  done
  back=$( (grep -l -E 'toolu_agentcheck|call_agentcheck' "$log"/*-req.json 2>/dev/null || true) | wc -l)
  # ... and with it the faked answer's reasoning (V4 keeps reasoning beside tool calls).
  reasoned=$( (grep -l 'agent-check reasoning' "$log"/*-req.json 2>/dev/null || true) | wc -l)
  if [ ${#bad[@]} -gt 0 ] || [ "$answered" -eq 0 ]; then
    echo "agent-check: $agent FAILED: $answered answered 200; not answered: ${bad[*]:-none} (log: $log)" >&2
    failed=1
  else
    echo "agent-check: $agent ok: $answered requests answered 200, $back sent the faked tool call back, $reasoned its reasoning (log: $log)" >&2
  fi
done
exit $failed
