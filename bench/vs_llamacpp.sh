#!/usr/bin/env bash
# vs_llamacpp.sh — Clocher beside llama.cpp on the same weights, interleaved, in one run.
#
# The only comparison that counts on a machine whose speed drifts 1.5-2x between minutes:
# both engines in the same rounds, the order swapped each round, the ratio taken per round.
# Measures prefill of 512 tokens and decode at 1 and 8 streams, 2 threads, with llama.cpp's
# own tools (llama-bench, llama-batched-bench) and Clocher's engine_bench
# (bench/engine_bench.c), for the weight type DTYPE names: int4 (the default: q4_0 = ggml's
# Q4_0), int8 (q8_0 = ggml's Q8_0) or bf16 (ggml's BF16). The measurements are the same for
# every DTYPE; it names the pair of files the run is for (printed in the header) and, for
# int8 and bf16, is checked against the GGUF's file name when that names a type.
#
# Same weights: `clocher synth --gguf` writes the Hugging Face folder's tensors in llama.cpp's
# layout (1-D tensors in f32, as llama.cpp wants them); `llama-quantize --pure` makes every
# matrix Q4_0 (Q8_0), as `clocher convert --dtype int4` (int8) does (same rounding):
#   clocher synth --preset tinyllama-1.1b --seed 1 --dtype bf16 HF --gguf T.gguf
#   llama-quantize --pure T.gguf T-q4_0.gguf Q4_0
#   clocher convert HF IE4 --dtype int4
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bash bench/vs_llamacpp.sh T-q4_0.gguf IE4 [ROUNDS]
# int8: `llama-quantize --pure T.gguf T-q8_0.gguf Q8_0`, `clocher convert HF IE8 --dtype int8`,
#   DTYPE=int8 ... vs_llamacpp.sh T-q8_0.gguf IE8.
# bf16: the synth's GGUF as it is, `clocher convert HF IE16 --dtype bf16`,
#   DTYPE=bf16 ... vs_llamacpp.sh T.gguf IE16.
#
# Prints one line per measurement and per round, then the per-round ratios and their median.
# PEAK=1 also measures, each round, the machine's multiply-add peak with every thread at once
# (bench/bw_probe --peak: bf16 dot for bf16, int8 dot for int4/int8) and sets each engine's
# prefill FLOP/s against it (FLOPs per token: 2 x the matrices' elements from model.ie.json,
# plus the causal attention of a 512-token prompt): how far the ratio target is from the roof.
# On an AMX CPU it adds the two-thread tile peaks (bench/amx_probe, AMX-BF16 and AMX-INT8): there
# both engines' prefill runs on tiles, so the vector-dot share can pass 100% and means little.
set -euo pipefail
dtype=${DTYPE:-int4}
only=${ONLY:-} # ONLY=prefill or ONLY=decode measures that alone (a busy machine's short run)
case $only in "" | prefill | decode) ;; *) echo "vs_llamacpp.sh: ONLY must be prefill or decode" >&2; exit 2 ;; esac
case $dtype in
  int4) ggml_type=q4_0 ;;
  int8) ggml_type=q8_0 ;;
  bf16) ggml_type=bf16 ;;
  *) echo "vs_llamacpp.sh: DTYPE must be int4, int8 or bf16, not '$dtype'" >&2; exit 2 ;;
