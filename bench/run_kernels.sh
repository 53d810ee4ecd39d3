#!/usr/bin/env bash
# Kernel benchmarks as recorded in docs/PERFORMANCE.md: a release build, then the bandwidth
# and peak probe and kern_bench at 1 thread and at every CPU. Prints markdown to stdout.
# Run it on a quiet machine: every figure is the best of several batches, but a busy
# neighbour on a core still lowers both the roofline and the kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build/bench-release}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target bw_probe kern_bench >/dev/null
echo "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, $(git rev-parse --short HEAD)"
echo
echo '```'
"$build/bench/bw_probe" 1024 8
echo '```'
for t in 1 "$(nproc)"; do
  "$build/bench/kern_bench" --threads "$t" "$@"
done
