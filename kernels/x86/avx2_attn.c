/*
 * avx2_attn.c — the attention tile kernel with AVX2+FMA (kern.h; the scalar specification is
 * kern_attn_<kvt>_f32_ref in kernels/attn.c): 8 lanes over the head dimension, ragged head
 * dims with vmaskmovps (masked lanes are neither read nor written). No AVX-512 here: this
 * file is compiled with -mavx2 -mfma -mf16c only.
 *
 * The same shape as avx512_attn.c (session 12's register-blocked tile) with 8 lanes: f16/bf16
 * K/V sub-tiles widened once and shared by every query row; K transposed 8 positions at a
 * time (8x8 in registers), the scores of 8 rows x 8 positions one broadcast-q FMA chain per
 * row; the softmax 8 rows at a time, a row per lane (softmax8, session 19: no horizontal
 * sums, no scalar exp per row), exp 8 scores at a time (avx2_exp.h, the scalar fm_expf's
 * algorithm); o += w v for 4 rows x 16 lanes per V row loaded. Each row's arithmetic does not depend on the rows beside it.
 *
 * 8-bit KV head rows (int8, fp8 E4M3 with an f32 scale; kern.h) are decoded into the same
 * widened tiles by widen_kvi8 / widen_kvf8, bit for bit kern_kv8_dequant.
 *
 * NOTES: reentrant; at most 2 x ATTN_BUF floats (64 KiB) of stack in the widening driver,
 * and 41 KiB in the tile (the transposed K, the scores of 64 rows, their weights transposed).
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

/* One 8x8 transpose: r[i] (row i) -> r[i] (column i). */
static inline __attribute__((always_inline)) void tr8x8(__m256 r[8])
{
    __m256 t[8];
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i += 4) {
        r[i + 0] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < 4; i++) {
        t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
        t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) r[i] = t[i];
}

/* K rows [i0, nb) (nb <= 8, row i at k + i*ldf floats) transposed into kt [hd][8], lanes
 * outside [i0, nb) zero (those rows are not read). */
static void transpose_k(float *kt, const float *k, size_t ldf, size_t i0, size_t nb, size_t hd)
{
    for (size_t d = 0; d < hd; d += 8) {
        const __m256i mk = lanes(hd, d);
        __m256 r[8];
        _Pragma("GCC unroll 8") for (size_t i = 0; i < 8; i++)
            r[i] = i >= i0 && i < nb ? _mm256_maskload_ps(k + i * ldf + d, mk) : _mm256_setzero_ps();
        tr8x8(r);
        const size_t nd = hd - d < 8 ? hd - d : 8;
        for (size_t i = 0; i < nd; i++)
            _mm256_store_ps(kt + (d + i) * 8, r[i]);
    }
}

/* Scores of R query rows against 8 transposed positions: s[r][0..8) = scale * q[r] . K[i].
 * One FMA chain per row over d, so a row's bits do not depend on R (batch invariance). */
#define SCORES_ROWS_(R)                                                                      \
    static void scores_rows##R(const float *const *q, const float *kt, size_t hd,          \
                               float scale, float *s, size_t lds)                           \
    {                                                                                        \
        __m256 a[R];                                                                         \
        _Pragma("GCC unroll 8") for (size_t r = 0; r < R; r++) a[r] = _mm256_setzero_ps();  \
        for (size_t d = 0; d < hd; d++) {                                                    \
            const __m256 k0 = _mm256_load_ps(kt + d * 8);                                    \
            _Pragma("GCC unroll 8") for (size_t r = 0; r < R; r++) a[r] =                    \
                _mm256_fmadd_ps(_mm256_broadcast_ss(q[r] + d), k0, a[r]);                    \
        }                                                                                    \
        const __m256 vs = _mm256_set1_ps(scale);                                             \
        _Pragma("GCC unroll 8") for (size_t r = 0; r < R; r++)                               \
            _mm256_store_ps(s + r * lds, _mm256_mul_ps(a[r], vs));                           \
    }
