/*
 * backoff.h — the respawn policy for crashed workers, kept apart from the process plumbing so
 * it can be tested on its own with synthetic clocks.
 *
 * After a crash the slot waits `delay` before the next spawn; the delay starts at initial_ms
 * and doubles on each further crash up to max_ms. A worker that stayed up for stable_ms before
 * crashing was healthy: its delay starts over at initial_ms. When crash_loop_max crashes fall
 * within window_ms the slot is given up (a crash loop: respawning would only burn CPU and fill
 * the journal) until an operator intervenes (SIGHUP resets given-up slots).
 *
 * NOTES: plain data owned by the supervisor's loop thread; times are caller-supplied
 * milliseconds on a monotonic clock.
 */
#ifndef CLOCHER_DAEMON_BACKOFF_H
#define CLOCHER_DAEMON_BACKOFF_H

#include <stdbool.h>
#include <stdint.h>

#define BACKOFF_MAX_LOOP 1000 /* largest crash_loop_max */

struct backoff_policy {
    uint64_t initial_ms;
    uint64_t max_ms;
    uint32_t crash_loop_max;  /* 1..BACKOFF_MAX_LOOP */
    uint64_t window_ms;
    uint64_t stable_ms;
};

struct backoff {
    struct backoff_policy pol;
    uint64_t next_delay_ms;   /* delay the next crash gets (unless the worker was stable) */
    uint32_t n_recent;        /* crash times kept in `recent`, <= crash_loop_max */
    uint32_t head;            /* ring index of the oldest kept crash time */
    uint64_t recent[BACKOFF_MAX_LOOP];
    bool given_up;
};

enum backoff_verdict { BACKOFF_RESPAWN = 1, BACKOFF_GIVE_UP = 2 };

/* Starts with no crash recorded. The policy is copied; it must be valid (checked: CHECK). */
void backoff_init(struct backoff *b, const struct backoff_policy *pol);

/*
 * Records a crash at now_ms of a worker started at started_ms. Returns BACKOFF_RESPAWN with
 * *delay_ms set, or BACKOFF_GIVE_UP once crash_loop_max crashes fall within window_ms (and on
 * every call after that, until backoff_reset).
 */
enum backoff_verdict backoff_crash(struct backoff *b, uint64_t now_ms, uint64_t started_ms,
                                   uint64_t *delay_ms);

/* Forgets the crash history (an operator's reload); the policy may change at the same time. */
void backoff_reset(struct backoff *b, const struct backoff_policy *pol);

#endif
