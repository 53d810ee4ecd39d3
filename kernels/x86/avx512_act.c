/*
 * avx512_act.c — kern_act_prepare with AVX-512: the same bits as kern__act_prepare_ref
 * (act.c, the specification), 32 activations per block in two zmm.
 *
 * Bit-identity notes: |x| maxima are taken with max_ps(|x|, acc), which returns acc when |x|
 * is NaN, like fmaxf; scale and inverse are the same scalar IEEE divisions; x * id is clamped
 * with max_ps/min_ps in the operand order that maps NaN to -127 like fmaxf/fminf; and
 * cvtps2dq rounds half to even like the scalar 1.5 * 2^23 trick.
 */
#include "internal.h"
#include "quant.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline __m512i bf16_round(__m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                     _mm512_and_si512(_mm512_srli_epi32(u, 16),
                                                                      _mm512_set1_epi32(1))));
    r = _mm512_srli_epi32(r, 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}

/*
 * ns32[b] = the sum of ns4[b * 8 .. b * 8 + 8) for the nb <= 16 blocks from b0: the 16 rows of
 * 8 lanes summed together by a tree of lane permutes (8 -> 4 -> 2 -> 1 partials a block), where
 * a horizontal sum per block was a chain of 6 shuffles and adds (perf, session 27: most of this
 * function's samples at 8 tokens). Integer sums: any order gives the same bits.
 */
static inline void ns32_of_ns4(const int32_t *ns4, int32_t *ns32, size_t b0, size_t nb)
{
    static const int32_t ia[16] = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27},
                         ib[16] = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31},
                         ic[16] = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29},
                         id[16] = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31},
                         ie[16] = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30},
                         if_[16] = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    const int32_t *lo[3] = {ia, ic, ie}, *hi[3] = {ib, id, if_};
    __m512i v[8]; /* v[k]: blocks 2k, 2k + 1 (lanes 0-7, 8-15); zero past nb */
    for (size_t k = 0; k < 8; k++) {
        const size_t lanes = nb * 8 > k * 16 ? nb * 8 - k * 16 : 0;
        const __mmask16 m = (__mmask16)(lanes >= 16 ? 0xffffu : (1u << lanes) - 1u);
        v[k] = _mm512_maskz_loadu_epi32(m, ns4 + (b0 + 2 * k) * 8);
    }
    for (int lv = 0, cnt = 8; lv < 3; lv++, cnt /= 2) {
        const __m512i l = _mm512_loadu_si512(lo[lv]), h = _mm512_loadu_si512(hi[lv]);
        for (int i = 0; i < cnt / 2; i++)
            v[i] = _mm512_add_epi32(_mm512_permutex2var_epi32(v[2 * i], l, v[2 * i + 1]),
                                    _mm512_permutex2var_epi32(v[2 * i], h, v[2 * i + 1]));
    }
    _mm512_mask_storeu_epi32(ns32 + b0, (__mmask16)((1u << nb) - 1u), v[0]);
}

void kern__act_prepare_avx512(const struct kern_act *a, size_t t0, size_t t1)
{
    const size_t cols = a->cols, cp = a->cp;
    const int sh = kern__traits[a->wt].act_offset == 8 ? 3 : 7;
    const __m512 qmax = _mm512_set1_ps((float)QUANT_ACT_QMAX),
                 qmin = _mm512_set1_ps(-(float)QUANT_ACT_QMAX), zero = _mm512_setzero_ps();
    const __m256i ones = _mm256_set1_epi8(1);
    for (size_t t = t0; t < t1; t++) {
        const float *x = a->x + t * cols; /* [cols] */
        if (a->q) {
            int8_t *q = a->q + t * a->ld;
            float *d = a->d + t * cp / 32, *d4 = a->d4 + t * cp / 4;
            int32_t *ns4 = a->ns4 + t * cp / 4, *ns32 = a->ns32 + t * cp / 32;
            for (size_t b = 0; b < cp / 32; b++) {
                __m256i qb = _mm256_setzero_si256();
                float dd = 0.0f;
                if (b * 32 < cols) {
                    __m512 v0 = _mm512_loadu_ps(x + b * 32), v1 = _mm512_loadu_ps(x + b * 32 + 16);
                    __m512 m = _mm512_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), zero),
                                             _mm512_max_ps(_mm512_abs_ps(v1), zero));
                    float amax = _mm512_reduce_max_ps(m);
                    dd = amax / (float)QUANT_ACT_QMAX;
                    __m512 id = _mm512_set1_ps(dd > 0.0f ? (float)QUANT_ACT_QMAX / amax : 0.0f);
                    __m512i i0 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v0, id), qmin), qmax));
                    __m512i i1 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v1, id), qmin), qmax));
                    qb = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtsepi32_epi8(i0)),
                                                 _mm512_cvtsepi32_epi8(i1), 1);
                }
                _mm256_storeu_si256((__m256i *)(q + b * 32), qb);
                d[b] = dd;
                /* sums of 4 quants, times -offset */
                __m256i s4 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, qb);
                __m256i n4 = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s4, sh));
                _mm256_storeu_si256((__m256i *)(ns4 + b * 8), n4);
                _mm256_storeu_ps(d4 + b * 8, _mm256_set1_ps(dd));
                if (b % 16 == 15 || b + 1 == cp / 32) /* the last block of a group of 16 */
                    ns32_of_ns4(ns4, ns32, b / 16 * 16, b % 16 + 1);
            }
        }
        if (a->xb) {
            uint16_t *xb = a->xb + t * a->ld;
            for (size_t c = 0; c < cp; c += 16) {
                __mmask16 m = c + 16 <= cols ? 0xffff
                              : c < cols     ? (__mmask16)((1u << (cols - c)) - 1u)
                                             : 0;
                __m512i r = bf16_round(_mm512_maskz_loadu_ps(m, x + c));
                _mm256_storeu_si256((__m256i *)(xb + c), _mm512_cvtepi32_epi16(r));
            }
        }
    }
}
