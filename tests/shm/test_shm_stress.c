/*
 * test_shm_stress.c — two processes over one region, as clocherd and a worker use it.
 *
 *  - echo: this process (the gateway side) creates the region and fork+execs itself as the
 *    worker (`--child echo`, the region's fd inherited like clocher-worker's --region-fd). A
 *    producer thread sends N records of random sizes (index + checksum inside); the child
 *    verifies each and sends it back on the events ring; the main thread verifies every echo in
 *    order. Each of the three parties has slow phases, so both rings run full and empty and
 *    every kind of sleep and wake-up happens. N = --records (default 10 million).
 *  - kill the worker: the child produces events forever; after some thousands the gateway
 *    SIGKILLs it, drains what was committed (still verified in order), and must see -EPIPE
 *    ("its process exited") within a bounded time, on its consumer and its producer end.
 *  - kill the gateway: a forked child creates the region and hands the fd over (SCM_RIGHTS);
 *    this process attaches as the worker, consumes, SIGKILLs the gateway, and must see -EPIPE
 *    within the same bound.
 */
#include "testutil.h"

#include "err.h"
#include "log.h"
#include "region.h"
#include "shmtest.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REQ_SEED 1001
#define EV_SEED 2002
#define CHILD_FD 10
#define GEN 3u
#define DETECT_BOUND_NS (1000ull * 1000000) /* a dead peer is noticed within 1 s */

static uint64_t g_records = 10000000;

/* Slow phases, by record index: 0 nobody, 1 the gateway's producer, 2 the worker, 3 the
 * gateway's consumer. A slow party naps every 256 records. */
static void maybe_nap(uint64_t i, int who)
{
    if ((int)((i >> 16) & 3) == who && (i & 255) == 0) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 50 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Reads the next record, sleeping as needed. 0, or the wait's/read's code. */
static int next(struct shm_ring *rx, uint8_t *buf, uint32_t cap, uint32_t *type, uint32_t *len)
{
    int rc;
    while ((rc = shm_ring_read(rx, buf, cap, type, len)) == -EAGAIN)
        if ((rc = shm_ring_wait_readable(rx, -1)) < 0)
            return rc;
    return rc;
}

/* Sends record i of stream `seed`, sleeping while the ring is full. */
static int send_rec(struct shm_ring *tx, uint64_t seed, uint64_t i)
{
    uint32_t max = shm_ring_max_record(tx), len = st_len(seed, i, max);
    void *p;
    int rc;
    while ((rc = shm_ring_reserve(tx, st_type(seed, i), len, &p)) == -EAGAIN)
        if ((rc = shm_ring_wait_writable(tx, len, -1)) < 0)
            return rc;
    if (rc < 0)
        return rc;
    st_fill(seed, i, p, len);
    shm_ring_commit(tx);
    return 0;
}

/* ---- the child: clocher-worker's role ---- */

static int child_main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s --child echo|produce FD GEN RECORDS\n", argv[0]);
        return 2;
    }
    const char *mode = argv[2];
    int fd = atoi(argv[3]);
    uint32_t gen = (uint32_t)atoi(argv[4]);
    uint64_t n = strtoull(argv[5], NULL, 10);
    struct shm_region *r;
    if (shm_region_attach(fd, gen, &r) < 0)
        return 3;
    close(fd);
    shm_region_set_name(r, "child");
    shm_region_set_state(r, SHM_STATE_READY);
    struct shm_ring *rx = shm_region_rx(r), *tx = shm_region_tx(r);
    uint32_t max = shm_region_max_record(r);
    uint8_t *buf = malloc(max);
    int status = 0;
    if (strcmp(mode, "produce") == 0) {
        for (uint64_t i = 0;; i++) /* until killed */
            if (send_rec(tx, EV_SEED, i) < 0) {
                status = 4;
                break;
            }
    } else {
        for (uint64_t i = 0; i < n; i++) {
            uint32_t type, len;
            char why[160];
            int rc = next(rx, buf, max, &type, &len);
            if (rc < 0) {
                fprintf(stderr, "child: request %llu: %s\n", (unsigned long long)i, err_name(rc));
                status = 5;
                break;
            }
            if (st_check(REQ_SEED, i, max, type, buf, len, why, sizeof why) != 0) {
                fprintf(stderr, "child: %s\n", why);
                status = 6;
                break;
            }
            void *p;
            while ((rc = shm_ring_reserve(tx, type, len, &p)) == -EAGAIN)
                if ((rc = shm_ring_wait_writable(tx, len, -1)) < 0)
                    break;
            if (rc < 0) {
                fprintf(stderr, "child: echo %llu: %s\n", (unsigned long long)i, err_name(rc));
                status = 7;
                break;
            }
            memcpy(p, buf, len);
            shm_ring_commit(tx);
            maybe_nap(i, 2);
        }
    }
    free(buf);
    shm_region_close(r);
    return status;
}

