#!/usr/bin/env python3
"""gen_shm_seeds.py — writes the seed corpora for fuzz_shm_msg and fuzz_shm_ring.

Run from anywhere: python3 tests/fuzz/gen_shm_seeds.py. The seeds are committed; this script
documents how they were made and regenerates them. It packs records from the layouts of
shm/shm_abi.h independently of the C code, so the seeds also cross-check the documented ABI.

fuzz_shm_msg input: u32 record type, then the record. One valid record of every type (with
every optional section used somewhere) plus near-misses that each break one rule.
fuzz_shm_ring input: u64 head, u64 tail, u64 head shown to the producer, then the 4096-byte
data area: valid streams (with a wrap-around pad), and streams with one lie each.
Only the standard library is used; nothing here runs at build or test time.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

GENERATE, CANCEL, TOKENIZE, DETOKENIZE, ADAPTER_LOAD, ADAPTER_UNLOAD, STATS_QUERY = range(16, 23)
TOKEN, FINISH, ERROR, TOKENS, TEXT, ADAPTER, DONE, STATS, HELLO = range(64, 73)
PAD = 1


def cstr(s):
    return s.encode() + b"\0"


def generate(rid=7, ids=(1, 2, 3), text=b"", adapter="sql", stops=("\n\n", "</s>"),
             temperature=0.7, top_p=0.9, min_p=0.0, rep=1.0, scale=1.0, top_k=40, window=64,
             max_tokens=16, prio=1, flags=1, reserved=0):
    a = cstr(adapter) if adapter else b""
    st = b"".join(cstr(s) for s in stops)
    fixed = struct.pack("<QQQQfffffIIIIIIIIIII", rid, 3, 0, 42, temperature, top_p, min_p, rep,
                        scale, top_k, window, max_tokens, prio, flags, len(ids), len(text),
                        len(a), len(stops), len(st), reserved)
    assert len(fixed) == 96
    return fixed + struct.pack("<%di" % len(ids), *ids) + a + st + text


def msg_seeds():
    s = {}
    s["generate_ids"] = (GENERATE, generate())
    s["generate_text"] = (GENERATE, generate(ids=(), text=b"Once upon a time", adapter=None,
                                             stops=()))
    s["cancel"] = (CANCEL, struct.pack("<Q", 9))
    s["tokenize"] = (TOKENIZE, struct.pack("<QII", 3, 1, 5) + b"hello")
    s["detokenize"] = (DETOKENIZE, struct.pack("<QII", 4, 2, 0) + struct.pack("<ii", 5, 6))
    s["adapter_load"] = (ADAPTER_LOAD, struct.pack("<QII", 5, 4, 7) + cstr("sql") + cstr("/a/sql"))
    s["adapter_unload"] = (ADAPTER_UNLOAD, struct.pack("<QII", 6, 4, 0) + cstr("sql"))
    s["stats_query"] = (STATS_QUERY, struct.pack("<Q", 8))
    s["token"] = (TOKEN, struct.pack("<QiI", 1, 1234, 4) + b" the")
    s["finish"] = (FINISH, struct.pack("<QIIIIQQQQ", 2, 3, 10, 20, 8, 1, 2, 3, 4))
    s["error"] = (ERROR, struct.pack("<QiI", 0, -10008, 11) + cstr("queue full"))
    s["tokens"] = (TOKENS, struct.pack("<QII", 3, 1, 0) + struct.pack("<i", 77))
    s["text"] = (TEXT, struct.pack("<QII", 3, 3, 0) + b"abc")
    s["adapter"] = (ADAPTER, struct.pack("<QIfIIII", 4, 16, 32.0, 5, 2, 4, 0) + cstr("sql"))
    s["done"] = (DONE, struct.pack("<Q", 4))
    s["stats"] = (STATS, struct.pack("<QII10Q", 5, 3, 1, 100, 40, 10, 7, 3, 0, 9, 99, 50, 1 << 30))
    s["hello"] = (HELLO, struct.pack("<QQIIIIII", 0, 260000, 512, 512, 12, 6, 4, 0) +
                  cstr("stories260K") + cstr("llama") + cstr("f32"))
    # near-misses: each breaks one rule
    s["bad_generate_topp"] = (GENERATE, generate(top_p=1.5))
    s["bad_generate_reserved"] = (GENERATE, generate(reserved=1))
    s["bad_generate_trailing"] = (GENERATE, generate() + b"\0")
    s["bad_generate_nstop"] = (GENERATE, generate()[:84] + struct.pack("<I", 3) + generate()[88:])
    s["bad_generate_both"] = (GENERATE, generate(text=b"x"))
    s["bad_token_len"] = (TOKEN, struct.pack("<QiI", 1, 5, 100) + b"short")
    s["bad_error_nul"] = (ERROR, struct.pack("<QiI", 1, -1, 4) + b"ab\0\0")
    s["bad_finish_reason"] = (FINISH, struct.pack("<QIIIIQQQQ", 2, 9, 0, 0, 0, 0, 0, 0, 0))
    s["bad_hello_id"] = (HELLO, struct.pack("<QQIIIIII", 1, 0, 1, 1, 2, 2, 2, 0) +
                         b"a\0b\0c\0")
    s["bad_type"] = (5, b"\0" * 16)
    d = os.path.join(HERE, "corpus", "shm_msg")
    os.makedirs(d, exist_ok=True)
    for name, (t, rec) in s.items():
        with open(os.path.join(d, name + ".bin"), "wb") as f:
            f.write(struct.pack("<I", t) + rec)


# ---- rings ----

CAP = 4096


def rec(rtype, payload, seq):
    n = 16 + len(payload)
    size = (n + 15) & ~15
    return struct.pack("<IIQ", len(payload), rtype, seq) + payload + b"\0" * (size - n)


def ring_image(head, tail, head2, records_at):
    data = bytearray(CAP)
    for pos, blob in records_at:
        off = pos % CAP
        data[off:off + len(blob)] = blob
    return struct.pack("<QQQ", head, tail, head2) + bytes(data)


def ring_seeds():
    events = [
        (TOKEN, struct.pack("<QiI", 1, 42, 3) + b"abc"),
        (FINISH, struct.pack("<QIIIIQQQQ", 1, 1, 3, 1, 0, 1, 2, 3, 4)),
        (ERROR, struct.pack("<QiI", 2, -5, 4) + cstr("bad")),
    ]
    s = {}
    # three events from 0
    pos, seq, out = 0, 0, []
    for t, p in events:
        r = rec(t, p, seq)
        out.append((pos, r))
        pos += len(r)
        seq += 1
    s["three_events"] = ring_image(0, pos, pos, out)
    s["empty"] = ring_image(0, 0, 0, [])
    # a wrap: head at CAP - 32, a pad of 16 payload bytes, then a record at 0
    start = 3 * CAP - 32
    pad = struct.pack("<IIQ", 16, PAD, 0) + b"\0" * 16
    r = rec(TOKEN, struct.pack("<QiI", 5, 7, 40) + b"x" * 40, 1)
    s["wrap_pad"] = ring_image(start, start + 32 + len(r), start, [(start, pad), (3 * CAP, r)])
    # lies: tail beyond capacity, a length past the tail, a bad sequence number, a head ahead
    s["bad_tail"] = ring_image(0, CAP + 16, 0, out)
    s["bad_len"] = ring_image(0, 32, 0, [(0, struct.pack("<IIQ", 400, TOKEN, 0) + b"\0" * 16)])
    s["bad_seq"] = ring_image(0, pos, pos, [(0, rec(TOKEN, events[0][1], 5))])
    s["bad_head"] = ring_image(0, pos, pos + 4096, out)
    d = os.path.join(HERE, "corpus", "shm_ring")
    os.makedirs(d, exist_ok=True)
    for name, blob in s.items():
        with open(os.path.join(d, name + ".bin"), "wb") as f:
            f.write(blob)


if __name__ == "__main__":
    msg_seeds()
    ring_seeds()
