/*
 * attn_bench — the attention kernels (kern.h, kernels/attn.c) per ISA against their _ref twin
 * and against the inline code they replace (worker/model/forward.c's attend_head before the swap:
 * one query head at a time, a score row, libm expf), on one KV head of a TinyLlama-shaped
 * layer (head_dim 64, 8 query heads per KV head):
 *   decode  — the 8 query rows of one KV head over 512 / 2048 / 4096 cached positions
 *             (kern_attn_causal with one token: the tile kernel over 64-position tiles);
 *   paged   — the same decode as the paged cache runs it (worker/engine/kv_attn.c):
 *             kern_attn over 16-position block spans, begin/end around them; also over
 *             8-bit KV head rows (int8, fp8: kern_kv8_quant of the same values);
 *   paged1  — paged with one query row per KV head (a model without GQA: the decode
 *             attention's one-row path, docs/PERFORMANCE.md "Decode attention at 8k");
 *   prefill — 512 tokens x 8 heads causal from position 0 (kern_attn_causal);
 *   walk    — the paged decode as kv_attn.c runs it since session 20: kern_attn_blocks over
 *             the blocks of an arena laid out as the paged cache's (per block 16 K rows then
 *             16 V rows of NKV heads; the same values as "paged"), the walk, its state and
 *             prefetch inside the kernel; walk1 with one query row;
 *   pprefill — the same prefill as the paged cache runs it (kv_attn.c's kv_attn_prefill, the
 *             engine's and engine_bench's path): 64 query rows (8 tokens x 8 heads) at a time,
 *             each batch walking 16-position block spans up to its last token, per-row
 *             causal limits in the span that holds the diagonal.
 * K/V rows are strided as in a cache row of 4 KV heads. The "inline" column exists for f32
 * only (the inline code read f32 rows). Time per call in microseconds of the thread's own CPU
 * time (CLOCK_THREAD_CPUTIME_ID: time spent descheduled by other processes on a shared
 * machine is not counted; cache sharing still is); one thread. GMAC/s: multiply-adds of q.k
 * and w v (2 x rows x positions seen x head_dim) per second of the best ISA column. Each
 * row ends with the CPU share other processes used meanwhile (bench_load_end).
 *
 *   usage: attn_bench [--quick] [--only SUBSTRING]   (SUBSTRING of "case kv", e.g. "paged")
 */
#include "bench_util.h"
#include "half.h"
#include "rng.h"
#include "kern.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HD 64
#define GROUP 8
#define NKV 4

static double g_min_time = 0.4;

/* worker/model/forward.c's attend_head before the swap, verbatim in behaviour (f32 rows). */
static void inline_head(const float *q, const float *key, const float *value, size_t stride,
                        size_t n_ctx, size_t hd, float *score, float *out)
{
    const float scale = 1.0f / sqrtf((float)hd);
    float max = -INFINITY;
    for (size_t p = 0; p < n_ctx; p++) {
        const float *k = key + p * stride;
        float s = 0.0f;
        for (size_t i = 0; i < hd; i++)
            s += q[i] * k[i];
        score[p] = s * scale;
        if (score[p] > max)
            max = score[p];
    }
    float sum = 0.0f;
    for (size_t p = 0; p < n_ctx; p++) {
        score[p] = expf(score[p] - max);
        sum += score[p];
    }
    const float inv = 1.0f / sum;
    memset(out, 0, hd * sizeof *out);
    for (size_t p = 0; p < n_ctx; p++) {
        const float *v = value + p * stride;
        const float w = score[p] * inv;
        for (size_t i = 0; i < hd; i++)
            out[i] += w * v[i];
    }
}

#define SPAN 16 /* the paged cache's default block_tokens */

struct job {
    enum dtype kvt;
    int use_inline;
    int paged;         /* kern_attn over SPAN-position spans (decode nt = 1, or prefill) */
    const void *arena; /* walk: [blocks][K, V][SPAN][ld] the same rows, or NULL */
    size_t rows;       /* paged: query rows per KV head (GROUP, or 1 without GQA) */
    size_t pos0, nt;   /* tokens [pos0, pos0+nt) attend causally */
    const void *k, *v; /* [pos0+nt][NKV][HD] of kvt */
    size_t ld;         /* bytes per position */
    float *q, *o;      /* [nt][GROUP][HD] */
    float *score;      /* [pos0+nt] */
};

