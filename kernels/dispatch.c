/*
 * dispatch.c — picks the kernel ISA once from CPUID (or CLOCHER_ISA) and fills the dispatch
 * table every entry point reads (internal.h, struct kern_ops) from the weight types' traits
 * (traits.c) and the ISA's other variants; routes products to the variant that suits the
 * number of tokens, and owns the per-thread scratch that kern_matmul prepares activations in.
 * The only file in kernels/ that looks at the ISA.
 *
 * NOTES: the table is written by kern_init()/kern_force_isa() only, which run before worker
 * threads exist (kern.h); afterwards it is read-only. Scratch is per thread (thread-local
 * pointer, freed by a pthread key destructor at thread exit).
 */
#include "internal.h"

#include "check.h"
#include "err.h"
#include "log.h"

#include <cpuid.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

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
    int amx_bf16; /* AMX-TILE + AMX-BF16 in the CPU and XCR0 (the OS grant is amx_granted) */
    int gfni;     /* GFNI with the AVX-512 ISA (its 512-bit forms, x86/avx512_q.c) */
};

static struct cpu_feats read_cpu_feats(void)
{
    struct cpu_feats f = {0, 0, 0, 0, 0};
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
    /* XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS manages the tile state */
    int os_amx = (xlo & 0x60000u) == 0x60000u;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return f;
    int avx2 = (b >> 5) & 1, avx512f = (b >> 16) & 1, avx512dq = (b >> 17) & 1,
        avx512bw = (b >> 30) & 1, avx512vl = (b >> 31) & 1, vnni = (c >> 11) & 1;
    f.avx2 = os_avx && avx2 && fma && f16c;
    f.avx512 = f.avx2 && os_avx512 && avx512f && avx512dq && avx512bw && avx512vl && vnni;
    f.gfni = f.avx512 && ((c >> 8) & 1); /* CPUID 7.0 ECX bit 8 */
    /* CPUID 7.0 EDX bit 24: AMX-TILE, bit 22: AMX-BF16, bit 25: AMX-INT8. Both kinds of tile
     * multiply are asked for (every AMX CPU so far has both): the amx overlay holds bf16 and
     * int8 kernels (x86/amx_bf16.c, x86/amx_q.c). */
    int amx_tile = (d >> 24) & 1, amx_bf16 = (d >> 22) & 1, amx_int8 = (d >> 25) & 1;
    if (f.avx512 && __get_cpuid_count(7, 1, &a, &b, &c, &d))
        f.avx512bf16 = (a >> 5) & 1;
    f.amx_bf16 = f.avx512bf16 && os_amx && amx_tile && amx_bf16 && amx_int8;
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


/*
 * Linux hands out the 8 KiB of tile data per process on request (ARCH_REQ_XCOMP_PERM with
 * XFEATURE_XTILEDATA = 18, kernel >= 5.16); a tile instruction before the grant is a SIGILL.
 * Asked once, before kern_init fills a table that uses tiles (so before worker threads run
 * them); the grant covers every thread of the process. A refusal means no AMX, not an error.
 */
#define ARCH_REQ_XCOMP_PERM_ 0x1023
#define XFEATURE_XTILEDATA_ 18
static int g_amx_granted;
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;
static void amx_grant(void)
{
    if (!cpu_feats().amx_bf16)
        return;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_, XFEATURE_XTILEDATA_) != 0) {
        LOG_INFO("AMX: the kernel did not grant tile data (arch_prctl): AMX not used");
        return;
    }
    g_amx_granted = 1;
}

int kern_has_amx_bf16(void)
{
    pthread_once(&g_amx_once, amx_grant);
    return g_amx_granted;
}

/* CLOCHER_AMX=0 keeps the tiles off (the way to run the AVX-512 GEMM on an AMX machine). */
static int amx_wanted(void)
{
    const char *s = getenv("CLOCHER_AMX");
    return !(s && strcmp(s, "0") == 0);
}

