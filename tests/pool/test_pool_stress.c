/*
 * test_pool_stress.c — the thread pool's claim/join protocol under stress: thousands of jobs
 * back to back with 0-40 tasks each, more participants than CPUs (so workers are descheduled
 * mid-job and arrive late), tasks that yield, gaps longer than the pool's spin (so workers and
 * the caller go through the futex sleep), and pool_wake between jobs.
 *
 * Every task writes its own plain (non-atomic) slot of a per-job array: a task run twice, a
 * task of one job claimed under another (the late-claim bug fixed in 372f72f hung the caller
 * on done > n_tasks), or a write not visible when pool_run returns shows up as a count other
 * than 1 and, in the ThreadSanitizer build (label tsan), as a data race. Each configuration
 * runs for a fixed time, so the test takes a few seconds in every build.
 */
#include "testutil.h"

#include "pool.h"

#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_TASKS 40
#define RUN_NS 700000000ull /* per configuration */

struct job {
    int hits[MAX_TASKS];  /* [n] runs of each task: 1 when pool_run returns */
    int thread[MAX_TASKS]; /* [n] the participant that ran it */
    size_t n;
    unsigned work;        /* busy iterations per task */
    int yield_every;      /* a task whose index is a multiple of this yields its CPU (0: none) */
    int n_threads;
};

static atomic_int bad_call; /* a task called with an index or participant out of range */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void stress_task(void *arg, size_t task, int thread)
{
    struct job *j = arg;
    if (task >= j->n || thread < 0 || thread >= j->n_threads) {
        atomic_store(&bad_call, 1); /* cmocka's asserts belong to the main thread */
        return;
    }
    volatile unsigned sink = 0;
    for (unsigned i = 0; i < j->work; i++)
        sink += i;
    (void)sink;
    if (j->yield_every && task % (size_t)j->yield_every == 0)
        sched_yield();
    j->hits[task]++;
    j->thread[task] = thread;
}

/* A pool_run that never returns (a task lost, or counted for the wrong job so that done
 * passes n_tasks) fails the test with its name instead of running into ctest's timeout. */
static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "test_pool_stress: a pool_run did not return within 30 s\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(1);
}

static void watchdog(unsigned seconds)
{
    signal(SIGALRM, on_alarm);
    alarm(seconds);
}

/* xorshift: the job mix is random but the same every run */
static uint32_t rnd(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

static void stress(int n_threads, uint32_t seed)
{
    struct pool *p;
    assert_int_equal(pool_create(n_threads, POOL_PIN_NONE, &p), 0);
    watchdog(30);
    /* two job records used in turn: a late worker of the previous job that read its ctx
     * pointer must not touch the next one's slots */
    static struct job jobs[2];
    uint64_t t0 = now_ns();
    long n_jobs = 0, n_sleeps = 0;
    while (now_ns() - t0 < RUN_NS || n_jobs < 2000) {
        struct job *j = &jobs[n_jobs & 1];
        uint32_t r = rnd(&seed);
        memset(j, 0, sizeof *j);
        j->n = r % 8 == 0 ? r / 8 % (MAX_TASKS + 1) : r / 8 % 5; /* mostly tiny, like decode */
        j->work = rnd(&seed) % 4 == 0 ? rnd(&seed) % 4000 : 0;
        j->yield_every = rnd(&seed) % 16 == 0 ? 3 : 0;
        j->n_threads = n_threads;
        pool_run(p, stress_task, j, j->n);
        for (size_t i = 0; i < j->n; i++)
            if (j->hits[i] != 1)
                fail_msg("threads %d job %ld: task %zu of %zu ran %d times", n_threads, n_jobs,
                         i, j->n, j->hits[i]);
        for (size_t i = j->n; i < MAX_TASKS; i++)
            assert_int_equal(j->hits[i], 0);
        n_jobs++;
        uint32_t g = rnd(&seed) % 512;
        if (g == 0) {
            /* longer than the pool's 200 us spin: the workers go to sleep */
            struct timespec gap = {0, 400 * 1000};
            nanosleep(&gap, NULL);
            n_sleeps++;
        } else if (g < 8) {
            pool_wake(p);
        }
    }
    pool_destroy(p);
    alarm(0);
    assert_int_equal(atomic_load(&bad_call), 0);
    print_message("threads %d: %ld jobs, %ld gaps past the spin\n", n_threads, n_jobs, n_sleeps);
}

static void test_stress_two(void **state)
{
    (void)state;
    stress(2, 0x9e3779b9u);
}

/* more participants than this machine's CPUs: workers are off their CPU mid-job */
static void test_stress_oversubscribed(void **state)
{
    (void)state;
    stress(5, 0x2545f491u);
}

/* pool_for over the same kind of mix: every element in exactly one shard */
struct for_job {
    int hits[1000]; /* [n] */
};

static void for_range(void *arg, size_t b, size_t e, int thread)
{
    (void)thread;
    struct for_job *j = arg;
    for (size_t i = b; i < e; i++)
        j->hits[i]++;
}

static void test_stress_for(void **state)
{
    (void)state;
    struct pool *p;
    assert_int_equal(pool_create(3, POOL_PIN_NONE, &p), 0);
    watchdog(30);
    static struct for_job j;
    uint32_t seed = 12345;
    uint64_t t0 = now_ns();
    for (long k = 0; now_ns() - t0 < RUN_NS / 2 || k < 500; k++) {
        size_t n = rnd(&seed) % 1000, grain = rnd(&seed) % 17 + 1;
        memset(&j, 0, sizeof j);
        pool_for(p, 0, n, grain, for_range, &j);
        for (size_t i = 0; i < 1000; i++)
            if (j.hits[i] != (i < n))
                fail_msg("pool_for(0, %zu, grain %zu): element %zu ran %d times", n, grain, i,
                         j.hits[i]);
    }
    pool_destroy(p);
    alarm(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stress_two),
        cmocka_unit_test(test_stress_oversubscribed),
        cmocka_unit_test(test_stress_for),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
