/*
 * shm_abi.h — THE cross-process contract between clocherd (the gateway side) and one
 * clocher-worker: the layout of the shared-memory region they share, of its two rings and of
 * every record the rings carry, and the memory ordering between the two sides ("Ordering"
 * below). (What a worker inherits besides the region — argv, descriptors, exit statuses,
 * control socket — is heritage.h.) Both processes run on the same host, so fields are in host
 * byte order; they need not come from the same build (clocherd runs whichever clocher-worker
 * --worker-binary names), which is what the header's abi_version and hdr_size catch at attach.
 * Everything else is pinned down here: fixed-width fields, offsets (never pointers), explicit
 * padding, and a static_assert on the size of every shared struct and the offset of every
 * field a peer reads (at the end of this file). Changing anything below means bumping
 * SHM_ABI_VERSION.
 *
 * Region (one memfd per worker generation, docs/SHM.md):
 *
 *   0        struct shm_hdr: identity (immutable after creation), one line per side
 *            (pid, state, heartbeat), the control block of each ring
 *   4096     data of ring 0 (requests, gateway → worker), capacity C0 (a power of two)
 *   4096+C0  data of ring 1 (events, worker → gateway), capacity C1
 *
 * NOTES: the region is writable by both processes, so a corrupt or malicious peer can write
 * any byte of it at any time. Readers therefore copy the immutable identity once at attach and
 * never read it again, keep their own counters in private memory, and validate every value a
 * peer writes (counters, record headers, records) before using it (ring.c, msg.c). Shared
 * counters are C11 atomics; the static_asserts below require them to be lock-free (hence
 * address-free, as C11 recommends), which is what makes them valid across processes.
 *
 * Ordering. Which release publishes what to which acquire, between the two sides (region.c and
 * ring.c implement it and name these labels where they do):
 *
 *   ID     The identity (struct shm_hdr lines 0-1, the ring descriptors) is written by the
 *          creator before the memfd leaves its process; the fork+exec that passes it orders
 *          those plain stores before every read by the worker. Nobody writes it again; each
 *          side copies it once at create/attach and never re-reads it.
 *   L1/L2  struct shm_side, written only by its own side: pid and a heartbeat first (relaxed),
 *          then state (L1, store-release). The peer loads state first (L2, load-acquire), then
 *          pid and heartbeat (relaxed): a peer that sees ATTACHED sees the pid that goes with
 *          it, and one that sees READY or DRAINING sees a heartbeat at least as recent as that
 *          state change (shm_region_set_state heartbeats just before it), so a long silence
 *          before READY never reads as stale. CLOSED is stored the same way (L1), after the
 *          side's last record, so a peer that sees CLOSED sees everything sent before it.
 *          Heartbeats alone are relaxed: a clock sample ordered with nothing, judged against a
 *          limit of seconds.
 *   R1/A1  The producer writes a record, then stores tail (R1, release); the consumer loads
 *          tail (A1, acquire) before reading the header and payload: it sees every byte
 *          written before R1.
 *   R2/A2  The consumer copies a record out, then stores head (R2, release); the producer loads
 *          head (A2, acquire) before reusing those bytes: it never overwrites what is still
 *          being read.
 *   S1/S2  Sleeping without lost wake-ups (Dekker): a waiter stores its `waiting` flag, then
 *          re-loads the other end's counter (S1); the other end stores its counter, then loads
 *          the flag (S2). These four accesses are seq_cst, so at least one side sees the
 *          other's store: the waiter sees the progress and does not sleep, or the other end
 *          sees the flag and wakes it. Hence R1 and R2 are seq_cst stores (a release plus the
 *          store-load order S2 needs).
 *   W1/W2  A waker bumps the futex word (data_seq/space_seq) with a release (W1) after what it
 *          announces (new records, a CLOSED state, a broken ring); the sleeper loads the word
 *          with an acquire before it sleeps (W2): a sleeper that sees the bump sees what came
 *          before it, and FUTEX_WAIT on the old value returns at once.
 *   BRK    `broken` is a flag that publishes nothing (relaxed both ways): a side that sets it
 *          stops using the ring; the other sees it at its next call, or at once through W1.
 */
#ifndef CLOCHER_SHM_SHM_ABI_H
#define CLOCHER_SHM_SHM_ABI_H

#include <assert.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define SHM_MAGIC 0x48534c43u      /* "CLSH" */
#define SHM_ABI_VERSION 6u          /* 3: chat tools, tool_call_id, TOKEN call headers;
                                     * 4: GENERATE.sent_ns; 5: the chat's tool_choice;
                                     * 6: tool_choice's SHM_TOOL_CHOICE_ONE_CALL bit */
#define SHM_LINE 64u               /* cache line: no two writers share one */
#define SHM_PAGE 4096u
#define SHM_HDR_SIZE 4096u         /* the header page; ring data follows, page-aligned */
#define SHM_REC_ALIGN 16u          /* records (header + payload + padding) are multiples */
#define SHM_RING_MIN_CAPACITY 4096u
#define SHM_RING_MAX_CAPACITY (1u << 30)

