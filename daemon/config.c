/*
 * config.c — parsing and validation of clocherd's JSON configuration (see config.h and
 * docs/DAEMON.md, "Configuration").
 *
 * The walker keeps the JSON path of the value being read ("tenants[1].api_keys[0]") in a
 * small stack so that every message names the exact field. Every object is checked against
 * its list of known keys before any of its values are read.
 */
#include "config.h"

#include "check.h"
#include "err.h"
#include "log.h"
#include "tlscheck.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define PATH_BUF 256

/* Defaults (docs/DAEMON.md lists them). */
#define DEF_LISTEN_TCP "127.0.0.1:50051"
#define DEF_METRICS "127.0.0.1:9464"

struct walk {
    const char *label;    /* file name for messages */
    const char *base_dir; /* for relative paths */
    char path[PATH_BUF];  /* JSON path of the current value */
    size_t path_len;
};

/* ---- messages ---- */

/* Quotes at most 48 bytes of untrusted text, escaping anything not printable ASCII. */
static const char *quote(const char *s, size_t n, char *buf, size_t cap)
{
    size_t o = 0;
    buf[o++] = '"';
    for (size_t i = 0; i < n && o + 6 < cap; i++) {
        if (i == 48) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\')
            buf[o++] = (char)ch;
        else
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
    }
    buf[o++] = '"';
    buf[o] = '\0';
    return buf;
}

static const char *json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

static int fail(struct walk *w, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct walk *w, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    LOG_ERR("%s: %s: %s", w->label, w->path_len ? w->path : "(top level)", msg);
    return code;
}

/* ---- the path stack ---- */

static size_t push_key(struct walk *w, const char *key)
{
    size_t saved = w->path_len;
    int n = snprintf(w->path + w->path_len, PATH_BUF - w->path_len, "%s%s",
                     w->path_len ? "." : "", key);
    if (n > 0)
        w->path_len = w->path_len + (size_t)n < PATH_BUF ? w->path_len + (size_t)n : PATH_BUF - 1;
    return saved;
}

static size_t push_index(struct walk *w, size_t i)
{
    size_t saved = w->path_len;
    int n = snprintf(w->path + w->path_len, PATH_BUF - w->path_len, "[%zu]", i);
    if (n > 0)
        w->path_len = w->path_len + (size_t)n < PATH_BUF ? w->path_len + (size_t)n : PATH_BUF - 1;
    return saved;
}

static void pop(struct walk *w, size_t saved)
{
    w->path_len = saved;
    w->path[saved] = '\0';
}

/* ---- typed getters; each reads obj[key] with the path pushed ---- */

/* Rejects keys of obj not in `allowed` (NULL-terminated), naming the first unknown one. */
static int check_keys(struct walk *w, json_t *obj, const char *const *allowed)
{
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        bool known = false;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(*a, key) == 0)
                known = true;
        if (!known) {
            char q[160], list[256];
            size_t o = 0;
            list[0] = '\0';
            for (const char *const *a = allowed; *a && o < sizeof list; a++)
                o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", a == allowed ? "" : ", ",
                                      *a);
            return fail(w, ERR_FORMAT, "unknown key %s (known keys: %s)",
                        quote(key, strlen(key), q, sizeof q), list);
        }
    }
    return 0;
}

static int get_object(struct walk *w, json_t *parent, const char *key, json_t **out)
{
    json_t *v = json_object_get(parent, key);
    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_object(v)) {
        size_t s = push_key(w, key);
        int rc = fail(w, ERR_FORMAT, "must be an object, got %s", json_type_name(v));
        pop(w, s);
        return rc;
    }
    *out = v;
    return 0;
}

static int get_uint(struct walk *w, json_t *obj, const char *key, uint64_t lo, uint64_t hi,
                    uint64_t def, uint64_t *out)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    *out = def;
    if (!v)
        return 0;
    size_t s = push_key(w, key);
    int rc = 0;
    if (!json_is_integer(v))
        rc = fail(w, ERR_FORMAT, "must be an integer in %llu..%llu, got %s",
                  (unsigned long long)lo, (unsigned long long)hi, json_type_name(v));
    else if (json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) < lo ||
             (uint64_t)json_integer_value(v) > hi)
        rc = fail(w, ERR_RANGE, "must be an integer in %llu..%llu, got %lld",
                  (unsigned long long)lo, (unsigned long long)hi,
                  (long long)json_integer_value(v));
    else
        *out = (uint64_t)json_integer_value(v);
    pop(w, s);
    return rc;
}

static int get_u32(struct walk *w, json_t *obj, const char *key, uint32_t lo, uint32_t hi,
                   uint32_t def, uint32_t *out)
{
    uint64_t v;
    int rc = get_uint(w, obj, key, lo, hi, def, &v);
    *out = (uint32_t)v;
    return rc;
}

/* A number in lo..hi of `unit` ("seconds", "gigabytes") at obj.key; def when absent. */
static int get_number(struct walk *w, json_t *obj, const char *key, double lo, double hi,
                      double def, const char *unit, double *out)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    *out = def;
    if (!v)
        return 0;
    size_t s = push_key(w, key);
    int rc = 0;
    if (!json_is_number(v))
        rc = fail(w, ERR_FORMAT, "must be a number of %s in %g..%g, got %s", unit, lo, hi,
                  json_type_name(v));
    else if (!(json_number_value(v) >= lo && json_number_value(v) <= hi))
        rc = fail(w, ERR_RANGE, "must be a number of %s in %g..%g, got %g", unit, lo, hi,
                  json_number_value(v));
    else
        *out = json_number_value(v);
    pop(w, s);
    return rc;
}

static int get_seconds(struct walk *w, json_t *obj, const char *key, double lo, double hi,
                       double def, double *out)
{
    return get_number(w, obj, key, lo, hi, def, "seconds", out);
}

static int get_bool(struct walk *w, json_t *obj, const char *key, bool def, bool *out)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    *out = def;
    if (!v)
        return 0;
    if (!json_is_boolean(v)) {
        size_t s = push_key(w, key);
        int rc = fail(w, ERR_FORMAT, "must be true or false, got %s", json_type_name(v));
        pop(w, s);
        return rc;
    }
    *out = json_is_true(v);
    return 0;
}

/* A string value: must be valid text without NUL (jansson guarantees UTF-8, not NUL-free). */
static int string_value(struct walk *w, json_t *v, size_t max_len, const char **out)
{
    if (!json_is_string(v))
        return fail(w, ERR_FORMAT, "must be a string, got %s", json_type_name(v));
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (strlen(s) != n)
        return fail(w, ERR_FORMAT, "contains a NUL character");
    if (n > max_len) {
        char q[160];
        return fail(w, ERR_RANGE, "is %zu bytes long, the limit is %zu: %s", n, max_len,
                    quote(s, n, q, sizeof q));
    }
    *out = s;
    return 0;
}

