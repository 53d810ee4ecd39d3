/*
 * lora_kern_bench.c — the LoRA update's kernels alone, bf16 against int8 serving copies
 * (docs/PERFORMANCE.md "LoRA at its byte floor"): one decode step's worth of work for
 * 4 distinct adapters (2 tokens each) on the seven TinyLlama-1.1B projections of 22 layers,
 * at rank R (argv[1], default 32), on the calling thread. The two packings alternate within
 * each of 7 repetitions and are timed in thread CPU time (the machine is shared: wall time
 * measures the neighbours). The weights are synthetic (their values do not change the work)
 * and 4 x 22 x 7 blocks of them, 25-200 MB, far larger than the caches, as in a step.
 * Prints one line: bytes per step, best and mean ms of each, the int8 / bf16 time ratios
 * (and a second for bf16x, below).
 *
 * `lora_kern_bench RANK streams` (session 14) times the shrinks alone, two ways alternating
 * within each repetition, in one packing (bf16, then int8):
 *   blocks:  each (adapter, layer, projection)'s A in its own allocation, called as the
 *            fused job's tasks were until session 13: per job (q k v; o; gate up; down),
 *            projection-major, 8 rank rows a call (32 on int8, each call quantizing x);
 *   streams: each (adapter, layer)'s A blocks back to back in one allocation (lora_pack.c's
 *            layout), per job adapter-major, one call per projection over the whole rank
 *            (int8: x quantized once per job, kern_lora_shrink_i8q).
 * Same kernels, same bytes: the difference is the streams' length and the call pattern.
 *
 * The bf16 shrink on x rounded once (kern_lora_bf16_x + kern_lora_shrink_bf16x, session 15;
 * what the fused job runs where kern_lora_shrink_rounds_x(DT_BF16, R)) is timed beside the
 * others (session 16), as a third variant in both modes:
 *   default: bf16x: per (layer, job, adapter) x rounded once, then each projection's shrink
 *            on it and its expand (the engine's order: q, k and v share the rounding);
 *   streams: bf16 streams-x: the streams' layout and order with x rounded once per (adapter,
 *            job) (the int8 streams quantize x once per job the same way).
 * On a CPU without AVX512-BF16 these run the scalar twins (the engine does not take them
 * there): the line says "(not the engine's path here)".
 */
