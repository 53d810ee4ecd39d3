/*
 * heritage.h — everything clocherd hands a clocher-worker when it spawns one, and everything
 * the worker says back outside the rings: the command line (options, arguments, defaults), the
 * inherited descriptors, the environment passed or dropped, the exit statuses, and the control
 * socket's keys and limits. Both sides include this header and use nothing else for these
 * facts: the supervisor (daemon/sup.c) builds the argv and environment with heritage_argv_build
 * and heritage_env_build, the worker (worker/process/worker_main.c) parses them with
 * heritage_args_parse and heritage_env_parse; the worker's loop (worker/process/serve.c)
 * formats control datagrams with heritage_ctl_format and the supervisor (daemon/ctl.c) parses
 * them by the key table below. Varnish's bin/varnishd/heritage.h plays the same part between
 * its manager and its child. The region's layout is the other half of the contract
 * (shm_abi.h); docs/DAEMON.md ("Worker lifecycle") describes it for operators and
 * tests/shm/test_heritage.c keeps the two in step.
 *
 * NOTES: pure data and pure functions (no global state except getopt's, which
 * heritage_args_parse resets), callable from any thread but heritage_args_parse (getopt is not
 * reentrant).
 */
#ifndef CLOCHER_SHM_HERITAGE_H
#define CLOCHER_SHM_HERITAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- exit statuses of clocher-worker (clocherd returns the same three) ---- */

#define HERITAGE_EXIT_OK 0      /* a clean stop (SIGTERM); unasked, the supervisor counts a crash */
#define HERITAGE_EXIT_FAILURE 1 /* anything else: treated as a crash and respawned after backoff */
#define HERITAGE_EXIT_FATAL 2   /* configuration or model error: respawning cannot help */

/* ---- inherited descriptors ----
 * The supervisor passes them as uv_spawn stdio slots: libuv dup2()s each onto its number in the
 * child, which clears close-on-exec there, and the worker is told the numbers on its command
 * line (--control-fd, --region-fd) rather than assuming them. fd 0 is /dev/null, fds 1 and 2
 * are clocherd's (the journal under systemd). */
#define HERITAGE_FD_CONTROL 3   /* one end of a SOCK_SEQPACKET socketpair: the control channel */
#define HERITAGE_FD_REGION 4    /* the worker generation's sealed memfd region (shm/region.h) */
#define HERITAGE_FD_COUNT 5     /* stdio slots the supervisor fills: 0..HERITAGE_FD_REGION */

/* ---- the command line ----
 *
 * X(field, "long-name", kind, "ARG", default, max, emit, "help")
 *   kind     NUM: a decimal integer 0..max in an int64_t field (default -1 = not given);
 *            STR: a const char * (default NULL = not given); LIST: --adapter NAME=DIR, repeatable
 *   emit     REQUIRED: the worker refuses to start without it; ALWAYS: the supervisor always
 *            passes it; IF_SET: passed only when the field differs from its default
 * The order is the order of the supervisor's argv.
 */
#define HERITAGE_MAX_ADAPTERS 256

