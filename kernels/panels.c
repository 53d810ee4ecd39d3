/*
 * panels.c — quantized matrices repacked at load time into panels of rows (kern.h,
 * kern_panels_*; layouts: quant.h "q4_0 panels" / "q8_0 panels" / "mxfp4 panels" / "q4_K
 * panels" / "q6_K panels"; the why: ADR 0004, "load-time q4_0 panels" and addenda "q8_0
 * panels", "k-quant panels", "mxfp4 panels"): the repacking, the way back to stored rows, the
 * products' entry points and the fallback of ISAs without a panel kernel, for every type whose
 * traits have a panel layout (kern__traits[wt].panels).
 *
 * The AVX-512 GEMMs (x86/avx512_q.c, x86/avx512_kqp.c, x86/avx512_mxfp4.c) read panels
 * directly. Every other ISA
 * has no panel kernel: its variant unpacks one panel's rows back into the stored layout
 * (exactly the bytes of the file) and runs that ISA's stored-row kernel on them, so a
 * repacked model computes there what the stored one did.
 *
 * NOTES: reentrant; the unpacked rows live in the calling thread's scratch slot 1 (slot 0 may
 * hold the activations kern_matmul_panels prepared).
 */
#include "internal.h"

#include "check.h"
#include "quant.h"

#include <stdint.h>
#include <string.h>

/* The type's panel layout; aborts for a type without one (kern.h). */
static const struct kern__panel_layout *layout(enum dtype wt)
{
    CHECK(kern_panels_supported(wt));
    return kern__traits[wt].panels;
}

int kern_panels_supported(enum dtype wt)
{
    return (unsigned)wt < DT_COUNT_ && kern__traits[wt].panels != NULL;
}

size_t kern_panels_bytes(enum dtype wt, size_t rows, size_t cols)
{
    const struct kern__panel_layout *pl = layout(wt);
    return (rows + pl->rows - 1) / pl->rows * pl->rows * (cols / kern__traits[wt].block) *
           pl->block_bytes;
}

/* ---- q4_K panels (quant.h "q4_K panels") ------------------------------------------------- */

/* Row i's super-block blk (stored, 144 bytes; NULL: a row past the matrix, zeros) into the
 * panel super-block ps. */
static void q4kp_put(uint8_t *ps, size_t i, const uint8_t *blk)
{
    if (!blk) {
        memset(ps + QUANT_Q4KP_D + 2 * i, 0, 2);
        memset(ps + QUANT_Q4KP_DMIN + 2 * i, 0, 2);
        for (size_t j = 0; j < 8; j++)
            ps[QUANT_Q4KP_SC + 16 * j + i] = ps[QUANT_Q4KP_M + 16 * j + i] = 0;
        for (size_t g = 0; g < 32; g++) /* [c][g] as one index: 32 groups of 4 bytes */
            memset(ps + QUANT_Q4KP_QS + 64 * g + 4 * i, 0, 4);
        return;
    }
    const struct quant_q4_k *b = (const void *)blk;
    memcpy(ps + QUANT_Q4KP_D + 2 * i, blk, 2);
    memcpy(ps + QUANT_Q4KP_DMIN + 2 * i, blk + 2, 2);
    uint8_t sc[8], m[8];
    quant_kq_scales_mins(b->scales, sc, m);
    for (size_t j = 0; j < 8; j++) {
        ps[QUANT_Q4KP_SC + 16 * j + i] = sc[j];
        ps[QUANT_Q4KP_M + 16 * j + i] = m[j];
    }
    for (size_t g = 0; g < 32; g++) /* qs[4g..4g+3]: chunk g / 8, group g % 8 */
        memcpy(ps + QUANT_Q4KP_QS + 64 * g + 4 * i, b->qs + 4 * g, 4);
}

/* The stored super-block of row i back out of the panel super-block ps: the 12 scale bytes
 * re-encoded from the decoded ones (quant.h quant_kq_scale_min's packing, every bit of it
 * covered, so these are the file's bytes). */