enum shm_side_id { SHM_SIDE_GATEWAY = 0, SHM_SIDE_WORKER = 1, SHM_SIDES = 2 };
enum shm_ring_id { SHM_RING_REQUESTS = 0, SHM_RING_EVENTS = 1, SHM_RINGS = 2 };

/* A side's lifecycle as it announces it in its line. Values outside the enum are corruption. */
enum shm_state {
    SHM_STATE_NONE = 0,     /* not attached yet (the worker before shm_region_attach) */
    SHM_STATE_ATTACHED = 1, /* mapped and checked the region */
    SHM_STATE_READY = 2,    /* serving */
    SHM_STATE_DRAINING = 3, /* finishing what it has, taking nothing new */
    SHM_STATE_CLOSED = 4,   /* closed its end on purpose: a clean goodbye, not a crash */
};

/* One side's line. Written only by that side; the other side reads and validates it. */
struct shm_side {
    _Atomic int32_t pid;          /* the side's process id, > 0 once set */
    _Atomic uint32_t state;       /* enum shm_state */
    _Atomic uint64_t heartbeat_ns; /* CLOCK_MONOTONIC of the side's last sign of life */
    _Atomic uint64_t heartbeats;  /* how many it has given (diagnostics) */
    uint8_t reserved[40];
};

/*
 * A ring's control block. head and tail count bytes ever consumed/produced: they only grow, and
 * `tail - head` is the number of bytes in the ring, so full and empty need no spare slot.
 * Line 0 is written by the producer, line 1 by the consumer (DPDK's separation), line 2 by
 * either side only when it gives up on the ring.
 */
struct shm_ring_ctl {
    /* line 0: producer */
    _Atomic uint64_t tail;          /* bytes published; store-release by the producer */
    _Atomic uint32_t data_seq;      /* futex word the consumer sleeps on; bumped to wake it */
    _Atomic uint32_t prod_waiting;  /* the producer sleeps on space_seq (cleared by the waker) */
    uint8_t pad0[SHM_LINE - 16];
    /* line 1: consumer */
    _Atomic uint64_t head;          /* bytes consumed; store-release by the consumer */
    _Atomic uint32_t space_seq;     /* futex word the producer sleeps on; bumped to wake it */
    _Atomic uint32_t cons_waiting;  /* the consumer sleeps on data_seq (cleared by the waker) */
    uint8_t pad1[SHM_LINE - 16];
    /* line 2: either side */
    _Atomic uint32_t broken;        /* nonzero: a side found the ring corrupt and gave up */
    uint8_t pad2[SHM_LINE - 4];
};

/* Where a ring's data lives. Immutable after creation; validated against the region at attach. */
struct shm_ring_desc {
    uint64_t data_offset;           /* from the region start; page-aligned, >= SHM_HDR_SIZE */
    uint64_t capacity;              /* bytes, a power of two in [SHM_RING_MIN_CAPACITY, MAX] */
};

struct shm_hdr {
    /* line 0-1: identity, written by the creator before the fd leaves its process */
    uint32_t magic;                 /* SHM_MAGIC */
    uint32_t abi_version;           /* SHM_ABI_VERSION */
    uint32_t hdr_size;              /* sizeof(struct shm_hdr): catches a mismatched build */
    uint32_t generation;            /* > 0; a respawned worker gets a new region and generation */
    uint64_t region_size;           /* must equal the memfd's size */
    uint32_t max_record;            /* the largest record payload either ring accepts */
    uint32_t reserved0;
    struct shm_ring_desc rings[SHM_RINGS];
    uint8_t pad0[2 * SHM_LINE - 64];
    /* lines 2-3 */
    struct shm_side sides[SHM_SIDES];
    /* lines 4-9 */
    struct shm_ring_ctl ctl[SHM_RINGS];
};

/*
 * Record header. Records are contiguous in a ring: a record that would cross the end of the
 * data area is preceded by a PAD record filling the rest of it, so a consumer always sees a
 * whole record at one address. `seq` counts every record of the ring from 0 (pads included),
 * which catches a consumer and producer out of step and stale data. Records are aligned to
 * SHM_REC_ALIGN = the header size, so a pad header always fits at the end of the data area.
 */
struct shm_rec_hdr {
    uint32_t len;                   /* payload bytes after this header (padding excluded) */
    uint32_t type;                  /* SHM_REC_PAD or an enum shm_msg_type */
    uint64_t seq;
};
#define SHM_REC_PAD 1u              /* len = bytes to the end of the data area - header */

/* ---- record payloads (msg.h encodes and validates them) ---- */

