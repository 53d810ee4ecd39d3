/*
 * heritage.c — the worker's inheritance, both ways (heritage.h): argv and environment built
 * by the supervisor and parsed by the worker from the same tables, and the control datagram
 * formatter the worker sends with.
 */
#include "heritage.h"

#include "err.h"
#include "log.h"

#include <assert.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- the command line ---- */

enum opt_kind { K_NUM, K_STR, K_LIST };
enum opt_emit { E_REQUIRED, E_ALWAYS, E_IF_SET };

/* One option of the table, with where its field lives in struct heritage_args. */
struct opt {
    const char *name;
    enum opt_kind kind;
    const char *arg;
    int64_t dflt_num;       /* K_NUM */
    const char *dflt_str;   /* K_STR */
    int64_t max;            /* K_NUM */
    enum opt_emit emit;
    const char *help;
    size_t off;             /* K_NUM: int64_t; K_STR: const char *; K_LIST: size_t n_ */
};

#define DFLT_NUM_NUM(d) (d)
#define DFLT_NUM_STR(d) 0
#define DFLT_NUM_LIST(d) 0
#define DFLT_STR_NUM(d) NULL
#define DFLT_STR_STR(d) (d)
#define DFLT_STR_LIST(d) NULL
#define OFF_NUM(f) offsetof(struct heritage_args, f)
#define OFF_STR(f) offsetof(struct heritage_args, f)
#define OFF_LIST(f) offsetof(struct heritage_args, n_##f)
#define OPT_ROW(field_, name_, kind_, arg_, dflt_, max_, emit_, help_)                           \
    {.name = name_, .kind = K_##kind_, .arg = arg_, .dflt_num = DFLT_NUM_##kind_(dflt_),          \
     .dflt_str = DFLT_STR_##kind_(dflt_), .max = (int64_t)(max_), .emit = E_##emit_,              \
     .help = help_, .off = OFF_##kind_(field_)},
static const struct opt opts[] = {HERITAGE_OPTIONS(OPT_ROW)};
#define N_OPTS (sizeof opts / sizeof opts[0])

static int64_t *num_at(struct heritage_args *a, const struct opt *o)
{
    return (int64_t *)(void *)((char *)a + o->off);
}
static const char **str_at(struct heritage_args *a, const struct opt *o)
{
    return (const char **)(void *)((char *)a + o->off);
}
static int64_t num_of(const struct heritage_args *a, const struct opt *o)
{
    return *(const int64_t *)(const void *)((const char *)a + o->off);
}
static const char *str_of(const struct heritage_args *a, const struct opt *o)
{
    return *(const char *const *)(const void *)((const char *)a + o->off);
}

void heritage_args_init(struct heritage_args *a)
{
    memset(a, 0, sizeof *a);
    for (size_t i = 0; i < N_OPTS; i++) {
        if (opts[i].kind == K_NUM)
            *num_at(a, &opts[i]) = opts[i].dflt_num;
        else if (opts[i].kind == K_STR)
            *str_at(a, &opts[i]) = opts[i].dflt_str;
    }
}

/* Whether the builder passes option o with the value in a. */
static bool emitted(const struct heritage_args *a, const struct opt *o)
{
    if (o->emit != E_IF_SET)
        return true;
    if (o->kind == K_NUM)
        return num_of(a, o) != o->dflt_num;
    if (o->kind == K_STR) {
        const char *v = str_of(a, o);
        return v && (!o->dflt_str || strcmp(v, o->dflt_str) != 0);
    }
    return a->n_adapters > 0;
}

/* One argv string as the concatenation of up to three pieces ("--" "adapter", NAME "=" DIR). */
struct arg3 {
    const char *p[3];
};

char **heritage_argv_build(const char *binary, const struct heritage_args *a)
{
    enum { MAX_ARGS = 1 + 2 * N_OPTS + 2 * HERITAGE_MAX_ADAPTERS };
    struct arg3 args[MAX_ARGS];
    char num[N_OPTS][24];
    size_t n = 0;
    args[n++] = (struct arg3){{binary, "", ""}};
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        if (!emitted(a, o))
            continue;
        if (o->kind == K_LIST) {
            for (size_t k = 0; k < a->n_adapters && k < HERITAGE_MAX_ADAPTERS; k++) {
                args[n++] = (struct arg3){{"--", o->name, ""}};
                args[n++] = (struct arg3){{a->adapters_name[k], "=", a->adapters_dir[k]}};
            }
            continue;
        }
        args[n++] = (struct arg3){{"--", o->name, ""}};
        if (o->kind == K_NUM) {
            snprintf(num[i], sizeof num[i], "%" PRId64, num_of(a, o));
            args[n++] = (struct arg3){{num[i], "", ""}};
        } else {
            const char *v = str_of(a, o);
            args[n++] = (struct arg3){{v ? v : "", "", ""}};
        }
    }
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += strlen(args[i].p[0]) + strlen(args[i].p[1]) + strlen(args[i].p[2]) + 1;
    char **v = malloc((n + 1) * sizeof *v + bytes);
    if (!v) {
        LOG_ERR("worker command line: out of memory (%zu bytes)", (n + 1) * sizeof *v + bytes);
        return NULL;
    }
    char *at = (char *)(v + n + 1);
    for (size_t i = 0; i < n; i++) {
        v[i] = at;
        for (int k = 0; k < 3; k++) {
            size_t l = strlen(args[i].p[k]);
            memcpy(at, args[i].p[k], l);
            at += l;
        }
        *at++ = '\0';
    }
    v[n] = NULL;
    return v;
}

