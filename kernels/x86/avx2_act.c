/*
 * avx2_act.c — kern_act_prepare with AVX2: the same bits as kern__act_prepare_ref (act.c, the
 * specification), 32 activations per block in four ymm. The bit-identity notes of
 * avx512_act.c apply unchanged (same operand orders, same scalar divisions, cvtps2dq rounds
 * half to even).
 */
#include "internal.h"
#include "quant.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline __m256i bf16_round(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                     _mm256_and_si256(_mm256_srli_epi32(u, 16),
                                                                      _mm256_set1_epi32(1))));
    r = _mm256_srli_epi32(r, 16);
    /* |u| > inf as signed compare is safe: both sides are below 2^31 */
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, qn, nan);
}

void kern__act_prepare_avx2(const struct kern_act *a, size_t t0, size_t t1)
{
    const size_t cols = a->cols, cp = a->cp;
    const int sh = kern__traits[a->wt].act_offset == 8 ? 3 : 7;
    const __m256 qmax = _mm256_set1_ps((float)QUANT_ACT_QMAX),
                 qmin = _mm256_set1_ps(-(float)QUANT_ACT_QMAX), zero = _mm256_setzero_ps(),
                 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
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
                    __m256 v[4], m = zero;
                    for (int i = 0; i < 4; i++) {
                        v[i] = _mm256_loadu_ps(x + b * 32 + (size_t)i * 8);
                        m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[i], absm), zero), m);
                    }
                    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
                    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
                    h = _mm_max_ss(h, _mm_movehdup_ps(h));
                    float amax = _mm_cvtss_f32(h);
                    dd = amax / (float)QUANT_ACT_QMAX;
                    __m256 id = _mm256_set1_ps(dd > 0.0f ? (float)QUANT_ACT_QMAX / amax : 0.0f);
                    __m256i iv[4];
                    for (int i = 0; i < 4; i++)
                        iv[i] = _mm256_cvtps_epi32(
                            _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[i], id), qmin), qmax));
                    /* packs interleave 128-bit lanes: restore element order with a dword permute */
                    __m256i p16a = _mm256_packs_epi32(iv[0], iv[1]), p16b = _mm256_packs_epi32(iv[2], iv[3]);
                    qb = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                }
                _mm256_storeu_si256((__m256i *)(q + b * 32), qb);
                d[b] = dd;
                __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, qb), ones16);
                __m256i n4 = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s4, sh));
                _mm256_storeu_si256((__m256i *)(ns4 + b * 8), n4);
                __m128i h = _mm_add_epi32(_mm256_castsi256_si128(n4), _mm256_extracti128_si256(n4, 1));
                h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
                h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
                ns32[b] = _mm_cvtsi128_si32(h);
                _mm256_storeu_ps(d4 + b * 8, _mm256_set1_ps(dd));
            }
        }
        if (a->xb) {
            uint16_t *xb = a->xb + t * a->ld;
            size_t c = 0;
            for (; c + 8 <= cols; c += 8) {
                __m256i r = bf16_round(_mm256_loadu_ps(x + c));
                __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
                _mm_storeu_si128((__m128i *)(xb + c), p);
            }
            for (; c < cp; c += 8) {
                float tmp[8] = {0};
                if (c < cols)
                    memcpy(tmp, x + c, (cols - c) * sizeof(float));
                __m256i r = bf16_round(_mm256_loadu_ps(tmp));
                __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
                _mm_storeu_si128((__m128i *)(xb + c), p);
            }
        }
    }
}
