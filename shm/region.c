/*
 * region.c — the per-worker shared-memory region (region.h, shm_abi.h, docs/SHM.md): memfd
 * creation and sealing, attach-time validation, the two ring ends of each side, heartbeats and
 * the dead-peer check.
 *
 * NOTES: the creator writes the identity part of the header before the fd leaves its process;
 * the worker copies it once at attach, validates the copy and keeps only private values (ring
 * geometry, limits), so a peer rewriting the header later changes nothing here. Each side
 * writes only its own line; the peer's line is loaded field by field and every value checked.
 * The memfd is sealed against shrinking and growing: otherwise a peer could ftruncate it and
 * turn our next access into SIGBUS. The peer bookkeeping (pid, pidfd, verdict) is guarded by
 * `mu` because gateway threads check liveness concurrently; ring ends need no lock here (each
 * belongs to one thread, ring.h).
 */
#include "region.h"

#include "check.h"
#include "err.h"
#include "internal.h"
#include "mono.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define REGION_MAGIC 0x4e474552u /* "REGN" */
#define FUTURE_SLACK_NS 1000000000ull /* a heartbeat may be this far "ahead" (clock reads race) */
#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW)

struct shm_region {
    uint32_t magic;
    enum shm_side_id side;
    int fd;                         /* the creator's memfd; -1 once handed over (and on attach) */
    uint8_t *base;                  /* the mapping: [size] */
    size_t size;
    struct shm_hdr *hdr;            /* == base */
    uint32_t generation;            /* private copies of the identity */
    uint32_t max_record;
    struct shm_ring tx, rx;
    char name[48];

    pthread_mutex_t mu;             /* guards the peer bookkeeping below */
    pid_t peer_pid;                 /* 0 while unknown */
    int pidfd;                      /* -1: none yet, or none possible */
    bool pidfd_unavailable;         /* pidfd_open refused: fall back to kill(pid, 0) */
    uint64_t stale_ns;
    bool gone;
    char why[160];
};

static const char *const ring_names[SHM_RINGS] = {"requests", "events"};

static enum shm_side_id peer_of(const struct shm_region *r)
{
    return r->side == SHM_SIDE_GATEWAY ? SHM_SIDE_WORKER : SHM_SIDE_GATEWAY;
}

static struct shm_side *line(struct shm_region *r, enum shm_side_id s)
{
    return &r->hdr->sides[s];
}

static void name_rings(struct shm_region *r)
{
    char buf[sizeof r->tx.name];
    unsigned tx = r->side == SHM_SIDE_GATEWAY ? SHM_RING_REQUESTS : SHM_RING_EVENTS;
    snprintf(buf, sizeof buf, "%s gen %" PRIu32 " %s ring", r->name, r->generation,
             ring_names[tx]);
    shm_ring_set_name(&r->tx, buf);
    snprintf(buf, sizeof buf, "%s gen %" PRIu32 " %s ring", r->name, r->generation,
             ring_names[1 - tx]);
    shm_ring_set_name(&r->rx, buf);
}

void shm_region_set_name(struct shm_region *r, const char *name)
{
    snprintf(r->name, sizeof r->name, "%s", name && *name ? name : "shm region");
    name_rings(r);
}

static int ring_peer_cb(void *ud)
{
    struct shm_region *r = ud;
    shm_region_heartbeat(r); /* a side waiting on its rings is alive */
    return shm_region_check_peer(r);
}

/* Opens this side's two ends over the (validated) geometry. */
static int open_rings(struct shm_region *r, const struct shm_ring_desc *d)
{
    bool gw = r->side == SHM_SIDE_GATEWAY;
    unsigned tx = gw ? SHM_RING_REQUESTS : SHM_RING_EVENTS, rx = 1 - tx;
    int rc = shm_ring_init(&r->tx, SHM_RING_PRODUCER, tx, &r->hdr->ctl[tx],
                           r->base + d[tx].data_offset, d[tx].capacity, r->max_record, NULL);
    if (rc < 0)
        return rc;
    if ((rc = shm_ring_init(&r->rx, SHM_RING_CONSUMER, rx, &r->hdr->ctl[rx],
                            r->base + d[rx].data_offset, d[rx].capacity, r->max_record, NULL)) < 0)
        return rc;
    shm_ring_set_peer_check(&r->tx, ring_peer_cb, r);
    shm_ring_set_peer_check(&r->rx, ring_peer_cb, r);
    name_rings(r);
    return 0;
}

