/*
 * avx512_attn.c — the attention tile kernel with AVX-512 (kern.h; the scalar specification is
 * kern_attn_<kvt>_f32_ref in kernels/attn.c): 16 lanes over the head dimension, ragged head
 * dims with masked loads and stores.
 *
 * Per call: f16/bf16 K and V rows are widened to f32 once per sub-tile into stack buffers
 * and then read by every query row (the GQA group / prefill rows share them); f32 rows are
 * read in place. Per query row: scores four positions at a time (one q load feeds four
 * FMAs), the tile's maximum, the exp of the scores 16 at a time (avx512_exp.h, the scalar
 * fm_expf's algorithm), then o = o*corr + sum_j e_j v_j with each 16-float slice of o held in
 * a register across the tile's rows.
 *
 * 8-bit KV head rows (int8, fp8 E4M3 with an f32 scale; kern.h) are decoded into the same
 * widened tiles by widen_kvi8 / widen_kvf8, bit for bit kern_kv8_dequant.
 *
 * NOTES: reentrant; at most 2 x ATTN_BUF floats (64 KiB) of stack.
 */
#include "avx512_exp.h"
#include "fastmath.h"
#include "internal.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define ATTN_BUF 8192 /* floats per widened K (or V) sub-tile: rows = ATTN_BUF / hd */

static inline __mmask16 lanes(size_t hd, size_t d)
{
    return hd - d >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hd - d)) - 1u);
}

/*
 * The online-softmax update of nq rows over n positions of f32 rows: K row j at kf + j*ldf,
 * V row j at vf + j*ldf (floats). n <= KERN_ATTN_TILE. Row r sees tile positions
 * [lo[r] - j0, vis[r] - j0) clipped to [0, n) (lo/vis are relative to the kernel call, j0 is
 * this tile's offset in it; NULL: unclipped).
 */
static void tile_f32(const float *const *q, float *const *o, float *m, float *l,
                     const uint32_t *lo, const uint32_t *vis, size_t j0, size_t nq,
                     const float *kf, const float *vf, size_t ldf, size_t n, size_t hd,
                     float scale)
{
    float s[KERN_ATTN_TILE] __attribute__((aligned(64))); /* [n] scores, then weights */
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
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (size_t d = 0; d < hd; d += 16) {
                const __mmask16 mk = lanes(hd, d);
                const __m512 x = _mm512_maskz_loadu_ps(mk, qr + d);
                a0 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(mk, k0 + d), a0);
                a1 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(mk, k1 + d), a1);
                a2 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(mk, k2 + d), a2);
                a3 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(mk, k3 + d), a3);
            }
            s[j + 0] = _mm512_reduce_add_ps(a0);
            s[j + 1] = _mm512_reduce_add_ps(a1);
            s[j + 2] = _mm512_reduce_add_ps(a2);
            s[j + 3] = _mm512_reduce_add_ps(a3);
        }
        for (; j < nv; j++) {
            const float *k0 = kr + j * ldf;
            __m512 a0 = _mm512_setzero_ps();
            for (size_t d = 0; d < hd; d += 16) {
                const __mmask16 mk = lanes(hd, d);
                a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, qr + d),
                                     _mm512_maskz_loadu_ps(mk, k0 + d), a0);
            }
            s[j] = _mm512_reduce_add_ps(a0);
        }
        /* scale, tile maximum, weights e^(s - m') and their sum, 16 scores at a time */
        const __m512 vs = _mm512_set1_ps(scale);
        __m512 vmx = _mm512_set1_ps(-INFINITY);
        for (j = 0; j < nv; j += 16) {
            const __mmask16 mk = lanes(nv, j);
            __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, s + j), vs);
            _mm512_mask_storeu_ps(s + j, mk, x);
            vmx = _mm512_mask_max_ps(vmx, mk, vmx, x);
        }
        const float mx = _mm512_reduce_max_ps(vmx);
        const float mn = m[r] > mx ? m[r] : mx;
        const float corr = fm_expf(m[r] - mn); /* 0 on the first tile (m = -inf) */
        __m512 vsum = _mm512_setzero_ps();
        const __m512 vmn = _mm512_set1_ps(mn);
        for (j = 0; j < nv; j += 16) {
            const __mmask16 mk = lanes(nv, j);
            __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j), vmn));
            e = _mm512_maskz_mov_ps(mk, e);
            _mm512_mask_storeu_ps(s + j, mk, e);
            vsum = _mm512_add_ps(vsum, e);
        }
        l[r] = l[r] * corr + _mm512_reduce_add_ps(vsum);
        m[r] = mn;
        /* o = o*corr + sum_j e_j v_j, one 16-float slice of o in a register at a time */
        float *orow = o[r];
        const __m512 vc = _mm512_set1_ps(corr);
        for (size_t d = 0; d < hd; d += 16) {
            const __mmask16 mk = lanes(hd, d);
            __m512 acc = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, orow + d), vc);
            __m512 acc2 = _mm512_setzero_ps();
            const float *vp = vr + d;
            for (j = 0; j + 2 <= nv; j += 2, vp += 2 * ldf) {
                acc = _mm512_fmadd_ps(_mm512_set1_ps(s[j]), _mm512_maskz_loadu_ps(mk, vp), acc);
                acc2 = _mm512_fmadd_ps(_mm512_set1_ps(s[j + 1]),
                                       _mm512_maskz_loadu_ps(mk, vp + ldf), acc2);
            }
            if (j < nv)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(s[j]), _mm512_maskz_loadu_ps(mk, vp), acc);
            _mm512_mask_storeu_ps(orow + d, mk, _mm512_add_ps(acc, acc2));
        }
    }
}

