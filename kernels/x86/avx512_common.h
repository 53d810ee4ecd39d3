/*
 * avx512_common.h — helpers shared by the AVX-512 kernel files (included only by files
 * compiled with the AVX-512 flags).
 */
#ifndef CLOCHER_KERNELS_X86_AVX512_COMMON_H
#define CLOCHER_KERNELS_X86_AVX512_COMMON_H

#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))
/* register tiles are arrays indexed by compile-time loops: they must be fully unrolled, or
 * GCC -O2 keeps the arrays in memory */
#define UNROLL _Pragma("GCC unroll 16")

/* In-register transpose of a 16x16 matrix of dwords (r[i] = row i). */
INLINE void transpose16(__m512i r[16])
{
    __m512i t[16], u[16];
    UNROLL for (int i = 0; i < 8; i++)
    {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    UNROLL for (int i = 0; i < 4; i++)
    {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    /* u[4i + c], 128-bit lane L = rows 4i..4i+3 of column 4L + c: transpose the lanes */
    UNROLL for (int c = 0; c < 4; c++)
    {
        __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88);
        __m512i v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);
        __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
        __m512i v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
        r[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        r[8 + c] = _mm512_shuffle_i32x4(v0, v2, 0xdd);
        r[4 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xdd);
    }
}

#endif
