/*
 * fuzz_shm_msg.c — libFuzzer harness over the shm record decoders (shm/msg.c). Input: a u32
 * record type (little-endian) followed by the record. A refusal is ERR_FORMAT with a message;
 * an acceptance must re-encode to exactly the input bytes (the encoding is canonical, so
 * nothing the decoder accepted was ignored or misread) and every view must lie inside the
 * record.
 */
#include "fuzz.h"

#include "log.h"
#include "msg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum log_level level, const char *msg, void *ud)
{
    (void)level;
    (void)msg;
    (void)ud;
}

static void inside(const void *p, size_t n, const uint8_t *buf, size_t len)
{
    if (n && (!p || (const uint8_t *)p < buf || (const uint8_t *)p + n > buf + len))
        abort();
}

static void check_views(const struct shm_msg *m, const uint8_t *buf, size_t len)
{
    switch (m->type) {
    case SHM_MSG_GENERATE:
        inside(m->generate.prompt_ids, 4ull * m->generate.n_prompt_ids, buf, len);
        inside(m->generate.prompt_text, m->generate.prompt_text_len, buf, len);
        if (m->generate.adapter)
            inside(m->generate.adapter, strlen(m->generate.adapter) + 1, buf, len);
        for (uint32_t i = 0; i < m->generate.n_stop; i++)
            inside(m->generate.stop[i], strlen(m->generate.stop[i]) + 1, buf, len);
        break;
    case SHM_MSG_TOKEN:
        inside(m->token.text, m->token.text_len, buf, len);
        break;
    case SHM_MSG_ERROR:
        inside(m->error.message, strlen(m->error.message) + 1, buf, len);
        break;
    case SHM_MSG_DETOKENIZE:
    case SHM_MSG_TOKENS:
        inside(m->ids.ids, 4ull * m->ids.n_ids, buf, len);
        break;
    default:
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_sink(quiet, NULL);
    if (size < 4 || size - 4 > (1u << 20))
        return 0;
    uint32_t type;
    memcpy(&type, data, 4);
    uint32_t len = (uint32_t)(size - 4);
    /* decoders read from an aligned private copy, as shm_ring_read provides */
    size_t alloc = ((size_t)len + 16) & ~(size_t)15; /* aligned_alloc: a multiple of 16 */
    uint8_t *buf = aligned_alloc(16, alloc);
    uint8_t *again = aligned_alloc(16, alloc);
    if (!buf || !again)
        abort();
    memcpy(buf, data + 4, len);
    struct shm_msg m;
    int rc = shm_msg_decode("fuzz", type, buf, len, &m);
    if (rc != 0) {
        if (rc > 0 || !log_last_error()[0])
            abort();
        log_clear_error();
    } else {
        check_views(&m, buf, len);
        uint32_t len2;
        if (shm_msg_size("fuzz", &m, &len2) != 0 || len2 != len)
            abort();
        shm_msg_encode(&m, again, len2);
        if (memcmp(again, buf, len) != 0)
            abort();
    }
    free(buf);
    free(again);
    return 0;
}