static struct shm_region *region_alloc(enum shm_side_id side)
{
    struct shm_region *r = calloc(1, sizeof *r);
    if (!r) {
        LOG_ERR("shm region: out of memory");
        return NULL;
    }
    r->magic = REGION_MAGIC;
    r->side = side;
    r->fd = -1;
    r->pidfd = -1;
    r->stale_ns = SHM_DEFAULT_STALE_NS;
    snprintf(r->name, sizeof r->name, "shm region");
    pthread_mutex_init(&r->mu, NULL);
    return r;
}

static void region_free(struct shm_region *r)
{
    if (r->base)
        munmap(r->base, r->size);
    if (r->fd >= 0)
        close(r->fd);
    if (r->pidfd >= 0)
        close(r->pidfd);
    pthread_mutex_destroy(&r->mu);
    r->magic = 0;
    free(r);
}

/* Writes this side's line: pid first, state last (L1 in shm_abi.h), so a peer that sees the
 * state also sees the pid. */
static void announce(struct shm_region *r)
{
    struct shm_side *me = line(r, r->side);
    atomic_store_explicit(&me->pid, (int32_t)getpid(), memory_order_relaxed);
    shm_region_heartbeat(r);
    atomic_store_explicit(&me->state, SHM_STATE_ATTACHED, memory_order_release); /* L1 */
}

