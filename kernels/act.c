/*
 * act.c — activations prepared once per product (struct kern_act, kern.h): int8 blocks of 32
 * for integer dot products against q8_0/q4_0 weights, bf16 copies for bf16 weights.
 *
 * The scalar kern__act_prepare_ref is the specification; x86/avx*_act.c compute the same bits
 * (tests/kern checks them bit for bit) because preparing is not negligible: a 64-token GEMM
 * with 2048 rows spends ~32 cycles per activation element, the scalar code ~20.
 * The quantization rule (kernels/include/quant.h): d = max|x|/127, q = round-half-even(x * 127/max|x|),
 * NaNs ignored by the max and quantized to -127 (garbage in, garbage out, but defined).
 */
#include "internal.h"
#include "quant.h"

#include "check.h"
#include "err.h"
#include "half.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

static int needs_q8(enum dtype wt) { return kern__traits[wt].act == KERN__ACT_Q8; }

/* Byte offsets of each array inside the buffer; each starts on a 64-byte boundary. */
struct act_layout {
    size_t q, d, ns4, ns32, d4, sc, sc_left, xb, xf, xt, total;
    int has_xt;
};

static int act_layout(enum dtype wt, size_t cols, size_t n, unsigned flags,
                      struct act_layout *l)
{
    CHECK((unsigned)wt < DT_COUNT_);
    if (cols % kern__traits[wt].block != 0)
        return ERR_FORMAT;
    memset(l, 0, sizeof *l);
    size_t cp = kern__round_up(cols, KERN__ACT_PAD), elems, off = 0;
    if (cp < cols || __builtin_mul_overflow(cp + KERN__ACT_PAD, n, &elems) ||
        elems > SIZE_MAX / 16)
        return ERR_OVERFLOW;
    /* elems counts padded rows (ld = cp + 64): an upper bound for every array below */
    if (needs_q8(wt)) {
        /* the AMX-BF16 panel product's A tiles (kern.h, xt): npad x cols bf16, cols a
         * multiple of 32 here (q8 types have blocks of 32 or more) */
        const size_t tmin = kern__ops.type[wt].tiles_min_n;
        if ((flags & KERN_ACT_BF16_TILES) && tmin && n >= tmin && cols % 32 == 0) {
            /* With xt, no int8 blocks (q, d, ns4, ns32, d4 stay NULL): nothing reads them.
             * xt exists only where the type's amx overlay sets tiles_min_n (q4_0, q8_0 with
             * AMX allowed), and on such acts (a) kern_matmul_act_panels runs the type's
             * panel_gemm, kern_gemm_q{4,8}_0p_q8_0_amx (x86/amx_q.c), which takes the bf16
             * kernel whenever xt is set; that kernel reads x and xt only (out of scratch it
             * runs the ref twin, which reads x); (b) kern_matmul_act (rows-stored weights,
             * e.g. CLOCHER_Q4_PANELS=0) sees q == NULL and quantizes x itself
             * (dispatch.c); (c) the batch-invariant rows and the fused LoRA job never get
             * the flag (worker/model/matmul*.c pass 0 there), so they always have q.
             * tests/kern test_amx_qbf16_dispatch checks (a) and (b). Saves the int8
             * quantization (~2-3% of an int4 prefill, s19-amxb2) and its memory. */
            l->has_xt = 1;
            l->xt = off;
            off += kern__round_up(n, 16) * cols * sizeof(uint16_t);
        } else {
            /* elems <= SIZE_MAX/16 keeps every sum below from overflowing */
            l->q = off;
            off += elems;
            l->d = off;
            off += kern__round_up(elems / 32 * sizeof(float), 64);
            l->ns32 = off;
            off += kern__round_up(elems / 32 * sizeof(int32_t), 64);
            l->ns4 = off;
            off += elems / 4 * sizeof(int32_t);
            l->d4 = off;
            off += elems / 4 * sizeof(float);
            if (cols % 32 == 0) { /* n x cols/32 pairs: within elems / 32 x 8 bytes */
                l->sc = off;
                off += kern__round_up(elems / 32 * sizeof(struct kern_act_sc), 64);
                l->sc_left = off; /* a line of its own */
                off += 64;
            }
        }
    } else {
        l->xf = off;
        off += elems * sizeof(float);
        if (kern__traits[wt].act == KERN__ACT_BF16) {
            l->xb = off;
            off += elems * sizeof(uint16_t);
        }
    }
    l->total = off;
    return 0;
}

