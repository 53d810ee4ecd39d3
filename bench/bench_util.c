/* bench_util.c — see bench_util.h. */
#include "bench_util.h"

#include "half.h"
#include "mono.h"
#include "rng.h"
#include "kern.h"

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double proc_busy_seconds(void)
{
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return 0;
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n < 8)
        return 0;
    /* user nice system idle iowait irq softirq steal: everything but idle and iowait */
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)sysconf(_SC_CLK_TCK);
}

static double self_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

void bench_load_begin(struct bench_load *l)
{
    l->busy = proc_busy_seconds();
    l->self = self_seconds();
    l->wall = bench_now();
}

double bench_load_end(const struct bench_load *l)
{
    double wall = bench_now() - l->wall;
    double other = (proc_busy_seconds() - l->busy) - (self_seconds() - l->self);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (wall <= 0 || ncpu <= 0)
        return 0;
    double share = other / (wall * (double)ncpu);
    return share < 0 ? 0 : share;
}

double bench_now(void) { return mono_sec(); }

uint32_t bench_xorshift(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return (uint32_t)(x >> 11);
}

double bench_thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void *bench_xmalloc(const char *who, size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "%s: out of memory\n", who);
        exit(1);
    }
    return p;
}

int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/*
 * Bandwidth probe. A pass streams the whole buffer once; each participant of the pool reads
 * its contiguous share, cut into S equal parts read side by side (S independent sequential
 * streams, two 64-byte loads from each per step), so that the core has S x 2 misses in
 * flight and the hardware prefetchers follow S streams at once. The variants differ in S
 * and in whether the buffer is backed by 2 MiB pages (fewer TLB misses and page walks; the
 * model's file pages are large folios on this kernel, so decode already streams from them).
 */
#define BW_MAX_STREAMS 8

struct stream_ctx {
    const uint8_t *buf;
    size_t page; /* bytes per pool_for unit */
    int streams;
    uint64_t sink[256];
    size_t read[256]; /* bytes read by each thread this pass */
};

#define STREAM_UNROLL_ _Pragma("GCC unroll 8")

/* S streams of len bytes each (a multiple of 128), starting at p + s * len. */
__attribute__((target("avx512f"), always_inline)) static inline uint64_t
stream_avx512(const uint8_t *p, size_t len, const int S)
{
    __m512i a[BW_MAX_STREAMS][2];
    STREAM_UNROLL_ for (int s = 0; s < S; s++) a[s][0] = a[s][1] = _mm512_setzero_si512();
    for (size_t i = 0; i < len; i += 128) {
        STREAM_UNROLL_ for (int s = 0; s < S; s++)
        {
            const uint8_t *q = p + (size_t)s * len + i;
            a[s][0] = _mm512_xor_si512(a[s][0], _mm512_load_si512(q));
            a[s][1] = _mm512_xor_si512(a[s][1], _mm512_load_si512(q + 64));
        }
    }
    __m512i r = _mm512_setzero_si512();
    STREAM_UNROLL_ for (int s = 0; s < S; s++) r = _mm512_xor_si512(r, _mm512_xor_si512(a[s][0], a[s][1]));
    return (uint64_t)_mm512_reduce_or_epi64(r);
}

__attribute__((target("avx2"), always_inline)) static inline uint64_t
stream_avx2(const uint8_t *p, size_t len, const int S)
{
    __m256i a[BW_MAX_STREAMS][4];
    STREAM_UNROLL_ for (int s = 0; s < S; s++) a[s][0] = a[s][1] = a[s][2] = a[s][3] =
        _mm256_setzero_si256();
    for (size_t i = 0; i < len; i += 128) {
        STREAM_UNROLL_ for (int s = 0; s < S; s++)
        {
            const uint8_t *q = p + (size_t)s * len + i;
            STREAM_UNROLL_ for (int k = 0; k < 4; k++) a[s][k] =
                _mm256_xor_si256(a[s][k], _mm256_load_si256((const __m256i *)(const void *)(q + 32 * k)));
        }
    }
    __m256i r = _mm256_setzero_si256();
    STREAM_UNROLL_ for (int s = 0; s < S; s++) STREAM_UNROLL_ for (int k = 0; k < 4; k++) r =
        _mm256_xor_si256(r, a[s][k]);
    return (uint64_t)_mm256_extract_epi64(r, 0) | (uint64_t)_mm256_extract_epi64(r, 3);
}

/* One instance per stream count, so the loop over streams unrolls into S independent chains. */
#define STREAM_FNS_(S)                                                                       \
    __attribute__((target("avx512f"))) static uint64_t stream512_##S(const uint8_t *p,       \
                                                                     size_t len)             \
    {                                                                                        \
        return stream_avx512(p, len, S);                                                     \
    }                                                                                        \
    __attribute__((target("avx2"))) static uint64_t stream256_##S(const uint8_t *p,          \
                                                                  size_t len)                \
    {                                                                                        \
        return stream_avx2(p, len, S);                                                       \
    }
