#!/usr/bin/env bash
# The main job (README's first command): install what is missing, build, create the default
# model, and serve one request with it.
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

echo "==> inference-engine on \"$prompt\"" >&2
"$bin/worker/inference-engine" --model-dir "$ie_dir" --prompt "$prompt" --max-new "$max_new" \
  --threads "$(nproc)" --seed 1 --print-ids