int shm_region_create(uint32_t generation, uint32_t max_record, struct shm_region **out)
{
    *out = NULL;
    if (generation == 0) {
        LOG_ERR("shm region: generation 0 is reserved; generations start at 1");
        return ERR_RANGE;
    }
    uint32_t rec = max_record < SHM_MIN_RECORD ? SHM_MIN_RECORD : max_record;
    if (rec > shm_ring_max_record_for(SHM_RING_MAX_CAPACITY)) {
        LOG_ERR("shm region gen %" PRIu32 ": records of %" PRIu32 " bytes exceed the limit of %"
                PRIu32, generation, rec, shm_ring_max_record_for(SHM_RING_MAX_CAPACITY));
        return ERR_RANGE;
    }
    uint64_t cap = SHM_RING_MIN_CAPACITY;
    while (shm_ring_max_record_for(cap) < rec)
        cap <<= 1;
    struct shm_region *r = region_alloc(SHM_SIDE_GATEWAY);
    if (!r)
        return -ENOMEM;
    r->generation = generation;
    r->max_record = rec;
    r->size = SHM_HDR_SIZE + 2 * cap;
    int rc;
    char memfd_name[32];
    snprintf(memfd_name, sizeof memfd_name, "clocher-shm-gen%" PRIu32, generation);
    r->fd = memfd_create(memfd_name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (r->fd < 0) {
        rc = -errno;
        LOG_ERR("shm region gen %" PRIu32 ": memfd_create: %s", generation, strerror(errno));
        goto fail;
    }
    if (ftruncate(r->fd, (off_t)r->size) != 0) {
        rc = -errno;
        LOG_ERR("shm region gen %" PRIu32 ": ftruncate(%zu): %s", generation, r->size,
                strerror(errno));
        goto fail;
    }
    if (fcntl(r->fd, F_ADD_SEALS, SEALS | F_SEAL_SEAL) != 0) {
        rc = -errno;
        LOG_ERR("shm region gen %" PRIu32 ": sealing the memfd: %s", generation, strerror(errno));
        goto fail;
    }
    void *p = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    if (p == MAP_FAILED) {
        rc = -errno;
        LOG_ERR("shm region gen %" PRIu32 ": mmap(%zu): %s", generation, r->size,
                strerror(errno));
        goto fail;
    }
    r->base = p;
    r->hdr = p;

    /* a fresh memfd reads as zeros: the lines and ring controls start formatted */
    struct shm_hdr *h = r->hdr;
    h->abi_version = SHM_ABI_VERSION;
    h->hdr_size = sizeof *h;
    h->generation = generation;
    h->region_size = r->size;
    h->max_record = rec;
    struct shm_ring_desc d[SHM_RINGS] = {{SHM_HDR_SIZE, cap}, {SHM_HDR_SIZE + cap, cap}};
    memcpy(h->rings, d, sizeof d);
    for (int i = 0; i < SHM_RINGS; i++)
        shm_ring_format(&h->ctl[i]);
    h->magic = SHM_MAGIC;
    if ((rc = open_rings(r, d)) < 0)
        goto fail;
    announce(r);
    *out = r;
    return 0;
fail:
    region_free(r);
    return rc;
}

/* ---- attach: nothing in the region is trusted before it is checked here ---- */

static int bad(int fd, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(int fd, int code, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    LOG_ERR("shm region (fd %d): %s", fd, what);
    return code;
}

static int check_identity(int fd, const struct shm_hdr *id, uint32_t generation, uint64_t size)
{
    if (id->magic != SHM_MAGIC)
        return bad(fd, ERR_FORMAT, "magic 0x%08" PRIx32 ", expected 0x%08" PRIx32
                                   " (not a clocher region)", id->magic, SHM_MAGIC);
    if (id->abi_version != SHM_ABI_VERSION)
        return bad(fd, ERR_UNSUPPORTED, "ABI version %" PRIu32 ", this build speaks %u",
                   id->abi_version, SHM_ABI_VERSION);
    if (id->hdr_size != sizeof(struct shm_hdr))
        return bad(fd, ERR_FORMAT, "hdr_size %" PRIu32 ", this build's header is %zu bytes",
                   id->hdr_size, sizeof(struct shm_hdr));
    if (id->generation != generation)
        return bad(fd, ERR_MISMATCH, "generation %" PRIu32 ", expected %" PRIu32,
                   id->generation, generation);
    if (id->region_size != size)
        return bad(fd, ERR_FORMAT, "region_size %" PRIu64 " but the memfd holds %" PRIu64
                                   " bytes", id->region_size, size);
    if (id->reserved0 != 0)
        return bad(fd, ERR_FORMAT, "reserved0 is %" PRIu32 ", expected 0", id->reserved0);
    if (id->max_record < SHM_MIN_RECORD)
        return bad(fd, ERR_FORMAT, "max_record %" PRIu32 " is below the minimum %u",
                   id->max_record, SHM_MIN_RECORD);
    for (int i = 0; i < SHM_RINGS; i++) {
        const struct shm_ring_desc *d = &id->rings[i];
        uint64_t c = d->capacity;
        if (c < SHM_RING_MIN_CAPACITY || c > SHM_RING_MAX_CAPACITY || (c & (c - 1)) != 0)
            return bad(fd, ERR_FORMAT, "%s ring: capacity %" PRIu64 " is not a power of two in "
                       "[%u, %u]", ring_names[i], c, SHM_RING_MIN_CAPACITY, SHM_RING_MAX_CAPACITY);
        if (id->max_record > shm_ring_max_record_for(c))
            return bad(fd, ERR_FORMAT, "%s ring: max_record %" PRIu32 " does not fit capacity %"
                       PRIu64, ring_names[i], id->max_record, c);
        if (d->data_offset < SHM_HDR_SIZE || d->data_offset % SHM_PAGE != 0 ||
            d->data_offset > size || c > size - d->data_offset)
            return bad(fd, ERR_FORMAT, "%s ring: data at [%" PRIu64 ", +%" PRIu64 ") is not a "
                       "page-aligned range after the header inside the %" PRIu64 "-byte region",
                       ring_names[i], d->data_offset, c, size);
    }
    const struct shm_ring_desc *a = &id->rings[0], *b = &id->rings[1];
    if (a->data_offset < b->data_offset + b->capacity &&
        b->data_offset < a->data_offset + a->capacity)
        return bad(fd, ERR_FORMAT, "the requests ring [%" PRIu64 ", +%" PRIu64 ") overlaps the "
                   "events ring [%" PRIu64 ", +%" PRIu64 ")", a->data_offset, a->capacity,
                   b->data_offset, b->capacity);
    return 0;
}

static int check_fresh(int fd, struct shm_hdr *h)
{
    /* L2: the gateway's state first, then the pid its L1 published (the gateway announced
     * before the fd reached us, so this order matters only against a corrupt peer) */
    uint32_t gst = atomic_load_explicit(&h->sides[SHM_SIDE_GATEWAY].state, memory_order_acquire);
    int32_t gpid = atomic_load_explicit(&h->sides[SHM_SIDE_GATEWAY].pid, memory_order_relaxed);
    if (gpid <= 0)
        return bad(fd, ERR_FORMAT, "gateway pid %" PRId32 " is not a process id", gpid);
    if (gst == SHM_STATE_CLOSED)
        return bad(fd, ERR_STATE, "the gateway (pid %" PRId32 ") has closed this region already",
                   gpid);
    if (gst < SHM_STATE_ATTACHED || gst > SHM_STATE_DRAINING)
        return bad(fd, ERR_FORMAT, "gateway state %" PRIu32 " is not a state", gst);
    int32_t wpid = atomic_load_explicit(&h->sides[SHM_SIDE_WORKER].pid, memory_order_relaxed);
    /* relaxed: both must still be 0, nothing is published with them yet */
    uint32_t wst = atomic_load_explicit(&h->sides[SHM_SIDE_WORKER].state, memory_order_relaxed);
    if (wst != SHM_STATE_NONE || wpid != 0)
        return bad(fd, ERR_STATE, "already attached by a worker (pid %" PRId32 ", state %" PRIu32
                   "): a region serves one worker generation", wpid, wst);
    /* the worker's own counters must be where a fresh ring has them; the gateway's (requests
     * tail) are validated by the ring on every load */
    uint64_t rh = atomic_load(&h->ctl[SHM_RING_REQUESTS].head);
    uint64_t et = atomic_load(&h->ctl[SHM_RING_EVENTS].tail);
    uint64_t eh = atomic_load(&h->ctl[SHM_RING_EVENTS].head);
    if (rh != 0 || et != 0 || eh != 0)
        return bad(fd, ERR_FORMAT, "rings not fresh: requests head %" PRIu64 ", events tail %"
                   PRIu64 ", events head %" PRIu64 " (all 0 before a worker attaches)", rh, et, eh);
    for (int i = 0; i < SHM_RINGS; i++)
        if (atomic_load(&h->ctl[i].broken))
            return bad(fd, ERR_STATE, "the %s ring is marked broken already", ring_names[i]);
    return 0;
}

int shm_region_attach(int fd, uint32_t generation, struct shm_region **out)
{
    *out = NULL;
    if (generation == 0)
        return bad(fd, ERR_RANGE, "generation 0 is reserved; generations start at 1");
    struct stat st;
    if (fstat(fd, &st) != 0)
        return bad(fd, -errno, "fstat: %s", strerror(errno));
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0)
        return bad(fd, errno == EINVAL ? ERR_FORMAT : -errno,
                   "not a sealable memfd (F_GET_SEALS: %s)", strerror(errno));
    if ((seals & SEALS) != SEALS)
        return bad(fd, ERR_FORMAT, "the memfd is not sealed against resizing (seals 0x%x): the "
                   "other side could truncate it under us", seals);
    uint64_t size = (uint64_t)st.st_size;
    if (st.st_size < (off_t)SHM_HDR_SIZE ||
        size > SHM_HDR_SIZE + 2 * (uint64_t)SHM_RING_MAX_CAPACITY)
        return bad(fd, ERR_FORMAT, "size %" PRIu64 " is not a region size", size);

    struct shm_region *r = region_alloc(SHM_SIDE_WORKER);
    if (!r)
        return -ENOMEM;
    int rc;
    void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rc = bad(fd, -errno, "mmap(%" PRIu64 "): %s", size, strerror(errno));
        goto fail;
    }
    r->base = p;
    r->size = (size_t)size;
    r->hdr = p;
    /* one copy of the identity: checked, then the only version used */
    struct shm_hdr id;
    memcpy(&id, r->hdr, offsetof(struct shm_hdr, sides));
    if ((rc = check_identity(fd, &id, generation, size)) < 0 ||
        (rc = check_fresh(fd, r->hdr)) < 0)
        goto fail;
    r->generation = id.generation;
    r->max_record = id.max_record;
    r->peer_pid = atomic_load(&r->hdr->sides[SHM_SIDE_GATEWAY].pid);
    if ((rc = open_rings(r, id.rings)) < 0)
        goto fail;
    announce(r);
    *out = r;
    return 0;
fail:
    region_free(r);
    return rc;
}

