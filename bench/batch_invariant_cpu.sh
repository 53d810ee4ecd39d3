#!/bin/sh
# bench/batch_invariant_cpu.sh — the cost of batch-invariant requests in CPU seconds rather than
# wall time (robust to a machine shared with other jobs: time slices others take are not
# counted; shared caches still are). One thread (no pool spinning in the count), 8 streams of
# the same prompt through the serving engine; MAX_NEW=1 is the prefill (+ one step), MAX_NEW=9
# adds 8 decode steps of 8 tokens. Default (A) and --batch-invariant (B) interleaved.
# Prints: model mode max_new user_s sys_s.
#
# usage: [REPS=1] [MODELS="tinyllama-1.1b-bf16 tinyllama-1.1b-f32"] [CLOCHER_MODELS=/work/models]
#        [IE=build/release/worker/inference-engine] sh bench/batch_invariant_cpu.sh
set -eu
REPS=${REPS:-1}
CLOCHER_MODELS=${CLOCHER_MODELS:-/work/models}
MODELS=${MODELS:-"tinyllama-1.1b-bf16 tinyllama-1.1b-f32"}
IE=${IE:-build/release/worker/inference-engine}
PROMPT="Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker who"
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo ?) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) load: $(cut -d' ' -f1-3 /proc/loadavg)"
for m in $MODELS; do
    for r in $(seq "$REPS"); do
        for n in 1 9; do
            for mode in default invariant; do
                flag=""
                [ "$mode" = invariant ] && flag="--batch-invariant"
                tf=$(mktemp)
                /usr/bin/time -o "$tf" -f "%U %S" "$IE" --model-dir "$CLOCHER_MODELS/$m" \
                    --prompt "$PROMPT" --max-new "$n" --ignore-eos --greedy --threads 1 \
                    --concurrency 8 --quiet $flag >/dev/null 2>&1
                echo "$m $mode $n $(tail -1 "$tf")"
                rm -f "$tf"
            done
        done
    done
done
