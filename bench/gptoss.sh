#!/usr/bin/env bash
# gpt-oss-20b on this machine (issue 13's benchmarks; docs/PERFORMANCE.md "gpt-oss-20b"):
# `clocher synth --preset gpt-oss-20b` (random weights of the real shapes, MXFP4 experts, the
# rest bf16) converted twice: attention/router/embeddings bf16 (as released) and int8 (q8_0).
# Before a dtype's runs its file's page cache is re-read in 2 MiB folios (HUGE=1, below), so
# every run maps the weights with 2 MiB entries. Per repetition (all of one dtype's first, so
# its 12-14 GB stay in the page cache), one after another so they share the machine's minute:
#   - bw_probe: the 2-thread read bandwidth, the roof every figure of the repetition is set
#     against (only a ratio measured in one run counts: the machine's speed swings 1.5-2x);
#   - decode tok/s after a short prompt (8 tokens, DECODE_TOKENS new);
#   - prefill tok/s (PREFILL_TOKENS prompt tokens, nothing generated);
#   - aggregate decode of STREAMS concurrent requests through the serving engine, each with its
#     own prompt (so their tokens route to different experts, as independent users' do): as
#     generated tokens / wall time (prefill included, the column of sessions up to 17) and
#     decode only, STREAMS / the median time per output token (what decode tok/s is for one
#     stream: first token to last; session 18);
# and once per dtype when LONG=1: decode after a LONG_TOKENS prompt (slow: prefill first).
# Bytes read per decoded token are computed from the manifest (bytes_per_token below): every
# non-expert matrix, bias and norm, n_experts_used/n_experts of the expert tensors, one
# embedding row; after the long prompt the KV cache read per token is added (f32, as
# inference-engine keeps it: full layers the whole context, sliding layers their window).
# Roofline fraction = bytes/token x tok/s / probe GB/s, per repetition, then the median.
#
# Why 2 MiB folios: on this virtual machine a decode reading the weights through 4 KiB
# page-table entries ran 2.4-6.8x slower (3-4.5x the CPU time) than through 2 MiB ones, in one
# interleaved run (docs/PERFORMANCE.md). A file mapping gets 2 MiB entries only where the page
# cache holds 2 MiB folios, which it does where the file was read through a MADV_HUGEPAGE
# mapping; hotrepl_hugify (worker/process/hotrepl.h) does the same inside a worker. HUGE=0
# leaves the page cache as it is; HUGE=small re-reads it in small folios (the 4 KiB baseline).
#   bash bench/gptoss.sh            Env: BUILD_DIR (build/release), CLOCHER_MODELS (models/),
#   REPS (3), THREADS (2), DTYPES ("bf16 int8"), DECODE_TOKENS (32), PREFILL_TOKENS (512),
#   STREAMS (8), LONG (0), LONG_TOKENS (4096), HUGE (1).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build/release}
models=${CLOCHER_MODELS:-models}
reps=${REPS:-3} threads=${THREADS:-2} dtypes=${DTYPES:-bf16 int8}
dec=${DECODE_TOKENS:-32} pre=${PREFILL_TOKENS:-512} streams=${STREAMS:-8}
long=${LONG:-0} long_tokens=${LONG_TOKENS:-4096} huge=${HUGE:-1}
cmake --build "$build" -j2 --target inference-engine bw_probe >/dev/null
clocher=$build/client/clocher ie=$build/worker/inference-engine probe=$build/bench/bw_probe
hf=$models/gpt-oss-20b-hf
mkdir -p "$models"
for dt in $dtypes; do # the models are made once (the clocher CLI is built only for that)
  d=$models/gpt-oss-20b-$dt
  [ -f "$d/model.ie.json" ] && continue
  cmake --build "$build" -j2 --target clocher >/dev/null
  [ -f "$hf/config.json" ] || "$clocher" synth --preset gpt-oss-20b --seed 1 "$hf" >/dev/null
  "$clocher" convert "$hf" "$d" --dtype "$dt" >/dev/null
done

bytes_per_token() { # model dir -> bytes one decoded token reads (weights only)
  python3 - "$1/model.ie.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
hp = m["hparams"]
frac = hp["n_experts_used"] / hp["n_experts"]
total = 0.0
for t in m["tensors"]:
    if t["name"] == "tok_embd":
        total += t["size"] / hp["vocab_size"]
    elif "_exps" in t["name"]:
        total += t["size"] * frac
    else:
        total += t["size"]
print(int(total))
PY
}