static void q4kp_get(const uint8_t *ps, size_t i, uint8_t *blk)
{
    struct quant_q4_k *b = (void *)blk;
    memcpy(blk, ps + QUANT_Q4KP_D + 2 * i, 2);
    memcpy(blk + 2, ps + QUANT_Q4KP_DMIN + 2 * i, 2);
    uint8_t sc[8], m[8];
    for (size_t j = 0; j < 8; j++) {
        sc[j] = ps[QUANT_Q4KP_SC + 16 * j + i];
        m[j] = ps[QUANT_Q4KP_M + 16 * j + i];
    }
    for (size_t j = 0; j < 4; j++) {
        b->scales[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
        b->scales[j + 4] = (uint8_t)((m[j] & 63) | (m[j + 4] >> 4) << 6);
        b->scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
    }
    for (size_t g = 0; g < 32; g++)
        memcpy(b->qs + 4 * g, ps + QUANT_Q4KP_QS + 64 * g + 4 * i, 4);
}

/* ---- q6_K panels (quant.h "q6_K panels"): bytes moved, none changed ---------------------- */

/* Byte o of row i's stored super-block <-> its place in the panel super-block (o < 210). */
static size_t q6kp_at(size_t i, size_t o)
{
    if (o < 128) { /* ql: half o / 64, then vector (o % 64) / 32, group o % 32 / 4 */
        size_t h = o / 64, v = o % 64 / 32, g = o % 32 / 4;
        return QUANT_Q6KP_QS + ((h * 8 + g) * 3 + v) * 64 + 4 * i + o % 4;
    }
    if (o < 192) { /* qh: half (o - 128) / 32 */
        size_t h = (o - 128) / 32, g = (o - 128) % 32 / 4;
        return QUANT_Q6KP_QS + ((h * 8 + g) * 3 + 2) * 64 + 4 * i + o % 4;
    }
    if (o < 208)
        return QUANT_Q6KP_SC + 16 * (o - 192) + i;
    return QUANT_Q6KP_D + 2 * i + (o - 208);
}

/* The quants move in groups of 4 bytes (q6kp_at(i, o + k) = q6kp_at(i, o) + k for o % 4 == 0,
 * o < 192), the scales and d byte by byte. */
static void q6kp_put(uint8_t *ps, size_t i, const uint8_t *blk)
{
    static const uint8_t zero[sizeof(struct quant_q6_k)];
    const uint8_t *b = blk ? blk : zero;
    size_t o = 0;
    for (; o < 192; o += 4)
        memcpy(ps + q6kp_at(i, o), b + o, 4);
    for (; o < sizeof(struct quant_q6_k); o++)
        ps[q6kp_at(i, o)] = b[o];
}

static void q6kp_get(const uint8_t *ps, size_t i, uint8_t *blk)
{
    size_t o = 0;
    for (; o < 192; o += 4)
        memcpy(blk + o, ps + q6kp_at(i, o), 4);
    for (; o < sizeof(struct quant_q6_k); o++)
        blk[o] = ps[q6kp_at(i, o)];
}

/* The k-quant panel layouts: bytes per row and super-block, and the per-row movers. */
struct kqp_kind {
    size_t row_bytes, blk_bytes;
    void (*put)(uint8_t *ps, size_t i, const uint8_t *blk);
    void (*get)(const uint8_t *ps, size_t i, uint8_t *blk);
};

static const struct kqp_kind *kqp_kind(enum dtype wt)
{
    static const struct kqp_kind q4k = {QUANT_Q4KP_ROW_BYTES, sizeof(struct quant_q4_k),
                                        q4kp_put, q4kp_get};
    static const struct kqp_kind q6k = {QUANT_Q6KP_ROW_BYTES, sizeof(struct quant_q6_k),
                                        q6kp_put, q6kp_get};
    CHECK(wt == DT_Q4_K || wt == DT_Q6_K);
    return wt == DT_Q4_K ? &q4k : &q6k;
}

static void pack_kq(enum dtype wt, const void *w, size_t cols, void *dst, size_t rows,
                    size_t p0, size_t p1)
{
    const struct kqp_kind *k = kqp_kind(wt);
    const size_t nsb = cols / QUANT_K, rb = nsb * k->blk_bytes, sbb = 16 * k->row_bytes;
    for (size_t p = p0; p < p1; p++) {
        uint8_t *pp = (uint8_t *)dst + p * nsb * sbb;
        for (size_t s = 0; s < nsb; s++)
            for (size_t i = 0; i < 16; i++) {
                size_t r = p * 16 + i;
                const uint8_t *blk =
                    r < rows ? (const uint8_t *)w + r * rb + s * k->blk_bytes : NULL;
                k->put(pp + s * sbb, i, blk);
            }
    }
}

void kern__panels_pack_q4_k(const void *w, size_t cols, void *dst, size_t rows, size_t p0,
                            size_t p1)
{
    pack_kq(DT_Q4_K, w, cols, dst, rows, p0, p1);
}

void kern__panels_pack_q6_k(const void *w, size_t cols, void *dst, size_t rows, size_t p0,
                            size_t p1)
{
    pack_kq(DT_Q6_K, w, cols, dst, rows, p0, p1);
}

/* The scalar repack: block b of row i goes to its panel as the layout (internal.h) says. */
static void pack_ref(enum dtype wt, const void *w, size_t cols, void *dst, size_t rows,
                     size_t p0, size_t p1)
{
    const struct kern__panel_layout *pl = layout(wt);
    const size_t pr = pl->rows, bb = kern__traits[wt].block_bytes, hdr = pl->hdr;
    const size_t groups = (bb - hdr) / 4;
    const size_t nb = cols / kern__traits[wt].block, rb = kern__row_bytes(wt, cols);
    for (size_t p = p0; p < p1; p++) {
        uint8_t *pp = (uint8_t *)dst + p * pr * rb; /* the panel (quant.h) */
        for (size_t i = 0; i < pr; i++) {
            size_t r = p * pr + i;
            const uint8_t *row = r < rows ? (const uint8_t *)w + r * rb : NULL;
            for (size_t b = 0; b < nb; b++) {
                uint8_t *q = pp + pl->qoff(b, nb), *sc = pp + pl->soff(b, nb);
                if (!row) { /* rows past the matrix: zero bytes (never XORed) and scales */
                    for (size_t g = 0; g < groups; g++)
                        memset(q + g * 64 + i * 4, 0, 4);
                    memset(sc + i * hdr, 0, hdr);
                    continue;
                }
                const uint8_t *blk = row + b * bb, *qs = blk + hdr; /* scale, then quants */
                for (size_t g = 0; g < groups; g++)
                    for (size_t j = 0; j < 4; j++)
                        q[g * 64 + i * 4 + j] = qs[4 * g + j] ^ pl->xor_mask;
                memcpy(sc + i * hdr, blk, hdr);
            }
        }
    }
}

void kern__panels_pack_q4_0_ref(const void *w, size_t cols, void *dst, size_t rows, size_t p0,
                                size_t p1)
{
    pack_ref(DT_Q4_0, w, cols, dst, rows, p0, p1);
}

void kern__panels_pack_q8_0_ref(const void *w, size_t cols, void *dst, size_t rows, size_t p0,
                                size_t p1)
{
    pack_ref(DT_Q8_0, w, cols, dst, rows, p0, p1);
}

void kern__panels_pack_mxfp4_ref(const void *w, size_t cols, void *dst, size_t rows, size_t p0,
                                 size_t p1)
{
    pack_ref(DT_MXFP4, w, cols, dst, rows, p0, p1);
}

void kern_panels_pack(enum dtype wt, const void *w, size_t cols, void *dst, size_t rows,
                      size_t p0, size_t p1)
{
    CHECK(kern_panels_supported(wt));
    kern__ops.type[wt].panel_pack(w, cols, dst, rows, p0, p1);
}

void kern_panels_rows(enum dtype wt, const void *wp, size_t cols, size_t r0, size_t r1,
                      void *out)
{
    const struct kern__panel_layout *pl = layout(wt);
    if (!pl->qoff) { /* a k-quant layout */
        const struct kqp_kind *k = kqp_kind(wt);
        const size_t nsb = cols / QUANT_K, rb = nsb * k->blk_bytes, sbb = 16 * k->row_bytes;
        for (size_t r = r0; r < r1; r++) {
            const uint8_t *pp = (const uint8_t *)wp + r / 16 * nsb * sbb;
            for (size_t s = 0; s < nsb; s++)
                k->get(pp + s * sbb, r % 16, (uint8_t *)out + (r - r0) * rb + s * k->blk_bytes);
        }
        return;
    }
    const size_t pr = pl->rows, bb = kern__traits[wt].block_bytes, hdr = pl->hdr;
    const size_t groups = (bb - hdr) / 4;
    const size_t nb = cols / kern__traits[wt].block, rb = kern__row_bytes(wt, cols);
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *pp = (const uint8_t *)wp + r / pr * pr * rb;
        size_t i = r % pr;
        uint8_t *row = (uint8_t *)out + (r - r0) * rb;
        for (size_t b = 0; b < nb; b++) {
            uint8_t *blk = row + b * bb, *qs = blk + hdr;
            const uint8_t *q = pp + pl->qoff(b, nb);
            for (size_t g = 0; g < groups; g++)
                for (size_t j = 0; j < 4; j++)
                    qs[4 * g + j] = q[g * 64 + i * 4 + j] ^ pl->xor_mask;
            memcpy(blk, pp + pl->soff(b, nb) + i * hdr, hdr);
        }
    }
}

