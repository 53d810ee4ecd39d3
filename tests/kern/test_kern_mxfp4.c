/*
 * test_kern_mxfp4.c — the MXFP4 kernels (gpt-oss experts; kernels/include/quant.h, spec §4):
 *  - kern_row_to_f32(DT_MXFP4) against a decoder written here from the spec's E2M1 table
 *    (§4.2: value by code, bit 3 the sign) and E8M0 rule (§4.3: 2^(e-127)), for all 16 codes in
 *    both nibble positions and every exponent 0..254;
 *  - kern_{gemv,gemm}_mxfp4_q8_0_{avx2,avx512} against their scalar _ref twins, and the twins and
 *    the dispatched kern_matmul / kern_matmul_act against the f32 specification
 *    (kern_matmul_ref), on row counts and ranges that are no multiple of the register tiles or
 *    16-row panels, 1..17 tokens, odd block counts and more than one 1024-column chunk;
 *    exponents random around 127 (weights O(1)) and, in extreme cases, per column block from
 *    {0, 1, 2, 127, 252, 253, 254} with the activations of that block scaled by about
 *    2^(127-e) so the products stay finite;
 *  - expert slices: kern_matmul_act on rows starting at any byte (an expert of a 3D tensor
 *    [experts][rows][cols] is a pointer offset of a multiple of 17 bytes) gives the same bits as
 *    on a 64-byte aligned copy, on every ISA;
 *  - the AVX-512 gemv (x86/avx512_mxfp4.c, with and without VBMI) gives the bits of the
 *    AVX-512 gemm on every case above, extreme exponents included;
 *  - mxfp4 panels (quant.h "mxfp4 panels", the loader's repack of the experts): the packed
 *    bytes where the layout says, the stored rows back byte for byte, zeros past the matrix;
 *    each panel variant (kern_gemm_mxfp4p_q8_0_*) gives its ISA's stored-row gemm's bits on
 *    every case above (AVX-512 with and without VBMI), the panel entries kern_matmul_act's;
 *  - batch invariance: every token's row, for n = 1..33 tokens drawn at random, equals its
 *    n = 1 bits through kern_matmul, kern_matmul_act, kern_matmul_act_panels and each gemv
 *    and gemm variant, on every ISA (a MoE expert's token count depends on the rest of the
 *    batch).
 *
 * Stated bounds (S = sum |w*x| of each output, w the dequantized weights):
 *  - variant vs its twin (same int8 activations, exact integer products |w'| <= 12 times
 *    |q| <= 127, exact power-of-two block scales; only the order of f32 additions differs):
 *    |y - y_twin| <= 1e-5 * S.
 *  - twin, variant and dispatched entries vs the f32 specification: the int8 activation bound
 *    of quant.h, sum_b d_b/2 * sum_{i in b} |w_i|, plus 2e-5 * S.
 *  - the scalar ISA's entries are the f32 specification itself: equal bit for bit.
 */
#include "testutil.h"
#include "rng.h"
#include "isa_case.h"

#include "dtype.h"
#include "kern_variants.h"
#include "quant.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL -12345.0f
#define BB 17 /* bytes per block: exponent, then 16 bytes of split-half nibbles */

static uint64_t rng_state = 0x6a09e667f3bcc909ull;

static uint32_t rnd(void)
{
    rng_xorshift64(&rng_state);
    return (uint32_t)(rng_state >> 16);
}

static float rndf(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; } /* [-1, 1) */

static size_t rndz(size_t lo, size_t hi) { return lo + rnd() % (hi - lo + 1); }

/* aligned_alloc sizes must be multiples of the alignment */
static size_t round64(size_t v) { return (v + 63) / 64 * 64; }

/* ---- an independent decoder (spec §4.2-§4.4, GGUF's split-half layout) -------------------- */

/* E2M1 code -> value, the spec's table; bit 3 is the sign. */
static const double fp4_table[16] = {0.0,  0.5,  1.0,  1.5,  2.0,  3.0,  4.0,  6.0,
                                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};

/* Element j (0..31) of a 17-byte block: byte 0 the exponent, qs[j] low nibble element j,
 * high nibble element j+16 (spec §4.4, llama.cpp's block_mxfp4). */
