/*
 * test_sup.c — clocherd's supervisor driving real clocher-worker processes on stories260K
 * (converted to IEBIN by the test), observed the way an operator and systemd see it: the
 * sd_notify datagrams (the test binds NOTIFY_SOCKET), the log, the process table.
 *
 *  - start with --workers 2: both workers become ready, READY=1, watchdog pings;
 *  - SIGKILL one worker: it is respawned with the next generation within 10 s and becomes
 *    ready again, the daemon and the other worker stay up;
 *  - a worker that exits 2 (the model made unreadable before its respawn) is not respawned;
 *    a SIGHUP after the fix brings it back;
 *  - an invalid configuration on SIGHUP is refused and the running one kept;
 *  - crash loop: crash_loop_max kills within the window give the slot up;
 *  - hot replication configured: every worker reports the tensors it made node-local;
 *  - a model no worker can load: clocherd exits 2;
 *  - SIGTERM: STOPPING=1, workers stopped, exit status 0.
 */
#include "testutil.h"
#include "mono.h"

#include "llama2c.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char *g_tmp;       /* scratch dir */
static char g_model[4096];
static char g_model_lc[4096]; /* test_lifecycle's own copy: it breaks and repairs it */

struct daemon {
    pid_t pid;
    int notify_fd;
    char log[4096];
    char notes[16384]; /* every sd_notify datagram received, newline separated */
    size_t notes_len;
};

static double now_s(void) { return mono_sec(); }

static int setup(void **state)
{
    (void)state;
    g_tmp = tu_mkdtemp();
    snprintf(g_model, sizeof g_model, "%s/model", g_tmp);
    snprintf(g_model_lc, sizeof g_model_lc, "%s/model-lc", g_tmp);
    if (llama2c_convert(tu_fixture("stories260K/stories260K.bin"), NULL, 0, g_model, DT_F32,
                        NULL) != 0 ||
        llama2c_convert(tu_fixture("stories260K/stories260K.bin"), NULL, 0, g_model_lc, DT_F32,
                        NULL) != 0)
        fail_msg("llama2c_convert: %s", log_last_error());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(g_tmp);
    free(g_tmp);
    return 0;
}

static void write_config(const char *path, const char *model, const char *extra)
{
    char buf[16384];
    snprintf(buf, sizeof buf,
             "{\"model_dir\": \"%s\", \"workers\": 2,\n"
             " \"listen\": {\"tcp\": null, \"unix\": \"%s/clocherd.sock\"},\n"
             " \"metrics\": {\"listen\": null},\n"
             " \"drain_timeout_s\": 5%s}\n",
             model, g_tmp, extra ? extra : "");
    tu_write_file(path, buf, strlen(buf));
}

/* Starts clocherd with `args` (NULL-terminated, after the program name). */
static void start(struct daemon *d, const char *const *args)
{
    memset(d, 0, sizeof *d);
    char sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
    if ((size_t)snprintf(sock, sizeof sock, "%s/notify.sock", g_tmp) >= sizeof sock)
        fail_msg("TMPDIR is too long for a Unix socket path");
    unlink(sock);
    d->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(d->notify_fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
    assert_int_equal(bind(d->notify_fd, (struct sockaddr *)&sa, sizeof sa), 0);
    snprintf(d->log, sizeof d->log, "%s/clocherd.log", g_tmp);

    const char *argv[32] = {tu_build_path("daemon/clocherd"), "--worker-binary",
                            tu_build_path("worker/clocher-worker")};
    int n = 3;
    for (const char *const *a = args; *a; a++)
        argv[n++] = *a;
    argv[n] = NULL;
    d->pid = fork();
    assert_true(d->pid >= 0);
    if (d->pid == 0) {
        int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, STDERR_FILENO);
        dup2(fd, STDOUT_FILENO);
        setenv("NOTIFY_SOCKET", sock, 1);
        setenv("WATCHDOG_USEC", "400000", 1); /* a ping every 200 ms */
        unsetenv("WATCHDOG_PID");
        setenv("CLOCHER_LOG", "info", 1);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
}

static const char *log_text(struct daemon *d)
{
    static char *buf;
    free(buf);
    buf = tu_read_file(d->log, NULL);
    return buf;
}

static void drain_notes(struct daemon *d, int timeout_ms)
{
    struct pollfd p = {.fd = d->notify_fd, .events = POLLIN};
    while (poll(&p, 1, timeout_ms) > 0) {
        char msg[4096];
        ssize_t n = recv(d->notify_fd, msg, sizeof msg - 1, 0);
        if (n <= 0)
            break;
        msg[n] = '\0';
        if (d->notes_len + (size_t)n + 2 < sizeof d->notes) {
            memcpy(d->notes + d->notes_len, msg, (size_t)n);
            d->notes_len += (size_t)n;
            d->notes[d->notes_len++] = '\n';
            d->notes[d->notes_len] = '\0';
        }
        timeout_ms = 0;
    }
}

/* Waits until the notifications received since `from` contain `needle`. */
static void wait_note(struct daemon *d, size_t from, const char *needle, double timeout)
{
    double end = now_s() + timeout;
    while (now_s() < end) {
        drain_notes(d, 100);
        if (d->notes_len >= from && strstr(d->notes + from, needle))
            return;
        int st;
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            fprintf(stderr, "notifications:\n%s\nlog:\n%s\n", d->notes + from, log_text(d));
            fail_msg("clocherd exited (status 0x%x) before \"%s\"", st, needle);
        }
    }
    fprintf(stderr, "notifications:\n%s\nlog:\n%s\n", d->notes + from, log_text(d));
    fail_msg("no \"%s\" from clocherd within %.0f s (notifications and log above)", needle,
             timeout);
}

