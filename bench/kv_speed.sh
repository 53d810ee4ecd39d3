#!/usr/bin/env bash
# Decode speed after long prompts per KV cache dtype (docs/PERFORMANCE.md, "KV cache dtypes";
# issue 16's target: 8-bit decode at 8k >= 1.5x the f32 figure on int4 weights).
# Synthetic TinyLlama-1.1B, int4 (q4_0) weights, its context raised to 16384 positions (a
# copy of the synth config with max_position_embeddings 16384: the synth default is 2048),
# one request through the serving engine (inference-engine --concurrency 1 --kv-dtype X), a
# random PROMPTS-token prompt (4096 and 8192), NEW (default 64) generated tokens, ROUNDS
# (default 3) rounds, each a fresh process (a full prefill every time); the figure is the
# median over rounds of the per-token decode time (p50_ms: tpot). Dtypes run interleaved per
# round so the shared machine's drift hits all alike.
# Exact commands (printed too):
#   inference-engine --model-dir M --prompt-ids IDS --kv-dtype DT --max-new NEW --greedy
#     --ignore-eos --quiet --threads THREADS --concurrency 1 --rounds 1
# Usage: bash bench/kv_speed.sh   (BUILD_DIR, CLOCHER_MODELS, THREADS (2), PROMPTS
#        ("4096 8192"), KV_DTYPES ("f32 bf16 int8 fp8"), NEW (64), ROUNDS (3), IE_B)
# IE_B: a second inference-engine binary (e.g. main's) run interleaved with this build's,
# rounds alternating A, B / B, A; the table then has one row per (prompt, dtype, binary) and
# the ratio B/A of the decode times.
# Each run prints its figures to stderr as it ends, so a run stopped early (the 8k prefills
# take minutes each: 24 runs at the defaults) still shows what it measured; a failed
# inference-engine run stops the script with its exit code and the end of its stderr (in
# session 11 the script stopped after the conversion with neither table nor message).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build/release}
models=${CLOCHER_MODELS:-models}
threads=${THREADS:-2}
prompts=${PROMPTS:-4096 8192}
kv_dtypes=${KV_DTYPES:-f32 bf16 int8 fp8}
new=${NEW:-64}
rounds=${ROUNDS:-3}
# configure only a new build directory (an existing one keeps its build type)
[ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j2 --target clocher inference-engine >/dev/null
clocher=$build/client/clocher ie=$build/worker/inference-engine
hf=$models/tinyllama-1.1b-hf
mkdir -p "$models"
[ -f "$hf/config.json" ] || "$clocher" synth --preset tinyllama-1.1b --seed 1 "$hf" >/dev/null
long=$models/tinyllama-1.1b-int4-ctx16k
if [ ! -f "$long/model.ie.json" ]; then
  src=$(mktemp -d)
  for f in "$hf"/*; do ln -s "$(realpath "$f")" "$src/$(basename "$f")"; done
  rm "$src/config.json"
  /usr/bin/python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["max_position_embeddings"]=16384; json.dump(c, open(sys.argv[2],"w"))' \
    "$hf/config.json" "$src/config.json"
  "$clocher" convert "$src" "$long" --dtype int4 >/dev/null 2>&1
  rm -rf "$src"
fi
ie_b=${IE_B:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, $threads threads, commit $(git rev-parse --short HEAD)"
echo
for n in $prompts; do
  awk -v n="$n" 'BEGIN{srand(11); printf "1"; for(i=1;i<n;i++) printf ",%d", 3+int(rand()*31990); print ""}' >"$tmp/p$n.ids"
done
echo "command: $ie --model-dir $long --prompt-ids <N random ids> --kv-dtype DT --max-new $new --greedy --ignore-eos --quiet --threads $threads --concurrency 1 --rounds 1" >&2
# one run: binary label (A or B), prompt tokens, dtype -> a line "n dt label tpot ttft" in raw
run_one() {
  local bin=$1 label=$2 n=$3 dt=$4
  if ! "$bin" --model-dir "$long" --prompt-ids "$(cat "$tmp/p$n.ids")" --kv-dtype "$dt" \
      --max-new "$new" --greedy --ignore-eos --quiet --threads "$threads" --concurrency 1 \
      --rounds 1 >"$tmp/out" 2>"$tmp/err"; then
    echo "kv_speed: $bin ($label, $n tokens, $dt) failed:" >&2
    tail -5 "$tmp/err" >&2
    exit 1
  fi
  /usr/bin/python3 -c 'import json,sys; j=json.loads(open(sys.argv[1]).readline()); print(sys.argv[2], sys.argv[3], sys.argv[4], j["p50_ms"], j["ttft_p50_ms"])' \
    "$tmp/out" "$n" "$dt" "$label" | tee -a "$tmp/raw" >&2
}
for r in $(seq "$rounds"); do
  for n in $prompts; do
    for dt in $kv_dtypes; do
      if [ -z "$ie_b" ]; then
        run_one "$ie" A "$n" "$dt"
      elif [ $((r % 2)) -eq 1 ]; then
        run_one "$ie" A "$n" "$dt"; run_one "$ie_b" B "$n" "$dt"
      else
        run_one "$ie_b" B "$n" "$dt"; run_one "$ie" A "$n" "$dt"
      fi
    done
  done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "A = $ie${ie_b:+, B = $ie_b}"
echo
echo "| prompt tokens | KV dtype | binary | decode ms/token (median of $rounds) | decode tok/s | vs f32 | B/A | time to first token (s) |"
echo "|---|---|---|---|---|---|---|---|"
/usr/bin/python3 - "$tmp/raw" <<'PY'
import sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    n, dt, lab, tpot, ttft = line.split()
    rows.setdefault((int(n), dt, lab), []).append((float(tpot), float(ttft)))
med = {k: st.median(t for t, _ in v) for k, v in rows.items()}
for (n, dt, lab) in sorted(rows):
    v = rows[(n, dt, lab)]
    tp = med[(n, dt, lab)]
    base = med.get((n, "f32", lab), float("nan"))
    other = med.get((n, dt, "A"), float("nan"))
    ba = f"{tp / other:.2f}" if lab == "B" else "-"
    print(f"| {n} | {dt} | {lab} | {tp:.1f} | {1e3 / tp:.2f} | {base / tp:.2f}x | {ba} | {st.median(f for _, f in v) / 1e3:.1f} |")
PY
