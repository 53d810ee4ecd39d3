/*
 * fuzz_shm_chat.c — libFuzzer harness over the shm chat encoding's decoder (shm_chat_decode,
 * shm/msg.c): the prompt of a chat GENERATE (tools JSON, messages with channel, recipient,
 * tool_call_id and content), written by the gateway and read by the worker, which trusts no
 * byte of it. A refusal is ERR_FORMAT with a message; an acceptance must re-encode to exactly
 * the input (the encoding is canonical) and every view must lie inside the input.
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_sink(quiet, NULL);
    if (size > (1u << 20))
        return 0;
    uint32_t len = (uint32_t)size, n = 0;
    uint8_t *buf = malloc(len ? len : 1); /* a private copy, as the worker decodes one */
    if (!buf)
        abort();
    memcpy(buf, data, len);
    struct shm_chat_msg *m = calloc(SHM_MAX_CHAT_MSGS, sizeof *m);
    const char *tools = NULL;
    uint32_t tools_len = 0;
    if (!m)
        abort();
    int rc = shm_chat_decode(buf, len, m, SHM_MAX_CHAT_MSGS, &n, &tools, &tools_len);
    if (rc != 0) {
        if (rc > 0 || !log_last_error()[0])
            abort();
        log_clear_error();
    } else {
        if (n == 0 || n > SHM_MAX_CHAT_MSGS)
            abort();
        inside(tools, tools_len, buf, len);
        for (uint32_t i = 0; i < n; i++) {
            inside(m[i].channel, m[i].channel_len, buf, len);
            inside(m[i].recipient, m[i].recipient_len, buf, len);
            inside(m[i].tool_call_id, m[i].tool_call_id_len, buf, len);
            inside(m[i].content, m[i].content_len, buf, len);
        }
        struct shm_chat ch = {.tools = tools, .tools_len = tools_len, .msgs = m, .n = n,
                              .tool_choice = shm_chat_tool_choice(buf)};
        uint32_t len2;
        if (shm_chat_size(&ch, &len2, NULL, 0) != 0 || len2 != len)
            abort();
        uint8_t *again = malloc(len2);
        if (!again)
            abort();
        shm_chat_encode(&ch, again, len2);
        if (memcmp(again, buf, len) != 0)
            abort();
        free(again);
    }
    free(m);
    free(buf);
    return 0;
}