/* Types 16..63 travel gateway → worker (requests ring), 64..127 worker → gateway (events). */
enum shm_msg_type {
    SHM_MSG_GENERATE = 16,          /* start generating: struct shm_wire_generate + sections */
    SHM_MSG_CANCEL = 17,            /* stop a request: struct shm_wire_id */
    SHM_MSG_TOKENIZE = 18,          /* text → ids: struct shm_wire_tokenize + text */
    SHM_MSG_DETOKENIZE = 19,        /* ids → text: struct shm_wire_ids + ids */
    SHM_MSG_ADAPTER_LOAD = 20,      /* struct shm_wire_adapter_load + name + path */
    SHM_MSG_ADAPTER_UNLOAD = 21,    /* struct shm_wire_name + name */
    SHM_MSG_STATS_QUERY = 22,       /* struct shm_wire_id; answered by SHM_MSG_STATS */

    SHM_MSG_TOKEN = 64,             /* one generated token: struct shm_wire_token + text piece */
    SHM_MSG_FINISH = 65,            /* a generation ended: struct shm_wire_finish */
    SHM_MSG_ERROR = 66,             /* a request failed: struct shm_wire_error + message */
    SHM_MSG_TOKENS = 67,            /* TOKENIZE's answer: struct shm_wire_ids + ids */
    SHM_MSG_TEXT = 68,              /* DETOKENIZE's answer: struct shm_wire_text + text */
    SHM_MSG_ADAPTER = 69,           /* ADAPTER_LOAD's answer: struct shm_wire_adapter + name */
    SHM_MSG_DONE = 70,              /* a request without other answer succeeded: shm_wire_id */
    SHM_MSG_STATS = 71,             /* STATS_QUERY's answer: struct shm_wire_stats */
    SHM_MSG_HELLO = 72,             /* sent once after attach: struct shm_wire_hello + strings */
};

/* Limits every decoder enforces (the gateway's own limits are tighter or equal). */
#define SHM_MAX_STOP 16u            /* stop strings per request */
#define SHM_MAX_STOP_LEN 256u       /* bytes of one stop string, NUL excluded */
#define SHM_MAX_NAME 63u            /* adapter names: 1..63 bytes of [A-Za-z0-9._-] */
#define SHM_MAX_PATH 4095u          /* adapter directories, NUL excluded */
#define SHM_MAX_PIECE 4096u         /* text bytes of one token event */
#define SHM_MAX_ERROR 1023u         /* error message bytes, NUL excluded */
#define SHM_MAX_INFO 255u           /* HELLO strings, NUL excluded */
#define SHM_MAX_REPEAT_WINDOW (1u << 20)
#define SHM_MAX_RANK 65536u
/* Sequences a worker runs at once (beyond them it queues limits.max_queue more): the gateway
 * refuses a generation at once when the least loaded worker holds both. */
#define SHM_MAX_RUNNING 64u

/* Strings marked "NUL-terminated" carry their terminating NUL inside the counted length, and no
 * other NUL; "bytes" are raw (UTF-8 text that may legitimately hold any byte). Sections follow
 * the fixed part in the order listed, unpadded; the record length is their exact sum. */

enum shm_priority { SHM_PRIO_HIGH = 0, SHM_PRIO_NORMAL = 1, SHM_PRIO_LOW = 2 };
#define SHM_GEN_ADD_BOS 0x1u        /* text prompts: prepend BOS when tokenizing */
#define SHM_GEN_CHAT 0x2u           /* prompt_text is a chat encoding (below), not text */
#define SHM_GEN_EFFORT_LOW 0x4u     /* chat: reasoning effort low (neither bit: medium) */
#define SHM_GEN_EFFORT_HIGH 0x8u    /* chat: reasoning effort high (not with _LOW) */
#define SHM_GEN_FLAGS (0xfu | SHM_GEN_BATCH_INVARIANT) /* every defined flag */
/* batchinv: batch-invariant products for this request (engine_request.batch_invariant,
 * docs/DAEMON.md "Batch invariance"); decoders refuse unknown bits, so an older worker
 * refuses the record rather than ignore the flag. 0x80, not the next free bit 0x10, which
 * test_shm_msg uses as its unknown bit */
#define SHM_GEN_BATCH_INVARIANT 0x80u

/* ---- chat tools (ABI 3): the chat encoding and the TOKEN call header ---- */
/* The chat encoding (GENERATE with SHM_GEN_CHAT: the prompt_text section, counted against
 * limits.max_prompt_bytes like a text prompt): a struct shm_wire_chat, then uint8
 * tools[tools_len] (the tools the model may call: OpenAI's `tools` array as JSON text, no NUL,
 * <= SHM_MAX_CHAT_TOOLS bytes; 0 = none; the worker parses it and refuses what is not such an
 * array), then 1..SHM_MAX_CHAT_MSGS messages back to back, each a struct shm_wire_chat_msg
 * then uint8 channel[channel_len], recipient[recipient_len], tool_call_id[tool_call_id_len],
 * content[content_len] (bytes, no NUL in any; channel, recipient and tool_call_id <=
 * SHM_MAX_CHAT_NAME bytes of [A-Za-z0-9._:-]). The worker renders them with the model's
 * template. Parallel tool calls are consecutive assistant messages, one recipient each.
 * docs/SHM.md "The chat encoding". */
