#!/usr/bin/env bash
# The gateway's cost, as recorded in docs/PERFORMANCE.md "## Daemon and gateway":
#   1. `clocher bench` against clocherd (one worker, THREADS threads) vs `inference-engine
#      --concurrency` in-process, same model, prompt, greedy decoding, same number of
#      concurrent requests starting together (one wave, after a warm-up wave on both sides:
#      a warm engine, a started client): generated tokens/s and
#      TTFT p50, interleaved repetitions, medians, and their ratios; the worker's own TTFT
#      (from each stream's last message) beside the client's, so the difference is what gRPC,
#      the gateway and the rings add; clocherd's CPU time over the worker's. Models: synthetic TinyLlama-1.1B int4 (a real workload) and the demo
#      model (5M parameters: tokens every ~0.3 ms, the gateway's worst case);
#      A single stream repeats ROUNDS1 sequential requests per repetition on both sides (its
#      TTFT p50 is then over REPS x ROUNDS1 requests: one request's TTFT on this shared VM
#      varies by milliseconds); several streams run one wave per repetition.
#   2. one worker with 2 threads vs two workers with one core each (--workers 2), 8 streams.
# Prints markdown. Env: BUILD_DIR, CLOCHER_MODELS (default models/), THREADS (2), REPS (5),
# ROUNDS1 (10), MAX_NEW (32), CONC ("1 8").
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build/release}
models=${CLOCHER_MODELS:-$(pwd)/models}
threads=${THREADS:-2}
reps=${REPS:-5}
rounds1=${ROUNDS1:-10}
max_new=${MAX_NEW:-32}
concs=${CONC:-1 8}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j2 --target clocher clocherd clocher-worker inference-engine >/dev/null
clocher=$build/client/clocher ie=$build/worker/inference-engine clocherd=$build/daemon/clocherd
mkdir -p "$models"
hf=$models/tinyllama-1.1b-hf
[ -f "$hf/config.json" ] || "$clocher" synth --preset tinyllama-1.1b --seed 1 "$hf" >/dev/null
[ -f "$models/tinyllama-1.1b-int4/model.ie.json" ] ||
  "$clocher" convert "$hf" "$models/tinyllama-1.1b-int4" --dtype int4 >/dev/null 2>&1
