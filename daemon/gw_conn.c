/*
 * gw_conn.c — the gateway's connections, where gRPC core 1.51 cannot guard them itself:
 *  - the Unix socket listener is ours (accept, then grpc_server_add_channel_from_fd), so a
 *    second clocherd cannot take a live socket over (a stale one is removed), and each
 *    connection's calls carry a peer name ("fd:N") that says which socket to close;
 *  - HTTP/2 rapid reset (CVE-2023-44487): gRPC 1.51 queues every stream a client opens until
 *    the application asks for it, even after the client reset it, with no bound. The gateway
 *    counts, per connection, the streams a client resets before any answer ("early resets");
 *    past limits.max_early_resets in 10 s it writes a GOAWAY (ENHANCE_YOUR_CALM) and shuts the
 *    socket down, which makes gRPC drop the connection and every stream it still queued;
 *  - the memory those streams took goes back to the system (malloc_trim) once they are freed:
 *    glibc keeps freed arena memory otherwise, and the supervisor is shielded from the OOM
 *    killer.
 *  - limits.max_connections bounds the connections open at once on the Unix listener: one
 *    accepted beyond it is still handed to gRPC, so that its calls can be refused with a
 *    status naming the limit (RESOURCE_EXHAUSTED) rather than a bare reset, and is closed
 *    (GOAWAY) OVER_GRACE_NS later; the connections already open are served as before.
 * TCP connections stay on gRPC's own listener (TLS needs it): their peer names are
 * "ipv4:a.b.c.d:port" / "ipv6:[..]:port", and the socket to close is found by its peer
 * address among this process's descriptors.
 */
#include "gw_internal.h"

#include "log.h"
#include "mono.h"
#include "stats.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define RESET_WINDOW_NS 10000000000ull /* the early-reset count's window */
#define TRIM_FOR_NS 5000000000ull      /* malloc_trim every second for this long after a close */
#define TRIM_AFTER_NS 2000000000ull    /* ... and after the last of its queued streams came */
#define OVER_GRACE_NS 2000000000ull    /* a connection over the cap: time to refuse its calls */

/* ---- the Unix socket listener ---- */

static int unix_addr(const char *path, struct sockaddr_un *a)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof a->sun_path) {
        LOG_ERR("listen.unix %s: longer than %zu bytes", path, sizeof a->sun_path - 1);
        return -ENAMETOOLONG;
    }
    memcpy(a->sun_path, path, strlen(path));
    return 0;
}

/* 1: something accepts connections on path; 0: nothing there, or a stale socket (removed). */
static int unix_live(const char *path, const struct sockaddr_un *a)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return 0;
    if (!S_ISSOCK(st.st_mode)) {
        LOG_ERR("listen.unix %s: exists and is not a socket", path);
        return -EEXIST;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        LOG_ERR("listen.unix %s: socket: %s", path, strerror(e));
        return -e;
    }
    int rc = connect(fd, (const struct sockaddr *)a, sizeof *a);
    int e = errno;
    close(fd);
    if (rc == 0)
        return 1;
    if (e == ECONNREFUSED) {
        LOG_INFO("listen.unix %s: a stale socket (nothing accepts on it): removed", path);
        if (unlink(path) < 0 && errno != ENOENT) {
            e = errno;
            LOG_ERR("listen.unix %s: removing the stale socket: %s", path, strerror(e));
            return -e;
        }
        return 0;
    }
    LOG_ERR("listen.unix %s: cannot tell whether it is in use: %s", path, strerror(e));
    return -e;
}

/* 0 if no other process serves path, -EADDRINUSE if one does (logged). */
static int unix_free(const char *path)
{
    struct sockaddr_un a;
    int rc = unix_addr(path, &a);
    if (rc < 0)
        return rc;
    rc = unix_live(path, &a);
    if (rc == 1) {
        LOG_ERR("gateway: cannot listen on unix:%s: another process (another clocherd?) serves "
                "it; refusing to take it over", path);
        return -EADDRINUSE;
    }
    return rc;
}

int gw_unix_free(const char *path)
{
    return unix_free(path);
}