STREAM_FNS_(1)
STREAM_FNS_(2)
STREAM_FNS_(4)
STREAM_FNS_(8)

static void stream_range(void *arg, size_t b, size_t e, int thread)
{
    struct stream_ctx *c = arg;
    const uint8_t *p = c->buf + b * c->page;
    int S = c->streams;
    size_t len = (e - b) * c->page / (size_t)S / 128 * 128;
    int w = __builtin_cpu_supports("avx512f");
    uint64_t v;
    switch (S) {
    case 1: v = w ? stream512_1(p, len) : stream256_1(p, len); break;
    case 2: v = w ? stream512_2(p, len) : stream256_2(p, len); break;
    case 4: v = w ? stream512_4(p, len) : stream256_4(p, len); break;
    default: v = w ? stream512_8(p, len) : stream256_8(p, len); break;
    }
    c->sink[thread] += v;
    c->read[thread] += len * (size_t)S;
}

/* Share of [p, p+bytes) the kernel backs with anonymous huge pages (from smaps), 0..1. */
static double huge_share(const void *p, size_t bytes)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long lo = 0, hi = 0, kb;
    int in = 0;
    double huge = 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            in = lo < (uintptr_t)p + bytes && hi > (uintptr_t)p;
        else if (in && sscanf(line, "AnonHugePages: %lu kB", &kb) == 1)
            huge += (double)kb * 1024;
    }
    fclose(f);
    return huge / (double)bytes;
}

/* Best of reps passes over buf with S streams per participant, in bytes/s. */
static double bandwidth_pass(struct pool *p, const uint8_t *buf, size_t bytes, int S, int reps)
{
    struct stream_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return 0;
    c->buf = buf;
    c->page = 4096;
    c->streams = S;
    size_t pages = bytes / c->page, nt = (size_t)pool_threads(p);
    double best = 0;
    for (int r = 0; r < reps; r++) {
        memset(c->read, 0, sizeof c->read);
        double t = bench_now();
        /* one shard per participant: each streams one contiguous region */
        pool_for(p, 0, pages, (pages + nt - 1) / nt, stream_range, c);
        t = bench_now() - t;
        size_t got = 0;
        for (size_t i = 0; i < nt && i < 256; i++)
            got += c->read[i];
        if ((double)got / t > best)
            best = (double)got / t;
    }
    volatile uint64_t sink = c->sink[0];
    (void)sink;
    free(c);
    return best;
}