[ -f "$models/demo-hf/config.json" ] || "$clocher" synth --preset demo --seed 1 "$models/demo-hf" >/dev/null
[ -f "$models/demo/model.ie.json" ] || "$clocher" convert "$models/demo-hf" "$models/demo" >/dev/null 2>&1

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/clocher-gwbench.XXXXXX")
daemon_pid=
stop_daemon() {
  if [ -n "$daemon_pid" ]; then
    kill -TERM "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
    daemon_pid=
  fi
}
trap 'stop_daemon; rm -rf "$run_dir"' EXIT
start_daemon() { # MODEL WORKERS THREADS_PER_WORKER
  cat >"$run_dir/c.json" <<EOF
{"listen": {"tcp": null, "unix": "$run_dir/s.sock"}, "metrics": {"listen": null},
 "model_dir": "$1", "workers": $2, "threads_per_worker": $3,
 "supervisor": {"ready_timeout_s": 600, "heartbeat_timeout_s": 600}}
EOF
  "$clocherd" --config "$run_dir/c.json" 2>"$run_dir/d.log" &
  daemon_pid=$!
  "$clocher" health --addr "unix:$run_dir/s.sock" --wait 300 --quiet
}
prompt=1,450,1000,2000,3000,4000,100,200
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
field() { python3 -c "import json,sys; j=json.loads(sys.stdin.read().strip().splitlines()[-1]); print($1)"; }
lines() { python3 -c "import json,sys; [print($1) for j in map(json.loads, sys.stdin.read().split())]"; }

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; threads $threads; $reps interleaved repetitions; $max_new greedy tokens per request"
echo
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
echo "| model | streams | in-process tok/s | via clocherd tok/s | ratio | in-process TTFT p50 ms | via clocherd TTFT p50 ms | worker's own TTFT p50 ms | gRPC+gateway+rings ms | clocherd CPU / worker CPU |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for m in tinyllama-1.1b-int4 demo; do
  dir=$models/$m
  start_daemon "$dir" 1 "$threads"
  for c in $concs; do
    : >"$run_dir/ie_tps"; : >"$run_dir/ie_ttft"; : >"$run_dir/gw_tps"; : >"$run_dir/gw_ttft"
    : >"$run_dir/sv_ttft"; dcpu=0; wcpu=0
    wpid=$(pgrep -P "$daemon_pid" clocher-worker | head -1)
    r=1
    [ "$c" -eq 1 ] && r=$rounds1
    for _ in $(seq "$reps"); do
      # both sides warm: the engine after a warm-up round, the client after its start-up (a
      # gRPC client's start costs CPU that a 2-core machine takes from the worker); one wave
      # of c requests starting together on both sides (the same batching schedule)
      out=$("$ie" --model-dir "$dir" --prompt-ids "$prompt" --greedy --max-new "$max_new" \
        --concurrency "$c" --threads "$threads" --warmup 1 --rounds "$r" --quiet)
      echo "$out" | lines 'j["tps"]' | median >>"$run_dir/ie_tps"
      echo "$out" | lines 'j["ttft_p50_ms"]' | median >>"$run_dir/ie_ttft"
      d0=$(cpu_ticks "$daemon_pid") w0=$(cpu_ticks "$wpid")
      out=$("$clocher" bench --addr "unix:$run_dir/s.sock" -c "$c" --warmup "$c" -n $((c * r)) --json \
        --prompt-ids "$prompt" --max-tokens "$max_new" --temperature 0)
      dcpu=$((dcpu + $(cpu_ticks "$daemon_pid") - d0)) wcpu=$((wcpu + $(cpu_ticks "$wpid") - w0))
      echo "$out" | field 'j["tokens_per_s"]' >>"$run_dir/gw_tps"
      echo "$out" | field 'j["ttft_ms"]["p50"]' >>"$run_dir/gw_ttft"
      echo "$out" | field 'j["server_ttft_ms"]["p50"]' >>"$run_dir/sv_ttft"
    done
    it=$(median <"$run_dir/ie_tps") gt=$(median <"$run_dir/gw_tps")
    if_=$(median <"$run_dir/ie_ttft") gf=$(median <"$run_dir/gw_ttft") sf=$(median <"$run_dir/sv_ttft")
    awk -v m="$m" -v c="$c" -v it="$it" -v gt="$gt" -v if_="$if_" -v gf="$gf" -v sf="$sf" \
      -v dc="$dcpu" -v wc="$wcpu" 'BEGIN {
      printf "| %s | %d | %.1f | %.1f | %.3f | %.2f | %.2f | %.2f | %.2f | %.4f |\n", m, c, it, gt,
        gt / it, if_, gf, sf, gf - sf, wc ? dc / wc : 0 }'
  done
  stop_daemon
done

echo
echo "| model | 8 streams | tok/s | ratio to one worker |"
echo "|---|---|---|---|"
m=tinyllama-1.1b-int4
base=
for w in 1 2; do
  tpw=0 # every CPU of the worker's share: both cores for one worker, one each for two
  start_daemon "$models/$m" "$w" "$tpw"
  : >"$run_dir/w_tps"
  for _ in $(seq "$reps"); do
    "$clocher" bench --addr "unix:$run_dir/s.sock" -c 8 -n 16 --json --prompt-ids "$prompt" \
      --max-tokens "$max_new" --temperature 0 | field 'j["tokens_per_s"]' >>"$run_dir/w_tps"
  done
  stop_daemon
  t=$(median <"$run_dir/w_tps")
  base=${base:-$t}
  awk -v w="$w" -v t="$t" -v b="$base" -v m="$m" 'BEGIN {
    printf "| %s | %s | %.1f | %.3f |\n", m, (w == 1 ? "1 worker, 2 threads" : "2 workers, 1 core each"), t, t / b }'
done
