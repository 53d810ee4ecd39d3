#!/usr/bin/python3
"""gguf_quant_writer.py — an independent GGUF v3 writer with Q8_0 / Q4_0 quantization, so the
GGUF importer of `clocher convert` is tested on quantized files that our own C code did not
write (worker/formats/gguf.c's writer and client/offline/convert.c's quantizer are not used here).

Written from the public GGUF v3 specification (ggml docs/gguf.md) and llama.cpp's reference
block layouts and quantizers (ggml-quants.c quantize_row_q8_0_ref / quantize_row_q4_0_ref):
  Q8_0: 34 bytes per 32 elements: f16 d, int8 q[32]; d = amax / 127, q = roundf(x * (1/d));
  Q4_0: 18 bytes per 32 elements: f16 d, 16 bytes where byte j holds element j in its low
        nibble and element j + 16 in its high nibble; d = m / -8 with m the element of largest
        magnitude (sign kept, the first one on ties), q = min(15, (int8)(x * (1/d) + 8.5));
        value = (q - 8) * d.
The codes are computed from the f32 scale (llama.cpp's rule), then d is stored as f16 — unlike
client/offline/convert.c, which rounds d to f16 first — so a converter that re-quantized instead of
copying the blocks would be caught by a byte comparison. f32 arithmetic is emulated exactly:
a product, quotient or sum of two f32 values computed in double and rounded once to f32 equals
the f32 operation (53 >= 2 * 24 + 2 bits).

The metadata is what llama.cpp's convert script writes for a llama model (general.*, llama.*,
tokenizer.ggml.*); q/k rows stay in llama2.c's (= Meta's, = GGUF's) interleaved RoPE order,
which is the order convert_hf_to_gguf.py produces when it permutes Hugging Face weights.

Only the standard library (tests must not need numpy). Used as a module by
test_convert_gguf_quant.py, or from the command line:
  gguf_quant_writer.py CHECKPOINT OUT.gguf [f32|q8_0|q4_0|dequant-q8_0|dequant-q4_0]
CHECKPOINT is a llama2.c checkpoint with a shared classifier (stories260K.bin); dequant-X
writes f32 tensors holding exactly the values of X's blocks.
"""
import math
import struct
import sys
from array import array

GGML_F32, GGML_Q4_0, GGML_Q8_0 = 0, 2, 8
# llama_ftype values (general.file_type): ALL_F32, MOSTLY_Q4_0, MOSTLY_Q8_0
FILE_TYPE = {"f32": 0, "q4_0": 2, "q8_0": 7}
ALIGNMENT = 32
QK = 32

# GGUF value types
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9


def f32(values):
    """Rounds each double to the nearest f32 (array's C cast: round to nearest even)."""
    return array("f", values).tolist()


def f16_bytes(d):
    return struct.pack("<e", d)  # IEEE binary16, round to nearest even, as GGML_FP32_TO_FP16


def roundf(v):
    """C roundf: halves away from zero."""
    r = math.floor(abs(v) + 0.5)
    return -r if v < 0 else r


def quantize_q8_0(x):
    """x: f32 values, a multiple of 32. Returns the Q8_0 blocks (bytes)."""
    out = bytearray()
    for i in range(0, len(x), QK):
        blk = x[i:i + QK]
        amax = max(abs(v) for v in blk)
        d = f32([amax / 127.0])[0]
        idv = f32([1.0 / d])[0] if d else 0.0
        q = [int(roundf(v)) for v in f32([v * idv for v in blk])]
        out += f16_bytes(d) + struct.pack("<32b", *q)
    return bytes(out)


def quantize_q4_0(x):
    """x: f32 values, a multiple of 32. Returns the Q4_0 blocks (bytes)."""
    out = bytearray()
    for i in range(0, len(x), QK):
        blk = x[i:i + QK]
        amax, m = 0.0, 0.0
        for v in blk:
            if amax < abs(v):
                amax, m = abs(v), v
        d = f32([m / -8.0])[0]
        idv = f32([1.0 / d])[0] if d else 0.0
        scaled = f32([v * idv for v in blk])
        q = [min(15, int(v)) for v in f32([s + 8.5 for s in scaled])]  # int(): C's truncation
        out += f16_bytes(d) + bytes(q[j] | (q[j + 16] << 4) for j in range(16))
    return bytes(out)


