#!/usr/bin/env bash
# Run-level interleaved A/B of two inference-engine builds (say, before and after a change):
# each repetition runs A then B back to back on the same command, so both see the same minute
# of this shared machine; prints one line per run and, at the end, per configuration the
# median of each side and the median of the per-repetition ratio B/A (docs/PERFORMANCE.md:
# only a ratio measured in one run counts).
#   bash bench/ab_ie.sh A_BUILD_DIR B_BUILD_DIR
# Env: CLOCHER_MODELS (default models/, tinyllama-1.1b-<dtype> inside), REPS (8),
# DTYPES ("int4 int8"), THREADS ("1 2"), DECODE_TOKENS (64), PREFILL_TOKENS (256).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: bench/ab_ie.sh A_BUILD_DIR B_BUILD_DIR" >&2; exit 2; }
a=$1/worker/inference-engine b=$2/worker/inference-engine
for x in "$a" "$b"; do [ -x "$x" ] || { echo "ab_ie: $x: not built" >&2; exit 2; }; done
models=${CLOCHER_MODELS:-models}
reps=${REPS:-8} dtypes=${DTYPES:-int4 int8} threads=${THREADS:-1 2}
dec=${DECODE_TOKENS:-64} pre=${PREFILL_TOKENS:-256}
prompt=$(seq -s, 1000 $((999 + pre)))
out=$(mktemp)
trap 'rm -f "$out"' EXIT
run() { # side dtype threads kind -> one line "dtype tT kind side value"
  local ie=$a; [ "$1" = B ] && ie=$b
  local d=$models/tinyllama-1.1b-$2
  if [ "$4" = decode ]; then
    "$ie" --model-dir "$d" --prompt-ids 1,2000,3000,4000,5000,6000,7000,8000 --max-new "$dec" \
      --ignore-eos --threads "$3" --quiet | sed -n "s/.*\"decode_tps\":\([0-9.]*\).*/$2 t$3 decode $1 \1/p"
  else
    "$ie" --model-dir "$d" --prompt-ids "$prompt" --max-new 0 --threads "$3" --quiet |
      sed -n "s/.*\"prefill_tps\":\([0-9.]*\).*/$2 t$3 prefill$pre $1 \1/p"
  fi
}
for r in $(seq "$reps"); do
  for dt in $dtypes; do
    for t in $threads; do
      for kind in decode prefill; do
        for side in A B; do run $side "$dt" "$t" $kind | sed "s/^/$r /" | tee -a "$out"; done
      done
    done
  done
done
echo
echo "| dtype | threads | figure | A median | B median | B/A per repetition: median (min-max) |"
echo "|---|---|---|---|---|---|"
python3 - "$out" <<'PY'
import collections, statistics, sys
v = {}
keys = []
for line in open(sys.argv[1]):
    r, dt, t, kind, side, x = line.split()
    k = (dt, t, kind)
    if k not in keys:
        keys.append(k)
    v[(r,) + k + (side,)] = float(x)
for k in keys:
    reps = sorted({key[0] for key in v if key[1:4] == k})
    A = [v[(r,) + k + ("A",)] for r in reps if (r,) + k + ("A",) in v]
    B = [v[(r,) + k + ("B",)] for r in reps if (r,) + k + ("B",) in v]
    q = [v[(r,) + k + ("B",)] / v[(r,) + k + ("A",)] for r in reps
         if (r,) + k + ("A",) in v and (r,) + k + ("B",) in v]
    print(f"| {k[0]} | {k[1][1:]} | {k[2]} tok/s | {statistics.median(A):.1f} | "
          f"{statistics.median(B):.1f} | {statistics.median(q):.3f} ({min(q):.2f}-{max(q):.2f}) |")
PY
