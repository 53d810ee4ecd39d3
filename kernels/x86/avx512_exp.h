/*
 * avx512_exp.h — fm_expf (kernels/fastmath.h) on 16 lanes, vscalefps: shared by avx512_elt.c and
 * avx512_attn.c so softmax and attention use one exp, bit-identical to the scalar one (the
 * bit-identity argument is in the header comment of avx512_elt.c). Include only from files
 * compiled with -mavx512f.
 */
#ifndef CLOCHER_KERNELS_X86_AVX512_EXP_H
#define CLOCHER_KERNELS_X86_AVX512_EXP_H

#include "fastmath.h"

#include <immintrin.h>

static inline __m512 exp16(__m512 x)
{
    x = _mm512_min_ps(_mm512_set1_ps(FM_EXP_HI), x);
    x = _mm512_max_ps(_mm512_set1_ps(FM_EXP_LO), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(FM_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(FM_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(FM_LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(FM_EXP_P5), r, _mm512_set1_ps(FM_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FM_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FM_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FM_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FM_EXP_P0));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

#endif