/* CLOCHER_AMX_QBF16=0 keeps the q4_0/q8_0 bf16 tile product (x86/amx_qbf16.c) off while the
 * other AMX kernels stay on: tiles_min_n 0, so no activations get the bf16 tiles (kern.h);
 * CLOCHER_AMX_QBF16=N (N > 0) moves its threshold (traits.c AMX_QBF16_MIN_N) to N tokens.
 * For A/B runs of (a) against (b) in one binary and for measuring (b) on small products
 * (docs/PERFORMANCE.md, session 19, s19-amxb2). Returns the threshold to use, or -1 (unset). */
static long qbf16_min_n(void)
{
    const char *s = getenv("CLOCHER_AMX_QBF16");
    if (!s || !*s)
        return -1;
    char *end;
    long v = strtol(s, &end, 10);
    return *end == '\0' && v >= 0 ? v : -1;
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

int kern_has_gfni(void) { return cpu_feats().gfni; }

/* internal.h kern__gfni: set with the table (fill_table); CLOCHER_GFNI=0 keeps GFNI off (the
 * way to run the plain AVX-512 path on a GFNI machine: tests/kern test_kern_nogfni, A/B runs) */
int kern__gfni;
static int gfni_wanted(void)
{
    const char *s = getenv("CLOCHER_GFNI");
    return !(s && strcmp(s, "0") == 0);
}

/* ---- the dispatch table ------------------------------------------------------------------ */

static void matmul_prepared(enum dtype wt, const void *w, size_t cols, const float *x, size_t n,
                            float *y, size_t ldy, size_t r0, size_t r1);

/* What is not per weight type, per ISA; the scalar ISA's kern_matmul prepares nothing. */
#define ISA_OPS_(I, matmul_fn)                                                               \
    {.isa = KERN_ISA_##I,                                                                    \
     .matmul = (matmul_fn),                                                                  \
     .act_prepare = kern__act_prepare_##I,                                                   \
     .bsr_gemv = kern_gemv_bsr_f32_##I,                                                      \
     .exp = kern_exp_f32_f32_##I,                                                            \
     .tanh = kern_tanh_f32_f32_##I,                                                          \
     .silu = kern_silu_f32_f32_##I,                                                          \
     .gelu = kern_gelu_f32_f32_##I,                                                          \
     .softmax = kern_softmax_f32_f32_##I,                                                    \
     .rmsnorm = kern_rmsnorm_f32_f32_##I,                                                    \
     .swiglu = kern_swiglu_f32_f32_##I,                                                      \
     .rope = kern_rope_f32_f32_##I,                                                          \
     .swiglu_clamp = kern_swiglu_clamp_f32_f32_##I}
#define KERN_ISA_ref KERN_ISA_REF
#define KERN_ISA_avx2 KERN_ISA_AVX2
#define KERN_ISA_avx512 KERN_ISA_AVX512
/* Indexed by enum kern_isa; .type is filled from kern__traits. */
static const struct kern_ops isa_ops[KERN__ISA_COUNT] = {
    ISA_OPS_(ref, kern_matmul_ref), ISA_OPS_(avx2, matmul_prepared),
    ISA_OPS_(avx512, matmul_prepared)};

struct kern_ops kern__ops;
static int g_inited;

/* Overlays the non-NULL fields of o on t. */
static void overlay(struct kern__type_ops *t, const struct kern__type_ops *o)
{
#define OVER_(f)                                                                             \
    if (o->f)                                                                                \
    t->f = o->f
    OVER_(gemv);
    OVER_(gemm);
    OVER_(panel_gemm);
    OVER_(panel_pack);
    OVER_(lora_shrink);
    OVER_(lora_expand);
    OVER_(lora_shrink_lowrank);
    OVER_(lora_expand_lowrank);
    OVER_(attn);
    OVER_(tiles_min_n);
    OVER_(act_tiles);
#undef OVER_
    if (o->gemm_min_n)
        t->gemm_min_n = o->gemm_min_n;
}

static void fill_table(enum kern_isa isa)
{
    struct kern_ops ops = isa_ops[isa];
    const int bf16 = isa == KERN_ISA_AVX512 && kern_has_avx512bf16();
    const int amx = bf16 && amx_wanted() && kern_has_amx_bf16();
    for (int dt = 0; dt < DT_COUNT_; dt++) {
        const struct kern_type_traits *tt = &kern__traits[dt];
        const struct dtype_info *di = dtype_info((enum dtype)dt);
        /* the traits restate common/dtype.h's geometry: a mismatch is a bug in traits.c */
        CHECK(tt->to_f32 && di && tt->block == di->block && tt->block_bytes == di->block_bytes);
        ops.type[dt] = tt->isa[isa];
        if (bf16)
            overlay(&ops.type[dt], &tt->bf16);
        if (amx) {
            overlay(&ops.type[dt], &tt->amx);
            const long qmin = qbf16_min_n();
            if (qmin >= 0 && ops.type[dt].tiles_min_n)
                ops.type[dt].tiles_min_n = (size_t)qmin;
        }
    }
    ops.amx = amx;
    kern__gfni = isa == KERN_ISA_AVX512 && kern_has_gfni() && gfni_wanted();
    kern__ops = ops;
}

/* The scalar table from program start until kern_init() runs (internal.h, kern__ops), so that
 * a kernel called early is slow rather than a NULL call; a static initializer cannot copy the
 * per-type columns out of traits.c. */
__attribute__((constructor)) static void table_boot(void)
{
    if (!g_inited)
        fill_table(KERN_ISA_REF);
}

int kern_force_isa(enum kern_isa isa)
{
    if (!kern_isa_supported(isa)) {
        LOG_ERR("kernel ISA %s is not supported by this CPU", kern_isa_name(isa));
        return ERR_UNSUPPORTED;
    }
    fill_table(isa);
    g_inited = 1;
    return 0;
}

/* kern.h kern_set_panel_streams: read by the few-token panel kernels (x86/avx512_q.c: q8_0 and
 * q4_0 up to n = 8, one token tile, where 4 means 2; _mxfp4.c up to n = 4, 4 streams up to
 * n = 2) */
int kern__panel_streams = 4;
int kern__qpanel_streams = 2;

void kern_set_panel_streams(int streams)
{
    kern__panel_streams = streams == 1 ? 1 : streams == 4 ? 4 : 2;
    kern__qpanel_streams = streams == 1 ? 1 : 2;
}

/* AMD family 1Ah (Zen 5) or later: CPUID 0's vendor and leaf 1's base + extended family. */
static int amd_zen5_or_later(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541u /* "Auth" */ ||
        d != 0x69746e65u /* "enti" */ || c != 0x444d4163u /* "cAMD" */)
        return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    unsigned fam = (a >> 8) & 0xf;
    if (fam == 0xf)
        fam += (a >> 20) & 0xff;
    return fam >= 0x1a;
}

_Thread_local struct kern__side_pf kern__side;

void kern_side_prefetch(const void *const *p, const size_t *bytes, size_t n)
{
    struct kern__side_pf *s = &kern__side;
    CHECK(n <= KERN_SIDE_PF_MAX);
    s->i = s->n = 0;
    s->lines = 0;
    for (size_t i = 0; i < n; i++) {
        if (!bytes[i])
            continue;
        const char *b = (const char *)((uintptr_t)p[i] & ~(uintptr_t)63);
        const char *e = (const char *)p[i] + bytes[i];
        s->p[s->n] = b;
        s->e[s->n] = e;
        s->lines += (size_t)(e - b + 63) / 64;
        s->n++;
    }
}

int kern_init(void)
{
    if (g_inited)
        return 0;
    const char *ps = getenv("CLOCHER_PANEL_STREAMS");
    if (ps && *ps)
        kern_set_panel_streams(atoi(ps));
    else if (amd_zen5_or_later())
        /* one stream for the q4_0/q8_0 panels: on Zen 5 the two-stream tiles measured slower
         * in one process (engine_bench --panel-streams-pair 2,1, session 25: int4 8 streams
         * -2.5 %, 1 stream -2.4 %, int8 8 streams -5.3 % time); the mxfp4 streams stay (not
         * measured there) */
        kern__qpanel_streams = 1;
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

enum kern_isa kern_isa(void) { return kern__ops.isa; }

int kern_amx_active(void) { return kern__ops.amx; }

/* ---- per-thread scratch ------------------------------------------------------------------ */

/* Two slots: kern_matmul prepares activations in slot 0 while the q4_0 panel fallback
 * (panels.c) unpacks rows into slot 1 under the same call. */
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
    if (!a->q && a->xt) {
        /* rows-stored q4_0/q8_0 weights on activations prepared for the panels' bf16 tiles,
         * which carry no int8 blocks (act.c act_layout): quantized here, per call */
        kern__ops.matmul(a->wt, w, a->cols, a->x, a->n, y, ldy, r0, r1);
        return;
    }
    const struct kern__type_ops *o = &kern__ops.type[a->wt];
    (a->n >= o->gemm_min_n ? o->gemm : o->gemv)(w, a, y, ldy, r0, r1);
}

/* kern_matmul on the SIMD ISAs: activations prepared in the thread's scratch. */
static void matmul_prepared(enum dtype wt, const void *w, size_t cols, const float *x, size_t n,
                            float *y, size_t ldy, size_t r0, size_t r1)
{
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

void kern_matmul(enum dtype wt, const void *w, size_t cols, const float *x, size_t n, float *y,
                 size_t ldy, size_t r0, size_t r1)
{
    if (r0 >= r1 || n == 0)
        return;
    kern__ops.matmul(wt, w, cols, x, n, y, ldy, r0, r1);
}

/* ---- 8-bit KV attention (kern_variants.h, kern_attn_kv8_variant) ------------------------ */

/* Not in the per-dtype traits: the 8-bit KV types are cache formats, not tensor types
 * (common/dtype.h numbers them past DT_COUNT_). Indexed by enum kern_isa, then kvi8 / kvf8. */
static kern_attn_fn *const attn_kv8[KERN__ISA_COUNT][2] = {
    {kern_attn_kvi8_f32_ref, kern_attn_kvf8_f32_ref},
    {kern_attn_kvi8_f32_avx2, kern_attn_kvf8_f32_avx2},
    {kern_attn_kvi8_f32_avx512, kern_attn_kvf8_f32_avx512}};

kern_attn_fn *kern_attn_kv8_variant(enum dtype kvt)
{
    if (!dtype_is_kv8(kvt))
        return NULL;
    return attn_kv8[kern__ops.isa][kvt == DT_KV_E4M3];
}

/* ---- LoRA int8 adapter weights (kern.h "on int8 adapter weights"): the active ISA's variant.
 * Not a model dtype, so not a column of kern__traits; indexed by enum kern_isa like isa_ops.
 * The AVX-512 column needs AVX-512 VNNI, which kern_isa_supported(KERN_ISA_AVX512) requires. */

static kern_lora_shrink_fn *const lora_i8_shrink[KERN__ISA_COUNT] = {
    kern_lora_shrink_i8_ref, kern_lora_shrink_i8_avx2, kern_lora_shrink_i8_avx512};
static kern_lora_expand_fn *const lora_i8_expand[KERN__ISA_COUNT] = {
    kern_lora_expand_i8_ref, kern_lora_expand_i8_avx2, kern_lora_expand_i8_avx512};

void kern_lora_shrink_i8(const void *a, size_t in, size_t rank, const float *x, size_t n,
                         float *t, size_t k0, size_t k1)
{
    CHECK(k0 <= k1 && k1 <= rank);
    lora_i8_shrink[kern__ops.isa](a, in, rank, x, n, t, k0, k1);
}

void kern_lora_expand_i8(const void *bt, size_t rank, const float *t, size_t n,
                         const float *scale, float s, float *y, size_t ldy, size_t j0,
                         size_t j1)
{
    CHECK(j0 <= j1);
    lora_i8_expand[kern__ops.isa](bt, rank, t, n, scale, s, y, ldy, j0, j1);
}
