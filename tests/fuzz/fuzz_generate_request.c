/*
 * fuzz_generate_request.c — libFuzzer harness over what the gateway does with a client's
 * Generate bytes: protobuf-c unpacking of clocher.v1.GenerateRequest and the checks of
 * daemon/gw_req.c, for an unrestricted and a restricted tenant.
 *
 * Properties: a refusal is INVALID_ARGUMENT or NOT_FOUND with a message; an accepted request
 * always makes a GENERATE record the worker ring accepts (shm_msg_size: ok, or ERR_RANGE for a
 * record too large for the ABI), i.e. nothing the gateway lets through is malformed on the
 * wire, and every limit of the configuration holds on it.
 */
#include "fuzz.h"

#include "config.h"
#include "err.h"
#include "gw_req.h"
#include "log.h"
#include "msg.h"

#include <grpc/status.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum log_level level, const char *msg, void *ud)
{
    (void)level, (void)msg, (void)ud;
}

static const char CFG[] =
    "{\"model_dir\": \"/m\", \"limits\": {\"max_tokens\": 300, \"max_prompt_tokens\": 64},"
    " \"tenants\": ["
    "  {\"name\": \"all\", \"api_keys\": [\"key-all-0001\"], \"allowed_adapters\": \"*\"},"
    "  {\"name\": \"some\", \"api_keys\": [\"key-some-001\"], \"allowed_adapters\": [\"a0\"]}]}";

static bool known(void *ud, const char *name)
{
    (void)ud;
    return strcmp(name, "a0") == 0 || strcmp(name, "a1") == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct config *cfg;
    log_set_sink(quiet, NULL);
    if (!cfg && config_parse("fuzz.json", "/etc", CFG, strlen(CFG), NULL, &cfg) != 0)
        abort();
    Clocher__V1__GenerateRequest *r =
        clocher__v1__generate_request__unpack(NULL, size, data);
    if (!r)
        return 0;
    for (int k = 0; k < 2; k++) {
        struct gw_req_ctx ctx = {.cfg = cfg,
                                 .tenant = config_find_tenant(cfg, k ? "some" : "all"),
                                 .tenant_id = 3, .model_name = "m", .adapter_known = known,
                                 .seed = 1};
        struct shm_msg m = {.type = SHM_MSG_GENERATE};
        char msg[512];
        int st = gw_req_generate(r, &ctx, &m.generate, msg, sizeof msg);
        if (st) {
            if ((st != GRPC_STATUS_INVALID_ARGUMENT && st != GRPC_STATUS_NOT_FOUND) || !msg[0])
                abort();
            continue;
        }
        const struct shm_msg_generate *g = &m.generate;
        if (g->max_tokens == 0 || g->max_tokens > cfg->limits.max_tokens ||
            g->n_prompt_ids > cfg->limits.max_prompt_tokens ||
            (g->adapter && !known(NULL, g->adapter)) ||
            (k && g->adapter && strcmp(g->adapter, "a0") != 0))
            abort();
        m.generate.request_id = 1;
        uint32_t len;
        int rc = shm_msg_size("fuzz", &m, &len);
        if (rc != 0 && rc != ERR_RANGE)
            abort(); /* the gateway let through what the ring refuses */
        log_clear_error();
    }
    clocher__v1__generate_request__free_unpacked(r, NULL);
    return 0;
}
