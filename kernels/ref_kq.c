/*
 * ref_kq.c — the GGUF k-quants (q4_K, q5_K, q6_K; layouts in kernels/include/quant.h):
 * dequantization, the converter's quantizer, and the scalar `_ref` twins of their GEMV/GEMM
 * kernels (the specification x86/avx2_kq.c and x86/avx512_kq.c are tested against).
 *
 * Products read the q8_0 activations every block type shares (kern.h struct kern_act: int8
 * blocks of 32 with an f32 scale dx_b, and ns32 = -8 * the block's quant sum, act_offset 8):
 * a q4_K/q5_K sub-block is one activation block, a q6_K activation block holds two 16-element
 * sub-blocks. Keeping ggml's q8_K (one activation scale per 256) would save a float multiply
 * per 32 products but quantize activations 8x more coarsely around an outlier; per-32 scales
 * keep kernels/include/quant.h's activation bound.
 */
#include "internal.h"
#include "quant.h"

#include "check.h"
#include "err.h"
#include "half.h"
#include "log.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define KQ_MAX_THREADS 16 /* kern_quantize_rows_kq's cap */

/* ---- dequantization (each type's kern__traits to_f32) ------------------------------------ */

/* Code of element e (0..255) of a super-block, unsigned as stored: q4_K 0..15, q5_K 0..31,
 * q6_K 0..63 (the value subtracts 32). */
static int kq_code(enum dtype dt, const uint8_t *blk, int e)
{
    const int c = e / 64, l = e % 32, hi = e % 64 >= 32;
    if (dt == DT_Q4_K) {
        const struct quant_q4_k *b = (const void *)blk;
        return hi ? b->qs[32 * c + l] >> 4 : b->qs[32 * c + l] & 15;
    }
    if (dt == DT_Q5_K) {
        const struct quant_q5_k *b = (const void *)blk;
        int lo4 = hi ? b->qs[32 * c + l] >> 4 : b->qs[32 * c + l] & 15;
        return lo4 | ((b->qh[l] >> (2 * c + hi)) & 1) << 4;
    }
    const struct quant_q6_k *b = (const void *)blk;
    const int h = e / 128, k = e % 128 / 32; /* quarter k of half h */
    int ql = b->ql[64 * h + 32 * (k & 1) + l];
    return (k >= 2 ? ql >> 4 : ql & 15) | ((b->qh[32 * h + l] >> (2 * k)) & 3) << 4;
}

static float f16_at(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return half_f16_to_f32(v);
}

/* q4_K / q5_K: x = (d * sc) * q - (dmin * m) in f32, as ggml's dequantize_row_q4_K. */
static void row_q45k(enum dtype dt, const void *row, float *out, size_t n)
{
    const size_t bb = dtype_info(dt)->block_bytes;
    const uint8_t *blk = row;
    for (size_t i = 0; i < n; i += QUANT_K, blk += bb) {
        const float d = f16_at(blk), dmin = f16_at(blk + 2);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            quant_kq_scale_min(blk + 4, j, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                float p = d1 * (float)kq_code(dt, blk, 32 * j + l); /* no fused multiply-add */
                out[i + 32 * (size_t)j + (size_t)l] = p - m1;
            }
        }
    }
}

void kern__row_q4_k(const void *row, float *out, size_t n) { row_q45k(DT_Q4_K, row, out, n); }
void kern__row_q5_k(const void *row, float *out, size_t n) { row_q45k(DT_Q5_K, row, out, n); }

/* q6_K: x = (d * sc) * (q - 32) in f32, as ggml's dequantize_row_q6_K. */
void kern__row_q6_k(const void *row, float *out, size_t n)
{
    const struct quant_q6_k *b = row;
    for (size_t i = 0; i < n; i += QUANT_K, b++) {
        const float d = half_f16_to_f32(b->d);
        for (int e = 0; e < QUANT_K; e++)
            out[i + (size_t)e] =
                d * (float)b->scales[e / 16] * (float)(kq_code(DT_Q6_K, (const void *)b, e) - 32);
    }
}

/* ---- quantization (clocher convert --dtype q4_k | q5_k | q6_k) --------------------------- */

static int nearest(float v) { return (int)lrintf(v); }

