#!/usr/bin/env bash
# kern_bench_ab.sh — one AVX-512 kernel file at two git revisions, A/B in one process:
# kernels/x86/avx512_q.c (and avx512_mxfp4.c) of REV_A and of REV_B are each compiled with the tree's flags, their
# symbols renamed by objcopy (only the products compared stay global), and linked with
# bench/kern_bench_ab.c, which times them alternately (thread CPU time, best of ROUNDS
# alternations: the machine is shared) and counts outputs whose bits differ.
# Usage: bench/kern_bench_ab.sh REV_A REV_B [KIND ROWS COLS N [ROUNDS]]...  (REV "." = the
#   working tree's file)
#   KIND: q4p (q4_0 panel GEMM, kern_gemm_q4_0p_q8_0_avx512), q8p (q8_0 panel GEMM,
#         kern_gemm_q8_0p_q8_0_avx512), q4rows (stored-row q4_0 GEMM),
#         mxv (kern_gemv_mxfp4_q8_0_avx512), q4vq8 (REV_A's q4_0 panels against REV_B's q8_0
#         panels on the same weights: bytes against ops); with no case given, a default set runs.
# CFLAGS_A, CFLAGS_B: extra compiler flags for one side (e.g. -DQ8P_PF=0: a knob of the file).
# Needs a configured build (BUILD_DIR, default build/release) with clocher_kernels built.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build/release}
[ $# -ge 2 ] || { echo "usage: $0 REV_A REV_B [KIND ROWS COLS N [ROUNDS]]..." >&2; exit 2; }
rev_a=$1 rev_b=$2
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cflags=(-O2 -g -DNDEBUG -D_GNU_SOURCE -std=c11 -Ikernels/include -Ikernels -Ikernels/x86 -Icommon
        -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16 -mfma -mf16c)
for side in a b; do
  rev=$rev_a; [ $side = b ] && rev=$rev_b
  # the q4_0 products live in avx512_q.c, the MXFP4 gemv in avx512_mxfp4.c: both files of
  # the revision, joined into one object so that only the compared products stay global
  for f in q mxfp4; do
    if [ "$rev" = . ]; then cp kernels/x86/avx512_$f.c "$tmp/${side}_$f.c" # the working tree's file
    else git show "$rev:kernels/x86/avx512_$f.c" > "$tmp/${side}_$f.c"; fi
    extra=${CFLAGS_A:-}; [ $side = b ] && extra=${CFLAGS_B:-}
    # shellcheck disable=SC2086 # the extra flags are words
    cc "${cflags[@]}" $extra -c "$tmp/${side}_$f.c" -o "$tmp/${side}_$f.o"
  done
  ld -r "$tmp/${side}_q.o" "$tmp/${side}_mxfp4.o" -o "$tmp/$side.o"
  objcopy --redefine-sym kern_gemm_q4_0p_q8_0_avx512=ab_${side}_q4p \
          --redefine-sym kern_gemm_q8_0p_q8_0_avx512=ab_${side}_q8p \
          --redefine-sym kern_gemm_q4_0_q8_0_avx512=ab_${side}_q4rows \
          --redefine-sym kern_gemv_mxfp4_q8_0_avx512=ab_${side}_mxv \
          --keep-global-symbol=ab_${side}_q4p --keep-global-symbol=ab_${side}_q8p \
          --keep-global-symbol=ab_${side}_q4rows \
          --keep-global-symbol=ab_${side}_mxv "$tmp/$side.o"
done
cc -O2 -std=c11 -D_GNU_SOURCE -Ikernels/include -Icommon bench/kern_bench_ab.c "$tmp/a.o" "$tmp/b.o" \
   "$build/kernels/libclocher_kernels.a" "$build/common/libclocher_common.a" -lpthread -lm \
   -o "$tmp/ab"
name() { if [ "$1" = . ]; then echo "working tree"; else git rev-parse --short "$1"; fi; }
echo "A = $rev_a ($(name "$rev_a")) ${CFLAGS_A:-}, B = $rev_b ($(name "$rev_b")) ${CFLAGS_B:-}, 1 thread, thread CPU time; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| kind | rows x cols | n | A GOP/s | B GOP/s | B / A | outputs whose bits differ |"
echo "|---|---|---|---|---|---|---|"
if [ $# -eq 0 ]; then
  set -- q4p 2048 2048 8 6 q4p 2048 2048 128 6 q4p 5632 2048 512 4 q4p 2048 5632 128 6 \
         mxv 2880 2880 1 8 mxv 5760 2880 1 8 mxv 5760 2880 4 6
fi
while [ $# -ge 4 ]; do
  kind=$1 rows=$2 cols=$3 n=$4 rounds=6
  shift 4
  if [ $# -ge 1 ] && [[ $1 =~ ^[0-9]+$ ]]; then rounds=$1; shift; fi
  "$tmp/ab" "$kind" "$rows" "$cols" "$n" "$rounds"
done