/* An anonymous buffer of bytes aligned to 2 MiB, with or without huge pages, touched. */
static uint8_t *bw_buffer(size_t bytes, int huge, void **base, size_t *len)
{
    const size_t hp = (size_t)2 << 20;
    *len = bytes + hp;
    uint8_t *m = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    *base = m;
    uint8_t *buf = (uint8_t *)(((uintptr_t)m + hp - 1) & ~(uintptr_t)(hp - 1));
    /* explicit either way, so the comparison holds whatever the system's THP default is */
    (void)madvise(buf, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    memset(buf, 1, bytes); /* fault every page in before timing */
    return buf;
}

double bench_bandwidth_ex(struct pool *p, size_t bytes, int reps, struct bench_bw *out)
{
    static const int streams[] = {1, 2, 4, 8};
    struct bench_bw r;
    memset(&r, 0, sizeof r);
    bytes = bytes / ((size_t)2 << 20) * ((size_t)2 << 20);
    if (bytes == 0)
        bytes = (size_t)2 << 20;
    for (int huge = 0; huge < 2; huge++) {
        void *base;
        size_t len;
        uint8_t *buf = bw_buffer(bytes, huge, &base, &len);
        if (!buf)
            continue;
        if (huge)
            r.huge_share = huge_share(buf, bytes);
        for (int k = 0; k < 4; k++) {
            double gbs = bandwidth_pass(p, buf, bytes, streams[k], reps) / 1e9;
            r.each[huge][k] = gbs;
            if (gbs > r.gbs) {
                r.gbs = gbs;
                r.streams = streams[k];
                r.huge = huge;
            }
        }
        munmap(base, len);
    }
    if (out)
        *out = r;
    return r.gbs;
}

double bench_bandwidth(struct pool *p, size_t bytes, int reps)
{
    return bench_bandwidth_ex(p, bytes, reps, NULL);
}

#define CHAINS_(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9)

__attribute__((target("avx512f,avx512bf16,avx512vnni,fma"))) static double peak_avx512(int which)
{
    const long iters = 20000000;
    __m512 b = _mm512_set1_ps(1.0f), cst = _mm512_set1_ps(1e-9f);
    __m512i ib = _mm512_set1_epi8(1);
#define DECL_(i) __m512 f##i = _mm512_set1_ps((float)i); __m512i q##i = _mm512_set1_epi32(i);
    CHAINS_(DECL_)
    double t = bench_now();
    for (long k = 0; k < iters; k++) {
        if (which == 0) {
#define FMA_(i) f##i = _mm512_fmadd_ps(f##i, b, cst);
            CHAINS_(FMA_)
        } else if (which == 1) {
#define BF_(i) f##i = _mm512_dpbf16_ps(f##i, (__m512bh)ib, (__m512bh)ib);
            CHAINS_(BF_)
        } else {
#define DP_(i) q##i = _mm512_dpbusd_epi32(q##i, ib, ib);
            CHAINS_(DP_)
        }
    }
    t = bench_now() - t;
    float sink = 0;
#define SINK_(i) sink += _mm512_reduce_add_ps(f##i) + (float)_mm512_reduce_add_epi32(q##i);
    CHAINS_(SINK_)
    volatile float vs = sink;
    (void)vs;
    /* multiply-adds per instruction: 16 (f32), 32 (bf16 pairs), 64 (int8 quads) */
    static const double macs[] = {16, 32, 64};
    return 10.0 * (double)iters * macs[which] * 2 / t / 1e9;
}

__attribute__((target("avx2,fma"))) static double peak_avx2_fma(void)
{
    const long iters = 20000000;
    __m256 b = _mm256_set1_ps(1.0f), cst = _mm256_set1_ps(1e-9f);
#define DECLY_(i) __m256 f##i = _mm256_set1_ps((float)i);
    CHAINS_(DECLY_)
    double t = bench_now();
    for (long k = 0; k < iters; k++) {
#define FMAY_(i) f##i = _mm256_fmadd_ps(f##i, b, cst);
        CHAINS_(FMAY_)
    }
    t = bench_now() - t;
    float sink = 0;
#define SINKY_(i) sink += f##i[0];
    CHAINS_(SINKY_)
    volatile float vs = sink;
    (void)vs;
    return 10.0 * (double)iters * 8 * 2 / t / 1e9;
}

double bench_peak_gops(int which)
{
    if (kern_isa_supported(KERN_ISA_AVX512) && (which != 1 || kern_has_avx512bf16()))
        return peak_avx512(which);
    if (which == 0 && kern_isa_supported(KERN_ISA_AVX2))
        return peak_avx2_fma();
    return 0;
}

void *bench_random_matrix(enum dtype dt, size_t rows, size_t cols, uint64_t seed)
{
    uint64_t rb;
    if (dtype_row_bytes(dt, cols, &rb) != 0)
        return NULL;
    size_t bytes = (size_t)rb * rows;
    uint8_t *w = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!w)
        return NULL;
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < bytes; i += 8) {
        rng_xorshift64(&s);
        memcpy(w + i, &s, bytes - i < 8 ? bytes - i : 8);
    }
    /* make every value finite and moderate: plain types get a fixed exponent band */
    size_t n = rows * cols;
    switch (dt) {
    case DT_F32:
        for (size_t i = 0; i < n; i++)
            w[i * 4 + 3] = (uint8_t)((w[i * 4 + 3] & 0x80) | 0x3c);
        break;
    case DT_F16:
        for (size_t i = 0; i < n; i++)
            w[i * 2 + 1] = (uint8_t)((w[i * 2 + 1] & 0x83) | 0x2c);
        break;
    case DT_BF16:
        for (size_t i = 0; i < n; i++)
            w[i * 2 + 1] = (uint8_t)((w[i * 2 + 1] & 0x80) | 0x3c);
        break;
    case DT_MXFP4: {
        /* byte 0 of a block is its E8M0 exponent (2^(e-127), 255 = NaN): a valid one near 127,
         * 2^-3..2^3, so products stay O(1) like the other types' (an f16 scale written here
         * would put 0x0a or similar in the exponent byte and the next in the first quants) */
        size_t bb = dtype_info(dt)->block_bytes, blocks = n / dtype_info(dt)->block;
        for (size_t b = 0; b < blocks; b++)
            w[b * bb] = (uint8_t)(124 + w[b * bb] % 7);
        break;
    }
    default: {
        size_t bb = dtype_info(dt)->block_bytes, blocks = n / dtype_info(dt)->block;
        uint16_t d = half_f32_to_f16(0.01f);
        for (size_t b = 0; b < blocks; b++) {
            memcpy(w + b * bb, &d, 2);
            if (dtype_q4g_has_min(dt)) /* the q4z types' f16 offset follows the scale */
                memcpy(w + b * bb + 2, &d, 2);
        }
    }
    }
    return w;
}