/*
 * The searches below run on GCC/Clang vector extensions of 4 floats whose lanes are 4
 * candidate grids: each lane adds its sums over the elements in element order, the very
 * operations of the scalar search they replaced (session 10's), so the bytes are unchanged
 * (a q4_k TinyLlama converts byte-identically) and never depend on the ISA the compiler maps
 * the vectors to (SSE2, x86-64's baseline); -std=c11 keeps it from contracting them into
 * FMAs. The scalar loop called lrintf per candidate and element (profiled: 92% of a q4_k
 * conversion); rounding here is the 1.5 x 2^23 trick, ties to even like lrintf.
 */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

static inline v4f v4_set1(float a) { return (v4f){a, a, a, a}; }
/* round to nearest, ties to even (lrintf's default mode) for |v| < 2^22 */
static inline v4f v4_round(v4f v)
{
    const v4f magic = v4_set1(12582912.0f); /* 1.5 * 2^23 */
    return (v + magic) - magic;
}
static inline v4f v4_clamp(v4f v, v4f lo, v4f hi)
{
    v4i below = v < lo, above = v > hi;
    v4i r = ((v4i)v & ~below) | ((v4i)lo & below);
    return (v4f)((r & ~above) | ((v4i)hi & above));
}

/*
 * One q4_K/q5_K sub-block of 32: the scale s >= 0 and offset -mn (mn >= 0) of least weighted
 * squared error for codes 0..nmax, the bounded search ggml's make_qkx2_quants is known for.
 * It starts from the min/max grid (origin lo = min(x, 0), iscale nmax / (hi - lo)), then
 * tries nstep + 1 grids iscale = (rmin + 0.1 step + nmax) / (hi - origin), each code set
 * refitted by weighted least squares (an offset above 0 clamped to 0: the format stores a
 * subtracted min), keeping a fit that lowers the error. A kept fit moves the origin of the
 * later grids to its offset: the search walks, it is not a fixed fan of grids around lo
 * (session 11's fan, origin always lo, cost 2.4% more squared error on TinyLlama's q4_K).
 * Since step k depends on the fits before it, 4 steps run at once in the lanes of a v4f
 * (each lane summing in element order, the scalar search's operations) from the current
 * origin; when lane k's fit is kept, the lanes after it are discarded and the next 4 start at
 * step k + 1 from the new origin. The result is the sequential search's, bit for bit.
 * x, w: [32]; O(32 x (nstep + 1 + kept fits)) per sub-block. grid: the kept fit's grid
 * (iscale, origin), whose codes a sub-block keeps when its 6-bit scale rounds to 0.
 */
