/*
 * matmul.h — multiply by a weight matrix: the one home of the products that both forward
 * passes run (the reference pass, forward.c, and the serving engine's batched pass,
 * worker/engine/fwd_batch.c).
 *
 * Every product is y [n][ldy] = x [n][cols] W^T for a stored weight matrix W [rows][cols]
 * (struct matmul_mat, the view model.h binds each projection to). Three entries:
 *  - matmul_rows / matmul_one: one product, its rows sharded over the pool;
 *  - matmul_group: k products as ONE pool job (a layer's q, k, v; gate, up), each distinct
 *    input prepared once;
 *  - matmul_group_lora: a group plus the LoRA update of a batch plan (lora.h) as ONE pool job
 *    whose adapter-reading tasks are interleaved with the base row tiles (the engine's path
 *    when adapters are in the batch; matmul_lora.c, docs/LORA.md).
 * A matrix with panels (repacked at load, model.h) is read through them, any other through its
 * stored rows; that choice, and pool or calling thread, are made here and nowhere else.
 *
 * Kernels are reached only through their public entries: kern_act_bytes/init/prepare
 * (activations prepared once per product input, for the weight's dtype), kern_matmul_act and
 * kern_matmul_act_panels per row shard, kern_matmul and kern_matmul_panels on the calling
 * thread. A new block format (MXFP4, Q4_K) plugs in below those entries, through the kernels'
 * dtype dispatch, and needs no change here; one with a load-time repacking of its own plugs
 * in through kern_panels_* (the loader fills matmul_mat.panels).
 *
 * Mixture of experts (gpt-oss: 32 experts, top-4 routing; moe.h runs it). Each product of a
 * group carries its own input and token count, so a MoE layer runs as two matmul_group calls:
 *  1. gate and up of every expert e the batch selected: products {gate_e, x_e, n_e, g_e} and
 *     {up_e, x_e, n_e, u_e}, where x_e [n_e][dim] gathers the rows of the tokens routed to e
 *     (the pass gathers them); gate_e and up_e name the same x_e, so it is prepared once;
 *  2. after the activation, down_e on h_e [n_e][ffn] for every selected expert; the pass
 *     scatters each y_e back to its tokens with the router's weights.
 * Experts stored as one [n_experts][rows][cols] tensor are n_experts matmul_mat views (data +
 * e * rows * row_bytes, their panels likewise). A product with n == 0 (an expert no token
 * chose) is skipped. Up to MATMUL_GROUP_MAX products per group; products of different dtypes
 * or widths may share a group.
 *
 * Numbers: every output row is computed by one kernel call on whole 16-row panels, so the
 * results do not depend on the pool's size nor on how products are grouped (tests/pool,
 * tests/lora test_matmul_fused). They may depend on the number of tokens n (a gemv below a
 * type's crossover, a gemm above, summing in other orders) unless c->invariant is set or the
 * weight type's kernels are batch invariant (the quantized ones: kern.h; but with AMX, q4_0 and
 * q8_0 products of 128 tokens or more take the bf16 tiles, kern.h KERN_ACT_BF16_TILES, unless
 * c->invariant is set: then their activations are prepared without them).
 *
 * NOTES: a struct matmul_ctx belongs to one thread, the one dispatching on its pool (pool.h:
 * one dispatching thread per pool); its scratch (prepared activations, the fused job's task
 * list) grows on demand and is reused by every call. Inputs must not overlap outputs.
 */
#ifndef CLOCHER_WORKER_MATMUL_H
#define CLOCHER_WORKER_MATMUL_H

#include "dtype.h"
#include "lora.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pool;

/*
 * A stored weight matrix W [rows][cols], row-major, each row packed per dtype (row_bytes
 * bytes). panels: for a dtype with a panel layout (kern_panels_supported: q4_0, q8_0, mxfp4, the k-quants), the
 * same matrix repacked at load into 16-row panels for the AVX-512 GEMM (kernels/include/quant.h), or
 * NULL. The products read the panels when they are there; `data` stays valid for every other
 * reader (embedding rows, tools).
 */
struct matmul_mat {
    enum dtype dtype;
    const void *data;    /* [rows][row_bytes] the stored rows */
    uint32_t rows, cols;
    size_t row_bytes;
    const void *panels;  /* [kern_panels_bytes(dtype, rows, cols)] W in panels, or NULL */
};

/* One product of a group: y = x W^T, every row of W. */
struct matmul_prod {
    const struct matmul_mat *w; /* W [rows][cols] */
    const float *x;             /* [n][w->cols] the input */
    size_t n;                   /* tokens: rows of x and of y */
    float *y;                   /* [n][ldy] the output: y[t][r] = x[t] . W[r], r < rows */
    size_t ldy;
    enum lora_target t;         /* the projection it is: matmul_group_lora adds the plan's
                                 * update for it; matmul_group ignores it */
};