static double spec_element(const uint8_t *blk, int j)
{
    int byte = blk[1 + (j & 15)], code = j < 16 ? byte & 15 : byte >> 4;
    return ldexp(fp4_table[code], (int)blk[0] - 127);
}

static void test_row_to_f32_spec(void **state)
{
    (void)state;
    enum { NB = 255 }; /* one block per exponent 0..254 */
    uint8_t *row = malloc(NB * BB);
    float *f = malloc(NB * 32 * sizeof(float));
    assert_non_null(row);
    assert_non_null(f);
    for (int rep = 0; rep < 16; rep++) {
        for (int b = 0; b < NB; b++) {
            uint8_t *blk = row + b * BB;
            blk[0] = (uint8_t)b;
            /* every code in both nibbles: low = (j + rep) % 16, high = (j * 7 + b + rep) % 16 */
            for (int j = 0; j < 16; j++)
                blk[1 + j] = (uint8_t)(((j + rep) & 15) | (((j * 7 + b + rep) & 15) << 4));
        }
        kern_row_to_f32(DT_MXFP4, row, f, NB * 32);
        for (int b = 0; b < NB; b++)
            for (int j = 0; j < 32; j++) {
                double want = spec_element(row + b * BB, j), got = f[b * 32 + j];
                /* values beyond FLT_MAX (codes >= 2.0 at e = 254) overflow to infinity */
                if (fabs(want) > FLT_MAX)
                    want = want > 0 ? INFINITY : -INFINITY;
                if (!(got == want))
                    fail_msg("e %d element %d (code %d): got %.9g, the spec says %.9g", b, j,
                             j < 16 ? row[b * BB + 1 + j] & 15 : row[b * BB + 1 + j - 16] >> 4,
                             got, want);
            }
    }
    free(f);
    free(row);
}

/* ---- products --------------------------------------------------------------------------- */

struct variant {
    const char *name;
    enum kern_isa isa;
    kern_mm_fn *fn, *twin;
};

static const struct variant variants[] = {
    {"kern_gemv_mxfp4_q8_0_avx2", KERN_ISA_AVX2, kern_gemv_mxfp4_q8_0_avx2,
     kern_gemv_mxfp4_q8_0_ref},
    {"kern_gemm_mxfp4_q8_0_avx2", KERN_ISA_AVX2, kern_gemm_mxfp4_q8_0_avx2,
     kern_gemm_mxfp4_q8_0_ref},
    {"kern_gemv_mxfp4_q8_0_avx512", KERN_ISA_AVX512, kern_gemv_mxfp4_q8_0_avx512,
     kern_gemv_mxfp4_q8_0_ref},
    {"kern_gemm_mxfp4_q8_0_avx512", KERN_ISA_AVX512, kern_gemm_mxfp4_q8_0_avx512,
     kern_gemm_mxfp4_q8_0_ref},
    /* the AVX-512 gemv without VBMI (x86/avx512_mxfp4.c) */
    {"kern_gemv_mxfp4_q8_0_avx512_plain", KERN_ISA_AVX512, kern_gemv_mxfp4_q8_0_avx512_plain,
     kern_gemv_mxfp4_q8_0_ref},
};


/* Exponent bases of the extreme cases, per column block (0 and 254 are the E8M0 extremes). */
static const int extreme_e[] = {0, 1, 2, 127, 252, 253, 254};

/* A case: weights [rows][cols] (exactly rows * rb bytes, so ASan sees any overread) and
 * activations x [n][cols] whose block b is scaled by 2^xs[b]. */
struct mcase {
    size_t rows, cols, n, rb;
    uint8_t *w;
    float *x;
};