#include "half.h"
#include "kern.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NA 4  /* distinct adapters */
#define NL 22 /* layers */
#define NP 7  /* projections */
#define REPS 7

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *alloc_or_die(size_t bytes)
{
    void *p = malloc(bytes);
    if (!p) {
        fprintf(stderr, "lora_kern_bench: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* q, k, v, o, gate, up, down: [out][in] */
static const size_t ins[NP] = {2048, 2048, 2048, 2048, 2048, 2048, 5632};
static const size_t outs[NP] = {2048, 256, 256, 2048, 5632, 5632, 2048};
static const int job_end[4] = {3, 4, 6, 7}; /* the projections of one fused job */

/* The shrinks of one step, blocks against streams (see the top); returns 0. */
static int bench_streams(size_t R)
{
    static void *blk[2][NA][NL][NP];     /* [int8][adapter][layer][proj] */
    static unsigned char *str[2][NA][NL]; /* the same blocks back to back */
    static size_t off[2][NP];             /* a block's offset in its stream */
    size_t bytes[2] = {0, 0};
    for (int w8 = 0; w8 < 2; w8++) {
        size_t o = 0;
        for (int p = 0; p < NP; p++) {
            off[w8][p] = o;
            o += ((w8 ? KERN_LORA_I8_HDR(R) + R * ins[p] : R * ins[p] * 2) + 63) / 64 * 64;
        }
        for (int a = 0; a < NA; a++)
            for (int l = 0; l < NL; l++) {
                str[w8][a][l] = alloc_or_die(o);
                memset(str[w8][a][l], 0x11, o);
                for (int p = 0; p < NP; p++) {
                    size_t n = (p + 1 < NP ? off[w8][p + 1] : o) - off[w8][p];
                    blk[w8][a][l][p] = alloc_or_die(n);
                    memset(blk[w8][a][l][p], 0x11, n);
                    if (w8) /* scales */
                        for (size_t k = 0; k < R; k++) {
                            ((float *)blk[1][a][l][p])[k] = 1e-3f;
                            ((float *)(str[1][a][l] + off[1][p]))[k] = 1e-3f;
                        }
                }
                bytes[w8] += o;
            }
    }
    float *x = alloc_or_die(2 * 5632 * sizeof(float));
    for (int i = 0; i < 2 * 5632; i++)
        x[i] = (float)((i * 2654435761u) >> 16) * 3e-5f - 1.0f;
    float t[2 * KERN_LORA_RANK_MAX];
    static int8_t qx[2 * KERN_LORA_I8_LDX(5632)];
    static _Alignas(64) uint16_t xb[2 * KERN_LORA_BF16_LDX(5632)];
    float xs[2];
    int32_t xsum[2];
    const int engine_x = kern_lora_shrink_rounds_x(DT_BF16, R);
    for (int w8 = 0; w8 < 2; w8++) {
        const size_t kb = w8 ? 32 : 8;
        const int nv = w8 ? 2 : 3; /* bf16: blocks, streams, streams-x */
        double best[3] = {1e30, 1e30, 1e30}, sum[3] = {0, 0, 0};
        for (int r = 0; r < REPS; r++)
            for (int v = 0; v < nv; v++) {
                const int st = (v + r) % nv; /* rotate which goes first */
                double t0 = cpu_now();
                for (int l = 0; l < NL; l++)
                    for (int j = 0, p0 = 0; j < 4; p0 = job_end[j++]) {
                        if (!st) {
                            for (int p = p0; p < job_end[j]; p++)
                                for (int a = 0; a < NA; a++)
                                    for (size_t k = 0; k < R; k += kb) {
                                        size_t k1 = k + kb < R ? k + kb : R;
                                        if (w8)
                                            kern_lora_shrink_i8(blk[1][a][l][p], ins[p], R, x,
                                                                2, t, k, k1);
                                        else
                                            kern_lora_shrink(DT_BF16, blk[0][a][l][p], ins[p],
                                                             R, x, 2, t, k, k1);
                                    }
                            continue;
                        }
                        for (int a = 0; a < NA; a++) {
                            if (w8) /* the job's projections share x */
                                kern_lora_i8_quant_x(x, ins[p0], 2, qx, xs, xsum);
                            else if (st == 2)
                                kern_lora_bf16_x(x, ins[p0], 2, xb);
                            for (int p = p0; p < job_end[j]; p++) {
                                const void *ap = str[w8][a][l] + off[w8][p];
                                if (w8)
                                    kern_lora_shrink_i8q(ap, ins[p], R, qx, xs, xsum, 2, t, 0, R);
                                else if (st == 2)
                                    kern_lora_shrink_bf16x(ap, ins[p], R, xb, 2, t, 0, R);
                                else
                                    kern_lora_shrink(DT_BF16, ap, ins[p], R, x, 2, t, 0, R);
                            }
                        }
                    }
                double d = cpu_now() - t0;
                sum[st] += d;
                best[st] = d < best[st] ? d : best[st];
            }
        printf("rank %zu %s shrinks (%s): %.1f MB/step | blocks best %.2f ms (%.1f GB/s), mean "
               "%.2f | streams best %.2f ms (%.1f GB/s), mean %.2f | streams / blocks: best "
               "%.2f, mean %.2f\n",
               R, w8 ? "int8" : "bf16", kern_isa_name(kern_isa()), (double)bytes[w8] / 1e6,
               best[0] * 1e3, (double)bytes[w8] / best[0] / 1e9, sum[0] / REPS * 1e3,
               best[1] * 1e3, (double)bytes[w8] / best[1] / 1e9, sum[1] / REPS * 1e3,
               best[1] / best[0], sum[1] / sum[0]);
        if (!w8)
            printf("rank %zu bf16 shrinks, x rounded once per job%s: streams-x best %.2f ms "
                   "(%.1f GB/s), mean %.2f | streams-x / streams: best %.2f, mean %.2f\n",
                   R, engine_x ? "" : " (not the engine's path here)", best[2] * 1e3,
                   (double)bytes[0] / best[2] / 1e9, sum[2] / REPS * 1e3, best[2] / best[1],
                   sum[2] / sum[1]);
    }
    return 0;
}

int main(int argc, char **argv)
{
    const size_t R = argc > 1 ? strtoul(argv[1], NULL, 10) : 32;
    if (R < 1 || R > KERN_LORA_RANK_MAX) {
        fprintf(stderr, "usage: lora_kern_bench [RANK 1..%u [streams]]\n", KERN_LORA_RANK_MAX);
        return 2;
    }
    if (kern_init() != 0)
        return 1;
    if (argc > 2 && strcmp(argv[2], "streams") == 0)
        return bench_streams(R);
    static void *a16[NA][NL][NP], *b16[NA][NL][NP], *a8[NA][NL][NP], *b8[NA][NL][NP];
    size_t by16 = 0, by8 = 0;
    uint32_t seed = 1;
    for (int a = 0; a < NA; a++)
        for (int l = 0; l < NL; l++)
            for (int p = 0; p < NP; p++) {
                size_t in = ins[p], pan = (outs[p] + 31) / 32, hdr = KERN_LORA_I8_HDR(R);
                size_t na16 = R * in * 2, nb16 = pan * 32 * R * 2;
                size_t na8 = R * in, nb8 = pan * ((R + 3) / 4) * 128;
                a16[a][l][p] = alloc_or_die(na16);
                b16[a][l][p] = alloc_or_die(nb16);
                a8[a][l][p] = alloc_or_die(hdr + na8);
                b8[a][l][p] = alloc_or_die(hdr + nb8);
                uint16_t *w = a16[a][l][p];
                for (size_t i = 0; i < na16 / 2; i++, seed = seed * 1664525u + 1013904223u)
                    w[i] = half_f32_to_bf16((float)(seed >> 16) * 1e-7f - 3e-3f);
                w = b16[a][l][p];
                for (size_t i = 0; i < nb16 / 2; i++, seed = seed * 1664525u + 1013904223u)
                    w[i] = half_f32_to_bf16((float)(seed >> 16) * 1e-7f - 3e-3f);
                float *sa = a8[a][l][p], *sb = b8[a][l][p];
                for (size_t k = 0; k < R; k++)
                    sa[k] = sb[k] = 1e-3f;
                memset((char *)a8[a][l][p] + hdr, 77, na8);
                memset((char *)b8[a][l][p] + hdr, 99, nb8);
                by16 += na16 + nb16;
                by8 += hdr + na8 + hdr + nb8;
            }
    float *x = alloc_or_die(2 * 5632 * sizeof(float)), *y = calloc(2 * 5632, sizeof(float));
    float t[2 * KERN_LORA_RANK_MAX], sc[2] = {1.0f, 0.5f};
    if (!y)
        return 1;
    for (int i = 0; i < 2 * 5632; i++, seed = seed * 1664525u + 1013904223u)
        x[i] = (float)(seed >> 16) * 3e-5f - 1.0f;
    static _Alignas(64) uint16_t xb[2 * KERN_LORA_BF16_LDX(5632)];
    const int engine_x = kern_lora_shrink_rounds_x(DT_BF16, R);
    double best[3] = {1e30, 1e30, 1e30}, sum[3] = {0, 0, 0};
    for (int r = 0; r < REPS; r++)
        for (int v = 0; v < 3; v++) {
            const int w8 = (v + r) % 3; /* rotate which goes first; 2: bf16x */
            double t0 = cpu_now();
            if (w8 == 2) { /* per (layer, job, adapter): x rounded once for the job */
                for (int l = 0; l < NL; l++)
                    for (int j = 0, p0 = 0; j < 4; p0 = job_end[j++])
                        for (int a = 0; a < NA; a++) {
                            kern_lora_bf16_x(x, ins[p0], 2, xb);
                            for (int p = p0; p < job_end[j]; p++) {
                                kern_lora_shrink_bf16x(a16[a][l][p], ins[p], R, xb, 2, t, 0, R);
                                kern_lora_expand(DT_BF16, b16[a][l][p], R, t, 2, sc, 0.0f, y,
                                                 outs[p], 0, outs[p]);
                            }
                        }
                double d = cpu_now() - t0;
                sum[2] += d;
                best[2] = d < best[2] ? d : best[2];
                continue;
            }
            for (int l = 0; l < NL; l++)
                for (int p = 0; p < NP; p++)
                    for (int a = 0; a < NA; a++) {
                        if (w8) {
                            kern_lora_shrink_i8(a8[a][l][p], ins[p], R, x, 2, t, 0, R);
                            kern_lora_expand_i8(b8[a][l][p], R, t, 2, sc, 0.0f, y, outs[p], 0,
                                                outs[p]);
                        } else {
                            kern_lora_shrink(DT_BF16, a16[a][l][p], ins[p], R, x, 2, t, 0, R);
                            kern_lora_expand(DT_BF16, b16[a][l][p], R, t, 2, sc, 0.0f, y,
                                             outs[p], 0, outs[p]);
                        }
                    }
            double d = cpu_now() - t0;
            sum[w8] += d;
            best[w8] = d < best[w8] ? d : best[w8];
        }
    printf("rank %zu (%s): bf16 %.1f MB/step, best %.2f ms (%.1f GB/s), mean %.2f ms | int8 "
           "%.1f MB/step, best %.2f ms (%.1f GB/s), mean %.2f ms | int8 / bf16 time: best "
           "%.2f, mean %.2f\n",
           R, kern_isa_name(kern_isa()), (double)by16 / 1e6, best[0] * 1e3,
           (double)by16 / best[0] / 1e9, sum[0] / REPS * 1e3, (double)by8 / 1e6, best[1] * 1e3,
           (double)by8 / best[1] / 1e9, sum[1] / REPS * 1e3, best[1] / best[0],
           sum[1] / sum[0]);
    printf("rank %zu bf16x (x rounded once per job%s): best %.2f ms (%.1f GB/s), mean %.2f ms | "
           "bf16x / bf16 time: best %.2f, mean %.2f\n",
           R, engine_x ? "" : "; not the engine's path here", best[2] * 1e3,
           (double)by16 / best[2] / 1e9, sum[2] / REPS * 1e3, best[2] / best[0], sum[2] / sum[0]);
    return 0;
}