int gw__conn_listen_unix(struct gw *g, const char *path)
{
    struct sockaddr_un a;
    int rc = unix_addr(path, &a);
    if (rc < 0 || (rc = unix_free(path)) < 0)
        return rc;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        int e = errno;
        LOG_ERR("listen.unix %s: socket: %s", path, strerror(e));
        return -e;
    }
    if (bind(fd, (const struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 128) < 0) {
        int e = errno;
        LOG_ERR("gateway: cannot listen on unix:%s: %s", path, strerror(e));
        close(fd);
        return -e;
    }
    g->unix_fd = fd;
    snprintf(g->unix_path, sizeof g->unix_path, "%s", path);
    LOG_INFO("gateway: listening on unix:%s", path);
    return 0;
}

/* ---- closing an abusive connection ---- */

/* The socket of a TCP peer name as gRPC writes it ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000"),
 * found among this process's descriptors; -1 if none. */
static int tcp_fd_of(const char *peer)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int found = -1;
    struct dirent *de;
    while (found < 0 && (de = readdir(d))) {
        int fd = atoi(de->d_name);
        if (de->d_name[0] < '0' || de->d_name[0] > '9' || fd == dirfd(d))
            continue;
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        if (getpeername(fd, (struct sockaddr *)&ss, &len) < 0)
            continue;
        char host[INET6_ADDRSTRLEN], name[INET6_ADDRSTRLEN + 24];
        if (ss.ss_family == AF_INET) {
            const struct sockaddr_in *in = (const void *)&ss;
            inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
            snprintf(name, sizeof name, "ipv4:%s:%u", host, ntohs(in->sin_port));
        } else if (ss.ss_family == AF_INET6) {
            /* gRPC listens dual-stack: an IPv4 client is a v4-mapped address it names ipv4 */
            const struct sockaddr_in6 *in6 = (const void *)&ss;
            bool mapped = IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr);
            inet_ntop(mapped ? AF_INET : AF_INET6,
                      mapped ? (const void *)&in6->sin6_addr.s6_addr[12]
                             : (const void *)&in6->sin6_addr,
                      host, sizeof host);
            snprintf(name, sizeof name, mapped ? "ipv4:%s:%u" : "ipv6:[%s]:%u", host,
                     ntohs(in6->sin6_port));
        } else {
            continue;
        }
        if (strcmp(name, peer) == 0)
            found = fd;
    }
    closedir(d);
    return found;
}

/* The socket of a peer name: "fd:N" from our Unix listener (checked to be one of its
 * connections: N may have been reused since), or a TCP peer. -1 if none. */
static int fd_of(struct gw *g, const char *peer)
{
    if (strncmp(peer, "fd:", 3) != 0)
        return strncmp(peer, "ipv", 3) == 0 ? tcp_fd_of(peer) : -1;
    int fd = atoi(peer + 3);
    struct sockaddr_un a;
    socklen_t len = sizeof a;
    if (fd < 0 || getsockname(fd, (struct sockaddr *)&a, &len) < 0 || a.sun_family != AF_UNIX ||
        len <= offsetof(struct sockaddr_un, sun_path) || strcmp(a.sun_path, g->unix_path) != 0 ||
        fd == g->unix_fd)
        return -1;
    return fd;
}

/* GOAWAY, last stream 0, ENHANCE_YOUR_CALM (RFC 9113 6.8, 7), then shutdown. */
static void goaway_shut(int fd)
{
    static const unsigned char goaway[17] = {0, 0, 8, 0x7, 0, 0, 0, 0, 0,
                                             0, 0, 0, 0, 0, 0, 0, 0xb};
    (void)!send(fd, goaway, sizeof goaway, MSG_DONTWAIT | MSG_NOSIGNAL);
    shutdown(fd, SHUT_RDWR);
}

/* Closes an abusive connection: GOAWAY then shutdown; gRPC sees the
 * socket end and drops the connection with every stream it still holds. The GOAWAY is written
 * beside gRPC's own writes and may land inside one of its frames; the connection ends anyway. */
static bool close_abuser(struct gw *g, const char *peer, uint32_t resets)
{
    int fd = fd_of(g, peer);
    if (fd < 0) {
        LOG_WARN("gateway: connection %s reset %" PRIu32 " streams before any answer in 10 s "
                 "(limits.max_early_resets): its socket is gone already", peer, resets);
        return false;
    }
    goaway_shut(fd);
    atomic_store(&g->trim_until_ns, mono_ns() + TRIM_FOR_NS);
    LOG_WARN("gateway: connection %s reset %" PRIu32 " streams before any answer in 10 s "
             "(limits.max_early_resets): GOAWAY, closed", peer, resets);
    return true;
}