/* Optional string: absent or null leaves *out NULL; "" is refused unless allow_empty. */
static int get_string(struct walk *w, json_t *obj, const char *key, size_t max_len,
                      bool allow_empty, const char **out)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    size_t s = push_key(w, key);
    int rc = string_value(w, v, max_len, out);
    if (rc == 0 && !allow_empty && **out == '\0')
        rc = fail(w, ERR_FORMAT, "must not be empty");
    pop(w, s);
    return rc;
}

static int dup_str(const char *s, char **out)
{
    *out = NULL;
    if (!s)
        return 0;
    *out = strdup(s);
    if (!*out) {
        LOG_ERR("config: out of memory");
        return -ENOMEM;
    }
    return 0;
}

/* A path: relative ones are taken from the config file's directory. */
static int make_path(struct walk *w, const char *s, char **out)
{
    *out = NULL;
    if (!s)
        return 0;
    if (s[0] == '/')
        return dup_str(s, out);
    size_t n = strlen(w->base_dir) + 1 + strlen(s) + 1;
    if (n > PATH_MAX)
        return fail(w, ERR_RANGE, "path longer than %d bytes once joined to %s", PATH_MAX,
                    w->base_dir);
    *out = malloc(n);
    if (!*out)
        return -ENOMEM;
    snprintf(*out, n, "%s/%s", w->base_dir, s);
    return 0;
}

static int get_path(struct walk *w, json_t *obj, const char *key, char **out)
{
    const char *s;
    *out = NULL;
    int rc = get_string(w, obj, key, PATH_MAX - 1, false, &s);
    if (rc < 0 || !s)
        return rc;
    size_t sv = push_key(w, key);
    rc = make_path(w, s, out);
    pop(w, sv);
    return rc;
}

/* A file the daemon must be able to read at start (TLS material). */
static int check_readable(struct walk *w, const char *key, const char *path)
{
    if (!path)
        return 0;
    if (access(path, R_OK) == 0)
        return 0;
    int e = errno;
    size_t s = push_key(w, key);
    int rc = fail(w, -e, "cannot read %s: %s", path, strerror(e));
    pop(w, s);
    return rc;
}

/* ---- value formats ---- */

static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= CONFIG_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-' && s[i] != '.')
            return false;
    return true;
}

static int check_name(struct walk *w, const char *s)
{
    if (name_ok(s))
        return 0;
    char q[160];
    return fail(w, ERR_FORMAT, "must be 1..%d characters of A-Z a-z 0-9 _ - ., got %s",
                CONFIG_NAME_MAX - 1, quote(s, strlen(s), q, sizeof q));
}

/*
 * "host:port" with host an IPv4 literal, "[IPv6]" or a DNS name, port 1..65535. The gateway and
 * the metrics endpoint resolve it; this only rejects what cannot be an address.
 */
static int check_hostport(struct walk *w, const char *s)
{
    char q[160];
    const char *colon = strrchr(s, ':');
    const char *host_end = colon;
    if (!colon || colon == s)
        return fail(w, ERR_FORMAT, "must be host:port (e.g. 127.0.0.1:50051), got %s",
                    quote(s, strlen(s), q, sizeof q));
    if (s[0] == '[') {
        if (colon[-1] != ']' || colon - s < 3)
            return fail(w, ERR_FORMAT, "an IPv6 address must be written [addr]:port, got %s",
                        quote(s, strlen(s), q, sizeof q));
        for (const char *p = s + 1; p < colon - 1; p++)
            if (!isxdigit((unsigned char)*p) && *p != ':' && *p != '.')
                return fail(w, ERR_FORMAT, "bad IPv6 address in %s",
                            quote(s, strlen(s), q, sizeof q));
    } else {
        for (const char *p = s; p < host_end; p++)
            if (!isalnum((unsigned char)*p) && *p != '.' && *p != '-')
                return fail(w, ERR_FORMAT, "bad host name in %s (IPv6 needs [addr]:port)",
                            quote(s, strlen(s), q, sizeof q));
    }
    const char *port = colon + 1;
    size_t np = strlen(port);
    if (np == 0 || np > 5 || strspn(port, "0123456789") != np || atoi(port) < 1 ||
        atoi(port) > 65535)
        return fail(w, ERR_RANGE, "port must be 1..65535, got %s",
                    quote(port, np, q, sizeof q));
    return 0;
}

/* Whether a checked host:port names a loopback address (anonymous access is only allowed
 * when every TCP listener is local). */
