/*
 * fastmath.h — the scalar specification of Clocher's exp and tanh (kernels/elt.c), whose
 * AVX2/AVX-512 twins (kernels/x86/avx*_elt.c) run the same algorithm lane-wise.
 *
 * exp: Cody-Waite reduction x = n ln2 + r with ln2 split into a 9-bit head (n * head is exact:
 * the clamp below keeps |n| <= 150, 8 bits) and a tail, |r| <= ~ln2/2; Cephes' degree-7
 * minimax polynomial for e^r; 2^n applied with one rounding (ldexpf here, vscalefps on
 * AVX-512, two normal-range factors on AVX2) so subnormal results are correctly rounded from
 * p. Inputs are clamped to [-104, 88.75] first (e^-104 rounds to 0, e^88.75 overflows to
 * +inf), in comparisons that let NaN through.
 * Error: rel <= KERN_EXP_MAX_REL_ERR (kern.h) for normal results, +2^-149 absolute for
 * subnormals (tests/kern/test_kern_elt.c sweeps every 127th float bit pattern against libm in
 * double).
 *
 * tanh, on |x| with the sign restored last (tanh(-0) = -0): |x| < 0.625: Cephes' odd polynomial
 * (no cancellation near 0); otherwise 1 - 2/(e^{2|x|} + 1) (±1 from |x| ~ 9 on, ±inf -> ±1).
 * Error: rel <= KERN_TANH_MAX_REL_ERR, same sweep.
 *
 * SiLU v / (1 + e^-v) and GELU-tanh v / (1 + e^{-2u}) (the same function as
 * 0.5 v (1 + tanh u), without its cancellation for negative v) return -0 where the exponential
 * overflows, so that -inf maps to the limit -0 rather than -inf/inf = NaN.
 *
 * Every operation is written out (fmaf where a fused multiply-add is meant, separate * and +
 * elsewhere) so that the SIMD twins, which use the same instructions, produce the same bits.
 */
#ifndef CLOCHER_KERNELS_FASTMATH_H
#define CLOCHER_KERNELS_FASTMATH_H

#include <math.h>

#define FM_EXP_HI 88.75f
#define FM_EXP_LO -104.0f
#define FM_LOG2E 1.44269504088896341f
#define FM_LN2_HI 0.693359375f      /* 355/512, 9 significant bits: n * FM_LN2_HI is exact */
#define FM_LN2_LO -2.12194440e-4f   /* ln2 - FM_LN2_HI */
/* Cephes expf: e^r ~ 1 + r + r^2 (P0 + P1 r + ... + P5 r^5) on |r| <= ln2/2 */
#define FM_EXP_P0 5.0000001201e-1f
#define FM_EXP_P1 1.6666665459e-1f
#define FM_EXP_P2 4.1665795894e-2f
#define FM_EXP_P3 8.3334519073e-3f
#define FM_EXP_P4 1.3981999507e-3f
#define FM_EXP_P5 1.9875691500e-4f
/* Cephes tanhf, |x| < 0.625: x + x^3 (T0 + T1 z + ... + T4 z^4), z = x^2 */
#define FM_TANH_SMALL 0.625f
#define FM_TANH_T0 -3.33332819422e-1f
#define FM_TANH_T1 1.33314422036e-1f
#define FM_TANH_T2 -5.37397155531e-2f
#define FM_TANH_T3 2.06390887954e-2f
#define FM_TANH_T4 -5.70498872745e-3f
/* GELU-tanh: u = v (C + CK v^2), C = sqrt(2/pi), CK = C * 0.044715 */
#define FM_GELU_C 0.797884560802865355f
#define FM_GELU_CK 0.0356774081363001403f

static inline float fm_expf(float x)
{
    if (isnan(x))
        return x;
    if (x > FM_EXP_HI)
        x = FM_EXP_HI;
    if (x < FM_EXP_LO)
        x = FM_EXP_LO;
    float n = rintf(x * FM_LOG2E);
    float r = fmaf(-n, FM_LN2_HI, x);
    r = fmaf(-n, FM_LN2_LO, r);
    float p = fmaf(FM_EXP_P5, r, FM_EXP_P4);
    p = fmaf(p, r, FM_EXP_P3);
    p = fmaf(p, r, FM_EXP_P2);
    p = fmaf(p, r, FM_EXP_P1);
    p = fmaf(p, r, FM_EXP_P0);
    p = fmaf(p, r * r, r) + 1.0f;
    return ldexpf(p, (int)n);
}

static inline float fm_tanhf(float x)
{
    /* on |x|, sign restored at the end: x + x^3 p with x = -0 would round to +0 */
    float a = fabsf(x), t;
    if (a < FM_TANH_SMALL) {
        float z = a * a;
        float p = fmaf(FM_TANH_T4, z, FM_TANH_T3);
        p = fmaf(p, z, FM_TANH_T2);
        p = fmaf(p, z, FM_TANH_T1);
        p = fmaf(p, z, FM_TANH_T0);
        t = fmaf(p * z, a, a);
    } else {
        t = 1.0f - 2.0f / (fm_expf(2.0f * a) + 1.0f);
    }
    return copysignf(t, x); /* t >= 0, or NaN for NaN x */
}

static inline float fm_siluf(float v)
{
    float e = fm_expf(-v);
    return e == INFINITY ? -0.0f : v / (1.0f + e);
}

static inline float fm_geluf(float v)
{
    float u = v * fmaf(FM_GELU_CK, v * v, FM_GELU_C);
    float e = fm_expf(-2.0f * u);
    return e == INFINITY ? -0.0f : v / (1.0f + e);
}

#endif
