#!/usr/bin/env python3
"""gen_tok_seeds.py — writes the seed corpora for fuzz_tok_load and fuzz_tok_encode.

Run from anywhere: python3 tests/fuzz/gen_tok_seeds.py. The seeds are committed; this script
documents how they were made and regenerates them. Only the standard library is used (and the
GGUF writer of gen_format_seeds.py); nothing here runs at build or test time.

fuzz_tok_load seeds: a selector byte (0 GGUF, 1 tokenizer.model, 2 tokenizer.json,
3 tokenizer.bin, 4 tokenizer.ie.json) then a small but complete tokenizer of that format, of
both kinds where the format has both, plus a few near misses.
fuzz_tok_encode seeds: a selector byte (bit 0: byte-level BPE, bit 1: ids instead of text)
then text in several scripts, emoji, whitespace runs and contractions, or little-endian ids.
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_format_seeds import ARR, BOOL, F32, I32, STR, U32, gguf  # noqa: E402

SP = "\u2581"
GGUF, MODEL, HFJSON, BIN, IEJSON = range(5)


def gpt2_chars():
    """GPT-2's byte -> character table."""
    self_bytes = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
    out, k = {}, 0
    for b in range(256):
        if b in self_bytes:
            out[b] = chr(b)
        else:
            out[b] = chr(0x100 + k)
            k += 1
    return [out[b] for b in range(256)]


# A small SentencePiece vocabulary: (piece, score, type) with SentencePiece's type numbers.
SPM = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3), (SP, -10.0, 1), ("a", -11.0, 1),
       ("b", -12.0, 1), ("e", -13.0, 1), (SP + "a", -1.0, 1), ("ab", -2.0, 1),
       (SP + "ab", -3.0, 1), ("<u>", 0.0, 4)] + [("<0x%02X>" % b, 0.0, 6) for b in range(256)]

BYTES = gpt2_chars()
BPE_EXTRA = ["\u0120a", "ab", "\u0120ab"]
BPE_MERGES = [("\u0120", "a"), ("a", "b"), ("\u0120a", "b")]
BPE = BYTES + BPE_EXTRA + ["<|endoftext|>"]


def varint(v):
    out = b""
    v &= (1 << 64) - 1
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num, wire, payload):
    key = varint(num << 3 | wire)
    if wire == 0:
        return key + varint(payload)
    if wire == 5:
        return key + struct.pack("<f", payload)
    return key + varint(len(payload)) + payload


def spm_model(model_type=2):
    out = b""
    for piece, score, typ in SPM:
        p = field(1, 2, piece.encode()) + field(2, 5, score)
        if typ != 1:
            p += field(3, 0, typ)
        out += field(1, 2, p)
    trainer = field(3, 0, model_type) + field(35, 0, 1) + field(40, 0, 0) + field(41, 0, 1) + \
        field(42, 0, 2)
    normalizer = field(1, 2, b"identity") + field(3, 0, 1) + field(4, 0, 0)
    return out + field(2, 2, trainer) + field(3, 2, normalizer)


def llama2c_bin():
    out = struct.pack("<i", 16)
    for i, (piece, score, _) in enumerate(SPM):
        s = {1: "\n<s>\n", 2: "\n</s>\n"}.get(i, piece).replace(SP, " ").encode()
        out += struct.pack("<fi", score, len(s)) + s
    return out


def gguf_spm():
    return gguf([("general.architecture", STR, "llama"),
                 ("tokenizer.ggml.model", STR, "llama"),
                 ("tokenizer.ggml.tokens", ARR, (STR, [p for p, _, _ in SPM])),
                 ("tokenizer.ggml.scores", ARR, (F32, [s for _, s, _ in SPM])),
                 ("tokenizer.ggml.token_type", ARR, (I32, [t for _, _, t in SPM])),
                 ("tokenizer.ggml.bos_token_id", U32, 1),
                 ("tokenizer.ggml.eos_token_id", U32, 2),
                 ("tokenizer.ggml.unknown_token_id", U32, 0),
                 ("tokenizer.ggml.add_bos_token", BOOL, 1)], [])


def gguf_bpe(pre="gpt-2"):
    return gguf([("general.architecture", STR, "gpt2"),
                 ("tokenizer.ggml.model", STR, "gpt2"),
                 ("tokenizer.ggml.pre", STR, pre),
                 ("tokenizer.ggml.tokens", ARR, (STR, BPE)),
                 ("tokenizer.ggml.token_type", ARR, (I32, [1] * (len(BPE) - 1) + [3])),
                 ("tokenizer.ggml.merges", ARR, (STR, ["%s %s" % m for m in BPE_MERGES])),
                 ("tokenizer.ggml.bos_token_id", U32, len(BPE) - 1),
                 ("tokenizer.ggml.eos_token_id", U32, len(BPE) - 1)], [])


def hf_spm(metaspace):
    vocab = {p: i for i, (p, _, _) in enumerate(SPM)}
    merges = [[SP, "a"], ["a", "b"], [SP + "a", "b"]]
    doc = {"version": "1.0",
           "added_tokens": [{"id": i, "content": p, "special": t == 3 or t == 2}
                            for i, (p, _, t) in enumerate(SPM) if t in (2, 3, 4)],
           "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True,
                     "vocab": vocab,
                     "merges": merges if metaspace else [" ".join(m) for m in merges]}}
    if metaspace:
        doc["normalizer"] = None
        doc["pre_tokenizer"] = {"type": "Metaspace", "replacement": SP,
                                "prepend_scheme": "first", "split": False}
    else:
        doc["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": SP},
            {"type": "Replace", "pattern": {"String": " "}, "content": SP}]}
        doc["pre_tokenizer"] = None
    return json.dumps(doc, ensure_ascii=False).encode()


