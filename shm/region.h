/*
 * region.h — the shared-memory region between clocherd and one worker generation (layout:
 * shm_abi.h; design: docs/SHM.md). clocherd creates it (the gateway side) as a sealed memfd
 * and hands the fd to the fork+exec'd worker, which attaches to it (the worker side). Each
 * side then holds two ring ends: it produces on its tx ring and consumes its rx ring
 * (gateway: tx = requests, rx = events; worker: the reverse).
 *
 * Liveness: each side writes its pid, its state and a heartbeat (CLOCK_MONOTONIC ns) into its
 * own line of the header. shm_region_check_peer() answers "is the other side still there":
 * its process has not exited (pidfd, or kill(pid, 0) where pidfd_open is unavailable), it has
 * not closed its end, its heartbeat is not older than the stale limit once it says READY or
 * DRAINING (a side that is still starting, e.g. a worker loading its model, need not
 * heartbeat), its line is not garbage. The ring waits of both ends run that check (and give this side's heartbeat) at
 * every slice, so no wait outlives the peer by more than a slice (SHM_RING_SLICE_NS).
 *
 * NOTES: a region is shared by the threads of one side: shm_region_heartbeat(),
 * shm_region_set_state(), shm_region_check_peer() and shm_region_peer() may be called from any
 * thread (the peer bookkeeping has a mutex); each ring end belongs to one thread at a time
 * (ring.h). shm_region_close() must be the last call, made once every thread is done with it.
 * The supervisor creates regions but never reads them (PostgreSQL's postmaster rule): the
 * gateway threads and the worker are their only users.
 */
#ifndef CLOCHER_SHM_REGION_H
#define CLOCHER_SHM_REGION_H

#include "ring.h"
#include "shm_abi.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Every region accepts records of at least this many bytes, whatever the creator asks for:
 * enough for any record whose size the ABI bounds (tokens, errors, names, stop strings). */
#define SHM_MIN_RECORD (16u * 1024u)
/* A peer whose heartbeat is older than this is considered gone (shm_region_set_stale_ns). */
#define SHM_DEFAULT_STALE_NS (30ull * 1000000000ull)

struct shm_region;

/* What this side knows about the other one (shm_region_peer). */
struct shm_peer {
    int32_t pid;                    /* 0 while unknown */
    enum shm_state state;
    uint64_t heartbeat_age_ns;      /* 0 before its first heartbeat */
    uint64_t heartbeats;
    bool gone;                      /* shm_region_check_peer() has returned -EPIPE */
    char why[160];                  /* why it is gone ("" while it is not) */
};

/*
 * Gateway side: creates a region for worker `generation` (> 0) whose rings carry records of up
 * to max(max_record, SHM_MIN_RECORD) bytes: each ring's capacity is the smallest power of two
 * that holds two of them (docs/SHM.md, "Sizing"). The memfd is close-on-exec and sealed against
 * shrinking and growing; pass shm_region_fd() to the worker (dup2 it to the number the worker
 * is told: dup2 clears close-on-exec). ERR_RANGE (logged) for an impossible size, -errno
 * (logged, naming the call) when the system refuses.
 */
int shm_region_create(uint32_t generation, uint32_t max_record, struct shm_region **out);

/*
 * Worker side: maps the region behind `fd` and checks it before trusting any of it: a sealed
 * memfd of the size the header states, magic, ABI version and header size, the expected
 * generation, ring geometry inside the region and not overlapping, a gateway pid, and no other
 * worker attached before. Then writes this process's pid and state ATTACHED. The fd stays
 * owned by the caller (the mapping does not need it; close it at will). ERR_FORMAT,
 * ERR_MISMATCH (wrong generation), ERR_UNSUPPORTED (other ABI version), ERR_STATE (attached
 * already) or -errno, each logged naming the fd and the field.
 */
int shm_region_attach(int fd, uint32_t generation, struct shm_region **out);

/* Says CLOSED in this side's line, wakes the peer's waits (so it sees that at once), unmaps,
 * closes the fd if still held, frees. NULL is a no-op. */
void shm_region_close(struct shm_region *r);

/* The creator's memfd, or -1 after shm_region_close_fd() (and always -1 on the worker side). */
int shm_region_fd(const struct shm_region *r);
/* Closes the creator's fd once the worker holds its own copy; the mapping stays valid. */
void shm_region_close_fd(struct shm_region *r);

uint32_t shm_region_generation(const struct shm_region *r);
enum shm_side_id shm_region_side(const struct shm_region *r);
/* The largest record payload of both rings. */
uint32_t shm_region_max_record(const struct shm_region *r);

/* This side's ring ends: tx produces (gateway: requests), rx consumes (gateway: events). */
struct shm_ring *shm_region_tx(struct shm_region *r);
struct shm_ring *shm_region_rx(struct shm_region *r);

/* Names the region in messages ("worker 3"); rings become "worker 3 gen 7 requests ring".
 * Call before the rings are in use. */
void shm_region_set_name(struct shm_region *r, const char *name);

/* Stores now into this side's heartbeat. Cheap (no system call beyond the vDSO clock). A side
 * in state READY or DRAINING must heartbeat well within the peer's stale limit: the ring waits
 * do it at every slice; a side busy elsewhere (the worker in an engine step) calls this. */
void shm_region_heartbeat(struct shm_region *r);
/* Announces this side's state (ATTACHED, READY, DRAINING; CLOSED is shm_region_close's), with a
 * heartbeat just before it. */
void shm_region_set_state(struct shm_region *r, enum shm_state state);

/*
 * Tells the region which pid the peer must have, from a source it trusts more than the header
 * (the gateway: the pid the supervisor spawned). Enables the pid check before the worker has
 * attached, and makes a peer claiming another pid count as gone. ERR_RANGE for pid <= 0.
 */
int shm_region_set_peer_pid(struct shm_region *r, pid_t pid);
/* Heartbeat age beyond which a READY or DRAINING peer counts as gone; 0 disables the heartbeat
 * check (pid and state checks remain). Default SHM_DEFAULT_STALE_NS. */
void shm_region_set_stale_ns(struct shm_region *r, uint64_t ns);

/*
 * 0 while the peer is (as far as can be told) alive or not attached yet; -EPIPE once it is
 * gone: its process exited, it closed its end, its heartbeat went stale, or its line holds
 * values no live peer writes. The first -EPIPE is logged, naming the region, the pid and the
 * reason (LOG_ERR; LOG_INFO for a peer that closed on purpose, which is no failure); it is
 * final: later calls return -EPIPE without logging (shm_region_peer() keeps the reason).
 */
int shm_region_check_peer(struct shm_region *r);
/* A snapshot of the peer's line and of the verdict so far. Runs the check first. */
void shm_region_peer(struct shm_region *r, struct shm_peer *out);

#endif