static bool hostport_is_loopback(const char *s)
{
    return strncmp(s, "127.", 4) == 0 || strncmp(s, "localhost:", 10) == 0 ||
           strncmp(s, "[::1]:", 6) == 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int parse_key(struct walk *w, const char *s, struct config_key *k)
{
    static const char pfx[] = "sha256:";
    size_t n = strlen(s);
    if (strncmp(s, pfx, sizeof pfx - 1) == 0) {
        const char *h = s + sizeof pfx - 1;
        if (strlen(h) != 64)
            return fail(w, ERR_FORMAT, "a sha256: key needs exactly 64 hex digits, got %zu",
                        strlen(h));
        for (int i = 0; i < 32; i++) {
            int hi = hexval(h[2 * i]), lo = hexval(h[2 * i + 1]);
            if (hi < 0 || lo < 0)
                return fail(w, ERR_FORMAT, "a sha256: key needs 64 hex digits; character %d is "
                            "not one", hi < 0 ? 2 * i + 1 : 2 * i + 2);
            k->sha256[i] = (uint8_t)(hi << 4 | lo);
        }
        k->kind = CONFIG_KEY_SHA256;
        return 0;
    }
    if (n < 8 || n > 256)
        return fail(w, ERR_RANGE, "a plain key must be 8..256 characters, got %zu", n);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
            return fail(w, ERR_FORMAT, "a plain key must be printable ASCII without spaces; "
                        "character %zu is not", i + 1);
    k->kind = CONFIG_KEY_PLAIN;
    return dup_str(s, &k->plain);
}

static bool key_equal(const struct config_key *a, const struct config_key *b)
{
    if (a->kind != b->kind)
        return false;
    if (a->kind == CONFIG_KEY_SHA256)
        return memcmp(a->sha256, b->sha256, 32) == 0;
    return strcmp(a->plain, b->plain) == 0;
}

/* ---- sections ---- */

static int parse_listen(struct walk *w, json_t *root, struct config *c)
{
    static const char *const keys[] = {"tcp", "unix", NULL};
    json_t *o;
    const char *tcp = DEF_LISTEN_TCP, *unx = NULL;
    int rc = get_object(w, root, "listen", &o);
    if (rc < 0)
        return rc;
    size_t s = push_key(w, "listen");
    if (o) {
        if ((rc = check_keys(w, o, keys)) < 0)
            goto out;
        json_t *t = json_object_get(o, "tcp");
        if (t && json_is_null(t))
            tcp = NULL;
        else if (t && (rc = get_string(w, o, "tcp", 300, false, &tcp)) < 0)
            goto out;
        if ((rc = get_string(w, o, "unix", sizeof(((struct sockaddr_un *)0)->sun_path) - 1,
                             false, &unx)) < 0)
            goto out;
    }
    if (tcp) {
        size_t s2 = push_key(w, "tcp");
        rc = check_hostport(w, tcp);
        pop(w, s2);
        if (rc < 0)
            goto out;
    }
    if (!tcp && !unx) {
        rc = fail(w, ERR_FORMAT, "no listener left: set tcp, unix or both");
        goto out;
    }
    if ((rc = dup_str(tcp, &c->listen_tcp)) < 0)
        goto out;
    if (unx) {
        size_t s2 = push_key(w, "unix");
        rc = make_path(w, unx, &c->listen_unix);
        if (rc == 0 && strlen(c->listen_unix) >= sizeof(((struct sockaddr_un *)0)->sun_path))
            rc = fail(w, ERR_RANGE, "socket path %s is longer than %zu bytes", c->listen_unix,
                      sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
        pop(w, s2);
    }
out:
    pop(w, s);
    return rc;
}

/* The TLS files hold what gRPC will want (tlscheck.c): --check-config and a start refuse them
 * naming the file, instead of the listener failing later with a message about the port. */
static int check_tls_files(struct walk *w, const struct config *c)
{
    char why[600];
    const char *key = tlscheck_files(c->tls_cert, c->tls_key, c->tls_client_ca, why, sizeof why);
    if (!key)
        return 0;
    size_t s = push_key(w, key);
    int rc = fail(w, ERR_FORMAT, "%s", why);
    pop(w, s);
    return rc;
}

static int parse_tls(struct walk *w, json_t *root, struct config *c)
{
    static const char *const keys[] = {"cert", "key", "client_ca", NULL};
    json_t *o;
    int rc = get_object(w, root, "tls", &o);
    if (rc < 0 || !o)
        return rc;
    size_t s = push_key(w, "tls");
    if ((rc = check_keys(w, o, keys)) < 0 || (rc = get_path(w, o, "cert", &c->tls_cert)) < 0 ||
        (rc = get_path(w, o, "key", &c->tls_key)) < 0 ||
        (rc = get_path(w, o, "client_ca", &c->tls_client_ca)) < 0)
        goto out;
    if (!c->tls_cert != !c->tls_key) {
        rc = fail(w, ERR_FORMAT, "cert and key go together: %s is missing",
                  c->tls_cert ? "key" : "cert");
        goto out;
    }
    if (c->tls_client_ca && !c->tls_cert) {
        rc = fail(w, ERR_FORMAT, "client_ca needs cert and key");
        goto out;
    }
    if ((rc = check_readable(w, "cert", c->tls_cert)) < 0 ||
        (rc = check_readable(w, "key", c->tls_key)) < 0 ||
        (rc = check_readable(w, "client_ca", c->tls_client_ca)) < 0 ||
        (rc = check_tls_files(w, c)) < 0)
        goto out;
out:
    pop(w, s);
    if (rc == 0 && c->tls_cert && c->listen_unix) {
        /* gRPC 1.51 hands a socket of ours to a connection without TLS only: TLS on a Unix
         * socket would be gRPC's own listener, whose connections all share one peer name, so
         * the rapid-reset guard (gw_conn.c) could not close the one abusing it */
        s = push_key(w, "listen.unix");
        rc = fail(w, ERR_FORMAT, "TLS (tls.cert) is not served on a Unix socket (it could not be "
                  "guarded against HTTP/2 rapid reset): serve TLS on listen.tcp only "
                  "(listen.unix: null)");
        pop(w, s);
    }
    return rc;
}

static int parse_metrics(struct walk *w, json_t *root, struct config *c)
{
    static const char *const keys[] = {"listen", NULL};
    json_t *o;
    const char *l = DEF_METRICS;
    int rc = get_object(w, root, "metrics", &o);
    if (rc < 0)
        return rc;
    size_t s = push_key(w, "metrics");
    if (o) {
        if ((rc = check_keys(w, o, keys)) < 0)
            goto out;
        json_t *v = json_object_get(o, "listen");
        if (v && json_is_null(v))
            l = NULL;
        else if (v && (rc = get_string(w, o, "listen", 300, false, &l)) < 0)
            goto out;
    }
    if (l) {
        size_t s2 = push_key(w, "listen");
        rc = check_hostport(w, l);
        pop(w, s2);
        if (rc < 0)
            goto out;
    }
    rc = dup_str(l, &c->metrics_listen);
out:
    pop(w, s);
    return rc;
}

bool config_hostport_loopback(const char *s) { return hostport_is_loopback(s); }

/* "http": {"listen", "max_connections", "timeout_s", "max_body_bytes"} (daemon/http.h) */
static int parse_http(struct walk *w, json_t *root, struct config *c)
{
    static const char *const keys[] = {"listen", "max_connections", "timeout_s",
                                       "max_body_bytes", NULL};
    json_t *o;
    const char *l = NULL;
    c->http_max_connections = 256;
    c->http_timeout_s = 30;
    c->http_max_body_bytes = 1u << 20;
    int rc = get_object(w, root, "http", &o);
    if (rc < 0 || !o)
        return rc;
    size_t s = push_key(w, "http");
    if ((rc = check_keys(w, o, keys)) < 0)
        goto out;
    json_t *v = json_object_get(o, "listen");
    if (v && !json_is_null(v) && (rc = get_string(w, o, "listen", 300, false, &l)) < 0)
        goto out;
    if (l) {
        size_t s2 = push_key(w, "listen");
        rc = check_hostport(w, l);
        pop(w, s2);
        if (rc < 0)
            goto out;
    }
    if ((rc = get_u32(w, o, "max_connections", 1, 65536, 256, &c->http_max_connections)) < 0 ||
        (rc = get_u32(w, o, "timeout_s", 1, 3600, 30, &c->http_timeout_s)) < 0 ||
        (rc = get_u32(w, o, "max_body_bytes", 1024, 64u << 20, 1u << 20,
                      &c->http_max_body_bytes)) < 0)
        goto out;
    rc = dup_str(l, &c->http_listen);
out:
    pop(w, s);
    return rc;
}

static int parse_limits(struct walk *w, json_t *root, struct config *c)
{
    static const char *const keys[] = {"max_message_bytes", "max_prompt_tokens", "max_tokens",
                                       "max_streams_per_connection", "max_queue",
                                       "max_prompt_bytes", "max_early_resets", "max_connections",
                                       "max_calls", NULL};
    json_t *o;
    int rc = get_object(w, root, "limits", &o);
    if (rc < 0)
        return rc;
    size_t s = push_key(w, "limits");
    struct config_limits *l = &c->limits;
    if ((o && (rc = check_keys(w, o, keys)) < 0) ||
        (rc = get_u32(w, o, "max_message_bytes", 1024, 64u << 20, 4u << 20,
                      &l->max_message_bytes)) < 0 ||
        (rc = get_u32(w, o, "max_prompt_tokens", 1, 1u << 20, 4096, &l->max_prompt_tokens)) < 0 ||
        (rc = get_u32(w, o, "max_tokens", 1, 1u << 20, 2048, &l->max_tokens)) < 0 ||
        (rc = get_u32(w, o, "max_streams_per_connection", 1, 65536, 100,
                      &l->max_streams_per_connection)) < 0 ||
        (rc = get_u32(w, o, "max_queue", 1, 1u << 20, 256, &l->max_queue)) < 0 ||
        (rc = get_u32(w, o, "max_prompt_bytes", 1, 256u << 20, 1u << 20,
                      &l->max_prompt_bytes)) < 0 ||
        (rc = get_u32(w, o, "max_early_resets", 1, 1u << 20, 200, &l->max_early_resets)) < 0 ||
        (rc = get_u32(w, o, "max_connections", 1, 65536, 1024, &l->max_connections)) < 0 ||
        (rc = get_u32(w, o, "max_calls", 1, 1u << 20, 4096, &l->max_calls)) < 0)
        goto out;
out:
    pop(w, s);
    return rc;
}

static int parse_supervisor(struct walk *w, json_t *root, struct config *c)
{
    static const char *const keys[] = {"respawn_initial_ms", "respawn_max_ms", "crash_loop_max",
                                       "crash_loop_window_s", "stable_after_s", "stop_grace_s",
                                       "ready_timeout_s", "heartbeat_timeout_s", NULL};
    json_t *o;
    int rc = get_object(w, root, "supervisor", &o);
    if (rc < 0)
        return rc;
    size_t s = push_key(w, "supervisor");
    struct config_supervisor *p = &c->sup;
    if ((o && (rc = check_keys(w, o, keys)) < 0) ||
        (rc = get_u32(w, o, "respawn_initial_ms", 10, 60000, 100, &p->respawn_initial_ms)) < 0 ||
        (rc = get_u32(w, o, "respawn_max_ms", 10, 3600000, 10000, &p->respawn_max_ms)) < 0 ||
        (rc = get_u32(w, o, "crash_loop_max", 1, 1000, 5, &p->crash_loop_max)) < 0 ||
        (rc = get_u32(w, o, "crash_loop_window_s", 1, 86400, 60, &p->crash_loop_window_s)) < 0 ||
        (rc = get_u32(w, o, "stable_after_s", 1, 86400, 60, &p->stable_after_s)) < 0 ||
        (rc = get_u32(w, o, "stop_grace_s", 0, 3600, 10, &p->stop_grace_s)) < 0 ||
        (rc = get_u32(w, o, "ready_timeout_s", 1, 86400, 300, &p->ready_timeout_s)) < 0 ||
        (rc = get_u32(w, o, "heartbeat_timeout_s", 1, 3600, 30, &p->heartbeat_timeout_s)) < 0)
        goto out;
    if (p->respawn_max_ms < p->respawn_initial_ms) {
        size_t s2 = push_key(w, "respawn_max_ms");
        rc = fail(w, ERR_RANGE, "must be >= respawn_initial_ms (%u), got %u",
                  p->respawn_initial_ms, p->respawn_max_ms);
        pop(w, s2);
    }
out:
    pop(w, s);
    return rc;
}

static int parse_hot(struct walk *w, json_t *root, struct config *c)
{
    static const char *const keys[] = {"enabled", "limit_mb", NULL};
    json_t *o;
    int rc = get_object(w, root, "hot_replication", &o);
    if (rc < 0)
        return rc;
    size_t s = push_key(w, "hot_replication");
    if ((o && (rc = check_keys(w, o, keys)) < 0) ||
        (rc = get_bool(w, o, "enabled", false, &c->hot_replicate)) < 0 ||
        (rc = get_uint(w, o, "limit_mb", 0, 1u << 24, 0, &c->hot_repl_limit_mb)) < 0)
        goto out;
out:
    pop(w, s);
    return rc;
}

static int parse_adapters(struct walk *w, json_t *root, struct config *c)
{
    json_t *o;
    int rc = get_object(w, root, "adapters", &o);
    if (rc < 0 || !o)
        return rc;
    size_t s = push_key(w, "adapters");
    size_t n = json_object_size(o);
    c->adapters = calloc(n ? n : 1, sizeof *c->adapters);
    if (!c->adapters) {
        rc = -ENOMEM;
        goto out;
    }
    const char *name;
    json_t *v;
    json_object_foreach(o, name, v) {
        size_t s2 = push_key(w, name);
        const char *dir = NULL;
        if ((rc = check_name(w, name)) == 0 && (rc = string_value(w, v, PATH_MAX - 1, &dir)) == 0 &&
            !*dir)
            rc = fail(w, ERR_FORMAT, "must name the adapter's directory, got \"\"");
        struct config_adapter *a = &c->adapters[c->n_adapters];
        if (rc == 0 && (rc = dup_str(name, &a->name)) == 0) {
            c->n_adapters++;
            rc = make_path(w, dir, &a->dir);
        }
        pop(w, s2);
        if (rc < 0)
            goto out;
    }
out:
    pop(w, s);
    return rc;
}

static int parse_tenant(struct walk *w, json_t *o, struct config_tenant *t)
{
    static const char *const keys[] = {"name", "api_keys", "allowed_adapters",
                                       "max_concurrent_streams", "admin", "requests_per_s",
                                       "tokens_per_min", "max_prompt_bytes", "max_queued", NULL};
    const char *name;
    int rc;
    if (!json_is_object(o))
        return fail(w, ERR_FORMAT, "must be an object, got %s", json_type_name(o));
    if ((rc = check_keys(w, o, keys)) < 0 || (rc = get_string(w, o, "name", 256, true, &name)) < 0)
        return rc;
    if (!name) {
        size_t s = push_key(w, "name");
        rc = fail(w, ERR_FORMAT, "is required");
        pop(w, s);
        return rc;
    }
    size_t s = push_key(w, "name");
    rc = check_name(w, name);
    pop(w, s);
    if (rc < 0 || (rc = dup_str(name, &t->name)) < 0)
        return rc;

    json_t *ks = json_object_get(o, "api_keys");
    s = push_key(w, "api_keys");
    if (!ks)
        rc = fail(w, ERR_FORMAT, "is required (a list of at least one key)");
    else if (!json_is_array(ks))
        rc = fail(w, ERR_FORMAT, "must be an array of strings, got %s", json_type_name(ks));
    else if (json_array_size(ks) == 0)
        rc = fail(w, ERR_FORMAT, "must hold at least one key");
    else if (json_array_size(ks) > 1024)
        rc = fail(w, ERR_RANGE, "holds %zu keys, the limit is 1024", json_array_size(ks));
    if (rc == 0 && !(t->keys = calloc(json_array_size(ks), sizeof *t->keys)))
        rc = -ENOMEM;
    for (size_t i = 0; rc == 0 && i < json_array_size(ks); i++) {
        size_t s2 = push_index(w, i);
        const char *k;
        if ((rc = string_value(w, json_array_get(ks, i), 300, &k)) == 0 &&
            (rc = parse_key(w, k, &t->keys[i])) == 0)
            t->n_keys++;
        pop(w, s2);
    }
    pop(w, s);
    if (rc < 0)
        return rc;

    json_t *aa = json_object_get(o, "allowed_adapters");
    s = push_key(w, "allowed_adapters");
    if (!aa || (json_is_string(aa) && strcmp(json_string_value(aa), "*") == 0)) {
        /* absent = every adapter: a tenant is limited only when the file says so */
        t->all_adapters = true;
    } else if (json_is_array(aa)) {
        if (json_array_size(aa) > 4096)
            rc = fail(w, ERR_RANGE, "holds %zu names, the limit is 4096", json_array_size(aa));
        else if (!(t->allowed_adapters = calloc(json_array_size(aa) + 1, sizeof(char *))))
            rc = -ENOMEM;
        for (size_t i = 0; rc == 0 && i < json_array_size(aa); i++) {
            size_t s2 = push_index(w, i);
            const char *a;
            if ((rc = string_value(w, json_array_get(aa, i), 256, &a)) == 0 &&
                (rc = check_name(w, a)) == 0 &&
                (rc = dup_str(a, &t->allowed_adapters[t->n_allowed])) == 0)
                t->n_allowed++;
            pop(w, s2);
        }
    } else {
        rc = fail(w, ERR_FORMAT, "must be \"*\" or an array of adapter names, got %s",
                  json_is_string(aa) ? "another string" : json_type_name(aa));
    }
    pop(w, s);
    if (rc < 0)
        return rc;
    if ((rc = get_u32(w, o, "max_concurrent_streams", 0, 1u << 20, 0,
                      &t->max_concurrent_streams)) < 0 ||
        (rc = get_bool(w, o, "admin", false, &t->admin)) < 0 ||
        (rc = get_u32(w, o, "requests_per_s", 0, 1u << 20, 0, &t->requests_per_s)) < 0 ||
        (rc = get_u32(w, o, "tokens_per_min", 0, 1u << 30, 0, &t->tokens_per_min)) < 0 ||
        (rc = get_u32(w, o, "max_prompt_bytes", 0, 256u << 20, 0, &t->max_prompt_bytes)) < 0 ||
        (rc = get_u32(w, o, "max_queued", 0, 1u << 20, 0, &t->max_queued)) < 0)
        return rc;
    return 0;
}

static int parse_tenants(struct walk *w, json_t *root, struct config *c)
{
    json_t *a = json_object_get(root, "tenants");
    if (!a || json_is_null(a))
        return 0;
    size_t s = push_key(w, "tenants");
    int rc = 0;
    if (!json_is_array(a))
        rc = fail(w, ERR_FORMAT, "must be an array of objects, got %s", json_type_name(a));
    else if (json_array_size(a) > 4096)
        rc = fail(w, ERR_RANGE, "holds %zu tenants, the limit is 4096", json_array_size(a));
    else if (!(c->tenants = calloc(json_array_size(a) + 1, sizeof *c->tenants)))
        rc = -ENOMEM;
    for (size_t i = 0; rc == 0 && i < json_array_size(a); i++) {
        size_t s2 = push_index(w, i);
        struct config_tenant *t = &c->tenants[c->n_tenants++];
        rc = parse_tenant(w, json_array_get(a, i), t);
        /* names and keys are unique across tenants: a key must identify one tenant */
        for (size_t j = 0; rc == 0 && j < i; j++) {
            const struct config_tenant *u = &c->tenants[j];
            if (strcmp(u->name, t->name) == 0) {
                size_t s3 = push_key(w, "name");
                rc = fail(w, ERR_FORMAT, "duplicate tenant name \"%s\" (also tenants[%zu])",
                          t->name, j);
                pop(w, s3);
            }
            for (size_t x = 0; rc == 0 && x < t->n_keys; x++)
                for (size_t y = 0; rc == 0 && y < u->n_keys; y++)
                    if (key_equal(&t->keys[x], &u->keys[y])) {
                        size_t s3 = push_key(w, "api_keys");
                        size_t s4 = push_index(w, x);
                        rc = fail(w, ERR_FORMAT, "the same key is given to tenants[%zu] (\"%s\")",
                                  j, u->name);
                        pop(w, s4);
                        pop(w, s3);
                    }
        }
        for (size_t x = 0; rc == 0 && x < t->n_keys; x++)
            for (size_t y = 0; rc == 0 && y < x; y++)
                if (key_equal(&t->keys[x], &t->keys[y])) {
                    size_t s3 = push_key(w, "api_keys");
                    size_t s4 = push_index(w, x);
                    rc = fail(w, ERR_FORMAT, "duplicate of api_keys[%zu]", y);
                    pop(w, s4);
                    pop(w, s3);
                }
        pop(w, s2);
    }
    pop(w, s);
    return rc;
}

/* ---- lifecycle ---- */

static void free_config(struct config *c)
{
    if (!c)
        return;
    free(c->path);
    free(c->listen_tcp);
    free(c->listen_unix);
    free(c->tls_cert);
    free(c->tls_key);
    free(c->tls_client_ca);
    free(c->metrics_listen);
    free(c->http_listen);
    free(c->model_dir);
    free(c->access_log);
    free(c->worker_binary);
    free(c->convert_cache_dir);
    free(c->convert_dtype);
    free(c->convert_program);
    free(c->served_model_dir);
    free(c->kv_snapshot_dir);
    for (size_t i = 0; i < c->n_tenants; i++) {
        struct config_tenant *t = &c->tenants[i];
        free(t->name);
        for (size_t k = 0; k < t->n_keys; k++)
            free(t->keys[k].plain);
        free(t->keys);
        for (size_t k = 0; k < t->n_allowed; k++)
            free(t->allowed_adapters[k]);
        free(t->allowed_adapters);
    }
    free(c->tenants);
    for (size_t i = 0; i < c->n_adapters; i++) {
        free(c->adapters[i].name);
        free(c->adapters[i].dir);
    }
    free(c->adapters);
    c->magic = 0;
    free(c);
}

struct config *config_ref(struct config *c)
{
    CHECK(c && c->magic == CONFIG_MAGIC);
    atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
    return c;
}

void config_unref(struct config *c)
{
    if (!c)
        return;
    CHECK(c->magic == CONFIG_MAGIC);
    /* acq_rel: the thread that frees sees every other thread's last use of the snapshot */
    if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) == 1)
        free_config(c);
}