static void make_case(struct mcase *c, size_t rows, size_t cols, size_t n, int extreme)
{
    const size_t nb = cols / 32;
    c->rows = rows;
    c->cols = cols;
    c->n = n;
    c->rb = nb * BB;
    c->w = malloc(rows * c->rb);
    c->x = malloc(n * cols * sizeof(float));
    int *xs = malloc(nb * sizeof(int)), *base = malloc(nb * sizeof(int));
    assert_non_null(c->w);
    assert_non_null(c->x);
    assert_non_null(xs);
    assert_non_null(base);
    for (size_t b = 0; b < nb; b++) {
        base[b] = extreme ? extreme_e[rnd() % (sizeof extreme_e / sizeof extreme_e[0])] : 0;
        int s = 127 - base[b]; /* activations ~ 2^(127-e): products O(1) */
        xs[b] = extreme ? (s > 120 ? 120 : s < -120 ? -120 : s) : 0;
    }
    for (size_t r = 0; r < rows; r++)
        for (size_t b = 0; b < nb; b++) {
            uint8_t *blk = c->w + r * c->rb + b * BB;
            int e = extreme ? base[b] + (int)(rnd() % 3) - 1 : 121 + (int)(rnd() % 12);
            blk[0] = (uint8_t)(e < 0 ? 0 : e > 254 ? 254 : e);
            /* at e = 253, 254 the larger codes exceed FLT_MAX (the f32 specification would be
             * infinite): magnitudes up to 3.0 (index 5) and 1.5 (index 3) there */
            const unsigned nmag = blk[0] == 254 ? 4 : blk[0] == 253 ? 6 : 8;
            for (int j = 1; j < BB; j++) {
                unsigned lo = (rnd() & 8) | (rnd() % nmag), hi = (rnd() & 8) | (rnd() % nmag);
                blk[j] = (uint8_t)(lo | hi << 4);
            }
        }
    for (size_t t = 0; t < n; t++)
        for (size_t col = 0; col < cols; col++)
            c->x[t * cols + col] =
                ldexpf(rndf() * (rnd() % 4 == 0 ? 8.0f : 1.0f), xs[col / 32]);
    /* one all-zero activation block per token where there is room: a zero scale */
    if (cols >= 64)
        for (size_t t = 0; t < n; t++)
            memset(c->x + t * cols + 32, 0, 32 * sizeof(float));
    free(base);
    free(xs);
}

static void free_case(struct mcase *c)
{
    free(c->w);
    free(c->x);
}

static float *filled(size_t count)
{
    float *p = malloc(count * sizeof(float));
    assert_non_null(p);
    for (size_t i = 0; i < count; i++)
        p[i] = SENTINEL;
    return p;
}

/* |y - want| <= tol inside rows [r0, r1); SENTINEL outside it. */
static void check_close(const char *what, const struct mcase *c, const float *y,
                        const float *want, const float *tol, size_t ldy, size_t r0, size_t r1)
{
    for (size_t t = 0; t < c->n; t++)
        for (size_t r = 0; r < ldy; r++) {
            size_t i = t * ldy + r;
            if (r < r0 || r >= r1) {
                if (y[i] != SENTINEL)
                    fail_msg("%s: rows %zu cols %zu n %zu: y[%zu][%zu] outside [%zu,%zu) written",
                             what, c->rows, c->cols, c->n, t, r, r0, r1);
                continue;
            }
            if (!(fabsf(y[i] - want[i]) <= tol[i]))
                fail_msg("%s: rows %zu cols %zu n %zu rows [%zu,%zu): y[%zu][%zu] = %.9g, want "
                         "%.9g (tolerance %.3g)",
                         what, c->rows, c->cols, c->n, r0, r1, t, r, y[i], want[i], tol[i]);
        }
}

/* The AVX-512 gemv, with and without VBMI, gives the AVX-512 gemm's bits (batch invariance:
 * which of the two runs depends on the expert's token count), on the case's rows [r0, r1),
 * and writes nothing outside them. */
static void check_gemv_gemm_bits(const struct kern_act *a, const uint8_t *w, size_t rows,
                                 size_t ldy, size_t r0, size_t r1)
{
    static kern_mm_fn *const gv[] = {kern_gemv_mxfp4_q8_0_avx512,
                                     kern_gemv_mxfp4_q8_0_avx512_plain};
    static const char *const names[] = {"kern_gemv_mxfp4_q8_0_avx512",
                                        "kern_gemv_mxfp4_q8_0_avx512_plain"};
    const size_t count = a->n * ldy;
    float *want = filled(count), *y = malloc(count * sizeof(float));
    assert_non_null(y);
    kern_gemm_mxfp4_q8_0_avx512(w, a, want, ldy, r0, r1);
    for (size_t v = 0; v < 2; v++) {
        for (size_t i = 0; i < count; i++)
            y[i] = SENTINEL;
        gv[v](w, a, y, ldy, r0, r1);
        for (size_t i = 0; i < count; i++)
            if (memcmp(&y[i], &want[i], sizeof y[i]) != 0)
                fail_msg("%s: rows %zu cols %zu n %zu rows [%zu,%zu): y[%zu][%zu] = %.9g, "
                         "kern_gemm_mxfp4_q8_0_avx512 gives %.9g",
                         names[v], rows, a->cols, a->n, r0, r1, i / ldy, i % ldy, y[i],
                         want[i]);
    }
    free(y);
    free(want);
}