def dequantize(ggml_type, blocks):
    """The f32 values a Q8_0 / Q4_0 block stream stands for."""
    vals = []
    if ggml_type == GGML_Q8_0:
        for i in range(0, len(blocks), 34):
            d = struct.unpack_from("<e", blocks, i)[0]
            vals += [d * q for q in struct.unpack_from("<32b", blocks, i + 2)]
    elif ggml_type == GGML_Q4_0:
        for i in range(0, len(blocks), 18):
            d = struct.unpack_from("<e", blocks, i)[0]
            nib = blocks[i + 2:i + 18]
            vals += [((b & 15) - 8) * d for b in nib] + [((b >> 4) - 8) * d for b in nib]
    else:
        raise ValueError(f"not a block type: {ggml_type}")
    return f32(vals)


def read_llama2c(path):
    """A llama2.c checkpoint → (hparams dict, [(gguf name, shape outermost first, f32 list)])."""
    raw = open(path, "rb").read()
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq = struct.unpack_from("<7i", raw)
    if vocab < 0:
        raise ValueError(f"{path}: only checkpoints with a shared classifier are handled")
    hd = dim // n_heads
    a = array("f")
    a.frombytes(raw[28:28 + (len(raw) - 28) // 4 * 4])
    if sys.byteorder != "little":
        a.byteswap()
    pos = [0]

    def take(*shape):
        n = math.prod(shape)
        if pos[0] + n > len(a):
            raise ValueError(f"{path}: truncated")
        r = a[pos[0]:pos[0] + n].tolist()
        pos[0] += n
        return r

    def per_layer(rows, cols):
        whole = take(n_layers, rows, cols)
        return [whole[l * rows * cols:(l + 1) * rows * cols] for l in range(n_layers)]

    emb = take(vocab, dim)
    rms_att = per_layer(1, dim)
    wq, wk = per_layer(dim, dim), per_layer(n_kv * hd, dim)
    wv, wo = per_layer(n_kv * hd, dim), per_layer(dim, dim)
    rms_ffn = per_layer(1, dim)
    w1, w2, w3 = per_layer(hidden, dim), per_layer(dim, hidden), per_layer(hidden, dim)
    rms_final = take(dim)
    hp = dict(dim=dim, hidden=hidden, n_layers=n_layers, n_heads=n_heads, n_kv=n_kv,
              vocab=vocab, seq=seq, head_dim=hd)
    # llama.cpp's order: token_embd, then each block, then output_norm (tied: no output)
    t = [("token_embd.weight", [vocab, dim], emb)]
    for l in range(n_layers):
        b = f"blk.{l}."
        t += [(b + "attn_norm.weight", [dim], rms_att[l]),
              (b + "attn_q.weight", [dim, dim], wq[l]),
              (b + "attn_k.weight", [n_kv * hd, dim], wk[l]),
              (b + "attn_v.weight", [n_kv * hd, dim], wv[l]),
              (b + "attn_output.weight", [dim, dim], wo[l]),
              (b + "ffn_norm.weight", [dim], rms_ffn[l]),
              (b + "ffn_gate.weight", [hidden, dim], w1[l]),
              (b + "ffn_down.weight", [dim, hidden], w2[l]),
              (b + "ffn_up.weight", [hidden, dim], w3[l])]
    t.append(("output_norm.weight", [dim], rms_final))
    return hp, t


def vocabulary(n):
    """A SentencePiece-style vocabulary of n tokens as llama.cpp writes one: <unk>, <s>, </s>,
    the 256 byte tokens, then pieces (stories260K's own 512-token tokenizer is not available,
    so the pieces are made up; prompts in the tests are token ids)."""
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # UNKNOWN, CONTROL, BYTE
    letters = "etaonihsrdlucmwfgypbvkjxqz"
    cands = ["\u2581"] + ["\u2581" + c for c in letters] + list(letters) + \
        ["\u2581" + a + b for a in letters for b in letters]
    for p in cands:
        if len(toks) >= n:
            break
        toks.append(p)
        types.append(1)  # NORMAL
    toks, types = toks[:n], types[:n]
    scores = [0.0] * 259 + [-float(i) for i in range(len(toks) - 259)]
    return toks, scores[:len(toks)], types


def llama_metadata(hp, file_type, name="stories260K"):
    """[(key, gguf type, value)] in the order llama.cpp's convert script writes them."""
    toks, scores, types = vocabulary(hp["vocab"])
    return [
        ("general.architecture", T_STRING, "llama"),
        ("general.name", T_STRING, name),
        ("general.alignment", T_UINT32, ALIGNMENT),
        ("llama.block_count", T_UINT32, hp["n_layers"]),
        ("llama.context_length", T_UINT32, hp["seq"]),
        ("llama.embedding_length", T_UINT32, hp["dim"]),
        ("llama.feed_forward_length", T_UINT32, hp["hidden"]),
        ("llama.attention.head_count", T_UINT32, hp["n_heads"]),
        ("llama.attention.head_count_kv", T_UINT32, hp["n_kv"]),
        ("llama.rope.freq_base", T_FLOAT32, 10000.0),
        ("llama.attention.layer_norm_rms_epsilon", T_FLOAT32, 1e-5),
        ("general.file_type", T_UINT32, FILE_TYPE[file_type]),
        ("llama.vocab_size", T_UINT32, hp["vocab"]),
        ("llama.rope.dimension_count", T_UINT32, hp["head_dim"]),
        ("tokenizer.ggml.model", T_STRING, "llama"),
        ("tokenizer.ggml.pre", T_STRING, "default"),
        ("tokenizer.ggml.tokens", (T_ARRAY, T_STRING), toks),
        ("tokenizer.ggml.scores", (T_ARRAY, T_FLOAT32), scores),
        ("tokenizer.ggml.token_type", (T_ARRAY, T_INT32), types),
        ("tokenizer.ggml.bos_token_id", T_UINT32, 1),
        ("tokenizer.ggml.eos_token_id", T_UINT32, 2),
        ("tokenizer.ggml.unknown_token_id", T_UINT32, 0),
        ("tokenizer.ggml.add_bos_token", T_BOOL, True),
        ("tokenizer.ggml.add_eos_token", T_BOOL, False),
        ("general.quantization_version", T_UINT32, 2),
    ]


def gstr(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


SCALAR = {T_UINT32: "<I", T_INT32: "<i", T_FLOAT32: "<f", T_BOOL: "<?"}


def value(t, v):
    if t == T_STRING:
        return gstr(v)
    return struct.pack(SCALAR[t], v)


def write_gguf(path, kvs, tensors):
    """kvs: [(key, type or (T_ARRAY, elem type), value)]; tensors: [(name, ggml type, shape
    outermost first, data bytes)]. Each tensor's offset is the previous one's end rounded up
    to ALIGNMENT; the data is written as given (a test may pass a wrong length on purpose)."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for key, t, v in kvs:
        out += gstr(key)
        if isinstance(t, tuple):
            out += struct.pack("<IIQ", T_ARRAY, t[1], len(v))
            out += b"".join(value(t[1], e) for e in v)
        else:
            out += struct.pack("<I", t) + value(t, v)
    data = bytearray()
    for name, gtype, shape, blob in tensors:
        ne = list(reversed(shape))  # GGUF lists dimensions innermost first
        out += gstr(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        out += struct.pack("<IQ", gtype, len(data))
        data += blob + bytes(-len(blob) % ALIGNMENT)
    out += bytes(-len(out) % ALIGNMENT)
    with open(path, "wb") as f:
        f.write(out + data)


def quantized_tensors(tensors, qtype):
    """llama2.c tensors → [(name, ggml type, shape, bytes)]: 2-D tensors whose rows are whole
    32-element blocks in qtype (f32, q8_0, q4_0), the others (norms; stories260K's 172-wide
    ffn_down) f32, as llama.cpp's quantizer keeps what its block does not fit."""
    out = []
    for name, shape, vals in tensors:
        if qtype != "f32" and len(shape) == 2 and shape[-1] % QK == 0:
            if qtype == "q8_0":
                out.append((name, GGML_Q8_0, shape, quantize_q8_0(vals)))
            else:
                out.append((name, GGML_Q4_0, shape, quantize_q4_0(vals)))
        else:
            out.append((name, GGML_F32, shape, array("f", vals).tobytes()))
    return out


def dequantized(qtensors):
    """The same tensors as f32 holding the blocks' exact values."""
    return [(n, GGML_F32, s, d if t == GGML_F32 else array("f", dequantize(t, d)).tobytes())
            for n, t, s, d in qtensors]


def main(argv):
    kinds = ("f32", "q8_0", "q4_0", "dequant-q8_0", "dequant-q4_0")
    if len(argv) != 4 or argv[3] not in kinds:
        print(f"usage: gguf_quant_writer.py CHECKPOINT OUT.gguf [{'|'.join(kinds)}]",
              file=sys.stderr)
        return 2
    hp, t = read_llama2c(argv[1])
    q = argv[3].replace("dequant-", "")
    qt = quantized_tensors(t, q)
    if argv[3].startswith("dequant-"):
        qt, q = dequantized(qt), "f32"
    write_gguf(argv[2], llama_metadata(hp, q), qt)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
