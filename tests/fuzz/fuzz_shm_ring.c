/*
 * fuzz_shm_ring.c — libFuzzer harness over the consumer and producer ends of a ring whose
 * shared memory a hostile peer wrote (shm/ring.c). Input: the head and tail counters (u64
 * little-endian each) and the bytes of a 4096-byte data area. The consumer reads until the ring
 * is empty or refuses; every refusal must be logged and leave the ring broken. Then a producer
 * opens the ring at that tail, the peer's head turns into the third counter, and each reserve
 * must either find room inside the data area or refuse. ASan watches that no access leaves the ring.
 */
#include "fuzz.h"

#include "err.h"
#include "log.h"
#include "msg.h"
#include "ring.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CAP 4096u
#define MAXREC (CAP / 2 - 16)

static void quiet(enum log_level level, const char *msg, void *ud)
{
    (void)level;
    (void)msg;
    (void)ud;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_sink(quiet, NULL);
    if (size < 24)
        return 0;
    uint64_t head, tail, head2;
    memcpy(&head, data, 8);
    memcpy(&tail, data + 8, 8);
    memcpy(&head2, data + 16, 8);
    struct shm_ring_ctl *ctl = aligned_alloc(64, sizeof *ctl);
    uint8_t *ring = aligned_alloc(64, CAP);
    uint8_t *buf = aligned_alloc(16, MAXREC);
    if (!ctl || !ring || !buf)
        abort();
    shm_ring_format(ctl);
    memset(ring, 0, CAP);
    memcpy(ring, data + 24, size - 24 < CAP ? size - 24 : CAP);
    atomic_store(&ctl->head, head);
    atomic_store(&ctl->tail, tail);

    struct shm_ring c, p;
    if (shm_ring_init(&c, SHM_RING_CONSUMER, SHM_RING_EVENTS, ctl, ring, CAP, MAXREC, "c") == 0) {
        for (int i = 0; i < 512; i++) {
            struct shm_msg m;
            int rc = shm_msg_recv(&c, buf, MAXREC, &m);
            if (rc == -EAGAIN)
                break;
            if (rc < 0) {
                if (!log_last_error()[0] || !shm_ring_broken(&c))
                    abort();
                log_clear_error();
                break;
            }
        }
        shm_ring_fini(&c);
    }
    log_clear_error();
    atomic_store(&ctl->broken, 0);
    atomic_store(&ctl->head, tail); /* a producer opens an empty ring, then the peer lies */
    if (shm_ring_init(&p, SHM_RING_PRODUCER, SHM_RING_EVENTS, ctl, ring, CAP, MAXREC, "p") == 0) {
        atomic_store(&ctl->head, head2);
        for (uint32_t k = 0; k < 16; k++) { /* more than the ring holds: the head is read */
            uint32_t len = (k * 509u) % (MAXREC + 1);
            void *pl;
            int rc = shm_ring_reserve(&p, 64, len, &pl);
            if (rc == 0) {
                if ((uint8_t *)pl < ring || (uint8_t *)pl + len > ring + CAP)
                    abort();
                memset(pl, 0xab, len);
                shm_ring_commit(&p);
            } else if (rc != -EAGAIN) {
                if (rc != ERR_FORMAT && rc != ERR_STATE)
                    abort();
                break;
            }
        }
        shm_ring_fini(&p);
    }
    log_clear_error();
    free(ctl);
    free(ring);
    free(buf);
    return 0;
}
