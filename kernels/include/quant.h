/*
 * quant.h — byte layouts of the quantized weight blocks (common/dtype.h names the types) and
 * the scalar quantize/dequantize rules every kernel path shares.
 *
 * The structs document the layout and let code index blocks; rows are arrays of them with no
 * padding, which the static_asserts guarantee. Stored blocks are only 2-byte aligned (an f16
 * scale then bytes), so SIMD code loads them unaligned.
 */
#ifndef CLOCHER_KERNELS_QUANT_H
#define CLOCHER_KERNELS_QUANT_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define QUANT_BLOCK 32 /* elements per block of q8_0/q4_0 and per nibble array of the q4 groups */

/* GGUF Q8_0: x[i] = d * qs[i]. */
struct quant_q8_0 {
    uint16_t d;     /* f16 scale */
    int8_t qs[32];
};

/* GGUF Q4_0: x[i] = d * ((qs[i] & 15) - 8), x[i + 16] = d * ((qs[i] >> 4) - 8), i < 16. */
struct quant_q4_0 {
    uint16_t d;     /* f16 scale */
    uint8_t qs[16]; /* low nibbles: elements 0..15, high nibbles: elements 16..31 */
};

/*
 * int4 groups (common/dtype.h DT_Q4_G64 .. DT_Q4Z_G128): a header, then one Q4_0-style nibble
 * array of 16 bytes per 32 elements (byte j of sub-block s: low nibble = element 32s + j, high
 * nibble = element 32s + j + 16), so every kernel unpacks 32 elements exactly as for q4_0.
 *   q4_gN:  x = d * (q - 8)           (scale only, like q4_0 with a larger group)
 *   q4z_gN: x = d * q + m, q in 0..15 (m: f16 offset = group minimum, GGUF Q4_1 for N = 32)
 */
struct quant_q4_g64 {
    uint16_t d;
    uint8_t qs[2][16];
};
struct quant_q4_g128 {
    uint16_t d;
    uint8_t qs[4][16];
};
struct quant_q4z_g32 {
    uint16_t d, m; /* f16 scale, f16 offset */
    uint8_t qs[1][16];
};
struct quant_q4z_g64 {
    uint16_t d, m;
    uint8_t qs[2][16];
};
struct quant_q4z_g128 {
    uint16_t d, m;
    uint8_t qs[4][16];
};
static_assert(sizeof(struct quant_q4_g64) == 34, "q4_g64 block must be 34 bytes");
static_assert(sizeof(struct quant_q4_g128) == 66, "q4_g128 block must be 66 bytes");
static_assert(sizeof(struct quant_q4z_g32) == 20, "q4z_g32 block must be 20 bytes (GGUF Q4_1)");
static_assert(sizeof(struct quant_q4z_g64) == 36, "q4z_g64 block must be 36 bytes");
static_assert(sizeof(struct quant_q4z_g128) == 68, "q4z_g128 block must be 68 bytes");
static_assert(offsetof(struct quant_q4_g128, qs) == 2 && offsetof(struct quant_q4z_g128, qs) == 4,
              "nibbles follow the header");
static_assert(_Alignof(struct quant_q4_g128) == 2 && _Alignof(struct quant_q4z_g128) == 2,
              "block arrays are packed back to back");

/*
 * GGUF MXFP4 (common/dtype.h DT_MXFP4): x[i] = FP4[qs[i] & 15] * 2^(e-127),
 * x[i + 16] = FP4[qs[i] >> 4] * 2^(e-127), i < 16. The E2M1 values doubled are small integers
 * (quant_mxfp4_kvalues: {0,1,2,3,4,6,8,12} and their negatives), so integer kernels multiply
 * them by int8 activations exactly and scale by 2^(e-128).
 */
struct quant_mxfp4 {
    uint8_t e;      /* E8M0 exponent: scale 2^(e-127); 255 is refused by the converters */
    uint8_t qs[16]; /* low nibbles: elements 0..15, high nibbles: elements 16..31 */
};
static const int8_t quant_mxfp4_kvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12,
                                               0, -1, -2, -3, -4, -6, -8, -12};

