#!/usr/bin/env bash
# vs_llamacpp.sh — Clocher beside llama.cpp on the same weights, interleaved, in one run.
#
# The only comparison that counts on a machine whose speed drifts 1.5-2x between minutes:
# both engines in the same rounds, the order swapped each round, the ratio taken per round.
# Measures int4 (q4_0 = ggml's Q4_0) prefill of 512 tokens and decode at 1 and 8 streams,
# 2 threads, with llama.cpp's own tools (llama-bench, llama-batched-bench) and Clocher's
# engine_bench (bench/engine_bench.c).
#
# Same weights: `clocher synth --gguf` writes the Hugging Face folder's tensors in llama.cpp's
# layout; `llama-quantize --pure` makes every matrix Q4_0, as `clocher convert --dtype int4`
# does (same rounding):
#   clocher synth --preset tinyllama-1.1b --seed 1 --dtype bf16 HF --gguf T.gguf
#   llama-quantize --pure T.gguf T-q4_0.gguf Q4_0
#   clocher convert HF IE4 --dtype int4
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bash bench/vs_llamacpp.sh T-q4_0.gguf IE4 [ROUNDS]
#
# Prints one line per measurement and per round, then the per-round ratios and their median.
set -euo pipefail
gguf=${1:?usage: vs_llamacpp.sh Q4_0.gguf IEBIN_DIR [ROUNDS]}
ie=${2:?usage: vs_llamacpp.sh Q4_0.gguf IEBIN_DIR [ROUNDS]}
rounds=${3:-3}
bin=${LLAMA_BIN:?set LLAMA_BIN to the bin folder of a llama.cpp build}
build=${CLOCHER_BUILD:-$(cd "$(dirname "$0")/.." && pwd)/build/release}
eb="$build/bench/engine_bench"
threads=${THREADS:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

llama_prefill() { # tokens/s of a 512-token prompt
  "$bin/llama-bench" -m "$gguf" -t "$threads" -p 512 -n 0 -r 1 -o json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])'
}
llama_decode() { # "1-stream 8-stream" aggregate generation tokens/s
  "$bin/llama-batched-bench" -m "$gguf" -t "$threads" -c 4096 -b 512 -ub 512 -npp 8 -ntg 32 \
    -npl 1,8 --output-format jsonl 2>/dev/null |
    python3 -c '
import json, sys
r = {}
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        j = json.loads(line)
        r[j["pl"]] = j["speed_tg"]
print(r[1], r[8])'
}
clocher_prefill() {
  "$eb" --model-dir "$ie" --threads "$threads" --mode prefill --prefill 1 --prefill-len 512 \
    2>/dev/null | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["wall_tps"])'
}
clocher_decode() {
  "$eb" --model-dir "$ie" --threads "$threads" --mode scale --streams 1,8 --reps 1 2>/dev/null |
    python3 -c '
import json, sys
r = {}
for line in sys.stdin:
    j = json.loads(line)
    r[j["streams"]] = j["wall_tps"]
print(r[1], r[8])'
}

echo "# $(date -u +%FT%TZ) $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "# clocher $(git -C "$(dirname "$0")" rev-parse --short HEAD), llama.cpp $(git -C "$bin/../.." rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "# threads $threads, rounds $rounds; wall-clock tokens/s"
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order="llama clocher"; else order="clocher llama"; fi
  for who in $order; do
    p=$(${who}_prefill)
    read -r d1 d8 < <(${who}_decode)
    echo "round $r $who prefill $p decode1 $d1 decode8 $d8" | tee -a "$out/rows"
  done
done
python3 - "$out/rows" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    rows.setdefault(int(f[1]), {})[f[2]] = {"prefill": float(f[4]), "decode1": float(f[6]),
                                            "decode8": float(f[8])}
for what in ("prefill", "decode1", "decode8"):
    ratios = [v["clocher"][what] / v["llama"][what] for v in rows.values()]
    print("clocher/llama.cpp %-8s per round %s  median %.2f" % (
        what, " ".join("%.2f" % x for x in ratios), statistics.median(ratios)))
EOF
