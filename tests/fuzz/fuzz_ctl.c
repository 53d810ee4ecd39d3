/*
 * fuzz_ctl.c — libFuzzer harness over the worker → supervisor control datagram parser
 * (daemon/ctl.c). A rejection is ERR_FORMAT with a message; an acceptance leaves a
 * NUL-terminated printable STATUS and flags only for keys the input really holds.
 */
#include "fuzz.h"

#include "ctl.h"
#include "log.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum log_level level, const char *msg, void *ud)
{
    (void)level;
    (void)msg;
    (void)ud;
}

static bool has(const uint8_t *d, size_t n, const char *key)
{
    size_t k = strlen(key);
    for (size_t i = 0; i + k <= n; i++)
        if ((i == 0 || d[i - 1] == '\n') && memcmp(d + i, key, k) == 0)
            return true;
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_sink(quiet, NULL);
    struct heritage_ctl_msg m;
    int rc = ctl_parse("fuzz", (const char *)data, size, &m);
    if (rc != 0) {
        if (rc > 0 || !log_last_error()[0])
            abort();
        log_clear_error();
        return 0;
    }
    size_t n = strnlen(m.status, sizeof m.status);
    if (n == sizeof m.status)
        abort();
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)m.status[i] < 0x20 || (unsigned char)m.status[i] >= 0x7f)
            abort();
    if ((m.ready && !has(data, size, "READY=1")) ||
        (m.watchdog && !has(data, size, "WATCHDOG=1")) ||
        (m.has_hot_bytes && !has(data, size, "HOT_BYTES=")) || (n && !has(data, size, "STATUS=")))
        abort();
    return 0;
}