/*
 * 2^(e-128), the scale of quant_mxfp4_kvalues, as an f32, exactly, for every E8M0 byte: the
 * biased f32 exponent is e - 1 for e >= 2; e = 1 and e = 0 give the subnormals 2^-127 and
 * 2^-128 (llama.cpp's ggml_e8m0_to_fp32_half). e = 255 (NaN in E8M0, refused by the
 * converters) gives 2^127 here, in every kernel alike. Weights of magnitude 2^128 and more
 * (e = 254 with |E2M1| >= 2, e = 253 with |E2M1| >= 4) exceed FLT_MAX: kern_row_to_f32 and
 * hence the f32 specification give them as infinities, while the integer kernels, which
 * multiply the codes and apply the scale to the block's sum, stay finite when that sum is.
 */
static inline float quant_e8m0_half(uint8_t e)
{
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static_assert(sizeof(struct quant_mxfp4) == 17, "mxfp4 block must be 17 bytes (GGUF)");
static_assert(sizeof(struct quant_q8_0) == 34, "q8_0 block must be 34 bytes (GGUF)");
static_assert(sizeof(struct quant_q4_0) == 18, "q4_0 block must be 18 bytes (GGUF)");
static_assert(offsetof(struct quant_q8_0, qs) == 2, "q8_0 quants follow the scale");
static_assert(offsetof(struct quant_q4_0, qs) == 2, "q4_0 quants follow the scale");
static_assert(_Alignof(struct quant_q8_0) == 2 && _Alignof(struct quant_q4_0) == 2,
              "block arrays are packed back to back");

/*
 * q4_0 panels (kern_panels_*, ADR 0004 "load-time q4_0 panels"): a q4_0 matrix [rows][cols]
 * repacked once at load so that the AVX-512 GEMM reads what it used to pack every step. With
 * nb = cols / 32 and rb = nb * 18 (a stored row), panel p holds rows 16p..16p+15 (rows past the
 * matrix are zero) in the bytes [p * 16 * rb, (p + 1) * 16 * rb) — as many as its 16 stored
 * rows, so the whole matrix is ceil(rows / 16) * 16 * rb bytes. Blocks go in pairs of 576
 * bytes (9 cache lines; an odd last block alone, 288), so a panel is one sequential stream:
 *   quants of block 2j, then of 2j+1: [4][16][4] bytes each: [g][i][j] = qs[4g + j] of row i
 *          (still two nibbles per byte: low = element 4g + j, high = 16 + 4g + j), so one
 *          64-byte vector is 4 bytes of all 16 rows (lane = row);
 *   then the scales of 2j, then of 2j+1: [16] f16 each: [i] = d of row i.
 * quant_q4p_qoff / quant_q4p_soff give block b's offsets inside its panel.
 */
#define QUANT_Q4P_ROWS 16
#define QUANT_Q4P_BLOCK_QBYTES 256 /* quant bytes of one block of a panel (16 rows x 16) */
#define QUANT_Q4P_BLOCK_SBYTES 32  /* scale bytes of one block of a panel (16 rows x f16) */

static inline size_t quant_q4p_qoff(size_t b, size_t nb)
{
    (void)nb;
    return b / 2 * 2 * (QUANT_Q4P_BLOCK_QBYTES + QUANT_Q4P_BLOCK_SBYTES) +
           b % 2 * QUANT_Q4P_BLOCK_QBYTES;
}

static inline size_t quant_q4p_soff(size_t b, size_t nb)
{
    size_t pair = b / 2 * 2, in_pair = pair + 1 < nb ? 2 : 1;
    return pair * (QUANT_Q4P_BLOCK_QBYTES + QUANT_Q4P_BLOCK_SBYTES) +
           in_pair * QUANT_Q4P_BLOCK_QBYTES + b % 2 * QUANT_Q4P_BLOCK_SBYTES;
}

/*
 * q8_0 panels (kern_panels_*, ADR 0004 addendum "q8_0 panels"): the same idea for a q8_0 matrix
 * [rows][cols]. With nb = cols / 32 and rb = nb * 34, panel p holds rows 16p..16p+15 (rows past
 * the matrix are zero bytes, quants and scales) in [p * 16 * rb, (p + 1) * 16 * rb): again as
 * many bytes as its 16 stored rows. Blocks go in pairs of 1088 bytes (17 cache lines; an odd
 * last block alone, 544):
 *   quants of block 2j, then of 2j+1: [8][16][4] bytes each: [g][i][j] = qs[4g + j] of row i
 *          stored as the unsigned byte qs ^ 0x80 = qs + 128 (the operand vpdpbusd multiplies,
 *          ADR 0004 decision 2), so one 64-byte vector is 4 columns of all 16 rows (lane = row)
 *          exactly as the stored-row GEMM packs it every step;
 *   then the scales of 2j, then of 2j+1: [16] f16 each: [i] = d of row i.
 * quant_q8p_qoff / quant_q8p_soff give block b's offsets inside its panel.
 */
#define QUANT_Q8P_ROWS 16
#define QUANT_Q8P_BLOCK_QBYTES 512 /* quant bytes of one block of a panel (16 rows x 32) */
#define QUANT_Q8P_BLOCK_SBYTES 32  /* scale bytes of one block of a panel (16 rows x f16) */

static inline size_t quant_q8p_qoff(size_t b, size_t nb)
{
    (void)nb;
    return b / 2 * 2 * (QUANT_Q8P_BLOCK_QBYTES + QUANT_Q8P_BLOCK_SBYTES) +
           b % 2 * QUANT_Q8P_BLOCK_QBYTES;
}

static inline size_t quant_q8p_soff(size_t b, size_t nb)
{
    size_t pair = b / 2 * 2, in_pair = pair + 1 < nb ? 2 : 1;
    return pair * (QUANT_Q8P_BLOCK_QBYTES + QUANT_Q8P_BLOCK_SBYTES) +
           in_pair * QUANT_Q8P_BLOCK_QBYTES + b % 2 * QUANT_Q8P_BLOCK_SBYTES;
}
static_assert(QUANT_Q8P_ROWS * sizeof(struct quant_q8_0) ==
                  QUANT_Q8P_BLOCK_QBYTES + QUANT_Q8P_BLOCK_SBYTES,
              "a q8_0 panel block holds exactly its 16 stored blocks' bytes");

/*
 * mxfp4 panels (kern_panels_*, ADR 0004 addendum "mxfp4 panels"; gpt-oss's experts): an mxfp4
 * matrix [rows][cols] repacked at load so that a 64-byte vector of quants holds the same 4
 * bytes of 16 rows (lane = row), as q4_0's panels, and the rows' E8M0 bytes of a block lie
 * together: the stored-row gemv rearranged every 16-block group and transposed its sums back
 * to lane = row each step (x86/avx512_mxfp4.c; docs/PERFORMANCE.md "gpt-oss decode, session
 * 16"). With nb = cols / 32 and rb = nb * 17, panel p holds rows 16p..16p+15 (rows past the
 * matrix are zero bytes) in [p * 16 * rb, (p + 1) * 16 * rb), block b at b * 272:
 *   the E8M0 bytes: [16]: [i] = e of row i;
 *   the quants: [4][16][4]: [g][i][j] = qs[4g + j] of row i (unchanged: low nibble element
 *          4g + j, high nibble 16 + 4g + j).
 * quant_mxp_qoff / quant_mxp_soff give block b's offsets inside its panel.
 */
#define QUANT_MXP_ROWS 16
#define QUANT_MXP_BLOCK_BYTES 272 /* one block of a panel: 16 E8M0 bytes, 16 rows x 16 quants */

static inline size_t quant_mxp_qoff(size_t b, size_t nb)
{
    (void)nb;
    return b * QUANT_MXP_BLOCK_BYTES + QUANT_MXP_ROWS;
}

static inline size_t quant_mxp_soff(size_t b, size_t nb)
{
    (void)nb;
    return b * QUANT_MXP_BLOCK_BYTES;
}
static_assert(QUANT_MXP_ROWS * sizeof(struct quant_mxfp4) == QUANT_MXP_BLOCK_BYTES,
              "an mxfp4 panel block holds exactly its 16 stored blocks' bytes");

/*
 * GGUF k-quants (common/dtype.h DT_Q4_K, DT_Q5_K, DT_Q6_K): super-blocks of 256 elements
 * (QUANT_K), byte for byte ggml's block_q4_K / block_q5_K / block_q6_K.
 *  q4_K: 8 sub-blocks of 32, each with a 6-bit scale sc_j and a 6-bit min m_j packed in
 *        scales[12] (quant_kq_scale_min); x = d * sc_j * q - dmin * m_j, q in 0..15. qs holds
 *        4 chunks of 64 elements: byte l of chunk c (qs[32c + l]) has element 64c + l in its
 *        low nibble and 64c + 32 + l in its high nibble.
 *  q5_K: q4_K plus a fifth bit: element 64c + l has bit 2c of qh[l], 64c + 32 + l bit 2c + 1;
 *        q in 0..31.
 *  q6_K: 16 sub-blocks of 16 with int8 scales: x = d * scales[e / 16] * (q - 32), q in 0..63.
 *        Half h (elements 128h..128h+127) uses ql[64h..64h+63] and qh[32h..32h+31]: for
 *        l < 32, element 128h + l is ql[64h + l] low nibble | (qh[32h + l] bits 0-1) << 4,
 *        + 32 + l: ql[64h + 32 + l] low | bits 2-3, + 64 + l: ql[64h + l] high | bits 4-5,
 *        + 96 + l: ql[64h + 32 + l] high | bits 6-7.
 * The reference dequantization (kernels/ref_kq.c) computes in f32 as ggml does:
 * q4_K/q5_K (d * sc) * q - (dmin * m), q6_K (d * sc) * (q - 32).
 */
#define QUANT_K 256

struct quant_q4_k {
    uint16_t d, dmin;   /* f16 super-block scales of the sub-block scales and mins */
    uint8_t scales[12]; /* 6-bit sc_j, m_j, j < 8 (quant_kq_scale_min) */
    uint8_t qs[128];
};
struct quant_q5_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[32];     /* the fifth bits */
    uint8_t qs[128];
};
struct quant_q6_k {
    uint8_t ql[128];    /* low 4 bits */
    uint8_t qh[64];     /* high 2 bits */
    int8_t scales[16];  /* one per 16 elements */
    uint16_t d;         /* f16 */
};
static_assert(sizeof(struct quant_q4_k) == 144, "q4_K block must be 144 bytes (GGUF)");
static_assert(sizeof(struct quant_q5_k) == 176, "q5_K block must be 176 bytes (GGUF)");
static_assert(sizeof(struct quant_q6_k) == 210, "q6_K block must be 210 bytes (GGUF)");
static_assert(_Alignof(struct quant_q4_k) == 2 && _Alignof(struct quant_q6_k) == 2,
              "block arrays are packed back to back");