/* One decode of the GROUP rows as kv_attn.c walks the paged cache: block spans of SPAN. */
static void run_paged(const struct job *j)
{
    const float *qr[GROUP];
    float *orow[GROUP], m[GROUP], l[GROUP];
    for (size_t h = 0; h < GROUP; h++) {
        qr[h] = j->q + h * HD;
        orow[h] = j->o + h * HD;
    }
    const size_t n = j->pos0 + 1;
    kern_attn_begin(orow, m, l, j->rows, HD);
    for (size_t p = 0; p < n; p += SPAN)
        kern_attn(j->kvt, qr, orow, m, l, NULL, j->rows, (const char *)j->k + p * j->ld,
                  (const char *)j->v + p * j->ld, j->ld, n - p < SPAN ? n - p : SPAN, HD,
                  1.0f / sqrtf((float)HD));
    kern_attn_end(orow, l, j->rows, HD);
}

/* A prefill of nt tokens from pos0 as kv_attn.c's kv_attn_prefill walks the paged cache:
 * query-major batches of QROWS rows (token i, head h), each over SPAN-position spans up to its
 * last token, vis NULL where every row sees the whole span. */
#define QROWS 64
static void run_paged_prefill(const struct job *j)
{
    const float *qr[QROWS];
    float *orow[QROWS], m[QROWS], l[QROWS];
    uint32_t lim[QROWS], vis[QROWS];
    const size_t rows = j->nt * GROUP;
    const float scale = 1.0f / sqrtf((float)HD);
    for (size_t r0 = 0; r0 < rows; r0 += QROWS) {
        const size_t nr = rows - r0 < QROWS ? rows - r0 : QROWS;
        uint32_t end = 0;
        for (size_t r = 0; r < nr; r++) {
            const size_t t = (r0 + r) / GROUP, h = (r0 + r) % GROUP;
            qr[r] = j->q + (t * GROUP + h) * HD;
            orow[r] = j->o + (t * GROUP + h) * HD;
            lim[r] = (uint32_t)(j->pos0 + t + 1);
            end = lim[r] > end ? lim[r] : end;
        }
        kern_attn_begin(orow, m, l, nr, HD);
        for (uint32_t p = 0; p < end; p += SPAN) {
            const size_t n = end - p < SPAN ? end - p : SPAN;
            int all = 1;
            for (size_t r = 0; r < nr; r++) {
                vis[r] = lim[r] > p ? lim[r] - p : 0;
                all &= vis[r] >= n;
            }
            kern_attn(j->kvt, qr, orow, m, l, all ? NULL : vis, nr,
                      (const char *)j->k + p * j->ld, (const char *)j->v + p * j->ld, j->ld, n,
                      HD, scale);
        }
        kern_attn_end(orow, l, nr, HD);
    }
}

/* The same decode through kern_attn_blocks over the arena's blocks. */
static void run_walk(const struct job *j)
{
    const float *qr[GROUP];
    float *orow[GROUP], m[GROUP], l[GROUP];
    const void *kb[4096 / SPAN];
    for (size_t h = 0; h < GROUP; h++) {
        qr[h] = j->q + h * HD;
        orow[h] = j->o + h * HD;
    }
    const size_t n = j->pos0 + 1, nb = (n + SPAN - 1) / SPAN;
    for (size_t b = 0; b < nb; b++)
        kb[b] = (const char *)j->arena + b * 2 * SPAN * j->ld;
    kern_attn_begin(orow, m, l, j->rows, HD);
    kern_attn_blocks(j->kvt, qr, orow, m, l, j->rows, kb, SPAN * j->ld, j->ld, SPAN, n, HD,
                     1.0f / sqrtf((float)HD));
    kern_attn_end(orow, l, j->rows, HD);
}

static void run(const struct job *j)
{
    if (j->arena) {
        run_walk(j);
        return;
    }
    if (j->paged && j->nt > 1) {
        run_paged_prefill(j);
        return;
    }
    if (j->paged) {
        run_paged(j);
        return;
    }
    if (!j->use_inline) {
        kern_attn_causal(j->kvt, j->nt, GROUP, HD, j->q, GROUP * HD, j->k, j->v, j->ld,
                         (uint32_t)j->pos0, j->o, GROUP * HD);
        return;
    }
    for (size_t t = 0; t < j->nt; t++)
        for (size_t h = 0; h < GROUP; h++)
            inline_head(j->q + (t * GROUP + h) * HD, j->k, j->v, NKV * HD, j->pos0 + t + 1, HD,
                        j->score, j->o + (t * GROUP + h) * HD);
}