void gw__conn_early_reset(struct gw *g, const char *peer, uint32_t limit)
{
    uint64_t now = mono_ns();
    uint32_t count = 0;
    pthread_mutex_lock(&g->conn_mu);
    struct gw_peer *p = NULL, *oldest = &g->peers[0];
    for (size_t i = 0; i < GW_PEERS; i++) {
        if (strcmp(g->peers[i].name, peer) == 0) {
            p = &g->peers[i];
            break;
        }
        if (g->peers[i].window_ns < oldest->window_ns)
            oldest = &g->peers[i];
    }
    if (!p) {
        p = oldest;
        snprintf(p->name, sizeof p->name, "%s", peer);
        p->window_ns = now, p->resets = 0;
    }
    if (now - p->window_ns > RESET_WINDOW_NS)
        p->window_ns = now, p->resets = 0;
    count = ++p->resets;
    pthread_mutex_unlock(&g->conn_mu);
    /* once at the limit: the streams already queued behind it come back reset as well, and
     * while they drain (each one's memory freed) the connection thread keeps trimming */
    bool closed = count == limit + 1 && close_abuser(g, peer, count);
    if (count > limit + 1)
        atomic_store(&g->trim_until_ns, now + TRIM_AFTER_NS);
    if (g->stats)
        stats_early_reset(g->stats, closed);
}

/* A connection accepted on our socket: it starts with a clean count and is not over the cap
 * (its fd number may have served an earlier connection). */
static void forget_peer(struct gw *g, int fd)
{
    char name[32];
    snprintf(name, sizeof name, "fd:%d", fd);
    pthread_mutex_lock(&g->conn_mu);
    for (size_t i = 0; i < GW_PEERS; i++)
        if (strcmp(g->peers[i].name, name) == 0)
            g->peers[i].name[0] = '\0', g->peers[i].resets = 0;
    /* an over-cap connection gRPC closed before its grace ended: the number is another's now */
    for (size_t i = 0; i < g->n_over;)
        if (g->over[i].fd == fd)
            g->over[i] = g->over[--g->n_over];
        else
            i++;
    pthread_mutex_unlock(&g->conn_mu);
}

/* ---- limits.max_connections ---- */

/* Connections open now on our Unix socket (the listener excluded): every socket of this
 * process bound to its path. Counted afresh, so a connection gRPC closed is never counted. */
static size_t unix_connections(struct gw *g)
{
    DIR *d = g->fd_dir;
    if (!d)
        return 0;
    rewinddir(d); /* procfs lists the descriptors open now on each read from the start */
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        int fd = atoi(de->d_name);
        if (de->d_name[0] < '0' || de->d_name[0] > '9' || fd == dirfd(d) || fd == g->unix_fd)
            continue;
        struct sockaddr_un a;
        socklen_t len = sizeof a;
        if (getsockname(fd, (struct sockaddr *)&a, &len) == 0 && a.sun_family == AF_UNIX &&
            len > offsetof(struct sockaddr_un, sun_path) && strcmp(a.sun_path, g->unix_path) == 0)
            n++;
    }
    return n;
}

bool gw__conn_over(struct gw *g, const char *peer)
{
    if (strncmp(peer, "fd:", 3) != 0)
        return false;
    int fd = atoi(peer + 3);
    bool over = false;
    pthread_mutex_lock(&g->conn_mu);
    for (size_t i = 0; i < g->n_over && !over; i++)
        over = g->over[i].fd == fd;
    pthread_mutex_unlock(&g->conn_mu);
    return over;
}

/* A connection just accepted (fd): 0 if it is within limits.max_connections; 1 if it is over
 * (noted for refusal and a later close); -1 if over and closed at once (too many wait). */
static int admit_over(struct gw *g, int fd)
{
    struct config *c = config_ptr_get(g->w->config);
    uint32_t cap = c->limits.max_connections;
    config_unref(c);
    size_t open = unix_connections(g); /* this one included */
    if (open <= cap)
        return 0;
    pthread_mutex_lock(&g->conn_mu);
    bool noted = g->n_over < GW_OVER;
    if (noted)
        g->over[g->n_over++] = (struct gw_over){.fd = fd, .close_ns = mono_ns() + OVER_GRACE_NS};
    pthread_mutex_unlock(&g->conn_mu);
    LOG_WARN("gateway: connection fd:%d is over limits.max_connections (%zu open, the limit is "
             "%" PRIu32 "): %s", fd, open, cap,
             noted ? "its calls are refused, then it is closed" : "closed");
    if (!noted)
        close(fd);
    return noted ? 1 : -1;
}

