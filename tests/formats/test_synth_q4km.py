#!/usr/bin/python3
"""test_synth_q4km.py — `clocher synth --gguf F --ftype q4_k_m`, the C writer of llama.cpp's
Q4_K_M mix (client/offline/synth.c), read back by code written here:
 - the GGUF's tensor types follow llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M rule (llama-quant.cpp,
   restated here): 1-D tensors f32, output.weight q6_K, attn_v / ffn_down q6_K on the layers
   use_more_bits(i, n) picks, every other matrix q4_K; a matrix whose rows are not whole
   256-element super-blocks (the demo preset's ffn_down, 704 wide) stays in the float type;
   general.file_type is 15;
 - `clocher convert` stores every k-quant tensor natively (dtype q4_k / q6_k, the GGUF's bytes);
 - the k-quant values are close to the safetensors' (bf16) weights they were quantized from
   (decoded by test_gguf_kquant.py's Python decoder, none of our C code);
 - logits (--dump-logits) of the native model equal those of an f32 IEBIN holding the decoded
   values (written here): to float rounding with CLOCHER_ISA=ref, within the kernels' int8
   activation rounding (test_gguf_kquant.py's bounds) on the machine's best ISA;
 - --ftype with another value, without --gguf, or on a gpt-oss preset is refused by name.
Usage (ctest): test_synth_q4km.py CLOCHER INFERENCE_ENGINE. Only the standard library.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_gguf_kquant as kq  # noqa: E402  (its decoder, logits comparison and bounds)

F32, BF16, Q4_K, Q6_K = 0, 30, 12, 14
NAMES = {F32: "f32", BF16: "bf16", Q4_K: "q4_k", Q6_K: "q6_k"}
LAYERS = 8


def read_gguf(path):
    """Metadata scalars and {name: (ggml type, ne, bytes)} of a GGUF v3 file."""
    b = open(path, "rb").read()
    assert b[:4] == b"GGUF", "not a GGUF file"
    _, n_t, n_kv = struct.unpack_from("<IQQ", b, 4)
    o = 24
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def rstr(o):
        n = struct.unpack_from("<Q", b, o)[0]
        return b[o + 8:o + 8 + n].decode(), o + 8 + n

    def skip(t, o):
        if t == 8:
            return rstr(o)[1]
        if t == 9:
            et, n = struct.unpack_from("<IQ", b, o)
            o += 12
            for _ in range(n):
                o = skip(et, o)
            return o
        return o + sizes[t]

    kv = {}
    for _ in range(n_kv):
        k, o = rstr(o)
        t = struct.unpack_from("<I", b, o)[0]
        o += 4
        if t in (4, 5):
            kv[k] = struct.unpack_from("<I", b, o)[0]
        o = skip(t, o)
    infos = []
    for _ in range(n_t):
        name, o = rstr(o)
        nd = struct.unpack_from("<I", b, o)[0]
        ne = struct.unpack_from(f"<{nd}Q", b, o + 4)
        t, off = struct.unpack_from("<IQ", b, o + 4 + 8 * nd)
        o += 4 + 8 * nd + 12
        infos.append((name, t, ne, off))
    align = kv.get("general.alignment", 32)
    base = (o + align - 1) // align * align
    out = {}
    for name, t, ne, off in infos:
        n = 1
        for d in ne:
            n *= d
        size = {F32: 4 * n, BF16: 2 * n, Q4_K: n // 256 * 144, Q6_K: n // 256 * 210}[t]
        out[name] = (t, ne, b[base + off:base + off + size])
    return kv, out


def more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def want_type(name, ne):
    if len(ne) == 1:
        return F32
    if ne[0] % 256:
        return BF16
    if name == "output.weight":
        return Q6_K
    parts = name.split(".")
    if parts[0] == "blk" and parts[2] in ("attn_v", "ffn_down") and more_bits(int(parts[1]), LAYERS):
        return Q6_K
    return Q4_K


def bf16_tensor(st_path, name):
    """f32 values of a bf16 tensor of a safetensors file."""
    b = open(st_path, "rb").read()
    n = struct.unpack_from("<Q", b, 0)[0]
    hdr = json.loads(b[8:8 + n])
    s, e = hdr[name]["data_offsets"]
    raw = b[8 + n + s:8 + n + e]
    return [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]


def write_f32_twin(src, dst, decoded):
    """An IEBIN directory like src with the k-quant tensors replaced by f32 values."""
    os.makedirs(dst)
    for f in os.listdir(src):
        if f not in ("model.ie.json", "model.ie.bin"):
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    man = json.load(open(os.path.join(src, "model.ie.json")))
    blob = open(os.path.join(src, "model.ie.bin"), "rb").read()
    out = bytearray()
    for t in man["tensors"]:
        data = blob[t["offset"]:t["offset"] + t["size"]]
        if t["name"] in decoded:
            data = array("f", decoded[t["name"]]).tobytes()
            t["dtype"] = "f32"
        out += b"\0" * (-len(out) % 64)
        t["offset"], t["size"] = len(out), len(data)
        out += data
    man["blob"]["size"] = len(out)
    open(os.path.join(dst, "model.ie.bin"), "wb").write(out)
    json.dump(man, open(os.path.join(dst, "model.ie.json"), "w"), indent=1)


def run(clocher, ie, tmp):
    p = lambda name: os.path.join(tmp, name)  # noqa: E731
    r = subprocess.run([clocher, "synth", "--preset", "demo", "--layers", str(LAYERS), "--dtype",
                        "bf16", "--seed", "3", p("hf"), "--gguf", p("q.gguf"), "--ftype",
                        "q4_k_m"], capture_output=True, text=True)
    kq.check(r.returncode == 0, "synth --gguf --ftype q4_k_m", r.stderr.strip())
    if kq.failed:
        return
    kv, g = read_gguf(p("q.gguf"))
    kq.check(kv.get("general.file_type") == 15, "general.file_type is 15 (MOSTLY_Q4_K_M)",
             str(kv.get("general.file_type")))
    wrong = [(n, NAMES.get(t), NAMES[want_type(n, ne)]) for n, (t, ne, _) in g.items()
             if t != want_type(n, ne)]
    counts = {}
    for t, _, _ in g.values():
        counts[NAMES[t]] = counts.get(NAMES[t], 0) + 1
    kq.check(not wrong and counts.get("q6_k") == 5 and counts.get("q4_k") > 40,
             f"the Q4_K_M rule, tensor by tensor: {counts}", f"wrong: {wrong[:4]}")

    # quantized from the same (bf16) weights as the safetensors: decoded values close to them
    # (q4_K: within a tenth of the tensor's range; q6_K: a sixtieth)
    st = p("hf/model.safetensors")
    for gname, hfname, perm in (("blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight", 0),
                                ("blk.1.attn_v.weight", "model.layers.1.self_attn.v_proj.weight", 0),
                                ("token_embd.weight", "model.embed_tokens.weight", 0)):
        t, ne, data = g[gname]
        dec = kq.dequant(t, data)
        ref = bf16_tensor(st, hfname)
        span = max(ref) - min(ref)
        err = max(abs(a - b) for a, b in zip(dec, ref))
        lim = span / (60 if t == Q6_K else 10)
        kq.check(len(dec) == len(ref) and err < lim,
                 f"{gname} ({NAMES[t]}) decodes to the safetensors' weights: max error "
                 f"{err:.3g} < {lim:.3g}")

    r = subprocess.run([clocher, "convert", p("q.gguf"), p("ie-q")], capture_output=True,
                       text=True)
    kq.check(r.returncode == 0, "convert q.gguf natively", r.stderr.strip())
    if kq.failed:
        return
    got = kq.read_iebin(p("ie-q"))
    decoded, bad_native = {}, []
    for name, (dtype, data) in got.items():
        t, _, gd = g[kq.gguf_name(name)]
        if dtype != NAMES[t] or (t in (Q4_K, Q6_K) and data != gd):
            bad_native.append((name, dtype, NAMES[t]))
        if t in (Q4_K, Q6_K):
            decoded[name] = kq.dequant(t, data)
    kq.check(not bad_native, f"every tensor stored as in the GGUF, k-quant bytes identical "
             f"({len(decoded)} k-quant tensors)", str(bad_native[:4]))
    write_f32_twin(p("ie-q"), p("ie-dq"), decoded)

    ids = [1] + [3 + (37 * i) % 4000 for i in range(23)]
    logits = {}
    for isa in ("ref", "best"):
        env = dict(os.environ)
        if isa == "best":
            env.pop("CLOCHER_ISA", None)
        else:
            env["CLOCHER_ISA"] = isa
        for k in ("q", "dq"):
            dump = p(f"L-{k}-{isa}.f32")
            r = subprocess.run([ie, "--model-dir", p("ie-" + k), "--prompt-ids",
                                ",".join(map(str, ids)), "--max-new", "0", "--quiet",
                                "--threads", "1", "--dump-logits", dump],
                               capture_output=True, text=True, env=env)
            if r.returncode != 0:
                kq.bad(f"inference-engine on {k} ({isa}): {r.stderr.strip()}")
                return
            raw = open(dump, "rb").read()
            flat = struct.unpack(f"<{len(raw) // 4}f", raw)
            logits[k, isa] = [list(flat[i:i + 4096]) for i in range(0, len(flat), 4096)]
    kq.check(len(logits["q", "best"]) == len(ids), f"{len(ids)} rows of logits")
    spread = max(max(r) - min(r) for r in logits["dq", "best"])
    kq.check(spread > 0.1, f"the logits are not flat (spread {spread:.3g})")
    for isa in ("ref", "best"):
        bmax, bkl = kq.BOUND_REF if isa == "ref" else kq.BOUND_SIMD
        mx, kl = kq.compare(logits["q", isa], logits["dq", isa])
        kq.check(mx < bmax and kl < bkl,
                 f"{isa}: Q4_K_M model vs its dequantized f32 twin: max |logit diff| {mx:.3g} < "
                 f"{bmax}, mean KL {kl:.3g} < {bkl}")

    for args, needle in ((["--gguf", p("x.gguf"), "--ftype", "q5_k_m"], "expected q4_k_m"),
                         (["--ftype", "q4_k_m"], "give --gguf FILE"),
                         (["--gguf", p("y.gguf"), "--ftype", "q4_k_m", "--preset", "gpt-oss-tiny",
                           "--vocab", "512"], "for the Llama presets")):
        pre = [] if "--preset" in args else ["--preset", "demo"]
        r = subprocess.run([clocher, "synth"] + pre + [p("bad")] + args, capture_output=True,
                           text=True)
        kq.check(r.returncode != 0 and needle in r.stderr, f"refused: {' '.join(args[-3:])}",
                 f"rc {r.returncode}: {r.stderr.strip()[-200:]}")


def main(argv):
    clocher, ie = argv[1:3]
    tmp = tempfile.mkdtemp(prefix="synth-q4km-")
    try:
        run(clocher, ie, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{kq.passed} passed, {kq.failed} failed")
    return 1 if kq.failed or not kq.passed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