def hf_bpe():
    doc = {"version": "1.0",
           "added_tokens": [{"id": len(BPE) - 1, "content": "<|endoftext|>", "special": True}],
           "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
           "model": {"type": "BPE", "unk_token": None,
                     "vocab": {p: i for i, p in enumerate(BPE)},
                     "merges": ["%s %s" % m for m in BPE_MERGES]}}
    return json.dumps(doc, ensure_ascii=False).encode()


def ie_spm():
    doc = {"format": "clocher-tokenizer", "version": 1, "kind": "spm", "bos": 1, "eos": 2,
           "unk": 0, "add_bos": True, "add_dummy_prefix": True,
           "remove_extra_whitespaces": False, "byte_fallback": True,
           "tokens": [p for p, _, _ in SPM],
           "types": [["", "normal", "unknown", "control", "user_defined", "unused", "byte"][t]
                     for _, _, t in SPM],
           "scores": [s for _, s, _ in SPM]}
    return json.dumps(doc, ensure_ascii=False).encode()


def ie_bpe():
    ids = {p: i for i, p in enumerate(BPE)}
    doc = {"format": "clocher-tokenizer", "version": 1, "kind": "bpe", "bos": len(BPE) - 1,
           "eos": len(BPE) - 1, "unk": None, "add_bos": False, "pre_tokenizer": "gpt2",
           "tokens": BPE, "types": ["normal"] * (len(BPE) - 1) + ["control"],
           "merges": [[ids[a], ids[b]] for a, b in BPE_MERGES]}
    return json.dumps(doc, ensure_ascii=False).encode()


def load_seeds():
    model = spm_model()
    return {
        "gguf_spm": bytes([GGUF]) + gguf_spm(),
        "gguf_bpe": bytes([GGUF]) + gguf_bpe(),
        "gguf_bpe_llama3_pre": bytes([GGUF]) + gguf_bpe("llama-bpe"),
        "gguf_no_tokenizer": bytes([GGUF]) + gguf([("general.architecture", STR, "llama")], []),
        "model_bpe": bytes([MODEL]) + model,
        "model_unigram": bytes([MODEL]) + spm_model(model_type=1),
        "model_truncated": bytes([MODEL]) + model[:len(model) // 2],
        "hf_llama_legacy": bytes([HFJSON]) + hf_spm(False),
        "hf_llama_metaspace": bytes([HFJSON]) + hf_spm(True),
        "hf_gpt2": bytes([HFJSON]) + hf_bpe(),
        "bin": bytes([BIN]) + llama2c_bin(),
        "bin_truncated": bytes([BIN]) + llama2c_bin()[:-3],
        "ie_spm": bytes([IEJSON]) + ie_spm(),
        "ie_bpe": bytes([IEJSON]) + ie_bpe(),
    }


TEXTS = [
    "Hello world",
    " Hello World!",
    "  two  spaces \t tab\n\nnewlines   ",
    "it's I'll we'Ve 'RE you're",
    "3 33 333 3.14 1,000,000",
    "F\u00fchrer \u00e9t\u00e9 na\u00efve \u00bd",
    "\u0440\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442",
    "\u6211\u60f3\u5728apple\u5de5\u4f5c",
    "\u1780\u17b6\u1793\u17cb\u178f\u17c2",
    "\U0001f680 \U0001f636\u200d\U0001f32b\ufe0f \u2705 \U0001f999\U0001f999",
    "<x> <s> </s> <|endoftext|> <|user|> <u>",
    SP + "already escaped" + SP,
    "",
]


def encode_seeds():
    seeds = {}
    for i, t in enumerate(TEXTS):
        b = t.encode()
        seeds["spm_text_%02d" % i] = bytes([0]) + b
        seeds["bpe_text_%02d" % i] = bytes([1]) + b
    seeds["spm_invalid_utf8"] = bytes([0]) + b"ok \xc3( \xed\xa0\x80 \xf4\x90\x80\x80"
    seeds["bpe_invalid_utf8"] = bytes([1]) + b"\x80\xff\xe2\x82"
    # ids: bytes tokens that split characters, control tokens, text tokens
    spm_ids = [1, 7, 3 + 11 + 0xF0, 3 + 11 + 0x9F, 3 + 11 + 0xA6, 3 + 11 + 0x99, 2, 4, 3 + 11 + 0xE2]
    seeds["spm_ids"] = bytes([2]) + b"".join(struct.pack("<H", i) for i in spm_ids)
    bpe_ids = [0xF0, 0x9F, 0x98, 0x81, 256, 258, 0xE2, 0x82]
    seeds["bpe_ids"] = bytes([3]) + b"".join(struct.pack("<H", i) for i in bpe_ids)
    return seeds


def write(dirname, seeds):
    d = os.path.join(HERE, "corpus", dirname)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    print("wrote %d seeds to %s" % (len(seeds), d))


if __name__ == "__main__":
    write("tok_load", load_seeds())
    write("tok_encode", encode_seeds())
