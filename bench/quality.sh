#!/usr/bin/env bash
# Quality of each weight dtype vs f32: KL divergence and top-1 agreement of the next-token
# distributions, teacher-forced over >= 4k positions, measured by `clocher convert`'s
# calibration run (client/offline/calib.c; docs/CONVERT.md "Calibration gate"). Prints markdown.
#  - stories260K (trained): the input is the model's own greedy text (f32), 9 stories of up to
#    512 tokens from different first tokens, concatenated (~4.6k positions);
#  - synthetic TinyLlama-1.1B (random weights, nearly flat logits): TINY_POSITIONS ids
#    (default 4096) of random tokens; skipped with TINY_POSITIONS=0 (scalar-path rows only
#    with TINY_REF=1: slow).
# "kernels": auto = the dispatched SIMD path (int8/int4 quantize activations to Q8_0 blocks,
# as llama.cpp does), ref = the scalar path (f32 activations: the weights' own error).
# dtypes: int8 = q8_0, int4 = q4_0 and the int4 group types (docs/IEBIN.md): q4_g64/q4_g128
# (scale only), q4z_g32/q4z_g64/q4z_g128 (scale + offset per group). stories260K's rows are 64
# wide, so it has no g128 rows (every matrix would stay f32); TinyLlama has them. The GGUF
# k-quants q4_k/q5_k/q6_k (super-blocks of 256; convert's k-quant search, kern.h) need rows of
# 256: TinyLlama only.
# Row selection: S260_DTYPES, S260_REF_DTYPES, TINY_DTYPES (space-separated lists; empty: none;
# DTYPE+search converts with --rounding search; DTYPE@E gives the token embedding and the
# classifier dtype E (--embd-dtype E), e.g. int8@f16; q4_k_m is llama.cpp's Q4_K_M mix as a
# quant manifest: q4_k, q6_k for output and for attn_v/ffn_down of the layers llama.cpp's
# use_more_bits picks — the same rule and quantizer as `clocher synth --ftype q4_k_m`).
# Usage: bash bench/quality.sh   (BUILD_DIR, CLOCHER_MODELS, CLOCHER_FIXTURES, THREADS;
# SKIP_BUILD=1 uses BUILD_DIR as it is)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build/release}
models=${CLOCHER_MODELS:-models}
fixtures=${CLOCHER_FIXTURES:-../shared/fixtures}
threads=${THREADS:-$(nproc)}
tiny_positions=${TINY_POSITIONS:-4096}
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j"$(nproc)" --target clocher inference-engine >/dev/null
fi
clocher=$build/client/clocher ie=$build/worker/inference-engine
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$models"

# q4km_manifest SRC FILE: llama.cpp's Q4_K_M rule (llama-quant.cpp, LLAMA_FTYPE_MOSTLY_Q4_K_M)
# for SRC's layer count as a quant manifest
q4km_manifest() {
  /usr/bin/python3 - "$1/config.json" "$2" <<'PY'
import json, sys
n = json.load(open(sys.argv[1]))["num_hidden_layers"]
more = [i for i in range(n) if i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2]
rules = [{"pattern": "^output$", "dtype": "q6_k"},
         {"pattern": "^blk\\.(%s)\\.(attn_v|ffn_down)$" % "|".join(map(str, more)), "dtype": "q6_k"},
         {"pattern": ".", "dtype": "q4_k"}]
json.dump({"version": 1, "rules": rules}, open(sys.argv[2], "w"))
PY
}

row() { # NAME SRC DTYPE[@EMBD][+search] IDS [ISA]: ISA=ref keeps activations f32 (weight-only error)
  local dt=${3%+search} rounding=nearest embd=()
  [ "$dt" = "$3" ] || rounding=search # DTYPE+search: convert --rounding search
  if [ "${dt#*@}" != "$dt" ]; then embd=(--embd-dtype "${dt#*@}"); dt=${dt%@*}; fi
  if [ "$dt" = q4_k_m ]; then q4km_manifest "$2" "$tmp/q4km.json"; embd=(--quant-manifest "$tmp/q4km.json"); dt=q4_k; fi
  env ${5:+CLOCHER_ISA=$5} "$clocher" convert "$2" "$tmp/q" --dtype "$dt" "${embd[@]}" --rounding "$rounding" \
    --calib-ids "$4" --calib-threads "$threads" \
    --calib-report "$tmp/rep.json" 2>/dev/null
  /usr/bin/python3 - "$1" "$3" "$tmp/rep.json" "${5:-auto}" <<'PY'
import json, sys
r = json.load(open(sys.argv[3]))
print(f"| {sys.argv[1]} | {sys.argv[2]} | {sys.argv[4]} | {r['positions']} | {r['kld_mean']:.6f} | {r['kld_max']:.4f} | {100*r['top1']:.2f}% | {r['cosine_min']:.6f} |")
PY
  rm -rf "$tmp/q"
}

echo "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, commit $(git rev-parse --short HEAD)"
echo
echo "| model | dtype | kernels | positions | KLD mean (nats) | KLD max | top-1 agreement | lowest tensor cosine |"
echo "|---|---|---|---|---|---|---|---|"

s260=$fixtures/stories260K/stories260K.bin
"$clocher" convert "$s260" "$tmp/s260-f32" --dtype f32 2>/dev/null
: >"$tmp/s260.ids"
for first in 1 100 200 300 350 400 420 450 500; do
  "$ie" --model-dir "$tmp/s260-f32" --prompt-ids "1,$first" --max-new 510 --greedy --ignore-eos \
    --print-ids --quiet --threads 1 |
    /usr/bin/python3 -c 'import json,sys; j=json.loads(sys.stdin.readline()); print(" ".join(map(str, [1, int(sys.argv[1])] + j["generated_ids"])))' "$first" >>"$tmp/s260.ids"
done
s260_default="bf16 f16 int8 int8@f16 int4 int4@int8 q4_g64 q4z_g32 q4z_g64"
s260_default+=" int4+search q4_g64+search q4z_g32+search q4z_g64+search"
for dt in ${S260_DTYPES-$s260_default}; do
  row stories260K "$s260" "$dt" "$tmp/s260.ids"
done
for dt in ${S260_REF_DTYPES-int8 int8@f16 int4 q4_g64 q4z_g32 q4z_g64}; do
  row stories260K "$s260" "$dt" "$tmp/s260.ids" ref
done

if [ "$tiny_positions" -gt 0 ]; then
  hf=$models/tinyllama-1.1b-hf
  [ -f "$hf/config.json" ] || "$clocher" synth --preset tinyllama-1.1b --seed 1 "$hf" >/dev/null
  awk -v n="$tiny_positions" 'BEGIN{srand(7); printf "1"; for(i=1;i<n;i++) printf " %d", 3+int(rand()*31990); print ""}' >"$tmp/tiny.ids"
  for dt in ${TINY_DTYPES-bf16 int8 int4 q4_g64 q4_g128 q4z_g32 q4z_g64 q4z_g128 q4_k q5_k q6_k}; do
    row "TinyLlama-1.1B (synthetic)" "$hf" "$dt" "$tmp/tiny.ids"
  done
  # the scalar path on a 1.1B model takes tens of minutes per row: only on request
  if [ "${TINY_REF:-0}" = 1 ]; then
    for dt in int8 int4 q4_k; do row "TinyLlama-1.1B (synthetic)" "$hf" "$dt" "$tmp/tiny.ids" ref; done
  fi
fi
