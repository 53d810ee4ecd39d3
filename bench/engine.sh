#!/usr/bin/env bash
# Serving-engine benchmark as recorded in docs/PERFORMANCE.md "## Serving engine": synthetic
# TinyLlama-1.1B in int4 and int8, THREADS (default 2) compute threads, bench/engine_bench:
#   - aggregate decode tok/s at 1, 2, 4, 8, 16 concurrent streams;
#   - the 8-stream batch base-only vs 4 different adapters of rank 16 and of rank 32 on all
#     seven projections (bf16 adapter files, and f32 ones), interleaved, median ratio;
#   - 4 x 1024-token prompts submitted at once: time to every first token.
# Ratios are of process CPU time (the machine is shared; see engine_bench.c). Prints markdown.
# The LoRA table is printed twice: as served (base-only steps on pool_matmul), and with
# CLOCHER_FWD_ONE_JOB=1 (base-only steps in the same one-job-per-group structure as adapted
# steps: the update's own cost; docs/LORA.md). ONE_JOB=0 skips the second.
# Env: BUILD_DIR, CLOCHER_MODELS (default models/), THREADS, REPS, LORA_REPS, LORA_STEPS,
# PREFILL_REPS, DTYPES, ONE_JOB.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build/release}
models=${CLOCHER_MODELS:-models}
threads=${THREADS:-2}
reps=${REPS:-5}
prefill_reps=${PREFILL_REPS:-3}
lora_reps=${LORA_REPS:-15}   # many short interleaved runs: the shared machine drifts
lora_steps=${LORA_STEPS:-8}
one_job=${ONE_JOB:-1}
dtypes=${DTYPES:-int4 int8}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j2 --target clocher engine_bench >/dev/null
clocher=$build/client/clocher eb=$build/bench/engine_bench
hf=$models/tinyllama-1.1b-hf
mkdir -p "$models"
[ -f "$hf/config.json" ] || "$clocher" synth --preset tinyllama-1.1b --seed 1 "$hf" >/dev/null
for dt in $dtypes; do
  d=$models/tinyllama-1.1b-$dt
  [ -f "$d/model.ie.json" ] || "$clocher" convert "$hf" "$d" --dtype "$dt" >/dev/null 2>&1
done
first=$models/tinyllama-1.1b-${dtypes%% *}
adapters=()
for fmt in bf16 f32; do
  ranks="16 32"
  [ "$fmt" = f32 ] || ranks="1 16 32" # rank 1: the update's fixed cost (scheduling, passes)
  for r in $ranks; do
    for s in 1 2 3 4; do
      a=$models/lora-$fmt-r$r-s$s
      [ -f "$a/adapter_config.json" ] ||
        "$clocher" synth-adapter "$first" "$a" --rank "$r" --targets all --seed "$s" \
          --dtype "$fmt" >/dev/null
      adapters+=(--adapter "$fmt-r$r-$s=$a")
    done
  done
done
sets=(--set "bf16-r1=bf16-r1-1,bf16-r1-2,bf16-r1-3,bf16-r1-4")
for fmt in bf16 f32; do
  for r in 16 32; do
    sets+=(--set "$fmt-r$r=$fmt-r$r-1,$fmt-r$r-2,$fmt-r$r-3,$fmt-r$r-4")
  done
done

echo "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, commit $(git rev-parse --short HEAD), $threads threads"
echo
for dt in $dtypes; do
  d=$models/tinyllama-1.1b-$dt
  echo "### $dt"
  echo
  echo "Decode, aggregate over the streams (median of $reps interleaved repetitions, 16 steps each):"
  echo
  echo "| streams | tok/s (wall) | tok/s (CPU) | × 1 stream (CPU) | × 1 stream (wall) | neighbour load |"
  echo "|---|---|---|---|---|---|"
  "$eb" --model-dir "$d" --threads "$threads" --mode scale --streams 1,2,4,8,16 --reps "$reps" \
      2>/dev/null |
    jq -r '"| \(.streams) | \(.wall_tps*10|round/10) | \(.cpu_tps*10|round/10) | \(.ratio_cpu*100|round/100) | \(.ratio_wall*100|round/100) | \(.neighbour_load*100|round)% |"'
  echo
  variants=(0)
  [ "$one_job" = 1 ] && variants+=(1)
  for oj in "${variants[@]}"; do
  echo "LoRA, 8 streams, 4 different adapters (2 streams each) on q,k,v,o,gate,up,down vs base-only (median of $lora_reps interleaved repetitions of $lora_steps steps, of the per-repetition ratio; p25–p75 of that ratio)$([ "$oj" = 1 ] && echo ", CLOCHER_FWD_ONE_JOB=1"):"
  echo
  echo "| adapters | tok/s (CPU) | tok/s (wall) | slower than base (CPU) | p25–p75 (CPU) | slower (wall) | median step CPU ms | slower by median step (CPU) |"
  echo "|---|---|---|---|---|---|---|---|"
  CLOCHER_FWD_ONE_JOB=$oj "$eb" --model-dir "$d" --threads "$threads" --mode lora --streams 8 \
      --reps "$lora_reps" --steps "$lora_steps" "${adapters[@]}" "${sets[@]}" 2>/dev/null |
    jq -r '"| \(.set) | \(.cpu_tps*10|round/10) | \(.wall_tps*10|round/10) | \((.slowdown_cpu-1)*1000|round/10)% | \((.slowdown_cpu_p25-1)*1000|round/10)% – \((.slowdown_cpu_p75-1)*1000|round/10)% | \((.slowdown_wall-1)*1000|round/10)% | \(.step_cpu_ms*10|round/10) | \((.slowdown_cpu_steps-1)*1000|round/10)% |"'
  echo
  done
  echo "Prefill, 4 prompts x 1024 tokens submitted at once (max_step_tokens 512, median of $prefill_reps), from 4 tenants (the budget shared) and from one (arrival order):"
  echo
  echo "| tenants | wall s (all 4) | CPU s | tok/s (wall) | tok/s (CPU) | ttft p50 ms | ttft last ms |"
  echo "|---|---|---|---|---|---|---|"
  for one in "" --one-tenant; do
    "$eb" --model-dir "$d" --threads "$threads" --mode prefill --prefill 4 --prefill-len 1024 \
        --reps "$prefill_reps" $one 2>/dev/null |
      jq -r '"| \(if .one_tenant then 1 else 4 end) | \(.wall_s*100|round/100) | \(.cpu_s*100|round/100) | \(.wall_tps*10|round/10) | \(.cpu_tps*10|round/10) | \(.ttft_p50_ms|round) | \(.ttft_max_ms|round) |"'
  done
  echo
done
