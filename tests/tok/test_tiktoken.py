#!/usr/bin/env python3
"""test_tiktoken.py — acceptance 3 of issue 13 (and the js-tiktoken half of issue 17's):
our o200k_harmony and cl100k_base tokenizers give exactly js-tiktoken's ids on a
multilingual corpus, through every way they load.

Steps (everything written under the build directory, never the source tree):
  1. npm ci (or npm install) of tests/tok/js/package.json (js-tiktoken, pinned) into
     BUILD/tok-js; without npm or the registry the test is skipped (exit 77, ctest's
     SKIP_RETURN_CODE);
  2. node dump.mjs: js-tiktoken writes its bundled o200k_base and cl100k_base ranks as
     tiktoken rank files and the ids of each corpus case;
  3. from the same rank files, a Hugging Face tokenizer.json each, made the way transformers'
     tiktoken converter does (vocab by rank in GPT-2's byte-level characters; merges = every
     split of a token into two tokens, ordered by the rank of the result, then of the sides;
     pre_tokenizer Split(regex, Isolated) + ByteLevel(use_regex false); ignore_merges);
  4. test_tok_tiktoken (C) loads .tiktoken, tokenizer.json, GGUF and tokenizer.ie.json and
     compares every id.
Usage: test_tiktoken.py BUILD_DIR JS_SOURCE_DIR CORPUS TEST_BINARY
"""
import base64
import json
import os
import shutil
import subprocess
import sys

SKIP = 77

# tiktoken's pat_str of each encoding (the spec's §5 for o200k); the js package carries a
# JavaScript rewrite of the same, which the C side need not understand
O200K_PAT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CL100K_PAT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
HARMONY = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>",
           200003: "<|constrain|>", 200005: "<|channel|>", 200006: "<|start|>",
           200007: "<|end|>", 200008: "<|message|>", 200012: "<|call|>",
           200018: "<|endofprompt|>"}
CL100K = {100257: "<|endoftext|>", 100258: "<|fim_prefix|>", 100259: "<|fim_middle|>",
          100260: "<|fim_suffix|>", 100276: "<|endofprompt|>"}


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(SKIP)


def bytes_to_unicode():
    """GPT-2's byte -> character table."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
          + list(range(ord("\xae"), ord("\xff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def hf_json(ranks_path, pat, specials, vocab_size, out_path):
    ranks = {}
    with open(ranks_path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    enc = bytes_to_unicode()
    spell = lambda b: "".join(enc[x] for x in b)
    vocab = {spell(b): r for b, r in ranks.items()}
    merges = []
    for b, r in ranks.items():
        local = [(ranks[b[:i]], ranks[b[i:]], b[:i], b[i:]) for i in range(1, len(b))
                 if b[:i] in ranks and b[i:] in ranks]
        merges.extend((r, lr, rr, l, rt) for lr, rr, l, rt in local)
    merges.sort()
    added = []
    for i in range(len(ranks), vocab_size):
        added.append({"id": i, "content": specials.get(i, f"<|reserved_{i}|>"),
                      "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
    doc = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pat}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab,
                  "merges": [[spell(l), spell(rt)] for _, _, _, l, rt in merges]},
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)


def main():
    build, js_src, corpus, binary = sys.argv[1:5]
    npm = shutil.which("npm")
    node = shutil.which("node")
    if not npm or not node:
        skip("npm or node is not installed")
    work = os.path.join(build, "tok-js")
    os.makedirs(work, exist_ok=True)
    for f in ("package.json", "package-lock.json", "dump.mjs"):
        shutil.copyfile(os.path.join(js_src, f), os.path.join(work, f))
    if not os.path.isdir(os.path.join(work, "node_modules", "js-tiktoken")):
        try:
            r = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=work,
                               capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            skip("npm ci timed out (no network to the npm registry?)")
        if r.returncode != 0:
            skip(f"npm ci failed (no network to the npm registry?): {r.stderr[-400:]}")
    r = subprocess.run([node, "dump.mjs", work, os.path.abspath(corpus)], cwd=work,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        print("FAIL: js-tiktoken's dump failed")
        return 1
    hf_json(os.path.join(work, "o200k_base.tiktoken"), O200K_PAT, HARMONY, 201088,
            os.path.join(work, "o200k_base.json"))
    hf_json(os.path.join(work, "cl100k_base.tiktoken"), CL100K_PAT, CL100K, 100277,
            os.path.join(work, "cl100k_base.json"))
    r = subprocess.run([binary, work], timeout=1200)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
