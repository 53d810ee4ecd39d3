#!/usr/bin/env python3
"""gen_llama2c_seeds.py — writes the seed corpus of fuzz_llama2c (tests/fuzz/corpus/llama2c).

Run from anywhere: python3 tests/fuzz/gen_llama2c_seeds.py. The seeds are committed; this
script documents how they were made. Valid tiny checkpoints (tied and untied classifier, GQA
and MHA) plus near-misses (truncated, trailing bytes, zero and negative fields, dim not a
multiple of n_heads, a header implying an overflowing size). Standard library only.
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "llama2c")


def n_floats(dim, hidden, layers, heads, kv_heads, vocab, seq):
    hs = dim // heads
    kv = hs * kv_heads
    v = abs(vocab)
    n = v * dim + layers * dim                       # embedding, rms_att
    n += layers * (dim * dim + 2 * kv * dim + dim * dim)  # wq wk wv wo
    n += layers * dim + 3 * layers * hidden * dim    # rms_ffn, w1 w2 w3
    n += dim + seq * hs                              # rms_final, freq_cis real + imag
    if vocab < 0:
        n += v * dim                                 # wcls
    return n


def checkpoint(h, nf=None, seed=1):
    if nf is None:
        nf = n_floats(*h)
    vals = [((i * 2654435761 + seed) % 1000) / 1000.0 - 0.5 for i in range(nf)]
    return struct.pack("<7i", *h) + struct.pack("<%df" % nf, *vals)


def main():
    os.makedirs(OUT, exist_ok=True)
    seeds = {
        "tied_gqa": checkpoint((8, 16, 1, 2, 1, 16, 4)),
        "untied_mha": checkpoint((8, 12, 2, 2, 2, -12, 3)),
        "one_head": checkpoint((4, 4, 1, 1, 1, 5, 2)),
    }
    ok = seeds["tied_gqa"]
    seeds["truncated"] = ok[:-4]
    seeds["trailing"] = ok + b"\0\0\0\0"
    seeds["header_only"] = ok[:28]
    seeds["short_header"] = ok[:20]
    seeds["zero_dim"] = struct.pack("<7i", 0, 16, 1, 2, 1, 16, 4)
    seeds["neg_layers"] = struct.pack("<7i", 8, 16, -1, 2, 1, 16, 4)
    seeds["dim_not_heads"] = struct.pack("<7i", 9, 16, 1, 2, 1, 16, 4) + b"\0" * 64
    seeds["kv_not_divisor"] = struct.pack("<7i", 12, 16, 1, 3, 2, 16, 4) + b"\0" * 64
    seeds["huge"] = struct.pack("<7i", 2**30, 2**30, 2**30, 2**15, 2**15, -(2**31 - 1), 2**30)
    for name, data in seeds.items():
        with open(os.path.join(OUT, name + ".bin"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
