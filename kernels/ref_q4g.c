/*
 * ref_q4g.c — the int4 group types (q4_g64, q4_g128, q4z_g32, q4z_g64, q4z_g128; layouts in
 * kernels/include/quant.h and docs/IEBIN.md): dequantization, the converter's round-to-nearest
 * quantizer, and the scalar `_ref` twins of their GEMV/GEMM kernels (the specification the
 * AVX2 / AVX-512 variants in x86/avx*_q4g.c are tested against).
 *
 * Kept apart from ref.c so that q8_0/q4_0 stay as they were; the row converters
 * (kern__row_<type>) are these types' kern__traits to_f32 (traits.c).
 */
#include "internal.h"
#include "quant.h"

#include "check.h"
#include "err.h"
#include "half.h"
#include "log.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Header bytes before the nibble arrays: f16 d, plus f16 m for the q4z types. */
static size_t hdr_bytes(enum dtype dt) { return dtype_q4g_has_min(dt) ? 4 : 2; } /* q4_0: 2 */

static uint16_t load_u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Code j (0..31) of the 16-byte nibble array at qs, 0..15 (q4_0's element order). */
static int nib(const uint8_t *qs, int j) { return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4; }

static void q4g_row_to_f32(enum dtype dt, const void *row, float *out, size_t n)
{
    const struct dtype_info *di = dtype_info(dt);
    const size_t g = di->block, hb = hdr_bytes(dt);
    const int zp = dtype_q4g_has_min(dt);
    const uint8_t *b = row;
    for (size_t i = 0; i < n; i += g, b += di->block_bytes) {
        float d = half_f16_to_f32(load_u16(b)), m = zp ? half_f16_to_f32(load_u16(b + 2)) : 0.0f;
        for (size_t s = 0; s < g / 32; s++)
            for (int j = 0; j < 32; j++) {
                int q = nib(b + hb + 16 * s, j);
                out[i + 32 * s + (size_t)j] = zp ? d * (float)q + m : d * (float)(q - 8);
            }
    }
}

#define ROW_(wty, DT)                                                                        \
    void kern__row_##wty(const void *row, float *out, size_t n) { q4g_row_to_f32(DT, row, out, n); }
ROW_(q4_g64, DT_Q4_G64)
ROW_(q4_g128, DT_Q4_G128)
ROW_(q4z_g32, DT_Q4Z_G32)
ROW_(q4z_g64, DT_Q4Z_G64)
ROW_(q4z_g128, DT_Q4Z_G128)
#undef ROW_

/* Codes of one group for scale d and offset m (zp) or q4_0's -8 bias; returns the squared
 * error of the dequantized group. d and m are already f16-exact. */
static double code_group(const float *v, size_t g, int zp, float d, float m, uint8_t *codes)
{
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    double err = 0.0;
    for (size_t j = 0; j < g; j++) {
        float r = zp ? roundf((v[j] - m) * id) : roundf(v[j] * id) + 8.0f;
        codes[j] = (uint8_t)(r < 0.0f ? 0 : r > 15.0f ? 15 : r);
        float back = zp ? d * (float)codes[j] + m : d * (float)((int)codes[j] - 8);
        err += (double)(v[j] - back) * (double)(v[j] - back);
    }
    return err;
}

static float f16_round(float v) { return half_f16_to_f32(half_f32_to_f16(v)); }

/*
 * --rounding search: candidates around the round-to-nearest scale (and, with an offset, a
 * range shrunk from either end: clipping a few outliers buys finer steps for the rest), each
 * followed by one least-squares refit of the scale (and offset) for its codes, as llama.cpp's
 * make_qx_quants does; the candidate of least squared error wins. The RTN choice is one of
 * the candidates, so the error never exceeds it.
 */
static void search_group(const float *v, size_t g, int zp, float big, float lo, float hi,
                         float *d_out, float *m_out, uint8_t *codes)
{
    uint8_t tmp[128];
    float best_d = zp ? f16_round((hi - lo) / 15.0f) : f16_round(big / -8.0f);
    float best_m = zp ? f16_round(lo) : 0.0f;
    double best = code_group(v, g, zp, best_d, best_m, codes);
    for (int k = 0; k < 24; k++) {
        float d, m = 0.0f;
        if (zp) {
            /* shrink the low end by a, the high end by b, in steps of 2% of the range */
            float a = (float)(k % 5) * 0.02f, b = (float)(k / 5) * 0.02f, span = hi - lo;
            m = f16_round(lo + a * span);
            d = f16_round((hi - b * span - (lo + a * span)) / 15.0f);
        } else {
            d = f16_round(big / (-8.0f + 0.1f * (float)(k - 6))); /* -8.6 .. -5.7 */
        }
        for (int refit = 0; refit < 2; refit++) {
            double e = code_group(v, g, zp, d, m, tmp);
            if (e < best) {
                best = e;
                best_d = d;
                best_m = m;
                memcpy(codes, tmp, g);
            }
            if (refit)
                break;
            /* least squares for these codes: x ~ d*c (+ m) */
            double sc = 0, scc = 0, sx = 0, sxc = 0;
            for (size_t j = 0; j < g; j++) {
                double c = zp ? (double)tmp[j] : (double)tmp[j] - 8.0;
                sc += c;
                scc += c * c;
                sx += v[j];
                sxc += (double)v[j] * c;
            }
            if (zp) {
                double det = (double)g * scc - sc * sc;
                if (det <= 0)
                    break;
                d = f16_round((float)(((double)g * sxc - sc * sx) / det));
                m = f16_round((float)((sx - (double)d * sc) / (double)g));
            } else {
                if (scc <= 0)
                    break;
                d = f16_round((float)(sxc / scc));
            }
        }
    }
    *d_out = best_d;
    *m_out = best_m;
}

static int quantize_q4(enum dtype dt, const float *x, void *dst, size_t n, int search)
{
    CHECK(dtype_is_q4g(dt) || dt == DT_Q4_0);
    const struct dtype_info *di = dtype_info(dt);
    const size_t g = di->block, hb = hdr_bytes(dt);
    const int zp = dtype_q4g_has_min(dt);
    if (n % g != 0)
        return ERR_FORMAT;
    uint8_t *b = dst;
    for (size_t i = 0; i < n; i += g, b += di->block_bytes) {
        const float *v = x + i;
        float amax = 0.0f, big = 0.0f, lo = INFINITY, hi = -INFINITY;
        for (size_t j = 0; j < g; j++) {
            if (!isfinite(v[j])) {
                LOG_ERR("cannot quantize a non-finite value (%g)", (double)v[j]);
                return ERR_RANGE;
            }
            if (fabsf(v[j]) > amax) {
                amax = fabsf(v[j]);
                big = v[j];
            }
            lo = fminf(lo, v[j]);
            hi = fmaxf(hi, v[j]);
        }
        uint8_t codes[128];
        float d, m = 0.0f;
        if (search) {
            search_group(v, g, zp, big, lo, hi, &d, &m, codes);
        } else if (zp) {
            /* asymmetric: the group's range [min, max] spread over the 16 codes */
            d = f16_round((hi - lo) / 15.0f);
            m = f16_round(lo);
            code_group(v, g, zp, d, m, codes);
        } else {
            /* q4_0's rule: the largest magnitude maps exactly to code 0 (-8) */
            d = f16_round(big / -8.0f);
            code_group(v, g, zp, d, m, codes);
        }
        uint16_t d16 = half_f32_to_f16(d), m16 = half_f32_to_f16(m);
        memcpy(b, &d16, 2);
        if (zp)
            memcpy(b + 2, &m16, 2);
        for (size_t s = 0; s < g / 32; s++) {
            uint8_t *qs = b + hb + 16 * s;
            const uint8_t *cs = codes + 32 * s;
            for (int j = 0; j < 16; j++)
                qs[j] = (uint8_t)(cs[j] | (cs[j + 16] << 4));
        }
    }
    return 0;
}

int kern_quantize_row_q4g(enum dtype dt, const float *x, void *dst, size_t n)
{
    CHECK(dtype_is_q4g(dt));
    return quantize_q4(dt, x, dst, n, 0);
}

int kern_quantize_row_q4_search(enum dtype dt, const float *x, void *dst, size_t n)
{
    return quantize_q4(dt, x, dst, n, 1);
}

/*
 * The specification of the SIMD variants: per block of 32 columns b (group s = b / (N/32)),
 *   q4_gN:  acc += dw_s * dx_b * sum_j (q_j - 8) * xq_j
 *   q4z_gN: acc += dw_s * dx_b * sum_j q_j * xq_j + m_s * dx_b * sum_j xq_j
 * in column order with f32 accumulation; the integer sums are exact.
 */
static void mm_q4g_ref(enum dtype wt, const void *w, const struct kern_act *a, float *y,
                       size_t ldy, size_t r0, size_t r1)
{
    CHECK(a->wt == wt && a->q && dtype_is_q4g(wt));
    const struct dtype_info *di = dtype_info(wt);
    const size_t row_bytes = kern__row_bytes(wt, a->cols), nb = a->cols / 32;
    const size_t spg = di->block / 32, hb = hdr_bytes(wt); /* blocks of 32 per group */
    const int zp = dtype_q4g_has_min(wt);
    for (size_t t = 0; t < a->n; t++) {
        const int8_t *q = a->q + t * a->ld;     /* [cols] */
        const float *d = a->d + t * a->cp / 32; /* [cp/32] */
        for (size_t r = r0; r < r1; r++) {
            const uint8_t *row = (const uint8_t *)w + r * row_bytes;
            float acc = 0.0f;
            for (size_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b / spg * di->block_bytes;
                const uint8_t *qs = blk + hb + 16 * (b % spg);
                int32_t dot = 0, sum = 0;
                for (int j = 0; j < 32; j++) {
                    int xq = q[b * 32 + (size_t)j];
                    dot += (nib(qs, j) - (zp ? 0 : 8)) * xq;
                    sum += xq;
                }
                acc += half_f16_to_f32(load_u16(blk)) * d[b] * (float)dot;
                if (zp)
                    acc += half_f16_to_f32(load_u16(blk + 2)) * d[b] * (float)sum;
            }
            y[t * ldy + r] = acc;
        }
    }
}

#define Q4G_TWIN_(op, wty, aty, isa, DT)                                                     \
    void kern_##op##_##wty##_##aty##_##isa(const void *w, const struct kern_act *a, float *y, \
                                           size_t ldy, size_t r0, size_t r1)                 \
    {                                                                                        \
        mm_q4g_ref(DT, w, a, y, ldy, r0, r1);                                                \
    }

Q4G_TWIN_(gemv, q4_g64, q8_0, ref, DT_Q4_G64)
Q4G_TWIN_(gemm, q4_g64, q8_0, ref, DT_Q4_G64)
Q4G_TWIN_(gemv, q4_g128, q8_0, ref, DT_Q4_G128)
Q4G_TWIN_(gemm, q4_g128, q8_0, ref, DT_Q4_G128)
Q4G_TWIN_(gemv, q4z_g32, q8_0, ref, DT_Q4Z_G32)
Q4G_TWIN_(gemm, q4z_g32, q8_0, ref, DT_Q4Z_G32)
Q4G_TWIN_(gemv, q4z_g64, q8_0, ref, DT_Q4Z_G64)
Q4G_TWIN_(gemm, q4z_g64, q8_0, ref, DT_Q4Z_G64)
Q4G_TWIN_(gemv, q4z_g128, q8_0, ref, DT_Q4Z_G128)
Q4G_TWIN_(gemm, q4z_g128, q8_0, ref, DT_Q4Z_G128)
