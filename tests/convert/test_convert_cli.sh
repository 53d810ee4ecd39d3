#!/usr/bin/env bash
# test_convert_cli.sh — `clocher synth` and `clocher convert` end to end, through the real
# binaries (the library's cases, with their messages, are in test_convert.c / test_synth.c):
#  - the same synthetic weights through the Hugging Face path and through a GGUF file give
#    identical IEBIN files, for f32, f16 and bf16;
#  - synth is deterministic; converted models generate with inference-engine (f32/bf16/int8/
#    int4/q4_g128, a 4-layer TinyLlama-shaped model);
#  - llama2.c, forced --from, --dtype conversion;
#  - malformed inputs and failing outputs: the exit code (3 source, 1 output, 2 usage), a
#    message naming the problem, nothing that loads.
set -u
clocher=$1
ie=$2
fixtures=${CLOCHER_FIXTURES:-../shared/fixtures}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok - $*"; }
bad() { fail=$((fail + 1)); echo "FAIL - $*"; }
# expect CODE 'needle' cmd...: exit code and a message containing needle on stderr
expect() {
  local code=$1 needle=$2; shift 2
  local err rc
  err=$("$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -eq "$code" ] && grep -qF -- "$needle" <<<"$err"; then ok "$* -> $code ($needle)"
  else bad "$* -> exit $rc, wanted $code with '$needle'; stderr: $err"; fi
}
no_model() { [ ! -e "$1/model.ie.json" ] && ok "no model left in $1" || bad "a manifest was left in $1"; }

# --- HF vs GGUF, every source dtype ---
for dt in f32 f16 bf16; do
  "$clocher" synth --preset demo --dtype $dt --seed 7 "$tmp/hf-$dt" --gguf "$tmp/demo-$dt.gguf" || bad "synth $dt"
  "$clocher" convert "$tmp/hf-$dt" "$tmp/ie-hf-$dt" || bad "convert hf $dt"
  "$clocher" convert "$tmp/demo-$dt.gguf" "$tmp/ie-gg-$dt" || bad "convert gguf $dt"
  if cmp -s "$tmp/ie-hf-$dt/model.ie.bin" "$tmp/ie-gg-$dt/model.ie.bin" &&
     diff <(grep -v '"name"' "$tmp/ie-hf-$dt/model.ie.json") <(grep -v '"name"' "$tmp/ie-gg-$dt/model.ie.json") >/dev/null &&
     cmp -s "$tmp/ie-hf-$dt/tokenizer.ie.json" "$tmp/ie-gg-$dt/tokenizer.ie.json"; then
    ok "HF and GGUF give identical IEBIN ($dt)"
  else bad "HF and GGUF IEBIN differ ($dt)"; fi
done

# --- determinism ---
"$clocher" synth --preset demo --dtype f32 --seed 7 "$tmp/hf-again" >/dev/null
cmp -s "$tmp/hf-f32/model.safetensors" "$tmp/hf-again/model.safetensors" && ok "synth is deterministic" || bad "synth differs between runs"
"$clocher" synth --preset demo --dtype f32 --seed 8 "$tmp/hf-seed8" >/dev/null
cmp -s "$tmp/hf-f32/model.safetensors" "$tmp/hf-seed8/model.safetensors" && bad "seed is ignored" || ok "another seed, other weights"

# --- dtype conversion and generation on the demo model ---
"$clocher" convert "$tmp/hf-f32" "$tmp/ie-bf16" --dtype bf16 || bad "convert --dtype bf16"
grep -q '"dtype": *"bf16"' "$tmp/ie-bf16/model.ie.json" && ok "--dtype bf16 applied" || bad "--dtype bf16 not applied"
out=$("$ie" --model-dir "$tmp/ie-bf16" --prompt "Once upon a time" --max-new 8 --quiet 2>/dev/null)
grep -q '"generated_tokens":8' <<<"$out" && ok "demo bf16 generates" || bad "demo bf16: $out"

# --- int8 / int4 quantization: real kernels, output stays close to f32 ---
"$clocher" convert "$tmp/hf-f32" "$tmp/ie-q8" --dtype int8 && grep -q '"q8_0"' "$tmp/ie-q8/model.ie.json" && ok "int8 convert" || bad "int8 convert"
"$clocher" convert "$tmp/hf-f32" "$tmp/ie-q4" --dtype int4 && grep -q '"q4_0"' "$tmp/ie-q4/model.ie.json" && ok "int4 convert" || bad "int4 convert"
"$clocher" convert "$tmp/hf-f32" "$tmp/ie-q4g" --dtype q4_g128 && grep -q '"q4_g128"' "$tmp/ie-q4g/model.ie.json" && ok "q4_g128 convert" || bad "q4_g128 convert"
for q in q8 q4 q4g; do
  out=$("$ie" --model-dir "$tmp/ie-$q" --prompt "Once upon a time" --max-new 4 --quiet 2>/dev/null)
  grep -q '"generated_tokens":4' <<<"$out" && ok "$q generates" || bad "$q: $out"
done
# stories260K (trained): int8 greedy ids equal f32's from BOS. (On the 10-token golden prompt
# int8 flips step 0, whose margin is 0.14: weight-only Q8_0 moves this 64-wide model's logits
# by ~0.5-1.5, f16 by ~0.02 — measured, see the issue notes; a better int8 is issue 3's work.)
"$clocher" convert "$fixtures/stories260K/stories260K.bin" "$tmp/s-q8" --dtype int8 || bad "stories int8"
ls -d "$tmp"/s-q8.import.* >/dev/null 2>&1 && bad "scratch import left behind" || ok "no scratch import left"
"$clocher" convert "$fixtures/stories260K/stories260K.bin" "$tmp/s-f32" >/dev/null
ids() { "$ie" --model-dir "$1" --prompt-ids 1 --max-new 10 --greedy --print-ids --quiet 2>/dev/null | grep -o '"generated_ids":\[[^]]*\]'; }
[ "$(ids "$tmp/s-q8")" = "$(ids "$tmp/s-f32")" ] && ok "stories260K int8 greedy = f32" || bad "int8 greedy differs: $(ids "$tmp/s-q8") vs $(ids "$tmp/s-f32")"
"$clocher" convert "$tmp/s-f32" "$tmp/s-q4" --dtype int4 && ok "IEBIN -> int4 requantization" || bad "IEBIN requantization"
# --prompt-ids repeated: one prompt each, round-robin over --concurrency's requests; each
# request's greedy ids are its prompt's alone (bench/gptoss.sh gives every stream its own prompt)
solo() { "$ie" --model-dir "$tmp/s-f32" --prompt-ids "$1" --max-new 6 --greedy --print-ids --quiet 2>/dev/null; }
conc=$("$ie" --model-dir "$tmp/s-f32" --prompt-ids 1,50 --prompt-ids 1,300,7 --max-new 6 --greedy \
  --print-ids --concurrency 2 --quiet 2>/dev/null)
/usr/bin/python3 - "$conc" "$(solo 1,50)" "$(solo 1,300,7)" <<'PY' && ok "--prompt-ids twice: each request its own prompt" || bad "--prompt-ids twice: $conc"
import json, sys
c = json.loads(sys.argv[1])["generated_ids"]
a, b = (json.loads(x)["generated_ids"] for x in sys.argv[2:])
sys.exit(0 if c == [a, b] and a != b else 1)
PY

# --- issue 3's acceptance: greedy ids vs llama2.c's golden ones (tests/convert/golden_greedy.py)
# Per case up to the first step whose golden margin is < 0.01. f32 must agree. int8 (Q8_0) and
# f16 do not (a diagnosed property of this 64-wide model, not a bug: docs/PERFORMANCE.md
# "Quality, session 5" — Gaussian noise of the same RMS as Q8_0's rounding does the same
# damage, and every tensor class alone flips a case), so the strict check is reported as a
# known failure (TODO) and each dtype is held to a guard instead: its first flip must be at a
# step whose golden margin its rounding can move (measured over 4.6k positions: f16 max 0.09,
# Q8_0 weights max 2.0; a broken quantizer flips steps of larger margin — int4 does, at 2.82).
golden=$fixtures/stories260K/golden.json
gg() { /usr/bin/python3 "$(dirname "$0")/golden_greedy.py" "$ie" "$1" "$golden" "${@:2}"; }
todo() { echo "not ok - $* # TODO issue 3"; }
if [ ! -f "$golden" ]; then bad "fixture $golden not found (set CLOCHER_FIXTURES)"
else
  out=$(gg "$tmp/s-f32" 2>&1) && ok "stories260K f32 greedy = golden on all five cases" || bad "f32 vs golden: $out"
  out=$(gg "$tmp/s-q8" 2>&1) && ok "stories260K int8 greedy = golden on all five cases (strict)" \
    || todo "stories260K int8 vs golden, strict: $(grep -c differs <<<"$out") of 5 cases flip: $(grep differs <<<"$out" | tr '\n' ';')"
  out=$(gg "$tmp/s-q8" --flip-below 2.5 2>&1) && ok "int8 flips only at steps of golden margin < 2.5" || bad "int8 guard: $out"
  "$clocher" convert "$fixtures/stories260K/stories260K.bin" "$tmp/s-f16" --dtype f16 >/dev/null 2>&1 || bad "stories f16"
  out=$(gg "$tmp/s-f16" 2>&1) && ok "stories260K f16 greedy = golden (strict)" || todo "f16 vs golden, strict: $(grep differs <<<"$out" | tr '\n' ';')"
  out=$(gg "$tmp/s-f16" --flip-below 0.15 2>&1) && ok "f16 flips only at steps of golden margin < 0.15" || bad "f16 guard: $out"
  "$clocher" convert "$fixtures/stories260K/stories260K.bin" "$tmp/s-i4" --dtype int4 >/dev/null 2>&1 || bad "stories int4"
  gg "$tmp/s-i4" --flip-below 2.5 >/dev/null 2>&1 && bad "the int8 guard does not catch int4's flips" || ok "the guard catches a flip of margin >= 2.5 (int4)"
  # the checker's own refusals name what is wrong
  gp="$(dirname "$0")/golden_greedy.py"
  expect 2 "cannot read the golden cases" /usr/bin/python3 "$gp" "$ie" "$tmp/s-f32" "$tmp/nonexistent.json"
  echo '{"no_cases": []}' > "$tmp/nocases.json"
  expect 2 "cannot read the golden cases ('cases')" /usr/bin/python3 "$gp" "$ie" "$tmp/s-f32" "$tmp/nocases.json"
  expect 2 "usage: golden_greedy.py" /usr/bin/python3 "$gp" "$ie" "$tmp/s-f32" "$golden" --tau 1
  expect 2 "--flip-below x: expected a number" /usr/bin/python3 "$gp" "$ie" "$tmp/s-f32" "$golden" --flip-below x
  expect 2 "inference-engine failed" /usr/bin/python3 "$gp" "$ie" "$tmp/no-such-model" "$golden"
  rm -rf "$tmp/s-f16" "$tmp/s-i4"
fi

# --- llama2.c ---
"$clocher" convert "$fixtures/stories260K/stories260K.bin" "$tmp/s260" && ok "llama2c convert" || bad "llama2c convert"
# stories260K's vocabulary (512) is smaller than the Llama 2 tokenizer's (32000): refused
expect 3 "32000 tokens, more than the model's vocab_size 512" "$clocher" convert --from llama2c \
  "$fixtures/stories260K/stories260K.bin" "$tmp/s260b" --tokenizer "$fixtures/tokenizer/llama2-tokenizer.bin"
no_model "$tmp/s260b"
[ -f "$tmp/s260/model.ie.json" ] && ok "stories260K converted" || bad "stories260K missing"

# --- a TinyLlama-shaped model cut to 4 layers (the full size is test_convert_tinyllama.sh) ---
"$clocher" synth --preset tinyllama-1.1b --layers 4 "$tmp/tl4" >/dev/null || bad "synth --layers 4"
grep -q '"num_hidden_layers": 4' "$tmp/tl4/config.json" && ok "--layers 4" || bad "--layers ignored"
"$clocher" convert "$tmp/tl4" "$tmp/tl4-ie" || bad "convert tl4"
grep -q '"dtype": *"bf16"' "$tmp/tl4-ie/model.ie.json" && ok "bf16 source kept" || bad "bf16 not kept"
out=$("$ie" --model-dir "$tmp/tl4-ie" --prompt "Hello" --max-new 4 --quiet 2>/dev/null)
grep -q '"generated_tokens":4' <<<"$out" && ok "tinyllama-1.1b --layers 4 generates" || bad "tl4: $out"
rm -rf "$tmp/tl4" "$tmp/tl4-ie"

# --- malformed sources ---
mkdir -p "$tmp/badjson"; cp "$tmp/hf-f32/model.safetensors" "$tmp/badjson/"; echo '{"model_type": "llama",' >"$tmp/badjson/config.json"
expect 3 "invalid JSON" "$clocher" convert "$tmp/badjson" "$tmp/o1"; no_model "$tmp/o1"
mkdir -p "$tmp/missing"; cp "$tmp/hf-f32/model.safetensors" "$tmp/missing/"
sed 's/"hidden_size": [0-9]*,//' "$tmp/hf-f32/config.json" >"$tmp/missing/config.json"
expect 3 "missing key 'hidden_size'" "$clocher" convert "$tmp/missing" "$tmp/o2"; no_model "$tmp/o2"
mkdir -p "$tmp/phi3"; cp "$tmp/hf-f32/model.safetensors" "$tmp/phi3/"
sed 's/"model_type": "llama"/"model_type": "phi3"/' "$tmp/hf-f32/config.json" >"$tmp/phi3/config.json"
expect 3 "model_type phi3" "$clocher" convert "$tmp/phi3" "$tmp/o3"
mkdir -p "$tmp/morelayers"; cp "$tmp/hf-f32/model.safetensors" "$tmp/morelayers/"
sed 's/"num_hidden_layers": [0-9]*/"num_hidden_layers": 5/' "$tmp/hf-f32/config.json" >"$tmp/morelayers/config.json"
expect 3 "model.layers.4.input_layernorm.weight' is missing" "$clocher" convert "$tmp/morelayers" "$tmp/o4"; no_model "$tmp/o4"
mkdir -p "$tmp/wide"; cp "$tmp/hf-f32/model.safetensors" "$tmp/wide/"
sed 's/"intermediate_size": [0-9]*/"intermediate_size": 512/' "$tmp/hf-f32/config.json" >"$tmp/wide/config.json"
expect 3 "expected [512, 256]" "$clocher" convert "$tmp/wide" "$tmp/o5"; no_model "$tmp/o5"
head -c 100000 "$fixtures/stories260K/stories260K.bin" >"$tmp/trunc.bin"
expect 3 "implies 1056540 (truncated)" "$clocher" convert --from llama2c "$tmp/trunc.bin" "$tmp/o6"; no_model "$tmp/o6"
expect 3 "only \"llama\"" "$clocher" convert "$fixtures/tokenizer/ggml-vocab-gpt-2.gguf" "$tmp/o7"
head -c 5000 "$tmp/demo-f32.gguf" >"$tmp/trunc.gguf"
expect 3 "trunc.gguf" "$clocher" convert "$tmp/trunc.gguf" "$tmp/o8"; no_model "$tmp/o8"
expect 3 "not a Hugging Face directory, a GGUF file or a valid llama2.c" "$clocher" convert "$fixtures/README.md" "$tmp/o9"
expect 2 "expected f32, f16, bf16" "$clocher" convert "$tmp/hf-f32" "$tmp/o10" --dtype int3
expect 2 "usage" "$clocher" convert "$tmp/hf-f32"

# --- failing outputs ---
touch "$tmp/afile"
expect 1 "afile/out: Not a directory" "$clocher" convert "$tmp/hf-f32" "$tmp/afile/out"
expect 1 "/proc/self/out" "$clocher" convert "$tmp/hf-f32" /proc/self/out
expect 1 "/proc/self/out" "$clocher" convert "$fixtures/stories260K/stories260K.bin" /proc/self/out
expect 1 "No space left on device" env CLOCHER_FAULT_WRITE_LIMIT=100000 "$clocher" convert "$tmp/hf-f32" "$tmp/full"
no_model "$tmp/full"
# a failed re-conversion keeps the model that was there
cp -r "$tmp/ie-hf-f32" "$tmp/keep"
expect 1 "No space left on device" env CLOCHER_FAULT_WRITE_LIMIT=100000 "$clocher" convert "$tmp/hf-f32" "$tmp/keep"
"$ie" --model-dir "$tmp/keep" --prompt-ids 1,2,3 --max-new 1 --quiet >/dev/null 2>&1 && ok "old model still loads" || bad "old model damaged"

# --- --quant-manifest and the calibration gate ---
s260=$fixtures/stories260K/stories260K.bin
awk 'BEGIN{for(i=0;i<300;i++) printf "%d ", (i*131+7)%512}' > "$tmp/calib.ids"
printf 'Once upon a time, there was a little girl who liked to play in the park with her dog.\n' > "$tmp/calib.txt"
cat > "$tmp/good.json" <<'J'
{"version": 1, "rules": [{"pattern": "^(tok_embd|output)$", "dtype": "f32"},
                         {"pattern": ".", "dtype": "f16"}]}
J
cat > "$tmp/bad.json" <<'J'
{"version": 1, "rules": [{"pattern": ".", "dtype": "int4w", "group": 32}]}
J
# a good manifest passes a strict gate, writes its report and the model
if "$clocher" convert "$s260" "$tmp/gated" --quant-manifest "$tmp/good.json" --calib-ids "$tmp/calib.ids" \
     --gate-kld 0.001 --gate-top1 0.98 --gate-cos 0.999 --calib-report "$tmp/rep.json" 2>"$tmp/err"; then
  ok "good manifest passes the gate"
else bad "good manifest refused: $(cat "$tmp/err")"; fi
grep -q '"passed": true' "$tmp/rep.json" && ok "report says passed" || bad "report: $(head -c 300 "$tmp/rep.json")"
grep -q '"dtype": *"f16"' "$tmp/gated/model.ie.json" && ok "manifest dtypes stored" || bad "no f16 tensor in the gated model"
# calibration text through the model's tokenizer works too
"$clocher" convert "$tmp/hf-f32" "$tmp/gated-txt" --dtype int8 --calib "$tmp/calib.txt" \
  --gate-cos 0.9 2>/dev/null && ok "--calib text" || bad "--calib text failed"
expect 3 "carries no tokenizer" "$clocher" convert "$s260" "$tmp/x" --calib "$tmp/calib.txt" --gate-top1 0.5
# a deliberately bad manifest: refused, exit 4, nothing written, no scratch left behind
expect 4 "REFUSED, nothing written" "$clocher" convert "$s260" "$tmp/refused" --quant-manifest "$tmp/bad.json" \
  --calib-ids "$tmp/calib.ids" --gate-kld 0.01 --gate-top1 0.95
[ ! -e "$tmp/refused" ] && ok "refused: OUT_DIR absent" || bad "refused conversion left $tmp/refused"
ls "$tmp" | grep -q 'calib-' && bad "scratch directories left: $(ls "$tmp" | grep calib-)" || ok "no scratch left"
# ... and a refused re-conversion keeps the model that was there, byte for byte
cp -r "$tmp/gated" "$tmp/gated.before"
expect 4 "top-1 agreement" "$clocher" convert "$s260" "$tmp/gated" --quant-manifest "$tmp/bad.json" \
  --calib-ids "$tmp/calib.ids" --gate-top1 0.95
diff -r "$tmp/gated" "$tmp/gated.before" >/dev/null && ok "refused: previous model intact" || bad "previous model changed"
# a passing re-conversion replaces it
"$clocher" convert "$s260" "$tmp/gated" --dtype int8 --calib-ids "$tmp/calib.ids" --gate-top1 0.5 2>/dev/null \
  && grep -q q8_0 "$tmp/gated/model.ie.json" && ok "passing re-conversion replaces the model" || bad "re-conversion"
# bad manifests and flags name what is wrong
printf '{"version": 1, "rules": [{"pattern": ".", "dtype": "int4w", "group": 256}]}' > "$tmp/g256.json"
expect 3 "rules[0].group: int4w with groups of 256" "$clocher" convert "$s260" "$tmp/x" --quant-manifest "$tmp/g256.json"
# int4 groups of 64 with a zero point: stored as q4z_g64 (the 172-wide ffn_down stays f32)
printf '{"version": 1, "rules": [{"pattern": "attn", "dtype": "int4w", "group": 64, "zero": "per-group"}]}' > "$tmp/g64.json"
"$clocher" convert "$s260" "$tmp/g64" --quant-manifest "$tmp/g64.json" --rounding search 2>/dev/null \
  && grep -q '"q4z_g64"' "$tmp/g64/model.ie.json" && ok "manifest int4w group 64 + zero -> q4z_g64" || bad "q4z_g64 manifest"
expect 2 "--rounding maybe: expected nearest or search" "$clocher" convert "$s260" "$tmp/x" --rounding maybe
printf '{"version": 1, "rules": [{"pattern": "[", "dtype": "f16"}]}' > "$tmp/re.json"
expect 3 "rules[0].pattern '['" "$clocher" convert "$s260" "$tmp/x" --quant-manifest "$tmp/re.json"
expect 3 "not valid JSON" "$clocher" convert "$s260" "$tmp/x" --quant-manifest "$tmp/calib.txt"
expect 3 "/nonexistent.json" "$clocher" convert "$s260" "$tmp/x" --quant-manifest /nonexistent.json
expect 2 "need calibration data" "$clocher" convert "$s260" "$tmp/x" --gate-kld 0.1
expect 2 "--gate-top1 1.5" "$clocher" convert "$s260" "$tmp/x" --calib-ids "$tmp/calib.ids" --gate-top1 1.5
printf '1 2 three' > "$tmp/bad.ids"
expect 3 "'three' is not a token id" "$clocher" convert "$s260" "$tmp/x" --calib-ids "$tmp/bad.ids" --gate-top1 0.5
printf '1 2 600' > "$tmp/oov.ids"
expect 3 "outside the vocabulary" "$clocher" convert "$s260" "$tmp/x" --calib-ids "$tmp/oov.ids" --gate-top1 0.5
no_model "$tmp/x"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