SCORES_ROWS_(8)
SCORES_ROWS_(1)
#undef SCORES_ROWS_

/* o[r] = o[r]*corr[r] + sum_{j in [ja, jb)} w[j*ldw + r*ldr] v_j for 4 rows (the weights
 * transposed as softmax8 leaves them, ldw = ROWS_MAX and ldr = 1, or row-major as softmax_row
 * does, ldw = 1 and ldr = KERN_ATTN_TILE), 16 floats of o per pass (avx512_attn.c's pv_rows with
 * 8 lanes: one FMA chain per (row, 8 lanes), j in order). */
#define PV_ROWS 4
static __attribute__((noinline)) void pv_rows(float *const *o, const float *corr,
                                              const float *w, size_t ldw, size_t ldr, size_t ja,
                                              size_t jb,
                                              const float *vf, size_t ldf, size_t hd)
{
    /* a base per row and one index: the addressing of the row-pointer loop this replaced */
    const float *w0 = w, *w1 = w + ldr, *w2 = w + 2 * ldr, *w3 = w + 3 * ldr;
    for (size_t d0 = 0; d0 < hd; d0 += 16) {
        const __m256i m0 = lanes(hd, d0);
        const __m256i m1 = d0 + 8 < hd ? lanes(hd, d0 + 8) : _mm256_setzero_si256();
#define PV_LOAD_(r)                                                                          \
    const __m256 c##r = _mm256_set1_ps(corr[r]);                                             \
    __m256 a##r##0 = _mm256_mul_ps(_mm256_maskload_ps(o[r] + d0, m0), c##r);                 \
    __m256 a##r##1 = _mm256_mul_ps(_mm256_maskload_ps(o[r] + d0 + 8, m1), c##r);
        PV_LOAD_(0) PV_LOAD_(1) PV_LOAD_(2) PV_LOAD_(3)
#undef PV_LOAD_
        const float *vp = vf + ja * ldf + d0;
        for (size_t j = ja, k = ja * ldw; j < jb; j++, vp += ldf, k += ldw) {
            const __m256 v0 = _mm256_maskload_ps(vp, m0), v1 = _mm256_maskload_ps(vp + 8, m1);
#define PV_FMA_(r)                                                                           \
    {                                                                                        \
        const __m256 wr = _mm256_broadcast_ss(w##r + k);                                     \
        a##r##0 = _mm256_fmadd_ps(wr, v0, a##r##0);                                          \
        a##r##1 = _mm256_fmadd_ps(wr, v1, a##r##1);                                          \
    }
            PV_FMA_(0) PV_FMA_(1) PV_FMA_(2) PV_FMA_(3)
#undef PV_FMA_
        }
#define PV_STORE_(r)                                                                         \
    _mm256_maskstore_ps(o[r] + d0, m0, a##r##0);                                             \
    _mm256_maskstore_ps(o[r] + d0 + 8, m1, a##r##1);
        PV_STORE_(0) PV_STORE_(1) PV_STORE_(2) PV_STORE_(3)
#undef PV_STORE_
    }
}

#define ROWS_MAX 64

/* Groups of fewer rows than this take softmax_row: softmax8's transposes and 8-lane passes
 * cost about as much as 4 rows' horizontal sums (a decode without GQA has one row). */
#define SOFTMAX_LANES_MIN 4

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

/*
 * The online-softmax step of one row (scores s [KERN_ATTN_TILE] over [jlo, jb), range
 * [a, b)): the weights e^(s - m') in place (0 outside the range), *corr = e^(m - m'), m and l.
 * The session-12 loop, with corr as lane 0 of exp8 (fm_expf's bits, no libm ldexpf call);
 * softmax8 gives every row the same bits.
 */
static void softmax_row(float *s, size_t a, size_t b, float *m, float *l, float *corr,
                        size_t jlo, size_t jb)
{
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i va1 = _mm256_set1_epi32((int)a - 1), vb = _mm256_set1_epi32((int)b);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 vmx = ninf;
    for (size_t j = jlo; j < jb; j += 8) {
        const __m256i vj = _mm256_add_epi32(_mm256_set1_epi32((int)j), iota);
        const __m256 mk = _mm256_castsi256_ps(
            _mm256_and_si256(_mm256_cmpgt_epi32(vj, va1), _mm256_cmpgt_epi32(vb, vj)));
        vmx = _mm256_max_ps(vmx, _mm256_blendv_ps(ninf, _mm256_load_ps(s + j), mk));
    }
    const float mx = hmax8(vmx);
    const float mn = *m > mx ? *m : mx;
    *corr = _mm256_cvtss_f32(exp8(_mm256_set1_ps(*m - mn))); /* 0 on the first tile */
    __m256 vsum = _mm256_setzero_ps();
    const __m256 vmn = _mm256_set1_ps(mn);
    for (size_t j = jlo; j < jb; j += 8) {
        const __m256i vj = _mm256_add_epi32(_mm256_set1_epi32((int)j), iota);
        const __m256 mk = _mm256_castsi256_ps(
            _mm256_and_si256(_mm256_cmpgt_epi32(vj, va1), _mm256_cmpgt_epi32(vb, vj)));
        const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_load_ps(s + j), vmn)), mk);
        _mm256_store_ps(s + j, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    *l = *l * *corr + hsum8(vsum);
    *m = mn;
}

/*
 * The online-softmax step of active rows i0 .. i0+nr-1 (nr <= 8), one row per lane: as
 * avx512_attn.c's softmax16 with 8 lanes (8 x 8 blocks of s [ROWS_MAX][KERN_ATTN_TILE]
 * transposed; weights into wt [n][ROWS_MAX], 0 outside a row's range and in lanes past nr;
 * corr, m and l of the rows). Same bits as the row-at-a-time loop it replaced (session 19):
 * the maximum is exact in any order, corr is exp8 of the same m - m' (fm_expf lane-wise), the
 * sum per position lane p runs over the blocks in order from 0 and then hsum8's tree (lane
 * p + p+4, then + p+2, then lane 0 + lane 1), l*corr + sum rounded twice.
 */
static void softmax8(float (*s)[KERN_ATTN_TILE], float *wt, size_t i0, size_t nr,
                     const size_t *ra, const size_t *rb, const size_t *act, float *m, float *l,
                     float *corr, size_t jlo, size_t jb)
{
    int32_t a32[8] __attribute__((aligned(32))), b32[8] __attribute__((aligned(32)));
    float m0[8] __attribute__((aligned(32))), l0[8] __attribute__((aligned(32)));
    for (size_t r = 0; r < 8; r++) { /* lanes past nr: an empty range, never stored */
        const int in = r < nr;
        a32[r] = in ? (int32_t)ra[i0 + r] : 0;
        b32[r] = in ? (int32_t)rb[i0 + r] : 0;
        m0[r] = in ? m[act[i0 + r]] : 0.0f;
        l0[r] = in ? l[act[i0 + r]] : 0.0f;
    }
    /* a - 1 < j < b: positions are below KERN_ATTN_TILE, the signed compare is exact */
    const __m256i va1 = _mm256_sub_epi32(_mm256_load_si256((const __m256i *)(const void *)a32),
                                         _mm256_set1_epi32(1));
    const __m256i vb = _mm256_load_si256((const __m256i *)(const void *)b32);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    /* pass 1: transposed scores into wt, the rows' maxima over their ranges */
    __m256 vmx = ninf;
    for (size_t b = jlo; b < jb; b += 8) {
        __m256 t[8];
        _Pragma("GCC unroll 8") for (size_t r = 0; r < 8; r++)
            t[r] = _mm256_load_ps(&s[i0 + r][b]); /* rows past nr: stale, masked below */
        tr8x8(t);
        _Pragma("GCC unroll 8") for (size_t p = 0; p < 8; p++) {
            const __m256i vj = _mm256_set1_epi32((int)(b + p));
            const __m256 mk = _mm256_castsi256_ps(
                _mm256_and_si256(_mm256_cmpgt_epi32(vj, va1), _mm256_cmpgt_epi32(vb, vj)));
            vmx = _mm256_max_ps(vmx, _mm256_blendv_ps(ninf, t[p], mk));
            _mm256_store_ps(wt + (b + p) * ROWS_MAX + i0, t[p]);
        }
    }
    const __m256 vm = _mm256_load_ps(m0);
    const __m256 mn = _mm256_max_ps(vm, vmx); /* m > mx ? m : mx, as the scalar loop */
    const __m256 vc = exp8(_mm256_sub_ps(vm, mn)); /* 0 on the first tile (m = -inf) */
    /* pass 2: weights in place, their per-lane sums over the blocks */
    __m256 acc[8];
    _Pragma("GCC unroll 8") for (size_t p = 0; p < 8; p++) acc[p] = _mm256_setzero_ps();
    for (size_t b = jlo; b < jb; b += 8) {
        _Pragma("GCC unroll 8") for (size_t p = 0; p < 8; p++) {
            const __m256i vj = _mm256_set1_epi32((int)(b + p));
            const __m256 mk = _mm256_castsi256_ps(
                _mm256_and_si256(_mm256_cmpgt_epi32(vj, va1), _mm256_cmpgt_epi32(vb, vj)));
            float *wp = wt + (b + p) * ROWS_MAX + i0;
            const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_load_ps(wp), mn)), mk);
            _mm256_store_ps(wp, e);
            acc[p] = _mm256_add_ps(acc[p], e);
        }
    }
    /* hsum8's tree, a lane per row */
    _Pragma("GCC unroll 4") for (size_t p = 0; p < 4; p++) acc[p] = _mm256_add_ps(acc[p], acc[p + 4]);
    const __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    const __m256 vl = _mm256_add_ps(_mm256_mul_ps(_mm256_load_ps(l0), vc), sum);
    _mm256_store_ps(m0, mn);
    _mm256_store_ps(l0, vl);
    _mm256_storeu_ps(corr + i0, vc); /* corr has ROWS_MAX entries: lanes past nr unused */
    for (size_t r = 0; r < nr; r++) {
        m[act[i0 + r]] = m0[r];
        l[act[i0 + r]] = l0[r];
    }
}

