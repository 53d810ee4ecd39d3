/* kvtest.c — see kvtest.h. */
#include "kvtest.h"

#include "err.h"
#include "log.h"
#include "rng.h"

#include <math.h>
#include <stdlib.h>

#define KT_LAYERS 2u
#define KT_KV_HEADS 2u
#define KT_HEAD_DIM 8u
#define KT_DIM (KT_KV_HEADS * KT_HEAD_DIM)

struct kv_config kt_config(uint32_t block_tokens, enum dtype dt, uint32_t n_blocks,
                           bool prefix_cache)
{
    size_t row = dtype_is_kv8(dt) ? KT_KV_HEADS * (KT_HEAD_DIM + 4u) /* codes + f32 scale */
                                  : KT_DIM * (dt == DT_F32 ? 4u : 2u);
    size_t data = (size_t)KT_LAYERS * 2 * block_tokens * row;
    size_t stride = (data + 63) & ~(size_t)63;
    struct kv_config c = {
        .n_layers = KT_LAYERS,
        .n_kv_heads = KT_KV_HEADS,
        .head_dim = KT_HEAD_DIM,
        .block_tokens = block_tokens,
        .dtype = dt,
        .budget_bytes = stride * n_blocks + stride / 2, /* a part block is not a block */
        .prefix_cache = prefix_cache,
    };
    return c;
}

struct kv_pool *kt_pool(const struct kv_config *cfg)
{
    struct kv_pool *p = NULL;
    int rc = kv_pool_create(cfg, &p);
    if (rc)
        fail_msg("kv_pool_create: %s (%s)", err_name(rc), log_last_error());
    return p;
}

float kt_value(uint32_t layer, int kv, uint32_t pos, int32_t token, uint32_t i)
{
    uint32_t h = (uint32_t)token * 7u + pos * 13u + layer * 29u + (uint32_t)kv * 31u + i * 3u;
    return (float)((int)(h % 128u) - 64) / 4.0f;
}

int kt_append(struct kv_seq *s, const int32_t *tokens, uint32_t n)
{
    uint32_t len = kv_seq_len(s);
    int rc = kv_seq_reserve(s, n);
    if (rc)
        return rc;
    float *k = malloc((size_t)(n ? n : 1) * KT_DIM * sizeof *k);
    float *v = malloc((size_t)(n ? n : 1) * KT_DIM * sizeof *v);
    assert_non_null(k);
    assert_non_null(v);
    for (uint32_t l = 0; l < KT_LAYERS && rc == 0; l++) {
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t i = 0; i < KT_DIM; i++) {
                k[t * KT_DIM + i] = kt_value(l, 0, len + t, tokens[t], i);
                v[t * KT_DIM + i] = kt_value(l, 1, len + t, tokens[t], i);
            }
        rc = kv_seq_write(s, l, k, v, n);
    }
    free(k);
    free(v);
    return rc ? rc : kv_seq_commit(s, tokens, n);
}

/*
 * How far a read-back value may be from kt_value: 0 for f32/f16/bf16 (exact), and for the
 * 8-bit types the bound kern.h states per rotated value carried through the rotation: an
 * error vector e with |e_d| <= b_d has |R^T e|_inf <= |e|_2, so with |x_rot|_inf <= |x|_2
 * (rotation keeps norms): int8 sqrt(hd) |x|_2 / 254, E4M3 |x|_2 / 16 + sqrt(hd) |x|_2 2^-10,
 * |x|_2 the norm of the head's row (plus f32 rounding of the rotation).
 */
static float tolerance(enum dtype dt, const float *head)
{
    if (!dtype_is_kv8(dt))
        return 0.0f;
    double n2 = 0;
    for (uint32_t d = 0; d < KT_HEAD_DIM; d++)
        n2 += (double)head[d] * head[d];
    const double norm = sqrt(n2), rt = sqrt((double)KT_HEAD_DIM);
    const double b = dt == DT_KV_I8 ? rt * norm / 254.0 : norm / 16.0 + rt * norm / 1024.0;
    return (float)(b * 1.0001 + 1e-5 * norm);
}

void kt_check_rows(const struct kv_seq *s, const int32_t *tokens, uint32_t from, uint32_t to)
{
    float k[KT_DIM], v[KT_DIM], kw[KT_DIM], vw[KT_DIM];
    const enum dtype dt = kv_pool_config(kv_seq_pool(s))->dtype;
    for (uint32_t l = 0; l < KT_LAYERS; l++)
        for (uint32_t pos = from; pos < to; pos++) {
            assert_int_equal(kv_seq_read(s, l, pos, k, v), 0);
            for (uint32_t i = 0; i < KT_DIM; i++) {
                kw[i] = kt_value(l, 0, pos, tokens[pos], i);
                vw[i] = kt_value(l, 1, pos, tokens[pos], i);
            }
            for (uint32_t i = 0; i < KT_DIM; i++) {
                const uint32_t h0 = i / KT_HEAD_DIM * KT_HEAD_DIM;
                if (fabsf(k[i] - kw[i]) > tolerance(dt, kw + h0) ||
                    fabsf(v[i] - vw[i]) > tolerance(dt, vw + h0))
                    fail_msg("layer %u position %u element %u: K %g V %g, expected %g %g", l,
                             pos, i, k[i], v[i], kt_value(l, 0, pos, tokens[pos], i),
                             kt_value(l, 1, pos, tokens[pos], i));
            }
        }
}

struct kv_metrics kt_valid(const struct kv_pool *p)
{
    int rc = kv_pool_validate(p);
    if (rc)
        fail_msg("kv_pool_validate: %s: %s", err_name(rc), log_last_error());
    struct kv_metrics m;
    kv_pool_metrics(p, &m);
    assert_int_equal(m.blocks_total, m.blocks_used + m.blocks_cached + m.blocks_free);
    return m;
}

void kt_tokens(int32_t *t, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++)
        t[i] = (int32_t)(rng_xorshift32(&x) % 32000u);
}