/* n rows of hd f16 / bf16 elements (row j at src + j*ld bytes) -> dst [n][hd] f32. */
static void widen_f16(float *dst, const void *src, size_t ld, size_t n, size_t hd)
{
    for (size_t j = 0; j < n; j++) {
        const uint16_t *h = (const uint16_t *)(const void *)((const char *)src + j * ld);
        for (size_t d = 0; d < hd; d += 16) {
            const __mmask16 mk = lanes(hd, d);
            _mm512_mask_storeu_ps(dst + j * hd + d, mk,
                                  _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, h + d)));
        }
    }
}

static void widen_bf16(float *dst, const void *src, size_t ld, size_t n, size_t hd)
{
    for (size_t j = 0; j < n; j++) {
        const uint16_t *h = (const uint16_t *)(const void *)((const char *)src + j * ld);
        for (size_t d = 0; d < hd; d += 16) {
            const __mmask16 mk = lanes(hd, d);
            __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, h + d));
            _mm512_mask_storeu_ps(dst + j * hd + d, mk,
                                  _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
        }
    }
}

/* n 8-bit KV head rows (kern.h: hd codes then an f32 scale; row j at src + j*ld bytes) ->
 * dst [n][hd] f32, bit for bit kern_kv8_dequant (as avx2_attn.c's). */
static void widen_kvi8(float *dst, const void *src, size_t ld, size_t n, size_t hd)
{
    for (size_t j = 0; j < n; j++) {
        const uint8_t *c = (const uint8_t *)src + j * ld;
        float sc;
        memcpy(&sc, c + hd, sizeof sc);
        const __m512 vs = _mm512_set1_ps(sc);
        for (size_t d = 0; d < hd; d += 16) {
            const __mmask16 mk = lanes(hd, d);
            const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mk, c + d)));
            _mm512_mask_storeu_ps(dst + j * hd + d, mk, _mm512_mul_ps(x, vs));
        }
    }
}

/* E4M3 through f16 bits, value / 2^8 exactly (avx2_attn.c's e4m3x8 explains). */
static void widen_kvf8(float *dst, const void *src, size_t ld, size_t n, size_t hd)
{
    for (size_t j = 0; j < n; j++) {
        const uint8_t *c = (const uint8_t *)src + j * ld;
        float sc;
        memcpy(&sc, c + hd, sizeof sc);
        const __m512 vs = _mm512_set1_ps(sc * 256.0f);
        for (size_t d = 0; d < hd; d += 16) {
            const __mmask16 mk = lanes(hd, d);
            const __m256i w = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(mk, c + d));
            const __m256i h =
                _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7),
                                _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8));
            _mm512_mask_storeu_ps(dst + j * hd + d, mk, _mm512_mul_ps(_mm512_cvtph_ps(h), vs));
        }
    }
}

#include "attn_drivers.h"

void kern_attn_f32_f32_avx512(const float *const *q, float *const *o, float *m, float *l,
                              const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                              const void *v, size_t ld, size_t n, size_t hd, float scale)
{
    attn_tiles_f32(q, o, m, l, lo, vis, nq, k, v, ld, n, hd, scale);
}

void kern_attn_f16_f32_avx512(const float *const *q, float *const *o, float *m, float *l,
                              const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                              const void *v, size_t ld, size_t n, size_t hd, float scale)
{
    attn_widened(widen_f16, q, o, m, l, lo, vis, nq, k, v, ld, n, hd, scale);
}

void kern_attn_bf16_f32_avx512(const float *const *q, float *const *o, float *m, float *l,
                               const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                               const void *v, size_t ld, size_t n, size_t hd, float scale)
{
    attn_widened(widen_bf16, q, o, m, l, lo, vis, nq, k, v, ld, n, hd, scale);
}

void kern_attn_kvi8_f32_avx512(const float *const *q, float *const *o, float *m, float *l,
                               const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                               const void *v, size_t ld, size_t n, size_t hd, float scale)
{
    attn_widened(widen_kvi8, q, o, m, l, lo, vis, nq, k, v, ld, n, hd, scale);
}

void kern_attn_kvf8_f32_avx512(const float *const *q, float *const *o, float *m, float *l,
                               const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                               const void *v, size_t ld, size_t n, size_t hd, float scale)
{
    attn_widened(widen_kvf8, q, o, m, l, lo, vis, nq, k, v, ld, n, hd, scale);
}