/*
 * As avx512_attn.c's tile_rows (the same blocking with 8 lanes): nq <= ROWS_MAX rows over
 * n <= KERN_ATTN_TILE positions of f32 rows, row r clipped to [lo[r] - j0, vis[r] - j0).
 */
static void tile_rows(const float *const *q, float *const *o, float *m, float *l,
                      const uint32_t *lo, const uint32_t *vis, size_t j0, size_t nq,
                      const float *kf, const float *vf, size_t ldf, size_t n, size_t hd,
                      float scale)
{
    float kt[KERN_ATTN_HD_MAX * 8] __attribute__((aligned(32)));          /* [hd][8] K^T */
    float s[ROWS_MAX][KERN_ATTN_TILE] __attribute__((aligned(32)));       /* [nq][n] */
    size_t ra[ROWS_MAX], rb[ROWS_MAX], act[ROWS_MAX], na = 0;
    size_t ja = n, jb = 0;
    for (size_t r = 0; r < nq; r++) {
        size_t nv = vis ? (vis[r] > j0 ? vis[r] - j0 : 0) : n;
        if (nv > n)
            nv = n;
        const size_t a = lo && lo[r] > j0 ? lo[r] - j0 : 0; /* the window's start */
        if (a >= nv)
            continue;
        ra[na] = a, rb[na] = nv, act[na++] = r;
        ja = a < ja ? a : ja;
        jb = nv > jb ? nv : jb;
    }
    if (na == 0)
        return;
    const float *qa[ROWS_MAX];
    for (size_t i = 0; i < na; i++)
        qa[i] = q[act[i]];
    /* scores over [ja, jb), 8 positions at a time from ja rounded down */
    const size_t jlo = ja / 8 * 8;
    for (size_t b = jlo; b < jb; b += 8) {
        const size_t first = b < ja ? ja : b;
        const size_t nb = jb - b < 8 ? jb - b : 8;
        transpose_k(kt, kf + b * ldf, ldf, first - b, nb, hd);
        size_t i = 0;
        for (; i + 8 <= na; i += 8)
            scores_rows8(qa + i, kt, hd, scale, &s[i][b], KERN_ATTN_TILE);
        for (; i < na; i++)
            scores_rows1(qa + i, kt, hd, scale, &s[i][b], KERN_ATTN_TILE);
    }
    /* the softmax, 8 rows at a time with a row per lane (softmax8) */
    float wt[KERN_ATTN_TILE * ROWS_MAX] __attribute__((aligned(32))); /* [n][ROWS_MAX] */
    float corr[ROWS_MAX];
    for (size_t i0 = 0; i0 < na; i0 += 8) {
        const size_t nr = na - i0 < 8 ? na - i0 : 8;
        if (nr >= SOFTMAX_LANES_MIN) {
            softmax8(s, wt, i0, nr, ra, rb, act, m, l, corr, jlo, jb);
        } else {
            for (size_t i = i0; i < na; i++)
                softmax_row(s[i], ra[i], rb[i], &m[act[i]], &l[act[i]], &corr[i], jlo, jb);
            for (size_t i = na; i < (na + PV_ROWS - 1) / PV_ROWS * PV_ROWS; i++)
                for (size_t j = jlo; j < jb; j += 8) /* the padding's weights */
                    _mm256_store_ps(&s[i][j], _mm256_setzero_ps());
        }
    }
    float dummy[KERN_ATTN_HD_MAX] __attribute__((aligned(32)));
    for (size_t i0 = 0; i0 < na; i0 += PV_ROWS) {
        float *orow[PV_ROWS];
        float c[PV_ROWS];
        size_t pa = n, pb = 0;
        for (size_t t = 0; t < PV_ROWS; t++) {
            if (i0 + t < na) {
                orow[t] = o[act[i0 + t]];
                c[t] = corr[i0 + t];
                pa = ra[i0 + t] < pa ? ra[i0 + t] : pa;
                pb = rb[i0 + t] > pb ? rb[i0 + t] : pb;
            } else { /* padding: softmax8 left its weights 0 (an empty range); a scratch row */
                orow[t] = dummy;
                c[t] = 0.0f;
            }
        }
        if (na - i0 / 8 * 8 >= SOFTMAX_LANES_MIN) /* softmax8's group: weights in wt */
            pv_rows(orow, c, wt + i0, ROWS_MAX, 1, pa, pb, vf, ldf, hd);
        else
            pv_rows(orow, c, s[i0], 1, KERN_ATTN_TILE, pa, pb, vf, ldf, hd);
    }
}

static void tile_f32(const float *const *q, float *const *o, float *m, float *l,
                     const uint32_t *lo, const uint32_t *vis, size_t j0, size_t nq,
                     const float *kf, const float *vf, size_t ldf, size_t n, size_t hd,
                     float scale)
{
    for (size_t r0 = 0; r0 < nq; r0 += ROWS_MAX)
        tile_rows(q + r0, o + r0, m + r0, l + r0, lo ? lo + r0 : NULL, vis ? vis + r0 : NULL, j0,
                  nq - r0 < ROWS_MAX ? nq - r0 : ROWS_MAX, kf, vf, ldf, n, hd, scale);
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