enum shm_chat_role {
    SHM_CHAT_SYSTEM = 0, SHM_CHAT_DEVELOPER = 1, SHM_CHAT_USER = 2, SHM_CHAT_ASSISTANT = 3,
    SHM_CHAT_TOOL = 4, /* recipient = the tool's name (required) */
};
struct shm_wire_chat {
    uint32_t tools_len;             /* <= SHM_MAX_CHAT_TOOLS */
    uint32_t tool_choice;           /* (ABI 5) bits 0..6 enum shm_tool_choice; bit 7 (ABI 6)
                                     * SHM_TOOL_CHOICE_ONE_CALL; bits 8..31 with
                                     * SHM_TOOL_CHOICE_FUNCTION the index of the function in
                                     * the tools array (the worker checks it against the array),
                                     * else 0. Not 0 only with tools. */
};
/* What the reply must do with the tools (OpenAI's tool_choice; "none" never travels: the
 * gateway sends no tools then). The worker forces the opening of a call in the model's own
 * format (docs/CHAT.md "tool_choice"); the model writes the rest. */
enum shm_tool_choice {
    SHM_TOOL_CHOICE_AUTO = 0,     /* the model decides */
    SHM_TOOL_CHOICE_REQUIRED = 1, /* a call; the model picks the tool */
    SHM_TOOL_CHOICE_FUNCTION = 2, /* a call of the function at index tool_choice >> 8 */
};
/* OpenAI's parallel_tool_calls false: the reply holds at most one call; the worker ends it
 * when that call closes and drops any further call of a list (docs/CHAT.md). */
#define SHM_TOOL_CHOICE_ONE_CALL 0x80u
#define SHM_TOOL_CHOICE_MODE(v) ((v) & 0x7fu)
#define SHM_TOOL_CHOICE_INDEX(v) ((v) >> 8)
struct shm_wire_chat_msg {
    uint32_t role;                  /* enum shm_chat_role */
    uint32_t channel_len;           /* assistant only; 0 = none */
    uint32_t recipient_len;         /* assistant (a tool call) and tool (its name) only */
    uint32_t content_len;
    uint32_t tool_call_id_len;      /* assistant with a recipient, and tool, only; 0 = none */
    uint32_t reserved;              /* 0 */
};
#define SHM_MAX_CHAT_MSGS 256u
#define SHM_MAX_CHAT_NAME 128u
#define SHM_MAX_CHAT_TOOLS (1u << 20)
/* A TOKEN whose text_len has SHM_TOKEN_CALL_OPEN opens a tool call: after its text comes a
 * struct shm_wire_call then char name[name_len] (the recipient, "functions.get_weather"),
 * id[id_len] (the call's id, made by the worker: "call_..."), both 1..SHM_MAX_CHAT_NAME bytes
 * of [A-Za-z0-9._:-]; only on a chat's piece (channel != NONE). That piece's text and the
 * following pieces' (up to the next call header or the FINISH) are the call's arguments. */
struct shm_wire_call {
    uint32_t name_len;
    uint32_t id_len;
};
/* ---- end chat tools ---- */

/* The channel a chat request's piece belongs to: TOKEN's text_len bits 24..30 (0 for requests
 * that are not chats). */
enum shm_channel {
    SHM_CH_NONE = 0, SHM_CH_ANALYSIS = 1, SHM_CH_COMMENTARY = 2, SHM_CH_FINAL = 3,
    SHM_CH_OTHER = 4,
};

/* GENERATE, then: int32 prompt_ids[n_prompt_ids]; char adapter[adapter_len] (NUL-terminated,
 * 0 = base model); char stops[stop_bytes] (n_stop NUL-terminated strings back to back);
 * uint8 prompt_text[prompt_text_len] (bytes). Exactly one of the two prompts is non-empty. */
struct shm_wire_generate {
    uint64_t request_id;            /* > 0, unique per region */
    uint64_t tenant_id;             /* prefix reuse and fairness are per tenant */
    uint64_t deadline_ns;           /* CLOCK_MONOTONIC; 0 = none */
    uint64_t seed;
    float temperature;              /* >= 0; 0 = greedy */
    float top_p;                    /* (0, 1] */
    float min_p;                    /* [0, 1) */
    float repeat_penalty;           /* > 0; 1 = off */
    float adapter_scale;            /* finite */
    uint32_t top_k;                 /* 0 = off */
    uint32_t repeat_window;         /* <= SHM_MAX_REPEAT_WINDOW */
    uint32_t max_tokens;            /* >= 1: the gateway resolves the default */
    uint32_t priority;              /* enum shm_priority */
    uint32_t flags;                 /* SHM_GEN_* */
    uint32_t n_prompt_ids;
    uint32_t prompt_text_len;
    uint32_t adapter_len;
    uint32_t n_stop;                /* <= SHM_MAX_STOP */
    uint32_t stop_bytes;
    uint32_t logprobs;              /* 0 = none; else 1 + the alternatives each TOKEN carries
                                     * (0..SHM_MAX_TOP_LOGPROBS) */
    uint64_t sent_ns;               /* CLOCK_MONOTONIC when the gateway put it on the ring
                                     * (queue_ms starts there); a reader clamps it to now */
};

