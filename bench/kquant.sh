#!/usr/bin/env bash
# k-quants beside int4 on the synthetic TinyLlama-1.1B (`clocher synth --preset tinyllama-1.1b
# --seed 1`, CLOCHER_MODELS/tinyllama-1.1b-hf): decode and prefill tokens/s at THREADS threads,
# and KL divergence vs f32, for
#  - int4    `clocher convert --dtype int4` (q4_0, groups of 32);
#  - q4_k    `clocher convert --dtype q4_k` (every matrix GGUF Q4_K);
#  - Q4_K_M  a GGUF written by `clocher synth --gguf F --ftype q4_k_m` (llama.cpp's Q4_K_M mix:
#            q4_K, q6_K for output and attn_v/ffn_down of the layers use_more_bits picks, f32
#            norms; client/offline/synth.c) from the same seed, converted natively;
#  - llama.cpp's Q4_K_M, a row only when KQ_DIR/tinyllama-1.1b-llama_q4_k_m is there: the same
#            weights quantized by llama.cpp (`llama-quantize F.gguf out.gguf Q4_K_M` of a
#            `clocher synth --gguf F` of the same seed), then `clocher convert`ed.
# Models: CLOCHER_MODELS/tinyllama-1.1b-{f32,int4,q4_k,q4_k_m} when there, else made in KQ_DIR
# (default CLOCHER_MODELS; the k-quant search runs on every CPU: 2 to 11 minutes per model on a
# busy 2-core machine: keep KQ_DIR between runs).
# Speed: REPS repetitions, each running every model back to back (interleaved, so all see the
# same minute of a shared machine); medians. KLD: KL(p_f32 || p_q) of the next-token
# distributions, mean and max over TINY_POSITIONS teacher-forced random ids (bench/quality.sh's
# definition and ids), from the logits inference-engine dumps for each model and for
# tinyllama-1.1b-f32. KLD=calib instead runs bench/quality.sh's calibration rows (int4, q4_k,
# q4_k_m as a quant manifest of the same rule and quantizer; it requantizes: slow).
# Short by default (REPS=2, 32 decoded, 128 prefilled, 256 KLD positions).
# Usage: bash bench/kquant.sh   (BUILD_DIR, CLOCHER_MODELS, KQ_DIR, THREADS=2, REPS,
#        DECODE_TOKENS, PREFILL_TOKENS, TINY_POSITIONS, KLD=logits|calib|none, SKIP_BUILD=1)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build/release}
models=${CLOCHER_MODELS:-models}
kq=${KQ_DIR:-$models}
threads=${THREADS:-2} reps=${REPS:-2} dec=${DECODE_TOKENS:-32} pre=${PREFILL_TOKENS:-128}
positions=${TINY_POSITIONS:-256}
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  cmake --build "$build" -j"${JOBS:-2}" --target clocher inference-engine >/dev/null
fi
clocher=$build/client/clocher ie=$build/worker/inference-engine
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kquant.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
hf=$models/tinyllama-1.1b-hf
# dir NAME: CLOCHER_MODELS/tinyllama-1.1b-NAME when it is there, else the one in KQ_DIR
dir() {
  local n=$1; [ "$n" = Q4_K_M ] && n=q4_k_m; [ "$n" = llama.cpp-Q4_K_M ] && n=llama_q4_k_m
  if [ -f "$models/tinyllama-1.1b-$n/model.ie.json" ]; then echo "$models/tinyllama-1.1b-$n"
  else echo "$kq/tinyllama-1.1b-$n"; fi
}
mkdir -p "$kq"
[ -f "$hf/config.json" ] || "$clocher" synth --preset tinyllama-1.1b --seed 1 "$hf" >/dev/null
for dt in f32 int4 q4_k; do
  [ -f "$(dir $dt)/model.ie.json" ] || "$clocher" convert "$hf" "$(dir $dt)" --dtype "$dt" >/dev/null 2>&1
done
if [ ! -f "$(dir Q4_K_M)/model.ie.json" ]; then
  # the synth's safetensors copy is only a by-product of writing the GGUF
  "$clocher" synth --preset tinyllama-1.1b --seed 1 "$tmp/hf" --gguf "$tmp/q4km.gguf" \
    --ftype q4_k_m >/dev/null
  rm -rf "$tmp/hf"
  "$clocher" convert "$tmp/q4km.gguf" "$(dir Q4_K_M)" >/dev/null 2>&1
  rm -f "$tmp/q4km.gguf"
fi

