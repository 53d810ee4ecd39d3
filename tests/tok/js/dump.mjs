// dump.mjs — the reference side of tests/tok/test_tiktoken.py: js-tiktoken (npm, pinned in
// package.json) writes the o200k_base and cl100k_base ranks it bundles as tiktoken rank files
// (base64 token, space, rank per line) and the ids it gives for each case of the corpus.
// Usage: node dump.mjs OUTDIR CORPUS   (cases in CORPUS are separated by lines "@@@@")
import { Tiktoken } from "js-tiktoken/lite";
import o200k from "js-tiktoken/ranks/o200k_base";
import cl100k from "js-tiktoken/ranks/cl100k_base";
import fs from "node:fs";
import path from "node:path";

const [, , outdir, corpusPath] = process.argv;
const corpus = fs.readFileSync(corpusPath, "utf8");
const cases = corpus.split("\n@@@@\n");
// special tokens, allowed: o200k_base's two keep their ids in o200k_harmony
const specials = ["a<|endoftext|>b", "<|endofprompt|><|endoftext|> x"];

const out = { cases };
for (const [name, ranks] of [["o200k_base", o200k], ["cl100k_base", cl100k]]) {
  // bpe_ranks: lines "<marker> <first rank> <base64 token> <base64 token> ..."
  const lines = [];
  for (const line of ranks.bpe_ranks.split("\n")) {
    if (!line) continue;
    const [, offsetStr, ...tokens] = line.split(" ");
    const offset = Number.parseInt(offsetStr, 10);
    tokens.forEach((tok, i) => lines.push(`${tok} ${offset + i}`));
  }
  fs.writeFileSync(path.join(outdir, `${name}.tiktoken`), lines.join("\n") + "\n");
  const enc = new Tiktoken(ranks);
  out[name] = {
    n_ranks: lines.length,
    pat_str: ranks.pat_str,
    special_tokens: ranks.special_tokens,
    // text that spells a special token is plain text here (nothing disallowed, nothing allowed)
    cases: cases.map((c) => enc.encode(c, [], [])),
    whole: enc.encode(corpus, [], []),
    specials: specials.map((s) => ({ text: s, ids: enc.encode(s, "all") })),
  };
}
fs.writeFileSync(path.join(outdir, "expected.json"), JSON.stringify(out));