static const struct isa_case *g_case;

/* Panels of the case's weights (kern_panels_pack in two ranges, as threads may), checked
 * byte for byte: the stored rows come back, rows past the matrix are zero bytes, and each block
 * is where quant.h "mxfp4 panels" says. Returns the aligned buffer. */
static uint8_t *make_panels(const struct mcase *c)
{
    const size_t rows = c->rows, cols = c->cols, nb = cols / 32, np = (rows + 15) / 16;
    const size_t bytes = kern_panels_bytes(DT_MXFP4, rows, cols);
    assert_true(kern_panels_supported(DT_MXFP4));
    assert_int_equal(bytes, np * 16 * c->rb);
    uint8_t *wp = aligned_alloc(64, round64(bytes)), *back = malloc(rows * c->rb);
    assert_non_null(wp);
    assert_non_null(back);
    memset(wp, 0xa5, bytes); /* rows past the matrix must be written (as zeros) */
    kern_panels_pack(DT_MXFP4, c->w, cols, wp, rows, 0, np / 2);
    kern_panels_pack(DT_MXFP4, c->w, cols, wp, rows, np / 2, np);
    kern_panels_rows(DT_MXFP4, wp, cols, 0, rows, back);
    assert_memory_equal(back, c->w, rows * c->rb);
    for (size_t r = 0; r < np * 16; r++)
        for (size_t b = 0; b < nb; b++) {
            const uint8_t *pp = wp + r / 16 * 16 * c->rb, *blk = c->w + r * c->rb + b * BB;
            const size_t i = r % 16;
            assert_int_equal(pp[quant_mxp_soff(b, nb) + i], r < rows ? blk[0] : 0);
            for (size_t g = 0; g < 4; g++)
                for (size_t j = 0; j < 4; j++)
                    assert_int_equal(pp[quant_mxp_qoff(b, nb) + g * 64 + i * 4 + j],
                                     r < rows ? blk[1 + 4 * g + j] : 0);
        }
    free(back);
    return wp;
}

/* The panel products on rows [r0, r1) (r0 rounded down to its panel): each panel variant of
 * the test's ISA gives its stored-row gemm's bits (the AVX-512 one with and without VBMI: the
 * arithmetic of x86/avx512_mxfp4.c's gemv and x86/avx512_q.c's gemm), and the entries
 * kern_matmul_act_panels / kern_matmul_panels give kern_matmul_act's bits on the stored rows;
 * nothing is written outside the rows. */
