/*
 * dispatch.c — picks the kernel ISA once from CPUID (or CLOCHER_ISA), routes products to the
 * variant that suits the weight type and the number of tokens, and owns the per-thread
 * scratch that kern_matmul prepares activations in.
 *
 * NOTES: the ISA and the routing table are written by kern_init()/kern_force_isa() only, which
 * run before worker threads exist (kern.h); afterwards they are read-only. Scratch is per
 * thread (thread-local pointer, freed by a pthread key destructor at thread exit).
 */
#include "kern.h"
#include "internal.h"

#include "check.h"
#include "err.h"
#include "log.h"

#include <cpuid.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Which variant runs a product: gemm from gemm_min_n tokens on, gemv below. */
struct route {
    kern_mm_fn *gemv;
    kern_mm_fn *gemm;
    size_t gemm_min_n;
};

static enum kern_isa g_isa = KERN_ISA_REF;
static int g_inited;
static struct route g_route[DT_COUNT_];

static const char *const isa_names[] = {"ref", "avx2", "avx512"};

const char *kern_isa_name(enum kern_isa isa)
{
    return (unsigned)isa < 3 ? isa_names[isa] : "?";
}

/*
 * CPU features from CPUID, plus XGETBV to check that the OS saves the AVX / AVX-512 register
 * state (a CPU flag alone is not enough: a kernel without XSAVE support for ZMM would fault).
 * Read directly rather than through __builtin_cpu_supports, whose feature names differ
 * between compilers (clang 14 has no "f16c").
 */
struct cpu_feats {
    int avx2, avx512, avx512bf16;
};

static struct cpu_feats read_cpu_feats(void)
{
    struct cpu_feats f = {0, 0, 0};
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return f;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx)
        return f;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    (void)xhi;
    int os_avx = (xlo & 0x6) == 0x6, os_avx512 = os_avx && (xlo & 0xe0) == 0xe0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return f;
    int avx2 = (b >> 5) & 1, avx512f = (b >> 16) & 1, avx512dq = (b >> 17) & 1,
        avx512bw = (b >> 30) & 1, avx512vl = (b >> 31) & 1, vnni = (c >> 11) & 1;
    f.avx2 = os_avx && avx2 && fma && f16c;
    f.avx512 = f.avx2 && os_avx512 && avx512f && avx512dq && avx512bw && avx512vl && vnni;
    if (f.avx512 && __get_cpuid_count(7, 1, &a, &b, &c, &d))
        f.avx512bf16 = (a >> 5) & 1;
    return f;
}

/* Read once: CPUID traps to the hypervisor in a VM (microseconds), and kern_has_avx512bf16
 * is asked per LoRA kernel call. pthread_once orders the write before every reader. */
static struct cpu_feats g_feats;
static pthread_once_t g_feats_once = PTHREAD_ONCE_INIT;
static void feats_init(void) { g_feats = read_cpu_feats(); }

static struct cpu_feats cpu_feats(void)
{
    pthread_once(&g_feats_once, feats_init);
    return g_feats;
}

int kern_isa_supported(enum kern_isa isa)
{
    struct cpu_feats f = cpu_feats();
    switch (isa) {
    case KERN_ISA_REF:
        return 1;
    case KERN_ISA_AVX2:
        return f.avx2;
    case KERN_ISA_AVX512:
        return f.avx512;
    }
    return 0;
}

int kern_has_avx512bf16(void) { return cpu_feats().avx512bf16; }

/*
 * Routing per ISA. gemm_min_n is where the gemm variant overtakes the gemv in bench/kern_bench
 * --only variants (docs/PERFORMANCE.md): the gemv streams a row once per pair of tokens and
 * wins while unpacking dominates; the packed gemm wins once a panel is reused enough.
 */