/*
 * Panel by panel: unpack rows [r, r + nr) into scratch and run fn on them (row 0 of the
 * scratch is row r, so y is offset by r); fn == NULL runs kern_matmul_act's routing instead.
 * Kernels have no error path: a panel's rows are a few tens of KiB, and failing to get them
 * aborts (kern_matmul's activations, far larger at prefill, are allocated first).
 */
static void via_rows(kern_mm_fn *fn, const void *wp, const struct kern_act *a, float *y,
                     size_t ldy, size_t r0, size_t r1)
{
    const size_t pr = layout(a->wt)->rows;
    CHECK(r0 % pr == 0);
    const size_t rb = kern__row_bytes(a->wt, a->cols);
    void *buf = kern__scratch_slot(1, pr * rb);
    CHECK(buf != NULL);
    for (size_t r = r0; r < r1; r += pr) {
        size_t nr = r1 - r < pr ? r1 - r : pr;
        kern_panels_rows(a->wt, wp, a->cols, r, r + nr, buf);
        if (fn)
            fn(buf, a, y + r, ldy, 0, nr);
        else
            kern_matmul_act(buf, a, y + r, ldy, 0, nr);
    }
}

void kern__panels_via_rows(const void *wp, const struct kern_act *a, float *y, size_t ldy,
                           size_t r0, size_t r1)
{
    via_rows(NULL, wp, a, y, ldy, r0, r1);
}

