/*
 * q8p.c — q8_0 matrices repacked at load time into 16-row panels (layout: quant.h, "q8_0
 * panels"; the why: ADR 0004, addendum "q8_0 panels"): the repacking, the way back to stored
 * rows, the products' entry points, the variants that are not AVX-512, and the dtype dispatch
 * over both panel kinds (kern_*_panels) that the worker's products call.
 *
 * As for q4_0 (q4p.c): the AVX-512 GEMM (x86/avx512_q.c) reads panels directly; every other
 * ISA unpacks one panel's 16 rows back into the stored q8_0 layout (the bytes of the file) and
 * runs that ISA's stored-row kernel on them, so a repacked model computes there what the
 * stored one did.
 *
 * NOTES: reentrant; the unpacked rows live in the calling thread's scratch slot 1 (slot 0 may
 * hold the activations kern_matmul_q8p prepared).
 */
#include "kern.h"
#include "internal.h"
#include "quant.h"

#include "check.h"

#include <stdint.h>
#include <string.h>

#define PR QUANT_Q8P_ROWS

/* Bytes of one stored q8_0 row of cols elements. */
static size_t row_bytes(size_t cols) { return cols / 32 * sizeof(struct quant_q8_0); }

size_t kern_q8p_bytes(size_t rows, size_t cols)
{
    return (rows + PR - 1) / PR * PR * row_bytes(cols);
}

void kern_q8p_pack(const void *w, size_t cols, void *dst, size_t rows, size_t p0, size_t p1)
{
    if (kern_isa() == KERN_ISA_AVX512) {
        kern__q8p_pack_avx512(w, cols, dst, rows, p0, p1);
        return;
    }
    const size_t nb = cols / 32, rb = row_bytes(cols);
    for (size_t p = p0; p < p1; p++) {
        uint8_t *pp = (uint8_t *)dst + p * PR * rb; /* the panel (quant.h) */
        for (size_t i = 0; i < PR; i++) {
            size_t r = p * PR + i;
            const struct quant_q8_0 *row =
                r < rows ? (const void *)((const uint8_t *)w + r * rb) : NULL;
            for (size_t b = 0; b < nb; b++) {
                uint8_t *q = pp + quant_q8p_qoff(b, nb), *sc = pp + quant_q8p_soff(b, nb);
                if (!row) { /* rows past the matrix: zero bytes (not +128) and zero scales */
                    for (size_t g = 0; g < 8; g++)
                        memset(q + g * 64 + i * 4, 0, 4);
                    memset(sc + i * 2, 0, 2);
                    continue;
                }
                for (size_t g = 0; g < 8; g++)
                    for (size_t j = 0; j < 4; j++)
                        q[g * 64 + i * 4 + j] = (uint8_t)row[b].qs[4 * g + j] ^ 0x80u;
                memcpy(sc + i * 2, &row[b].d, 2);
            }
        }
    }
}

void kern_q8p_rows(const void *wp, size_t cols, size_t r0, size_t r1, void *out)
{
    const size_t nb = cols / 32, rb = row_bytes(cols);
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *pp = (const uint8_t *)wp + r / PR * PR * rb;
        size_t i = r % PR;
        struct quant_q8_0 *row = (void *)((uint8_t *)out + (r - r0) * rb);
        for (size_t b = 0; b < nb; b++) {
            const uint8_t *q = pp + quant_q8p_qoff(b, nb);
            for (size_t g = 0; g < 8; g++)
                for (size_t j = 0; j < 4; j++)
                    row[b].qs[4 * g + j] = (int8_t)(q[g * 64 + i * 4 + j] ^ 0x80u);
            memcpy(&row[b].d, pp + quant_q8p_soff(b, nb) + i * 2, 2);
        }
    }
}

/*
 * Panel by panel: unpack rows [r, r + nr) into scratch and run fn on them (row 0 of the
 * scratch is row r, so y is offset by r); fn == NULL runs kern_matmul_act's routing instead.
 * Kernels have no error path: 16 rows are a few tens of KiB, and failing to get them aborts.
 */