static void check_panels(const struct mcase *c, const struct kern_act *a, size_t ldy, size_t r0,
                         size_t r1)
{
    static const struct {
        const char *name;
        enum kern_isa isa;
        kern_mm_fn *fn, *rows_fn;
    } pv[] = {
        {"kern_gemm_mxfp4p_q8_0_ref", KERN_ISA_REF, kern_gemm_mxfp4p_q8_0_ref,
         kern_gemm_mxfp4_q8_0_ref},
        {"kern_gemm_mxfp4p_q8_0_avx2", KERN_ISA_AVX2, kern_gemm_mxfp4p_q8_0_avx2,
         kern_gemm_mxfp4_q8_0_avx2},
        {"kern_gemm_mxfp4p_q8_0_avx512", KERN_ISA_AVX512, kern_gemm_mxfp4p_q8_0_avx512,
         kern_gemm_mxfp4_q8_0_avx512},
        {"kern_gemm_mxfp4p_q8_0_avx512_plain", KERN_ISA_AVX512,
         kern_gemm_mxfp4p_q8_0_avx512_plain, kern_gemm_mxfp4_q8_0_avx512},
    };
    r0 = r0 / 16 * 16;
    uint8_t *wp = make_panels(c);
    const size_t count = a->n * ldy;
    float *want = filled(count), *y = filled(count);
    /* one, two and four DRAM streams per thread (kern_set_panel_streams: n <= 4, more than one
     * panel; four at n <= 2) */
    static const int streams[] = {1, 2, 4};
    for (size_t sv = 0; sv < 3 * (sizeof pv / sizeof pv[0] + 2); sv++) {
        const size_t v = sv % (sizeof pv / sizeof pv[0] + 2);
        kern_set_panel_streams(streams[sv / (sizeof pv / sizeof pv[0] + 2)]);
        const char *name = v < sizeof pv / sizeof pv[0] ? pv[v].name
                           : v == sizeof pv / sizeof pv[0] ? "kern_matmul_act_panels"
                                                           : "kern_matmul_panels";
        if (v < sizeof pv / sizeof pv[0] && pv[v].isa != g_case->isa)
            continue;
        for (size_t i = 0; i < count; i++)
            y[i] = want[i] = SENTINEL;
        if (v < sizeof pv / sizeof pv[0]) {
            pv[v].rows_fn(c->w, a, want, ldy, r0, r1);
            pv[v].fn(wp, a, y, ldy, r0, r1);
        } else {
            kern_matmul_act(c->w, a, want, ldy, r0, r1);
            if (v == sizeof pv / sizeof pv[0])
                kern_matmul_act_panels(DT_MXFP4, wp, a, y, ldy, r0, r1);
            else
                kern_matmul_panels(DT_MXFP4, wp, c->cols, a->x, a->n, y, ldy, r0, r1);
        }
        for (size_t i = 0; i < count; i++)
            if (memcmp(&y[i], &want[i], sizeof y[i]) != 0)
                fail_msg("%s (%s): rows %zu cols %zu n %zu rows [%zu,%zu): y[%zu][%zu] = %.9g, "
                         "the stored rows give %.9g",
                         name, g_case->name, c->rows, c->cols, a->n, r0, r1, i / ldy, i % ldy,
                         y[i], want[i]);
    }
    kern_set_panel_streams(4); /* the default, for the checks after this one */
    free(y);
    free(want);
    free(wp);
}

/*
 * One case on the test's ISA: its variants against their twins and the spec, and the
 * dispatched kern_matmul / kern_matmul_act against the spec.
 */
static int g_full_range; /* run_case: rows [0, rows), not a random range */