kv_bytes_per_token() { # model dir, context -> KV bytes one decoded token reads (f32 cache)
  python3 - "$1/model.ie.json" "$2" <<'PY'
import json, sys
hp = json.load(open(sys.argv[1]))["hparams"]
ctx = int(sys.argv[2])
per_pos = 2 * hp["n_kv_heads"] * hp["head_dim"] * 4  # K and V, f32
win = hp.get("sliding_window") or 0
n_slide = hp["n_layers"] // 2 if win else 0  # gpt-oss: the even layers slide
print(per_pos * ((hp["n_layers"] - n_slide) * ctx + n_slide * min(win, ctx)))
PY
}

# Re-reads the page cache of a model file in 2 MiB folios (mode huge; small: default folios)
# and prints the GB a mapping then maps with 2 MiB entries / the file's GB. Chunk by chunk:
# drop the chunk's cached pages (clean; pages another process maps stay as they are), read it
# again through a MADV_HUGEPAGE mapping (readahead then allocates PMD-sized folios), so memory
# grows by one chunk at most.
page_cache() { # mode (huge|small), file
  python3 - "$1" "$2" <<'PY'
import mmap, os, sys
MADV_POPULATE_READ = 22  # Linux 5.14
mode, path = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
m = mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ)
ch = 64 << 20
pmd = 0
for off in range(0, size, ch):
    n = min(ch, size - off)
    os.posix_fadvise(fd, off, n, os.POSIX_FADV_DONTNEED)
    m.madvise(mmap.MADV_HUGEPAGE if mode == "huge" else mmap.MADV_NOHUGEPAGE, off, n)
    m.madvise(MADV_POPULATE_READ, off, n)
    if off + n == size and mode == "huge":  # this mapping's 2 MiB entries, before unmapping
        pmd = sum(int(l.split()[1]) * 1024 for l in open("/proc/self/smaps")
                  if l.startswith("FilePmdMapped:"))
    m.madvise(mmap.MADV_DONTNEED, off, n) if mode == "small" else None
m.close()
os.close(fd)
print(f"{pmd / 1e9:.2f}/{size / 1e9:.2f}")
PY
}

evict_others() { # dtype: drops the page cache of the other dtypes' model files
  for o in bf16 int8 $dtypes; do
    [ "$o" = "$1" ] || [ ! -f "$models/gpt-oss-20b-$o/model.ie.bin" ] || python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$models/gpt-oss-20b-$o/model.ie.bin"
  done
}

