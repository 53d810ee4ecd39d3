/*
 * avx2_attn.c — the attention tile kernel with AVX2+FMA (kern.h; the scalar specification is
 * kern_attn_<kvt>_f32_ref in kernels/attn.c): 8 lanes over the head dimension, ragged head
 * dims with vmaskmovps (masked lanes are neither read nor written). No AVX-512 here: this
 * file is compiled with -mavx2 -mfma -mf16c only.
 *
 * The same shape as avx512_attn.c: f16/bf16 K/V sub-tiles widened once and shared by every
 * query row; scores four positions at a time; exp 8 scores at a time (avx2_exp.h, the scalar
 * fm_expf's algorithm); o = o*corr + sum_j e_j v_j one 8-float slice of o at a time.
 *
 * 8-bit KV head rows (int8, fp8 E4M3 with an f32 scale; kern.h) are decoded into the same
 * widened tiles by widen_kvi8 / widen_kvf8, bit for bit kern_kv8_dequant.
 *
 * NOTES: reentrant; at most 2 x ATTN_BUF floats (64 KiB) of stack.
 */
#include "avx2_exp.h"
#include "fastmath.h"
#include "internal.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define ATTN_BUF 8192 /* floats per widened K (or V) sub-tile: rows = ATTN_BUF / hd */