/* Waits for `needle` in the log at or after byte offset `from`; returns its offset. */
static size_t wait_log(struct daemon *d, size_t from, const char *needle, double timeout)
{
    double end = now_s() + timeout;
    for (;;) {
        const char *t = log_text(d);
        if (strlen(t) >= from) {
            const char *p = strstr(t + from, needle);
            if (p)
                return (size_t)(p - t);
        }
        if (now_s() >= end) {
            fprintf(stderr, "log:\n%s\n", t);
            fail_msg("\"%s\" not logged within %.0f s (log above)", needle, timeout);
        }
        drain_notes(d, 50);
    }
}

/* The pid and generation of the latest start of worker `slot` in the log after `from`. */
static pid_t worker_pid(struct daemon *d, size_t from, unsigned slot, unsigned *gen)
{
    char needle[64];
    snprintf(needle, sizeof needle, "worker %u: started pid ", slot);
    const char *t = log_text(d);
    const char *p = NULL, *q = t + from;
    while ((q = strstr(q, needle))) {
        p = q;
        q++;
    }
    if (!p)
    {
        fprintf(stderr, "clocherd log:\n%s\n", t);
        fail_msg("worker %u never started (log above)", slot);
    }
    int pid = 0;
    unsigned g = 0;
    assert_int_equal(sscanf(p + strlen(needle), "%d, generation %u", &pid, &g), 2);
    if (gen)
        *gen = g;
    return pid;
}

/* cmocka truncates long failure messages: the log goes to stderr first */
#define FAIL_LOG(d, ...)                                                                      \
    do {                                                                                      \
        fprintf(stderr, "clocherd log:\n%s\n", log_text(d));                                  \
        fail_msg(__VA_ARGS__);                                                                \
    } while (0)

static bool alive(pid_t pid) { return kill(pid, 0) == 0; }

static int stop(struct daemon *d, double timeout)
{
    kill(d->pid, SIGTERM);
    double end = now_s() + timeout;
    int st = 0;
    while (waitpid(d->pid, &st, WNOHANG) == 0) {
        if (now_s() >= end) {
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &st, 0);
            FAIL_LOG(d, "clocherd did not stop within %.0f s", timeout);
        }
        drain_notes(d, 50);
    }
    drain_notes(d, 0);
    close(d->notify_fd);
    return st;
}

static int wait_exit(struct daemon *d, double timeout)
{
    double end = now_s() + timeout;
    int st = 0;
    while (waitpid(d->pid, &st, WNOHANG) == 0) {
        if (now_s() >= end) {
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &st, 0);
            FAIL_LOG(d, "clocherd did not exit within %.0f s", timeout);
        }
        drain_notes(d, 50);
    }
    close(d->notify_fd);
    return st;
}

