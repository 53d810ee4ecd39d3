#!/usr/bin/env bash
# End-to-end benchmark: synthetic TinyLlama-1.1B converted to f32, bf16, int8 and int4,
# inference-engine at 1 and all threads: decode tok/s (128 tokens after an 8-token prompt),
# prefill tok/s (a 512-token prompt), and decode as a fraction of the bandwidth roofline
# measured in the same run (blob bytes read per token x tok/s / bandwidth); then decode of
# 128 tokens after a 1024-token prompt at all threads, whose bytes per token add the f32 KV
# cache attention reads (K and V of every layer at the mean position). Prints markdown.
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
# one probe run (>= 1 GiB, best of its variants, ~10 s) gives both thread counts
probe=$("$build/bench/bw_probe" 1024 4)
bw1=$(sed -n 's/^bandwidth threads=1: \([0-9.]*\).*/\1/p' <<<"$probe")
bwn=$(sed -n "s/^bandwidth threads=$(nproc): \([0-9.]*\).*/\1/p" <<<"$probe")
win1=$(sed -n 's/^bandwidth threads=1: .*winner: \(.*\))$/\1/p' <<<"$probe")
winn=$(sed -n "s/^bandwidth threads=$(nproc): .*winner: \(.*\))$/\1/p" <<<"$probe")
echo "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, commit $(git rev-parse --short HEAD), ISA $("$ie" --help >/dev/null 2>&1; echo auto)"
echo "Bandwidth (read-only, this run): 1 thread $bw1 GB/s ($win1), $(nproc) threads $bwn GB/s ($winn)"
echo "Load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| dtype | threads | model GB | decode tok/s | decode GB/s (% of roofline) | prefill tok/s (512) |"
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
    roof=$(awk "BEGIN{printf \"%.1f (%.0f%%)\", $gb*$dec, 100*$gb*$dec/$bw}")
    printf '| %s | %s | %.2f | %.1f | %s | %.1f |\n' "$dt" "$t" "$gb" "$dec" "$roof" "$pre"
  done
done

# Decode after a long prompt: weights plus the KV cache read per token. The engine's KV cache
# is f32; decode step i (of 128) attends to 1024 + i positions, K and V of every layer.
cfg=$hf/config.json
key() { sed -n "s/.*\"$1\": *\([0-9]*\).*/\1/p" "$cfg"; }
kvpos=$(awk "BEGIN{print 2*$(key num_hidden_layers)*$(key num_key_value_heads)*$(key hidden_size)/$(key num_attention_heads)*4}")
kvgb=$(awk "BEGIN{print $kvpos*(1024+64)/1e9}")
prompt1024=$(seq -s, 1000 2023)
echo
echo "Decode 128 tokens after a 1024-token prompt, $(nproc) threads (KV cache read per token:"
echo "$kvpos bytes per position x 1088 mean positions = $(awk "BEGIN{printf \"%.3f\", $kvgb}") GB):"
echo
echo "| dtype | threads | GB read per token (weights + KV) | decode tok/s | decode GB/s (% of roofline) |"
echo "|---|---|---|---|---|"
for dt in f32 bf16 int8 int4; do
  ie_dir=$models/tinyllama-1.1b-$dt
  gb=$(awk "BEGIN{print $(stat -c %s "$ie_dir/model.ie.bin")/1e9 + $kvgb}")
  t=$(nproc)
  dec=$("$ie" --model-dir "$ie_dir" --prompt-ids "$prompt1024" --max-new 128 --ignore-eos --threads "$t" --quiet | sed -n 's/.*"decode_tps":\([0-9.]*\).*/\1/p')
  roof=$(awk "BEGIN{printf \"%.1f (%.0f%%)\", $gb*$dec, 100*$gb*$dec/$bwn}")
  printf '| %s | %s | %.3f | %.1f | %s |\n' "$dt" "$t" "$gb" "$dec" "$roof"
done