static void run_case(size_t rows, size_t cols, size_t n, int extreme)
{
    struct mcase c;
    make_case(&c, rows, cols, n, extreme);
    size_t r0 = rnd() % 4 == 0 ? 0 : rndz(0, rows - 1), r1 = rndz(r0 + 1, rows);
    if (g_full_range) /* every panel of the matrix */
        r0 = 0, r1 = rows;
    size_t ldy = rows + rndz(0, 5);
    float *wf = malloc(rows * cols * sizeof(float));
    assert_non_null(wf);
    for (size_t r = 0; r < rows; r++)
        kern_row_to_f32(DT_MXFP4, c.w + r * c.rb, wf + r * cols, cols);

    size_t act_bytes;
    assert_int_equal(kern_act_bytes(DT_MXFP4, cols, n, &act_bytes), 0);
    void *buf = aligned_alloc(64, act_bytes);
    assert_non_null(buf);
    struct kern_act a;
    kern_act_init(&a, DT_MXFP4, c.x, cols, n, buf);
    kern_act_prepare(&a, 0, n);
    assert_non_null(a.q); /* mxfp4 products read int8 activations */

    /* S and the quantization bound of each output, in double */
    float *s = filled(n * ldy), *qb = filled(n * ldy);
    for (size_t t = 0; t < n; t++)
        for (size_t r = 0; r < rows; r++) {
            double sum = 0, qerr = 0;
            for (size_t col = 0; col < cols; col++)
                sum += fabs((double)wf[r * cols + col] * c.x[t * cols + col]);
            for (size_t b = 0; b < cols / 32; b++) {
                double wabs = 0;
                for (size_t col = b * 32; col < b * 32 + 32; col++)
                    wabs += fabs(wf[r * cols + col]);
                qerr += a.d[t * a.cp / 32 + b] / 2 * wabs;
            }
            s[t * ldy + r] = (float)sum;
            qb[t * ldy + r] = (float)qerr;
        }
    float *want = filled(n * ldy), *twin = filled(n * ldy), *y = filled(n * ldy);
    float *tol = malloc(n * ldy * sizeof(float)), *tolq = malloc(n * ldy * sizeof(float));
    assert_non_null(tol);
    assert_non_null(tolq);
    for (size_t i = 0; i < n * ldy; i++) {
        tol[i] = 1e-5f * s[i] + 1e-30f;
        tolq[i] = qb[i] + 2e-5f * s[i] + 1e-30f;
    }
    kern_matmul_ref(DT_MXFP4, c.w, cols, c.x, n, want, ldy, r0, r1);

    char what[160];
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        const struct variant *vr = &variants[v];
        if (vr->isa != g_case->isa)
            continue;
        for (size_t i = 0; i < n * ldy; i++)
            twin[i] = y[i] = SENTINEL;
        vr->twin(c.w, &a, twin, ldy, r0, r1);
        vr->fn(c.w, &a, y, ldy, r0, r1);
        snprintf(what, sizeof what, "%s vs its twin%s", vr->name, extreme ? " (extreme e)" : "");
        check_close(what, &c, y, twin, tol, ldy, r0, r1);
        snprintf(what, sizeof what, "%s's twin vs the f32 spec", vr->name);
        check_close(what, &c, twin, want, tolq, ldy, r0, r1);
        snprintf(what, sizeof what, "%s vs the f32 spec", vr->name);
        check_close(what, &c, y, want, tolq, ldy, r0, r1);
    }

    if (g_case->isa == KERN_ISA_AVX512)
        check_gemv_gemm_bits(&a, c.w, rows, ldy, r0, r1);
    check_panels(&c, &a, ldy, r0, r1);

    /* the entries of the test's ISA (the scalar one is the spec: bit for bit) */
    for (size_t i = 0; i < n * ldy; i++)
        y[i] = twin[i] = SENTINEL;
    kern_matmul(DT_MXFP4, c.w, cols, c.x, n, y, ldy, r0, r1);
    kern_matmul_act(c.w, &a, twin, ldy, r0, r1);
    if (g_case->isa == KERN_ISA_REF) {
        assert_memory_equal(y, want, n * ldy * sizeof(float));
        assert_memory_equal(twin, want, n * ldy * sizeof(float));
    } else {
        snprintf(what, sizeof what, "kern_matmul(mxfp4, %s)", g_case->name);
        check_close(what, &c, y, want, tolq, ldy, r0, r1);
        snprintf(what, sizeof what, "kern_matmul_act(mxfp4, %s)", g_case->name);
        check_close(what, &c, twin, want, tolq, ldy, r0, r1);
    }

    free(tolq);
    free(tol);
    free(y);
    free(twin);
    free(want);
    free(qb);
    free(s);
    free(buf);
    free(wf);
    free_case(&c);
}

/* Block counts: odd ones, the AVX-512 gemv's 16-block step and its tail, > one 1024-column
 * chunk of the gemm. */
static const size_t g_blocks[] = {1, 2, 3, 5, 15, 16, 17, 31, 33, 34, 65};
static const size_t g_ns[] = {1, 2, 3, 4, 5, 8, 9, 17};

static void test_matmul_mxfp4(void **state)
{
    g_case = isa_case_begin(state);
    size_t k = 0;
    for (size_t in = 0; in < sizeof g_ns / sizeof g_ns[0]; in++)
        for (int rep = 0; rep < 6; rep++, k++)
            run_case(rndz(1, 40), 32 * g_blocks[k % (sizeof g_blocks / sizeof g_blocks[0])],
                     g_ns[in], 0);
    /* full and partial 16-row panels, two KC chunks, many tokens */
    run_case(48, 2048 + 96, 33, 0);
    run_case(33, 2880, 12, 0);
    /* 1-4 tokens over an even and an odd number of panels, the last one partial (two streams:
     * panels i and h + i together) */
    for (size_t n = 1; n <= 4; n++) {
        run_case(16 * 5 + 7, 2880, n, 0);
        run_case(16 * 4 + 3, 2048 + 96, n, 0);
        /* four streams: 10 panels in lanes of 4, 3, 3 (the tiles of 4, 2 + 1) */
        run_case(16 * 9 + 5, 2880, n, 0);
    }
    /* four streams over whole matrices (a random range seldom has enough panels): 10 panels
     * (lanes of 4, 3, 3: the tiles of 4, 2 + 1) and 16 (lanes of 4), the last partial */
    g_full_range = 1;
    for (size_t n = 1; n <= 2; n++) {
        run_case(16 * 9 + 5, 2880, n, 0);
        run_case(16 * 15 + 5, 2880, n, 0);
    }
    g_full_range = 0;
}