/* Closes the over-cap connections whose grace has passed (connection thread). */
static void close_over(struct gw *g, uint64_t now)
{
    pthread_mutex_lock(&g->conn_mu);
    for (size_t i = 0; i < g->n_over;) {
        if (now >= g->over[i].close_ns) {
            /* still one of our socket's connections (gRPC may have closed it and the number
             * gone to another descriptor; one of ours would have cleared it, forget_peer) */
            char peer[32];
            snprintf(peer, sizeof peer, "fd:%d", g->over[i].fd);
            if (fd_of(g, peer) >= 0)
                goaway_shut(g->over[i].fd); /* gRPC closes the descriptor itself */
            g->over[i] = g->over[--g->n_over];
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&g->conn_mu);
}

/* ---- the connection thread: accepts on the Unix socket, gives memory back ---- */

static void *conn_main(void *arg)
{
    struct gw *g = arg;
    grpc_server_credentials *insecure = grpc_insecure_server_credentials_create();
    while (!atomic_load(&g->stopping)) {
        struct pollfd p[2] = {{.fd = g->wake[0], .events = POLLIN},
                              {.fd = g->unix_fd, .events = POLLIN}};
        int n = poll(p, g->unix_fd >= 0 ? 2 : 1, g->n_over ? 200 : 1000);
        if (n < 0 && errno != EINTR) {
            int e = errno;
            LOG_ERR("gateway: poll: %s", strerror(e));
            break;
        }
        if (atomic_load(&g->stopping))
            break;
        uint64_t until = atomic_load(&g->trim_until_ns), now = mono_ns();
        if (until && now < until)
            malloc_trim(0);
        close_over(g, now);
        if (n <= 0 || !(p[1].revents & POLLIN))
            continue;
        for (;;) {
            int fd = accept4(g->unix_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd < 0) {
                int e = errno;
                if (e == EMFILE || e == ENFILE)
                    LOG_WARN("gateway: accept on unix:%s: %s", g->unix_path, strerror(e));
                break;
            }
            forget_peer(g, fd);
            if (admit_over(g, fd) < 0)
                continue; /* over the cap with too many waiting already: closed */
            /* gRPC owns fd from here (non-blocking, as its endpoints expect) */
            grpc_server_add_channel_from_fd(g->server, fd, insecure);
        }
    }
    grpc_server_credentials_release(insecure);
    return NULL;
}

int gw__conn_start(struct gw *g)
{
    if (pipe2(g->wake, O_CLOEXEC) < 0) {
        int e = errno;
        LOG_ERR("gateway: pipe2: %s", strerror(e));
        return -e;
    }
    g->fd_dir = opendir("/proc/self/fd"); /* happens-before the thread that reads it */
    if (!g->fd_dir) {
        int e = errno;
        LOG_WARN("gateway: /proc/self/fd: %s; limits.max_connections is not enforced",
                 strerror(e));
    }
    int e = pthread_create(&g->conn_thread, NULL, conn_main, g);
    if (e != 0) {
        LOG_ERR("gateway: pthread_create: %s", strerror(e));
        close(g->wake[0]), close(g->wake[1]);
        g->wake[0] = g->wake[1] = -1;
        if (g->fd_dir)
            closedir(g->fd_dir), g->fd_dir = NULL;
        return -e;
    }
    g->conn_started = true;
    return 0;
}

void gw__conn_stop(struct gw *g)
{
    if (g->conn_started) {
        (void)!write(g->wake[1], "x", 1);
        pthread_join(g->conn_thread, NULL);
        g->conn_started = false;
    }
    for (int i = 0; i < 2; i++)
        if (g->wake[i] >= 0)
            close(g->wake[i]), g->wake[i] = -1;
    if (g->fd_dir) /* the connection thread, its only reader, has joined */
        closedir(g->fd_dir), g->fd_dir = NULL;
    if (g->unix_fd >= 0) {
        close(g->unix_fd);
        g->unix_fd = -1;
        /* ours: we bound it (a live one of another process was never touched) */
        if (unlink(g->unix_path) < 0 && errno != ENOENT) {
            int e = errno;
            LOG_WARN("gateway: removing unix:%s: %s", g->unix_path, strerror(e));
        }
    }
}