static void via_rows(kern_mm_fn *fn, const void *wp, const struct kern_act *a, float *y,
                     size_t ldy, size_t r0, size_t r1)
{
    CHECK(a->wt == DT_Q8_0 && r0 % PR == 0);
    const size_t rb = row_bytes(a->cols);
    void *buf = kern__scratch_slot(1, PR * rb);
    CHECK(buf != NULL);
    for (size_t r = r0; r < r1; r += PR) {
        size_t nr = r1 - r < PR ? r1 - r : PR;
        kern_q8p_rows(wp, a->cols, r, r + nr, buf);
        if (fn)
            fn(buf, a, y + r, ldy, 0, nr);
        else
            kern_matmul_act(buf, a, y + r, ldy, 0, nr);
    }
}

void kern_gemm_q8_0p_q8_0_ref(const void *wp, const struct kern_act *a, float *y, size_t ldy,
                              size_t r0, size_t r1)
{
    via_rows(kern_gemm_q8_0_q8_0_ref, wp, a, y, ldy, r0, r1);
}

void kern_gemm_q8_0p_q8_0_avx2(const void *wp, const struct kern_act *a, float *y, size_t ldy,
                               size_t r0, size_t r1)
{
    via_rows(kern_gemm_q8_0_q8_0_avx2, wp, a, y, ldy, r0, r1);
}

void kern_matmul_act_q8p(const void *wp, const struct kern_act *a, float *y, size_t ldy,
                         size_t r0, size_t r1)
{
    if (r0 >= r1 || a->n == 0)
        return;
    if (kern_isa() == KERN_ISA_AVX512)
        kern_gemm_q8_0p_q8_0_avx512(wp, a, y, ldy, r0, r1);
    else
        via_rows(NULL, wp, a, y, ldy, r0, r1);
}

void kern_matmul_q8p(const void *wp, size_t cols, const float *x, size_t n, float *y,
                     size_t ldy, size_t r0, size_t r1)
{
    if (r0 >= r1 || n == 0)
        return;
    size_t bytes;
    CHECK(kern_act_bytes(DT_Q8_0, cols, n, &bytes) == 0);
    void *buf = bytes ? kern__scratch(bytes) : NULL;
    CHECK(!bytes || buf); /* see via_rows */
    struct kern_act a;
    kern_act_init(&a, DT_Q8_0, x, cols, n, buf);
    kern_act_prepare(&a, 0, n);
    kern_matmul_act_q8p(wp, &a, y, ldy, r0, r1);
}

/* ---- either panel kind, by dtype ---------------------------------------------------------- */

int kern_panels_supported(enum dtype wt) { return wt == DT_Q4_0 || wt == DT_Q8_0; }

size_t kern_panels_bytes(enum dtype wt, size_t rows, size_t cols)
{
    CHECK(kern_panels_supported(wt));
    return wt == DT_Q4_0 ? kern_q4p_bytes(rows, cols) : kern_q8p_bytes(rows, cols);
}

void kern_panels_pack(enum dtype wt, const void *w, size_t cols, void *dst, size_t rows,
                      size_t p0, size_t p1)
{
    CHECK(kern_panels_supported(wt));
    if (wt == DT_Q4_0)
        kern_q4p_pack(w, cols, dst, rows, p0, p1);
    else
        kern_q8p_pack(w, cols, dst, rows, p0, p1);
}

void kern_matmul_panels(enum dtype wt, const void *wp, size_t cols, const float *x, size_t n,
                        float *y, size_t ldy, size_t r0, size_t r1)
{
    CHECK(kern_panels_supported(wt));
    if (wt == DT_Q4_0)
        kern_matmul_q4p(wp, cols, x, n, y, ldy, r0, r1);
    else
        kern_matmul_q8p(wp, cols, x, n, y, ldy, r0, r1);
}

void kern_matmul_act_panels(enum dtype wt, const void *wp, const struct kern_act *a, float *y,
                            size_t ldy, size_t r0, size_t r1)
{
    CHECK(kern_panels_supported(wt) && a->wt == wt);
    if (wt == DT_Q4_0)
        kern_matmul_act_q4p(wp, a, y, ldy, r0, r1);
    else
        kern_matmul_act_q8p(wp, a, y, ldy, r0, r1);
}