void shm_region_close(struct shm_region *r)
{
    if (!r)
        return;
    CHECK(r->magic == REGION_MAGIC);
    /* L1: after our last record; the wakes (W1) let a sleeping peer see it at once */
    atomic_store_explicit(&line(r, r->side)->state, SHM_STATE_CLOSED, memory_order_release);
    for (int i = 0; i < SHM_RINGS; i++)
        shm_ring_wake_all(&r->hdr->ctl[i]);
    shm_ring_fini(&r->tx);
    shm_ring_fini(&r->rx);
    region_free(r);
}

int shm_region_fd(const struct shm_region *r) { return r->fd; }

void shm_region_close_fd(struct shm_region *r)
{
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
}

uint32_t shm_region_generation(const struct shm_region *r) { return r->generation; }
enum shm_side_id shm_region_side(const struct shm_region *r) { return r->side; }
uint32_t shm_region_max_record(const struct shm_region *r) { return r->max_record; }
struct shm_ring *shm_region_tx(struct shm_region *r) { return &r->tx; }
struct shm_ring *shm_region_rx(struct shm_region *r) { return &r->rx; }

void shm_region_heartbeat(struct shm_region *r)
{
    struct shm_side *me = line(r, r->side);
    /* relaxed: a clock sample; L1 orders it before a state change that relies on it */
    atomic_store_explicit(&me->heartbeat_ns, mono_ns(), memory_order_relaxed);
    atomic_fetch_add_explicit(&me->heartbeats, 1, memory_order_relaxed);
}