static void set_routes(enum kern_isa isa)
{
    memset(g_route, 0, sizeof g_route);
#define ROUTE_(dt, wty, aty, sfx, min_n)                                                     \
    g_route[dt] = (struct route){kern_gemv_##wty##_##aty##_##sfx,                            \
                                 kern_gemm_##wty##_##aty##_##sfx, (min_n)}
    switch (isa) {
    case KERN_ISA_REF:
        break; /* kern_matmul_act runs kern_matmul_ref on the f32 activations */
    case KERN_ISA_AVX2:
        ROUTE_(DT_F32, f32, f32, avx2, 3);
        ROUTE_(DT_F16, f16, f32, avx2, 3);
        ROUTE_(DT_BF16, bf16, f32, avx2, 3);
        ROUTE_(DT_Q8_0, q8_0, q8_0, avx2, 5);
        ROUTE_(DT_Q4_0, q4_0, q8_0, avx2, 8);
        /* int4 groups (x86/avx2_q4g.c): the gemm tile reuses unpacked rows over 4 tokens */
        ROUTE_(DT_Q4_G64, q4_g64, q8_0, avx2, 4);
        ROUTE_(DT_Q4_G128, q4_g128, q8_0, avx2, 4);
        ROUTE_(DT_Q4Z_G32, q4z_g32, q8_0, avx2, 4);
        ROUTE_(DT_Q4Z_G64, q4z_g64, q8_0, avx2, 4);
        ROUTE_(DT_Q4Z_G128, q4z_g128, q8_0, avx2, 4);
        break;
    case KERN_ISA_AVX512:
        ROUTE_(DT_F32, f32, f32, avx512, 2);
        ROUTE_(DT_F16, f16, f32, avx512, 3);
        ROUTE_(DT_BF16, bf16, f32, avx512, 3);
        if (kern_has_avx512bf16())
            g_route[DT_BF16].gemm = kern_gemm_bf16_bf16_avx512;
        ROUTE_(DT_Q8_0, q8_0, q8_0, avx512, 6);
        ROUTE_(DT_Q4_0, q4_0, q8_0, avx512, 4);
        /* x86/avx512_q4g.c: the same packed-panel gemm as q4_0, so its crossover */
        ROUTE_(DT_Q4_G64, q4_g64, q8_0, avx512, 6);
        ROUTE_(DT_Q4_G128, q4_g128, q8_0, avx512, 6);
        ROUTE_(DT_Q4Z_G32, q4z_g32, q8_0, avx512, 6);
        ROUTE_(DT_Q4Z_G64, q4z_g64, q8_0, avx512, 6);
        ROUTE_(DT_Q4Z_G128, q4z_g128, q8_0, avx512, 6);
        break;
    }
#undef ROUTE_
}

int kern_force_isa(enum kern_isa isa)
{
    if (!kern_isa_supported(isa)) {
        LOG_ERR("kernel ISA %s is not supported by this CPU", kern_isa_name(isa));
        return ERR_UNSUPPORTED;
    }
    g_isa = isa;
    set_routes(isa);
    g_inited = 1;
    return 0;
}

int kern_init(void)
{
    if (g_inited)
        return 0;
    const char *s = getenv("CLOCHER_ISA");
    if (s && *s) {
        for (int i = 0; i < 3; i++)
            if (strcmp(s, isa_names[i]) == 0)
                return kern_force_isa((enum kern_isa)i);
        LOG_ERR("CLOCHER_ISA=%s: expected ref, avx2 or avx512", s);
        return ERR_USAGE;
    }
    for (int i = KERN_ISA_AVX512; i >= KERN_ISA_REF; i--)
        if (kern_isa_supported((enum kern_isa)i))
            return kern_force_isa((enum kern_isa)i);
    return 0; /* unreachable: ref is always supported */
}

enum kern_isa kern_isa(void) { return g_isa; }

/* ---- per-thread scratch ------------------------------------------------------------------ */

/* Two slots: kern_matmul prepares activations in slot 0 while the q4_0 panel fallback
 * (q4p.c) unpacks rows into slot 1 under the same call. */
#define SCRATCH_SLOTS 2
static pthread_key_t scratch_key[SCRATCH_SLOTS];
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static _Thread_local void *tl_scratch[SCRATCH_SLOTS];
static _Thread_local size_t tl_scratch_cap[SCRATCH_SLOTS];

static void scratch_key_init(void)
{
    for (int i = 0; i < SCRATCH_SLOTS; i++)
        CHECK(pthread_key_create(&scratch_key[i], free) == 0);
}

void *kern__scratch_slot(int slot, size_t bytes)
{
    CHECK(slot >= 0 && slot < SCRATCH_SLOTS);
    if (bytes <= tl_scratch_cap[slot])
        return tl_scratch[slot];
    pthread_once(&scratch_once, scratch_key_init);
    size_t cap = kern__round_up(bytes + bytes / 4, 64); /* grow with headroom */
    if (cap < bytes)
        return NULL;
    void *p = aligned_alloc(64, cap);
    if (!p)
        return NULL;
    free(tl_scratch[slot]);
    tl_scratch[slot] = p;
    tl_scratch_cap[slot] = cap;
    pthread_setspecific(scratch_key[slot], p); /* the destructor frees it at thread exit */
    return p;
}

void *kern__scratch(size_t bytes) { return kern__scratch_slot(0, bytes); }

/* ---- products ---------------------------------------------------------------------------- */

void kern_matmul_act(const void *w, const struct kern_act *a, float *y, size_t ldy, size_t r0,
                     size_t r1)
{
    if (r0 >= r1 || a->n == 0)
        return;
    const struct route *rt = &g_route[a->wt];
    if (g_isa == KERN_ISA_REF || !rt->gemv) {
        kern_matmul_ref(a->wt, w, a->cols, a->x, a->n, y, ldy, r0, r1);
        return;
    }
    (a->n >= rt->gemm_min_n ? rt->gemm : rt->gemv)(w, a, y, ldy, r0, r1);
}

void kern_matmul(enum dtype wt, const void *w, size_t cols, const float *x, size_t n, float *y,
                 size_t ldy, size_t r0, size_t r1)
{
    if (r0 >= r1 || n == 0)
        return;
    if (g_isa == KERN_ISA_REF) {
        kern_matmul_ref(wt, w, cols, x, n, y, ldy, r0, r1);
        return;
    }
    size_t bytes;
    CHECK(kern_act_bytes(wt, cols, n, &bytes) == 0);
    void *buf = bytes ? kern__scratch(bytes) : NULL;
    if (bytes && !buf) {
        /* out of memory: the scalar path needs none; slow but correct beats failing */
        static _Thread_local int warned;
        if (!warned++)
            LOG_WARN("kern_matmul: no memory for %zu bytes of activations, using the scalar path",
                     bytes);
        kern_matmul_ref(wt, w, cols, x, n, y, ldy, r0, r1);
        return;
    }
    struct kern_act a;
    kern_act_init(&a, wt, x, cols, n, buf);
    kern_act_prepare(&a, 0, n);
    kern_matmul_act(w, &a, y, ldy, r0, r1);
}
