#!/usr/bin/env bash
# End-to-end benchmark: synthetic TinyLlama-1.1B converted to f32, bf16, int8 and int4,
# inference-engine at 1 and all threads: decode tok/s (128 tokens after an 8-token prompt),
# prefill tok/s (a 512-token prompt), and decode as a fraction of the bandwidth roofline
# measured in the same run (blob bytes read per token x tok/s / bandwidth). Prints markdown.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build/release}
models=${CLOCHER_MODELS:-models}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" >/dev/null
clocher=$build/client/clocher ie=$build/worker/inference-engine
hf=$models/tinyllama-1.1b-hf
mkdir -p "$models"
[ -f "$hf/config.json" ] || "$clocher" synth --preset tinyllama-1.1b --seed 1 "$hf"
bw1=$("$build/bench/bw_probe" 512 4 | sed -n 's/^bandwidth threads=1: \([0-9.]*\).*/\1/p')
bwn=$("$build/bench/bw_probe" 512 4 | sed -n "s/^bandwidth threads=$(nproc): \([0-9.]*\).*/\1/p")
echo "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, commit $(git rev-parse --short HEAD), ISA $("$ie" --help >/dev/null 2>&1; echo auto)"
echo "Bandwidth (read-only, this run): 1 thread $bw1 GB/s, $(nproc) threads $bwn GB/s"
echo
echo "| dtype | threads | model GB | decode tok/s | decode % of roofline | prefill tok/s (512) |"
echo "|---|---|---|---|---|---|"
prompt512=$(seq -s, 1000 1511)
for dt in f32 bf16 int8 int4; do
  ie_dir=$models/tinyllama-1.1b-$dt
  [ -f "$ie_dir/model.ie.json" ] || "$clocher" convert "$hf" "$ie_dir" --dtype "$dt" 2>/dev/null
  gb=$(awk "BEGIN{print $(stat -c %s "$ie_dir/model.ie.bin")/1e9}")
  for t in 1 "$(nproc)"; do
    bw=$bw1; [ "$t" = 1 ] || bw=$bwn
    dec=$("$ie" --model-dir "$ie_dir" --prompt-ids 1,2000,3000,4000,5000,6000,7000,8000 --max-new 128 --ignore-eos --threads "$t" --quiet | sed -n 's/.*"decode_tps":\([0-9.]*\).*/\1/p')
    pre=$("$ie" --model-dir "$ie_dir" --prompt-ids "$prompt512" --max-new 0 --threads "$t" --quiet | sed -n 's/.*"prefill_tps":\([0-9.]*\).*/\1/p')
    roof=$(awk "BEGIN{printf \"%.0f%%\", 100*$gb*$dec/$bw}")
    printf '| %s | %s | %.2f | %.1f | %s | %.1f |\n' "$dt" "$t" "$gb" "$dec" "$roof" "$pre"
  done
done
