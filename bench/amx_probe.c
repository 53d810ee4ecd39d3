/*
 * amx_probe.c — does each thread get its own AMX unit? (session 19, issue 16 "Speed still owed")
 *
 * On a VM the vCPUs may be SMT siblings of one host core, which would share one AMX unit and
 * halve what a second thread can add to a tile-bound GEMM. This probe runs tile multiplies on
 * register-resident tiles (no memory traffic inside the loop: tiles 4-7 are loaded once) on 1
 * thread and on 2 threads pinned to CPUs 0 and 1, and prints the total tile operations per
 * second of each. Shared unit: 2 threads give ~1x the total of 1; separate units: ~2x.
 * Rounds alternate 1 2 2 1 so that the machine's drift between minutes cancels in the ratio.
 *
 * Usage: amx_probe [bf16|int8] [rounds] [millions of iterations per thread]
 * Prints one JSON line per round (G tile ops/s at 1 and 2 threads, their ratio) and a last
 * line with the mean ratio.
 * Only built on x86-64; exits 0 with a "skip" line where AMX or the kernel's grant is missing.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM_ 0x1023
#define XFEATURE_XTILEDATA_ 18

/* palette 1 tile configuration: 64 bytes, laid out as the architecture defines it */
struct tile_cfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

struct probe_arg {
    int cpu, int8;
    long iters;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

__attribute__((target("amx-tile,amx-bf16,amx-int8"))) static void *probe_thread(void *p)
{
    const struct probe_arg *a = p;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(a->cpu, &set);
    sched_setaffinity(0, sizeof set, &set); /* best effort: an unpinned run still measures */
    struct tile_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.colsb[i] = 64;
        cfg.rows[i] = 16;
    }
    _tile_loadconfig(&cfg);
    /* operands: small values so that neither sum overflows nor goes subnormal */
    static _Thread_local uint8_t buf[1024] __attribute__((aligned(64)));
    memset(buf, 1, sizeof buf);
    _tile_loadd(4, buf, 64);
    _tile_loadd(5, buf, 64);
    _tile_loadd(6, buf, 64);
    _tile_loadd(7, buf, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    /* four independent accumulators: the loop is bound by the unit's throughput, not latency */
    if (a->int8)
        for (long i = 0; i < a->iters; i++) {
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 4, 7);
            _tile_dpbssd(2, 5, 6);
            _tile_dpbssd(3, 5, 7);
        }
    else
        for (long i = 0; i < a->iters; i++) {
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    _tile_stored(0, buf, 64);
    _tile_release();
    return NULL;
}

/* total tile ops per second (1e9) over nthreads threads */
static double run(int nthreads, int int8, long iters)
{
    pthread_t t[2];
    struct probe_arg arg[2];
    double t0 = now_s();
    for (int i = 0; i < nthreads; i++) {
        arg[i] = (struct probe_arg){.cpu = i, .int8 = int8, .iters = iters};
        if (pthread_create(&t[i], NULL, probe_thread, &arg[i]) != 0) {
            fprintf(stderr, "amx_probe: pthread_create failed\n");
            exit(1);
        }
    }
    for (int i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    return (double)nthreads * (double)iters * 4.0 / (now_s() - t0) / 1e9;
}

int main(int argc, char **argv)
{
    const int int8 = argc > 1 && strcmp(argv[1], "int8") == 0;
    if (argc > 1 && !int8 && strcmp(argv[1], "bf16") != 0) {
        fprintf(stderr, "amx_probe: unknown tile op '%s' (bf16 or int8)\n", argv[1]);
        return 2;
    }
    const int rounds = argc > 2 ? atoi(argv[2]) : 3;
    const long iters = (argc > 3 ? atol(argv[3]) : 20) * 1000000L;
    if (rounds < 1 || iters < 1) {
        fprintf(stderr, "amx_probe: rounds and iterations must be positive\n");
        return 2;
    }
    unsigned eax, ebx, ecx, edx;
    /* CPUID.(7,0):EDX bit 22 AMX-BF16, 24 AMX-TILE, 25 AMX-INT8 */
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !(edx & (1u << 24)) ||
        !(edx & (1u << 22)) || !(edx & (1u << 25))) {
        printf("{\"skip\":\"no AMX-TILE/BF16/INT8 on this CPU\"}\n");
        return 0;
    }
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_, XFEATURE_XTILEDATA_) != 0) {
        printf("{\"skip\":\"the kernel did not grant AMX tile data (arch_prctl)\"}\n");
        return 0;
    }
    const char *op = int8 ? "tdpbssd" : "tdpbf16ps";
    double ratio_sum = 0;
    for (int r = 0; r < rounds; r++) {
        /* order 1 2 2 1: each round's ratio uses the mean of its two runs of each */
        double a1 = run(1, int8, iters), b1 = run(2, int8, iters);
        double b2 = run(2, int8, iters), a2 = run(1, int8, iters);
        double ratio = (b1 + b2) / (a1 + a2);
        ratio_sum += ratio;
        printf("{\"op\":\"%s\",\"round\":%d,\"gtileops_1t\":[%.3f,%.3f],"
               "\"gtileops_2t\":[%.3f,%.3f],\"ratio_2t_1t\":%.3f}\n",
               op, r, a1, a2, b1, b2, ratio);
        fflush(stdout);
    }
    printf("{\"op\":\"%s\",\"rounds\":%d,\"mean_ratio_2t_1t\":%.3f}\n", op, rounds,
           ratio_sum / rounds);
    return 0;
}
