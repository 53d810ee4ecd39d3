#!/usr/bin/env bash
# The whole test suite, as CI runs it (README's second command).
#  1. release build with -Werror: every test but those labelled asan (unit, integration); the
#     release tree still builds everything;
#  2. ASan+UBSan build: the unit tests and those labelled asan (the gateway end to end, one
#     ctest per pytest file: a real clocherd and its workers, sanitized, leak-checked at exit;
#     they run here only, the same behaviour checked harder than in release); two ctest slots
#     a core, the tests that mostly wait taking one (tests/CMakeLists.txt, CLOCHER_TEST_WAITS);
#  3. TSan build: the tests labelled tsan (rings, thread pool, registries, stats, and
#     gateway_tsan_streams and gateway_tsan_faults: the gateway cases that drive its threads,
#     tests/gateway/CMakeLists.txt, two ctests so the two cores run them side by side, with gRPC
#     core's own code suppressed: tests/gateway/tsan.supp);
#  4. clang libFuzzer build: each fuzzer for a bounded time (CLOCHER_FUZZ_SECONDS,
#     6 s by default, two at a time); its SIMD kernel files without ASan/UBSan
#     (kernels/CMakeLists.txt says why).
# The sanitizer trees build only what their tests run (targets tests_sanitized, tests_tsan,
# tests_fuzz: tests/CMakeLists.txt records each test's programs per label), and every tree keeps
# line tables only (-g1): a sanitizer report still names file and line, and the builds, about
# half of the suite's time on 2 cores, get shorter. Target: the suite under 20 minutes.
# Build trees go to build/ci-*; a clean checkout is all it needs (deps are installed first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)
fuzz_seconds=${CLOCHER_FUZZ_SECONDS:-6}

section() { printf '\n==== %s (at %ss) ====\n' "$*" "$SECONDS"; }

section "release build (-Werror)"
cmake -S . -B build/ci-release -DCLOCHER_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" >/dev/null
cmake --build build/ci-release -j"$jobs"
ctest --test-dir build/ci-release --output-on-failure -j"$jobs" -LE 'fuzz|asan'

section "ASan+UBSan build: unit tests and the gateway end to end"
cmake -S . -B build/ci-asan -DCLOCHER_WERROR=ON -DCLOCHER_SANITIZE=address,undefined \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g1" >/dev/null
cmake --build build/ci-asan -j"$jobs" --target tests_sanitized
# two slots a core: a test that computes takes two, one that mostly waits on a sanitized
# daemon takes one, so the waiting ones overlap (tests/CMakeLists.txt, CLOCHER_TEST_WAITS)
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build/ci-asan --output-on-failure -j"$((2 * jobs))" -L 'unit|asan'

section "TSan build: shared-memory and thread tests (label tsan)"
cmake -S . -B build/ci-tsan -DCLOCHER_WERROR=ON -DCLOCHER_SANITIZE=thread \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g1" >/dev/null
cmake --build build/ci-tsan -j"$jobs" --target tests_tsan
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  ctest --test-dir build/ci-tsan --output-on-failure -j"$jobs" -L tsan

section "libFuzzer: ${fuzz_seconds}s per parser"
cmake -S . -B build/ci-fuzz -DCMAKE_C_COMPILER=clang -DCLOCHER_FUZZ=ON \
  -DCLOCHER_FUZZ_SECONDS="$fuzz_seconds" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g1" >/dev/null
cmake --build build/ci-fuzz -j"$jobs" --target tests_fuzz
if ctest --test-dir build/ci-fuzz -N -L fuzz | grep -q 'Total Tests: 0'; then
  echo "no fuzz targets yet"
else
  ctest --test-dir build/ci-fuzz --output-on-failure -j"$jobs" -L fuzz
fi
printf '\n==== the whole suite passed in %ss ====\n' "$SECONDS"