static pid_t spawn_child(struct shm_region *r, const char *mode, uint64_t n)
{
    char fd_s[16], gen_s[16], n_s[32];
    snprintf(fd_s, sizeof fd_s, "%d", CHILD_FD);
    snprintf(gen_s, sizeof gen_s, "%u", shm_region_generation(r));
    snprintf(n_s, sizeof n_s, "%llu", (unsigned long long)n);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* what uv_spawn does for clocher-worker: the memfd at a fixed number, cloexec cleared */
        if (dup2(shm_region_fd(r), CHILD_FD) < 0)
            _exit(120);
        char *args[] = {"test_shm_stress", "--child", (char *)mode, fd_s, gen_s, n_s, NULL};
        execv("/proc/self/exe", args);
        _exit(121);
    }
    /* the gateway trusts the pid it spawned, not what the region will say */
    assert_int_equal(shm_region_set_peer_pid(r, pid), 0);
    shm_region_close_fd(r);
    return pid;
}

/* ---- echo: N records each way, verified in order ---- */

struct producer {
    struct shm_region *r;
    uint64_t n;
    int rc;
    uint64_t at;
};

static void *produce_requests(void *arg)
{
    struct producer *p = arg;
    struct shm_ring *tx = shm_region_tx(p->r);
    for (uint64_t i = 0; i < p->n; i++) {
        if ((p->rc = send_rec(tx, REQ_SEED, i)) < 0) {
            p->at = i;
            return NULL;
        }
        maybe_nap(i, 1);
    }
    return NULL;
}

static void test_echo(void **state)
{
    (void)state;
    struct shm_region *r;
    assert_int_equal(shm_region_create(GEN, 0, &r), 0);
    shm_region_set_name(r, "stress");
    uint64_t t0 = st_now_ns();
    pid_t pid = spawn_child(r, "echo", g_records);
    struct producer prod = {.r = r, .n = g_records};
    pthread_t th;
    pthread_create(&th, NULL, produce_requests, &prod);

    struct shm_ring *rx = shm_region_rx(r);
    uint32_t max = shm_region_max_record(r);
    uint8_t *buf = malloc(max);
    uint64_t bytes = 0;
    for (uint64_t i = 0; i < g_records; i++) {
        uint32_t type, len;
        char why[160];
        int rc = next(rx, buf, max, &type, &len);
        if (rc < 0)
            fail_msg("echo %llu: %s: %s", (unsigned long long)i, err_name(rc), log_last_error());
        /* the echo of request i is request i, byte for byte */
        if (st_check(REQ_SEED, i, max, type, buf, len, why, sizeof why) != 0)
            fail_msg("%s", why);
        bytes += len;
        maybe_nap(i, 3);
    }
    pthread_join(th, NULL);
    if (prod.rc < 0)
        fail_msg("request %llu: %s", (unsigned long long)prod.at, err_name(prod.rc));
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    double secs = (double)(st_now_ns() - t0) / 1e9;
    const struct shm_ring_stats *ts = &shm_region_tx(r)->stats, *rs = &rx->stats;
    print_message("echo: %llu records each way (%.1f MB) in %.2f s: %.2f M records/s; gateway tx "
                  "pads %llu full %llu sleeps %llu wakes %llu; rx sleeps %llu wakes %llu\n",
                  (unsigned long long)g_records, (double)bytes / 1e6, secs,
                  2.0 * (double)g_records / secs / 1e6, (unsigned long long)ts->pads,
                  (unsigned long long)ts->full, (unsigned long long)ts->sleeps,
                  (unsigned long long)ts->wakes, (unsigned long long)rs->sleeps,
                  (unsigned long long)rs->wakes);
    assert_int_equal(ts->records, g_records);
    assert_int_equal(rs->records, g_records);
    assert_true(ts->pads > 0);
    if (g_records >= 1000000) {
        /* the speeds differed: the producer found the ring full and slept, the consumer found
         * it empty and slept; and wake-ups stayed far rarer than records */
        assert_true(ts->full > 0 && ts->sleeps > 0 && rs->sleeps > 0);
        assert_true(ts->wakes + rs->wakes < g_records / 10);
    }
    /* the worker said goodbye */
    assert_int_equal(shm_region_check_peer(r), -EPIPE);
    struct shm_peer peer;
    shm_region_peer(r, &peer);
    assert_non_null(strstr(peer.why, "closed its end"));
    free(buf);
    shm_region_close(r);
}

