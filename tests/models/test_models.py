#!/usr/bin/python3
"""tests/models/test_models.py — Llama 3, Qwen2 and Mistral (issue 17, "Architectures"): each
`clocher synth` preset (llama3-tiny, qwen2-tiny, mistral-tiny) against an independent float64
numpy reference written here from the Hugging Face semantics, reading the checkpoint the
preset wrote (config.json + model.safetensors) and nothing of Clocher's.

The reference follows transformers' modeling code for each model_type: RMSNorm
(x * rsqrt(mean(x^2) + eps) * w), q/k/v projections (qwen2: with biases, o without), RoPE in
the rotate-half convention (pairs j, j + head_dim/2) with inv_freq = theta^(-2j/d), rescaled for
rope_scaling "llama3" as _compute_llama3_parameters does (wavelength bands of
original_max_position_embeddings / {low,high}_freq_factor, smoothed between), grouped-query
causal attention scaled by 1/sqrt(head_dim) (mistral: a query at i sees keys j with
i - j < sliding_window), SwiGLU MLP, final norm, lm_head or the embedding when
tie_word_embeddings.

Checks, per preset (each a failure of the test when it does not hold):
 1. HF and GGUF conversions (f32 and bf16) give bit-identical IEBIN: same blob, same manifest
    but for the name.
 2. f32 path (CLOCHER_ISA=ref, inference-engine --dump-logits): at every position of a
    N_PROMPT-token prompt (longer than mistral's window), max |logit - ref| <= REL_TOL x
    max |ref|.
 3. Negative controls: the same check FAILS by NEG_FACTOR x against the reference without the
    preset's feature (llama3: plain RoPE; qwen2: no biases; mistral: no window) and, for the
    tied presets, against a reference whose classifier is not the embedding (its rows
    reversed).
 4. The serving engine's paged path (tests/gptoss/gptoss_batch --logits, f32 KV): one greedy
    request of N_GEN tokens; its logits at every position against the reference on the same
    tokens (mistral: past the window, through the paged attention's window).
 6. Llama 3's 128256-token vocabulary (llama3-tiny --vocab 128256, tied): HF = GGUF, and f32
    logits within REL_TOL at every position of a prompt of ids above 2^16, the last id included.
 7. Mistral's window frees paged KV blocks (window_checks).
 5. int8 (q8_0 matrices, the machine's best ISA with int8 activations): the HF and GGUF
    conversions are bit-identical, and mean KL(ref || engine) over positions <= KLD_INT8.

Run by ctest (label models); needs CLOCHER_BUILD_DIR.
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

PRESETS = {
    "llama3-tiny": "plain RoPE (rope_scaling ignored)",
    "qwen2-tiny": "no q/k/v biases",
    "mistral-tiny": "no sliding window",
}
N_PROMPT = 24       # > mistral-tiny's window of 8
N_GEN = 24          # positions scored through the serving engine
SWA_GEN = 64        # mistral-tiny in the paged engine: 8x its window
REL_TOL = 1e-4      # max |dlogit| / max |logit|
NEG_FACTOR = 10     # a negative control must miss by at least 10x the tolerance
KLD_INT8 = 5e-3     # mean KL(ref || engine) per position, q8_0 + int8 activations (5e-4)


def build(*parts):
    return os.path.join(os.environ["CLOCHER_BUILD_DIR"], *parts)


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()[-800:]}")
    return r.stdout


# ---- the checkpoint, read without Clocher ----------------------------------------------------
def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        buf = raw[base + a:base + b]
        if t["dtype"] == "F32":
            x = np.frombuffer(buf, dtype="<f4")
        elif t["dtype"] == "BF16":
            x = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] == "F16":
            x = np.frombuffer(buf, dtype="<f2")
        else:
            sys.exit(f"FAIL: {path}: tensor {name} has dtype {t['dtype']}")
        out[name] = x.astype(np.float64).reshape(t["shape"])
    return out


# ---- the reference (transformers' semantics) -------------------------------------------------
def inv_freq_of(cfg, head_dim, scaling=True):
    theta = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)
    rs = cfg.get("rope_scaling")
    if not scaling or not rs:
        return inv
    assert rs.get("rope_type", rs.get("type")) == "llama3"
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / lo, old / hi
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled)


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def reference(cfg, W, tokens, scaling=True, bias=True, window=True, shuffle_embed=False):
    d, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or d // nh
    eps = cfg["rms_norm_eps"]
    T = len(tokens)
    sw = cfg.get("sliding_window") if cfg["model_type"] == "mistral" and window else None

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    inv = inv_freq_of(cfg, hd, scaling)
    ang = np.arange(T)[:, None] * inv[None, :]
    emb = np.concatenate([ang, ang], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    embed = W["model.embed_tokens.weight"]
    x = embed[tokens].copy()
    for li in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{li}."

        def proj(name):
            y = xn @ W[p + name + ".weight"].T
            if bias and p + name + ".bias" in W:
                y = y + W[p + name + ".bias"]
            return y

        xn = rms(x, W[p + "input_layernorm.weight"])
        q = proj("self_attn.q_proj").reshape(T, nh, hd)
        k = proj("self_attn.k_proj").reshape(T, nkv, hd)
        v = proj("self_attn.v_proj").reshape(T, nkv, hd)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        att = np.zeros((T, nh, hd))
        for t in range(T):
            u0 = max(0, t - sw + 1) if sw else 0
            for h in range(nh):
                g = h // (nh // nkv)
                s = (k[u0:t + 1, g] @ q[t, h]) / math.sqrt(hd)
                pr = np.exp(s - s.max())
                att[t, h] = (pr / pr.sum()) @ v[u0:t + 1, g]
        x = x + att.reshape(T, nh * hd) @ W[p + "self_attn.o_proj.weight"].T
        xn = rms(x, W[p + "post_attention_layernorm.weight"])
        gate = xn @ W[p + "mlp.gate_proj.weight"].T
        up = xn @ W[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ W[p + "mlp.down_proj.weight"].T
    head = embed if cfg.get("tie_word_embeddings") else W["lm_head.weight"]
    if shuffle_embed:
        head = head[::-1]
    return rms(x, W["model.norm.weight"]) @ head.T


# ---- the engine ------------------------------------------------------------------------------
def engine_logits(model_dir, tokens, vocab, isa="ref"):
    dump = os.path.join(model_dir, "logits.f32")
    env = dict(os.environ, CLOCHER_ISA=isa) if isa else \
        {k: v for k, v in os.environ.items() if k != "CLOCHER_ISA"}
    run([build("worker", "inference-engine"), "--model-dir", model_dir, "--prompt-ids",
         ",".join(map(str, tokens)), "--max-new", "0", "--threads", "1", "--quiet",
         "--dump-logits", dump], env=env)
    return np.fromfile(dump, dtype="<f4").reshape(len(tokens), vocab).astype(np.float64)


def paged_logits(model_dir, token, n, vocab):
    out = os.path.join(model_dir, "paged.f32")
    ids = run([build("tests", "gptoss", "gptoss_batch"), "--logits", model_dir, "f32",
               str(token), str(n), out], env=dict(os.environ, CLOCHER_ISA="ref"))
    ids = [int(t) for t in ids.strip().split(",")]
    return ids, np.fromfile(out, dtype="<f4").reshape(-1, vocab).astype(np.float64)


def window_checks(check, cfg, W, model_dir, token, vocab):
    """7. Mistral (every layer slides) in the paged engine with 4-token blocks (swa_window.c):
    a SWA_GEN-token request keeps at most ceil((W - 1) / 4) + 2 blocks (the window's, the
    block being written and the one kept until its successor is indexed), lets blocks go, and
    its logits still match the reference; two requests at once on its first half (their leading
    blocks taken from the prefix cache, shared by both) continue with its second half."""
    out = os.path.join(model_dir, "swa.f32")
    lines = run([build("tests", "models", "swa_window"), model_dir, str(token), str(SWA_GEN),
                 out], env=dict(os.environ, CLOCHER_ISA="ref")).strip().split("\n")
    ids = [int(t) for t in lines[0].split(",")]
    _, used, released = lines[1].split()
    w, B = cfg["sliding_window"], 4
    bound = -(-(w - 1) // B) + 2
    check("mistral-tiny: window bounds the paged KV", int(used) <= bound and int(released) > 0,
          f"{SWA_GEN} tokens: at most {used} blocks in use (bound {bound}), {released} released")
    eng = np.fromfile(out, dtype="<f4").reshape(-1, vocab).astype(np.float64)
    ref = reference(cfg, W, [token] + ids[:-1])
    e = np.abs(eng - ref).max() / np.abs(ref).max()
    check("mistral-tiny: logits with released blocks", bool(len(ids) == SWA_GEN and e <= REL_TOL),
          f"{len(ids)} positions, relative error {e:.3g} (tolerance {REL_TOL})")
    want = ",".join(map(str, ids[SWA_GEN // 2:]))
    check("mistral-tiny: shared prefix blocks survive the window",
          lines[2] == want and lines[3] == want,
          f"continuations {lines[2]} / {lines[3]}, expected {want}")


def log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def same_iebin(a, b):
    with open(os.path.join(a, "model.ie.bin"), "rb") as f1, \
            open(os.path.join(b, "model.ie.bin"), "rb") as f2:
        if f1.read() != f2.read():
            return "blobs differ"
    m = []
    for d in (a, b):
        with open(os.path.join(d, "model.ie.json")) as f:
            j = json.load(f)
        j.pop("name", None)
        m.append(j)
    return None if m[0] == m[1] else "manifests differ"


def main():
    clocher = build("client", "clocher")
    failures, passed = [], 0

    def check(name, ok, detail):
        nonlocal passed
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
        if ok:
            passed += 1
        else:
            failures.append(name)

    with tempfile.TemporaryDirectory(prefix="models-") as tmp:
        for preset, feature in PRESETS.items():
            base = os.path.join(tmp, preset)
            for dt in ("f32", "bf16"):
                hf, gg = f"{base}-{dt}", f"{base}-{dt}.gguf"
                run([clocher, "synth", "--preset", preset, hf, "--dtype", dt, "--gguf", gg])
                run([clocher, "convert", hf, f"{hf}.hf.ie"])
                run([clocher, "convert", gg, f"{hf}.gg.ie"])
                why = same_iebin(f"{hf}.hf.ie", f"{hf}.gg.ie")
                check(f"{preset} {dt}: HF and GGUF give the same IEBIN", why is None,
                      why or "blob and manifest identical")
            hf = f"{base}-f32"
            with open(os.path.join(hf, "config.json")) as f:
                cfg = json.load(f)
            W = read_safetensors(os.path.join(hf, "model.safetensors"))
            V = cfg["vocab_size"]
            rng = np.random.default_rng(17)
            tokens = [int(t) for t in rng.integers(3, V, N_PROMPT)]
            ref = reference(cfg, W, tokens)
            scale = np.abs(ref).max()
            got = engine_logits(f"{hf}.hf.ie", tokens, V)
            err = np.abs(got - ref).max() / scale
            check(f"{preset}: f32 logits at every position", bool(err <= REL_TOL),
                  f"max |dlogit| / max |logit| = {err:.3g} (tolerance {REL_TOL}; "
                  f"logits up to {scale:.3g}, {N_PROMPT} positions)")
            kw = {"llama3-tiny": dict(scaling=False), "qwen2-tiny": dict(bias=False),
                  "mistral-tiny": dict(window=False)}[preset]
            bad = reference(cfg, W, tokens, **kw)
            e = np.abs(got - bad).max() / scale
            check(f"{preset}: negative control, {feature}", bool(e > NEG_FACTOR * REL_TOL),
                  f"relative error {e:.3g} must exceed {NEG_FACTOR * REL_TOL:.3g}")
            if cfg.get("tie_word_embeddings"):
                bad = reference(cfg, W, tokens, shuffle_embed=True)
                e = np.abs(got - bad).max() / scale
                check(f"{preset}: negative control, classifier not the embedding",
                      bool(e > NEG_FACTOR * REL_TOL),
                      f"relative error {e:.3g} must exceed {NEG_FACTOR * REL_TOL:.3g}")
            if preset == "mistral-tiny":
                w = cfg["sliding_window"]
                late = np.abs(got[w:] - ref[w:]).max() / scale
                check(f"{preset}: past the window", bool(late <= REL_TOL),
                      f"positions >= {w}: {late:.3g}")
            run([clocher, "convert", hf, f"{hf}.q8.ie", "--dtype", "int8"])
            run([clocher, "convert", f"{hf}.gguf", f"{hf}.q8g.ie", "--dtype", "int8"])
            why = same_iebin(f"{hf}.q8.ie", f"{hf}.q8g.ie")
            check(f"{preset} int8: HF and GGUF give the same IEBIN", why is None,
                  why or "blob and manifest identical")
            q8 = engine_logits(f"{hf}.q8.ie", tokens, V, isa=None)
            lp, lq = log_softmax(ref), log_softmax(q8)
            kld = (np.exp(lp) * (lp - lq)).sum(axis=1)
            check(f"{preset}: int8 KLD", bool(kld.mean() <= KLD_INT8),
                  f"mean KL(ref||engine) {kld.mean():.3g}, max {kld.max():.3g} (limit mean "
                  f"{KLD_INT8})")
            ids, eng = paged_logits(f"{hf}.hf.ie", tokens[0], N_GEN, V)
            seq = [tokens[0]] + ids[:-1]
            refe = reference(cfg, W, seq)
            e = np.abs(eng - refe).max() / np.abs(refe).max()
            check(f"{preset}: serving engine (paged KV, f32) at every position",
                  bool(len(ids) == N_GEN and e <= REL_TOL),
                  f"{len(ids)} positions, relative error {e:.3g} (tolerance {REL_TOL})")
            if preset == "mistral-tiny":
                window_checks(check, cfg, W, f"{hf}.hf.ie", tokens[0], V)
        # 6. a 128k vocabulary, tied
        big = os.path.join(tmp, "llama3-128k")
        run([clocher, "synth", "--preset", "llama3-tiny", big, "--vocab", "128256", "--gguf",
             big + ".gguf"])
        run([clocher, "convert", big, big + ".hf.ie"])
        run([clocher, "convert", big + ".gguf", big + ".gg.ie"])
        why = same_iebin(big + ".hf.ie", big + ".gg.ie")
        check("llama3-tiny 128k vocabulary: HF and GGUF give the same IEBIN", why is None,
              why or "blob and manifest identical")
        with open(os.path.join(big, "config.json")) as f:
            cfg = json.load(f)
        W = read_safetensors(os.path.join(big, "model.safetensors"))
        V = cfg["vocab_size"]
        tokens = [int(t) for t in np.random.default_rng(5).integers(65536, V, N_PROMPT - 1)]
        tokens.append(V - 1)
        ref = reference(cfg, W, tokens)
        got = engine_logits(big + ".hf.ie", tokens, V)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        check("llama3-tiny 128k vocabulary: f32 logits at every position",
              bool(V == 128256 and err <= REL_TOL),
              f"vocabulary {V}, relative error {err:.3g} (tolerance {REL_TOL})")
    print(f"{passed} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
