/*
 * msg.h — the records the rings carry (wire layouts: shm_abi.h): encoders for the sending side
 * and decoders that validate every field of a received record before anyone uses it.
 *
 * A decoded struct shm_msg is a view: its pointers (token ids, strings, text) point into the
 * buffer it was decoded from, which must stay alive and unchanged while the view is used and
 * must be 8-byte aligned (shm_ring_read() into a malloc'd buffer is). Strings the ABI marks
 * NUL-terminated are usable as C strings directly; text (prompt, token pieces, detokenized
 * text) is raw bytes with a length.
 *
 * Validation (both directions: the encoder refuses to send what the decoder would refuse):
 * exact record length (the fixed part plus the sections its counts announce, nothing more),
 * reserved fields 0, known enum values and flag bits, finite floats in their ranges, counts and
 * lengths within the SHM_MAX_* limits, names of [A-Za-z0-9._-], request ids > 0 (0 only where
 * the ABI says), a record type on the ring of its direction. Each refusal is ERR_FORMAT, logged
 * once with the ring (or caller's label), the record type, the request id when known, and the
 * field.
 */
#ifndef CLOCHER_SHM_MSG_H
#define CLOCHER_SHM_MSG_H

#include "ring.h"
#include "shm_abi.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct shm_msg_generate {
    uint64_t request_id, tenant_id;
    uint64_t deadline_ns;           /* CLOCK_MONOTONIC; 0 = none */
    uint64_t sent_ns;               /* CLOCK_MONOTONIC when the gateway sent it; 0 = unknown
                                     * (untrusted: the worker clamps it, serve.c) */
    uint64_t seed;
    float temperature, top_p, min_p, repeat_penalty;
    float adapter_scale;
    uint32_t top_k, repeat_window, max_tokens;
    enum shm_priority priority;
    uint32_t flags;                 /* SHM_GEN_* */
    const int32_t *prompt_ids;      /* [n_prompt_ids]; exactly one prompt is non-empty */
    uint32_t n_prompt_ids;
    const char *prompt_text;        /* [prompt_text_len] bytes */
    uint32_t prompt_text_len;
    const char *adapter;            /* NULL = base model */
    const char *stop[SHM_MAX_STOP]; /* [n_stop] non-empty C strings */
    uint32_t n_stop;
    bool logprobs;                  /* each TOKEN carries its logprob ... */
    uint32_t top_logprobs;          /* ... and this many alternatives' (<= SHM_MAX_TOP_LOGPROBS) */
};

struct shm_msg_tokenize {
    uint64_t request_id;
    uint32_t flags;                 /* SHM_GEN_ADD_BOS */
    const char *text;               /* [text_len] bytes */
    uint32_t text_len;
};

struct shm_msg_ids {                /* DETOKENIZE, TOKENS */
    uint64_t request_id;
    const int32_t *ids;             /* [n_ids], each >= 0 */
    uint32_t n_ids;
};

struct shm_msg_adapter_load {
    uint64_t request_id;
    const char *name;
    const char *path;
};

struct shm_msg_name {               /* ADAPTER_UNLOAD */
    uint64_t request_id;
    const char *name;
};

struct shm_msg_logprob {
    int32_t id;
    float logprob;
    const char *piece;              /* [piece_len] bytes: the token's own */
    uint32_t piece_len;
};

struct shm_msg_token {
    uint64_t request_id;
    enum shm_channel channel;       /* chat requests: the piece's channel; else SHM_CH_NONE */
    bool call;                      /* the id is harmony's <|call|>: a tool call ends the reply */
    /* chat tools: a piece that opens a tool call carries its recipient and id ([*_len] bytes,
     * 1..SHM_MAX_CHAT_NAME of [A-Za-z0-9._:-]; call_name_len 0 = not an opening piece) */
    const char *call_name, *call_id;
    uint32_t call_name_len, call_id_len;
    int32_t token;                  /* -1: a text-only piece, not a generated token */
    const char *text;               /* [text_len] bytes, text_len <= SHM_MAX_PIECE */
    uint32_t text_len;
    /* a generation that asked for logprobs (a generated token, not text only), each checked:
     * ids >= 0, logprobs finite in [SHM_LOGPROB_FLOOR, 0], pieces <= SHM_MAX_LOGPROB_PIECE
     * bytes, the alternatives most likely first */
    bool has_logprob;
    struct shm_msg_logprob own;     /* the token's own (own.id = token) */
    uint32_t n_top;
    struct shm_msg_logprob top[SHM_MAX_TOP_LOGPROBS];
};

struct shm_msg_finish {
    uint64_t request_id;
    enum shm_finish reason;
    uint32_t prompt_tokens, completion_tokens, cached_tokens;
    uint64_t queue_ns, ttft_ns, tpot_ns, e2e_ns;
};

struct shm_msg_error {
    uint64_t request_id;            /* 0 = not about one request */
    int32_t code;                   /* < 0 */
    const char *message;            /* 1..SHM_MAX_ERROR bytes */
};

struct shm_msg_text {
    uint64_t request_id;
    const char *text;               /* [text_len] bytes */
    uint32_t text_len;
};

struct shm_msg_adapter {
    uint64_t request_id;
    uint32_t rank;
    float alpha;
    uint32_t targets;               /* enum shm_target bits */
    uint32_t active_requests;
    const char *name;
};

