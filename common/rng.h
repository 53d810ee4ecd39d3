/*
 * rng.h — the project's small deterministic pseudo-random generators, and the draws built on
 * them, each in one place.
 *
 * None is for secrets. Their exact sequences are observable and must never change: the
 * sampler draws the same tokens for the same seed, `clocher synth` writes byte-identical
 * models for the same seed, and tests and benchmarks keep their inputs (tolerances were set on
 * them). So a caller picks the generator its output was defined with:
 *   rng_splitmix64  64-bit state, good statistics (Steele et al., SplitMix); any seed works.
 *   rng_xorshift64  Marsaglia's xorshift64 (13, 7, 17); the state must not be 0.
 *   rng_xorshift32  Marsaglia's xorshift32 (13, 17, 5); the state must not be 0.
 * The draws map one 64-bit output to a number; they take the output, not the state, so they
 * serve every generator.
 */
#ifndef CLOCHER_COMMON_RNG_H
#define CLOCHER_COMMON_RNG_H

#include <stdint.h>

/* Advances *state by the golden-ratio step and returns the mixed output. */
static inline uint64_t rng_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Advances *state (never 0) and returns it. */
static inline uint64_t rng_xorshift64(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

/* Advances *state (never 0) and returns it. */
static inline uint32_t rng_xorshift32(uint32_t *state)
{
    uint32_t x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *state = x;
}

/* Uniform in [0, 1) on the 2^-53 grid, from the top 53 bits of a 64-bit output. */
static inline double rng_unit_f64(uint64_t r) { return (double)(r >> 11) * 0x1p-53; }

/* Uniform in [-1, 1) on the 2^-23 grid, from the top 24 bits of a 64-bit output. */
static inline float rng_signed_f32(uint64_t r)
{
    return (float)(r >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

#endif