/* "lora_weights": how workers pack adapters for the update (docs/LORA.md) */
static int parse_lora_weights(struct walk *w, json_t *root, struct config *c)
{
    const char *s;
    int rc = get_string(w, root, "lora_weights", 16, false, &s);
    if (rc < 0 || !s)
        return rc;
    if (strcmp(s, "bf16") == 0 || strcmp(s, "auto") == 0) {
        c->lora_weights_bf16 = s[0] == 'b';
        return 0;
    }
    /* 8-bit adapter weights (session 10): a block of its own */
    if (strcmp(s, "int8") == 0) {
        c->lora_weights_int8 = true;
        return 0;
    }
    size_t k = push_key(w, "lora_weights");
    char q[64];
    rc = fail(w, ERR_FORMAT, "must be \"auto\" or \"bf16\" (or \"int8\"), got %s",
              quote(s, strlen(s), q, sizeof q));
    pop(w, k);
    return rc;
}

/* "kv_dtype": the KV cache element type, one of dtype_kv_name()'s names (docs/KV.md) */
static int parse_kv_dtype(struct walk *w, json_t *root, struct config *c)
{
    const char *s;
    c->kv_dtype = DT_BF16;
    int rc = get_string(w, root, "kv_dtype", 16, false, &s);
    if (rc < 0 || !s || dtype_kv_from_name(s, &c->kv_dtype) == 0)
        return rc;
    size_t k = push_key(w, "kv_dtype");
    char q[64];
    rc = fail(w, ERR_FORMAT, "must be one of f32, f16, bf16, int8, fp8, got %s",
              quote(s, strlen(s), q, sizeof q));
    pop(w, k);
    return rc;
}