rows="int4 q4_k Q4_K_M"
[ -f "$(dir llama.cpp-Q4_K_M)/model.ie.json" ] && rows="$rows llama.cpp-Q4_K_M"
# a q4_k made by an older quantizer, kept as KQ_DIR/tinyllama-1.1b-q4_k-old: compared in one run
[ -f "$kq/tinyllama-1.1b-q4_k-old/model.ie.json" ] && rows="$rows q4_k-old"
# Since session 12 our quantizer writes llama.cpp's bytes (kernels/ref_kq.c): say whether the two
# Q4_K_M models are the same file, which makes their KLD rows equal by construction
if [ -f "$(dir llama.cpp-Q4_K_M)/model.ie.bin" ]; then
  if cmp -s "$(dir Q4_K_M)/model.ie.bin" "$(dir llama.cpp-Q4_K_M)/model.ie.bin"; then
    echo "Q4_K_M and llama.cpp-Q4_K_M: model.ie.bin byte-identical"
  else
    echo "Q4_K_M and llama.cpp-Q4_K_M: model.ie.bin differ"
  fi
fi
echo "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), commit $(git rev-parse --short HEAD)"
echo
vocab=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$(dir f32)/model.ie.json")
prompt=$(seq -s, 1000 $((999 + pre)))
short=1$(for i in 2 3 4 5 6 7 8; do printf ',%d' $((vocab * i / 9)); done) # 8 ids: the decode prompt
: >"$tmp/speed"
for r in $(seq "$reps"); do
  for m in $rows; do
    "$ie" --model-dir "$(dir $m)" --prompt-ids "$short" \
      --max-new "$dec" --ignore-eos --threads "$threads" --quiet |
      sed -n "s/.*\"decode_tps\":\([0-9.]*\).*/$m decode \1/p" >>"$tmp/speed"
    "$ie" --model-dir "$(dir $m)" --prompt-ids "$prompt" --max-new 0 --threads "$threads" --quiet |
      sed -n "s/.*\"prefill_tps\":\([0-9.]*\).*/$m prefill \1/p" >>"$tmp/speed"
  done
done
/usr/bin/python3 - "$tmp/speed" "$threads" "$reps" "$dec" "$pre" \
  $(for m in $rows; do echo "$m=$(dir $m)"; done) <<'PY'
import json, os, statistics, sys
path, threads, reps, dec, pre = sys.argv[1:6]
dirs = dict(a.split("=", 1) for a in sys.argv[6:])
v = {}
for line in open(path):
    m, kind, x = line.split()
    v.setdefault((m, kind), []).append(float(x))
print(f"| model | tensors | weights MB | decode tok/s ({threads} threads, {dec} tokens, median of {reps}) "
      f"| prefill tok/s ({threads} threads, {pre} tokens, median of {reps}) |")
print("|---|---|---|---|---|")
for m, d in dirs.items():
    man = json.load(open(os.path.join(d, "model.ie.json")))
    kinds = {}
    for t in man["tensors"]:
        kinds[t["dtype"]] = kinds.get(t["dtype"], 0) + 1
    mb = os.path.getsize(os.path.join(d, "model.ie.bin")) / 1e6
    dd, pp = v.get((m, "decode"), [0]), v.get((m, "prefill"), [0])
    print(f"| {m} | {', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))} | {mb:.0f} | "
          f"{statistics.median(dd):.2f} | {statistics.median(pp):.1f} |")
PY
echo

case ${KLD:-logits} in
none) ;;
calib)
  SKIP_BUILD=1 BUILD_DIR=$build CLOCHER_MODELS=$models THREADS=$threads TINY_POSITIONS=$positions \
    S260_DTYPES= S260_REF_DTYPES= TINY_DTYPES="int4 q4_k q4_k_m" bash bench/quality.sh |
    sed -n '/^| model\|^|---\|^| TinyLlama/p'
  ;;
logits)
  # quality.sh's TinyLlama ids (the same seed), teacher-forced in one prompt
  awk -v n="$positions" -v r=$((vocab - 10)) 'BEGIN{srand(7); printf "1"; for(i=1;i<n;i++) printf ",%d", 3+int(rand()*r); print ""}' >"$tmp/ids"
  for m in f32 $rows; do
    "$ie" --model-dir "$(dir $m)" --prompt-ids "$(cat "$tmp/ids")" --max-new 0 --quiet --threads "$threads" \
      --dump-logits "$tmp/L-$m.f32" >/dev/null
  done
  /usr/bin/python3 - "$tmp" "$positions" $rows <<'PY'
import sys
import numpy as np
tmp, n = sys.argv[1], int(sys.argv[2])
def logp(m):
    x = np.fromfile(f"{tmp}/L-{m}.f32", dtype=np.float32).astype(np.float64).reshape(n, -1)
    x -= x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))
ref = logp("f32")
p = np.exp(ref)
print(f"| model | positions | KLD mean (nats) | KLD max | top-1 agreement |")
print("|---|---|---|---|---|")
for m in sys.argv[3:]:
    q = logp(m)
    kl = (p * (ref - q)).sum(axis=1)
    top = (ref.argmax(axis=1) == q.argmax(axis=1)).mean()
    print(f"| {m} | {n} | {kl.mean():.6f} | {kl.max():.4f} | {100 * top:.2f}% |")
PY
  ;;
*) echo "kquant: KLD=${KLD} is not logits, calib or none" >&2; exit 2 ;;
esac