ids() { # N [K]: N token ids, the K-th such list (K = 0 by default); lists differ from the first id
  python3 -c "import sys; n, k = map(int, sys.argv[1:]); print(','.join(str(1000 + ((i + 37 * k) * 7919) % 190000) for i in range(n)))" "$1" "${2:-0}"
}
short=$(ids 8) prefill=$(ids "$pre")
# the streams' prompts: one list each, so each stream's tokens route to their own experts (the
# same prompt 8 times would send every token of a step to the same 4 experts per layer)
stream_args=()
for k in $(seq 0 $((streams - 1))); do stream_args+=(--prompt-ids "$(ids 8 "$k")"); done
json() { python3 -c "import json,sys; d=json.loads(sys.stdin.readline()); print(d[sys.argv[1]])" "$1"; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for dt in $dtypes; do # dtype outermost: two 13 GB models do not both stay in the page cache
  d=$models/gpt-oss-20b-$dt
  if [ "$huge" != 0 ]; then
    [ "$huge" = small ] && mode=small || mode=huge
    evict_others "$dt" # 2 MiB folios need free 2 MiB runs of memory: the other models' cache goes
    echo "# $dt: page cache re-read in $mode folios; GB mapped with 2 MiB entries: $(page_cache "$mode" "$d/model.ie.bin")"
  fi
  for r in $(seq "$reps"); do
    bw=$("$probe" 512 3 | sed -n "s/^bandwidth threads=$threads: \([0-9.]*\) GB\/s.*/\1/p")
    dec_tps=$("$ie" --model-dir "$d" --prompt-ids "$short" --max-new "$dec" --ignore-eos \
      --greedy --threads "$threads" --quiet | json decode_tps)
    pre_tps=$("$ie" --model-dir "$d" --prompt-ids "$prefill" --max-new 0 --threads "$threads" \
      --quiet | json prefill_tps)
    aggj=$("$ie" --model-dir "$d" "${stream_args[@]}" --max-new "$dec" --ignore-eos --greedy \
      --threads "$threads" --concurrency "$streams" --quiet)
    agg=$(echo "$aggj" | json tps)
    # decode only, as decode_tps is: the streams' tokens per step time (tpot p50, first token
    # to last), without the prefill that `tps` (generated / wall) also counts
    aggd=$(echo "$aggj" | python3 -c "import json,sys; d=json.loads(sys.stdin.readline()); print('%.3f' % ($streams * 1000 / d['p50_ms']))")
    rss=$(/usr/bin/time -f '%M' "$ie" --model-dir "$d" --prompt-ids "$short" --max-new 4 \
      --threads "$threads" --quiet 2>&1 >/dev/null | tail -1)
    echo "$r $dt $bw $dec_tps $pre_tps $agg $rss $aggd" | tee -a "$out"
  done
done
if [ "$long" = 1 ]; then
  for dt in $dtypes; do
    d=$models/gpt-oss-20b-$dt
    [ "$huge" = 1 ] && evict_others "$dt" &&
      echo "# $dt: GB mapped with 2 MiB entries: $(page_cache huge "$d/model.ie.bin")"
    bw=$("$probe" 512 3 | sed -n "s/^bandwidth threads=$threads: \([0-9.]*\) GB\/s.*/\1/p")
    tps=$("$ie" --model-dir "$d" --prompt-ids "$(ids "$long_tokens")" --max-new 16 --ignore-eos \
      --greedy --threads "$threads" --quiet | json decode_tps)
    echo "long $dt $bw $tps" | tee -a "$out"
  done
fi
echo
echo "| dtype (non-expert) | bytes/token | probe GB/s | decode tok/s | roofline fraction | prefill$pre tok/s | $streams streams tok/s (x one) | $streams streams decode only (x one) | peak RSS GB |"
echo "|---|---|---|---|---|---|---|---|---|"
for dt in $dtypes; do
  bpt=$(bytes_per_token "$models/gpt-oss-20b-$dt")
  python3 - "$out" "$dt" "$bpt" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.split()[0] != "long" and l.split()[1] == sys.argv[2]]
bpt = int(sys.argv[3])
med = lambda xs: statistics.median(xs)
bw = [float(r[2]) for r in rows]; dec = [float(r[3]) for r in rows]
frac = [bpt * float(r[3]) / (float(r[2]) * 1e9) for r in rows]
agg = [float(r[5]) / float(r[3]) for r in rows]
print(f"| {sys.argv[2]} | {bpt / 1e9:.3f} GB | {med(bw):.1f} | {med(dec):.2f} | "
      f"{med(frac):.2f} ({min(frac):.2f}-{max(frac):.2f}) | {med([float(r[4]) for r in rows]):.1f} | "
      f"{med([float(r[5]) for r in rows]):.2f} ({med(agg):.2f}x) | "
      f"{med([float(r[7]) for r in rows]):.2f} ({med([float(r[7]) / float(r[3]) for r in rows]):.2f}x) | "
      f"{max(float(r[6]) for r in rows) / 1048576:.2f} |")
PY
done
if [ "$long" = 1 ]; then
  echo
  echo "| dtype (non-expert) | decode after | bytes/token (weights + KV f32) | probe GB/s | decode tok/s | roofline fraction |"
  echo "|---|---|---|---|---|---|"
  for dt in $dtypes; do
    d=$models/gpt-oss-20b-$dt
    bpt=$(( $(bytes_per_token "$d") + $(kv_bytes_per_token "$d" "$long_tokens") ))
    awk -v dt="$dt" -v b="$bpt" -v n="$long_tokens" '$1 == "long" && $2 == dt {
      printf "| %s | %d tokens | %.3f GB | %.1f | %.2f | %.2f |\n", dt, n, b / 1e9, $3, $4, b * $4 / ($3 * 1e9) }' "$out"
  done
fi
