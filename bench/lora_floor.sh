#!/usr/bin/env bash
# LoRA at its byte floor (issue 16; docs/PERFORMANCE.md "LoRA at its byte floor"): for an
# 8-stream decode batch with 4 distinct adapters (2 streams each), the time over base-only
# steps measured interleaved in the same engine_bench run, beside
#     floor = adapter bytes read per step / base bytes read per step,
# computed from the files:
#   base bytes    = the sizes in model.ie.json of every tensor but tok_embd (a decode step
#                   reads each weight once; tok_embd only the batch's 8 rows). The KV cache
#                   (8-token prompts, a few steps) and activations are left out: < 0.1%.
#   adapter bytes = for each of the 4 adapters, what the update reads of its serving copy:
#                   every lora_A / lora_B element of adapter_model.safetensors (shapes from its
#                   header) times the packed element size: 2 bytes (bf16), or 1 byte plus the
#                   per-rank-row f32 scales, rank padded to a multiple of 4 in B (int8,
#                   --lora-weights int8; docs/LORA.md). Every adapter is read once per step per
#                   projection (the engine makes each adapter's rows one segment).
# The overhead is measured in pairs of steps of one batch (engine_bench --mode lora, session
# 16): the same 8 requests step once base-only (their adapters bypassed) and once adapted,
# the order alternating pair by pair, REPS runs of STEPS pairs per set; overhead = median over
# every pair of (adapted step / base step) - 1, in process CPU time, with the median's 95 %
# confidence interval (engine_bench's median_ci: the resolution of that one run; session 19),
# beside its spread (the pairs' p25-p75 and the range of the REPS runs' own medians) and the
# wall-time figure, kept
# apart. Until session 15 base and adapted were separate runs seconds apart and rows moved by
# several points between runs. The machine is shared, so only ratios within one run mean
# anything.
#
# Env (defaults keep the run short: the machine is shared; the full table is
#   DTYPES="int4 int8" TARGETS="qv qkvo all" RANKS="8 16 32" WEIGHTS="bf16 int8" REPS=9):
#   BUILD_DIR (build/release), MODELS (/work/models), BASE_DIR (printf pattern of a base's
#   directory from its dtype; default $MODELS/tinyllama-1.1b-%s), SCRATCH (/work/scratch/lora: adapters
#   that are not in MODELS are synthesized there), DTYPES (int4), TARGETS (qv), RANKS (8),
#   WEIGHTS (bf16: the serving copy, --lora-weights), REPS (3: runs per set), STEPS (8:
#   pairs of steps per run; REPS x STEPS pairs in all, >= 5 per run asked), THREADS (2),
#   RANK1 (0: 1 adds a rank-1 all-projection set, the update's fixed cost).
# Prints markdown: one table per base dtype.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build/release}
models=${MODELS:-/work/models}
base_pat=${BASE_DIR:-$models/tinyllama-1.1b-%s}
scratch=${SCRATCH:-/work/scratch/lora}
dtypes=${DTYPES:-int4}
targets=${TARGETS:-qv}
ranks=${RANKS:-8}
weights=${WEIGHTS:-bf16}
reps=${REPS:-3}
steps=${STEPS:-8}
threads=${THREADS:-2}
rank1=${RANK1:-0}
[ -x "$build/bench/engine_bench" ] && [ -x "$build/client/clocher" ] ||
  cmake --build "$build" -j2 --target clocher engine_bench >/dev/null
clocher=$build/client/clocher eb=$build/bench/engine_bench
mkdir -p "$scratch"

tgt_list() { # short name -> synth-adapter --targets
  case $1 in
    qv) echo q,v ;; qkvo) echo q,k,v,o ;; all) echo all ;;
    *) echo "lora_floor.sh: unknown target set '$1' (qv, qkvo, all)" >&2; exit 2 ;;
  esac
}

# The adapter directory for (target set, rank, seed): /work/models has all-projection bf16
# adapters of rank 1, 16 and 32; the rest are synthesized (deterministic) into SCRATCH.
adapter_dir() {
  local tg=$1 r=$2 s=$3 base=$4 d
  d=$models/lora-bf16-r$r-s$s
  if [ "$tg" = all ] && [ -f "$d/adapter_config.json" ]; then echo "$d"; return; fi
  d=$scratch/lora-bf16-$tg-r$r-s$s
  [ -f "$d/adapter_config.json" ] ||
    "$clocher" synth-adapter "$base" "$d" --rank "$r" --targets "$(tgt_list "$tg")" \
      --seed "$s" --dtype bf16 >/dev/null
  echo "$d"
}