/* A caller's products: the pool they run on and the scratch they reuse. */
struct matmul_ctx {
    struct pool *pool;  /* shards rows over its participants; NULL = the calling thread */
    bool base_one_job;  /* matmul_group_lora runs a group of a plan without adapters as its
                         * fused job too (CLOCHER_FWD_ONE_JOB=1 in the engine: a measurement
                         * knob, docs/LORA.md); false: as matmul_group */
    bool invariant;     /* batch-invariant products (docs/DESIGN.md "Batch invariance"): each
                         * token's outputs are the bits it gets as a product of one token, so
                         * they do not depend on how many tokens share the call. Products
                         * not invariant on the ISA (f32/f16/bf16 on AVX2 and AVX-512, every
                         * type on AVX2; the AVX-512 quantized kernels are, kern.h, and
                         * the switch also prepares q4_0/q8_0 inputs without the AMX bf16
                         * tiles, KERN_ACT_BF16_TILES, so they keep the int8 bits) then run
                         * the one-token gemv per token over blocks of MATMUL_INV_ROWS rows
                         * (the block stays in cache across the tokens): slower than the gemm
                         * for many tokens. matmul_group_lora ignores it: a caller that wants
                         * it runs matmul_group, then lora_apply_fused */
    /* private: the scratch, 64-byte aligned, grown on demand */
    void *act_;         /* prepared activations of the distinct inputs */
    size_t act_cap_;
    void *tasks_;       /* matmul_group_lora's task list and tile flags */
    size_t tasks_cap_;
    void *prep_;        /* matmul_group_begin's plan of the inputs (struct matmul_prep) */
    bool prep_open_;    /* between matmul_group_begin and matmul_group_end */
};

/* Binds c to pool (NULL = the calling thread alone); nothing is allocated yet. */
void matmul_ctx_init(struct matmul_ctx *c, struct pool *pool);
/* Frees the scratch. Safe on a zeroed struct. */
void matmul_ctx_fini(struct matmul_ctx *c);

/*
 * y rows [r0, r1) of x [n][w->cols] W^T into y [n][ldy]. With a pool: the activations prepared
 * once (tokens in parallel when there are many), row shards of whole 16-row panels; r0 % 16
 * must be 0 when W has panels. If the scratch cannot grow (logged once per thread), each shard
 * prepares its own activations: slower, the same numbers.
 */
void matmul_rows(struct matmul_ctx *c, const struct matmul_mat *w, const float *x, size_t n,
                 float *y, size_t ldy, size_t r0, size_t r1);

/* Every row: y [n][ldy] = x [n][w->cols] W^T. */
static inline void matmul_one(struct matmul_ctx *c, const struct matmul_mat *w, const float *x,
                              size_t n, float *y, size_t ldy)
{
    matmul_rows(c, w, x, n, y, ldy, 0, w->rows);
}

/* Rows per block of the batch-invariant products: 16 rows of 2048 f32 columns are 128 KiB
 * (L2), the x split of the bf16 gemv is repeated once per block and token. */
#define MATMUL_INV_ROWS 16

#define MATMUL_GROUP_MAX 64 /* a MoE layer's gate and up products of 32 experts */

/*
 * k <= MATMUL_GROUP_MAX products as one pool job: each distinct input (same x, n, weight dtype
 * and width) prepared once, then one pool_for over the products' rows laid end to end, each
 * product starting on a 16-row boundary so that every shard starts on a panel. The same
 * kernels on the same rows as k matmul_one calls, so the same results.
 */
void matmul_group(struct matmul_ctx *c, const struct matmul_prod *g, size_t k);

/*
 * A group whose inputs are prepared by the caller, row by row, inside the job that writes
 * them (the engine's RMSNorm job writes xb and quantizes each row it wrote: no serial
 * preparation between that job and the products, and one pass over the rows while they are
 * in cache). Three calls, on the ctx's thread:
 *  - matmul_group_begin(c, g, k): plans and lays out the distinct inputs of g[0..k) in c's
 *    scratch; returns a handle, or NULL when the group takes its inputs as floats (no pool,
 *    c->invariant, no memory): then run matmul_group (or whatever the caller runs) instead;
 *  - matmul_prep_rows(h, t0, t1): prepares tokens [t0, t1) of every input from their floats,
 *    which must be written by then; any thread, disjoint ranges, all tokens before the end;
 *  - matmul_group_end(c, g, k): the products of matmul_group(c, g, k) on those inputs (g the
 *    same array as begin's). The same kernels on the same prepared bytes: the same numbers.
 * No other product may run on c between begin and end (they share the scratch).
 */
struct matmul_prep;
const struct matmul_prep *matmul_group_begin(struct matmul_ctx *c, const struct matmul_prod *g,
                                             size_t k);
void matmul_prep_rows(const struct matmul_prep *h, size_t t0, size_t t1);
void matmul_group_end(struct matmul_ctx *c, const struct matmul_prod *g, size_t k);