esac
gguf=${1:?usage: vs_llamacpp.sh Q4_0.gguf IEBIN_DIR [ROUNDS]}
ie=${2:?usage: vs_llamacpp.sh Q4_0.gguf IEBIN_DIR [ROUNDS]}
rounds=${3:-3}
bin=${LLAMA_BIN:?set LLAMA_BIN to the bin folder of a llama.cpp build}
build=${CLOCHER_BUILD:-$(cd "$(dirname "$0")/.." && pwd)/build/release}
eb="$build/bench/engine_bench"
threads=${THREADS:-2}
# a GGUF whose name says another type is the wrong file for this DTYPE (int4 runs unchecked,
# as before the switch existed)
gguf_name=$(basename "$gguf" | tr 'A-Z' 'a-z')
gguf_name=${gguf_name//$ggml_type/}
for t in q4_0 q8_0 bf16 f16 f32; do
  if [ "$dtype" != int4 ] && [[ $gguf_name == *"$t"* ]]; then
    echo "vs_llamacpp.sh: DTYPE=$dtype wants $ggml_type weights, but $gguf is named $t" >&2
    exit 2
  fi
done
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
  # 3 x 48 timed steps: 1 x 16 (the default) swung 27-68 tok/s between runs of one binary on a
  # quiet machine (session 12); llama-batched-bench times 32 generated tokens per stream
  "$eb" --model-dir "$ie" --threads "$threads" --mode scale --streams 1,8 --reps 3 --steps 48 \
    2>/dev/null |
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
[ "$dtype" = int4 ] || echo "# dtype $dtype ($ggml_type)"
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order="llama clocher"; else order="clocher llama"; fi
  for who in $order; do
    p=nan d1=nan d8=nan
    [ "$only" = decode ] || p=$(${who}_prefill)
    [ "$only" = prefill ] || read -r d1 d8 < <(${who}_decode)
    echo "round $r $who prefill $p decode1 $d1 decode8 $d8" | tee -a "$out/rows"
  done
  if [ "${PEAK:-0}" = 1 ]; then
    "$build/bench/bw_probe" --peak | sed -n "s/^peak threads=[0-9]*: /round $r peak /p" |
      tee -a "$out/peaks"
    # Where the CPU has AMX, both engines' prefill runs on tiles, far above the vector dot's
    # peak: the tile peak with both threads (bench/amx_probe, register-resident tiles; a
    # tdpbf16ps is 16x16x32 multiply-adds, a tdpbssd 16x16x64) is the roof that means something.
    if [ -x "$build/bench/amx_probe" ]; then
      for op in bf16 int8; do
        "$build/bench/amx_probe" "$op" 1 | python3 -c '
import json, sys
r, op = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    j = json.loads(line)
    if "gtileops_2t" in j:
        t = sum(j["gtileops_2t"]) / len(j["gtileops_2t"])
        print("round %s amx %s %.0f" % (r, op, t * (16 * 16 * 32 if op == "bf16" else 16 * 16 * 64) * 2))
' "$r" "$op" | tee -a "$out/peaks"
      done
    fi
  fi
done
if [ "${PEAK:-0}" = 1 ] && [ "$only" != decode ]; then
  python3 - "$out/rows" "$out/peaks" "$ie/model.ie.json" "$dtype" <<'PEAKS'
import json, re, statistics, sys
m = json.load(open(sys.argv[3]))
hp = m["hparams"]
mat = sum(t["shape"][0] * t["shape"][1] for t in m["tensors"]
          if len(t["shape"]) == 2 and (t["name"] != "tok_embd" or hp.get("tied_embeddings")))
n = 512  # causal: position i attends to i + 1 keys, QK and PV, 2 FLOPs each
attn = hp["n_layers"] * hp["n_heads"] * hp["head_dim"] * 2 * 2 * (n + 1) / 2
flops = 2 * mat + attn
key = "bf16 dot" if sys.argv[4] == "bf16" else "int8 dot"
peaks, amx = {}, {}
for line in open(sys.argv[2]):
    f = line.split()
    if f[2] == "amx":  # "round R amx bf16|int8 GFLOP/s"
        amx.setdefault(int(f[1]), {})[f[3]] = float(f[4])
    else:
        peaks[int(f[1])] = float(re.search(key + r" ([0-9.]+)", line).group(1))
pre = {}
for line in open(sys.argv[1]):
    f = line.split()
    pre.setdefault(int(f[1]), {})[f[2]] = float(f[4])
print("prefill FLOPs/token %.3f G; peak = %s, every thread at once, measured each round" %
      (flops / 1e9, key))
fr = {"llama": [], "clocher": []}
for r in sorted(pre):
    pk = peaks.get(r)
    if not pk:
        continue
    cells = []
    for who in ("llama", "clocher"):
        g = pre[r][who] * flops / 1e9
        fr[who].append(g / pk)
        cells.append("%s %.0f GFLOP/s = %.0f%%" % (who, g, 100 * g / pk))
    print("round %d peak %.0f: %s; 2x llama = %.0f%% of the peak" %
          (r, pk, ", ".join(cells), 200 * pre[r]["llama"] * flops / 1e9 / pk))
    for op, g in sorted(amx.get(r, {}).items()):
        print("round %d AMX %s tile peak %.0f: llama %.0f%%, clocher %.0f%%" %
              (r, op, g, 100 * pre[r]["llama"] * flops / 1e9 / g,
               100 * pre[r]["clocher"] * flops / 1e9 / g))
if fr["llama"]:
    print("median share of the peak: llama %.0f%%, clocher %.0f%%" %
          (100 * statistics.median(fr["llama"]), 100 * statistics.median(fr["clocher"])))
PEAKS
fi
python3 - "$out/rows" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    rows.setdefault(int(f[1]), {})[f[2]] = {"prefill": float(f[4]), "decode1": float(f[6]),
                                            "decode8": float(f[8])}
for what in ("prefill", "decode1", "decode8"):
    ratios = [v["clocher"][what] / v["llama"][what] for v in rows.values()]
    if any(r != r for r in ratios):  # not measured (ONLY)
        continue
    print("clocher/llama.cpp %-8s per round %s  median %.2f" % (
        what, " ".join("%.2f" % x for x in ratios), statistics.median(ratios)))
EOF