static int parse_num(const struct opt *o, const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v > (unsigned long long)o->max) {
        LOG_ERR("--%s: want an integer in 0..%" PRId64 ", got \"%s\"", o->name, o->max, s);
        return ERR_USAGE;
    }
    *out = (int64_t)v;
    return 0;
}

int heritage_args_parse(int argc, char **argv, struct heritage_args *a)
{
    struct option lo[N_OPTS + 2];
    for (size_t i = 0; i < N_OPTS; i++)
        lo[i] = (struct option){opts[i].name, required_argument, NULL, 256 + (int)i};
    lo[N_OPTS] = (struct option){"help", no_argument, NULL, 'h'};
    lo[N_OPTS + 1] = (struct option){NULL, 0, NULL, 0};
    heritage_args_init(a);
    bool given[N_OPTS] = {false};
    optind = 0; /* glibc: a full re-initialisation, so the parser can run more than once */
    int ch, rc = 0;
    while (rc == 0 && (ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        if (ch == 'h')
            return HERITAGE_HELP;
        if (ch < 256 || ch >= 256 + (int)N_OPTS) {
            heritage_usage(stderr);
            return ERR_USAGE;
        }
        const struct opt *o = &opts[ch - 256];
        given[ch - 256] = true;
        if (o->kind == K_NUM) {
            rc = parse_num(o, optarg, num_at(a, o));
        } else if (o->kind == K_STR) {
            *str_at(a, o) = optarg;
        } else {
            char *eq = strchr(optarg, '=');
            if (!eq || eq == optarg || !eq[1]) {
                LOG_ERR("--%s: want NAME=DIR, got \"%s\"", o->name, optarg);
                rc = ERR_USAGE;
            } else if (a->n_adapters == HERITAGE_MAX_ADAPTERS) {
                LOG_ERR("--%s: more than %d adapters", o->name, HERITAGE_MAX_ADAPTERS);
                rc = ERR_USAGE;
            } else {
                *eq = '\0';
                a->adapters_name[a->n_adapters] = optarg;
                a->adapters_dir[a->n_adapters++] = eq + 1;
            }
        }
    }
    if (rc == 0 && optind < argc) {
        LOG_ERR("unexpected argument \"%s\"", argv[optind]);
        rc = ERR_USAGE;
    }
    for (size_t i = 0; rc == 0 && i < N_OPTS; i++)
        if (opts[i].emit == E_REQUIRED && !given[i]) {
            char list[256] = "";
            size_t at = 0;
            for (size_t k = 0; k < N_OPTS; k++)
                if (opts[k].emit == E_REQUIRED && at < sizeof list)
                    at += (size_t)snprintf(list + at, sizeof list - at, "%s--%s",
                                           at ? ", " : "", opts[k].name);
            LOG_ERR("%s are required (--%s is missing)", list, opts[i].name);
            rc = ERR_USAGE;
        }
    return rc;
}

void heritage_usage(FILE *f)
{
    fprintf(f, "usage: clocher-worker [options]\n\n"
               "A clocherd worker: started by clocherd, not by hand (docs/DAEMON.md).\n\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        char lhs[64];
        snprintf(lhs, sizeof lhs, "--%s %s", o->name, o->arg);
        fprintf(f, "  %-30s %s", lhs, o->help);
        if (o->emit == E_REQUIRED)
            fprintf(f, " (required)");
        else if (o->kind == K_NUM && o->dflt_num >= 0)
            fprintf(f, " (default %" PRId64 ")", o->dflt_num);
        else if (o->kind == K_STR && o->dflt_str)
            fprintf(f, " (default %s)", o->dflt_str);
        else if (o->kind == K_LIST)
            fprintf(f, " (repeatable)");
        fputc('\n', f);
    }
    fprintf(f, "  %-30s %s\n\n", "-h, --help", "this text");
    fprintf(f, "Environment: %s=1 copies hot tensors to node-local memory,\n"
               "%s caps how much (MiB, 0 = no limit).\n",
            HERITAGE_ENV_HOT_REPLICATE, HERITAGE_ENV_HOT_REPL_LIMIT_MB);
}

/* ---- the environment ---- */

/* Whether `var` ("NAME=value") sets the variable `name`. */
static bool sets(const char *var, const char *name)
{
    size_t n = strlen(name);
    return strncmp(var, name, n) == 0 && var[n] == '=';
}

char **heritage_env_build(char *const *environ_in, const struct heritage_env *e,
                          struct heritage_env_store *store)
{
    static const char *const drop[] = {
#define HERITAGE_DROP_ROW(name) name,
        HERITAGE_ENV_DROPPED(HERITAGE_DROP_ROW)
#undef HERITAGE_DROP_ROW
        HERITAGE_ENV_HOT_REPLICATE, HERITAGE_ENV_HOT_REPL_LIMIT_MB, NULL};
    size_t n = 0;
    while (environ_in[n])
        n++;
    char **env = calloc(n + 3, sizeof *env);
    if (!env) {
        LOG_ERR("worker environment: out of memory");
        return NULL;
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        bool skip = false;
        for (const char *const *d = drop; *d; d++)
            skip = skip || sets(environ_in[i], *d);
        if (!skip)
            env[o++] = environ_in[i];
    }
    snprintf(store->own[0], sizeof store->own[0], "%s=%d", HERITAGE_ENV_HOT_REPLICATE,
             e->hot_replicate ? 1 : 0);
    snprintf(store->own[1], sizeof store->own[1], "%s=%" PRIu64, HERITAGE_ENV_HOT_REPL_LIMIT_MB,
             e->hot_repl_limit_mb);
    env[o++] = store->own[0];
    env[o++] = store->own[1];
    env[o] = NULL;
    return env;
}

int heritage_env_parse(struct heritage_env *out)
{
    const char *hot = getenv(HERITAGE_ENV_HOT_REPLICATE);
    const char *lim = getenv(HERITAGE_ENV_HOT_REPL_LIMIT_MB);
    out->hot_replicate = hot && strcmp(hot, "1") == 0;
    out->hot_repl_limit_mb = 0;
    if (lim && *lim) {
        const struct opt o = {.name = HERITAGE_ENV_HOT_REPL_LIMIT_MB,
                              .max = (int64_t)HERITAGE_ENV_HOT_REPL_LIMIT_MAX};
        int64_t v;
        int rc = parse_num(&o, lim, &v);
        if (rc < 0)
            return rc;
        out->hot_repl_limit_mb = (uint64_t)v;
    }
    return 0;
}

/* ---- the control socket ---- */

const struct heritage_ctl_key_info heritage_ctl_keys[] = {
#define HERITAGE_CTL_ROW(id, kind, value, help)                                               \
    {#id, sizeof #id - 1, HERITAGE_CTL_##kind, value, help},
    HERITAGE_CTL_KEYS(HERITAGE_CTL_ROW)
#undef HERITAGE_CTL_ROW
};
static_assert(sizeof heritage_ctl_keys / sizeof heritage_ctl_keys[0] == HERITAGE_CTL_NKEYS,
              "one row per key");

int heritage_ctl_key_find(const char *s, size_t n)
{
    for (int k = 0; k < HERITAGE_CTL_NKEYS; k++)
        if (heritage_ctl_keys[k].len == n && memcmp(heritage_ctl_keys[k].name, s, n) == 0)
            return k;
    return -1;
}

static size_t appendf(char *buf, size_t cap, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static size_t appendf(char *buf, size_t cap, size_t at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + at, cap - at, fmt, ap);
    va_end(ap);
    return w < 0 ? at : (size_t)w >= cap - at ? cap - 1 : at + (size_t)w;
}

size_t heritage_ctl_format(const struct heritage_ctl_msg *m, char *buf, size_t cap)
{
    size_t at = 0;
    if (cap == 0)
        return 0;
    buf[0] = '\0';
/* an expression (so `APPEND(...), sep = "\n"` reads as one step); clamps at the buffer's end */
#define APPEND(...) (at = appendf(buf, cap, at, __VA_ARGS__))
    const char *sep = "";
    for (int k = 0; k < HERITAGE_CTL_NKEYS; k++) {
        const char *key = heritage_ctl_keys[k].name;
        switch ((enum heritage_ctl_key)k) {
        case HERITAGE_CTL_READY:
            if (m->ready)
                APPEND("%s%s=1", sep, key), sep = "\n";
            break;
        case HERITAGE_CTL_WATCHDOG:
            if (m->watchdog)
                APPEND("%s%s=1", sep, key), sep = "\n";
            break;
        case HERITAGE_CTL_HOT_BYTES:
            if (m->has_hot_bytes)
                APPEND("%s%s=%" PRIu64, sep, key, m->hot_bytes), sep = "\n";
            break;
        case HERITAGE_CTL_HOT_TENSORS:
            if (m->has_hot_tensors)
                APPEND("%s%s=%" PRIu64, sep, key, m->hot_tensors), sep = "\n";
            break;
        case HERITAGE_CTL_STATUS: {
            size_t sn = strnlen(m->status, sizeof m->status - 1);
            if (!sn)
                break;
            APPEND("%s%s=", sep, key);
            for (size_t i = 0; i < sn && at + 1 < cap; i++) {
                unsigned char c = (unsigned char)m->status[i];
                buf[at++] = c < 0x20 || c >= 0x7f ? '?' : (char)c;
            }
            buf[at] = '\0';
            sep = "\n";
            break;
        }
        case HERITAGE_CTL_NKEYS: break;
        }
    }
#undef APPEND
    return at;
}