void shm_region_set_state(struct shm_region *r, enum shm_state state)
{
    CHECK(state >= SHM_STATE_ATTACHED && state <= SHM_STATE_DRAINING);
    /* heartbeat first: a peer that sees READY (and so starts judging our heartbeat) sees a
     * fresh one, however long we were silent before */
    shm_region_heartbeat(r);
    atomic_store_explicit(&line(r, r->side)->state, state, memory_order_release); /* L1 */
}

int shm_region_set_peer_pid(struct shm_region *r, pid_t pid)
{
    if (pid <= 0) {
        LOG_ERR("%s gen %" PRIu32 ": peer pid %d is not a process id", r->name, r->generation,
                (int)pid);
        return ERR_RANGE;
    }
    pthread_mutex_lock(&r->mu);
    if (r->peer_pid != pid && r->pidfd >= 0) {
        close(r->pidfd);
        r->pidfd = -1;
    }
    r->peer_pid = pid;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

void shm_region_set_stale_ns(struct shm_region *r, uint64_t ns)
{
    pthread_mutex_lock(&r->mu);
    r->stale_ns = ns;
    pthread_mutex_unlock(&r->mu);
}

/* Has the peer's process exited? pidfd where the kernel (and seccomp) allow it: it also sees a
 * zombie as exited. Else kill(pid, 0), which sees a zombie as alive (the heartbeat covers it).
 * Under mu. */
static bool process_exited(struct shm_region *r)
{
    if (r->pidfd < 0 && !r->pidfd_unavailable) {
        long fd = syscall(SYS_pidfd_open, r->peer_pid, 0);
        if (fd >= 0)
            r->pidfd = (int)fd;
        else if (errno == ESRCH)
            return true;
        else
            r->pidfd_unavailable = true; /* ENOSYS, EPERM from a filter, ... */
    }
    if (r->pidfd >= 0) {
        struct pollfd pfd = {.fd = r->pidfd, .events = POLLIN};
        return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR));
    }
    return kill(r->peer_pid, 0) != 0 && errno == ESRCH;
}