/* Exponents 0 and 254 (and their neighbours) with activations scaled to keep products finite. */
static void test_matmul_mxfp4_extreme_e(void **state)
{
    g_case = isa_case_begin(state);
    size_t k = 0;
    for (size_t in = 0; in < sizeof g_ns / sizeof g_ns[0]; in++)
        for (int rep = 0; rep < 4; rep++, k++)
            run_case(rndz(1, 40), 32 * g_blocks[(k * 5) % (sizeof g_blocks / sizeof g_blocks[0])],
                     g_ns[in], 1);
}

/*
 * Expert slices: a [experts][rows][cols] tensor with an odd block count (so expert e starts at
 * e * rows * nb * 17 bytes: every residue mod 64 comes up), the whole tensor placed at each
 * offset 0..15 from a 64-byte boundary. kern_matmul_act on each expert equals, bit for bit,
 * the same call on a 64-byte aligned copy of that expert (the kernels assume nothing about the
 * weight pointer's alignment), for gemv and gemm token counts.
 */
static void test_expert_slices(void **state)
{
    g_case = isa_case_begin(state);
    enum { EXPERTS = 5, ROWS = 19 };
    static const size_t colss[] = {32 * 3, 32 * 17, 32 * 33};
    static const size_t nss[] = {1, 3, 16};
    for (size_t ic = 0; ic < sizeof colss / sizeof colss[0]; ic++)
        for (size_t in = 0; in < sizeof nss / sizeof nss[0]; in++) {
            const size_t cols = colss[ic], n = nss[in], rb = cols / 32 * BB;
            const size_t eb = ROWS * rb; /* bytes per expert */
            struct mcase c;
            make_case(&c, ROWS * EXPERTS, cols, n, 0);
            size_t act_bytes;
            assert_int_equal(kern_act_bytes(DT_MXFP4, cols, n, &act_bytes), 0);
            void *buf = aligned_alloc(64, act_bytes);
            uint8_t *big = aligned_alloc(64, round64(EXPERTS * eb + 64));
            uint8_t *one = aligned_alloc(64, round64(eb));
            float *y = malloc(n * ROWS * sizeof(float)), *z = malloc(n * ROWS * sizeof(float));
            assert_non_null(buf);
            assert_non_null(big);
            assert_non_null(one);
            assert_non_null(y);
            assert_non_null(z);
            struct kern_act a;
            kern_act_init(&a, DT_MXFP4, c.x, cols, n, buf);
            kern_act_prepare(&a, 0, n);
            for (size_t off = 0; off < 16; off++) {
                memcpy(big + off, c.w, EXPERTS * eb);
                for (size_t e = 0; e < EXPERTS; e++) {
                    memcpy(one, c.w + e * eb, eb);
                    kern_matmul_act(big + off + e * eb, &a, y, ROWS, 0, ROWS);
                    kern_matmul_act(one, &a, z, ROWS, 0, ROWS);
                    if (memcmp(y, z, n * ROWS * sizeof(float)) != 0)
                        fail_msg("%s: expert %zu at byte offset %zu (cols %zu, n %zu) differs "
                                 "from its aligned copy",
                                 g_case->name, e, (size_t)((uintptr_t)(big + off + e * eb) & 63),
                                 cols, n);
                }
            }
            free(z);
            free(y);
            free(one);
            free(big);
            free(buf);
            free_case(&c);
        }
}

