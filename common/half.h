/*
 * half.h — IEEE binary16 and bfloat16 conversions.
 *
 * Scalar, exact and branch-light: these are the reference conversions every converter, the
 * scalar kernels and the tests use. f32→f16/bf16 rounds to nearest even; NaN stays NaN (quiet),
 * infinities and signed zeros are preserved; f16 subnormals are produced and read exactly.
 */
#ifndef CLOCHER_COMMON_HALF_H
#define CLOCHER_COMMON_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t half_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float half_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float half_bf16_to_f32(uint16_t h) { return half_bits_f32((uint32_t)h << 16); }

static inline uint16_t half_f32_to_bf16(float f)
{
    uint32_t u = half_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign, force quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static inline float half_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) /* inf / NaN */
        return half_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0)
            return half_bits_f32(sign);
        /* subnormal: value = man * 2^-24, exact in f32 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return half_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t half_f32_to_f16(float f)
{
    uint32_t u = half_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below the smallest normal 2^-14: subnormal or zero */
        if (a < 0x33000000u) /* below half the smallest subnormal 2^-25: zero */
            return sign;
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = a + 0x0fffu + ((a >> 13) & 1u) - 0x38000000u; /* rebias 127→15 and round */
    return (uint16_t)(sign | (r >> 13));
}

#endif