/* Sub-block j's (j < 8) 6-bit scale and min out of a q4_K/q5_K scales[12]: j < 4 in the low 6
 * bits of bytes j and j + 4; j >= 4 in byte j + 4's nibbles with their top 2 bits in the top
 * bits of bytes j - 4 (scale) and j (min). ggml's get_scale_min_k4. */
static inline void quant_kq_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* All 8 scales and mins at once, as two little-endian words (byte j of *sc is sc_j, of *m
 * m_j): the packed form's 12 bytes rearranged with ggml's kmask trick, in registers (a SIMD
 * kernel loads them with one movq; going through 4-byte stores would stall the load). */
static inline void quant_kq_scales_mins64(const uint8_t *s, uint64_t *sc, uint64_t *m)
{
    uint32_t u0, u1, u2;
    memcpy(&u0, s, 4);
    memcpy(&u1, s + 4, 4);
    memcpy(&u2, s + 8, 4);
    const uint32_t k1 = 0x3f3f3f3fu, k2 = 0x0f0f0f0fu, k3 = 0x03030303u;
    const uint32_t sc_hi = (u2 & k2) | (((u0 >> 6) & k3) << 4);
    const uint32_t m_hi = ((u2 >> 4) & k2) | (((u1 >> 6) & k3) << 4);
    *sc = (uint64_t)(u0 & k1) | (uint64_t)sc_hi << 32;
    *m = (uint64_t)(u1 & k1) | (uint64_t)m_hi << 32;
}