/* "log_format": "text" or "json" (common/log.h); the daemon applies it at start (main.c) */
static int parse_log_format(struct walk *w, json_t *root, struct config *c)
{
    const char *s;
    c->log_format = -1;
    int rc = get_string(w, root, "log_format", 16, false, &s);
    if (rc < 0 || !s)
        return rc;
    enum log_format f;
    if (log_format_parse(s, &f) == 0) {
        c->log_format = (int)f;
        return 0;
    }
    size_t k = push_key(w, "log_format");
    char q[64];
    rc = fail(w, ERR_FORMAT, "must be \"text\" or \"json\", got %s",
              quote(s, strlen(s), q, sizeof q));
    pop(w, k);
    return rc;
}

/* "convert": {"enabled", "cache_dir", "dtype", "program", "cache_max_gb"}: a Hugging Face
 * folder or a GGUF
 * as model_dir, converted once into the cache (docs/DAEMON.md, "Models as downloaded") */
static int parse_convert(struct walk *w, json_t *root, struct config *c)
{
    static const char *const keys[] = {"enabled", "cache_dir", "dtype", "program",
                                       "cache_max_gb", NULL};
    json_t *o;
    int rc = get_object(w, root, "convert", &o);
    if (rc < 0 || !o)
        return rc;
    size_t s = push_key(w, "convert");
    bool enabled;
    const char *d = NULL;
    if ((rc = check_keys(w, o, keys)) < 0 || (rc = get_bool(w, o, "enabled", true, &enabled)) < 0 ||
        (rc = get_path(w, o, "cache_dir", &c->convert_cache_dir)) < 0 ||
        (rc = get_path(w, o, "program", &c->convert_program)) < 0 ||
        (rc = get_number(w, o, "cache_max_gb", 0, 1e6, 0, "gigabytes",
                         &c->convert_cache_max_gb)) < 0 ||
        (rc = get_string(w, o, "dtype", 16, false, &d)) < 0)
        goto out;
    c->convert_disabled = !enabled;
    if (d) {
        enum dtype t;
        size_t k = push_key(w, "dtype");
        char q[64];
        if (!config_convert_dtype_ok(d, &t))
            rc = fail(w, ERR_FORMAT, "must be a `clocher convert --dtype` (f32, f16, bf16, int8, "
                      "int4, q4_k, ...), got %s", quote(d, strlen(d), q, sizeof q));
        else
            rc = dup_str(d, &c->convert_dtype);
        pop(w, k);
    }
out:
    pop(w, s);
    return rc;
}

