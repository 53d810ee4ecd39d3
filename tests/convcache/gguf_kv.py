#!/usr/bin/python3
"""gguf_kv.py — adds one string key to a GGUF v3 file (e.g. tokenizer.chat_template), keeping
every other key, the tensor table and the tensor bytes as they are: what llama.cpp's
gguf_new_metadata.py does, in the standard library only, from the GGUF specification (ggml
docs/gguf.md). `clocher synth --gguf` writes no chat template; the conversion cache tests need
a GGUF that carries one, as the downloads do.

    gguf_kv.py IN.gguf OUT.gguf KEY VALUE_FILE
"""
import struct
import sys

SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _string(b, o):
    (n,) = struct.unpack_from("<Q", b, o)
    return b[o + 8:o + 8 + n], o + 8 + n


def _value(b, o, t):
    if t in SIZES:
        return b[o:o + SIZES[t]], o + SIZES[t]
    if t == 8:
        return _string(b, o)
    if t == 9:
        et, n = struct.unpack_from("<IQ", b, o)
        o += 12
        for _ in range(n):
            _, o = _value(b, o, et)
        return None, o
    raise ValueError("unknown GGUF value type %d at %d" % (t, o))


def add_string_kv(src, dst, key, value):
    b = open(src, "rb").read()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", b, 0)
    if magic != b"GGUF" or version != 3:
        raise ValueError("%s: not a GGUF v3 file" % src)
    o, align = 24, 32
    for _ in range(n_kv):
        k, o = _string(b, o)
        (t,) = struct.unpack_from("<I", b, o)
        v, o = _value(b, o + 4, t)
        if k == key.encode():
            raise ValueError("%s: already has %s" % (src, key))
        if k == b"general.alignment":
            (align,) = struct.unpack("<I", v)
    kv_end = o
    for _ in range(n_tensors):
        _, o = _string(b, o)
        (nd,) = struct.unpack_from("<I", b, o)
        o += 4 + 8 * nd + 4 + 8
    infos_end = o
    data = (infos_end + align - 1) // align * align
    kb, vb = key.encode(), value.encode()
    new = struct.pack("<Q", len(kb)) + kb + struct.pack("<IQ", 8, len(vb)) + vb
    out = bytearray(struct.pack("<4sIQQ", b"GGUF", 3, n_tensors, n_kv + 1))
    out += b[24:kv_end] + new + b[kv_end:infos_end]
    out += b"\0" * ((-len(out)) % align)
    out += b[data:]
    with open(dst, "wb") as f:
        f.write(out)


if __name__ == "__main__":
    add_string_kv(sys.argv[1], sys.argv[2], sys.argv[3], open(sys.argv[4]).read())