static void test_lifecycle(void **state)
{
    (void)state;
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/clocherd.json", g_tmp);
    write_config(cfg, g_model_lc,
                 ", \"supervisor\": {\"respawn_initial_ms\": 50, \"respawn_max_ms\": 400}");
    struct daemon d;
    const char *args[] = {"--config", cfg, NULL};
    start(&d, args);

    /* both workers ready, then READY=1 and watchdog pings */
    wait_note(&d, 0, "READY=1", 60);
    assert_non_null(strstr(log_text(&d), "all 2 workers ready"));
    size_t n0 = d.notes_len;
    wait_note(&d, n0, "WATCHDOG=1", 5);
    assert_non_null(strstr(d.notes, "STATUS=serving: 2/2 workers ready"));
    unsigned g0, g1;
    pid_t w0 = worker_pid(&d, 0, 0, &g0), w1 = worker_pid(&d, 0, 1, &g1);
    assert_int_equal(g0, 1);
    assert_int_equal(g1, 1);
    assert_true(alive(w0) && alive(w1));

    /* SIGKILL worker 1: respawned with generation 2 within 10 s, ready again */
    size_t at = strlen(log_text(&d));
    double t0 = now_s();
    assert_int_equal(kill(w1, SIGKILL), 0);
    at = wait_log(&d, at, "was killed by signal 9", 5);
    at = wait_log(&d, at, "worker 1: started pid", 10);
    unsigned g1b;
    pid_t w1b = worker_pid(&d, at, 1, &g1b);
    assert_int_equal(g1b, 2);
    assert_true(w1b != w1);
    wait_log(&d, at, "worker 1 (pid", 10);
    wait_log(&d, at, "generation 2): ready", 10);
    assert_true(now_s() - t0 < 10.0);
    assert_true(alive(d.pid));
    assert_true(alive(w0)); /* the other worker was not touched */

    /* exit 2 is not respawned: make the model unloadable, kill the worker, watch the respawn
     * fail fatally; the daemon stays up with one worker */
    char man[4200], man_bak[4300];
    snprintf(man, sizeof man, "%s/model.ie.json", g_model_lc);
    snprintf(man_bak, sizeof man_bak, "%s.bak", man);
    assert_int_equal(rename(man, man_bak), 0);
    at = strlen(log_text(&d));
    assert_int_equal(kill(w1b, SIGKILL), 0);
    at = wait_log(&d, at, "exited with status 2", 15);
    wait_log(&d, at, "NOT respawning", 2);
    usleep(500 * 1000);
    assert_null(strstr(log_text(&d) + at, "worker 1: started pid")); /* no respawn */
    assert_true(alive(d.pid));
    assert_true(alive(w0));

    /* fixed + SIGHUP: the slot is tried again */
    assert_int_equal(rename(man_bak, man), 0);
    size_t notes_at = d.notes_len;
    at = strlen(log_text(&d));
    assert_int_equal(kill(d.pid, SIGHUP), 0);
    wait_note(&d, notes_at, "RELOADING=1", 5);
    wait_note(&d, notes_at, "READY=1", 5);
    at = wait_log(&d, at, "worker 1: started pid", 10);
    unsigned g1c;
    worker_pid(&d, at, 1, &g1c);
    assert_int_equal(g1c, 4); /* generation 3 was the one that exited 2 */
    wait_log(&d, at, "generation 4): ready", 20);

    /* an invalid configuration on SIGHUP is refused; the daemon keeps running */
    tu_write_file(cfg, "{\"model_dir\": 5}", 16);
    at = strlen(log_text(&d));
    kill(d.pid, SIGHUP);
    at = wait_log(&d, at, "model_dir: must be a string", 5);
    wait_log(&d, at, "reload refused", 2);
    assert_true(alive(d.pid));

    /* SIGTERM: STOPPING=1, workers gone, exit 0 */
    pid_t w1c = worker_pid(&d, 0, 1, NULL);
    notes_at = d.notes_len;
    int st = stop(&d, 30);
    assert_true(strstr(d.notes + notes_at, "STOPPING=1") != NULL);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        FAIL_LOG(&d, "clocherd exited with status 0x%x", st);
    assert_false(alive(w0));
    assert_false(alive(w1c));
    assert_non_null(strstr(log_text(&d), "stopped cleanly"));
}

