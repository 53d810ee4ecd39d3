#!/bin/sh
# bench/batch_invariant.sh — the cost of batch-invariant requests (docs/PERFORMANCE.md "Batch
# invariance"): inference-engine through the serving engine, 1 stream (decode) and 8 streams
# (aggregate), default products (A) against --batch-invariant (B), interleaved A B A B ... in
# one run so that load drifts hit both alike. Prints one line per run: model, mode, streams,
# then the JSON line of inference-engine (tps, prefill_tps, decode_tps).
#
# usage: [REPS=2] [THREADS=2] [MAX_NEW=32] [MODELS="tinyllama-1.1b-bf16 ..."] \
#        [CLOCHER_MODELS=/work/models] [IE=build/release/worker/inference-engine] \
#        sh bench/batch_invariant.sh
set -eu
REPS=${REPS:-2}
THREADS=${THREADS:-2}
MAX_NEW=${MAX_NEW:-32}
CLOCHER_MODELS=${CLOCHER_MODELS:-/work/models}
MODELS=${MODELS:-"tinyllama-1.1b-f32 tinyllama-1.1b-bf16 tinyllama-1.1b-int8 tinyllama-1.1b-int4"}
IE=${IE:-build/release/worker/inference-engine}
PROMPT="Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker who"
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo ?) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) load: $(cut -d' ' -f1-3 /proc/loadavg)"
for m in $MODELS; do
    for r in $(seq "$REPS"); do
        for streams in 1 8; do
            for mode in default invariant; do
                flag=""
                [ "$mode" = invariant ] && flag="--batch-invariant"
                out=$("$IE" --model-dir "$CLOCHER_MODELS/$m" --prompt "$PROMPT" --max-new "$MAX_NEW" \
                      --ignore-eos --greedy --threads "$THREADS" --concurrency "$streams" --quiet $flag \
                      2>/dev/null | tail -1)
                echo "$m $mode $streams rep$r $out"
            done
        done
    done
done
