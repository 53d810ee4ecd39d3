/*
 * kv8.c — the 8-bit KV cache's row format (kern.h, "8-bit KV cache rows"; docs/KV.md): the
 * orthonormal randomized Walsh-Hadamard rotation of a head, quantization of a rotated head
 * row to int8 or FP8 E4M3 codes with one f32 scale, and the scalar decode (the scalar
 * attention tiles kern_attn_kvi8/kvf8_f32_ref in attn.c widen rows with it).
 *
 * Why a rotation: K (and V) rows of real models carry a few large channels; one scale per
 * head row then spends most of the 8-bit range on them. R = H D (D: fixed random signs, H:
 * the normalized Hadamard matrix) spreads every channel over all of them, so a row becomes
 * close to Gaussian, max|x| / rms about 3 (docs/PERFORMANCE.md "KV cache dtypes" measures
 * what that buys: int8's KLD 1.5-2x lower at head_dim 32, nothing for fp8).
 * R is orthonormal, so q.k = (Rq).(Rk), and sum_t w_t (R v_t) = R (sum_t w_t v_t): attention
 * over rotated rows with a rotated query gives R out, undone by R^T = D H.
 *
 * NOTES: stateless and reentrant; no allocation.
 */
#include "internal.h"

#include "check.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- rotation ---------------------------------------------------------------------------- */

/* D's signs: bit d of these 256 bits (hex digits of pi) set = element d is negated. */
static const uint64_t g_signs[4] = {UINT64_C(0x243f6a8885a308d3), UINT64_C(0x13198a2e03707344),
                                    UINT64_C(0xa4093822299f31d0), UINT64_C(0x082efa98ec4e6c89)};

static void flip_signs(float *x, size_t hd)
{
    for (size_t d = 0; d < hd; d++)
        if ((g_signs[d / 64] >> (d % 64)) & 1)
            x[d] = -x[d];
}

/* x [n] <- H x / sqrt(n), n a power of two: the fast Walsh-Hadamard transform (H symmetric,
 * so the normalized transform is its own inverse). */
static void fwht(float *x, size_t n)
{
    for (size_t h = 1; h < n; h *= 2)
        for (size_t i = 0; i < n; i += 2 * h)
            for (size_t j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    const float s = 1.0f / sqrtf((float)n);
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

/* A head dim that is not a power of two is rotated block-diagonally: largest power-of-two
 * chunks first (96 = 64 + 32); each block is orthonormal, so the whole is. */
static void fwht_chunks(float *x, size_t hd)
{
    for (size_t off = 0; off < hd;) {
        size_t len = 1;
        while (len * 2 <= hd - off)
            len *= 2;
        fwht(x + off, len);
        off += len;
    }
}

void kern_kv_rotate(float *x, size_t hd)
{
    CHECK(hd <= KERN_ATTN_HD_MAX);
    flip_signs(x, hd);
    fwht_chunks(x, hd);
}

void kern_kv_unrotate(float *x, size_t hd)
{
    CHECK(hd <= KERN_ATTN_HD_MAX);
    fwht_chunks(x, hd);
    flip_signs(x, hd);
}

/* ---- codes ------------------------------------------------------------------------------- */

/* E4M3 (e4m3fn): s eeee mmm, bias 7; e = 0 subnormal m 2^-9; 0x7f / 0xff NaN (never written). */
static float e4m3_decode(uint8_t c)
{
    const int e = (c >> 3) & 15, m = c & 7;
    const float a = e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : ldexpf((float)m, -9);
    return c & 0x80 ? -a : a;
}

/* Nearest E4M3 code to y (ties to even), |y| <= 448 after scaling (saturates above). */
static uint8_t e4m3_encode(float y)
{
    const uint8_t s = signbit(y) ? 0x80 : 0;
    const float a = fabsf(y);
    if (!(a > 0.0f))
        return s;
    if (a >= 448.0f)
        return s | 0x7e;
    int e;
    (void)frexpf(a, &e); /* a in [2^(e-1), 2^e) */
    int E = e - 1 < -6 ? -6 : e - 1;
    float m = rintf(ldexpf(a, 3 - E)); /* the quantum at exponent E is 2^(E-3) */
    if (m >= 16.0f) {                   /* rounded up into the next binade */
        E++;
        m = 8.0f;
    }
    if (m < 8.0f) /* subnormal: only at E = -6 */
        return s | (uint8_t)m;
    const unsigned code = ((unsigned)(E + 7) << 3) | ((unsigned)m - 8u);
    return s | (uint8_t)(code > 0x7e ? 0x7e : code);
}

static float code_value(enum dtype kvt, uint8_t c)
{
    return kvt == DT_KV_I8 ? (float)(int8_t)c : e4m3_decode(c);
}

void kern_kv8_quant(enum dtype kvt, const float *x, void *dst, size_t hd)
{
    CHECK(dtype_is_kv8(kvt));
    uint8_t *c = dst;
    float amax = 0.0f;
    for (size_t d = 0; d < hd; d++)
        amax = fabsf(x[d]) > amax ? fabsf(x[d]) : amax;
    const float top = kvt == DT_KV_I8 ? 127.0f : 448.0f;
    float scale = amax / top;
    if (!isfinite(amax)) { /* a non-finite row stays non-finite when read, as in f32 */
        scale = NAN;
        memset(c, 0, hd);
    } else if (amax == 0.0f) {
        memset(c, 0, hd);
    } else {
        const float inv = top / amax;
        for (size_t d = 0; d < hd; d++) {
            const float y = x[d] * inv;
            if (kvt == DT_KV_I8) {
                float r = rintf(y);
                r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
                c[d] = (uint8_t)(int8_t)r;
            } else {
                c[d] = e4m3_encode(y);
            }
        }
    }
    memcpy(c + hd, &scale, sizeof scale);
}

void kern_kv8_dequant(enum dtype kvt, const void *src, float *out, size_t hd)
{
    CHECK(dtype_is_kv8(kvt));
    const uint8_t *c = src;
    float scale;
    memcpy(&scale, c + hd, sizeof scale);
    for (size_t d = 0; d < hd; d++)
        out[d] = scale * code_value(kvt, c[d]);
}