/* This thread's CPU seconds (descheduled time excluded). */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Microseconds of CPU per call, averaged over as many calls as fit in g_min_time (best of 3). */
static double time_us(const struct job *j)
{
    double best = INFINITY;
    for (int rep = 0; rep < 3; rep++) {
        size_t calls = 0;
        double t0 = cpu_now(), t;
        do {
            run(j);
            calls++;
            t = cpu_now();
        } while (t - t0 < g_min_time / 3);
        double us = (t - t0) * 1e6 / (double)calls;
        if (us < best)
            best = us;
    }
    return best;
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--quick") == 0) {
            g_min_time = 0.06;
        } else if (strcmp(argv[a], "--only") == 0 && a + 1 < argc) {
            only = argv[++a];
        } else {
            fprintf(stderr, "usage: attn_bench [--quick] [--only SUBSTRING]\n");
            return 2;
        }
    }
    if (kern_init())
        return 1;
    const enum kern_isa best = kern_isa();
    const size_t maxpos = 4096;
    const size_t nel = maxpos * NKV * HD;
    float *kf = malloc(nel * sizeof *kf), *vf = malloc(nel * sizeof *vf);
    uint16_t *kh = malloc(maxpos * NKV * HD * 2), *vh = malloc(maxpos * NKV * HD * 2);
    uint16_t *kb = malloc(maxpos * NKV * HD * 2), *vb = malloc(maxpos * NKV * HD * 2);
    float *q = malloc(512 * GROUP * HD * sizeof *q), *o = malloc(512 * GROUP * HD * sizeof *o);
    float *score = malloc(maxpos * sizeof *score);
    const size_t hb = kern_kv8_head_bytes(HD); /* 8-bit head row: HD codes and a scale */
    unsigned char *k8[2], *v8[2];               /* [maxpos][NKV][hb] int8, fp8 */
    for (int t = 0; t < 2; t++) {
        k8[t] = malloc(maxpos * NKV * hb);
        v8[t] = malloc(maxpos * NKV * hb);
    }
    if (!kf || !vf || !kh || !vh || !kb || !vb || !q || !o || !score || !k8[0] || !v8[0] ||
        !k8[1] || !v8[1]) {
        fprintf(stderr, "attn_bench: out of memory\n");
        return 1;
    }
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < maxpos * NKV * HD; i++) {
        rng_xorshift64(&s);
        kf[i] = (float)((s >> 40) & 0xffff) / 32768.0f - 1.0f;
        vf[i] = (float)((s >> 20) & 0xffff) / 32768.0f - 1.0f;
        kh[i] = half_f32_to_f16(kf[i]);
        vh[i] = half_f32_to_f16(vf[i]);
        kb[i] = half_f32_to_bf16(kf[i]);
        vb[i] = half_f32_to_bf16(vf[i]);
    }
    for (size_t r = 0; r < maxpos * NKV; r++)
        for (int t = 0; t < 2; t++) {
            kern_kv8_quant(t ? DT_KV_E4M3 : DT_KV_I8, kf + r * HD, k8[t] + r * hb, HD);
            kern_kv8_quant(t ? DT_KV_E4M3 : DT_KV_I8, vf + r * HD, v8[t] + r * hb, HD);
        }
    for (size_t i = 0; i < 512 * GROUP * HD; i++)
        q[i] = (float)((i * 2654435761u) % 1000) / 250.0f - 2.0f;

    static const struct {
        const char *name;
        size_t pos0, nt;
        int paged; /* 0, or the query rows per KV head of a paged decode (per token) */
        int walk;  /* the paged decode through kern_attn_blocks */
    } cases[] = {{"decode 512", 511, 1, 0, 0},        {"decode 2048", 2047, 1, 0, 0},
                 {"decode 4096", 4095, 1, 0, 0},      {"paged 4096", 4095, 1, GROUP, 0},
                 {"walk 4096", 4095, 1, GROUP, 1},    {"paged1 4096", 4095, 1, 1, 0},
                 {"walk1 4096", 4095, 1, 1, 1},       {"prefill 512", 0, 512, 0, 0},
                 {"pprefill 512", 0, 512, GROUP, 0}};
    printf("attention, one KV head: head_dim %d, %d query heads per KV head; us per call\n", HD,
           GROUP);
    printf("%-12s %-4s %9s %9s %9s %9s | %8s %8s | %8s %8s | %6s %6s | %5s\n", "case", "kv",
           "inline", "ref", "avx2", "avx512", "2 vs ref", "512/ref", "2 vs inl", "512/inl",
           "GMAC/s", "2 GMAC", "load");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int t = 0; t < 5; t++) {
            static const enum dtype kvts[5] = {DT_F32, DT_F16, DT_BF16, DT_KV_I8, DT_KV_E4M3};
            const enum dtype kvt = kvts[t];
            if (t >= 3 && (!cases[c].paged || cases[c].nt > 1))
                continue; /* 8-bit rows: as the paged cache reads them */
            const void *kc = t == 0 ? (const void *)kf : t == 1 ? (const void *)kh
                             : t == 2 ? (const void *)kb : (const void *)k8[t - 3];
            const void *vc = t == 0 ? (const void *)vf : t == 1 ? (const void *)vh
                             : t == 2 ? (const void *)vb : (const void *)v8[t - 3];
            const size_t ld = t == 0 ? NKV * HD * 4u : t < 3 ? NKV * HD * 2u : NKV * hb;
            char label[48];
            snprintf(label, sizeof label, "%s %s", cases[c].name,
                     t < 3 ? dtype_info(kvt)->name : dtype_kv_name(kvt));
            if (only && !strstr(label, only))
                continue;
            unsigned char *arena = NULL; /* walk: the rows in the paged cache's layout */
            if (cases[c].walk) {
                arena = malloc(maxpos * 2 * ld);
                if (!arena) {
                    fprintf(stderr, "attn_bench: out of memory\n");
                    return 1;
                }
                for (size_t p = 0; p < maxpos; p++) {
                    const size_t b = p / SPAN, r = p % SPAN;
                    memcpy(arena + (b * 2 * SPAN + r) * ld, (const char *)kc + p * ld, ld);
                    memcpy(arena + (b * 2 * SPAN + SPAN + r) * ld, (const char *)vc + p * ld, ld);
                }
            }
            struct job j = {kvt,          0,   cases[c].paged != 0, arena, (size_t)cases[c].paged,
                            cases[c].pos0, cases[c].nt, kc, vc, ld, q, o, score};
            struct bench_load ldg;
            bench_load_begin(&ldg);
            double us[4] = {NAN, NAN, NAN, NAN}; /* inline, ref, avx2, avx512 */
            if (t == 0 && !cases[c].paged) {
                j.use_inline = 1;
                us[0] = time_us(&j);
                j.use_inline = 0;
            }
            for (int isa = 0; isa < 3; isa++)
                if (kern_isa_supported((enum kern_isa)isa) && !kern_force_isa((enum kern_isa)isa))
                    us[1 + isa] = time_us(&j);
            double load = bench_load_end(&ldg);
            /* positions seen summed over the tokens: (pos0+1) + ... + (pos0+nt) */
            const double seen = (double)cases[c].nt * (double)cases[c].pos0 +
                                (double)cases[c].nt * (double)(cases[c].nt + 1) / 2.0;
            const double mac = 2.0 * (cases[c].paged ? cases[c].paged : GROUP) * seen * HD;
            printf("%-12s %-4s %9.1f %9.1f %9.1f %9.1f | %8.1f %8.1f | %8.1f %8.1f | %6.1f %6.1f "
                   "| %4.0f%%\n",
                   cases[c].name, t < 3 ? dtype_info(kvt)->name : dtype_kv_name(kvt), us[0],
                   us[1], us[2], us[3], us[1] / us[2], us[1] / us[3], us[0] / us[2],
                   us[0] / us[3], mac / us[3] * 1e-3, mac / us[2] * 1e-3, load * 100);
            free(arena);
        }
    kern_force_isa(best);
    free(kf), free(vf), free(kh), free(vh), free(kb), free(vb), free(q), free(o), free(score);
    for (int t = 0; t < 2; t++)
        free(k8[t]), free(v8[t]);
    return 0;
}