static void test_crash_loop(void **state)
{
    (void)state;
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/loop.json", g_tmp);
    write_config(cfg, g_model, ", \"supervisor\": {\"respawn_initial_ms\": 20, \"respawn_max_ms\": 40, "
                      "\"crash_loop_max\": 3, \"crash_loop_window_s\": 60}");
    struct daemon d;
    const char *args[] = {"--config", cfg, NULL};
    start(&d, args);
    wait_note(&d, 0, "READY=1", 60);
    size_t at = 0;
    for (int i = 0; i < 3; i++) {
        pid_t w = worker_pid(&d, at, 0, NULL);
        at = strlen(log_text(&d));
        kill(w, SIGKILL);
        at = wait_log(&d, at, "was killed by signal 9", 10);
        if (i < 2)
            at = wait_log(&d, at, "worker 0: started pid", 10);
    }
    wait_log(&d, at, "crash loop, NOT respawning", 5);
    usleep(300 * 1000);
    assert_null(strstr(log_text(&d) + at, "worker 0: started pid"));
    assert_true(alive(d.pid));
    int st = stop(&d, 30);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* IE_HOT_REPLICATE through the configuration: each worker reports what it made node-local */
static void test_hot_replication(void **state)
{
    (void)state;
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/hot.json", g_tmp);
    write_config(cfg, g_model, ", \"hot_replication\": {\"enabled\": true, \"limit_mb\": 64}");
    struct daemon d;
    const char *args[] = {"--config", cfg, NULL};
    start(&d, args);
    wait_note(&d, 0, "READY=1", 60);
    const char *t = log_text(&d);
    /* stories260K: all of its tensors fit in 64 MiB, the tied embedding first */
    assert_non_null(strstr(t, "hot replication: node "));
    assert_non_null(strstr(t, ": 47 tensors"));
    assert_non_null(strstr(t, "(tok_embd .. blk.4."));
    assert_non_null(strstr(t, "MiB of hot tensors node-local (47 tensors)"));
    int st = stop(&d, 30);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_no_worker_can_start(void **state)
{
    (void)state;
    char empty[4096];
    snprintf(empty, sizeof empty, "%s/empty-model", g_tmp);
    mkdir(empty, 0755);
    struct daemon d;
    const char *args[] = {"--model-dir", empty, "--workers", "2", NULL};
    start(&d, args);
    int st = wait_exit(&d, 30);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 2)
        FAIL_LOG(&d, "want exit status 2, got 0x%x", st);
    const char *t = log_text(&d);
    assert_non_null(strstr(t, "model.ie.json"));
    assert_non_null(strstr(t, "no worker could start"));
    assert_null(strstr(d.notes, "READY=1"));
}

static void test_bad_config_exit_2(void **state)
{
    (void)state;
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/bad.json", g_tmp);
    tu_write_file(cfg, "{\"model_dir\": \"m\", \"workerz\": 1}", 32);
    char cmd[16384], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s --config %s 2>&1", tu_build_path("daemon/clocherd"), cfg);
    assert_int_equal(tu_run(cmd, &out), 2);
    assert_non_null(strstr(out, "unknown key \"workerz\""));
    free(out);
    /* --print-plan on a fake two-node tree */
    char topo[4096];
    snprintf(topo, sizeof topo, "%s/topo", g_tmp);
    mkdir(topo, 0755);
    for (int n = 0; n < 2; n++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/node%d", topo, n);
        mkdir(p, 0755);
        tu_write_file(tu_path(p, "cpulist"), n ? "4-7\n" : "0-3\n", 4);
    }
    snprintf(cmd, sizeof cmd, "%s --model-dir %s --topology-root %s --print-plan 2>&1",
             tu_build_path("daemon/clocherd"), g_model, topo);
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_non_null(strstr(out, "2 workers (one per NUMA node)"));
    assert_non_null(strstr(out, "worker 0: node 0, cpus 0-3"));
    assert_non_null(strstr(out, "worker 1: node 1, cpus 4-7"));
    free(out);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_config_exit_2),
        cmocka_unit_test(test_lifecycle),
        cmocka_unit_test(test_crash_loop),
        cmocka_unit_test(test_hot_replication),
        cmocka_unit_test(test_no_worker_can_start),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
