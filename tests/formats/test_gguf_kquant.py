#!/usr/bin/python3
"""test_gguf_kquant.py — a Q4_K_M-style GGUF (k-quants q4_K, q5_K, q6_K) of a small synthetic
llama converted natively by `clocher convert` and run by inference-engine:
 - the GGUF is written here (tests/convert/gguf_quant_writer.py's GGUF v3 writer and llama
   metadata) with a k-quant quantizer and a decoder written here in Python from ggml's block
   layouts (block_q4_K 144 bytes, block_q5_K 176, block_q6_K 210; none of our C code); the
   mix is llama.cpp's Q4_K_M shape: q4_K matrices, q6_K output and layer 0's attn_v/ffn_down,
   q5_K layer 1's (the Q5_K_M choice), f32 norms;
 - every matrix is stored in IEBIN as q4_k / q5_k / q6_k with the GGUF's bytes (copied, not
   requantized);
 - logits (--dump-logits, 24 positions) of the native model against an f32 GGUF holding the
   decoder's dequantized values: with CLOCHER_ISA=ref both run the f32 specification on the
   same weight values, so they agree to float rounding (the C dequantization is the Python
   decoder's, bit for bit); on the machine's best ISA the difference is the kernels' int8
   activation rounding only, bounded below;
 - negative control: the q4_K nibble halves swapped (elements 64c + l and 64c + 32 + l
   exchanged) break that bound.
Usage (ctest): test_gguf_kquant.py CLOCHER INFERENCE_ENGINE. Only the standard library.
"""
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "convert"))
import gguf_quant_writer as gw  # noqa: E402

GGML_Q4_K, GGML_Q5_K, GGML_Q6_K = 12, 13, 14
BB = {GGML_Q4_K: 144, GGML_Q5_K: 176, GGML_Q6_K: 210}
DTYPE = {GGML_Q4_K: "q4_k", GGML_Q5_K: "q5_k", GGML_Q6_K: "q6_k", gw.GGML_F32: "f32"}
# Bounds (max |logit diff|, mean KL) of the native model vs its dequantized f32 twin, measured
# on this model at --threads 1 (AVX-512: max 0.084, KL 1.7e-4) and set at about 3x that: what
# is left is the kernels' int8 activation rounding (the nibble-swap control gives max 6, KL 1.4).
BOUND_SIMD = (0.25, 5e-4)
BOUND_REF = (1e-4, 1e-9)  # the f32 specification on identical weights: summation order only

passed = failed = 0


def ok(msg):
    global passed
    passed += 1
    print(f"ok - {msg}")


def bad(msg):
    global failed
    failed += 1
    print(f"FAIL - {msg}")


def check(cond, msg, why=""):
    ok(msg) if cond else bad(f"{msg}: {why}" if why else msg)


def f16(v):
    """v rounded to f16 (as a float), and its two bytes."""
    b = struct.pack("<e", v)
    return struct.unpack("<e", b)[0], b


def f32(v):
    return array("f", [v])[0]


# ---- quantizer (round to nearest on each sub-block's range; the layouts are what matters) ----

def quant_q45(x, five):
    """256 floats -> one block_q4_K / block_q5_K."""
    nmax = 31 if five else 15
    sc, mn = [], []
    for j in range(8):
        sub = x[32 * j:32 * j + 32]
        lo, hi = min(min(sub), 0.0), max(sub)
        sc.append((hi - lo) / nmax)
        mn.append(-lo)
    d, db = f16(max(sc) / 63)
    dmin, mb = f16(max(mn) / 63)
    ls = [min(63, max(0, round(s / d))) if d else 0 for s in sc]
    lm = [min(63, max(0, round(m / dmin))) if dmin else 0 for m in mn]
    s = [0] * 12
    for j in range(8):
        if j < 4:
            s[j], s[j + 4] = ls[j], lm[j]
        else:
            s[j + 4] = (ls[j] & 15) | (lm[j] & 15) << 4
            s[j - 4] |= (ls[j] >> 4) << 6
            s[j] |= (lm[j] >> 4) << 6
    qs, qh = [0] * 128, [0] * 32
    for j in range(8):
        dj, mj = d * ls[j], dmin * lm[j]
        c, h = j // 2, j & 1
        for l in range(32):
            q = min(nmax, max(0, round((x[32 * j + l] + mj) / dj))) if dj else 0
            qs[32 * c + l] |= (q & 15) << (4 * h)
            if five:
                qh[l] |= (q >> 4) << j
    return db + mb + bytes(s) + (bytes(qh) if five else b"") + bytes(qs)


