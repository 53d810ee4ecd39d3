/*
 * matmul_lora.c — a group of products fused with the LoRA update of a batch plan, as one pool
 * job (matmul_group_lora, matmul.h; docs/LORA.md "With the base product").
 *
 * The job is a list of tasks that the pool's participants claim in order:
 *   PREP    tokens [a, b) of one distinct input (kern_act_prepare); none when the caller
 *           prepared the inputs (matmul_group_lora_end: the engine's norm job prepares them
 *           as it writes them, as for a group without adapters; session 21);
 *   SHRINK  units [b, c) of segment a's shrinks, T = X_seg A^T: the segment's units are
 *           blocks of lora__shrink_kb rank rows, for every product its adapter adapts in
 *           product order, so that a task reads one stretch of the adapter's A blocks,
 *           which lora_pack.c lays out back to back for the products of one job (q, k, v;
 *           gate, up): one long stream per (adapter, job), split only into tasks of about
 *           MM_SHRINK_BYTES (session 14);
 *   BASE    tile a of a product's base rows (lay_tiles: pool_for's shards, long first and
 *           short last, cut at the products' ends), once its input is prepared (b = 1,
 *           "merged": every shrink
 *           of its product is earlier in the list).
 * The expand, y += s_t T B^T on a tile's columns for every segment, is no task of its own
 * (session 15): it needs two events, the tile's base rows written and its product's shrinks
 * all done, and the participant that completes the second runs it, at once: the base task
 * of the tile, or the SHRINK task that finished the product's last units (then for every
 * tile of the product whose rows are already written). Nobody waits for either event. Until
 * session 14 an EXPAND task waited on its tile's flag, and a merged tile on its product's
 * shrinks, whenever the other participant was still running them: at 8 streams, rank 8 on
 * q,k,v,o, those spins were most of the update's time beyond its kernels (counted, session
 * 15; docs/PERFORMANCE.md "LoRA fixed cost, session 15").
 * Preparation comes first, then the first shrinks (MM_PREP_COVER: the other participant
 * reads adapter rows while the activations are prepared, where it waited for them), then
 * base tiles with the shrinks spread evenly among them by cost (weight elements for the
 * base, adapter bytes for the update), so that the participants mostly run one of each kind
 * at a time: the update only reads memory while the base GEMM of a small batch is bound by
 * compute. A merged tile's expand follows its base rows on the same core, while the rows are
 * still in its cache (the update's fixed cost at low rank was mostly separate expand tasks:
 * 2-4 % of an 8-stream int4 step at rank 1, perf, session 10). A product that no segment
 * adapts gets no expand at all.
 * The expand's panels are requested during the base rows of its tile (session 24): the base
 * task puts them on the thread's side list (kern.h kern_side_prefetch) and the panel product
 * requests one line of it per block as it streams, so the expand finds them in L2. Requested
 * where they are read, at low rank, they left the expand waiting a DRAM latency for its first
 * lines (perf: 26-37 % of its samples); requested all at once (session 11: a merged tile asked
 * for them MM_TAIL rows before its base product ended, a shrink for the rows of the task
 * MM_LOOKAHEAD places on) they waited for fill buffers beside the base stream, so that from
 * session 19 only plans of rank MM_PREFETCH_MIN_RANK and more make those requests, since
 * session 24 only ranks above 32.
 *
 * NOTES: a task waits (spins, yielding now and then) only for the PREP tasks, which precede
 * it in the list and which running participants are finishing, so claiming in order cannot
 * deadlock. A PREP's release publishes its activations to the BASE tasks that acquire
 * prep_done. A tile's counter (tile_done) takes one acq_rel increment per event: the base
 * task's publishes its rows, the last shrinker's the T rows of every shrink of the product
 * (it acquired them all through the product's shrink counter, whose increments are acq_rel
 * too), so whoever reads 1 sees both.
 */
#include "matmul.h"

#include "check.h"
#include "log.h"
#include "lora_internal.h"
#include "matmul_internal.h"
#include "pool.h"

#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>  /* _mm_pause, _mm_prefetch (SSE, baseline x86-64) */
#include <x86intrin.h> /* __rdtsc */
#endif

#ifndef MM_TILE /* MM_GUIDED 0 only */
#define MM_TILE 512u    /* base rows (= expand columns) per task: whole 16-row GEMM panels and
                         * 32-column B panels (measured, int4, 8 streams: 256 cost +2-5% at
                         * rank 1 against matmul_group's longer shards, 512 ~0%) */
#endif
#define MM_PREP_TOK 16u /* tokens per activation-preparing task */
/* The job's last MM_TAIL_TILES tiles of MM_TILE rows are split into parts, tiles of their
 * own (rows a multiple of MM_TAIL_GRAIN; tail_parts says how many). With whole 512-row tiles
 * a participant that claimed the last one ran alone for up to a tile (a down tile: 512 x
 * 5632 weights, ~0.1 ms at 8 tokens) while the other spun in the pool's join (session 22,
 * all 7 projections at rank 8: the caller spun 2.6 % of an adapted step's samples against
 * 0.9 % on the base path, whose pool_for shards shrink towards the end). Each part is a
 * tile: its expand runs on its own columns. */
#define MM_TAIL_TILES 2u
#define MM_TAIL_GRAIN 32u /* whole B^T panels (32 columns) and GEMM panels (16 rows) */
#define MM_MAX MATMUL_LORA_GROUP_MAX
#define MM_TAIL 128u    /* a merged tile requests its expand's panels this many base rows
                         * before its end (a multiple of 16: whole panels) */
#define MM_LOOKAHEAD 4u /* a shrink task requests the rows of the task this many places on */
#define MM_SHRINK_FIRST_RANK 4u /* plans of at most this rank put every shrink first */
#ifndef MM_PREP_COVER
#define MM_PREP_COVER 65536.0 /* adapter bytes of shrinks put before the first base tile per
                               * PREP task: what the other participant reads meanwhile */
#endif
#ifndef MM_SHRINK_BYTES
#define MM_SHRINK_BYTES (128u * 1024u) /* a shrink task reads about this many adapter bytes
                                        * (whole units): long streams, yet enough tasks for
                                        * both threads to share a segment's */
#endif
#ifndef MM_SHRINK_BY_PROJECTION
#define MM_SHRINK_BY_PROJECTION 0 /* 1: shrink tasks projection-major (push_shrink) */
#endif
#define MM_SHRINK_PF_ROWS 4u /* a shrink task's first rank rows requested ahead (the int8
                              * kernels request each block's next rows themselves, the bf16
                              * ones leave them to the hardware prefetchers) */
