#!/usr/bin/env python3
"""gen_format_seeds.py — writes the seed corpora for fuzz_gguf and fuzz_safetensors.

Run from anywhere: python3 tests/fuzz/gen_format_seeds.py. The seeds are committed; this
script documents how they were made and regenerates them. Each seed is small (a few KB) and
covers one feature of the format (every value type, every tensor type, alignment, sharding
metadata...) plus a few near-misses, so the fuzzer starts from deep inside the parsers.
Only the standard library is used; nothing here runs at build or test time.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------------------------------------
# GGUF

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "B",
              U64: "Q", I64: "q", F64: "d"}
# ggml type: (block elements, block bytes)
GGML = {0: (1, 4), 1: (1, 2), 2: (32, 18), 8: (32, 34), 30: (1, 2), 12: (256, 144),
        39: (32, 17)}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gvalue(t, v):
    if t == STR:
        return gstr(v)
    if t == ARR:
        at, items = v
        return struct.pack("<IQ", at, len(items)) + b"".join(gvalue(at, x) for x in items)
    return struct.pack("<" + SCALAR_FMT[t], v)


def gguf(kvs, tensors, version=3, alignment=32, block_bytes=None):
    """kvs: [(key, type, value)]; tensors: [(name, ne, ggml_type)] laid out in order.
    block_bytes {ggml_type: bytes} lays tensors out with a wrong block size (malformed)."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += gstr(k) + struct.pack("<I", t) + gvalue(t, v)
    off, blobs = 0, []
    for name, ne, typ in tensors:
        blk, bb = GGML[typ]
        bb = (block_bytes or {}).get(typ, bb)
        n = 1
        for d in ne[1:]:
            n *= d
        size = ne[0] // blk * bb * n
        off = (off + alignment - 1) // alignment * alignment
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", typ, off)
        blobs.append((off, bytes((i * 37 + len(name)) & 0xFF for i in range(size))))
        off += size
    out += b"\0" * (-len(out) % alignment)
    data = bytearray(off)
    for o, b in blobs:
        data[o:o + len(b)] = b
    return out + bytes(data)


def gguf_seeds():
    tok = ["<unk>", "<s>", "</s>", "<0x0A>", "\u2581The", "\u2581a", "", "\u7ed9"]
    llama_kvs = [
        ("general.architecture", STR, "llama"),
        ("general.name", STR, "seed"),
        ("llama.block_count", U32, 2),
        ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        ("tokenizer.ggml.model", STR, "llama"),
        ("tokenizer.ggml.tokens", ARR, (STR, tok)),
        ("tokenizer.ggml.scores", ARR, (F32, [float(-i) for i in range(len(tok))])),
        ("tokenizer.ggml.token_type", ARR, (I32, [2, 3, 3, 6, 1, 1, 1, 1])),
        ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.add_bos_token", BOOL, 1),
    ]
    every_type = [
        ("u8", U8, 200), ("i8", I8, -3), ("u16", U16, 65535), ("i16", I16, -300),
        ("u32", U32, 7), ("i32", I32, -7), ("f32", F32, 0.5), ("bool", BOOL, 0),
        ("str", STR, "text"), ("u64", U64, 1 << 40), ("i64", I64, -(1 << 40)),
        ("f64", F64, 2.5),
    ] + [("arr." + str(t), ARR, (t, [1, 0, 1])) for t in (U8, I8, U16, I16, U32, I32, BOOL, U64,
                                                            I64)] + [
        ("arr.f32", ARR, (F32, [1.0, -2.0])), ("arr.f64", ARR, (F64, [3.0])),
        ("arr.str", ARR, (STR, ["a", "bc", ""])), ("arr.empty", ARR, (U8, [])),
    ]
    tensors = [
        ("token_embd.weight", [8, 4], 0),
        ("blk.0.attn_norm.weight", [8], 1),
        ("blk.0.attn_q.weight", [4, 2, 2], 30),
        ("blk.0.ffn_up.weight", [32, 2], 8),
        ("blk.0.ffn_down.weight", [32, 1, 1, 2], 2),
        ("blk.0.ffn_gate.weight", [256], 12),
    ]
    seeds = {
        "tokenizer.gguf": gguf(llama_kvs, []),
        "every_value_type.gguf": gguf(every_type, []),
        "every_tensor_type.gguf": gguf([("general.architecture", STR, "llama")], tensors),
        "align64.gguf": gguf([("general.alignment", U32, 64)], tensors[:3], alignment=64),
        "v2.gguf": gguf(llama_kvs[:3], tensors[:2], version=2),
        "empty.gguf": gguf([], []),
        "one_tensor.gguf": gguf([], [("t", [4], 0)]),
    }
    bad = bytearray(seeds["every_tensor_type.gguf"])
    bad[4:8] = struct.pack("<I", 1)
    seeds["v1.gguf"] = bytes(bad)
    seeds["dup_key.gguf"] = gguf([("k", U32, 1), ("k", U32, 2)], [])
    seeds["nested_array.gguf"] = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gstr("n") +
                                  struct.pack("<IIQIQB", ARR, ARR, 1, U8, 1, 0))
    # Q4_0 written with 16-byte blocks (the scale left out): the next tensor starts inside it
    seeds["q4_0_short_blocks.gguf"] = gguf([], [("blk.0.attn_q.weight", [64, 1], 2),
                                                 ("blk.0.attn_k.weight", [8], 0)],
                                           block_bytes={2: 16})
    # gpt-oss (llama.cpp's keys and names): MXFP4 experts [E=2][rows 2][64], biases, sinks
    gpt_oss_kvs = [
        ("general.architecture", STR, "gpt-oss"),
        ("gpt-oss.block_count", U32, 1),
        ("gpt-oss.expert_count", U32, 2),
        ("gpt-oss.expert_used_count", U32, 1),
        ("gpt-oss.attention.sliding_window", U32, 4),
        ("gpt-oss.rope.scaling.type", STR, "yarn"),
        ("gpt-oss.rope.scaling.factor", F32, 32.0),
        ("gpt-oss.rope.scaling.original_context_length", U32, 4096),
        ("gpt-oss.rope.scaling.yarn_beta_fast", F32, 32.0),
        ("gpt-oss.rope.scaling.yarn_beta_slow", F32, 1.0),
    ]
    seeds["gpt_oss_mxfp4.gguf"] = gguf(gpt_oss_kvs, [
        ("blk.0.ffn_gate_exps.weight", [64, 2, 2], 39),
        ("blk.0.ffn_gate_exps.bias", [2, 2], 0),
        ("blk.0.attn_sinks.weight", [4], 0),
    ])
    return seeds