/* lanes(n, i): the lanes i .. min(n, i+8)-1 of a vector starting at element i. */
static const int32_t g_mask_tab[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
static inline __m256i lanes(size_t n, size_t i)
{
    return _mm256_loadu_si256((const __m256i *)(g_mask_tab + 8 - (n - i >= 8 ? 8 : n - i)));
}

static inline float hsum8(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

static inline float hmax8(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* As avx512_attn.c's tile_f32: nq rows over n <= KERN_ATTN_TILE positions of f32 rows, row r
 * clipped to [lo[r] - j0, vis[r] - j0). */
static void tile_f32(const float *const *q, float *const *o, float *m, float *l,
                     const uint32_t *lo, const uint32_t *vis, size_t j0, size_t nq,
                     const float *kf, const float *vf, size_t ldf, size_t n, size_t hd,
                     float scale)
{
    float s[KERN_ATTN_TILE] __attribute__((aligned(32))); /* [n] scores, then weights */
    for (size_t r = 0; r < nq; r++) {
        size_t nv = vis ? (vis[r] > j0 ? vis[r] - j0 : 0) : n;
        if (nv > n)
            nv = n;
        const size_t a = lo && lo[r] > j0 ? lo[r] - j0 : 0; /* the window's start */
        if (a >= nv)
            continue;
        nv -= a; /* positions [a, a+nv) of the tile, as rows [0, nv) from kr / vr */
        const float *qr = q[r], *kr = kf + a * ldf, *vr = vf + a * ldf;
        size_t j = 0;
        for (; j + 4 <= nv; j += 4) {
            const float *k0 = kr + j * ldf, *k1 = k0 + ldf, *k2 = k1 + ldf, *k3 = k2 + ldf;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (size_t d = 0; d < hd; d += 8) {
                const __m256i mk = lanes(hd, d);
                const __m256 x = _mm256_maskload_ps(qr + d, mk);
                a0 = _mm256_fmadd_ps(x, _mm256_maskload_ps(k0 + d, mk), a0);
                a1 = _mm256_fmadd_ps(x, _mm256_maskload_ps(k1 + d, mk), a1);
                a2 = _mm256_fmadd_ps(x, _mm256_maskload_ps(k2 + d, mk), a2);
                a3 = _mm256_fmadd_ps(x, _mm256_maskload_ps(k3 + d, mk), a3);
            }
            s[j + 0] = hsum8(a0);
            s[j + 1] = hsum8(a1);
            s[j + 2] = hsum8(a2);
            s[j + 3] = hsum8(a3);
        }
        for (; j < nv; j++) {
            const float *k0 = kr + j * ldf;
            __m256 a0 = _mm256_setzero_ps();
            for (size_t d = 0; d < hd; d += 8) {
                const __m256i mk = lanes(hd, d);
                a0 = _mm256_fmadd_ps(_mm256_maskload_ps(qr + d, mk),
                                     _mm256_maskload_ps(k0 + d, mk), a0);
            }
            s[j] = hsum8(a0);
        }
        /* scale, tile maximum, weights e^(s - m') and their sum, 8 scores at a time */
        const __m256 vs = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
        __m256 vmx = ninf;
        for (j = 0; j < nv; j += 8) {
            const __m256i mk = lanes(nv, j);
            __m256 x = _mm256_mul_ps(_mm256_maskload_ps(s + j, mk), vs);
            _mm256_maskstore_ps(s + j, mk, x);
            vmx = _mm256_max_ps(vmx, _mm256_blendv_ps(ninf, x, _mm256_castsi256_ps(mk)));
        }
        const float mx = hmax8(vmx);
        const float mn = m[r] > mx ? m[r] : mx;
        const float corr = fm_expf(m[r] - mn); /* 0 on the first tile (m = -inf) */
        __m256 vsum = _mm256_setzero_ps();
        const __m256 vmn = _mm256_set1_ps(mn);
        for (j = 0; j < nv; j += 8) {
            const __m256i mk = lanes(nv, j);
            __m256 e = exp8(_mm256_sub_ps(_mm256_maskload_ps(s + j, mk), vmn));
            e = _mm256_and_ps(e, _mm256_castsi256_ps(mk));
            _mm256_maskstore_ps(s + j, mk, e);
            vsum = _mm256_add_ps(vsum, e);
        }
        l[r] = l[r] * corr + hsum8(vsum);
        m[r] = mn;
        /* o = o*corr + sum_j e_j v_j, one 8-float slice of o in a register at a time */
        float *orow = o[r];
        const __m256 vc = _mm256_set1_ps(corr);
        for (size_t d = 0; d < hd; d += 8) {
            const __m256i mk = lanes(hd, d);
            __m256 acc = _mm256_mul_ps(_mm256_maskload_ps(orow + d, mk), vc);
            __m256 acc2 = _mm256_setzero_ps();
            const float *vp = vr + d;
            for (j = 0; j + 2 <= nv; j += 2, vp += 2 * ldf) {
                acc = _mm256_fmadd_ps(_mm256_set1_ps(s[j]), _mm256_maskload_ps(vp, mk), acc);
                acc2 = _mm256_fmadd_ps(_mm256_set1_ps(s[j + 1]),
                                       _mm256_maskload_ps(vp + ldf, mk), acc2);
            }
            if (j < nv)
                acc = _mm256_fmadd_ps(_mm256_set1_ps(s[j]), _mm256_maskload_ps(vp, mk), acc);
            _mm256_maskstore_ps(orow + d, mk, _mm256_add_ps(acc, acc2));
        }
    }
}

/* 8 halves at h (only the first c < 8 exist: copied to a zeroed buffer, never read past). */
static inline __m128i load8_u16(const uint16_t *h, size_t c)
{
    if (c >= 8)
        return _mm_loadu_si128((const __m128i *)(const void *)h);
    uint16_t t[8] = {0};
    memcpy(t, h, c * sizeof *h);
    return _mm_loadu_si128((const __m128i *)(const void *)t);
}

/* n rows of hd f16 / bf16 elements (row j at src + j*ld bytes) -> dst [n][hd] f32. */
static void widen_f16(float *dst, const void *src, size_t ld, size_t n, size_t hd)
{
    for (size_t j = 0; j < n; j++) {
        const uint16_t *h = (const uint16_t *)(const void *)((const char *)src + j * ld);
        for (size_t d = 0; d < hd; d += 8)
            _mm256_maskstore_ps(dst + j * hd + d, lanes(hd, d),
                                _mm256_cvtph_ps(load8_u16(h + d, hd - d)));
    }
}

static void widen_bf16(float *dst, const void *src, size_t ld, size_t n, size_t hd)
{
    for (size_t j = 0; j < n; j++) {
        const uint16_t *h = (const uint16_t *)(const void *)((const char *)src + j * ld);
        for (size_t d = 0; d < hd; d += 8) {
            __m256i w = _mm256_cvtepu16_epi32(load8_u16(h + d, hd - d));
            _mm256_maskstore_ps(dst + j * hd + d, lanes(hd, d),
                                _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
    }
}

/* 8 bytes at c (only the first n < 8 exist: copied to a zeroed buffer, never read past). */
static inline __m128i load8_u8(const uint8_t *c, size_t n)
{
    uint8_t t[8] = {0};
    memcpy(t, c, n < 8 ? n : 8);
    return _mm_loadl_epi64((const __m128i *)(const void *)t);
}

/* n 8-bit KV head rows (kern.h: hd codes then an f32 scale; row j at src + j*ld bytes) ->
 * dst [n][hd] f32, bit for bit kern_kv8_dequant: one product per value in both. */
static void widen_kvi8(float *dst, const void *src, size_t ld, size_t n, size_t hd)
{
    for (size_t j = 0; j < n; j++) {
        const uint8_t *c = (const uint8_t *)src + j * ld;
        float sc;
        memcpy(&sc, c + hd, sizeof sc);
        const __m256 vs = _mm256_set1_ps(sc);
        for (size_t d = 0; d < hd; d += 8) {
            const __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load8_u8(c + d, hd - d)));
            _mm256_maskstore_ps(dst + j * hd + d, lanes(hd, d), _mm256_mul_ps(x, vs));
        }
    }
}

/* E4M3 as f16 bits: the sign to bit 15, exponent and mantissa (7 bits) to bits 13..7, which
 * is the value / 2^8 exactly (subnormals too: F16C converts f16 subnormals exactly); the
 * 2^8 goes into the scale, a power of two, so the product rounds as the reference's. */
static inline __m256 e4m3x8(__m128i b)
{
    const __m128i w = _mm_cvtepu8_epi16(b);
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7),
                                   _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8));
    return _mm256_cvtph_ps(h);
}

