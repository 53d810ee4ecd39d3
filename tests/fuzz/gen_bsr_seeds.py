#!/usr/bin/env python3
"""gen_bsr_seeds.py — writes the seed corpus for fuzz_bsr (tests/fuzz/corpus/bsr/).

Run from anywhere: python3 tests/fuzz/gen_bsr_seeds.py. The seeds are committed; this script
documents how they were made and regenerates them. It packs files from docs/BSR.md
independently of worker/formats/bsr.c, so the seeds also cross-check the documented layout: valid
matrices (ragged edges in both directions, empty block rows, no blocks at all, 1x1 blocks)
and near-misses that each break one rule. Only the standard library is used.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "bsr")


def bsr(rows, cols, br, bc, blocks, magic=b"CLOCHBSR", version=1, dtype=0, reserved=0,
        nnzb=None, row_ptr=None, trailing=b"", pad_byte=0):
    """blocks: {(block_row, block_col): function(i, j) -> float} (inside the matrix only)."""
    nbr, nbc = -(-rows // br), -(-cols // bc)
    keys = sorted(blocks)
    rp = row_ptr
    if rp is None:
        rp = [0] * (nbr + 1)
        for b, _ in keys:
            rp[b + 1] += 1
        for b in range(nbr):
            rp[b + 1] += rp[b]
    n = len(keys) if nnzb is None else nnzb
    out = bytearray(magic + struct.pack("<IIQQIIQQQ", version, dtype, rows, cols, br, bc, n,
                                         reserved, 0))
    out += struct.pack("<%dI" % len(rp), *rp)
    out += struct.pack("<%dI" % len(keys), *[c for _, c in keys])
    pad = (-len(out)) % 64
    out += bytes([pad_byte] * pad) if pad else b""
    for b, c in keys:
        f = blocks[(b, c)]
        for i in range(br):
            for j in range(bc):
                inside = b * br + i < rows and c * bc + j < cols
                out += struct.pack("<f", f(i, j) if inside else 0.0)
    return bytes(out) + trailing


def fill(i, j):
    return (i * 7 + j * 3) % 11 - 5.0


def write(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def main():
    os.makedirs(OUT, exist_ok=True)
    ragged = {(0, 0): fill, (0, 1): fill, (1, 1): fill}          # 5x7 in 4x4: both edges ragged
    write("ok_ragged.bsr", bsr(5, 7, 4, 4, ragged))
    write("ok_empty_row.bsr", bsr(12, 16, 4, 8, {(0, 1): fill, (2, 0): fill}))
    write("ok_no_blocks.bsr", bsr(3, 3, 2, 2, {}))
    write("ok_1x1.bsr", bsr(3, 4, 1, 1, {(0, 3): fill, (1, 0): fill, (2, 2): fill}))
    write("ok_16x16.bsr", bsr(40, 33, 16, 16, {(b, c): fill for b in range(3) for c in range(3)
                                               if (b + c) % 2 == 0}))
    write("ok_tall_block.bsr", bsr(9, 40, 9, 33, {(0, 0): fill, (0, 1): fill}))
    # near-misses, one rule each
    write("bad_magic.bsr", bsr(5, 7, 4, 4, ragged, magic=b"CLOCHBSX"))
    write("bad_version.bsr", bsr(5, 7, 4, 4, ragged, version=2))
    write("bad_dtype.bsr", bsr(5, 7, 4, 4, ragged, dtype=1))
    write("bad_reserved.bsr", bsr(5, 7, 4, 4, ragged, reserved=1))
    write("bad_nnzb.bsr", bsr(5, 7, 4, 4, ragged, nnzb=4))
    write("bad_rowptr_end.bsr", bsr(5, 7, 4, 4, ragged, row_ptr=[0, 2, 2]))
    write("bad_rowptr_order.bsr", bsr(5, 7, 4, 4, ragged, row_ptr=[0, 3, 2]))
    write("bad_trailing.bsr", bsr(5, 7, 4, 4, ragged, trailing=b"\0"))
    write("bad_truncated.bsr", bsr(5, 7, 4, 4, ragged)[:-3])
    write("bad_pad_byte.bsr", bsr(5, 7, 4, 4, ragged, pad_byte=1))
    write("bad_col_range.bsr", bsr(5, 7, 4, 4, {(0, 0): fill, (0, 2): fill}))
    unsorted = bytearray(bsr(5, 7, 4, 4, ragged))
    struct.pack_into("<II", unsorted, 64 + 12, 1, 0)  # block row 0's columns: 1, 0
    write("bad_col_order.bsr", bytes(unsorted))
    padded = bytearray(bsr(5, 7, 4, 4, ragged))
    struct.pack_into("<f", padded, 128 + 64 + 4 * 3, 1.0)  # block 1, element [0][3]: col 7
    write("bad_padding.bsr", bytes(padded))
    write("bad_huge_rows.bsr", bsr(1 << 40, 7, 4, 4, {}, row_ptr=[0, 0]))
    write("bad_huge_nnzb.bsr", bsr(5, 7, 4, 4, ragged, nnzb=1 << 62))


if __name__ == "__main__":
    main()