/* The named fallback variants (kern_variants.h): one ISA's stored-row gemm on each panel. */
#define VIA_ROWS_(wty, DT, isa)                                                              \
    void kern_gemm_##wty##p_q8_0_##isa(const void *wp, const struct kern_act *a, float *y,   \
                                       size_t ldy, size_t r0, size_t r1)                     \
    {                                                                                        \
        CHECK(a->wt == DT);                                                                  \
        via_rows(kern_gemm_##wty##_q8_0_##isa, wp, a, y, ldy, r0, r1);                       \
    }
VIA_ROWS_(q4_0, DT_Q4_0, ref)
VIA_ROWS_(q4_0, DT_Q4_0, avx2)
VIA_ROWS_(q8_0, DT_Q8_0, ref)
VIA_ROWS_(q8_0, DT_Q8_0, avx2)
VIA_ROWS_(q4_k, DT_Q4_K, ref)
VIA_ROWS_(q4_k, DT_Q4_K, avx2)
VIA_ROWS_(q6_k, DT_Q6_K, ref)
VIA_ROWS_(q6_k, DT_Q6_K, avx2)
VIA_ROWS_(mxfp4, DT_MXFP4, ref)
VIA_ROWS_(mxfp4, DT_MXFP4, avx2)
#undef VIA_ROWS_

void kern_matmul_act_panels(enum dtype wt, const void *wp, const struct kern_act *a, float *y,
                            size_t ldy, size_t r0, size_t r1)
{
    CHECK(kern_panels_supported(wt) && a->wt == wt);
    if (r0 >= r1 || a->n == 0)
        return;
    kern__ops.type[wt].panel_gemm(wp, a, y, ldy, r0, r1);
}

void kern_matmul_panels(enum dtype wt, const void *wp, size_t cols, const float *x, size_t n,
                        float *y, size_t ldy, size_t r0, size_t r1)
{
    CHECK(kern_panels_supported(wt));
    if (r0 >= r1 || n == 0)
        return;
    size_t bytes;
    CHECK(kern_act_bytes(wt, cols, n, &bytes) == 0);
    void *buf = bytes ? kern__scratch(bytes) : NULL;
    CHECK(!bytes || buf); /* see via_rows */
    struct kern_act a;
    kern_act_init(&a, wt, x, cols, n, buf);
    kern_act_prepare(&a, 0, n);
    kern_matmul_act_panels(wt, wp, &a, y, ldy, r0, r1);
}