static int gone(struct shm_region *r, bool clean, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int gone(struct shm_region *r, bool clean, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, sizeof r->why, fmt, ap);
    va_end(ap);
    r->gone = true;
    /* a goodbye (CLOSED) is no failure: the peer stopped on purpose */
    log_msg(clean ? LOG_LEVEL_INFO : LOG_LEVEL_ERROR,
            "%s gen %" PRIu32 ": the %s (pid %d) is gone: %s", r->name, r->generation,
            peer_of(r) == SHM_SIDE_WORKER ? "worker" : "gateway", (int)r->peer_pid, r->why);
    return -EPIPE;
}

static int check_peer_locked(struct shm_region *r)
{
    if (r->gone)
        return -EPIPE;
    struct shm_side *ps = line(r, peer_of(r));
    uint32_t st = atomic_load_explicit(&ps->state, memory_order_acquire); /* L2 */
    int32_t pid = atomic_load_explicit(&ps->pid, memory_order_relaxed);
    uint64_t hb = atomic_load_explicit(&ps->heartbeat_ns, memory_order_relaxed);
    if (st > SHM_STATE_CLOSED)
        return gone(r, false, "its state word holds %" PRIu32 ", not a state", st);
    if (pid < 0 || (pid == 0 && st != SHM_STATE_NONE))
        return gone(r, false, "its pid word holds %" PRId32 " in state %" PRIu32, pid, st);
    if (pid > 0) {
        if (r->peer_pid == 0)
            r->peer_pid = pid;
        else if (pid != r->peer_pid)
            return gone(r, false, "it claims pid %" PRId32 ", but the %s is pid %d", pid,
                        peer_of(r) == SHM_SIDE_WORKER ? "worker" : "gateway", (int)r->peer_pid);
    }
    if (st == SHM_STATE_CLOSED)
        return gone(r, true, "it closed its end");
    if (r->peer_pid > 0 && process_exited(r))
        return gone(r, false, "its process exited");
    if (st != SHM_STATE_NONE && r->stale_ns) {
        uint64_t now = mono_ns();
        if (hb > now + FUTURE_SLACK_NS)
            return gone(r, false, "its heartbeat is %.3f s in the future",
                        (double)(hb - now) / 1e9);
        /* Only a serving side promises heartbeats: a worker that attached and is still loading
         * its model, or a gateway that has not started serving the region, may be silent for
         * longer than the limit; its pid speaks for it meanwhile (and the supervisor has its own
         * timeout for a worker that never gets ready). */
        bool serving = st == SHM_STATE_READY || st == SHM_STATE_DRAINING;
        if (serving && hb < now && now - hb > r->stale_ns)
            return gone(r, false, "no heartbeat for %.3f s (limit %.3f s)",
                        (double)(now - hb) / 1e9, (double)r->stale_ns / 1e9);
    }
    return 0;
}

int shm_region_check_peer(struct shm_region *r)
{
    pthread_mutex_lock(&r->mu);
    int rc = check_peer_locked(r);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void shm_region_peer(struct shm_region *r, struct shm_peer *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&r->mu);
    check_peer_locked(r);
    struct shm_side *ps = line(r, peer_of(r));
    uint32_t st = atomic_load_explicit(&ps->state, memory_order_acquire); /* L2 */
    uint64_t hb = atomic_load_explicit(&ps->heartbeat_ns, memory_order_relaxed);
    uint64_t now = mono_ns();
    out->pid = r->peer_pid;
    out->state = st <= SHM_STATE_CLOSED ? (enum shm_state)st : SHM_STATE_NONE;
    out->heartbeat_age_ns = hb && hb < now ? now - hb : 0;
    out->heartbeats = atomic_load_explicit(&ps->heartbeats, memory_order_relaxed);
    out->gone = r->gone;
    snprintf(out->why, sizeof out->why, "%s", r->why);
    pthread_mutex_unlock(&r->mu);
}