static float fit_affine(const float *x, const float *w, int nmax, float rmin, int nstep,
                        float *mn_out, float grid[2])
{
    grid[0] = grid[1] = 0.0f;
    float lo = x[0], hi = x[0], sw = w[0], sx = w[0] * x[0];
    for (int i = 1; i < 32; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
        sw += w[i];
        sx += w[i] * x[i];
    }
    if (lo > 0.0f)
        lo = 0.0f;
    if (hi == lo) {
        *mn_out = -lo;
        return 0.0f;
    }
    float min = lo, scale = (hi - lo) / (float)nmax, best = 0.0f;
    {
        const float is = (float)nmax / (hi - lo);
        scale = 1.0f / is;
        grid[0] = is;
        grid[1] = lo;
        for (int i = 0; i < 32; i++) { /* the plain grid's error */
            int l = nearest(is * (x[i] - lo));
            l = l < 0 ? 0 : l > nmax ? nmax : l;
            const float dif = scale * (float)l + lo - x[i];
            best += w[i] * (dif * dif);
        }
    }
    const v4f zero = v4_set1(0.0f), vmax = v4_set1((float)nmax);
    v4f L[32]; /* the 4 lanes' codes */
    for (int step = 0; step <= nstep;) {
        float is[4];
        for (int k = 0; k < 4; k++) /* lanes past nstep repeat it and are never read */
            is[k] = (rmin + 0.1f * (float)(step + k <= nstep ? step + k : nstep) + (float)nmax) /
                    (hi - min);
        v4f vis, a = zero, b = zero, d = zero;
        memcpy(&vis, is, sizeof vis);
        for (int i = 0; i < 32; i++) {
            L[i] = v4_clamp(v4_round(vis * v4_set1(x[i] - min)), zero, vmax);
            const v4f wl = v4_set1(w[i]) * L[i];
            a += wl;
            b += wl * L[i];
            d += wl * v4_set1(x[i]);
        }
        float sl[4], sl2[4], sxl[4], ts[4], tm[4];
        memcpy(sl, &a, sizeof a);
        memcpy(sl2, &b, sizeof b);
        memcpy(sxl, &d, sizeof d);
        for (int k = 0; k < 4; k++) {
            const float D = sw * sl2[k] - sl[k] * sl[k];
            ts[k] = D > 0.0f ? (sw * sxl[k] - sx * sl[k]) / D : 0.0f;
            tm[k] = D > 0.0f ? (sl2[k] * sx - sl[k] * sxl[k]) / D : 0.0f;
            if (D > 0.0f && tm[k] > 0.0f) {
                tm[k] = 0.0f;
                ts[k] = sxl[k] / sl2[k];
            }
        }
        v4f vs, vm, e = zero;
        memcpy(&vs, ts, sizeof vs);
        memcpy(&vm, tm, sizeof vm);
        for (int i = 0; i < 32; i++) { /* sum w (s L + m - x)^2 */
            const v4f dif = vs * L[i] + vm - v4_set1(x[i]);
            e += v4_set1(w[i]) * (dif * dif);
        }
        float err[4];
        memcpy(err, &e, sizeof e);
        int next = step + 4;
        for (int k = 0; k < 4 && step + k <= nstep; k++) {
            if (sw * sl2[k] - sl[k] * sl[k] > 0.0f && err[k] < best) {
                best = err[k];
                grid[0] = is[k];
                grid[1] = min;
                scale = ts[k];
                min = tm[k];
                next = step + k + 1; /* later lanes used the old origin */
                break;
            }
        }
        step = next;
    }
    *mn_out = -min;
    return scale;
}

/*
 * One q6_K sub-block of 16: a signed scale s for codes -32..31, ggml's make_qx_quants with
 * rmse_type 1: the grid set by the element of largest magnitude (it maps to -32), then the
 * grids -(32 + 0.1 step) / that element for steps -9..9 (0 excepted), each refitted by least
 * squares with weights x^2, s = sum w x l / sum w l^2, which lowers the weighted error by
 * (sum w x l)^2 / sum w l^2; in that order, a grid is kept when it lowers it further. The
 * grids do not depend on the kept fit, so they run 4 at a time in v4f lanes. x: [16].
 * grid: the kept grid's iscale (0: an all-zero sub-block), for a scale that rounds to 0.
 */
#define SYM_GRIDS 19 /* the plain grid, then steps -9..-1, 1..9 */
#define KQ_GROUP_EPS 1e-15f /* ggml's GROUP_MAX_EPS: a smaller maximum is all zero */
static float fit_symmetric(const float *x, float *grid)
{
    *grid = 0.0f;
    float amax = 0.0f, big = 0.0f;
    for (int i = 0; i < 16; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            big = x[i];
        }
    if (amax < KQ_GROUP_EPS)
        return 0.0f;
    float is[20], sxl[20], sl2[20];
    for (int c = 0; c < 20; c++) {
        const int step = c == 0 ? 0 : c <= 9 ? c - 10 : c < SYM_GRIDS ? c - 9 : 9;
        is[c] = c == 0 ? -32.0f / big : -(32.0f + 0.1f * (float)step) / big;
    }
    const v4f lo = v4_set1(-32.0f), hi = v4_set1(31.0f), zero = v4_set1(0.0f);
    for (int v = 0; v < 5; v++) {
        v4f vis, a = zero, b = zero;
        memcpy(&vis, is + 4 * v, sizeof vis);
        for (int i = 0; i < 16; i++) {
            const v4f l = v4_clamp(v4_round(vis * v4_set1(x[i])), lo, hi);
            const float w = x[i] * x[i];
            a += v4_set1(w * x[i]) * l;
            b += v4_set1(w) * l * l;
        }
        memcpy(sxl + 4 * v, &a, sizeof a);
        memcpy(sl2 + 4 * v, &b, sizeof b);
    }
    float scale = sl2[0] != 0.0f ? sxl[0] / sl2[0] : 0.0f, best = scale * sxl[0];
    *grid = is[0];
    for (int c = 1; c < SYM_GRIDS; c++)
        if (sl2[c] > 0.0f && sxl[c] * sxl[c] > best * sl2[c]) {
            *grid = is[c];
            scale = sxl[c] / sl2[c];
            best = scale * sxl[c];
        }
    return scale;
}