static void widen_kvf8(float *dst, const void *src, size_t ld, size_t n, size_t hd)
{
    for (size_t j = 0; j < n; j++) {
        const uint8_t *c = (const uint8_t *)src + j * ld;
        float sc;
        memcpy(&sc, c + hd, sizeof sc);
        const __m256 vs = _mm256_set1_ps(sc * 256.0f);
        for (size_t d = 0; d < hd; d += 8)
            _mm256_maskstore_ps(dst + j * hd + d, lanes(hd, d),
                                _mm256_mul_ps(e4m3x8(load8_u8(c + d, hd - d)), vs));
    }
}

#include "attn_drivers.h"

void kern_attn_f32_f32_avx2(const float *const *q, float *const *o, float *m, float *l,
                            const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                            const void *v, size_t ld, size_t n, size_t hd, float scale)
{
    attn_tiles_f32(q, o, m, l, lo, vis, nq, k, v, ld, n, hd, scale);
}

void kern_attn_f16_f32_avx2(const float *const *q, float *const *o, float *m, float *l,
                            const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                            const void *v, size_t ld, size_t n, size_t hd, float scale)
{
    attn_widened(widen_f16, q, o, m, l, lo, vis, nq, k, v, ld, n, hd, scale);
}

void kern_attn_bf16_f32_avx2(const float *const *q, float *const *o, float *m, float *l,
                             const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                             const void *v, size_t ld, size_t n, size_t hd, float scale)
{
    attn_widened(widen_bf16, q, o, m, l, lo, vis, nq, k, v, ld, n, hd, scale);
}

void kern_attn_kvi8_f32_avx2(const float *const *q, float *const *o, float *m, float *l,
                             const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                             const void *v, size_t ld, size_t n, size_t hd, float scale)
{
    attn_widened(widen_kvi8, q, o, m, l, lo, vis, nq, k, v, ld, n, hd, scale);
}

void kern_attn_kvf8_f32_avx2(const float *const *q, float *const *o, float *m, float *l,
                             const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                             const void *v, size_t ld, size_t n, size_t hd, float scale)
{
    attn_widened(widen_kvf8, q, o, m, l, lo, vis, nq, k, v, ld, n, hd, scale);
}