/* CANCEL, STATS_QUERY, DONE */
struct shm_wire_id {
    uint64_t request_id;            /* > 0 */
};

/* TOKENIZE, then uint8 text[text_len] */
struct shm_wire_tokenize {
    uint64_t request_id;
    uint32_t flags;                 /* SHM_GEN_ADD_BOS */
    uint32_t text_len;
};

/* DETOKENIZE and TOKENS, then int32 ids[n_ids] (each >= 0) */
struct shm_wire_ids {
    uint64_t request_id;
    uint32_t n_ids;
    uint32_t reserved;              /* 0 */
};

/* ADAPTER_LOAD, then char name[name_len], char path[path_len] (both NUL-terminated) */
struct shm_wire_adapter_load {
    uint64_t request_id;
    uint32_t name_len;
    uint32_t path_len;
};

/* ADAPTER_UNLOAD, then char name[name_len] (NUL-terminated) */
struct shm_wire_name {
    uint64_t request_id;
    uint32_t name_len;
    uint32_t reserved;              /* 0 */
};

/* TOKEN, then uint8 text[text_len] (the completed UTF-8 text this token adds; may be empty),
 * then, when text_len has SHM_TOKEN_CALL_OPEN, the call header (struct shm_wire_call + name + id),
 * then, when text_len has SHM_TOKEN_LOGPROBS (a GENERATE that asked for logprobs, a generated
 * token), 1 + n_top entries, each a struct shm_wire_logprob then uint8 piece[piece_len] (the
 * token's own bytes, possibly a partial UTF-8 character): the token's own (its id = token),
 * then its n_top most likely alternatives, most likely first. Log-probabilities are natural
 * logs, finite, in [SHM_LOGPROB_FLOOR, 0] (an impossible token's is the floor). */
struct shm_wire_token {
    uint64_t request_id;
    int32_t token;                  /* >= 0; -1 = text only (held back until the end, with text) */
    uint32_t text_len;              /* bits 0..15: the length, <= SHM_MAX_PIECE;
                                     * bits 16..22: n_top (<= SHM_MAX_TOP_LOGPROBS);
                                     * bit 23 (SHM_TOKEN_LOGPROBS): the logprob section follows;
                                     * bits 24..29: the piece's enum shm_channel (chat requests),
                                     * else 0; bit 30 (SHM_TOKEN_CALL_OPEN): a call header
                                     * follows the text (shm_wire_call); bit 31 (SHM_TOKEN_CALL): the id is harmony's
                                     * <|call|>, the reply ends with a tool call (FINISH: EOS) */
};
#define SHM_TOKEN_LEN_MASK 0xffffu
#define SHM_TOKEN_TOP_SHIFT 16
#define SHM_TOKEN_TOP_MASK 0x7fu
#define SHM_TOKEN_LOGPROBS 0x800000u
#define SHM_TOKEN_CHANNEL_SHIFT 24
#define SHM_TOKEN_CHANNEL_MASK 0x3fu
#define SHM_TOKEN_CALL_OPEN 0x40000000u
#define SHM_TOKEN_CALL 0x80000000u
#define SHM_MAX_TOP_LOGPROBS 20u
#define SHM_LOGPROB_FLOOR -9999.0f

#define SHM_MAX_LOGPROB_PIECE 256u   /* bytes of one token's piece in a logprob entry */
struct shm_wire_logprob {
    int32_t id;                     /* >= 0 */
    float logprob;
    uint32_t piece_len;             /* <= SHM_MAX_LOGPROB_PIECE */
};

enum shm_finish {
    SHM_FINISH_EOS = 1,             /* the model ended the sequence */
    SHM_FINISH_LENGTH = 2,          /* max_tokens reached */
    SHM_FINISH_STOP = 3,            /* a stop string matched */
    SHM_FINISH_CANCELLED = 4,       /* a CANCEL record */
    SHM_FINISH_DEADLINE = 5,        /* deadline_ns passed */
    SHM_FINISH_CONTEXT = 6,         /* the model's context length was reached */
};