static int check_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            LOG_ERR("cannot quantize a non-finite value (%g) at element %zu", (double)x[i], i);
            return ERR_RANGE;
        }
    return 0;
}

static void quantize_q45k(enum dtype dt, const float *x, uint8_t *blk)
{
    /* ggml's grids: q4_K steps 0..20 from iscale (nmax - 1) / range, q5_K 0..15 from - 0.5 */
    const int nmax = dt == DT_Q4_K ? 15 : 31, nstep = dt == DT_Q4_K ? 20 : 15;
    const float rmin = dt == DT_Q4_K ? -1.0f : -0.5f;
    float sc[8], mn[8], w[32], grid[8][2], smax = 0.0f, mmax = 0.0f;
    for (int j = 0; j < 8; j++) {
        float s2 = 0.0f;
        for (int i = 0; i < 32; i++)
            s2 += x[32 * j + i] * x[32 * j + i];
        const float av = sqrtf(s2 / 32.0f); /* the sub-block's rms, not the super-block's */
        for (int i = 0; i < 32; i++)
            w[i] = av + fabsf(x[32 * j + i]); /* ggml's weighting: large values matter more */
        sc[j] = fit_affine(x + 32 * j, w, nmax, rmin, nstep, &mn[j], grid[j]);
        if (sc[j] > smax) /* not fmaxf: a -0 min (-lo, lo = 0) must leave +0, so dmin's */
            smax = sc[j]; /* f16 is 0x0000 as ggml writes it */
        if (mn[j] > mmax)
            mmax = mn[j];
    }
    /* 6-bit scales and mins against their maxima (ggml's rounding: nearest(63 / max * v),
     * not v over the f16-rounded d; the same squared error within 0.01% on TinyLlama, and
     * it keeps our bytes equal to quantize_row_q4_K_ref's); codes refitted to them below */
    const uint16_t d16 = half_f32_to_f16(smax / 63.0f), m16 = half_f32_to_f16(mmax / 63.0f);
    const float d = half_f16_to_f32(d16), dmin = half_f16_to_f32(m16);
    const float is = smax > 0.0f ? 63.0f / smax : 0.0f, im = mmax > 0.0f ? 63.0f / mmax : 0.0f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        const int a = nearest(is * sc[j]), b = nearest(im * mn[j]);
        ls[j] = (uint8_t)(a < 0 ? 0 : a > 63 ? 63 : a);
        lm[j] = (uint8_t)(b < 0 ? 0 : b > 63 ? 63 : b);
    }
    memset(blk, 0, dtype_info(dt)->block_bytes);
    memcpy(blk, &d16, 2);
    memcpy(blk + 2, &m16, 2);
    uint8_t *s = blk + 4; /* the inverse of quant_kq_scale_min */
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (uint8_t)((ls[j] & 15) | (lm[j] & 15) << 4);
            s[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            s[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
    uint8_t *qs = blk + (dt == DT_Q4_K ? 16 : 48), *qh = blk + 16;
    for (int j = 0; j < 8; j++) {
        const float dj = d * (float)ls[j], mj = dmin * (float)lm[j];
        for (int l = 0; l < 32; l++) {
            /* a scale that rounded to 0 keeps the search's codes (they decode to -mj all
             * the same; ggml keeps them, and so the bytes stay equal) */
            int q = dj > 0.0f ? nearest((x[32 * j + l] + mj) / dj)
                              : nearest(grid[j][0] * (x[32 * j + l] - grid[j][1]));
            q = q < 0 ? 0 : q > nmax ? nmax : q;
            const int c = j / 2, hi = j & 1;
            qs[32 * c + l] |= (uint8_t)((q & 15) << (4 * hi));
            if (dt == DT_Q5_K)
                qh[l] |= (uint8_t)((q >> 4) << (2 * c + hi));
        }
    }
}

static void quantize_q6k(const float *x, struct quant_q6_k *b)
{
    float sc[16], grid[16], smax = 0.0f, big = 0.0f;
    for (int k = 0; k < 16; k++) {
        sc[k] = fit_symmetric(x + 16 * k, &grid[k]);
        if (fabsf(sc[k]) > smax) {
            smax = fabsf(sc[k]);
            big = sc[k];
        }
    }
    memset(b, 0, sizeof *b);
    if (smax < KQ_GROUP_EPS) /* d = 0: every element decodes to 0 */
        return;
    /* the largest scale maps to -128 (int8's full range), as ggml rounds it */
    const float is = -128.0f / big;
    b->d = half_f32_to_f16(1.0f / is);
    const float d = half_f16_to_f32(b->d);
    for (int k = 0; k < 16; k++) {
        int l = nearest(is * sc[k]);
        b->scales[k] = (int8_t)(l < -128 ? -128 : l > 127 ? 127 : l);
    }
    for (int e = 0; e < QUANT_K; e++) {
        const float de = d * (float)b->scales[e / 16];
        /* a scale that rounded to 0 keeps the search's codes, and an all-zero sub-block
         * code 0, as ggml does (they decode to 0 all the same) */
        int q = de != 0.0f ? nearest(x[e] / de) : nearest(grid[e / 16] * x[e]);
        q = (q < -32 ? -32 : q > 31 ? 31 : q) + 32;
        if (de == 0.0f && grid[e / 16] == 0.0f)
            q = 0;
        const int h = e / 128, k = e % 128 / 32, l = e % 32;
        b->ql[64 * h + 32 * (k & 1) + l] |= (uint8_t)((q & 15) << (k >= 2 ? 4 : 0));
        b->qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * k));
    }
}