# Elements of every tensor in a safetensors file, one "name rows cols" a line.
st_shapes() {
  local f=$1 n
  n=$(od -An -t u8 -N8 "$f" | tr -d ' ')
  head -c "$((n + 8))" "$f" | tail -c +9 |
    jq -r 'to_entries[] | select(.key != "__metadata__") | "\(.key) \(.value.shape[0]) \(.value.shape[1])"'
}

# Bytes the update reads of one adapter's serving copy in packing $2 (bf16 | int8). Rank 1
# asked for int8 is served in bf16 (worker/model/lora.h LORA_I8_MIN_RANK, session 18).
adapter_bytes() {
  st_shapes "$1/adapter_model.safetensors" | awk -v w="$2" '
    { rows = $2; cols = $3; a = ($1 ~ /lora_A/); r = a ? rows : cols # A [r][in], B [out][r]
      p = w == "int8" && r < 2 ? "bf16" : w }
    p == "bf16" { b += 2 * rows * cols }
    # int8: A [r][in] codes + r f32 scales; B^T [ceil(out/32)*32][ceil(r/4)*4] codes + r scales
    p == "int8" && a { b += rows * cols + 4 * rows }
    p == "int8" && !a { b += int((rows + 31) / 32) * 32 * int((cols + 3) / 4) * 4 + 4 * cols }
    END { printf "%d\n", b }'
}

base_bytes() {
  jq '[.tensors[] | select(.name != "tok_embd") | .size] | add' "$1/model.ie.json"
}

echo "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs (shared with other jobs: ratios within one run only), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "Commit $(git rev-parse --short HEAD), $threads threads, 8 streams, 4 distinct adapters; per set $reps runs of $steps pairs of steps (base-only, adapted; order alternating)"
echo
for dt in $dtypes; do
  # shellcheck disable=SC2059
  base=$(printf "$base_pat" "$dt")
  bb=$(base_bytes "$base")
  echo "### $dt base ($bb bytes read per step)"
  echo
  echo "| targets | rank | adapter weights | floor | overhead (CPU, median of pairs; its 95 % CI) | pairs p25–p75 | runs' medians | overhead (wall) | ≤ 1.15 × floor + 1 pt |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for w in $weights; do
    for tg in $targets; do
      args=()
      sets=()
      declare -A floor=()
      rs=$ranks
      [ "$rank1" = 1 ] && [ "$tg" = all ] && rs="1 $rs"
      for r in $rs; do
        names=() ab=0
        for s in 1 2 3 4; do
          d=$(adapter_dir "$tg" "$r" "$s" "$base")
          args+=(--adapter "$tg-r$r-$s=$d")
          names+=("$tg-r$r-$s")
          ab=$((ab + $(adapter_bytes "$d" "$w")))
        done
        sets+=(--set "$tg-r$r=$(IFS=,; echo "${names[*]}")")
        floor[$tg-r$r]=$(awk -v a="$ab" -v b="$bb" 'BEGIN { printf "%.2f", 100 * a / b }')
      done
      "$eb" --model-dir "$base" --threads "$threads" --mode lora --streams 8 --reps "$reps" \
          --steps "$steps" --lora-weights "$w" "${args[@]}" "${sets[@]}" 2>/dev/null |
        jq -r '"\(.set) \((.slowdown_cpu-1)*100) \((.slowdown_cpu_ci_lo-1)*100) \((.slowdown_cpu_ci_hi-1)*100) \((.slowdown_cpu_p25-1)*100) \((.slowdown_cpu_p75-1)*100) \((.slowdown_wall-1)*100) \((.slowdown_cpu_rep_min-1)*100) \((.slowdown_cpu_rep_max-1)*100)"' |
        while read -r set o clo chi p25 p75 ow rlo rhi; do
          f=${floor[$set]}
          awk -v set="$set" -v w="$w" -v f="$f" -v o="$o" -v clo="$clo" -v chi="$chi" -v p25="$p25" -v p75="$p75" -v ow="$ow" -v rlo="$rlo" -v rhi="$rhi" 'BEGIN {
            split(set, s, "-r"); ok = o <= 1.15 * f + 1 ? "yes" : "no"
            printf "| %s | %s | %s | %.2f%% | %+.1f%% (%+.1f – %+.1f) | %+.1f%% – %+.1f%% | %+.1f%% – %+.1f%% | %+.1f%% | %s (%.1f%%) |\n",
                   s[1], s[2], w, f, o, clo, chi, p25, p75, rlo, rhi, ow, ok, 1.15 * f + 1 }'
        done
      unset floor
    done
  done
  echo
done