/* The same as bytes: sc[0..7], m[0..7]. */
static inline void quant_kq_scales_mins(const uint8_t *s, uint8_t sc[8], uint8_t m[8])
{
    uint64_t a, b;
    quant_kq_scales_mins64(s, &a, &b);
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(a >> (8 * j));
        m[j] = (uint8_t)(b >> (8 * j));
    }
}

/*
 * q4_K panels (kern_panels_*, ADR 0004 addendum "k-quant panels"): a q4_K matrix [rows][cols]
 * repacked once at load so that one 64-byte vector holds 4 bytes (8 codes, nibble-packed) of
 * each of 16 rows, as the q4_0 panels do, and the 6-bit scales and mins are bytes. With
 * nsb = cols / 256, panel p holds rows 16p..16p+15 (rows past the matrix are zero bytes) in
 * [p * 16 * nsb * 148, (p + 1) * 16 * nsb * 148): 148 bytes per row and super-block against the
 * stored 144 (+2.8%: the 12 packed scale bytes become 16). Super-block s of a panel is one
 * 2368-byte piece (37 cache lines) at s * 2368:
 *   [0, 32)      d of the 16 rows (f16, [i] = row i's d);
 *   [32, 64)     dmin of the 16 rows (f16);
 *   [64, 192)    sc [8][16]: [j][i] = row i's 6-bit scale of sub-block j, one byte;
 *   [192, 320)   m [8][16]: the mins the same way;
 *   [320, 2368)  quants [4][8][16][4]: [c][g][i][k] = qs[32c + 4g + k] of row i, the stored byte
 *                unchanged (low nibble: element 64c + 4g + k, sub-block 2c; high nibble:
 *                element 64c + 32 + 4g + k, sub-block 2c + 1).
 * quant_q4kp_off gives super-block s's offset inside its panel.
 */
