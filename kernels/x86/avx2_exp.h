/*
 * avx2_exp.h — fm_expf (kernels/fastmath.h) on 8 lanes, two exponent factors: shared by
 * avx2_elt.c and avx2_attn.c so softmax and attention use one exp, bit-identical to the scalar
 * one (the argument is in avx2_elt.c's header comment). Include only from files compiled with
 * -mavx2 -mfma.
 */
#ifndef CLOCHER_KERNELS_X86_AVX2_EXP_H
#define CLOCHER_KERNELS_X86_AVX2_EXP_H

#include "fastmath.h"

#include <immintrin.h>

static inline __m256 exp8(__m256 x)
{
    x = _mm256_min_ps(_mm256_set1_ps(FM_EXP_HI), x);
    x = _mm256_max_ps(_mm256_set1_ps(FM_EXP_LO), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(FM_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(FM_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(FM_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(FM_EXP_P5), r, _mm256_set1_ps(FM_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FM_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FM_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FM_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FM_EXP_P0));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    /* NaN x: n converts to INT_MIN and the factors are garbage, but p is NaN already */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    __m256 f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
}

#endif