#ifndef MM_PREFETCH
#define MM_PREFETCH 1   /* update tasks request their whole weight blocks first */
#endif
#ifndef MM_SHRINK_FIRST_PF
#define MM_SHRINK_FIRST_PF 1 /* run_shrink: a shrinks-first plan's task requests its rows */
#endif
#ifndef MM_GUIDED
#define MM_GUIDED 1 /* lay_tiles_guided; 0: MM_TILE rows and the split tail */
#endif
#ifndef MM_SIDE_PF
#define MM_SIDE_PF 1 /* run_base: the expand's panels on the side list below MM_PREFETCH_MIN_RANK */
#endif
#ifndef MM_PREFETCH_MIN_RANK
#define MM_PREFETCH_MIN_RANK 33u /* ... in plans of at least this rank; below it the expand's
                                  * panels go on the side list instead (run_base), which at
                                  * rank 32 measured 4-7 points under these requests (session
                                  * 24: int4 base, 8 streams, all 7 projections, three
                                  * alternations, +31.4/+29.2/+33.7 against +35.2/+36.5/+37.0;
                                  * ranks above 32 not measured). Session 19, int4 base,
                                  * 8 streams, 4 adapters on all 7 projections, A/B in one
                                  * run against the requests at every rank (loaded machine):
                                  * without them rank 1 bf16 costs ~1.5 points less, rank 8
                                  * int8 ~1.3, rank 8 bf16 ~3, rank 16 int8 the same: the
                                  * requests, issued while the base GEMM streams, wait for
                                  * fill buffers more than the latency they hide (perf: the
                                  * prefetch loops' samples sit on the prefetch). Rank 32
                                  * was not measured then. The kernels still request their
                                  * next rows and panels. */
#endif

enum { TK_PREP, TK_SHRINK, TK_BASE };

/* ---- cycle accounting (matmul.h matmul_lora_cycles_enable) ------------------------------- */

static atomic_bool g_cyc_on;
/* totals by enum matmul_cyc; relaxed adds: the reader reads them after the step, whose pool
 * joins order every participant's adds before its return */
static _Atomic uint64_t g_cyc[MATMUL_CYC_N];

uint64_t matmul_lora_cycles_now(void)
{
#if defined(__x86_64__)
    return __rdtsc();
#else
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
#endif
}

void matmul_lora_cycles_enable(bool on) { atomic_store(&g_cyc_on, on); }

void matmul_lora_cycles_read(uint64_t out[MATMUL_CYC_N])
{
    for (int k = 0; k < MATMUL_CYC_N; k++)
        out[k] = atomic_load_explicit(&g_cyc[k], memory_order_relaxed);
}

/* The clock now when the accounting is on, else 0 (then cyc_add does nothing). */
static inline uint64_t cyc_start(void)
{
    return atomic_load_explicit(&g_cyc_on, memory_order_relaxed) ? matmul_lora_cycles_now() : 0;
}

static inline void cyc_add(enum matmul_cyc k, uint64_t t0, uint64_t times)
{
    if (t0)
        atomic_fetch_add_explicit(&g_cyc[k], (matmul_lora_cycles_now() - t0) * times,
                                  memory_order_relaxed);
}

struct task {
    uint32_t kind, prod; /* prod: the input's index for TK_PREP (SHRINK: unused) */
    uint32_t a, b, c;    /* PREP: tokens [a, b); SHRINK: segment a, units [b, c);
                          * BASE: tile a, merged b */
};

struct job {
    const struct lora_plan *p;
    uint32_t layer;
    const struct matmul_prod *g;
    size_t n_prod;                   /* products in g */
    float *tmp;                      /* [k][p->tmp_floats] each product's T */
    const struct task *tasks;
    size_t n_tasks;
    struct matmul__acts A;           /* the distinct inputs */
    size_t tile0[MM_MAX];            /* product -> its first tile in tiles/tile_done */
    size_t n_tiles[MM_MAX];          /* product -> its tiles */
    struct tile { uint32_t r0, r1; } *tiles; /* [every product's tiles] base rows [r0, r1)
                                              * of the tile's product = its expand's columns */
    size_t prep_total[MM_MAX];       /* input -> its PREP tasks */
    size_t shrink_total[MM_MAX];     /* product -> its shrink units in SHRINK tasks pushed so
                                      * far (while building) */
    size_t shrink_want[MM_MAX];      /* product -> its shrink units in all (0: not adapted) */
    atomic_size_t prep_done[MM_MAX], shrink_done[MM_MAX]; /* PREP tasks; shrink units */
    atomic_uint *tile_done;          /* [every product's tiles] events of its expand (0-2) */
    /* int8 adapters' u codes (kern_lora_i8_quant_u), made once per product when its shrinks
     * are done and read by each of its tiles' expands (NULL: no int8 segment): token i of
     * product p at uq + (p * n + i) * ldu (a segment's n tokens of LDU(its rank) bytes from
     * its t0), us / usum [p * n + i] */
    int8_t *uq;
    float *us;
    int32_t *usum;
    size_t ldu, n_tok;
    bool prefetch; /* MM_PREFETCH and the plan's rank >= MM_PREFETCH_MIN_RANK */
    size_t n_part; /* the pool's participants (1 without one) */
};

/* ---- running a task ---------------------------------------------------------------------- */

static inline void cpu_relax(void)
{
#if defined(__x86_64__)
    _mm_pause();
#endif
}

/* Spins until *v >= want. What it waits for precedes the waiting task in the task order, so a
 * running participant is finishing it; yield now and then in case that one was preempted. */
static void wait_at_least(atomic_size_t *v, size_t want)
{
    for (unsigned i = 1; atomic_load_explicit(v, memory_order_acquire) < want; i++) {
        cpu_relax();
        if ((i & 1023) == 0)
            sched_yield();
    }
}

/* One of the two events tile `tile` (an index into j->tiles) waits for has happened (its base
 * rows are written, or its product's shrinks are all done); true for the second, whose caller
 * then runs the tile's expand. */
static inline bool tile_arrive(struct job *j, size_t tile)
{
    return atomic_fetch_add_explicit(&j->tile_done[tile], 1, memory_order_acq_rel) == 1;
}

static void expand_tile(struct job *j, size_t prod, size_t tile, bool fetch);

/* Requests [p, p + bytes) into L2 at once. An update task's weights are a few contiguous
 * blocks of 8-90 KB read once: asking for all of them up front keeps many misses in flight,
 * where the kernels' own loads (and the short streams the hardware prefetcher sees) wait for
 * them a few at a time (measured: the expand kernel's time was mostly its first loads). */
static inline void prefetch_l2(const void *p, size_t bytes)
{
#if defined(__x86_64__)
    const char *c = (const char *)((uintptr_t)p & ~(uintptr_t)63);
    for (const char *e = (const char *)p + bytes; c < e; c += 64)
        _mm_prefetch(c, _MM_HINT_T1);
#else
    (void)p;
    (void)bytes;
#endif
}

static inline void run_prep(struct job *j, const struct task *tk)
{
    kern_act_prepare(&j->A.a[tk->prod], tk->a, tk->b);
    atomic_fetch_add_explicit(&j->prep_done[tk->prod], 1, memory_order_release);
}

/* Unit u of segment `seg`'s shrinks: the product it belongs to and its first rank row; false
 * past the segment's last unit. */
static bool shrink_unit(const struct job *j, size_t k, size_t seg, size_t u, size_t *prod,
                        size_t *k0)
{
    const struct lora_adapter *ad = j->p->segs[seg].ad;
    const size_t kb = lora__shrink_kb(ad), per = (ad->cfg.rank + kb - 1) / kb;
    for (size_t i = 0; i < k; i++) {
        if (!lora_weights(ad, j->layer, j->g[i].t))
            continue;
        if (u < per) {
            *prod = i;
            *k0 = u * kb;
            return true;
        }
        u -= per;
    }
    return false;
}

/* Requests the first MM_SHRINK_PF_ROWS rank rows a SHRINK task reads: the rest of its stream
 * is requested by the int8 kernels as they go, or followed by the hardware prefetchers
 * (kernels/x86/avx512_lora.c), so only a task's start would wait a memory latency. */
static void prefetch_shrink(const struct job *j, const struct task *tk)
{
    size_t prod, k0;
    if (!shrink_unit(j, j->n_prod, tk->a, tk->b, &prod, &k0))
        return;
    const struct lora_adapter *ad = j->p->segs[tk->a].ad;
    const uint32_t t = j->g[prod].t;
    const struct lora_weights *w = lora_weights(ad, j->layer, t);
    size_t r = ad->cfg.rank, k1 = k0 + MM_SHRINK_PF_ROWS < r ? k0 + MM_SHRINK_PF_ROWS : r;
    prefetch_l2((const char *)w->fa + lora__fa_offset(ad, t, k0),
                lora__fa_offset(ad, t, k1) - lora__fa_offset(ad, t, k0));
}

/* Requests the first rows of task i if it is a SHRINK: a shrink that requests only its own
 * rows first waits a memory latency for them (most of the shrink's time at rank 1, perf,
 * session 11); a shrink requests those of the task MM_LOOKAHEAD places on, and the job's
 * first MM_LOOKAHEAD are requested while the pool starts. */
static void prefetch_if_shrink(const struct job *j, size_t i)
{
    if (i < j->n_tasks && j->tasks[i].kind == TK_SHRINK)
        prefetch_shrink(j, &j->tasks[i]);
}

/* A SHRINK task's rows of one product. */
struct piece {
    size_t prod, k0, k1, units;
};

/* The pieces of task tk (units [b, c) of segment a), in order; at most one per product. */
static size_t task_pieces(const struct job *j, const struct task *tk, struct piece *pc)
{
    const struct lora_adapter *ad = j->p->segs[tk->a].ad;
    const size_t kb = lora__shrink_kb(ad), r = ad->cfg.rank;
    size_t u = tk->b, prod, k0, np = 0;
    while (u < tk->c && shrink_unit(j, j->n_prod, tk->a, u, &prod, &k0)) {
        /* this product's units of the task: to the end of its rank or of the task */
        size_t units = (r - k0 + kb - 1) / kb;
        if (units > tk->c - u)
            units = tk->c - u;
        pc[np++] = (struct piece){prod, k0, k0 + units * kb < r ? k0 + units * kb : r, units};
        u += units;
    }
    return np;
}

#define MM_Q_TOK 4u /* int8 weights: tokens quantized at a time (64 KB of codes at most) */

/* The int8 pieces of segment s: each block of MM_Q_TOK tokens quantized once per distinct
 * input (q, k and v share theirs: kern_lora_i8_quant_x), then every piece's rows on the
 * codes (kern_lora_shrink_i8q; the same bits as kern_lora_shrink_i8). An input whose codes
 * the caller's preparation made (struct matmul__lora_x) is read as made. */
static void shrink_i8(struct job *j, const struct lora_seg *s, const struct piece *pc,
                      size_t np)
{
    const struct lora_adapter *ad = s->ad;
    _Alignas(64) int8_t qx[MM_Q_TOK * KERN_LORA_I8_LDX(KERN_LORA_I8_IN_MAX)];
    float xs[MM_Q_TOK];
    int32_t xsum[MM_Q_TOK];
    for (size_t i0 = 0; i0 < s->n; i0 += MM_Q_TOK) {
        const size_t nt = s->n - i0 < MM_Q_TOK ? s->n - i0 : MM_Q_TOK;
        const float *have = NULL; /* the input whose codes qx holds */
        for (size_t q = 0; q < np; q++) {
            const struct matmul_prod *pr = &j->g[pc[q].prod];
            const struct lora_weights *w = lora_weights(ad, j->layer, pr->t);
            const size_t in = ad->in[pr->t];
            const struct matmul__lora_x *lx = &j->A.lx[j->A.of[pc[q].prod]];
            const int8_t *cq = qx;
            const float *cs = xs;
            const int32_t *csum = xsum;
            if (lx->q) {
                const size_t t = s->t0 + i0;
                cq = lx->q + t * KERN_LORA_I8_LDX(in);
                cs = lx->xs + t;
                csum = lx->xsum + t;
            } else if (pr->x != have) {
                kern_lora_i8_quant_x(pr->x + (s->t0 + i0) * in, in, nt, qx, xs, xsum);
                have = pr->x;
            }
            kern_lora_shrink_i8q(w->fa, in, ad->cfg.rank, cq, cs, csum, nt,
                                 j->tmp + pc[q].prod * j->p->tmp_floats + s->tmp0 +
                                     i0 * ad->cfg.rank,
                                 pc[q].k0, pc[q].k1);
        }
    }
}

/* The bf16 pieces of segment s where the shrink rounds x to bf16 (kern_lora_shrink_rounds_x):
 * each block of MM_Q_TOK tokens rounded once per distinct input (kern_lora_bf16_x), then
 * every piece's rows on it (kern_lora_shrink_bf16x; the same bits as kern_lora_shrink).
 * Rounding per piece was 1.3 points of rank 1's 4.5 % on 7 projections (session 15). */
static void shrink_bf16x(struct job *j, const struct lora_seg *s, const struct piece *pc,
                         size_t np)
{
    const struct lora_adapter *ad = s->ad;
    _Alignas(64) uint16_t xb[MM_Q_TOK * KERN_LORA_BF16_LDX(KERN_LORA_BF16_IN_MAX)];
    for (size_t i0 = 0; i0 < s->n; i0 += MM_Q_TOK) {
        const size_t nt = s->n - i0 < MM_Q_TOK ? s->n - i0 : MM_Q_TOK;
        const float *have = NULL; /* the input whose rounding xb holds */
        for (size_t q = 0; q < np; q++) {
            const struct matmul_prod *pr = &j->g[pc[q].prod];
            const struct lora_weights *w = lora_weights(ad, j->layer, pr->t);
            const size_t in = ad->in[pr->t];
            const struct matmul__lora_x *lx = &j->A.lx[j->A.of[pc[q].prod]];
            const uint16_t *cb = xb;
            if (lx->xb) /* made by the caller's preparation */
                cb = lx->xb + (s->t0 + i0) * KERN_LORA_BF16_LDX(in);
            else if (pr->x != have) {
                kern_lora_bf16_x(pr->x + (s->t0 + i0) * in, in, nt, xb);
                have = pr->x;
            }
            kern_lora_shrink_bf16x(w->fa, in, ad->cfg.rank, cb, nt,
                                   j->tmp + pc[q].prod * j->p->tmp_floats + s->tmp0 +
                                       i0 * ad->cfg.rank,
                                   pc[q].k0, pc[q].k1);
        }
    }
}

/* True if adapter ad's shrinks on group g[0..k) take shrink_bf16x: bf16 weights whose shrink
 * rounds x, every input of the group's products no wider than KERN_LORA_BF16_IN_MAX. */
static bool ad_bf16x(const struct lora_adapter *ad, const struct matmul_prod *g, size_t k)
{
    if (ad->fast_dt != DT_BF16 || !kern_lora_shrink_rounds_x(DT_BF16, ad->cfg.rank))
        return false;
    for (size_t p = 0; p < k; p++)
        if (ad->in[g[p].t] > KERN_LORA_BF16_IN_MAX)
            return false;
    return true;
}

static bool seg_bf16x(const struct job *j, const struct lora_seg *s)
{
    return ad_bf16x(s->ad, j->g, j->n_prod);
}

/* ---- the adapters' forms of the inputs, made by the caller's preparation ------------------ */

/* Which forms of input a segment s's shrinks read in group A->lx_g (1: codes, 2: rounding). */
static unsigned seg_forms(const struct matmul__acts *A, const struct lora_seg *s, size_t a)
{
    const struct lora_adapter *ad = s->ad;
    bool reads = false;
    for (size_t i = 0; i < A->lx_k; i++)
        reads |= A->lx_g[i].n && A->of[i] == a && lora_weights(ad, A->lx_layer, A->lx_g[i].t);
    if (!reads)
        return 0;
    if (ad->fast_dt == LORA_DT_I8)
        return 1;
    return ad_bf16x(ad, A->lx_g, A->lx_k) ? 2 : 0;
}

void matmul__lora_x_plan(struct matmul__acts *A, const struct matmul_prod *g, size_t k,
                         const struct lora_plan *p, uint32_t layer)
{
    A->lx_plan = p;
    A->lx_g = g;
    A->lx_k = k;
    A->lx_layer = layer;
    for (size_t a = 0; a < A->n; a++) {
        unsigned forms = 0;
        for (size_t si = 0; si < p->n_segs; si++)
            forms |= seg_forms(A, &p->segs[si], a);
        const struct matmul_prod *pr = &g[A->first[a]];
        const size_t n = pr->n, cols = pr->w->cols;
        if ((forms & 1) && cols <= KERN_LORA_I8_IN_MAX) {
            A->lx[a].off_q = A->total;
            A->total += (n * (KERN_LORA_I8_LDX(cols) + sizeof(float) + sizeof(int32_t)) + 63) /
                        64 * 64;
        }
        if (forms & 2) {
            A->lx[a].off_b = A->total;
            A->total += (n * KERN_LORA_BF16_LDX(cols) * sizeof(uint16_t) + 63) / 64 * 64;
        }
    }
}

void matmul__lora_x_rows(const struct matmul__acts *A, size_t t0, size_t t1)
{
    const struct lora_plan *p = A->lx_plan;
    for (size_t a = 0; a < A->n; a++) {
        const struct matmul__lora_x *lx = &A->lx[a];
        if (!lx->q && !lx->xb)
            continue;
        const struct kern_act *act = &A->a[a];
        const size_t in = act->cols;
        for (size_t si = 0; si < p->n_segs; si++) {
            const struct lora_seg *s = &p->segs[si];
            const size_t b = s->t0 > t0 ? s->t0 : t0;
            const size_t e = s->t0 + s->n < t1 ? s->t0 + s->n : t1;
            if (b >= e)
                continue;
            const unsigned forms = seg_forms(A, s, a);
            if ((forms & 1) && lx->q)
                kern_lora_i8_quant_x(act->x + b * in, in, e - b,
                                     lx->q + b * KERN_LORA_I8_LDX(in), lx->xs + b,
                                     lx->xsum + b);
            if ((forms & 2) && lx->xb)
                kern_lora_bf16_x(act->x + b * in, in, e - b, lx->xb + b * KERN_LORA_BF16_LDX(in));
        }
    }
}

/* The u codes of every int8 segment of product prod (its shrinks done): once per product, not
 * once per tile's expand (kern.h kern_lora_i8_quant_u; session 17 counted the per-tile
 * quantization at ~288 calls a layer, the largest part of quant_x512's ~1.1 % of an adapted
 * step's samples). Published to the tiles' expands by the tile counters' acq_rel. */
static void quant_u(struct job *j, size_t prod)
{
    const struct lora_plan *p = j->p;
    for (size_t si = 0; si < p->n_segs; si++) {
        const struct lora_seg *s = &p->segs[si];
        const struct lora_weights *w = lora_weights(s->ad, j->layer, j->g[prod].t);
        if (!w || s->ad->fast_dt != LORA_DT_I8)
            continue;
        const size_t at = prod * j->n_tok + s->t0;
        kern_lora_i8_quant_u(w->fbt, s->ad->cfg.rank, j->tmp + prod * p->tmp_floats + s->tmp0,
                             s->n, j->uq + at * j->ldu, j->us + at, j->usum + at);
    }
}

/* Units [b, c) of segment a: one kernel call per product (its rows of the stretch), each
 * product's counter raised once its rows are done; the task that completes a product's
 * shrinks expands every tile of it whose base rows are written. */
static inline void run_shrink(struct job *j, const struct task *tk, size_t task)
{
    const struct lora_seg *s = &j->p->segs[tk->a];
    const struct lora_adapter *ad = s->ad;
    if (j->prefetch) {
        prefetch_shrink(j, tk);
        prefetch_if_shrink(j, task + MM_LOOKAHEAD);
    }
    struct piece pc[MM_MAX] = {{0, 0, 0, 0}};
    const size_t np = task_pieces(j, tk, pc);
    /* a plan that runs every shrink first (rank <= MM_SHRINK_FIRST_RANK) has no base stream
     * beside them to wait on fill buffers with: its task's rows (a few KB each) requested at
     * once, where the kernel's own requests left it waiting a latency per row (shrink_group
     * 772 -> 581 samples at rank 1, int4, all 7 projections, perf, session 24) */
    if (MM_SHRINK_FIRST_PF && !j->prefetch && j->p->max_rank <= MM_SHRINK_FIRST_RANK)
        for (size_t q = 0; q < np; q++) {
            const uint32_t t = j->g[pc[q].prod].t;
            const struct lora_weights *w = lora_weights(ad, j->layer, t);
            prefetch_l2((const char *)w->fa + lora__fa_offset(ad, t, pc[q].k0),
                        lora__fa_offset(ad, t, pc[q].k1) - lora__fa_offset(ad, t, pc[q].k0));
        }
    const bool once = ad->fast_dt == LORA_DT_I8 || seg_bf16x(j, s); /* x prepared once */
    uint64_t t0 = cyc_start();
    if (ad->fast_dt == LORA_DT_I8)
        shrink_i8(j, s, pc, np);
    else if (once)
        shrink_bf16x(j, s, pc, np);
    cyc_add(MATMUL_CYC_SHRINK, t0, 1);
    for (size_t q = 0; q < np; q++) {
        const struct matmul_prod *pr = &j->g[pc[q].prod];
        if (!once) {
            const struct lora_weights *w = lora_weights(ad, j->layer, pr->t);
            const size_t in = ad->in[pr->t];
            t0 = cyc_start();
            lora__shrink(ad, w->fa, in, pr->x + s->t0 * in, s->n,
                         j->tmp + pc[q].prod * j->p->tmp_floats + s->tmp0, pc[q].k0, pc[q].k1);
            cyc_add(MATMUL_CYC_SHRINK, t0, 1);
        }
        const size_t prod = pc[q].prod;
        if (atomic_fetch_add_explicit(&j->shrink_done[prod], pc[q].units,
                                      memory_order_acq_rel) + pc[q].units !=
            j->shrink_want[prod])
            continue;
        if (j->uq)
            quant_u(j, prod);
        for (size_t t = j->tile0[prod]; t < j->tile0[prod] + j->n_tiles[prod]; t++)
            if (tile_arrive(j, t))
                expand_tile(j, prod, t, true);
    }
}

/* Requests the B^T panels of tile `tile` of product `prod`, every segment's. */
static void prefetch_tile(const struct job *j, size_t prod, size_t tile)
{
    const struct lora_plan *p = j->p;
    const struct matmul_prod *pr = &j->g[prod];
    const size_t c0 = j->tiles[tile].r0, c1 = j->tiles[tile].r1;
    for (size_t si = 0; si < p->n_segs; si++) {
        const struct lora_seg *s = &p->segs[si];
        const struct lora_weights *w = lora_weights(s->ad, j->layer, pr->t);
        if (w) /* the tile's panels, from c0 (a multiple of 32) */
            prefetch_l2((const char *)w->fbt + lora__fbt_offset(s->ad, c0),
                        lora__fbt_offset(s->ad, c1) - lora__fbt_offset(s->ad, c0));
    }
}

/* y += the update on tile `tile` of product `prod`, for every segment (shrinks done); fetch:
 * its panels are not requested yet. */
static void expand_tile(struct job *j, size_t prod, size_t tile, bool fetch)
{
    const struct lora_plan *p = j->p;
    const struct matmul_prod *pr = &j->g[prod];
    const size_t c0 = j->tiles[tile].r0, c1 = j->tiles[tile].r1;
    const uint64_t t0 = cyc_start();
    if (j->prefetch && fetch)
        prefetch_tile(j, prod, tile);
    for (size_t si = 0; si < p->n_segs; si++) {
        const struct lora_seg *s = &p->segs[si];
        const struct lora_weights *w = lora_weights(s->ad, j->layer, pr->t);
        if (!w)
            continue;
        if (j->uq && s->ad->fast_dt == LORA_DT_I8) { /* on the product's codes (quant_u) */
            const size_t at = prod * j->n_tok + s->t0;
            kern_lora_expand_i8q(w->fbt, s->ad->cfg.rank, j->uq + at * j->ldu, j->us + at,
                                 j->usum + at, s->n, p->scale + s->t0, 0.0f,
                                 pr->y + s->t0 * pr->ldy, pr->ldy, c0, c1);
            continue;
        }
        lora__expand(s->ad, w->fbt, j->tmp + prod * p->tmp_floats + s->tmp0, s->n,
                     p->scale + s->t0, pr->y + s->t0 * pr->ldy, pr->ldy, c0, c1);
    }
    cyc_add(MATMUL_CYC_EXPAND, t0, 1);
}

/* Puts tile `tile`'s B^T panels, every segment's, on the thread's side list (kern.h
 * kern_side_prefetch): the base product of its rows requests them a few lines at a time as it
 * streams, so that its expand finds them in L2. */
static void side_tile(const struct job *j, size_t prod, size_t tile)
{
    const struct lora_plan *p = j->p;
    const size_t c0 = j->tiles[tile].r0, c1 = j->tiles[tile].r1;
    const void *at[KERN_SIDE_PF_MAX];
    size_t bytes[KERN_SIDE_PF_MAX], n = 0;
    for (size_t si = 0; si < p->n_segs && n < KERN_SIDE_PF_MAX; si++) {
        const struct lora_weights *w = lora_weights(p->segs[si].ad, j->layer, j->g[prod].t);
        if (!w)
            continue;
        at[n] = (const char *)w->fbt + lora__fbt_offset(p->segs[si].ad, c0);
        bytes[n++] = lora__fbt_offset(p->segs[si].ad, c1) - lora__fbt_offset(p->segs[si].ad, c0);
    }
    kern_side_prefetch(at, bytes, n);
}

/* Base rows [r0, r1) of product pr (matmul__rows), counted as MATMUL_CYC_BASE. */
static inline void base_rows(const struct matmul_prod *pr, const struct kern_act *a, size_t r0,
                             size_t r1)
{
    const uint64_t t0 = cyc_start();
    matmul__rows(pr, a, r0, r1);
    cyc_add(MATMUL_CYC_BASE, t0, 1);
}

static inline void run_base(struct job *j, const struct task *tk)
{
    size_t ai = j->A.of[tk->prod];
    wait_at_least(&j->prep_done[ai], j->prep_total[ai]);
    const struct matmul_prod *pr = &j->g[tk->prod];
    const size_t r0 = j->tiles[tk->a].r0, r1 = j->tiles[tk->a].r1;
    /* below MM_PREFETCH_MIN_RANK the expand's panels are requested during the base rows, a few
     * lines at a time (session 24; at and above it, all at once MM_TAIL rows before the end) */
    const bool side = MM_SIDE_PF && !j->prefetch && j->shrink_want[tk->prod];
    if (side)
        side_tile(j, tk->prod, tk->a);
    /* tiles are whole panels (MM_TAIL_GRAIN rows, MM_TILE): they start on one */
    if (tk->b) { /* merged: the product's shrinks precede this task */
        /* the expand's panels are requested MM_TAIL rows before the base product ends, so
         * that they arrive while it computes: requested at the expand, each tile waited for
         * a memory latency (the update's fixed cost at rank 1, perf, session 11); the base
         * rows are the same whichever calls compute them; mid starts a panel (of a ragged
         * last tile too) */
        size_t mid = r0;
        if (j->prefetch && r1 - r0 > MM_TAIL)
            mid += (r1 - r0 - MM_TAIL) / 16 * 16;
        if (mid > r0)
            base_rows(pr, &j->A.a[ai], r0, mid);
        if (j->prefetch)
            prefetch_tile(j, tk->prod, tk->a);
        base_rows(pr, &j->A.a[ai], mid, r1);
        if (side)
            kern_side_prefetch(NULL, NULL, 0);
        /* the last shrink may still be running: then its task expands the tile */
        if (tile_arrive(j, tk->a))
            expand_tile(j, tk->prod, tk->a, false);
    } else {
        base_rows(pr, &j->A.a[ai], r0, r1);
        if (side)
            kern_side_prefetch(NULL, NULL, 0);
        if (j->shrink_want[tk->prod] && tile_arrive(j, tk->a))
            expand_tile(j, tk->prod, tk->a, true);
    }
}

static void run_task(void *ctx, size_t task, int thread)
{
    (void)thread;
    struct job *j = ctx;
    const struct task *tk = &j->tasks[task];
    const uint64_t t0 = cyc_start();
    switch (tk->kind) {
    case TK_PREP:
        run_prep(j, tk);
        break;
    case TK_SHRINK:
        run_shrink(j, tk, task);
        break;
    case TK_BASE:
        run_base(j, tk);
        break;
    default:
        CHECK(0);
    }
    cyc_add(MATMUL_CYC_TASKS, t0, 1);
}

/* ---- building the task list -------------------------------------------------------------- */

struct counts {
    size_t prep, shrink, tiles; /* tasks of each kind (shrink: units, so at most) */
};

/* Parts the whole tile `from_end` places before the job's last (0: the last) is split into:
 * measured at 8 streams, all 7 projections at rank 8 (int4 base; perf cpu-clock, session 23):
 * the pool's spin was 3.5-3.7 % of the samples with whole tiles, 2.2-2.4 % with 4 and 2
 * parts, 1.8-2.0 % with 8 and 4 (the base path alone: ~0.9 %). */
static size_t tail_parts(size_t from_end)
{
    static const size_t parts[MM_TAIL_TILES] = {8, 4};
    return from_end < MM_TAIL_TILES ? parts[from_end] : 1;
}

/*
 * The guided layout (MM_GUIDED, session 24): the products' rows laid end to end in units of
 * MM_TAIL_GRAIN, cut where pool_for cuts its shards (pool.c: four rounds of one shard per
 * participant taking 44, 32, 18 and 6 % of the line) and at every product's end, so that the
 * base rows run in the calls matmul_group runs them in: long first (a gate/up tile of ~2500
 * rows), short last. With fixed 512-row tiles the base GEMM alone ran several % slower in
 * the fused job than in matmul_group at 8 streams (int4, all 7 projections: adapted steps
 * whose update was skipped still cost +2.3..+7.3 % over base steps, -0.4..+3.1 % when the base
 * steps ran the fused job too), which was most of the fixed cost at rank 1; guided, in
 * three alternations, rank 1 +7.2/+6.5/+10.0 -> +4.9/+3.4/+4.9, rank 8 +15.1/+9.9/+13.7 ->
 * +11.3/+7.0/+8.8 (docs/PERFORMANCE.md "Session 24").
 */
static const unsigned guided_w[4] = {22, 16, 9, 3}; /* of 50, pool.c's for_round_w */

static size_t guided_at(size_t units, size_t n, size_t i)
{
    size_t kk = i / n, jj = i % n, c = 0;
    for (size_t r = 0; r < kk && r < 4; r++)
        c += guided_w[r] * n;
    if (kk < 4)
        c += guided_w[kk] * jj;
    return (size_t)((unsigned __int128)units * c / (50u * n));
}

static size_t lay_tiles_guided(struct job *j, size_t k, struct tile *out)
{
    size_t units = 0, n = 0;
    for (size_t i = 0; i < k; i++)
        units += (j->g[i].w->rows + MM_TAIL_GRAIN - 1) / MM_TAIL_GRAIN;
    const size_t parts = j->n_part;
    size_t cut = 1; /* the next shard boundary: guided_at(.., cut) */
    for (size_t i = 0, u0 = 0; i < k; i++) {
        const size_t rows = j->g[i].w->rows;
        const size_t pu = (rows + MM_TAIL_GRAIN - 1) / MM_TAIL_GRAIN;
        j->tile0[i] = n;
        size_t a = 0; /* the product's next unit */
        while (a < pu) {
            while (cut < 4 * parts && guided_at(units, parts, cut) <= u0 + a)
                cut++;
            size_t e = cut < 4 * parts ? guided_at(units, parts, cut) - u0 : pu;
            if (e > pu)
                e = pu;
            if (out) {
                const size_t r1 = e * MM_TAIL_GRAIN < rows ? e * MM_TAIL_GRAIN : rows;
                out[n] = (struct tile){(uint32_t)(a * MM_TAIL_GRAIN), (uint32_t)r1};
            }
            n++;
            a = e;
        }
        j->n_tiles[i] = n - j->tile0[i];
        u0 += pu;
    }
    return n;
}

/* The job's tiles in task order (product by product): guided (above), or MM_TILE rows each
 * with the last MM_TAIL_TILES split into parts of whole MM_TAIL_GRAIN panels (until session
 * 24). Fills j->tile0 and j->n_tiles, and out (when not NULL); returns how many. */
static size_t lay_tiles(struct job *j, size_t k, struct tile *out)
{
    if (MM_GUIDED)
        return lay_tiles_guided(j, k, out);
    size_t whole = 0, n = 0;
    for (size_t i = 0; i < k; i++)
        whole += (j->g[i].w->rows + MM_TILE - 1) / MM_TILE;
    for (size_t i = 0, w = 0; i < k; i++) {
        const size_t rows = j->g[i].w->rows;
        j->tile0[i] = n;
        for (size_t r0 = 0; r0 < rows; r0 += MM_TILE, w++) {
            const size_t r1 = r0 + MM_TILE < rows ? r0 + MM_TILE : rows;
            const size_t parts = tail_parts(whole - 1 - w);
            size_t step = (r1 - r0 + parts - 1) / parts;
            step = (step + MM_TAIL_GRAIN - 1) / MM_TAIL_GRAIN * MM_TAIL_GRAIN;
            for (size_t a = r0; a < r1; a += step, n++)
                if (out)
                    out[n] = (struct tile){(uint32_t)a, (uint32_t)(a + step < r1 ? a + step : r1)};
        }
        j->n_tiles[i] = n - j->tile0[i];
    }
    return n;
}

/* Counts the tasks; fills j->tile0 and j->n_tiles. prepared: the inputs are ready (no PREP
 * task). */
static struct counts count_tasks(struct job *j, size_t k, size_t n, bool prepared)
{
    const struct lora_plan *p = j->p;
    struct counts c = {0, 0, 0};
    for (size_t a = 0; a < j->A.n && !prepared; a++)
        c.prep += j->A.bytes[a] ? (n + MM_PREP_TOK - 1) / MM_PREP_TOK : 0;
    c.tiles = lay_tiles(j, k, NULL);
    for (size_t i = 0; i < k; i++) {
        j->shrink_want[i] = 0;
        for (size_t si = 0; si < p->n_segs; si++)
            if (lora_weights(p->segs[si].ad, j->layer, j->g[i].t))
                j->shrink_want[i] +=
                    (p->segs[si].ad->cfg.rank + lora__shrink_kb(p->segs[si].ad) - 1) /
                    lora__shrink_kb(p->segs[si].ad);
        c.shrink += j->shrink_want[i];
    }
    return c;
}

/* Where the writer of the task list is. */
struct cursor {
    size_t nt;                  /* tasks written */
    size_t bi;                  /* base tasks written */
    double base_done, upd_done; /* their cost so far (weight elements; adapter bytes) */
    size_t base_p, base_t;      /* next base task: product, tile (of all, j->tiles) */
    size_t sh_s, sh_u;          /* next shrink: segment, unit (shrink_unit) */
    size_t sh_p;                /* ... and product (MM_SHRINK_BY_PROJECTION only) */
    double sh_target;           /* the current segment's bytes per SHRINK task */
    size_t n_shrink;            /* shrink units written */
};

/* Every input's PREP tasks, in order. */
static void push_preps(struct job *j, struct task *tasks, struct cursor *cu, size_t n)
{
    for (size_t a = 0; a < j->A.n; a++) {
        j->prep_total[a] = 0;
        if (!j->A.bytes[a])
            continue;
        for (size_t t0 = 0; t0 < n; t0 += MM_PREP_TOK) {
            tasks[cu->nt++] = (struct task){TK_PREP, (uint32_t)a, (uint32_t)t0,
                                            (uint32_t)(t0 + MM_PREP_TOK < n ? t0 + MM_PREP_TOK : n), 0};
            j->prep_total[a]++;
        }
    }
}

static void push_base(struct job *j, struct task *tasks, struct cursor *cu)
{
    const struct matmul_mat *w = j->g[cu->base_p].w;
    const size_t want = j->shrink_want[cu->base_p];
    const uint8_t merged = want && j->shrink_total[cu->base_p] == want;
    const struct tile *t = &j->tiles[cu->base_t];
    tasks[cu->nt++] =
        (struct task){TK_BASE, (uint32_t)cu->base_p, (uint32_t)cu->base_t, merged, 0};
    cu->base_done += (double)(t->r1 - t->r0) * (double)w->cols;
    cu->bi++;
    if (++cu->base_t == j->tile0[cu->base_p] + j->n_tiles[cu->base_p])
        cu->base_p++;
}

/* Bytes of unit (prod, k0) of an adapter's shrinks. */
static double unit_bytes(const struct job *j, const struct lora_adapter *ad, size_t prod,
                         size_t k0)
{
    const size_t kb = lora__shrink_kb(ad), r = ad->cfg.rank;
    const size_t rows = r - k0 < kb ? r - k0 : kb;
    return (double)rows * ad->in[j->g[prod].t] * lora__fast_elem_bytes(ad);
}

/* Bytes of segment seg's units [u0, u1) (u1 may pass its last). */
static double units_bytes(const struct job *j, size_t k, size_t seg, size_t u0, size_t u1)
{
    const struct lora_adapter *ad = j->p->segs[seg].ad;
    double total = 0;
    size_t prod, k0;
    for (size_t u = u0; u < u1 && shrink_unit(j, k, seg, u, &prod, &k0); u++)
        total += unit_bytes(j, ad, prod, k0);
    return total;
}

/* Sets cu->sh_target: the stretch of `total` bytes split into near-equal tasks of at most
 * about MM_SHRINK_BYTES. */
static void split_stretch(struct cursor *cu, double total)
{
    double parts = total / MM_SHRINK_BYTES;
    parts = parts > 1 ? (double)(size_t)(parts + 0.999) : 1;
    cu->sh_target = total / parts;
}

/* Writes a SHRINK task of the current segment's units from cu->sh_u (before u_end): about
 * cu->sh_target bytes of whole units, at least one. */
static void take_units(struct job *j, struct task *tasks, struct cursor *cu, size_t k,
                       size_t u_end)
{
    const struct lora_adapter *ad = j->p->segs[cu->sh_s].ad;
    const size_t u0 = cu->sh_u;
    size_t prod, k0;
    double bytes = 0;
    while (cu->sh_u < u_end && (cu->sh_u == u0 || bytes < cu->sh_target * 0.999) &&
           shrink_unit(j, k, cu->sh_s, cu->sh_u, &prod, &k0)) {
        const double b = unit_bytes(j, ad, prod, k0);
        j->shrink_total[prod]++;
        cu->n_shrink++;
        cu->upd_done += b;
        bytes += b;
        cu->sh_u++;
    }
    tasks[cu->nt++] = (struct task){TK_SHRINK, 0, (uint32_t)cu->sh_s, (uint32_t)u0,
                                    (uint32_t)cu->sh_u};
}

/* The next SHRINK task. Called only while units remain. By default segment-major: the
 * following units of the current segment, every projection of the job in turn (one stream
 * per adapter and job). With MM_SHRINK_BY_PROJECTION, projection-major as until session 13
 * (every segment's units of q, then of k, ...: a projection's shrinks end earlier in the job,
 * so more base tiles expand themselves), each (segment, projection) still one stretch. */
static void push_shrink(struct job *j, struct task *tasks, struct cursor *cu, size_t k)
{
    const struct lora_plan *p = j->p;
    size_t prod, k0;
    if (!MM_SHRINK_BY_PROJECTION) {
        while (!shrink_unit(j, k, cu->sh_s, cu->sh_u, &prod, &k0)) { /* the next segment */
            cu->sh_s++;
            cu->sh_u = 0;
            CHECK(cu->sh_s < p->n_segs);
        }
        if (cu->sh_u == 0)
            split_stretch(cu, units_bytes(j, k, cu->sh_s, 0, SIZE_MAX));
        take_units(j, tasks, cu, k, SIZE_MAX);
        return;
    }
    for (;;) { /* segment sh_s's units of product sh_p: [u0, u0 + per) */
        const struct lora_adapter *ad = p->segs[cu->sh_s].ad;
        const size_t kb = lora__shrink_kb(ad), per = (ad->cfg.rank + kb - 1) / kb;
        size_t u0 = 0;
        bool here = false;
        for (size_t i = 0; i <= cu->sh_p; i++)
            if (lora_weights(ad, j->layer, j->g[i].t)) {
                here = i == cu->sh_p;
                u0 += here ? 0 : per;
            }
        if (here && cu->sh_u <= u0) { /* entering it (a task takes one unit at least) */
            cu->sh_u = u0;
            split_stretch(cu, units_bytes(j, k, cu->sh_s, u0, u0 + per));
        }
        if (here && cu->sh_u < u0 + per) {
            take_units(j, tasks, cu, k, u0 + per);
            return;
        }
        cu->sh_u = 0;
        if (++cu->sh_s == p->n_segs) {
            cu->sh_s = 0;
            cu->sh_p++;
            CHECK(cu->sh_p < k);
        }
    }
}

/*
 * Base tiles with the shrinks between them: after each base task, shrinks while the update
 * is behind the base in proportion to their costs. The update's cost counts its expands too
 * (they run with the tiles), so the shrinks end where the update's shrink share of the job
 * does, and the tiles after that are merged.
 */
static void push_interleaved(struct job *j, struct task *tasks, struct cursor *cu, size_t k,
                             const struct counts *c)
{
    const struct lora_plan *p = j->p;
    double base_cost = 0, upd_cost = 0; /* weight elements; adapter bytes */
    for (size_t i = 0; i < k; i++) {
        const struct matmul_prod *g = &j->g[i];
        base_cost += (double)g->w->rows * (double)g->w->cols;
        for (size_t si = 0; si < p->n_segs; si++) {
            const struct lora_adapter *ad = p->segs[si].ad;
            if (lora_weights(ad, j->layer, g->t))
                upd_cost += (double)ad->cfg.rank * (ad->in[g->t] + ad->out[g->t]) *
                            lora__fast_elem_bytes(ad);
        }
    }
    /* rank <= MM_SHRINK_FIRST_RANK: the shrinks are a few KB each; all of them first makes
     * every base tile merged, its expand on the rows still in its core's cache */
    if (p->max_rank <= MM_SHRINK_FIRST_RANK)
        while (cu->n_shrink < c->shrink)
            push_shrink(j, tasks, cu, k);
    /* the PREP tasks' participant runs alone until they are done and the base tiles wait for
     * them; the shrinks read x as it is, so the other participant runs those meanwhile */
    while (c->prep && cu->n_shrink < c->shrink && cu->upd_done < MM_PREP_COVER * c->prep)
        push_shrink(j, tasks, cu, k);
    while (cu->bi < c->tiles || cu->n_shrink < c->shrink) {
        if (cu->bi < c->tiles)
            push_base(j, tasks, cu);
        while (cu->n_shrink < c->shrink &&
               (cu->bi == c->tiles || cu->upd_done * base_cost <= cu->base_done * upd_cost))
            push_shrink(j, tasks, cu, k);
    }
}

/* The fused job; -ENOMEM (nothing computed) when the scratch cannot grow. prepared: the
 * group's inputs, already prepared in mc's act_ scratch (matmul_group_begin): the job has no
 * PREP task and leaves act_ alone; NULL: it plans and prepares them itself. */
static int fused(struct matmul_ctx *mc, const struct matmul_prod *g, size_t k,
                 const struct lora_plan *p, uint32_t layer, float *tmp,
                 const struct matmul__acts *prepared)
{
    const size_t n = g[0].n;
    for (size_t i = 0; i < k; i++)
        CHECK(g[i].n == n && (p->n_segs == 0 || n == p->n_tok));
    if (n == 0)
        return 0;
    struct job j;
    j.p = p;
    j.layer = layer;
    j.g = g;
    j.n_prod = k;
    j.tmp = tmp;
    j.prefetch = MM_PREFETCH && p->max_rank >= MM_PREFETCH_MIN_RANK;
    j.n_part = mc->pool ? (size_t)pool_threads(mc->pool) : 1;
    if (prepared) {
        j.A = *prepared;
        /* the adapters' forms were made for this plan, layer and group (matmul.h) */
        CHECK(!j.A.lx_plan || (j.A.lx_plan == p && j.A.lx_layer == layer && j.A.lx_k == k));
    }
    else
        matmul__acts_plan(&j.A, g, k, 0); /* the fused LoRA job keeps the int8 products */
    const struct counts c = count_tasks(&j, k, n, prepared != NULL);
    const size_t n_tasks = c.prep + c.shrink + c.tiles; /* at most */
    const size_t flag_off = (n_tasks * sizeof(struct task) + 63) / 64 * 64;
    /* the int8 segments' u codes after the tile counters: [k][n][ldu] codes, [k][n] us, usum */
    bool any_i8 = false;
    for (size_t si = 0; si < p->n_segs; si++)
        any_i8 |= p->segs[si].ad->fast_dt == LORA_DT_I8;
    j.n_tok = n;
    j.ldu = KERN_LORA_I8_LDU(p->max_rank);
    const size_t tiles_off = (flag_off + c.tiles * sizeof(atomic_uint) + 63) / 64 * 64;
    const size_t uq_off = (tiles_off + c.tiles * sizeof(struct tile) + 63) / 64 * 64;
    const size_t uq_bytes = any_i8 ? k * n * (j.ldu + sizeof(float) + sizeof(int32_t)) : 0;
    if ((!prepared && !matmul__grow(&mc->act_, &mc->act_cap_, j.A.total ? j.A.total : 64)) ||
        !matmul__grow(&mc->tasks_, &mc->tasks_cap_, uq_off + uq_bytes))
        return -ENOMEM;
    j.uq = NULL;
    j.us = NULL;
    j.usum = NULL;
    if (any_i8) {
        j.uq = (int8_t *)((unsigned char *)mc->tasks_ + uq_off);
        j.us = (float *)(j.uq + k * n * j.ldu); /* ldu a multiple of 16: aligned */
        j.usum = (int32_t *)(j.us + k * n);
    }
    struct task *tasks = mc->tasks_;
    j.tasks = tasks;
    j.tile_done = (atomic_uint *)((unsigned char *)mc->tasks_ + flag_off);
    for (size_t i = 0; i < c.tiles; i++)
        atomic_init(&j.tile_done[i], 0);
    j.tiles = (struct tile *)((unsigned char *)mc->tasks_ + tiles_off);
    CHECK(lay_tiles(&j, k, j.tiles) == c.tiles);
    if (!prepared)
        matmul__acts_init(&j.A, g, mc->act_);
    for (size_t a = 0; a < j.A.n; a++)
        atomic_init(&j.prep_done[a], 0);
    for (size_t i = 0; i < k; i++) {
        j.shrink_total[i] = 0;
        atomic_init(&j.shrink_done[i], 0);
    }

    struct cursor cu;
    memset(&cu, 0, sizeof cu);
    if (prepared)
        for (size_t a = 0; a < j.A.n; a++)
            j.prep_total[a] = 0;
    else
        push_preps(&j, tasks, &cu, n);
    push_interleaved(&j, tasks, &cu, k, &c);
    CHECK(cu.nt <= n_tasks);
    j.n_tasks = cu.nt;
    if (j.prefetch)
        for (size_t i = 0; i < MM_LOOKAHEAD; i++)
            prefetch_if_shrink(&j, i);
    const uint64_t t0 = cyc_start();
    if (mc->pool)
        pool_run(mc->pool, run_task, &j, cu.nt);
    else
        for (size_t i = 0; i < cu.nt; i++)
            run_task(&j, i, 0);
    cyc_add(MATMUL_CYC_JOB, t0, j.n_part);
    return 0;
}

bool matmul_lora_adapts(const struct lora_plan *p, uint32_t layer, const struct matmul_prod *g,
                        size_t k)
{
    for (size_t si = 0; si < p->n_segs; si++)
        for (size_t i = 0; i < k; i++)
            if (lora_weights(p->segs[si].ad, layer, g[i].t))
                return true;
    return false;
}

/* matmul_group_lora (A NULL) and matmul_group_lora_end (A: the inputs the caller prepared). */
static int group_lora(struct matmul_ctx *c, const struct matmul_prod *g, size_t k,
                      const struct lora_plan *p, uint32_t layer, float *tmp,
                      const struct matmul__acts *A)
{
    CHECK(k >= 1 && k <= MATMUL_LORA_GROUP_MAX);
    /* a group no segment adapts in this layer (o, gate/up, down under q,v adapters) is the
     * base products alone: matmul_group's shards, not the fused job's tiles
     * and PREP tasks (session 21: the fused job on every group of an adapted step was most
     * of the overhead beyond the floor at q,v) */
    const bool adapted = matmul_lora_adapts(p, layer, g, k);
    if (adapted || c->base_one_job) {
        if (fused(c, g, k, p, layer, tmp, A) == 0)
            return 0;
        /* the same numbers from the separate jobs */
        static _Thread_local int warned;
        if (!warned++)
            LOG_WARN("matmul: no memory for the fused LoRA job's scratch: running the base "
                     "products and the update as separate jobs");
    }
    if (A)
        matmul__group_prepared(c, g, k, A);
    else
        matmul_group(c, g, k);
    if (!adapted)
        return c->base_one_job ? -ENOMEM : 0; /* -ENOMEM: the fused job could not run */
    struct lora_proj pr[MATMUL_LORA_GROUP_MAX];
    for (size_t i = 0; i < k; i++)
        pr[i] = (struct lora_proj){g[i].t, g[i].x, g[i].y, g[i].ldy};
    lora_apply_fused(p, c->pool, layer, pr, k, tmp);
    return -ENOMEM;
}

int matmul_group_lora(struct matmul_ctx *c, const struct matmul_prod *g, size_t k,
                      const struct lora_plan *p, uint32_t layer, float *tmp)
{
    return group_lora(c, g, k, p, layer, tmp, NULL);
}

int matmul_group_lora_end(struct matmul_ctx *c, const struct matmul_prod *g, size_t k,
                          const struct lora_plan *p, uint32_t layer, float *tmp)
{
    return group_lora(c, g, k, p, layer, tmp, matmul__prep_take(c));
}
