/*
 * bw_probe — read-only streaming memory bandwidth with 1 thread and with every CPU of the
 * affinity mask (pinned compactly), plus each core's peak multiply-add throughput: the two
 * roofs the kernels are measured against (docs/PERFORMANCE.md). The bandwidth is the best of
 * 1/2/4/8 streams per thread x 4 KiB/2 MiB pages (bench_bandwidth_ex); every variant is
 * printed, and the winner named, on the line scripts parse.
 *   usage: bw_probe [MiB per pass (default 1024)] [passes (default 5)]
 *          bw_probe --peak   only the peaks: per core, and every CPU of the mask at once (a
 *                            VM's vCPUs may be SMT siblings: the sum of single-core figures
 *                            would overstate what all threads reach together)
 */
#include "bench_util.h"
#include "kern.h"
#include "pool.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --peak: every pool thread runs the same peak loop at once; the figures add up. */
struct peak_job {
    int which;
    double gops[256];
};

static void peak_task(void *ctx, size_t task, int thread)
{
    (void)thread;
    struct peak_job *j = ctx;
    j->gops[task] = bench_peak_gops(j->which);
}

static int print_peaks(int ncpu)
{
    struct pool *p;
    if (ncpu > 256)
        ncpu = 256;
    if (pool_create(ncpu, POOL_PIN_COMPACT, &p) != 0)
        return 1;
    static const char *const names[] = {"f32 FMA", "bf16 dot", "int8 dot"};
    double one[3], all[3];
    for (int w = 0; w < 3; w++) {
        one[w] = bench_peak_gops(w);
        struct peak_job j = {.which = w};
        pool_run(p, peak_task, &j, (size_t)ncpu);
        all[w] = 0;
        for (int t = 0; t < ncpu; t++)
            all[w] += j.gops[t];
    }
    pool_destroy(p);
    printf("peak per core: f32 FMA %.1f GFLOP/s, bf16 dot %.1f GFLOP/s, int8 dot %.1f GOP/s\n",
           one[0], one[1], one[2]);
    printf("peak threads=%d:", ncpu);
    for (int w = 0; w < 3; w++)
        printf(" %s %.1f%s", names[w], all[w], w < 2 ? "," : "\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--peak")) {
        cpu_set_t s;
        sched_getaffinity(0, sizeof s, &s);
        return kern_init() != 0 ? 1 : print_peaks(CPU_COUNT(&s));
    }
    size_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 1024;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    cpu_set_t set;
    sched_getaffinity(0, sizeof set, &set);
    int ncpu = CPU_COUNT(&set);
    if (kern_init() != 0)
        return 1;
    for (int th = 1; th <= ncpu; th = th == ncpu ? ncpu + 1 : (th * 2 > ncpu ? ncpu : th * 2)) {
        struct pool *p;
        if (pool_create(th, POOL_PIN_COMPACT, &p) != 0)
            return 1;
        struct bench_bw bw;
        bench_bandwidth_ex(p, mib << 20, reps, &bw);
        printf("bandwidth threads=%d: %.2f GB/s (read-only, %zu MiB, best of %d; winner: %d "
               "stream%s/thread, %s pages)\n",
               th, bw.gbs, mib, reps, bw.streams, bw.streams > 1 ? "s" : "",
               bw.huge ? "2 MiB" : "4 KiB");
        for (int h = 0; h < 2; h++)
            printf("  %s pages: 1 stream %.2f, 2 streams %.2f, 4 streams %.2f, 8 streams %.2f "
                   "GB/s%s\n",
                   h ? "2 MiB" : "4 KiB", bw.each[h][0], bw.each[h][1], bw.each[h][2],
                   bw.each[h][3], h && bw.huge_share < 0.9 ? " (few huge pages granted)" : "");
        pool_destroy(p);
    }
    printf("peak per core: f32 FMA %.1f GFLOP/s, bf16 dot %.1f GFLOP/s, int8 dot %.1f GOP/s\n",
           bench_peak_gops(0), bench_peak_gops(1), bench_peak_gops(2));
    return 0;
}