/* "threads_pin": the workers' --pin (worker/model/pool.h's modes) */
static int parse_threads_pin(struct walk *w, json_t *root, struct config *c)
{
    const char *s;
    snprintf(c->threads_pin, sizeof c->threads_pin, "compact");
    int rc = get_string(w, root, "threads_pin", 16, false, &s);
    if (rc < 0 || !s)
        return rc;
    if (!strcmp(s, "compact") || !strcmp(s, "scatter") || !strcmp(s, "none")) {
        snprintf(c->threads_pin, sizeof c->threads_pin, "%s", s);
        return 0;
    }
    size_t k = push_key(w, "threads_pin");
    char q[64];
    rc = fail(w, ERR_FORMAT, "must be \"compact\", \"scatter\" or \"none\", got %s",
              quote(s, strlen(s), q, sizeof q));
    pop(w, k);
    return rc;
}

/* "kv_snapshot": {"path": DIR (required, an existing directory), "max_mb": N} */
static int parse_kv_snapshot(struct walk *w, json_t *root, struct config *c)
{
    static const char *const keys[] = {"path", "max_mb", NULL};
    json_t *o;
    int rc = get_object(w, root, "kv_snapshot", &o);
    if (rc < 0 || !o)
        return rc;
    size_t s = push_key(w, "kv_snapshot");
    if ((rc = check_keys(w, o, keys)) < 0 ||
        (rc = get_path(w, o, "path", &c->kv_snapshot_dir)) < 0 ||
        (rc = get_uint(w, o, "max_mb", 0, 1u << 24, 0, &c->kv_snapshot_max_mb)) < 0)
        goto out;
    size_t k = push_key(w, "path");
    struct stat st;
    if (!c->kv_snapshot_dir)
        rc = fail(w, ERR_FORMAT, "is required (the directory the workers' snapshots go to)");
    else if (strlen(c->kv_snapshot_dir) > PATH_MAX - 32)
        rc = fail(w, ERR_RANGE, "is too long for the snapshot files in it");
    else if (stat(c->kv_snapshot_dir, &st) != 0) {
        int e = errno;
        rc = fail(w, -e, "%s: %s", c->kv_snapshot_dir, strerror(e));
    } else if (!S_ISDIR(st.st_mode))
        rc = fail(w, ERR_FORMAT, "%s is not a directory", c->kv_snapshot_dir);
    pop(w, k);
out:
    pop(w, s);
    return rc;
}

bool config_convert_dtype_ok(const char *name, enum dtype *out)
{
    if (!strcmp(name, "int8"))
        name = "q8_0";
    else if (!strcmp(name, "int4"))
        name = "q4_0";
    return dtype_from_name(name, out) == 0;
}

