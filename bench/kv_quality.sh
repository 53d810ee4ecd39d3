#!/usr/bin/env bash
# Quality of each KV cache dtype vs the f32 cache (docs/PERFORMANCE.md, "KV cache dtypes"):
# KL divergence of the next-token distributions over EVAL (default 32) teacher-forced decode
# steps after a prefill of 1k and 4k tokens, f16 / bf16 / int8 / fp8, the 8-bit types with and
# without the Walsh-Hadamard rotation (bench/kv_quality.c). Prints markdown.
#  - stories260K (trained, context 512: 1k and 4k run past what it was trained on, which makes
#    attention broad, not invalid): the input is the model's own greedy text (f32 weights),
#    9 stories of up to 512 tokens from different first tokens, concatenated (~4.6k ids);
#  - synthetic TinyLlama-1.1B (random weights, bf16; `clocher synth`): random token ids.
#    Skipped with TINY=0 (a 4k prefill of a 1.1B model per dtype takes minutes).
# Usage: bash bench/kv_quality.sh   (BUILD_DIR, CLOCHER_MODELS, CLOCHER_FIXTURES, THREADS,
#        CTXS="1024 4096", EVAL=32, TINY=1)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build/release}
models=${CLOCHER_MODELS:-models}
fixtures=${CLOCHER_FIXTURES:-../shared/fixtures}
threads=${THREADS:-$(nproc)}
ctxs=${CTXS:-1024 4096}
eval_steps=${EVAL:-32}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target clocher inference-engine kv_quality >/dev/null
clocher=$build/client/clocher ie=$build/worker/inference-engine kvq=$build/bench/kv_quality
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, commit $(git rev-parse --short HEAD)"
echo
echo "| model | prompt tokens | KV dtype | rotation | KLD mean (nats) | KLD max |"
echo "|---|---|---|---|---|---|"

"$clocher" convert "$fixtures/stories260K/stories260K.bin" "$tmp/s260" --dtype f32 2>/dev/null
: >"$tmp/s260.ids"
for first in 1 100 200 300 350 400 420 450 500; do
  "$ie" --model-dir "$tmp/s260" --prompt-ids "1,$first" --max-new 510 --greedy --ignore-eos \
    --print-ids --quiet --threads 1 |
    /usr/bin/python3 -c 'import json,sys; j=json.loads(sys.stdin.readline()); print(" ".join(map(str, [1, int(sys.argv[1])] + j["generated_ids"])))' "$first" >>"$tmp/s260.ids"
done
for ctx in $ctxs; do
  "$kvq" --model-dir "$tmp/s260" --ids "$tmp/s260.ids" --ctx "$ctx" --eval "$eval_steps" \
    --name stories260K --threads "$threads"
done

if [ "${TINY:-1}" != 0 ]; then
  hf=$models/tinyllama-1.1b-hf
  [ -f "$hf/config.json" ] || "$clocher" synth --preset tinyllama-1.1b --seed 1 "$hf" >/dev/null
  "$clocher" convert "$hf" "$tmp/tiny" --dtype bf16 >/dev/null 2>&1
  awk 'BEGIN{srand(7); printf "1"; for(i=1;i<8192;i++) printf " %d", 3+int(rand()*31990); print ""}' >"$tmp/tiny.ids"
  for ctx in $ctxs; do
    "$kvq" --model-dir "$tmp/tiny" --ids "$tmp/tiny.ids" --ctx "$ctx" --eval "$eval_steps" \
      --name "TinyLlama-1.1B (synthetic, bf16 weights)" --threads "$threads"
  done
fi
