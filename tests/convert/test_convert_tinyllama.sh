#!/usr/bin/env bash
# test_convert_tinyllama.sh — acceptance (a) at full size: `clocher synth --preset
# tinyllama-1.1b` (2.2 GB of bf16) → `clocher convert` → inference-engine loads the IEBIN model
# and generates. Labelled slow (about 20 s here, mostly writing 4.4 GB); the other tests use
# the demo preset or --layers.
set -u
clocher=$1
ie=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$clocher" synth --preset tinyllama-1.1b "$tmp/tl" || { echo "FAIL - synth"; exit 1; }
"$clocher" convert "$tmp/tl" "$tmp/tl-ie" || { echo "FAIL - convert"; exit 1; }
rm -rf "$tmp/tl" # keep the peak disk use to one copy
n=$(grep -c '"name"' "$tmp/tl-ie/model.ie.json")
[ "$n" -ge $((3 + 9 * 22)) ] || { echo "FAIL - $n tensors in the manifest"; exit 1; }
out=$("$ie" --model-dir "$tmp/tl-ie" --prompt "Once upon a time" --max-new 4 --quiet)
if grep -q '"generated_tokens":4' <<<"$out"; then
  echo "ok - tinyllama-1.1b: synth -> convert -> generate: $out"
else
  echo "FAIL - tinyllama-1.1b: $out"; exit 1
fi
