#!/usr/bin/env bash
# Pipecat's and LiveKit's OpenAI TTS, unmodified, against this server (scripts/check_agents.py): their
# defaults and each response_format, every row compared with the server's own frame count.
#   scripts/check_agents.sh            builds .agents-venv, starts a server (scripts/serve.sh, tiny demo
#                                      checkpoint unless MOSS_TTS_MODEL_DIR is set) on free ports, runs
#                                      the check, stops the server; exit 0 when every row passes
#   SHIM_URL=http://HOST:8080 METRICS_URL=http://HOST:8002/metrics scripts/check_agents.sh
#                                      against a running server (nothing else should use it meanwhile:
#                                      the frame count is the server's counter)
#   CHECK_ARGS=--bodies                also print each row's request bodies and each agent run
#   CHECK_ARGS="--only agents"         only the plugins' agent-style runs (or --only openai)
# Then this repository's plugins (plugins/: LiveKit and Pipecat TTS over the WebSocket's named
# contexts), agent-style: interrupted mid-answer, the next answer at once (scripts/agent_turns.py).
# The frameworks pull numpy 2, so they get their own venv (.agents-venv, requirements-agents.txt),
# and so do the plugins, each pinning its framework; the server's .venv is never touched.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.agents-venv
python_minor="$(python3 scripts/pins.py --fact python)"
if ! cmp -s requirements-agents.txt "$venv/.installed-requirements"; then
  rm -rf "$venv"
  "${PYTHON:-python$python_minor}" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r requirements-agents.txt
  cp requirements-agents.txt "$venv/.installed-requirements"
fi
# The plugins are reinstalled whenever a file of theirs changed (setuptools builds in their build/).
plugins_sum="$(find plugins -type f \( -name '*.py' -o -name pyproject.toml \) -not -path '*/build/*' | sort | xargs sha256sum)"
if [ "$plugins_sum" != "$(cat "$venv/.installed-plugins" 2>/dev/null)" ]; then
  rm -rf plugins/*/build
  "$venv/bin/pip" install -q --disable-pip-version-check ./plugins/livekit-plugins-moss-tts ./plugins/pipecat-moss-tts
  rm -rf plugins/*/build
  printf '%s\n' "$plugins_sum" >"$venv/.installed-plugins"
fi
if [ -z "${SHIM_URL:-}" ]; then
  read -r HTTP_PORT GRPC_PORT METRICS_PORT SHIM_PORT < <(python3 -c "
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(('127.0.0.1', 0))
print(*(s.getsockname()[1] for s in socks))")
  export HTTP_PORT GRPC_PORT METRICS_PORT SHIM_PORT
  log="$(mktemp -t check_agents_server.XXXXXX.log)"
  setsid scripts/serve.sh >"$log" 2>&1 &
  server=$!
  trap 'kill -TERM -- -"$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
  SHIM_URL="http://127.0.0.1:$SHIM_PORT" METRICS_URL="http://127.0.0.1:$METRICS_PORT/metrics"
  echo "server log: $log"
  for _ in $(seq 600); do
    if curl -sf "$SHIM_URL/health" >/dev/null; then break; fi
    if ! kill -0 "$server" 2>/dev/null; then tail -30 "$log"; exit 1; fi
    sleep 1
  done
  curl -sf "$SHIM_URL/health" >/dev/null || { tail -30 "$log"; echo "the server did not become healthy" >&2; exit 1; }
fi
# The first request of a fresh server compiles for tens of seconds on a CPU; LiveKit's plugin waits 30 s.
curl -sf "$SHIM_URL/v1/audio/speech" -H "Content-Type: application/json" -o /dev/null \
  -d '{"input": "Warm up.", "max_new_tokens": 2, "response_format": "pcm", "stream": false}'
"$venv/bin/python" scripts/check_agents.py --shim-url "$SHIM_URL" --metrics-url "$METRICS_URL" ${CHECK_ARGS:-}