int config_parse(const char *label, const char *base_dir, const char *json, size_t len,
                 const char *model_dir_override, struct config **out)
{
    static const char *const keys[] = {
        "batch_invariant", /* the default of GenerateRequest.batch_invariant */
        "listen", "tls", "metrics", "model_dir", "worker_binary", "workers", "threads_per_worker",
        "kv_budget_mb", "limits", "drain_timeout_s", "tenants", "adapters", "hot_replication",
        "supervisor", "lora_weights", "http", "access_log", "log_format", "kv_dtype",
        "convert", "threads_pin", "kv_snapshot", NULL};
    struct walk w = {.label = label ? label : "config", .base_dir = base_dir ? base_dir : "/"};
    json_error_t jerr;
    int rc;
    *out = NULL;

    struct config *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->magic = CONFIG_MAGIC;
    atomic_init(&c->refs, 1);

    /* REJECT_DUPLICATES: "workers" given twice is a mistake, not "the last one wins" */
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        LOG_ERR("%s:%d:%d: invalid JSON: %s", w.label, jerr.line, jerr.column, jerr.text);
        rc = ERR_FORMAT;
        goto fail;
    }
    if (!json_is_object(root)) {
        rc = fail(&w, ERR_FORMAT, "must be a JSON object, got %s", json_type_name(root));
        goto fail;
    }
    /* "batch_invariant": requests that do not say run batch invariant (docs/DAEMON.md "Configuration");
     * the gateway reads it per request, so a reload applies it to the next ones */
    if ((rc = get_bool(&w, root, "batch_invariant", false, &c->batch_invariant)) < 0)
        goto fail;
    if ((rc = check_keys(&w, root, keys)) < 0 || (rc = parse_listen(&w, root, c)) < 0 ||
        (rc = parse_tls(&w, root, c)) < 0 || (rc = parse_metrics(&w, root, c)) < 0 ||
        (rc = parse_http(&w, root, c)) < 0 ||
        (rc = get_path(&w, root, "worker_binary", &c->worker_binary)) < 0 ||
        (rc = get_path(&w, root, "access_log", &c->access_log)) < 0 ||
        (rc = get_u32(&w, root, "workers", 0, CONFIG_MAX_WORKERS, 0, &c->workers)) < 0 ||
        (rc = get_u32(&w, root, "threads_per_worker", 0, 1024, 0, &c->threads_per_worker)) < 0 ||
        (rc = get_uint(&w, root, "kv_budget_mb", 0, 1u << 24, 0, &c->kv_budget_mb)) < 0 ||
        (rc = parse_limits(&w, root, c)) < 0 ||
        (rc = get_seconds(&w, root, "drain_timeout_s", 0, 86400, 30, &c->drain_timeout_s)) < 0 ||
        (rc = parse_supervisor(&w, root, c)) < 0 || (rc = parse_hot(&w, root, c)) < 0 ||
        (rc = parse_adapters(&w, root, c)) < 0 || (rc = parse_tenants(&w, root, c)) < 0 ||
        (rc = parse_lora_weights(&w, root, c)) < 0 || (rc = parse_log_format(&w, root, c)) < 0 ||
        (rc = parse_kv_dtype(&w, root, c)) < 0)
        goto fail;
    if ((rc = parse_convert(&w, root, c)) < 0 || (rc = parse_threads_pin(&w, root, c)) < 0 ||
        (rc = parse_kv_snapshot(&w, root, c)) < 0)
        goto fail;

    if (model_dir_override) {
        if ((rc = make_path(&w, model_dir_override, &c->model_dir)) < 0)
            goto fail;
    } else if ((rc = get_path(&w, root, "model_dir", &c->model_dir)) < 0) {
        goto fail;
    } else if (!c->model_dir) {
        size_t s = push_key(&w, "model_dir");
        rc = fail(&w, ERR_FORMAT, "is required (the IEBIN model directory; or clocherd "
                  "--model-dir)");
        pop(&w, s);
        goto fail;
    }

    for (size_t i = 0; i < c->n_tenants; i++)
        for (size_t k = 0; k < c->tenants[i].n_allowed; k++)
            if (!config_find_adapter(c, c->tenants[i].allowed_adapters[k]))
                LOG_WARN("%s: tenants[%zu].allowed_adapters[%zu]: \"%s\" is not in adapters; it "
                         "must be loaded at run time to be usable",
                         w.label, i, k, c->tenants[i].allowed_adapters[k]);

    /* Without tenants nobody is asked for a key: only acceptable on local listeners. */
    if (c->n_tenants == 0 && c->http_listen && !hostport_is_loopback(c->http_listen)) {
        size_t s = push_key(&w, "tenants");
        rc = fail(&w, ERR_FORMAT, "no tenants while http.listen (%s) is not a loopback address: "
                  "anonymous access is only allowed on local listeners", c->http_listen);
        pop(&w, s);
        goto fail;
    }
    if (c->n_tenants == 0 && c->listen_tcp && !hostport_is_loopback(c->listen_tcp)) {
        size_t s = push_key(&w, "tenants");
        rc = fail(&w, ERR_FORMAT, "no tenants while listen.tcp (%s) is not a loopback address: "
                  "anonymous access is only allowed on local listeners", c->listen_tcp);
        pop(&w, s);
        goto fail;
    }

    json_decref(root);
    *out = c;
    return 0;
fail:
    json_decref(root);
    free_config(c);
    return rc;
}

int config_load(const char *path, const char *model_dir_override, struct config **out)
{
    *out = NULL;
    char *abs = realpath(path, NULL);
    if (!abs) {
        int e = errno;
        LOG_ERR("config %s: %s", path, strerror(e));
        return -e;
    }
    int rc;
    char *buf = NULL, *dir = NULL;
    int fd = open(abs, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        rc = -errno;
        LOG_ERR("config %s: %s", abs, strerror(-rc));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        LOG_ERR("config %s: not a regular file", abs);
        rc = ERR_FORMAT;
        goto out;
    }
    if ((uint64_t)st.st_size > CONFIG_FILE_MAX) {
        LOG_ERR("config %s: %lld bytes, the limit is %u", abs, (long long)st.st_size,
                CONFIG_FILE_MAX);
        rc = ERR_RANGE;
        goto out;
    }
    size_t n = (size_t)st.st_size, got = 0;
    buf = malloc(n + 1);
    if (!buf) {
        rc = -ENOMEM;
        goto out;
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = r < 0 ? -errno : ERR_TRUNCATED;
            LOG_ERR("config %s: read failed: %s", abs, r < 0 ? strerror(-rc) : "file shrank");
            goto out;
        }
        got += (size_t)r;
    }
    dir = strdup(abs);
    if (!dir) {
        rc = -ENOMEM;
        goto out;
    }
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = '\0';
    else
        *slash = '\0';
    rc = config_parse(abs, dir, buf, n, model_dir_override, out);
    if (rc == 0) {
        (*out)->path = abs;
        abs = NULL;
    }
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    free(dir);
    free(abs);
    return rc;
}