#define MATMUL_LORA_GROUP_MAX 4 /* q, k, v: the largest group that shares a LoRA plan */

/*
 * k <= MATMUL_LORA_GROUP_MAX products of one layer that are ready together, each on every
 * token of plan p (g[i].n == p->n_tok), plus the plan's LoRA update of their adapted rows
 * (g[i].t names the projection): y = x W^T + s_t (x A^T) B^T as ONE pool job whose tasks are
 * row tiles of the base products (pool_for's shards, cut at the products' ends), shrink tasks
 * and expand tasks, interleaved so that one
 * participant streams adapter weights while the other runs the compute-bound base GEMM. An
 * expand task waits (spins) for its base tile and its projection's shrink tasks, which always
 * precede it in the task order, so claiming tasks in order cannot deadlock. The numbers are
 * those of matmul_group followed by lora_apply_fused (same kernels, same blocks).
 * tmp: [k * p->tmp_floats]. A group no segment of p adapts in this layer (a plan without
 * segments, or o/gate/up/down under q,v adapters) runs matmul_group (or, with
 * c->base_one_job, the fused job of the base products alone).
 * 0 when it ran as one job; -ENOMEM when the scratch could not grow: the products were then
 * computed by matmul_group and lora_apply_fused (the same numbers, two more jobs).
 */
int matmul_group_lora(struct matmul_ctx *c, const struct matmul_prod *g, size_t k,
                      const struct lora_plan *p, uint32_t layer, float *tmp);

/*
 * matmul_group_lora on inputs the caller prepared (matmul_group_begin(c, g, k), then
 * matmul_prep_rows over every token): the fused job without its PREP tasks, so an adapted
 * group keeps the norm job's preparation as a group without adapters does (session 21). Ends
 * the begin. The base products' numbers are those of matmul_group_end; 0 or -ENOMEM as
 * matmul_group_lora.
 */
int matmul_group_lora_end(struct matmul_ctx *c, const struct matmul_prod *g, size_t k,
                          const struct lora_plan *p, uint32_t layer, float *tmp);

/*
 * matmul_group_begin for a group that matmul_group_lora_end(c, g, k, p, layer, ...) will end:
 * matmul_prep_rows then also makes the adapters' forms of each token's input that p's segments
 * read in this layer (the int8 adapters' codes, the bf16 ones' rounding), on the thread that
 * wrote the floats, instead of the fused job's shrinks on another core (session 24). The same
 * kernels on the same floats: the same numbers. p NULL or without segments: matmul_group_begin.
 * p must stay unchanged until the end.
 */
const struct matmul_prep *matmul_group_begin_lora(struct matmul_ctx *c,
                                                  const struct matmul_prod *g, size_t k,
                                                  const struct lora_plan *p, uint32_t layer);

/* Whether any segment of plan p adapts a product of g[0..k) in this layer (its adapter has
 * weights for g[i].t there). A group it does not adapt runs as matmul_group, so its caller
 * may prepare its inputs with matmul_group_begin as in a step without adapters. */
bool matmul_lora_adapts(const struct lora_plan *p, uint32_t layer, const struct matmul_prod *g,
                        size_t k);

/*
 * Where the fused LoRA job's time goes (engine_bench --lora-cycles; docs/PERFORMANCE.md
 * "Session 27"): while enabled, every fused job adds the cycles its participants spend in
 * each kind of work to process-wide counters, read as totals since the process started. The
 * clock is the TSC on x86-64 (constant rate on the CPUs this runs on; the reader calibrates it)
 * and CLOCK_MONOTONIC nanoseconds elsewhere. Off (the default) it costs a predictable branch
 * per counted call.
 *   MATMUL_CYC_BASE    base rows (the panel or row products of the tiles)
 *   MATMUL_CYC_SHRINK  shrink kernels, T = X A^T
 *   MATMUL_CYC_EXPAND  expands, y += s T B^T (whoever runs them)
 *   MATMUL_CYC_TASKS   every task from claim to return: the three above plus bookkeeping
 *                      and waits for PREP tasks
 *   MATMUL_CYC_JOB     the job's time on the calling thread times its participants: TASKS
 *                      plus the pool's claims and joins (the spin at the end of a job)
 * A group without adapters runs as matmul_group, outside these counters, unless the context's
 * base_one_job is set (CLOCHER_FWD_ONE_JOB=1 in the engine): compare a base step's counters with
 * an adapted one's under it.
 */
enum matmul_cyc {
    MATMUL_CYC_BASE,
    MATMUL_CYC_SHRINK,
    MATMUL_CYC_EXPAND,
    MATMUL_CYC_TASKS,
    MATMUL_CYC_JOB,
    MATMUL_CYC_N
};
void matmul_lora_cycles_enable(bool on);
void matmul_lora_cycles_read(uint64_t out[MATMUL_CYC_N]);
/* the counters' clock now (what they count in) */
uint64_t matmul_lora_cycles_now(void);

#endif