def quant_q6(x):
    """256 floats -> one block_q6_K."""
    sc = []
    for k in range(16):
        sub = x[16 * k:16 * k + 16]
        big = max(sub, key=abs)
        sc.append(big / -32.0)
    bigs = max(sc, key=abs)
    d, db = f16(bigs / -128.0)
    ls = [min(127, max(-128, round(s / d))) if d else 0 for s in sc]
    ql, qh = [0] * 128, [0] * 64
    for e in range(256):
        de = d * ls[e // 16]
        q = (min(31, max(-32, round(x[e] / de))) if de else 0) + 32
        h, k, l = e // 128, e % 128 // 32, e % 32
        ql[64 * h + 32 * (k & 1) + l] |= (q & 15) << (4 if k >= 2 else 0)
        qh[32 * h + l] |= (q >> 4) << (2 * k)
    return bytes(ql) + bytes(qh) + struct.pack("<16b", *ls) + db


def quantize(gtype, vals):
    out = bytearray()
    for i in range(0, len(vals), 256):
        blk = vals[i:i + 256]
        out += quant_q6(blk) if gtype == GGML_Q6_K else quant_q45(blk, gtype == GGML_Q5_K)
    return bytes(out)


# ---- the decoder (ggml's dequantize_row_q*_K, f32 arithmetic emulated exactly) ----

def scale_min(s, j):
    if j < 4:
        return s[j] & 63, s[j + 4] & 63
    return (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)


def dequant(gtype, data):
    y = []
    bb = BB[gtype]
    for o in range(0, len(data), bb):
        b = data[o:o + bb]
        if gtype == GGML_Q6_K:
            d = struct.unpack_from("<e", b, 208)[0]
            sc = struct.unpack_from("<16b", b, 192)
            out = [0.0] * 256
            for n in range(2):
                ql, qh = b[64 * n:64 * n + 64], b[128 + 32 * n:160 + 32 * n]
                for l in range(32):
                    qs = ((ql[l] & 15) | (qh[l] & 3) << 4, (ql[l + 32] & 15) | (qh[l] >> 2 & 3) << 4,
                          (ql[l] >> 4) | (qh[l] >> 4 & 3) << 4, (ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4)
                    for k in range(4):
                        ds = f32(d * sc[8 * n + l // 16 + 2 * k])
                        out[128 * n + 32 * k + l] = f32(ds * (qs[k] - 32))
            y += out
            continue
        five = gtype == GGML_Q5_K
        d, dmin = struct.unpack_from("<2e", b, 0)
        s, qh, qs = b[4:16], b[16:48], b[48:176] if five else b[16:144]
        for j in range(8):
            sc, m = scale_min(s, j)
            d1, m1 = f32(d * sc), f32(dmin * m)
            c, h = j // 2, j & 1
            for l in range(32):
                q = (qs[32 * c + l] >> (4 * h)) & 15
                if five and qh[l] >> j & 1:
                    q += 16
                y.append(f32(f32(d1 * q) - m1))
    return y


# ---- the model ----

def model(seed=7):
    """A small llama whose every row is whole 256-element super-blocks."""
    hp = dict(dim=256, hidden=512, n_layers=2, n_heads=4, n_kv=2, vocab=512, seq=128)
    hp["head_dim"] = hp["dim"] // hp["n_heads"]
    rng = random.Random(seed)
    dim, hid, kv = hp["dim"], hp["hidden"], hp["n_kv"] * hp["head_dim"]

    def mat(rows, cols, std):
        # a shifted sub-block now and then, so the mins matter
        return [rng.gauss(0.02 if (i // 32) % 7 == 0 else 0.0, std) for i in range(rows * cols)]

    t = [("token_embd.weight", [hp["vocab"], dim], mat(hp["vocab"], dim, 1.0))]
    for l in range(hp["n_layers"]):
        b = f"blk.{l}."
        t += [(b + "attn_norm.weight", [dim], [1.0 + 0.1 * rng.gauss(0, 1) for _ in range(dim)]),
              (b + "attn_q.weight", [dim, dim], mat(dim, dim, 0.08)),
              (b + "attn_k.weight", [kv, dim], mat(kv, dim, 0.08)),
              (b + "attn_v.weight", [kv, dim], mat(kv, dim, 0.08)),
              (b + "attn_output.weight", [dim, dim], mat(dim, dim, 0.06)),
              (b + "ffn_norm.weight", [dim], [1.0 + 0.1 * rng.gauss(0, 1) for _ in range(dim)]),
              (b + "ffn_gate.weight", [hid, dim], mat(hid, dim, 0.06)),
              (b + "ffn_down.weight", [dim, hid], mat(dim, hid, 0.05)),
              (b + "ffn_up.weight", [hid, dim], mat(hid, dim, 0.06))]
    t.append(("output_norm.weight", [dim], [1.0] * dim))
    t.append(("output.weight", [hp["vocab"], dim], mat(hp["vocab"], dim, 0.08)))
    return hp, t


def mix(name):
    """llama.cpp's Q4_K_M choice (q6_K output, more bits for attn_v / ffn_down), q5_K in layer 1."""
    if name == "output.weight":
        return GGML_Q6_K
    if name.endswith(("attn_v.weight", "ffn_down.weight")):
        return GGML_Q6_K if name.startswith("blk.0.") else GGML_Q5_K
    return GGML_Q4_K


def swap_halves(gtype, data):
    """q4_K with each chunk's low/high nibbles exchanged (a decoder that mixed up the halves)."""
    if gtype != GGML_Q4_K:
        return data
    out = bytearray(data)
    for o in range(0, len(data), 144):
        for i in range(o + 16, o + 144):
            out[i] = ((data[i] & 15) << 4) | (data[i] >> 4)
    return bytes(out)


def read_iebin(d):
    import json
    with open(os.path.join(d, "model.ie.json")) as f:
        man = json.load(f)
    with open(os.path.join(d, "model.ie.bin"), "rb") as f:
        blob = f.read()
    return {t["name"]: (t["dtype"], blob[t["offset"]:t["offset"] + t["size"]])
            for t in man["tensors"]}


def compare(a, b):
    """max |a - b| and mean KL(softmax b || softmax a) over rows of logits."""
    def lsm(row):
        m = max(row)
        s = math.log(sum(math.exp(v - m) for v in row)) + m
        return [v - s for v in row]
    mx, kl = 0.0, 0.0
    for ra, rb in zip(a, b):
        mx = max(mx, max(abs(x - y) for x, y in zip(ra, rb)))
        la, lb = lsm(ra), lsm(rb)
        kl += sum(math.exp(y) * (y - x) for x, y in zip(la, lb))
    return mx, kl / len(a)


G_NAMES = {"tok_embd": "token_embd", "output_norm": "output_norm", "attn_o": "attn_output"}


def gguf_name(iebin_name):
    parts = iebin_name.split(".")
    parts[-1] = G_NAMES.get(parts[-1], parts[-1])
    return ".".join(parts) + ".weight"


def run(clocher, ie, tmp):
    p = lambda name: os.path.join(tmp, name)  # noqa: E731
    hp, tensors = model()
    q, dq, sw = [], [], []
    for name, shape, vals in tensors:
        if len(shape) == 2:
            g = mix(name)
            blob = quantize(g, vals)
            q.append((name, g, shape, blob))
            sw.append((name, g, shape, swap_halves(g, blob)))
            dq.append((name, gw.GGML_F32, shape, array("f", dequant(g, blob)).tobytes()))
        else:
            f = (name, gw.GGML_F32, shape, array("f", vals).tobytes())
            q.append(f), sw.append(f), dq.append(f)
    meta = gw.llama_metadata(hp, "f32", name="kquant-synth")
    meta = [(k, t, 15 if k == "general.file_type" else v) for k, t, v in meta]  # MOSTLY_Q4_K_M
    gw.write_gguf(p("q.gguf"), meta, q)
    gw.write_gguf(p("sw.gguf"), meta, sw)
    gw.write_gguf(p("dq.gguf"), gw.llama_metadata(hp, "f32", name="kquant-synth"), dq)
    for k in ("q", "sw", "dq"):
        r = subprocess.run([clocher, "convert", p(k + ".gguf"), p("ie-" + k)], capture_output=True,
                           text=True)
        check(r.returncode == 0, f"convert {k}.gguf", r.stderr.strip())
    if failed:
        return 1

    got = read_iebin(p("ie-q"))
    src = {n: (t, d) for n, t, _, d in q}
    counts = {}
    for name, (dtype, data) in got.items():
        gt, gd = src.get(gguf_name(name), (None, None))
        want = DTYPE.get(gt, "?")
        if dtype != want or data != gd:
            bad(f"tensor {name}: dtype {dtype} (want {want}), bytes "
                f"{'equal' if data == gd else 'differ'}")
            break
        counts[dtype] = counts.get(dtype, 0) + 1
    else:
        check(counts.get("q4_k") == 11 and counts.get("q6_k") == 3 and counts.get("q5_k") == 2,
              f"stored natively, byte-identical to the GGUF: {counts}")

    ids = [1] + [3 + (37 * i) % 500 for i in range(23)]
    logits = {}
    # ref, the machine's best ISA, and AVX2 too when the best is AVX-512
    cpu = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    isas = ["ref", "best"] + (["avx2"] if " avx512_vnni" in cpu and " fma" in cpu else [])
    for isa in isas:
        env = dict(os.environ)
        if isa == "best":
            env.pop("CLOCHER_ISA", None)
        else:
            env["CLOCHER_ISA"] = isa
        for k in ("q", "dq", "sw"):
            dump = p(f"L-{k}-{isa}.f32")
            r = subprocess.run([ie, "--model-dir", p("ie-" + k), "--prompt-ids",
                                ",".join(map(str, ids)), "--max-new", "0", "--quiet",
                                "--threads", "1", "--dump-logits", dump],
                               capture_output=True, text=True, env=env)
            if r.returncode != 0:
                bad(f"inference-engine on {k} ({isa}): {r.stderr.strip()}")
                return 1
            raw = open(dump, "rb").read()
            flat = struct.unpack(f"<{len(raw) // 4}f", raw)
            logits[k, isa] = [list(flat[i:i + hp["vocab"]])
                              for i in range(0, len(flat), hp["vocab"])]
    check(len(logits["q", "best"]) == len(ids), f"{len(ids)} rows of logits")
    spread = max(max(r) - min(r) for r in logits["dq", "best"])
    check(spread > 1.0, f"the logits are not flat (spread {spread:.2f})")
    for isa in isas:
        bmax, bkl = BOUND_REF if isa == "ref" else BOUND_SIMD
        mx, kl = compare(logits["q", isa], logits["dq", isa])
        check(mx < bmax and kl < bkl,
              f"{isa}: k-quant model vs its dequantized f32 twin: max |logit diff| {mx:.3g} < "
              f"{bmax}, mean KL {kl:.3g} < {bkl}")
    # clocher convert --dtype q4_k | q5_k | q6_k from the f32 model: every matrix in the
    # k-quant, and the KL to the f32 model ordered as the bits are (q6_k < q5_k < q4_k)
    kls = {}
    for dt in ("q4_k", "q5_k", "q6_k"):
        r = subprocess.run([clocher, "convert", p("ie-dq"), p("ie-" + dt), "--dtype", dt],
                           capture_output=True, text=True)
        if r.returncode != 0:
            bad(f"convert --dtype {dt}: {r.stderr.strip()}")
            continue
        types = {t for t, _ in read_iebin(p("ie-" + dt)).values()}
        check(types == {dt, "f32"}, f"--dtype {dt}: matrices stored as {dt}", str(types))
        dump = p(f"L-{dt}.f32")
        r = subprocess.run([ie, "--model-dir", p("ie-" + dt), "--prompt-ids",
                            ",".join(map(str, ids)), "--max-new", "0", "--quiet",
                            "--threads", "1", "--dump-logits", dump], capture_output=True,
                           text=True)
        raw = open(dump, "rb").read() if r.returncode == 0 else b""
        flat = struct.unpack(f"<{len(raw) // 4}f", raw)
        rows = [list(flat[i:i + hp["vocab"]]) for i in range(0, len(flat), hp["vocab"])]
        if len(rows) != len(ids):
            bad(f"--dtype {dt}: inference-engine: {r.stderr.strip()}")
            continue
        kls[dt] = compare(rows, logits["dq", "best"])[1]
    print(f"# KL vs the f32 model: {kls}")
    check(len(kls) == 3 and kls["q6_k"] < kls["q5_k"] < kls["q4_k"] < 0.05,
          f"--dtype: KL to f32 falls with the bits and stays small: {kls}")
    r = subprocess.run([clocher, "convert", p("ie-dq"), p("ie-bad"), "--dtype", "q3_k"],
                       capture_output=True, text=True)
    check(r.returncode != 0 and "q3_k" in r.stderr, "--dtype q3_k is refused, naming it",
          r.stderr.strip())

    mx, kl = compare(logits["sw", "best"], logits["dq", "best"])
    check(not (mx < BOUND_SIMD[0] and kl < BOUND_SIMD[1]),
          f"q4_K nibble halves swapped break the bound (max {mx:.3f}, KL {kl:.4f})")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def main(argv):
    if len(argv) != 3:
        print("usage: test_gguf_kquant.py CLOCHER INFERENCE_ENGINE", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="gguf-kquant-")
    try:
        return run(argv[1], argv[2], tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
