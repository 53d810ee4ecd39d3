#!/usr/bin/env bash
# The main job (README's first command): install what is missing, build, create the default
# model, start the daemon clocherd on it and stream one reply through the `clocher` client:
#   build -> default model -> clocherd (config in a temp dir, Unix socket for gRPC, the
#   OpenAI-compatible HTTP API on 127.0.0.1:$CLOCHER_HTTP_PORT, default 8000) -> health SERVING
#   -> `clocher generate` streams the text -> `curl` POST /v1/chat/completions -> SIGTERM
#   -> clocherd exits 0.
#
# The default model is `clocher synth --preset ${CLOCHER_PRESET:-tinyllama-1.1b}`: a
# TinyLlama-1.1B-shaped Llama with RANDOM weights (deterministic, seed 1). Its output is not
# language; it exercises exactly the code a real checkpoint does (see README: "A real model").
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
preset=${CLOCHER_PRESET:-tinyllama-1.1b}
dtype=${CLOCHER_DTYPE:-bf16}
models=${CLOCHER_MODELS:-$root/models}
prompt=${CLOCHER_PROMPT:-Once upon a time, in a small village by the sea,}
max_new=${CLOCHER_MAX_NEW:-32}
http_port=${CLOCHER_HTTP_PORT:-8000}

bash scripts/install-deps.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j"$(nproc)" >&2
bin=build/release

hf_dir=$models/$preset-hf
ie_dir=$models/$preset-$dtype
if [ ! -f "$ie_dir/model.ie.json" ]; then
  echo "==> creating the default model: synth --preset $preset (random weights) -> IEBIN $dtype" >&2
  mkdir -p "$models"
  [ -f "$hf_dir/config.json" ] || "$bin/client/clocher" synth --preset "$preset" --seed 1 "$hf_dir"
  "$bin/client/clocher" convert "$hf_dir" "$ie_dir" --dtype "$dtype"
fi

# clocherd with a throwaway configuration: a Unix socket in a temp dir for gRPC, the HTTP API on
# loopback (CLOCHER_HTTP_PORT if 8000 is taken), no metrics endpoint, generous ready/heartbeat
# timeouts for a big model's slow start.
run_dir=$(mktemp -d "${TMPDIR:-/tmp}/clocher-run.XXXXXX")
sock=$run_dir/clocherd.sock
addr=unix:$sock
daemon_pid=
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  rm -rf "$run_dir"
}
trap cleanup EXIT
cat >"$run_dir/clocherd.json" <<EOF
{
  "listen": {"tcp": null, "unix": "$sock"},
  "metrics": {"listen": null},
  "http": {"listen": "127.0.0.1:$http_port"},
  "model_dir": "$ie_dir",
  "supervisor": {"ready_timeout_s": 600, "heartbeat_timeout_s": 600}
}
EOF

echo "==> clocherd on $ie_dir, listening on $addr and http://127.0.0.1:$http_port/v1" >&2
"$bin/daemon/clocherd" --config "$run_dir/clocherd.json" &
daemon_pid=$!

# SERVING within ~120 s, or say why (a daemon that exits has logged its reason above)
ready=
for _ in $(seq 1 240); do
  if "$bin/client/clocher" health --addr "$addr" --quiet --connect-timeout 1; then
    ready=1
    break
  fi
  if ! kill -0 "$daemon_pid" 2>/dev/null; then
    rc=0
    wait "$daemon_pid" || rc=$?
    daemon_pid=
    echo "run.sh: clocherd exited with status $rc before serving" >&2
    exit 1
  fi
  sleep 0.5
done
if [ -z "$ready" ]; then
  echo "run.sh: clocherd is not SERVING after 120 s:" >&2
  "$bin/client/clocher" health --addr "$addr" >&2 || true
  exit 1
fi

echo "==> clocher generate \"$prompt\" (streamed as it arrives; random weights: not language)" >&2
"$bin/client/clocher" generate --addr "$addr" --max-tokens "$max_new" --seed 1 --verbose \
  "$prompt"

# the same daemon through its OpenAI-compatible API (docs/HTTP.md)
model=$(curl -sS "http://127.0.0.1:$http_port/v1/models" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
echo "==> curl http://127.0.0.1:$http_port/v1/chat/completions (model \"$model\")" >&2
curl -sS --fail-with-body "http://127.0.0.1:$http_port/v1/chat/completions" \
  -H "Content-Type: application/json" \
  -d "{\"model\": \"$model\", \"max_tokens\": $max_new, \"seed\": 1,
       \"messages\": [{\"role\": \"user\", \"content\": \"$prompt\"}]}"
echo

echo "==> stopping clocherd (SIGTERM)" >&2
kill -TERM "$daemon_pid"
rc=0
wait "$daemon_pid" || rc=$?
daemon_pid=
if [ "$rc" -ne 0 ]; then
  echo "run.sh: clocherd exited with status $rc after SIGTERM (expected 0)" >&2
  exit 1
fi
echo "==> clocherd stopped cleanly" >&2