# ---------------------------------------------------------------------------------------------
# safetensors

ST = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
      "BOOL": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def safetensors(tensors, metadata=None, pad_to=8):
    """tensors: [(name, dtype, shape)] laid out contiguously in order."""
    hdr, off, data = {}, 0, b""
    if metadata is not None:
        hdr["__metadata__"] = metadata
    for name, dt, shape in tensors:
        n = ST[dt]
        for d in shape:
            n *= d
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        data += bytes((i * 11 + len(name)) & 0xFF for i in range(n))
        off += n
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-(8 + len(h)) % pad_to)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    every = [("t." + dt.lower(), dt, [2, 3]) for dt in ST]
    seeds = {
        "every_dtype.safetensors": safetensors(every, {"format": "pt"}),
        # gpt-oss's MXFP4 experts: U8 blocks [E][rows][nb][16] and scales [E][rows][nb]
        "gpt_oss_mxfp4.safetensors": safetensors([
            ("model.layers.0.mlp.experts.gate_up_proj_blocks", "U8", [2, 4, 2, 16]),
            ("model.layers.0.mlp.experts.gate_up_proj_scales", "U8", [2, 4, 2]),
            ("model.layers.0.mlp.experts.gate_up_proj_bias", "BF16", [2, 4]),
            ("model.layers.0.self_attn.sinks", "BF16", [4]),
        ], {"format": "pt"}),
        "llama.safetensors": safetensors([
            ("model.embed_tokens.weight", "BF16", [16, 8]),
            ("model.layers.0.self_attn.q_proj.weight", "BF16", [8, 8]),
            ("model.norm.weight", "F32", [8]),
        ], {"format": "pt", "note": "seed"}),
        "scalar_and_empty.safetensors": safetensors([
            ("scalar", "F32", []), ("empty", "F16", [0, 4]), ("after", "I8", [3]),
        ]),
        "empty.safetensors": safetensors([]),
        "unicode.safetensors": safetensors([("w\u00e9ight.\u2581", "U8", [5])]),
    }
    raw = safetensors([("a", "F32", [2])])
    seeds["overlap.safetensors"] = raw.replace(b"[0,8]", b"[0,9]")
    h = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{}}'
    seeds["dup_name.safetensors"] = struct.pack("<Q", len(h)) + h + b"\0" * 8
    return seeds


def write(dirname, seeds):
    d = os.path.join(HERE, "corpus", dirname)
    os.makedirs(d, exist_ok=True)
    for name, blob in seeds.items():
        assert len(blob) < 8192, name
        with open(os.path.join(d, name), "wb") as f:
            f.write(blob)


if __name__ == "__main__":
    write("gguf", gguf_seeds())
    write("safetensors", safetensors_seeds())
