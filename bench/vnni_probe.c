/*
 * vnni_probe — what issues beside vpdpbusd on this core (session 26). The AVX-512 q4_0/q8_0
 * decode tiles are a stream of vpdpbusd with {1to16} activation operands plus a few loads,
 * shuffles and float multiplies per block; which of those take vpdpbusd's issue slots decides
 * how the tiles are built (kernels/x86/avx512_q.c gemm_q4p_tile1). Each case times a loop of
 * 16 vpdpbusd on 16 independent zmm accumulators (or fewer chains) plus `extra` other
 * instructions of one kind, independent of each other and of the vpdpbusd (the accumulators
 * wrap; only the rate matters), and prints the
 * vpdpbusd rate as GOP/s (64 multiply-adds = 128 ops each): one JSON line per case, the best of
 * --reps runs. Where the rate stays at the pure case's, the extra kind issued in other slots.
 *
 *   usage: vnni_probe [--reps N]
 *
 * Inline assembly in avx512f-targeted functions (xmm16-31 clobbers), run only where the CPU has
 * AVX512-VNNI (checked, exit 2 otherwise).
 */
#include "bench_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ITERS 4000000L

/* 16 vpdpbusd, accumulators zmm0..15 (register operands zmm30, zmm31) */
#define D_(r) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #r "\n\t"
#define D16_ D_(0) D_(1) D_(2) D_(3) D_(4) D_(5) D_(6) D_(7) D_(8) D_(9) D_(10) D_(11) D_(12) \
    D_(13) D_(14) D_(15)
/* the same with the {1to16} memory operand of the tiles (4 bytes of %0 each) */
#define M_(r, o) "vpdpbusd " #o "(%0)%{1to16%}, %%zmm30, %%zmm" #r "\n\t"
#define M16_ M_(0, 0) M_(1, 4) M_(2, 8) M_(3, 12) M_(4, 16) M_(5, 20) M_(6, 24) M_(7, 28) \
    M_(8, 32) M_(9, 36) M_(10, 40) M_(11, 44) M_(12, 48) M_(13, 52) M_(14, 56) M_(15, 60)
/* 16 vpdpbusd on 8 chains (two per accumulator) */
#define D16_8C_ D_(0) D_(1) D_(2) D_(3) D_(4) D_(5) D_(6) D_(7) D_(0) D_(1) D_(2) D_(3) D_(4) \
    D_(5) D_(6) D_(7)
/* 4 and 8 extra instructions into zmm16..23 */
#define X4_(op) op(16) op(17) op(18) op(19)
#define X8_(op) X4_(op) op(20) op(21) op(22) op(23)
#define BC_(r) "vpbroadcastd " #r "*4(%0), %%zmm" #r "\n\t"
#define SHUF_(r) "vpshufd $0x55, %%zmm29, %%zmm" #r "\n\t"
#define PERM_(r) "vpermd %%zmm29, %%zmm28, %%zmm" #r "\n\t"
#define MUL_(r) "vmulps %%zmm29, %%zmm28, %%zmm" #r "\n\t"
#define FMA_(r) "vfmadd213ps %%zmm29, %%zmm28, %%zmm" #r "\n\t"
#define ADD_(r) "vaddps %%zmm29, %%zmm28, %%zmm" #r "\n\t"
#define CVT_(r) "vcvtdq2ps %%zmm29, %%zmm" #r "\n\t"
#define AND_(r) "vpandd %%zmm29, %%zmm28, %%zmm" #r "\n\t"

#define CLOBBER_                                                                            \
    "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
        "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18",     \
        "xmm19", "xmm20", "xmm21", "xmm22", "xmm23"

static int32_t g_words[64] __attribute__((aligned(64)));

/* one case: its name, what runs beside 16 vpdpbusd, its loop */
struct probe_case {
    const char *name, *extra;
    void (*run)(long);
};

/* zmm28..31 set in the function (libc calls between cases may use them): all-ones bytes
 * for the products, zeros for the float and shuffle sources (no denormals) */
#define CASE_FN_(fn, body)                                                         \
    __attribute__((target("avx512f"))) static void fn(long n)                     \
    {                                                                              \
        const int32_t *p = g_words;                                                \
        __asm__ volatile("vpternlogd $0xff, %%zmm30, %%zmm30, %%zmm30\n\t"       \
                         "vmovdqa64 %%zmm30, %%zmm31\n\t"                         \
                         "vpxorq %%zmm29, %%zmm29, %%zmm29\n\t"                   \
                         "vpxorq %%zmm28, %%zmm28, %%zmm28\n\t" ::                \
                             : "xmm28", "xmm29", "xmm30", "xmm31");                \
        for (long i = 0; i < n; i++)                                               \
            __asm__ volatile(body : : "r"(p) : CLOBBER_);                          \
    }

CASE_FN_(run_pure, D16_)
CASE_FN_(run_chains8, D16_8C_)
CASE_FN_(run_mem, M16_)
CASE_FN_(run_mem_bc4, M16_ X4_(BC_))
CASE_FN_(run_mem_bc8, M16_ X8_(BC_))
CASE_FN_(run_bc8, D16_ X8_(BC_))
CASE_FN_(run_shuf16, D16_ X8_(SHUF_) X8_(SHUF_))
CASE_FN_(run_perm16, D16_ X8_(PERM_) X8_(PERM_))
CASE_FN_(run_mul4, D16_ X4_(MUL_))
CASE_FN_(run_fma4, D16_ X4_(FMA_))
CASE_FN_(run_add4, D16_ X4_(ADD_))
CASE_FN_(run_cvt4, D16_ X4_(CVT_))
CASE_FN_(run_and4, D16_ X4_(AND_))

static const struct probe_case cases[] = {
    {"pure", "none (16 chains)", run_pure},
    {"chains8", "none (8 chains of 2)", run_chains8},
    {"mem", "every vpdpbusd with a {1to16} memory operand", run_mem},
    {"mem+bcast4", "{1to16} operands + 4 vpbroadcastd loads", run_mem_bc4},
    {"mem+bcast8", "{1to16} operands + 8 vpbroadcastd loads", run_mem_bc8},
    {"bcast8", "8 vpbroadcastd loads", run_bc8},
    {"shuf16", "16 vpshufd", run_shuf16},
    {"perm16", "16 vpermd", run_perm16},
    {"mul4", "4 vmulps", run_mul4},
    {"fma4", "4 vfmadd213ps", run_fma4},
    {"add4", "4 vaddps", run_add4},
    {"cvt4", "4 vcvtdq2ps", run_cvt4},
    {"and4", "4 vpandd", run_and4},
};

int main(int argc, char **argv)
{
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: vnni_probe [--reps N]\n");
            return 2;
        }
    }
    if (reps < 1) {
        fprintf(stderr, "vnni_probe: --reps must be >= 1\n");
        return 2;
    }
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512vnni")) {
        fprintf(stderr, "vnni_probe: this CPU has no AVX512-VNNI\n");
        return 2;
    }
    for (int i = 0; i < 64; i++)
        g_words[i] = 0x01010101;
    run_pure(ITERS); /* the clock up before the first case */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double best = 0;
        for (int r = 0; r < reps; r++) {
            double t0 = bench_now();
            cases[c].run(ITERS);
            double t = bench_now() - t0;
            double gops = (double)ITERS * 16 * 128 / t / 1e9;
            best = gops > best ? gops : best;
        }
        printf("{\"case\":\"%s\",\"beside_16_vpdpbusd\":\"%s\",\"vpdpbusd_gops\":%.1f}\n",
               cases[c].name, cases[c].extra, best);
    }
    return 0;
}