int kern_act_bytes_ex(enum dtype wt, size_t cols, size_t n, unsigned flags, size_t *out)
{
    struct act_layout l;
    int rc = act_layout(wt, cols, n, flags, &l);
    if (rc == 0)
        *out = l.total;
    return rc;
}

int kern_act_bytes(enum dtype wt, size_t cols, size_t n, size_t *out)
{
    return kern_act_bytes_ex(wt, cols, n, 0, out);
}

void kern_act_init_ex(struct kern_act *a, enum dtype wt, const float *x, size_t cols, size_t n,
                      unsigned flags, void *buf)
{
    struct act_layout l;
    CHECK(act_layout(wt, cols, n, flags, &l) == 0);
    CHECK(l.total == 0 || ((uintptr_t)buf & 63) == 0);
    uint8_t *b = buf;
    memset(a, 0, sizeof *a);
    a->wt = wt;
    a->cols = cols;
    a->n = n;
    a->cp = kern__round_up(cols, KERN__ACT_PAD);
    a->ld = a->cp + KERN__ACT_PAD;
    a->x = x;
    if (needs_q8(wt)) {
        if (l.has_xt) { /* xt instead of the int8 blocks (act_layout) */
            a->xt = (uint16_t *)(void *)(b + l.xt);
        } else {
            a->q = (int8_t *)(b + l.q);
            a->d = (float *)(void *)(b + l.d);
            a->ns32 = (int32_t *)(void *)(b + l.ns32);
            a->ns4 = (int32_t *)(void *)(b + l.ns4);
            a->d4 = (float *)(void *)(b + l.d4);
            if (l.sc) {
                a->sc = (struct kern_act_sc *)(void *)(b + l.sc);
                a->sc_left = (atomic_size_t *)(void *)(b + l.sc_left);
                atomic_init(a->sc_left, n);
            }
        }
    } else {
        a->xf = (float *)(void *)(b + l.xf);
        if (kern__traits[wt].act == KERN__ACT_BF16)
            a->xb = (uint16_t *)(void *)(b + l.xb);
    }
}

void kern_act_init(struct kern_act *a, enum dtype wt, const float *x, size_t cols, size_t n,
                   void *buf)
{
    kern_act_init_ex(a, wt, x, cols, n, 0, buf);
}

