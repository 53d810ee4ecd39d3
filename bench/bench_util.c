/* bench_util.c — see bench_util.h. */
#include "bench_util.h"

#include "half.h"
#include "kern.h"

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct stream_ctx {
    const uint8_t *buf;
    uint64_t sink[256];
};

__attribute__((target("avx512f"))) static uint64_t stream_avx512(const uint8_t *p, size_t n)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 256 <= n; i += 256) {
        a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
        a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + 64));
        a2 = _mm512_xor_si512(a2, _mm512_load_si512(p + i + 128));
        a3 = _mm512_xor_si512(a3, _mm512_load_si512(p + i + 192));
    }
    __m512i s = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
    return (uint64_t)_mm512_reduce_or_epi64(s);
}

__attribute__((target("avx2"))) static uint64_t stream_avx2(const uint8_t *p, size_t n)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    __m256i s = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return (uint64_t)_mm256_extract_epi64(s, 0) | (uint64_t)_mm256_extract_epi64(s, 3);
}

static void stream_range(void *arg, size_t b, size_t e, int thread)
{
    struct stream_ctx *c = arg;
    /* 4 KiB granules keep every range aligned for the aligned loads */
    const uint8_t *p = c->buf + b * 4096;
    size_t n = (e - b) * 4096;
    c->sink[thread] += __builtin_cpu_supports("avx512f") ? stream_avx512(p, n) : stream_avx2(p, n);
}

double bench_bandwidth(struct pool *p, size_t bytes, int reps)
{
    bytes = bytes / 4096 * 4096;
    uint8_t *buf = aligned_alloc(4096, bytes);
    if (!buf)
        return 0;
    memset(buf, 1, bytes); /* fault every page in before timing */
    struct stream_ctx c = {buf, {0}};
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t = bench_now();
        /* one shard per participant: each streams one contiguous region */
        size_t pages = bytes / 4096, grain = (pages + (size_t)pool_threads(p) - 1) / (size_t)pool_threads(p);
        pool_for(p, 0, pages, grain, stream_range, &c);
        t = bench_now() - t;
        if ((double)bytes / t > best)
            best = (double)bytes / t;
    }
    free(buf);
    return best / 1e9;
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
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
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