#define QUANT_Q4KP_ROWS 16
#define QUANT_Q4KP_ROW_BYTES 148 /* bytes of one row's super-block in a panel */
#define QUANT_Q4KP_D 0
#define QUANT_Q4KP_DMIN 32
#define QUANT_Q4KP_SC 64
#define QUANT_Q4KP_M 192
#define QUANT_Q4KP_QS 320
#define QUANT_Q4KP_SB_BYTES (QUANT_Q4KP_ROWS * QUANT_Q4KP_ROW_BYTES) /* 2368 */

static inline size_t quant_q4kp_off(size_t s) { return s * QUANT_Q4KP_SB_BYTES; }
static_assert(QUANT_Q4KP_QS + 4 * 8 * 64 == QUANT_Q4KP_SB_BYTES,
              "a q4_K panel super-block is its header then 16 rows x 128 quant bytes");

/*
 * q6_K panels (the same addendum): a q6_K matrix [rows][cols] repacked so that one 64-byte
 * vector holds 4 bytes of each of 16 rows. With nsb = cols / 256, panel p holds rows
 * 16p..16p+15 (rows past the matrix are zero bytes) in [p * 16 * nsb * 210, (p + 1) * 16 * nsb
 * * 210): exactly the stored bytes (the scales are bytes already). Super-block s of a panel is
 * one 3360-byte piece at s * 3360:
 *   [0, 32)      d of the 16 rows (f16);
 *   [32, 288)    scales [16][16]: [k][i] = row i's int8 scale of sub-block k (16 elements);
 *   [288, 3360)  quants [2][8][3][16][4]: half h, group g, then three vectors of [i][k]:
 *                ql[64h + 4g + k], ql[64h + 32 + 4g + k], qh[32h + 4g + k] of row i, the
 *                stored bytes unchanged (quant.h's q6_K element rule: the first vector's low
 *                nibbles are elements 128h + 4g + k, its high ones 128h + 64 + 4g + k; the
 *                second's 128h + 32 + 4g + k and 128h + 96 + 4g + k; the third holds their
 *                top two bits in bits 0-1, 2-3, 4-5, 6-7 in that order).
 * quant_q6kp_off gives super-block s's offset inside its panel.
 */
#define QUANT_Q6KP_ROWS 16
#define QUANT_Q6KP_ROW_BYTES 210
#define QUANT_Q6KP_D 0
#define QUANT_Q6KP_SC 32
#define QUANT_Q6KP_QS 288
#define QUANT_Q6KP_SB_BYTES (QUANT_Q6KP_ROWS * QUANT_Q6KP_ROW_BYTES) /* 3360 */

static inline size_t quant_q6kp_off(size_t s) { return s * QUANT_Q6KP_SB_BYTES; }
static_assert(QUANT_Q6KP_QS + 2 * 8 * 3 * 64 == QUANT_Q6KP_SB_BYTES,
              "a q6_K panel super-block holds exactly its 16 stored super-blocks' bytes");

/*
 * Activations are quantized per block of 32 to int8 with an f32 scale (q8_0 style but f32, so
 * the scale itself adds no error): d = max|x| / 127, q = round-half-even(x / d) in [-127, 127].
 * Per element |x - d*q| <= d/2, hence for a dot product with weights w:
 *     |sum w*x - sum w*d*q| <= sum_blocks (d_b / 2) * sum_{i in b} |w_i|
 *                           <= (1/254) * sum_blocks max|x_b| * sum_{i in b} |w_i|.
 * Tests assert that bound (plus float rounding) against the f32 reference.
 */
#define QUANT_ACT_QMAX 127

#endif