int kern_quantize_row_kq(enum dtype dt, const float *x, void *dst, size_t n)
{
    CHECK(dtype_is_kq(dt));
    if (n % QUANT_K != 0) {
        LOG_ERR("%s: a row of %zu elements is not whole super-blocks of %d", dtype_info(dt)->name,
                n, QUANT_K);
        return ERR_FORMAT;
    }
    int rc = check_finite(x, n);
    if (rc)
        return rc;
    uint8_t *b = dst;
    const size_t bb = dtype_info(dt)->block_bytes;
    for (size_t i = 0; i < n; i += QUANT_K, b += bb) {
        if (dt == DT_Q6_K)
            quantize_q6k(x + i, (void *)b);
        else
            quantize_q45k(dt, x + i, b);
    }
    return 0;
}

/* One thread's share of kern_quantize_rows_kq: rows [r0, r1). */
struct kq_rows_job {
    enum dtype dt;
    const float *x; /* [rows][n] */
    uint8_t *dst;   /* [rows][row bytes] */
    size_t n, r0, r1;
    int rc;
    pthread_t th;
};

static void *kq_rows_run(void *arg)
{
    struct kq_rows_job *j = arg;
    const size_t rb = kern__row_bytes(j->dt, j->n);
    for (size_t r = j->r0; r < j->r1 && j->rc == 0; r++)
        j->rc = kern_quantize_row_kq(j->dt, j->x + r * j->n, j->dst + r * rb, j->n);
    return NULL;
}

int kern_quantize_rows_kq(enum dtype dt, const float *x, size_t rows, size_t n, void *dst,
                          int threads)
{
    CHECK(dtype_is_kq(dt));
    if (n % QUANT_K != 0) {
        LOG_ERR("%s: a row of %zu elements is not whole super-blocks of %d", dtype_info(dt)->name,
                n, QUANT_K);
        return ERR_FORMAT;
    }
    if (threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c > 0 ? (int)c : 1;
    }
    if (threads > KQ_MAX_THREADS)
        threads = KQ_MAX_THREADS;
    if ((size_t)threads > rows)
        threads = rows ? (int)rows : 1;
    struct kq_rows_job job[KQ_MAX_THREADS];
    int started = 0;
    for (int t = 0; t < threads; t++) {
        /* contiguous shares: row r's bytes depend on row r alone, never on the split */
        job[t] = (struct kq_rows_job){dt, x, dst, n, rows * (size_t)t / (size_t)threads,
                                      rows * (size_t)(t + 1) / (size_t)threads, 0, 0};
        if (t == 0)
            continue;
        int e = pthread_create(&job[t].th, NULL, kq_rows_run, &job[t]);
        if (e) { /* run the share here instead: slower, same bytes */
            LOG_WARN("quantize: pthread_create: %s; quantizing on fewer threads", strerror(e));
            kq_rows_run(&job[t]);
            job[t].th = 0;
            continue;
        }
        started |= 1 << t;
    }
    kq_rows_run(&job[0]);
    int rc = 0;
    for (int t = 0; t < threads; t++) {
        if (started >> t & 1)
            pthread_join(job[t].th, NULL);
        if (rc == 0)
            rc = job[t].rc; /* the first failing row's error, whatever the split */
    }
    return rc;
}