/*
 * Batch invariance (issue 13, acceptance 4: batched = alone): a MoE expert sees however many
 * tokens the batch routes to it, so each token's row must not depend on n or on the other
 * tokens of the call. From a pool of 33 tokens, for n = 1..33 and a random subset (random
 * order) of n of them, kern_matmul, kern_matmul_act and each of this ISA's variants (gemv and
 * gemm alike, whatever n) give, for every token, the bits kern_matmul gives it alone (n = 1).
 * Shapes: gpt-oss's 2880 columns (90 blocks: 16-block groups and a tail), partial panels, and
 * more than one 4096-column window of the AVX gemvs.
 */
static void test_batch_invariance(void **state)
{
    g_case = isa_case_begin(state);
    enum { POOL = 33 };
    static const size_t shapes[][2] = {{37, 2880}, {21, 32 * 17}, {18, 32 * 131}, {5, 32}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        const size_t rows = shapes[sh][0], cols = shapes[sh][1];
        struct mcase c;
        make_case(&c, rows, cols, POOL, 0);
        float *alone = malloc(POOL * rows * sizeof(float)), *x = malloc(POOL * cols * sizeof(float));
        float *y = malloc(POOL * rows * sizeof(float));
        size_t act_bytes;
        assert_int_equal(kern_act_bytes(DT_MXFP4, cols, POOL, &act_bytes), 0);
        void *buf = aligned_alloc(64, round64(act_bytes));
        assert_non_null(alone);
        assert_non_null(x);
        assert_non_null(y);
        assert_non_null(buf);
        for (size_t t = 0; t < POOL; t++)
            kern_matmul(DT_MXFP4, c.w, cols, c.x + t * cols, 1, alone + t * rows, rows, 0, rows);
        uint8_t *wp = make_panels(&c);
        size_t pick[POOL];
        for (size_t n = 1; n <= POOL; n++) {
            /* a random n-subset in random order: a partial Fisher-Yates shuffle */
            for (size_t i = 0; i < POOL; i++)
                pick[i] = i;
            for (size_t i = 0; i < n; i++) {
                size_t k = rndz(i, POOL - 1), tmp = pick[i];
                pick[i] = pick[k];
                pick[k] = tmp;
            }
            for (size_t i = 0; i < n; i++)
                memcpy(x + i * cols, c.x + pick[i] * cols, cols * sizeof(float));
            struct kern_act a;
            kern_act_init(&a, DT_MXFP4, x, cols, n, buf);
            kern_act_prepare(&a, 0, n);
            /* 0: kern_matmul, 1: kern_matmul_act, 2: kern_matmul_act_panels, 3..: the
             * variants of this ISA */
            for (size_t e = 0; e < 3 + sizeof variants / sizeof variants[0]; e++) {
                const char *name = e == 0   ? "kern_matmul"
                                   : e == 1 ? "kern_matmul_act"
                                   : e == 2 ? "kern_matmul_act_panels"
                                            : variants[e - 3].name;
                if (e >= 3 && variants[e - 3].isa != g_case->isa)
                    continue;
                for (size_t i = 0; i < n * rows; i++)
                    y[i] = SENTINEL;
                if (e == 0)
                    kern_matmul(DT_MXFP4, c.w, cols, x, n, y, rows, 0, rows);
                else if (e == 1)
                    kern_matmul_act(c.w, &a, y, rows, 0, rows);
                else if (e == 2)
                    kern_matmul_act_panels(DT_MXFP4, wp, &a, y, rows, 0, rows);
                else
                    variants[e - 3].fn(c.w, &a, y, rows, 0, rows);
                for (size_t i = 0; i < n; i++)
                    for (size_t r = 0; r < rows; r++) {
                        float got = y[i * rows + r], want = alone[pick[i] * rows + r];
                        if (memcmp(&got, &want, sizeof got) != 0)
                            fail_msg("%s (%s): rows %zu cols %zu n %zu: token %zu (pool %zu) "
                                     "row %zu = %.9g, alone %.9g",
                                     name, g_case->name, rows, cols, n, i, pick[i], r, got, want);
                    }
            }
        }
        free(wp);
        free(buf);
        free(y);
        free(x);
        free(alone);
        free_case(&c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row_to_f32_spec),
        ISA_CASE_TESTS(test_matmul_mxfp4),
        ISA_CASE_TESTS(test_matmul_mxfp4_extreme_e),
        ISA_CASE_TESTS(test_expert_slices),
        ISA_CASE_TESTS(test_batch_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
