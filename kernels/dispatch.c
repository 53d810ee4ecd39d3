/*
 * dispatch.c — picks the kernel ISA once from CPUID (or CLOCHER_ISA) and routes calls.
 */
#include "kern.h"
#include "internal.h"

#include "err.h"
#include "log.h"

#include <stdlib.h>
#include <string.h>

static enum kern_isa g_isa = KERN_ISA_REF;
static int g_inited;

static const char *const isa_names[] = {"ref", "avx2", "avx512"};

const char *kern_isa_name(enum kern_isa isa)
{
    return (unsigned)isa < 3 ? isa_names[isa] : "?";
}

int kern_isa_supported(enum kern_isa isa)
{
    __builtin_cpu_init();
    switch (isa) {
    case KERN_ISA_REF:
        return 1;
    case KERN_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case KERN_ISA_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
    }
    return 0;
}

int kern_force_isa(enum kern_isa isa)
{
    if (!kern_isa_supported(isa)) {
        LOG_ERR("kernel ISA %s is not supported by this CPU", kern_isa_name(isa));
        return ERR_UNSUPPORTED;
    }
    g_isa = isa;
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
    /* Only the scalar path exists so far; SIMD paths register here as they land. */
    g_isa = KERN_ISA_REF;
    g_inited = 1;
    return 0;
}

enum kern_isa kern_isa(void) { return g_isa; }

void kern_matmul(enum dtype wt, const void *w, size_t cols, const float *x, size_t n, float *y,
                 size_t ldy, size_t r0, size_t r1)
{
    kern_matmul_ref(wt, w, cols, x, n, y, ldy, r0, r1);
}
