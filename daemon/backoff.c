/* backoff.c — exponential respawn delays with a crash-loop limit (see backoff.h). */
#include "backoff.h"

#include "check.h"

#include <string.h>

void backoff_init(struct backoff *b, const struct backoff_policy *pol)
{
    CHECK(pol->initial_ms > 0 && pol->max_ms >= pol->initial_ms);
    CHECK(pol->crash_loop_max >= 1 && pol->crash_loop_max <= BACKOFF_MAX_LOOP);
    memset(b, 0, sizeof *b);
    b->pol = *pol;
    b->next_delay_ms = pol->initial_ms;
}

void backoff_reset(struct backoff *b, const struct backoff_policy *pol) { backoff_init(b, pol); }

enum backoff_verdict backoff_crash(struct backoff *b, uint64_t now_ms, uint64_t started_ms,
                                   uint64_t *delay_ms)
{
    const struct backoff_policy *p = &b->pol;
    *delay_ms = 0;
    if (b->given_up)
        return BACKOFF_GIVE_UP;

    /* keep the last crash_loop_max crash times; the oldest falls out of the ring */
    if (b->n_recent == p->crash_loop_max) {
        b->head = (b->head + 1) % p->crash_loop_max;
        b->n_recent--;
    }
    b->recent[(b->head + b->n_recent) % p->crash_loop_max] = now_ms;
    b->n_recent++;
    uint64_t oldest = b->recent[b->head];
    if (b->n_recent == p->crash_loop_max && now_ms - oldest <= p->window_ms) {
        b->given_up = true;
        return BACKOFF_GIVE_UP;
    }

    if (now_ms >= started_ms && now_ms - started_ms >= p->stable_ms)
        b->next_delay_ms = p->initial_ms; /* it had been healthy: this is a fresh failure */
    *delay_ms = b->next_delay_ms;
    b->next_delay_ms = b->next_delay_ms > p->max_ms / 2 ? p->max_ms : b->next_delay_ms * 2;
    return BACKOFF_RESPAWN;
}