/* FINISH: the last record of a successful generation */
struct shm_wire_finish {
    uint64_t request_id;
    uint32_t reason;                /* enum shm_finish */
    uint32_t prompt_tokens;
    uint32_t completion_tokens;
    uint32_t cached_tokens;         /* <= prompt_tokens: served from the prefix cache */
    uint64_t queue_ns;              /* submit → first scheduled */
    uint64_t ttft_ns;               /* submit → first token */
    uint64_t tpot_ns;               /* mean time per output token after the first */
    uint64_t e2e_ns;                /* submit → finish */
};

/* ERROR, then char message[message_len] (NUL-terminated, 1..SHM_MAX_ERROR+1). The last record
 * of a failed request; request_id 0 = a worker-level error tied to no request. */
struct shm_wire_error {
    uint64_t request_id;
    int32_t code;                   /* < 0: -errno or an ERR_* code (common/err.h) */
    uint32_t message_len;
};

/* TEXT, then uint8 text[text_len] */
struct shm_wire_text {
    uint64_t request_id;
    uint32_t text_len;
    uint32_t reserved;              /* 0 */
};

/* The projections an adapter may target (bits of shm_wire_adapter.targets). */
enum shm_target {
    SHM_TARGET_Q = 1u << 0, SHM_TARGET_K = 1u << 1, SHM_TARGET_V = 1u << 2,
    SHM_TARGET_O = 1u << 3, SHM_TARGET_GATE = 1u << 4, SHM_TARGET_UP = 1u << 5,
    SHM_TARGET_DOWN = 1u << 6,
};
#define SHM_TARGETS 0x7fu           /* every defined target bit */

/* ADAPTER, then char name[name_len] (NUL-terminated) */
struct shm_wire_adapter {
    uint64_t request_id;
    uint32_t rank;                  /* 1..SHM_MAX_RANK */
    float alpha;                    /* finite, > 0 */
    uint32_t targets;               /* nonzero subset of SHM_TARGETS */
    uint32_t active_requests;
    uint32_t name_len;
    uint32_t reserved;              /* 0 */
};

/* STATS: the engine's counters (worker/engine/engine.h engine_metrics) and the worker's RSS */
struct shm_wire_stats {
    uint64_t request_id;
    uint32_t running;
    uint32_t waiting;
    uint64_t kv_blocks_total;
    uint64_t kv_blocks_used;        /* used <= total, cached <= total */
    uint64_t kv_blocks_cached;
    uint64_t prefix_hit_tokens;
    uint64_t prefix_miss_tokens;
    uint64_t preemptions;
    uint64_t requests_finished;
    uint64_t tokens_generated;
    uint64_t tokens_prefilled;
    uint64_t rss_bytes;
};

/* HELLO (request_id 0), then char name[name_len], arch[arch_len], dtype[dtype_len], each
 * NUL-terminated, 2..SHM_MAX_INFO+1 bytes, printable ASCII */
struct shm_wire_hello {
    uint64_t request_id;            /* 0 */
    uint64_t parameters;
    uint32_t vocab_size;            /* >= 1 */
    uint32_t context_length;        /* >= 1 */
    uint32_t name_len;
    uint32_t arch_len;
    uint32_t dtype_len;
    uint32_t reserved;              /* 0 */
};

/* ---- the layout is the contract: pin it ---- */

