#!/usr/bin/python3
"""int8_sensitivity.py — issue 3's diagnosis of stories260K int8 (Q8_0), reproducible.

Not run by ctest (it needs numpy; tests must not). A float64 numpy re-implementation of
worker/model/forward.c for llama2.c checkpoints (checked here against golden.json's prompt logits,
|error| ~3e-5), used to quantize weights in simulation (Q8_0 and Q4_0 exactly as
client/offline/convert.c does: blocks of 32 along each row, f16 scale) and measure, teacher-forced
over IDS (one sequence of token ids per line, e.g. bench/quality.sh's stories260K input):
 - KL(p_f32 || p_x) mean and top-1 agreement, per tensor class quantized alone and all together;
 - Gaussian noise of the same RMS as Q8_0's rounding error (is it the rounding or the size?);
 - f16 weights; the tied embedding kept f16;
 - GPTQ (error feedback with the calibration Hessian X^T X, 1% damping; each block's one f16
   scale taken from its weights as updated when the block starts) and AWQ (per-input-channel scale mean|x|^a, a searched per layer and
   projection group on the calibration activations, divided back after rounding: the same
   function as the exact transform folded into the preceding norm/rows);
 - per-input-channel activation RMS (max / median): are there outlier channels?
 - how far each dtype moves the top-1 minus top-2 logit margin (median, p99, max);
 - the golden cases: first greedy step that differs (teacher-forced on the golden ids) and its
   golden margin, up to the first step with margin < 0.01.
Calibration activations for GPTQ/AWQ: the first 3 sequences of IDS, captured on the f32 model.

Usage: python3 tests/convert/int8_sensitivity.py CHECKPOINT GOLDEN_JSON IDS
"""
import json
import struct
import sys

import numpy as np


def load(path):
    f = open(path, "rb").read()
    dim, hid, n_layers, n_heads, n_kv, vocab, seq = struct.unpack("7i", f[:28])
    if vocab < 0:
        sys.exit("only checkpoints with a shared classifier are handled here")
    hd = dim // n_heads
    a = np.frombuffer(f[28:], dtype=np.float32)
    off = [0]

    def take(*shape):
        n = int(np.prod(shape))
        r = a[off[0]:off[0] + n].reshape(shape).astype(np.float64)
        off[0] += n
        return r
    w = dict(emb=take(vocab, dim), ra=take(n_layers, dim), wq=take(n_layers, dim, dim),
             wk=take(n_layers, n_kv * hd, dim), wv=take(n_layers, n_kv * hd, dim),
             wo=take(n_layers, dim, dim), rf=take(n_layers, dim),
             w1=take(n_layers, hid, dim), w2=take(n_layers, dim, hid),
             w3=take(n_layers, hid, dim), rfin=take(dim))
    w["out"] = w["emb"]
    return w, dict(dim=dim, L=n_layers, H=n_heads, KV=n_kv, hd=hd)


W, P = load(sys.argv[1])
L, H, KV, HD = P["L"], P["H"], P["KV"], P["hd"]