/* ---- SIGKILL mid-stream ---- */

/* Consumes from rx, verifying stream `seed`, until `kill_after` records, then kills `victim`;
 * drains what was committed and expects -EPIPE within DETECT_BOUND_NS. */
static void consume_kill_detect(struct shm_region *r, uint64_t seed, uint64_t kill_after,
                                pid_t victim)
{
    struct shm_ring *rx = shm_region_rx(r);
    uint32_t max = shm_region_max_record(r);
    uint8_t *buf = malloc(max);
    uint64_t i = 0, t_kill = 0;
    int rc;
    tu_log_capture_begin();
    for (;; i++) {
        uint32_t type, len;
        char why[160];
        if (i == kill_after) {
            assert_int_equal(kill(victim, SIGKILL), 0);
            t_kill = st_now_ns();
        }
        if ((rc = next(rx, buf, max, &type, &len)) < 0)
            break;
        if (st_check(seed, i, max, type, buf, len, why, sizeof why) != 0)
            fail_msg("%s", why);
    }
    uint64_t dt = st_now_ns() - t_kill;
    tu_log_capture_end();
    print_message("killed after %llu records; %llu more drained; -EPIPE %.1f ms after the kill\n",
                  (unsigned long long)kill_after, (unsigned long long)(i - kill_after),
                  (double)dt / 1e6);
    assert_true(t_kill != 0);
    assert_int_equal(rc, -EPIPE);
    assert_true(dt < DETECT_BOUND_NS);
    tu_assert_log_contains("is gone: its process exited", NULL);
    free(buf);
}

static void test_kill_worker(void **state)
{
    (void)state;
    struct shm_region *r;
    assert_int_equal(shm_region_create(GEN, 0, &r), 0);
    shm_region_set_name(r, "worker 0");
    pid_t pid = spawn_child(r, "produce", 0);
    consume_kill_detect(r, EV_SEED, 20000, pid);
    /* the producer end gives up as fast: the requests ring fills, and the wait ends */
    struct shm_ring *tx = shm_region_tx(r);
    while (shm_ring_write(tx, 16, NULL, 0) == 0)
        ;
    uint64_t t0 = st_now_ns();
    assert_int_equal(shm_ring_wait_writable(tx, 0, -1), -EPIPE);
    assert_true(st_now_ns() - t0 < DETECT_BOUND_NS);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    shm_region_close(r);
}

static void test_kill_gateway(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* the gateway: create, hand the fd over, produce until killed */
        close(sv[0]);
        struct shm_region *r;
        if (shm_region_create(GEN, 0, &r) < 0)
            _exit(10);
        int fd = shm_region_fd(r);
        char cbuf[CMSG_SPACE(sizeof fd)] = {0};
        char byte = 'r';
        struct iovec iov = {.iov_base = &byte, .iov_len = 1};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                            .msg_controllen = sizeof cbuf};
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof fd);
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
        if (sendmsg(sv[1], &mh, 0) != 1)
            _exit(11);
        shm_region_close_fd(r);
        for (uint64_t i = 0;; i++)
            if (send_rec(shm_region_tx(r), REQ_SEED, i) < 0)
                _exit(12);
    }
    close(sv[1]);
    int fd = -1;
    char cbuf[CMSG_SPACE(sizeof fd)];
    char byte;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                        .msg_controllen = sizeof cbuf};
    assert_int_equal(recvmsg(sv[0], &mh, MSG_CMSG_CLOEXEC), 1);
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    assert_non_null(c);
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
    close(sv[0]);
    struct shm_region *r;
    assert_int_equal(shm_region_attach(fd, GEN, &r), 0);
    close(fd);
    shm_region_set_name(r, "worker side");
    consume_kill_detect(r, REQ_SEED, 20000, pid);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    shm_region_close(r);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--child") == 0)
        return child_main(argc, argv);
    /* the count: --records N, else $CLOCHER_SHM_STRESS_RECORDS (set by CMake, smaller in
     * sanitizer builds), else 10 million */
    const char *n = getenv("CLOCHER_SHM_STRESS_RECORDS");
    if (argc == 3 && strcmp(argv[1], "--records") == 0)
        n = argv[2];
    else if (argc != 1) {
        fprintf(stderr, "usage: %s [--records N]\n", argv[0]);
        return 2;
    }
    if (n) {
        char *end;
        g_records = strtoull(n, &end, 10);
        if (end == n || *end || g_records == 0) {
            fprintf(stderr, "%s: record count \"%s\" is not a positive integer\n", argv[0], n);
            return 2;
        }
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_echo),
        cmocka_unit_test(test_kill_worker),
        cmocka_unit_test(test_kill_gateway),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