#define SHM_PIN(type, field, off)                                                                  \
    static_assert(offsetof(struct type, field) == (off), #type "." #field " moved")

static_assert(ATOMIC_INT_LOCK_FREE == 2 && ATOMIC_LLONG_LOCK_FREE == 2,
              "shared-memory atomics must be lock-free (address-free) across processes");
static_assert(sizeof(_Atomic uint64_t) == 8 && sizeof(_Atomic uint32_t) == 4 &&
                  sizeof(_Atomic int32_t) == 4, "atomics must have their plain size");
static_assert(sizeof(float) == 4, "float is IEEE-754 binary32");

static_assert(sizeof(struct shm_side) == SHM_LINE, "shm_side is one line");
static_assert(offsetof(struct shm_side, pid) == 0, "abi");
static_assert(offsetof(struct shm_side, state) == 4, "abi");
static_assert(offsetof(struct shm_side, heartbeat_ns) == 8, "abi");
static_assert(offsetof(struct shm_side, heartbeats) == 16, "abi");

static_assert(sizeof(struct shm_ring_ctl) == 3 * SHM_LINE, "shm_ring_ctl is three lines");
static_assert(offsetof(struct shm_ring_ctl, tail) == 0, "abi");
static_assert(offsetof(struct shm_ring_ctl, data_seq) == 8, "abi");
static_assert(offsetof(struct shm_ring_ctl, prod_waiting) == 12, "abi");
static_assert(offsetof(struct shm_ring_ctl, head) == SHM_LINE, "head on its own line");
static_assert(offsetof(struct shm_ring_ctl, space_seq) == SHM_LINE + 8, "abi");
static_assert(offsetof(struct shm_ring_ctl, cons_waiting) == SHM_LINE + 12, "abi");
static_assert(offsetof(struct shm_ring_ctl, broken) == 2 * SHM_LINE, "abi");

static_assert(offsetof(struct shm_hdr, magic) == 0, "magic first");
static_assert(offsetof(struct shm_hdr, abi_version) == 4, "abi");
static_assert(offsetof(struct shm_hdr, hdr_size) == 8, "abi");
static_assert(offsetof(struct shm_hdr, generation) == 12, "abi");
static_assert(offsetof(struct shm_hdr, region_size) == 16, "abi");
static_assert(offsetof(struct shm_hdr, max_record) == 24, "abi");
static_assert(offsetof(struct shm_hdr, rings) == 32, "abi");
static_assert(offsetof(struct shm_hdr, reserved0) == 28, "abi");
static_assert(offsetof(struct shm_hdr, sides) == 2 * SHM_LINE, "sides start at line 2");
static_assert(offsetof(struct shm_hdr, ctl) == 4 * SHM_LINE, "ring controls start at line 4");
static_assert(sizeof(struct shm_hdr) == 10 * SHM_LINE, "abi");
static_assert(sizeof(struct shm_hdr) <= SHM_HDR_SIZE, "the header fits its page");

static_assert(sizeof(struct shm_rec_hdr) == 16 && sizeof(struct shm_rec_hdr) == SHM_REC_ALIGN,
              "a record header is one alignment unit");
SHM_PIN(shm_rec_hdr, len, 0);
SHM_PIN(shm_rec_hdr, type, 4);
SHM_PIN(shm_rec_hdr, seq, 8);

/* Every payload field at its offset: a peer decodes these from its own build. */
static_assert(sizeof(struct shm_ring_desc) == 16, "abi");
SHM_PIN(shm_ring_desc, data_offset, 0);
SHM_PIN(shm_ring_desc, capacity, 8);
static_assert(sizeof(struct shm_wire_generate) == 104, "abi");
SHM_PIN(shm_wire_generate, request_id, 0);
SHM_PIN(shm_wire_generate, tenant_id, 8);
SHM_PIN(shm_wire_generate, deadline_ns, 16);
SHM_PIN(shm_wire_generate, seed, 24);
SHM_PIN(shm_wire_generate, temperature, 32);
SHM_PIN(shm_wire_generate, top_p, 36);
SHM_PIN(shm_wire_generate, min_p, 40);
SHM_PIN(shm_wire_generate, repeat_penalty, 44);
SHM_PIN(shm_wire_generate, adapter_scale, 48);
SHM_PIN(shm_wire_generate, top_k, 52);
SHM_PIN(shm_wire_generate, repeat_window, 56);
SHM_PIN(shm_wire_generate, max_tokens, 60);
SHM_PIN(shm_wire_generate, priority, 64);
SHM_PIN(shm_wire_generate, flags, 68);
SHM_PIN(shm_wire_generate, n_prompt_ids, 72);
SHM_PIN(shm_wire_generate, prompt_text_len, 76);
SHM_PIN(shm_wire_generate, adapter_len, 80);
SHM_PIN(shm_wire_generate, n_stop, 84);
SHM_PIN(shm_wire_generate, stop_bytes, 88);
SHM_PIN(shm_wire_generate, logprobs, 92);
SHM_PIN(shm_wire_generate, sent_ns, 96);
static_assert(sizeof(struct shm_wire_id) == 8, "abi");
SHM_PIN(shm_wire_id, request_id, 0);
static_assert(sizeof(struct shm_wire_tokenize) == 16, "abi");
SHM_PIN(shm_wire_tokenize, request_id, 0);
SHM_PIN(shm_wire_tokenize, flags, 8);
SHM_PIN(shm_wire_tokenize, text_len, 12);
static_assert(sizeof(struct shm_wire_ids) == 16, "abi");
SHM_PIN(shm_wire_ids, request_id, 0);
SHM_PIN(shm_wire_ids, n_ids, 8);
SHM_PIN(shm_wire_ids, reserved, 12);
static_assert(sizeof(struct shm_wire_adapter_load) == 16, "abi");
SHM_PIN(shm_wire_adapter_load, request_id, 0);
SHM_PIN(shm_wire_adapter_load, name_len, 8);
SHM_PIN(shm_wire_adapter_load, path_len, 12);
static_assert(sizeof(struct shm_wire_name) == 16, "abi");
SHM_PIN(shm_wire_name, request_id, 0);
SHM_PIN(shm_wire_name, name_len, 8);
SHM_PIN(shm_wire_name, reserved, 12);
static_assert(sizeof(struct shm_wire_token) == 16, "abi");
static_assert(sizeof(struct shm_wire_logprob) == 12, "abi");
static_assert(SHM_MAX_PIECE <= SHM_TOKEN_LEN_MASK, "abi");
static_assert(SHM_MAX_TOP_LOGPROBS <= SHM_TOKEN_TOP_MASK, "abi");
SHM_PIN(shm_wire_token, request_id, 0);
SHM_PIN(shm_wire_token, token, 8);
SHM_PIN(shm_wire_token, text_len, 12);
/* chat tools (ABI 3) */
static_assert(sizeof(struct shm_wire_chat_msg) == 24, "abi");
SHM_PIN(shm_wire_chat_msg, role, 0);
SHM_PIN(shm_wire_chat_msg, channel_len, 4);
SHM_PIN(shm_wire_chat_msg, recipient_len, 8);
SHM_PIN(shm_wire_chat_msg, content_len, 12);
SHM_PIN(shm_wire_chat_msg, tool_call_id_len, 16);
SHM_PIN(shm_wire_chat_msg, reserved, 20);
static_assert(sizeof(struct shm_wire_chat) == 8, "abi");
SHM_PIN(shm_wire_chat, tools_len, 0);
SHM_PIN(shm_wire_chat, tool_choice, 4);
static_assert(sizeof(struct shm_wire_call) == 8, "abi");
SHM_PIN(shm_wire_call, name_len, 0);
SHM_PIN(shm_wire_call, id_len, 4);
static_assert((SHM_TOKEN_CALL_OPEN & (SHM_TOKEN_CHANNEL_MASK << SHM_TOKEN_CHANNEL_SHIFT)) == 0 &&
                  (SHM_TOKEN_CALL_OPEN & SHM_TOKEN_CALL) == 0 && SHM_CH_OTHER <= SHM_TOKEN_CHANNEL_MASK,
              "abi");
static_assert(sizeof(struct shm_wire_finish) == 56, "abi");
SHM_PIN(shm_wire_finish, request_id, 0);
SHM_PIN(shm_wire_finish, reason, 8);
SHM_PIN(shm_wire_finish, prompt_tokens, 12);
SHM_PIN(shm_wire_finish, completion_tokens, 16);
SHM_PIN(shm_wire_finish, cached_tokens, 20);
SHM_PIN(shm_wire_finish, queue_ns, 24);
SHM_PIN(shm_wire_finish, ttft_ns, 32);
SHM_PIN(shm_wire_finish, tpot_ns, 40);
SHM_PIN(shm_wire_finish, e2e_ns, 48);
static_assert(sizeof(struct shm_wire_error) == 16, "abi");
SHM_PIN(shm_wire_error, request_id, 0);
SHM_PIN(shm_wire_error, code, 8);
SHM_PIN(shm_wire_error, message_len, 12);
static_assert(sizeof(struct shm_wire_text) == 16, "abi");
SHM_PIN(shm_wire_text, request_id, 0);
SHM_PIN(shm_wire_text, text_len, 8);
SHM_PIN(shm_wire_text, reserved, 12);
static_assert(sizeof(struct shm_wire_adapter) == 32, "abi");
SHM_PIN(shm_wire_adapter, request_id, 0);
SHM_PIN(shm_wire_adapter, rank, 8);
SHM_PIN(shm_wire_adapter, alpha, 12);
SHM_PIN(shm_wire_adapter, targets, 16);
SHM_PIN(shm_wire_adapter, active_requests, 20);
SHM_PIN(shm_wire_adapter, name_len, 24);
SHM_PIN(shm_wire_adapter, reserved, 28);
static_assert(sizeof(struct shm_wire_stats) == 96, "abi");
SHM_PIN(shm_wire_stats, request_id, 0);
SHM_PIN(shm_wire_stats, running, 8);
SHM_PIN(shm_wire_stats, waiting, 12);
SHM_PIN(shm_wire_stats, kv_blocks_total, 16);
SHM_PIN(shm_wire_stats, kv_blocks_used, 24);
SHM_PIN(shm_wire_stats, kv_blocks_cached, 32);
SHM_PIN(shm_wire_stats, prefix_hit_tokens, 40);
SHM_PIN(shm_wire_stats, prefix_miss_tokens, 48);
SHM_PIN(shm_wire_stats, preemptions, 56);
SHM_PIN(shm_wire_stats, requests_finished, 64);
SHM_PIN(shm_wire_stats, tokens_generated, 72);
SHM_PIN(shm_wire_stats, tokens_prefilled, 80);
SHM_PIN(shm_wire_stats, rss_bytes, 88);
static_assert(sizeof(struct shm_wire_hello) == 40, "abi");
SHM_PIN(shm_wire_hello, request_id, 0);
SHM_PIN(shm_wire_hello, parameters, 8);
SHM_PIN(shm_wire_hello, vocab_size, 16);
SHM_PIN(shm_wire_hello, context_length, 20);
SHM_PIN(shm_wire_hello, name_len, 24);
SHM_PIN(shm_wire_hello, arch_len, 28);
SHM_PIN(shm_wire_hello, dtype_len, 32);
SHM_PIN(shm_wire_hello, reserved, 36);

#endif