/* ---- reload ---- */

static bool str_eq(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

static void keep_str(char **fresh, char *const *running, const char *field, int *n)
{
    if (str_eq(*fresh, *running))
        return;
    LOG_WARN("config reload: %s changed (\"%s\" -> \"%s\"); it takes effect at restart", field,
             *running ? *running : "", *fresh ? *fresh : "");
    free(*fresh);
    *fresh = *running ? strdup(*running) : NULL;
    CHECK(!*running || *fresh);
    (*n)++;
}

/* A restart-only field whose values have names: *fresh gets running back, the warning names
 * both values. */
static void keep_named(int *fresh, int running, const char *field, const char *fresh_name,
                       const char *running_name, int *n)
{
    if (*fresh == running)
        return;
    LOG_WARN("config reload: %s changed (\"%s\" -> \"%s\"); it takes effect at restart", field,
             running_name, fresh_name);
    *fresh = running;
    (*n)++;
}

static const char *log_format_name(int f)
{
    return f < 0 ? "(not set)" : f == LOG_FORMAT_JSON ? "json" : "text";
}

#define KEEP_NUM(field, name)                                                                 \
    do {                                                                                      \
        if (fresh->field != running->field) {                                                 \
            LOG_WARN("config reload: %s changed (%llu -> %llu); it takes effect at restart",  \
                     name, (unsigned long long)running->field,                               \
                     (unsigned long long)fresh->field);                                       \
            fresh->field = running->field;                                                    \
            n++;                                                                              \
        }                                                                                     \
    } while (0)

int config_keep_restart_fields(struct config *fresh, const struct config *running)
{
    int n = 0;
    keep_str(&fresh->listen_tcp, &running->listen_tcp, "listen.tcp", &n);
    keep_str(&fresh->listen_unix, &running->listen_unix, "listen.unix", &n);
    keep_str(&fresh->tls_cert, &running->tls_cert, "tls.cert", &n);
    keep_str(&fresh->tls_key, &running->tls_key, "tls.key", &n);
    keep_str(&fresh->tls_client_ca, &running->tls_client_ca, "tls.client_ca", &n);
    keep_str(&fresh->metrics_listen, &running->metrics_listen, "metrics.listen", &n);
    keep_str(&fresh->http_listen, &running->http_listen, "http.listen", &n);
    keep_str(&fresh->model_dir, &running->model_dir, "model_dir", &n);
    keep_str(&fresh->worker_binary, &running->worker_binary, "worker_binary", &n);
    KEEP_NUM(workers, "workers");
    KEEP_NUM(threads_per_worker, "threads_per_worker");
    KEEP_NUM(kv_budget_mb, "kv_budget_mb");
    KEEP_NUM(lora_weights_bf16, "lora_weights");
    KEEP_NUM(lora_weights_int8, "lora_weights");
    keep_named(&fresh->log_format, running->log_format, "log_format",
               log_format_name(fresh->log_format), log_format_name(running->log_format), &n);
    int kv = (int)fresh->kv_dtype;
    keep_named(&kv, (int)running->kv_dtype, "kv_dtype", dtype_kv_name(fresh->kv_dtype),
               dtype_kv_name(running->kv_dtype), &n);
    fresh->kv_dtype = (enum dtype)kv;
    KEEP_NUM(hot_replicate, "hot_replication.enabled");
    KEEP_NUM(hot_repl_limit_mb, "hot_replication.limit_mb");
    KEEP_NUM(limits.max_message_bytes, "limits.max_message_bytes");
    /* the conversion cache: what was converted at start is what is served */
    KEEP_NUM(convert_disabled, "convert.enabled");
    keep_str(&fresh->convert_cache_dir, &running->convert_cache_dir, "convert.cache_dir", &n);
    keep_str(&fresh->convert_dtype, &running->convert_dtype, "convert.dtype", &n);
    keep_str(&fresh->convert_program, &running->convert_program, "convert.program", &n);
    KEEP_NUM(convert_cache_max_gb, "convert.cache_max_gb");
    free(fresh->served_model_dir);
    fresh->served_model_dir = running->served_model_dir ? strdup(running->served_model_dir) : NULL;
    CHECK(!running->served_model_dir || fresh->served_model_dir);
    fresh->model_sampling = running->model_sampling;
    if (strcmp(fresh->threads_pin, running->threads_pin)) {
        LOG_WARN("config reload: threads_pin changed (\"%s\" -> \"%s\"); it takes effect at "
                 "restart", running->threads_pin, fresh->threads_pin);
        memcpy(fresh->threads_pin, running->threads_pin, sizeof fresh->threads_pin);
        n++;
    }
    keep_str(&fresh->kv_snapshot_dir, &running->kv_snapshot_dir, "kv_snapshot.path", &n);
    KEEP_NUM(kv_snapshot_max_mb, "kv_snapshot.max_mb");
    return n;
}

/* ---- lookups ---- */

const struct config_tenant *config_find_tenant(const struct config *c, const char *name)
{
    for (size_t i = 0; name && i < c->n_tenants; i++)
        if (strcmp(c->tenants[i].name, name) == 0)
            return &c->tenants[i];
    return NULL;
}

const struct config_adapter *config_find_adapter(const struct config *c, const char *name)
{
    for (size_t i = 0; name && i < c->n_adapters; i++)
        if (strcmp(c->adapters[i].name, name) == 0)
            return &c->adapters[i];
    return NULL;
}

bool config_tenant_allows(const struct config_tenant *t, const char *name)
{
    if (!name || t->all_adapters)
        return true;
    for (size_t i = 0; i < t->n_allowed; i++)
        if (strcmp(t->allowed_adapters[i], name) == 0)
            return true;
    return false;
}

/* ---- the shared snapshot ---- */

void config_ptr_init(struct config_ptr *p, struct config *c)
{
    CHECK(pthread_mutex_init(&p->mu, NULL) == 0);
    p->cur = c;
}

void config_ptr_fini(struct config_ptr *p)
{
    config_unref(p->cur);
    p->cur = NULL;
    pthread_mutex_destroy(&p->mu);
}

struct config *config_ptr_get(struct config_ptr *p)
{
    pthread_mutex_lock(&p->mu);
    struct config *c = config_ref(p->cur);
    pthread_mutex_unlock(&p->mu);
    return c;
}

void config_ptr_set(struct config_ptr *p, struct config *c)
{
    pthread_mutex_lock(&p->mu);
    struct config *old = p->cur;
    p->cur = c;
    pthread_mutex_unlock(&p->mu);
    config_unref(old); /* outside the lock: freeing may take a while */
}