#define HERITAGE_OPTIONS(X)                                                                        \
    X(slot, "slot", NUM, "N", -1, 4095, REQUIRED, "the worker's slot (its place: node + CPUs)")  \
    X(generation, "generation", NUM, "G", -1, UINT32_MAX, REQUIRED,                              \
      "this spawn's generation: the region's header must say the same")                         \
    X(control_fd, "control-fd", NUM, "FD", -1, INT32_MAX, REQUIRED,                              \
      "the control socket (READY=1, WATCHDOG=1, ...)")                                           \
    X(region_fd, "region-fd", NUM, "FD", -1, INT32_MAX, REQUIRED, "the shared-memory region")    \
    X(cpus, "cpus", STR, "LIST", NULL, 0, REQUIRED,                                              \
      "CPUs to run on (\"0-7\"), set before loading")                                           \
    X(mem_node, "mem-node", NUM, "N", -1, 1023, IF_SET,                                          \
      "bind memory to this NUMA node (default: no binding)")                                     \
    X(model_dir, "model-dir", STR, "DIR", NULL, 0, REQUIRED, "the IEBIN model directory")        \
    X(threads, "threads", NUM, "N", 0, 1024, ALWAYS, "engine threads (0: every allowed CPU)")    \
    X(kv_budget_mb, "kv-budget-mb", NUM, "MB", 0, INT64_C(1) << 24, ALWAYS,                      \
      "KV cache budget (0: the engine's default)")                                               \
    X(max_queue, "max-queue", NUM, "N", 256, 1 << 20, ALWAYS, "requests waiting at most")        \
    X(max_prompt_tokens, "max-prompt-tokens", NUM, "N", 4096, 1 << 20, ALWAYS,                   \
      "longest prompt accepted")                                                                 \
    X(parent_pid, "parent-pid", NUM, "PID", 0, INT32_MAX, ALWAYS,                                \
      "clocherd's pid: exit at once if it is already gone (0: no check)")                        \
    X(lora_weights, "lora-weights", STR, HERITAGE_LORA_WEIGHTS_CHOICES,                          \
      HERITAGE_LORA_WEIGHTS_AUTO, 0, IF_SET, "LoRA weight packing (docs/LORA.md)")               \
    X(kv_dtype, "kv-dtype", STR, HERITAGE_KV_DTYPE_CHOICES, HERITAGE_KV_DTYPE_DEFAULT, 0, IF_SET,  \
      "KV cache element type (docs/KV.md)")                                                      \
    X(pin, "pin", STR, "none|compact|scatter", "compact", 0, IF_SET,                             \
      "pin the engine threads within the CPUs above (docs/DAEMON.md)")                           \
    X(kv_snapshot, "kv-snapshot", STR, "FILE", NULL, 0, IF_SET,                                  \
      "restore the prefix cache from FILE at start, save it there at stop (docs/KV.md)")         \
    X(kv_snapshot_max_mb, "kv-snapshot-max-mb", NUM, "MB", 0, INT64_C(1) << 24, IF_SET,          \
      "bytes of KV blocks a snapshot keeps at most (0: the whole pool)")                         \
    X(adapters, "adapter", LIST, "NAME=DIR", NULL, 0, IF_SET, "load this LoRA adapter at start")

/* --lora-weights values: the worker's lora_pack_parse reads them (it owns their meaning). */
#define HERITAGE_LORA_WEIGHTS_AUTO "auto"
#define HERITAGE_LORA_WEIGHTS_BF16 "bf16"
#define HERITAGE_LORA_WEIGHTS_INT8 "int8"
#define HERITAGE_LORA_WEIGHTS_CHOICES "auto|bf16|int8"
/* --kv-dtype values: dtype_kv_name()'s names (common/dtype.h); the worker's engine reads them */
#define HERITAGE_KV_DTYPE_DEFAULT "bf16"
#define HERITAGE_KV_DTYPE_CHOICES "f32|f16|bf16|int8|fp8"

#define HERITAGE_FIELD_NUM(f) int64_t f;
#define HERITAGE_FIELD_STR(f) const char *f;
#define HERITAGE_FIELD_LIST(f)                                                                     \
    size_t n_##f;                                                                                  \
    const char *f##_name[HERITAGE_MAX_ADAPTERS];                                                   \
    const char *f##_dir[HERITAGE_MAX_ADAPTERS];
#define HERITAGE_FIELD(field, name, kind, arg, dflt, max, emit, help) HERITAGE_FIELD_##kind(field)

/* The worker's command line, parsed (or about to be built). Strings point into argv (parse) or
 * into the caller's memory (build). */
struct heritage_args {
    HERITAGE_OPTIONS(HERITAGE_FIELD)
};

/* Every field at its default (what a worker gets for an option not given). */
void heritage_args_init(struct heritage_args *a);

/*
 * The supervisor's side: argv for `binary` with every option of `a` (REQUIRED and ALWAYS ones
 * always, IF_SET ones when they differ from their default; adapters as --adapter NAME=DIR),
 * NULL-terminated, in one allocation the caller frees with free(). NULL (logged) when out of
 * memory.
 */
char **heritage_argv_build(const char *binary, const struct heritage_args *a);

/*
 * The worker's side: parses argv into *a (heritage_args_init first). 0, HERITAGE_HELP for
 * --help / -h (the caller prints heritage_usage and exits 0), or ERR_USAGE (logged, naming the
 * option): an unknown option, a value out of range, a missing required option, more than
 * HERITAGE_MAX_ADAPTERS adapters, a stray argument. --adapter's NAME=DIR is split in place
 * (the '=' becomes a NUL), as getopt leaves argv strings to the program.
 */
#define HERITAGE_HELP 1
int heritage_args_parse(int argc, char **argv, struct heritage_args *a);

/* The worker's usage text, generated from HERITAGE_OPTIONS and the environment below. */
void heritage_usage(FILE *f);

/* ---- the environment ----
 * A worker gets clocherd's environment minus the variables below, plus the two the
 * configuration owns (hot_replication.*). systemd's NOTIFY_SOCKET and WATCHDOG_* are its
 * contract with clocherd alone: a worker that inherited them could ping systemd for clocherd. */