def rms(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * w


def rope(x, n, nh):
    ang = np.arange(n)[:, None] * 10000.0 ** (-2 * np.arange(HD // 2) / HD)
    c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
    x = x.reshape(n, nh, HD // 2, 2)
    x0, x1 = x[..., 0], x[..., 1]
    return np.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).reshape(n, nh * HD)


def forward(w, ids, cap=None):
    n = len(ids)
    x = w["emb"][ids].copy()
    mask = np.triu(np.full((n, n), -np.inf), 1)
    g = H // KV
    for l in range(L):
        xb = rms(x, w["ra"][l])
        if cap is not None:
            cap.setdefault(("qkv", l), []).append(xb)
        q = rope(xb @ w["wq"][l].T, n, H)
        k = rope(xb @ w["wk"][l].T, n, KV)
        v = xb @ w["wv"][l].T
        att = np.zeros((n, H * HD))
        for h in range(H):
            kh = h // g
            sc = q[:, h * HD:(h + 1) * HD] @ k[:, kh * HD:(kh + 1) * HD].T / np.sqrt(HD) + mask
            sc = np.exp(sc - sc.max(1, keepdims=True))
            att[:, h * HD:(h + 1) * HD] = (sc / sc.sum(1, keepdims=True)) @ v[:, kh * HD:(kh + 1) * HD]
        if cap is not None:
            cap.setdefault(("o", l), []).append(att)
        x = x + att @ w["wo"][l].T
        xb = rms(x, w["rf"][l])
        if cap is not None:
            cap.setdefault(("gu", l), []).append(xb)
        a = xb @ w["w1"][l].T
        hh = a / (1 + np.exp(-a)) * (xb @ w["w3"][l].T)
        if cap is not None:
            cap.setdefault(("down", l), []).append(hh)
        x = x + hh @ w["w2"][l].T
    return rms(x, w["rfin"]) @ w["out"].T


def f16r(v):
    return v.astype(np.float16).astype(np.float64)


def q8(w):
    sh = w.shape
    w = w.reshape(-1, 32)
    d = f16r(np.abs(w).max(1, keepdims=True) / 127)
    inv = np.where(d != 0, 1 / np.where(d == 0, 1, d), 0)
    return (np.clip(np.round(w * inv), -127, 127) * d).reshape(sh)


def q4(w):
    sh = w.shape
    w = w.reshape(-1, 32)
    m = w[np.arange(len(w)), np.abs(w).argmax(1)][:, None]
    d = f16r(m / -8)
    inv = np.where(d != 0, 1 / np.where(d == 0, 1, d), 0)
    return ((np.clip(np.round(w * inv) + 8, 0, 15) - 8) * d).reshape(sh)


MATS = ["emb", "wq", "wk", "wv", "wo", "w1", "w3"]  # w2 (172 columns) stays f32 in int8/int4
GROUPS = [(["wq", "wk", "wv"], "qkv"), (["wo"], "o"), (["w1", "w3"], "gu")]


def with_(changes):
    w = dict(W)
    w.update(changes)
    w["out"] = w["emb"]
    return w


def logsm(z):
    z = z - z.max(1, keepdims=True)
    return z - np.log(np.exp(z).sum(1, keepdims=True))


SEQS = [np.array(list(map(int, l.split()))) for l in open(sys.argv[3]) if l.strip()]
REF = [forward(W, s[:-1]) for s in SEQS]


def quality(w):
    kl = agree = n = 0
    dm = []
    for s, a in zip(SEQS, REF):
        b = forward(w, s[:-1])
        pa, pb = logsm(a), logsm(b)
        kl += (np.exp(pa) * (pa - pb)).sum()
        agree += (a.argmax(1) == b.argmax(1)).sum()
        n += len(a)
        o = np.argsort(-a, 1)
        r = np.arange(len(a))
        dm.append(np.abs((b[r, o[:, 0]] - b[r, o[:, 1]]) - (a[r, o[:, 0]] - a[r, o[:, 1]])))
    dm = np.concatenate(dm)
    return kl / n, agree / n, dm


CASES = json.load(open(sys.argv[2]))["cases"]


def golden(w):
    out = []
    for c in CASES:
        p, gr, m = c["prompt"], c["greedy"], c["greedy_margin"]
        lim = next((i for i, x in enumerate(m) if x < 0.01), len(gr))
        lg = forward(w, np.array(p + gr[:lim])[:len(p) + lim - 1])
        pred = lg[len(p) - 1:len(p) - 1 + lim].argmax(1)
        bad = np.nonzero(pred != np.array(gr[:lim]))[0]
        out.append("ok" if len(bad) == 0 else f"{bad[0]}@{m[bad[0]]:.3f}")
    return " ".join(out)


def row(name, w):
    kl, t1, dm = quality(w)
    print(f"| {name} | {kl:.5f} | {100 * t1:.2f}% | {np.median(dm):.4f} | "
          f"{np.percentile(dm, 99):.3f} | {dm.max():.3f} | {golden(w)} |", flush=True)


c = CASES[1]
err = np.abs(forward(W, np.array(c["prompt"])) - np.array(c["prompt_logits"])).max()
print(f"numpy forward vs golden prompt logits (case 1): max |error| {err:.2g}")
cap = {}
for s in SEQS[:3]:
    forward(W, s[:-1], cap)
X = {k: np.concatenate(v) for k, v in cap.items()}
print("\nactivation RMS per input channel, max/median (layers 0..%d):" % (L - 1))
for kind in ["qkv", "o", "gu", "down"]:
    r = [np.sqrt((X[(kind, l)] ** 2).mean(0)) for l in range(L)]
    print(f"  {kind:5s}", " ".join(f"{x.max() / np.median(x):.2f}" for x in r))
print("\nQ8_0 relative RMS weight error per class:",
      " ".join(f"{k} {np.linalg.norm(q8(W[k]) - W[k]) / np.linalg.norm(W[k]):.4f}" for k in MATS))


def block_scale(blk, qf):
    """The f16 scale convert.c gives a [rows][32] block (Q8_0: max|x|/127; Q4_0: -m/8)."""
    if qf is q8:
        return f16r(np.abs(blk).max(1) / 127), -127, 127
    m = blk[np.arange(len(blk)), np.abs(blk).argmax(1)]
    return f16r(m / -8), -8, 7


def gptq(wm, xc, qf):
    wm = wm.copy()
    n = wm.shape[1]
    hm = xc.T @ xc
    hm += 0.01 * np.mean(np.diag(hm)) * np.eye(n)
    u = np.linalg.cholesky(np.linalg.inv(hm)).T
    out = np.zeros_like(wm)
    for b in range(0, n, 32):
        # one scale per block, from its weights as updated by the columns before it
        d, lo, hi = block_scale(wm[:, b:b + 32], qf)
        inv = np.where(d != 0, 1 / np.where(d == 0, 1, d), 0)
        for j in range(b, b + 32):
            out[:, j] = np.clip(np.round(wm[:, j] * inv), lo, hi) * d
            e = (wm[:, j] - out[:, j]) / u[j, j]
            wm[:, j + 1:] -= np.outer(e, u[j, j + 1:])
    return out


def awq(mats, xc, qf, grid=20):
    a = np.abs(xc).mean(0)
    ref = [xc @ m.T for m in mats]
    best = None
    for i in range(grid + 1):
        s = a ** (i / grid)
        s = s / np.sqrt(s.max() * s.min())
        qs = [qf(m * s) / s for m in mats]
        e = sum(((xc @ q.T - r) ** 2).sum() for q, r in zip(qs, ref))
        if best is None or e < best[0]:
            best = (e, qs)
    return best[1]


def layers(method, qf):
    ch = {k: W[k].copy() for k in ["wq", "wk", "wv", "wo", "w1", "w3"]}
    for l in range(L):
        for keys, xk in GROUPS:
            if method == "awq":
                for k, q in zip(keys, awq([W[k][l] for k in keys], X[(xk, l)], qf)):
                    ch[k][l] = q
            else:
                for k in keys:
                    ch[k][l] = gptq(W[k][l], X[(xk, l)], qf) if method == "gptq" else qf(W[k][l])
    return ch


print("\n| weights (rest f32) | KLD mean | top-1 | abs Δmargin median | p99 | max | golden cases: first differing step@margin |")
print("|---|---|---|---|---|---|---|")
rng = np.random.default_rng(0)
row("f16, all matrices", with_({k: f16r(W[k]) for k in MATS + ["w2"]}))
for k in MATS:
    row(f"Q8_0 {k} only", with_({k: q8(W[k])}))
row("Q8_0 all (= --dtype int8)", with_({k: q8(W[k]) for k in MATS}))
row("Gaussian noise, Q8_0's RMS, all",
    with_({k: W[k] + rng.standard_normal(W[k].shape) * (q8(W[k]) - W[k]).std() for k in MATS}))
row("Q8_0 all, embedding f16", with_(dict(layers("rtn", q8), emb=f16r(W["emb"]))))
row("Q8_0 + GPTQ", with_(dict(layers("gptq", q8), emb=q8(W["emb"]))))
row("Q8_0 + GPTQ, embedding f16", with_(dict(layers("gptq", q8), emb=f16r(W["emb"]))))
row("Q8_0 + AWQ", with_(dict(layers("awq", q8), emb=q8(W["emb"]))))
row("Q4_0 all (= --dtype int4)", with_(dict(layers("rtn", q4), emb=q4(W["emb"]))))
row("Q4_0 + AWQ", with_(dict(layers("awq", q4), emb=q4(W["emb"]))))
row("Q4_0 + GPTQ, embedding Q8_0", with_(dict(layers("gptq", q4), emb=q8(W["emb"]))))