struct shm_msg_stats {
    uint64_t request_id;
    uint32_t running, waiting;
    uint64_t kv_blocks_total, kv_blocks_used, kv_blocks_cached;
    uint64_t prefix_hit_tokens, prefix_miss_tokens, preemptions;
    uint64_t requests_finished, tokens_generated, tokens_prefilled;
    uint64_t rss_bytes;
};

struct shm_msg_hello {
    uint64_t parameters;
    uint32_t vocab_size, context_length;
    const char *name, *arch, *dtype; /* 1..SHM_MAX_INFO bytes of printable ASCII */
};

struct shm_msg {
    enum shm_msg_type type;
    union {
        struct shm_msg_generate generate;
        uint64_t request_id;        /* CANCEL, STATS_QUERY, DONE */
        struct shm_msg_tokenize tokenize;
        struct shm_msg_ids ids;     /* DETOKENIZE, TOKENS */
        struct shm_msg_adapter_load adapter_load;
        struct shm_msg_name name;   /* ADAPTER_UNLOAD */
        struct shm_msg_token token;
        struct shm_msg_finish finish;
        struct shm_msg_error error;
        struct shm_msg_text text;
        struct shm_msg_adapter adapter;
        struct shm_msg_stats stats;
        struct shm_msg_hello hello;
    };
};

/* One message of a chat encoding (shm_abi.h), decoded: views into the encoding. */
struct shm_chat_msg {
    enum shm_chat_role role;
    const char *channel, *recipient, *content; /* [*_len] bytes, no NUL */
    uint32_t channel_len, recipient_len, content_len;
    const char *tool_call_id;                  /* [tool_call_id_len]; 0 = none */
    uint32_t tool_call_id_len;
};

/* A whole chat: the tools the model may call (JSON text, [tools_len] bytes, 0 = none) and its
 * messages. */
struct shm_chat {
    const char *tools;
    uint32_t tools_len;
    uint32_t tool_choice; /* struct shm_wire_chat's (shm_abi.h); 0 = auto */
    const struct shm_chat_msg *msgs;
    uint32_t n;
};

/* The size of the chat encoding of ch: ERR_FORMAT (logged, naming the message index and the
 * field; msg[cap] says it too when msg is not NULL) when one is out of the ABI's bounds. */
int shm_chat_size(const struct shm_chat *ch, uint32_t *len, char *msg, size_t cap);
/* Writes the encoding shm_chat_size accepted into buf[len]. */
void shm_chat_encode(const struct shm_chat *ch, void *buf, uint32_t len);
/* Validates the encoding buf[len] and decodes up to cap messages into out (may be NULL to only
 * count): 0 with *n set and, when tools is not NULL, *tools and *tools_len the tools' JSON text
 * (a view; NULL/0 for none); ERR_FORMAT (logged, naming the message and the field). */
int shm_chat_decode(const void *buf, uint32_t len, struct shm_chat_msg *out, uint32_t cap,
                    uint32_t *n, const char **tools, uint32_t *tools_len);
/* The tool_choice of an encoding shm_chat_decode accepted (shm_abi.h, struct shm_wire_chat). */
uint32_t shm_chat_tool_choice(const void *buf);

/* "generate", "token", ...; NULL for a value that is not a record type. */
const char *shm_msg_type_name(uint32_t type);
/* SHM_RING_REQUESTS or SHM_RING_EVENTS: the ring a type travels on; -1 for a non-type. */
int shm_msg_type_ring(uint32_t type);

/*
 * Validates m and computes its encoded length. ERR_FORMAT (logged, naming `what`, the record
 * and the field) for an invalid message; ERR_RANGE (logged) when the record would exceed
 * 2^32 - 1 bytes. `what` labels messages (e.g. the ring's name).
 */
int shm_msg_size(const char *what, const struct shm_msg *m, uint32_t *len);
/* Writes the record of a message shm_msg_size() accepted into buf[len] (len = its answer). */
void shm_msg_encode(const struct shm_msg *m, void *buf, uint32_t len);

/*
 * Decodes and validates the record buf[len] of `type` (buf 8-byte aligned). 0 with *out a view
 * into buf; ERR_FORMAT (logged, naming what, the record, its request id and the field).
 */
int shm_msg_decode(const char *what, uint32_t type, const void *buf, uint32_t len,
                   struct shm_msg *out);

/*
 * Encodes m straight into the producer ring r (no intermediate copy). 0 once committed;
 * -EAGAIN when the ring is full now (wait with shm_ring_wait_writable and retry, or use
 * shm_msg_send_wait); ERR_FORMAT for an invalid message or one on the wrong ring; ERR_RANGE
 * when it exceeds the ring's record limit; ring errors as shm_ring_reserve.
 */
int shm_msg_send(struct shm_ring *r, const struct shm_msg *m);
/* shm_msg_send, waiting up to timeout_ns (< 0: no deadline) for room; codes as
 * shm_ring_wait_writable. */
int shm_msg_send_wait(struct shm_ring *r, const struct shm_msg *m, int64_t timeout_ns);

/*
 * Reads the next record of the consumer ring r into buf[cap] (8-byte aligned; give it
 * shm_ring_max_record() bytes) and decodes it into *out. -EAGAIN when empty. A record that does
 * not decode, or a type that does not belong on this ring, marks the ring broken (ERR_FORMAT):
 * the producer is not following the protocol, and nothing it sends after can be trusted.
 */
int shm_msg_recv(struct shm_ring *r, void *buf, size_t cap, struct shm_msg *out);

#endif