/* ---- the _ref twins ---------------------------------------------------------------------- */

/*
 * The specification of the SIMD variants, per activation block b of 32 (dx_b its scale, xq its
 * int8 quants) in column order with f32 accumulation; integer sums are exact:
 *   q4_K, q5_K (sub-block j = b % 8): acc += (d * sc_j) * dx_b * sum q xq
 *                                     acc -= (dmin * m_j) * dx_b * sum xq
 *   q6_K: acc += d * dx_b * (sc_2j' * sum_lo (q - 32) xq + sc_2j'+1 * sum_hi (q - 32) xq),
 *         j' = b % 8, lo/hi the block's two 16-element halves.
 */
static void mm_kq_ref(enum dtype wt, const void *w, const struct kern_act *a, float *y,
                      size_t ldy, size_t r0, size_t r1)
{
    CHECK(a->wt == wt && a->q && dtype_is_kq(wt));
    const size_t row_bytes = kern__row_bytes(wt, a->cols), nb = a->cols / 32;
    const size_t bb = dtype_info(wt)->block_bytes;
    for (size_t t = 0; t < a->n; t++) {
        const int8_t *q = a->q + t * a->ld;     /* [cols] */
        const float *dx = a->d + t * a->cp / 32; /* [cp/32] */
        for (size_t r = r0; r < r1; r++) {
            const uint8_t *row = (const uint8_t *)w + r * row_bytes;
            float acc = 0.0f;
            for (size_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b / 8 * bb;
                const int j = (int)(b % 8);
                const int8_t *xq = q + b * 32;
                if (wt == DT_Q6_K) {
                    const struct quant_q6_k *k6 = (const void *)blk;
                    int32_t lo = 0, hi = 0;
                    for (int l = 0; l < 16; l++) {
                        lo += (kq_code(wt, blk, 32 * j + l) - 32) * xq[l];
                        hi += (kq_code(wt, blk, 32 * j + 16 + l) - 32) * xq[16 + l];
                    }
                    int32_t dot = k6->scales[2 * j] * lo + k6->scales[2 * j + 1] * hi;
                    acc += half_f16_to_f32(k6->d) * dx[b] * (float)dot;
                } else {
                    int32_t dot = 0, sum = 0;
                    for (int l = 0; l < 32; l++) {
                        dot += kq_code(wt, blk, 32 * j + l) * xq[l];
                        sum += xq[l];
                    }
                    uint8_t sc, m;
                    quant_kq_scale_min(blk + 4, j, &sc, &m);
                    acc += f16_at(blk) * (float)sc * dx[b] * (float)dot;
                    acc -= f16_at(blk + 2) * (float)m * dx[b] * (float)sum;
                }
            }
            y[t * ldy + r] = acc;
        }
    }
}

#define KQ_TWIN_(op, wty, DT)                                                                \
    void kern_##op##_##wty##_q8_0_ref(const void *w, const struct kern_act *a, float *y,     \
                                      size_t ldy, size_t r0, size_t r1)                      \
    {                                                                                        \
        mm_kq_ref(DT, w, a, y, ldy, r0, r1);                                                 \
    }
KQ_TWIN_(gemv, q4_k, DT_Q4_K)
KQ_TWIN_(gemm, q4_k, DT_Q4_K)
KQ_TWIN_(gemv, q5_k, DT_Q5_K)
KQ_TWIN_(gemm, q5_k, DT_Q5_K)
KQ_TWIN_(gemv, q6_k, DT_Q6_K)
KQ_TWIN_(gemm, q6_k, DT_Q6_K)
