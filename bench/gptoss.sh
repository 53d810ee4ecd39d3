#!/usr/bin/env bash
# gpt-oss-20b on this machine (issue 13's benchmarks; docs/PERFORMANCE.md "gpt-oss-20b"):
# `clocher synth --preset gpt-oss-20b` (random weights of the real shapes, MXFP4 experts, the
# rest bf16) converted twice: attention/router/embeddings bf16 (as released) and int8 (q8_0).
# Per repetition (all of one dtype's first, so its mapping stays in the page cache), one after
# another so they share the machine's minute:
#   - bw_probe: the 2-thread read bandwidth, the roof every figure of the repetition is set
#     against (only a ratio measured in one run counts: the machine's speed swings 1.5-2x);
#   - decode tok/s after a short prompt (8 tokens, DECODE_TOKENS new);
#   - prefill tok/s (PREFILL_TOKENS prompt tokens, nothing generated);
#   - aggregate decode of STREAMS concurrent requests through the serving engine;
# and once per dtype when LONG=1: decode after a LONG_TOKENS prompt (slow: prefill first).
# Bytes read per decoded token are computed from the manifest (bytes_per_token below): every
# non-expert matrix, bias and norm, n_experts_used/n_experts of the expert tensors, one
# embedding row; KV reads are left out (small after a short prompt; stated for LONG).
# Roofline fraction = bytes/token x tok/s / probe GB/s, per repetition, then the median.
#   bash bench/gptoss.sh            Env: BUILD_DIR (build/release), CLOCHER_MODELS (models/),
#   REPS (3), THREADS (2), DTYPES ("bf16 int8"), DECODE_TOKENS (32), PREFILL_TOKENS (512),
#   STREAMS (8), LONG (0), LONG_TOKENS (4096).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build/release}
models=${CLOCHER_MODELS:-models}
reps=${REPS:-3} threads=${THREADS:-2} dtypes=${DTYPES:-bf16 int8}
dec=${DECODE_TOKENS:-32} pre=${PREFILL_TOKENS:-512} streams=${STREAMS:-8}
long=${LONG:-0} long_tokens=${LONG_TOKENS:-4096}
cmake --build "$build" -j2 --target clocher inference-engine bw_probe >/dev/null
clocher=$build/client/clocher ie=$build/worker/inference-engine probe=$build/bench/bw_probe
hf=$models/gpt-oss-20b-hf
mkdir -p "$models"
[ -f "$hf/config.json" ] || "$clocher" synth --preset gpt-oss-20b --seed 1 "$hf" >/dev/null
for dt in $dtypes; do
  d=$models/gpt-oss-20b-$dt
  [ -f "$d/model.ie.json" ] || "$clocher" convert "$hf" "$d" --dtype "$dt" >/dev/null
done

bytes_per_token() { # model dir -> bytes one decoded token reads (weights only)
  python3 - "$1/model.ie.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
hp = m["hparams"]
frac = hp["n_experts_used"] / hp["n_experts"]
total = 0.0
for t in m["tensors"]:
    if t["name"] == "tok_embd":
        total += t["size"] / hp["vocab_size"]
    elif "_exps" in t["name"]:
        total += t["size"] * frac
    else:
        total += t["size"]
print(int(total))
PY
}

ids() { python3 -c "import sys; print(','.join(str(1000 + (i * 7919) % 190000) for i in range(int(sys.argv[1]))))" "$1"; }
short=$(ids 8) prefill=$(ids "$pre")
json() { python3 -c "import json,sys; d=json.loads(sys.stdin.readline()); print(d[sys.argv[1]])" "$1"; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for dt in $dtypes; do # dtype outermost: two 13 GB models do not both stay in the page cache
  for r in $(seq "$reps"); do
    d=$models/gpt-oss-20b-$dt
    bw=$("$probe" 512 3 | sed -n "s/^bandwidth threads=$threads: \([0-9.]*\) GB\/s.*/\1/p")
    dec_tps=$("$ie" --model-dir "$d" --prompt-ids "$short" --max-new "$dec" --ignore-eos \
      --greedy --threads "$threads" --quiet | json decode_tps)
    pre_tps=$("$ie" --model-dir "$d" --prompt-ids "$prefill" --max-new 0 --threads "$threads" \
      --quiet | json prefill_tps)
    agg=$("$ie" --model-dir "$d" --prompt-ids "$short" --max-new "$dec" --ignore-eos --greedy \
      --threads "$threads" --concurrency "$streams" --quiet | json tps)
    rss=$(/usr/bin/time -f '%M' "$ie" --model-dir "$d" --prompt-ids "$short" --max-new 4 \
      --threads "$threads" --quiet 2>&1 >/dev/null | tail -1)
    echo "$r $dt $bw $dec_tps $pre_tps $agg $rss" | tee -a "$out"
  done
done
if [ "$long" = 1 ]; then
  for dt in $dtypes; do
    d=$models/gpt-oss-20b-$dt
    bw=$("$probe" 512 3 | sed -n "s/^bandwidth threads=$threads: \([0-9.]*\) GB\/s.*/\1/p")
    tps=$("$ie" --model-dir "$d" --prompt-ids "$(ids "$long_tokens")" --max-new 16 --ignore-eos \
      --greedy --threads "$threads" --quiet | json decode_tps)
    echo "long $dt $bw $tps" | tee -a "$out"
  done
fi
echo
echo "| dtype (non-expert) | bytes/token | probe GB/s | decode tok/s | roofline fraction | prefill$pre tok/s | $streams streams tok/s (x one) | peak RSS GB |"
echo "|---|---|---|---|---|---|---|---|"
for dt in $dtypes; do
  bpt=$(bytes_per_token "$models/gpt-oss-20b-$dt")
  python3 - "$out" "$dt" "$bpt" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.split()[0] != "long" and l.split()[1] == sys.argv[2]]
bpt = int(sys.argv[3])
med = lambda xs: statistics.median(xs)
bw = [float(r[2]) for r in rows]; dec = [float(r[3]) for r in rows]
frac = [bpt * float(r[3]) / (float(r[2]) * 1e9) for r in rows]
agg = [float(r[5]) / float(r[3]) for r in rows]
print(f"| {sys.argv[2]} | {bpt / 1e9:.3f} GB | {med(bw):.1f} | {med(dec):.2f} | "
      f"{med(frac):.2f} ({min(frac):.2f}-{max(frac):.2f}) | {med([float(r[4]) for r in rows]):.1f} | "
      f"{med([float(r[5]) for r in rows]):.2f} ({med(agg):.2f}x) | {max(float(r[6]) for r in rows) / 1048576:.2f} |")
PY
done