#define HERITAGE_ENV_HOT_REPLICATE "IE_HOT_REPLICATE"         /* 1: copy hot tensors node-local */
#define HERITAGE_ENV_HOT_REPL_LIMIT_MB "IE_HOT_REPL_LIMIT_MB" /* cap of those bytes; 0 = none */
#define HERITAGE_ENV_HOT_REPL_LIMIT_MAX (UINT64_C(1) << 24)
#define HERITAGE_ENV_DROPPED(X) X("NOTIFY_SOCKET") X("WATCHDOG_USEC") X("WATCHDOG_PID")

struct heritage_env {
    bool hot_replicate;
    uint64_t hot_repl_limit_mb;
};

/* Room heritage_env_build needs for the variables it writes. */
struct heritage_env_store {
    char own[2][64];
};

/*
 * The supervisor's side: `environ` minus HERITAGE_ENV_DROPPED and the two owned variables,
 * plus those set from `e` (their text in `store`, which must outlive the result). A calloc'd,
 * NULL-terminated vector of pointers into `environ` and `store` (free() it), or NULL when out
 * of memory (logged).
 */
char **heritage_env_build(char *const *environ_in, const struct heritage_env *e,
                          struct heritage_env_store *store);

/* The worker's side: reads the two variables with getenv. 0, or ERR_USAGE (logged) for a
 * limit that is not an integer in 0..HERITAGE_ENV_HOT_REPL_LIMIT_MAX. */
int heritage_env_parse(struct heritage_env *out);

/* ---- the control socket (worker → supervisor), a private sd_notify ----
 * Each datagram is "KEY=VALUE" lines, at most HERITAGE_CTL_MSG_MAX bytes, no NUL.
 * X(ID, kind, "value", "help"): the key is #ID; kind FLAG (value "1"), COUNT (a decimal uint64)
 * or TEXT (printable ASCII, < HERITAGE_CTL_STATUS_MAX bytes); "value" names what the value must
 * be, for the parser's messages. A key appears at most once per datagram.
 */
#define HERITAGE_CTL_MSG_MAX 512    /* longer datagrams are refused (MSG_TRUNC) */
#define HERITAGE_CTL_STATUS_MAX 128 /* STATUS text, NUL included */

#define HERITAGE_CTL_KEYS(X)                                                                       \
    X(READY, FLAG, "1", "the model and adapters are loaded: route requests here")                \
    X(WATCHDOG, FLAG, "1", "the worker's loop is alive (about once a second)")                   \
    X(HOT_BYTES, COUNT, "a decimal byte count",                                                  \
      "bytes of hot tensors replicated into node-local memory")                                  \
    X(HOT_TENSORS, COUNT, "a decimal tensor count", "how many tensors those are")                \
    X(STATUS, TEXT, "printable ASCII", "free text for the log (at most 127 bytes)")

enum heritage_ctl_key {
#define HERITAGE_CTL_ENUM(id, kind, value, help) HERITAGE_CTL_##id,
    HERITAGE_CTL_KEYS(HERITAGE_CTL_ENUM)
#undef HERITAGE_CTL_ENUM
    HERITAGE_CTL_NKEYS
};
enum heritage_ctl_kind { HERITAGE_CTL_FLAG, HERITAGE_CTL_COUNT, HERITAGE_CTL_TEXT };

struct heritage_ctl_key_info {
    const char *name;            /* "READY" */
    size_t len;
    enum heritage_ctl_kind kind;
    const char *value;           /* "a decimal byte count" */
    const char *help;
};
/* [HERITAGE_CTL_NKEYS], in enum order. */
extern const struct heritage_ctl_key_info heritage_ctl_keys[];

/* One datagram's content; a key is present when its `has` bit is set. */
struct heritage_ctl_msg {
    bool ready;
    bool watchdog;
    bool has_hot_bytes;
    uint64_t hot_bytes;
    bool has_hot_tensors;
    uint64_t hot_tensors;
    char status[HERITAGE_CTL_STATUS_MAX]; /* "" when absent */
};

/* The key named by s[0..n), or -1. */
int heritage_ctl_key_find(const char *s, size_t n);

/*
 * The worker's side: formats `m` as one datagram into buf[cap] (cap >= HERITAGE_CTL_MSG_MAX+1
 * always suffices): the present keys in table order, STATUS last when non-empty. A status
 * character outside printable ASCII becomes '?', so any model path can be announced. Returns
 * the length (no NUL counted).
 */
size_t heritage_ctl_format(const struct heritage_ctl_msg *m, char *buf, size_t cap);

#endif