/* One block of 32 activations (block types only, so never a ragged block). */
static void quantize_block(const float *x, int8_t *q, float *d)
{
    float amax = 0.0f;
    for (int i = 0; i < 32; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    float dd = amax / (float)QUANT_ACT_QMAX;
    float id = dd > 0.0f ? (float)QUANT_ACT_QMAX / amax : 0.0f;
    for (int i = 0; i < 32; i++) {
        /* clamp first: NaN/inf inputs give garbage, never undefined behaviour */
        float v = fminf(fmaxf(x[i] * id, -(float)QUANT_ACT_QMAX), (float)QUANT_ACT_QMAX);
        /* round half to even (the default rounding mode) without a libm call: adding
         * 1.5 * 2^23 leaves no fraction bits for |v| <= 2^22 */
        v = (v + 12582912.0f) - 12582912.0f;
        q[i] = (int8_t)v;
    }
    *d = dd;
}

/* kern_act.sc from d and ns32, every token's: tiles of near-equal size (n = 12: 6 + 6, not
 * 8 + 4), written in the order the products read them */
static void act_gather_sc(const struct kern_act *a)
{
    const size_t nb = a->cols / 32, cb = a->cp / 32;
    const size_t ntiles = (a->n + KERN_ACT_SC_NT - 1) / KERN_ACT_SC_NT;
    size_t nt;
    for (size_t t = 0, ti = 0; t < a->n; t += nt, ti++) {
        nt = (a->n - t + (ntiles - ti) - 1) / (ntiles - ti);
        struct kern_act_sc *s = a->sc + t * nb;
        for (size_t b = 0; b < nb; b++)
            for (size_t j = 0; j < nt; j++)
                s[b * nt + j] = (struct kern_act_sc){a->d[(t + j) * cb + b],
                                                     a->ns32[(t + j) * cb + b]};
    }
}

void kern_act_prepare(const struct kern_act *a, size_t t0, size_t t1)
{
    CHECK(t0 <= t1 && t1 <= a->n);
    if (a->xf) {
        for (size_t t = t0; t < t1; t++) {
            memcpy(a->xf + t * a->ld, a->x + t * a->cols, a->cols * sizeof(float));
            memset(a->xf + t * a->ld + a->cols, 0, (a->ld - a->cols) * sizeof(float));
        }
    }
    if (a->q || a->xb)
        kern__ops.act_prepare(a, t0, t1);
    /* the call that prepares the last tokens lays out sc for all (kern.h: each token once
     * after kern_act_init, but a call over all of them may repeat): a line of sc holds one
     * block of 8 tokens, so threads that prepared token ranges of one tile and wrote their
     * own entries shared every line (measured: slower than gathering per product call).
     * acq_rel: each call's release publishes its d and ns32, the last one acquires them all
     * (the chain of read-modify-writes); the caller's own synchronisation after preparing
     * publishes sc with them. */
    if (a->sc && t0 == 0 && t1 == a->n) { /* all in one call (tests prepare acts again) */
        act_gather_sc(a);
    } else if (a->sc && t1 > t0) {
        const size_t left = atomic_fetch_sub_explicit(a->sc_left, t1 - t0, memory_order_acq_rel);
        CHECK(left >= t1 - t0); /* each token prepared once after kern_act_init */
        if (left == t1 - t0)
            act_gather_sc(a);
    }
    if (a->xt) /* only laid out where the type's act_tiles exists (act_layout) */
        kern__ops.type[a->wt].act_tiles(a, t0, t1);
}

void kern__act_prepare_ref(const struct kern_act *a, size_t t0, size_t t1)
{
    size_t cols = a->cols, cp = a->cp;
    int32_t off = kern__traits[a->wt].act_offset;
    for (size_t t = t0; t < t1; t++) {
        const float *x = a->x + t * cols; /* [cols] */
        if (a->q) {
            int8_t *q = a->q + t * a->ld;
            int32_t *ns32 = a->ns32 + t * cp / 32;
            float *d = a->d + t * cp / 32;
            int32_t *ns4 = a->ns4 + t * cp / 4;
            float *d4 = a->d4 + t * cp / 4;
            for (size_t b = 0; b < cp / 32; b++) {
                if (b * 32 < cols) {
                    quantize_block(x + b * 32, q + b * 32, &d[b]);
                } else {
                    memset(q + b * 32, 0, 32);
                    d[b] = 0.0f;
                }
            }
            for (size_t b = 0; b < cp / 32; b++)
                ns32[b] = 0;
            for (size_t g = 0; g < cp / 4; g++) {
                ns4[g] = -off * (q[4 * g] + q[4 * g + 1] + q[4 * g + 2] + q[4 * g + 3]);
                ns32[g / 8] += ns4[g];
                d4[g] = d[g / 8];
            }
        }
        if (a->xb) {
            uint16_t *xb = a->xb + t * a->ld;
            for (size_t c = 0; c < cols; c++)
                xb[c] = half_f32_to_bf16(x[c]);
            for (size_t c = cols; c < cp; c++)
                xb[c] = 0;
        }
    }
}
