/*
 * topo.c — NUMA topology discovery (libnuma or a fake sysfs tree) and worker placement
 * (see topo.h).
 */
#include "topo.h"

#include "err.h"
#include "log.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <numa.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- CPU lists ---- */

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int parse_num(const char *what, const char **p, long *out)
{
    const char *s = *p;
    if (!isdigit((unsigned char)*s)) {
        LOG_ERR("%s: malformed CPU list: expected a number at \"%.16s\"", what, s);
        return ERR_FORMAT;
    }
    long v = 0;
    while (isdigit((unsigned char)*s)) {
        v = v * 10 + (*s - '0');
        if (v >= TOPO_MAX_CPUS) {
            LOG_ERR("%s: CPU id beyond %d in the CPU list", what, TOPO_MAX_CPUS - 1);
            return ERR_RANGE;
        }
        s++;
    }
    *p = s;
    *out = v;
    return 0;
}

int topo_cpulist_parse(const char *what, const char *s, int **cpus, size_t *n)
{
    *cpus = NULL;
    *n = 0;
    /* a bitmap first: duplicates and ranges in any order collapse, and the count is bounded */
    uint8_t *seen = calloc(TOPO_MAX_CPUS, 1);
    if (!seen)
        return -ENOMEM;
    int rc = 0;
    size_t count = 0;
    const char *p = s;
    while (*p && *p != '\n') {
        long a, b;
        if ((rc = parse_num(what, &p, &a)) < 0)
            goto out;
        b = a;
        if (*p == '-') {
            p++;
            if ((rc = parse_num(what, &p, &b)) < 0)
                goto out;
            if (b < a) {
                LOG_ERR("%s: malformed CPU list: range %ld-%ld is reversed", what, a, b);
                rc = ERR_FORMAT;
                goto out;
            }
        }
        for (long c = a; c <= b; c++)
            if (!seen[c]) {
                seen[c] = 1;
                count++;
            }
        if (*p == ',') {
            p++;
            if (!*p || *p == '\n') {
                LOG_ERR("%s: malformed CPU list: trailing comma", what);
                rc = ERR_FORMAT;
                goto out;
            }
        } else if (*p && *p != '\n') {
            LOG_ERR("%s: malformed CPU list: unexpected character 0x%02x", what,
                    (unsigned char)*p);
            rc = ERR_FORMAT;
            goto out;
        }
    }
    if (*p == '\n' && p[1] != '\0') {
        LOG_ERR("%s: malformed CPU list: text after the end of line", what);
        rc = ERR_FORMAT;
        goto out;
    }
    if (count) {
        *cpus = malloc(count * sizeof **cpus);
        if (!*cpus) {
            rc = -ENOMEM;
            goto out;
        }
        for (int c = 0; c < TOPO_MAX_CPUS; c++)
            if (seen[c])
                (*cpus)[(*n)++] = c;
    }
out:
    free(seen);
    return rc;
}

int topo_cpulist_format(const int *cpus, size_t n, char *buf, size_t cap)
{
    size_t o = 0;
    if (cap == 0)
        return ERR_RANGE;
    buf[0] = '\0';
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j + 1 < n && cpus[j + 1] == cpus[j] + 1)
            j++;
        int w = j == i ? snprintf(buf + o, cap - o, "%s%d", o ? "," : "", cpus[i])
                       : snprintf(buf + o, cap - o, "%s%d-%d", o ? "," : "", cpus[i], cpus[j]);
        if (w < 0 || (size_t)w >= cap - o)
            return ERR_RANGE;
        o += (size_t)w;
        i = j + 1;
    }
    return 0;
}

/* ---- discovery ---- */

static int add_node(struct topo *t, int id, int *cpus, size_t n)
{
    struct topo_node *nodes = realloc(t->nodes, (t->n_nodes + 1) * sizeof *nodes);
    if (!nodes) {
        free(cpus);
        return -ENOMEM;
    }
    t->nodes = nodes;
    t->nodes[t->n_nodes++] = (struct topo_node){.id = id, .n_cpus = n, .cpus = cpus};
    return 0;
}

static int read_small_file(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        int e = errno;
        LOG_ERR("topology: cannot read %s: %s", path, strerror(e));
        return -e;
    }
    size_t n = fread(buf, 1, cap - 1, f);
    int bad = ferror(f) || !feof(f);
    fclose(f);
    if (bad) {
        LOG_ERR("topology: %s: %s", path, n == cap - 1 ? "larger than expected" : "read error");
        return n == cap - 1 ? ERR_RANGE : -EIO;
    }
    buf[n] = '\0';
    return 0;
}

static int cmp_node(const void *a, const void *b)
{
    return cmp_int(&((const struct topo_node *)a)->id, &((const struct topo_node *)b)->id);
}

static int discover_sysfs(const char *root, struct topo *t)
{
    enum { BUF = 64 * 1024 };
    char *buf = malloc(BUF);
    char path[4096];
    int rc = 0;
    int *online = NULL;
    size_t n_online = 0;
    bool have_online = false;
    DIR *d = NULL;
    if (!buf)
        return -ENOMEM;

    /* "online" lists node ids in the same syntax as a cpulist; without it every nodeN counts */
    snprintf(path, sizeof path, "%s/online", root);
    FILE *f = fopen(path, "re");
    if (f) {
        fclose(f);
        if ((rc = read_small_file(path, buf, BUF)) < 0 ||
            (rc = topo_cpulist_parse(path, buf, &online, &n_online)) < 0)
            goto out;
        have_online = true;
    }

    d = opendir(root);
    if (!d) {
        rc = -errno;
        LOG_ERR("topology: cannot open %s: %s", root, strerror(-rc));
        goto out;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        if (strncmp(nm, "node", 4) != 0 || !nm[4] || strspn(nm + 4, "0123456789") != strlen(nm + 4))
            continue;
        if (strlen(nm + 4) > 4 || atoi(nm + 4) >= TOPO_MAX_NODES) {
            LOG_ERR("topology: %s/%s: node id beyond %d", root, nm, TOPO_MAX_NODES - 1);
            rc = ERR_RANGE;
            goto out;
        }
        int id = atoi(nm + 4);
        if (have_online && !bsearch(&id, online, n_online, sizeof *online, cmp_int))
            continue;
        snprintf(path, sizeof path, "%s/%s/cpulist", root, nm);
        int *cpus;
        size_t n;
        if ((rc = read_small_file(path, buf, BUF)) < 0 ||
            (rc = topo_cpulist_parse(path, buf, &cpus, &n)) < 0)
            goto out;
        if (n == 0) {
            LOG_INFO("topology: node %d has no CPU (memory only): no worker there", id);
            continue;
        }
        if ((rc = add_node(t, id, cpus, n)) < 0)
            goto out;
    }
    if (t->n_nodes > 1)
        qsort(t->nodes, t->n_nodes, sizeof *t->nodes, cmp_node);
    /* a CPU belongs to one node; a tree saying otherwise is not a machine */
    for (size_t i = 0; i < t->n_nodes; i++)
        for (size_t j = i + 1; j < t->n_nodes; j++)
            for (size_t a = 0; a < t->nodes[i].n_cpus; a++)
                if (bsearch(&t->nodes[i].cpus[a], t->nodes[j].cpus, t->nodes[j].n_cpus,
                            sizeof(int), cmp_int)) {
                    LOG_ERR("topology: %s: CPU %d is listed by node%d and node%d", root,
                            t->nodes[i].cpus[a], t->nodes[i].id, t->nodes[j].id);
                    rc = ERR_FORMAT;
                    goto out;
                }
    t->numa = true;
out:
    if (d)
        closedir(d);
    free(online);
    free(buf);
    return rc;
}

/* No NUMA to use (kernel without it, or the policy calls refused): one pseudo-node holding
 * the CPUs we may run on. */
static int one_pseudo_node(struct topo *t, const cpu_set_t *allowed)
{
    int *cpus = malloc(CPU_SETSIZE * sizeof *cpus);
    size_t n = 0;
    if (!cpus)
        return -ENOMEM;
    for (int c = 0; c < CPU_SETSIZE && c < TOPO_MAX_CPUS; c++)
        if (CPU_ISSET(c, allowed))
            cpus[n++] = c;
    t->numa = false;
    return add_node(t, 0, cpus, n);
}

static int discover_libnuma(struct topo *t)
{
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) < 0) {
        int e = errno;
        LOG_ERR("topology: sched_getaffinity: %s", strerror(e));
        return -e;
    }
    if (numa_available() < 0) /* no NUMA support in the kernel */
        return one_pseudo_node(t, &allowed);
    int rc = 0;
    struct bitmask *mask = numa_allocate_cpumask();
    struct bitmask *mems = numa_get_mems_allowed();
    if (!mask || !mems) {
        rc = -ENOMEM;
        goto out;
    }
    if (numa_bitmask_weight(mems) == 0) {
        /* get_mempolicy was refused (Docker's default seccomp profile refuses the memory
         * policy calls without CAP_SYS_NICE): no node's memory can be bound either, so the
         * workers share one pseudo-node rather than the daemon refusing to start */
        LOG_WARN("topology: the kernel refused the NUMA memory-policy calls (a container's "
                 "seccomp profile?): one worker group on every allowed CPU, memory not bound "
                 "(give the container CAP_SYS_NICE for per-node workers)");
        rc = one_pseudo_node(t, &allowed);
        goto out;
    }
    int max = numa_max_node();
    for (int node = 0; node <= max && node < TOPO_MAX_NODES; node++) {
        if (!numa_bitmask_isbitset(numa_nodes_ptr, (unsigned)node))
            continue;
        if (numa_node_to_cpus(node, mask) < 0) {
            int e = errno;
            LOG_ERR("topology: numa_node_to_cpus(%d): %s", node, strerror(e));
            rc = -e;
            goto out;
        }
        int *cpus = malloc(TOPO_MAX_CPUS * sizeof *cpus);
        size_t n = 0;
        if (!cpus) {
            rc = -ENOMEM;
            goto out;
        }
        for (int c = 0; c < TOPO_MAX_CPUS && (unsigned)c < mask->size; c++)
            if (numa_bitmask_isbitset(mask, (unsigned)c) && c < CPU_SETSIZE &&
                CPU_ISSET(c, &allowed))
                cpus[n++] = c;
        if (n == 0) {
            free(cpus);
            continue;
        }
        if (!numa_bitmask_isbitset(mems, (unsigned)node)) {
            /* our cpuset forbids this node's memory: a worker there could not bind locally */
            LOG_WARN("topology: node %d: its memory is not in this process's cpuset; its %zu "
                     "CPUs are not used",
                     node, n);
            free(cpus);
            continue;
        }
        if ((rc = add_node(t, node, cpus, n)) < 0)
            goto out;
    }
    t->numa = true;
out:
    if (mask)
        numa_free_cpumask(mask);
    if (mems)
        numa_free_nodemask(mems);
    return rc;
}

int topo_discover(const char *root, struct topo **out)
{
    *out = NULL;
    struct topo *t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    int rc = root ? discover_sysfs(root, t) : discover_libnuma(t);
    if (rc == 0 && t->n_nodes == 0) {
        LOG_ERR("topology: %s: no NUMA node with a usable CPU", root ? root : "this machine");
        rc = ERR_NOT_FOUND;
    }
    if (rc < 0) {
        topo_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

void topo_destroy(struct topo *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n_nodes; i++)
        free(t->nodes[i].cpus);
    free(t->nodes);
    free(t);
}

/* ---- placement ---- */

void topo_plan_destroy(struct topo_plan *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n; i++)
        free(p->shares[i].cpus);
    free(p->shares);
    free(p);
}

int topo_plan_create(const struct topo *t, unsigned n_workers, struct topo_plan **out)
{
    *out = NULL;
    size_t n = n_workers ? n_workers : t->n_nodes;
    size_t total = 0;
    for (size_t i = 0; i < t->n_nodes; i++)
        total += t->nodes[i].n_cpus;
    if (n > total) {
        LOG_ERR("topology: %zu workers asked for, but only %zu CPUs are usable: a worker needs "
                "at least one CPU of its own",
                n, total);
        return ERR_RANGE;
    }
    int rc = 0;
    struct topo_plan *p = calloc(1, sizeof *p);
    size_t *per_node = calloc(t->n_nodes, sizeof *per_node);
    if (!p || !per_node || !(p->shares = calloc(n, sizeof *p->shares))) {
        rc = -ENOMEM;
        goto fail;
    }
    /* how many workers each node gets: the node with the most CPUs per worker so far takes the
     * next one (compare cpus_a/(w_a+1) > cpus_b/(w_b+1) without division) */
    for (size_t k = 0; k < n; k++) {
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < t->n_nodes; i++) {
            if (per_node[i] >= t->nodes[i].n_cpus)
                continue;
            if (best == SIZE_MAX ||
                t->nodes[i].n_cpus * (per_node[best] + 1) > t->nodes[best].n_cpus * (per_node[i] + 1))
                best = i;
        }
        /* n <= total guarantees a node with a free CPU */
        per_node[best]++;
    }
    /* split each node's CPUs into contiguous runs; the first (n_cpus % w) runs get one more */
    size_t s = 0;
    for (size_t i = 0; i < t->n_nodes; i++) {
        const struct topo_node *nd = &t->nodes[i];
        size_t w = per_node[i], at = 0;
        for (size_t k = 0; k < w; k++) {
            size_t len = nd->n_cpus / w + (k < nd->n_cpus % w ? 1 : 0);
            struct topo_share *sh = &p->shares[s++];
            sh->node = nd->id;
            sh->n_cpus = len;
            if (!(sh->cpus = malloc(len * sizeof *sh->cpus))) {
                p->n = s;
                rc = -ENOMEM;
                goto fail;
            }
            memcpy(sh->cpus, nd->cpus + at, len * sizeof *sh->cpus);
            at += len;
        }
    }
    p->n = s;
    free(per_node);
    *out = p;
    return 0;
fail:
    free(per_node);
    topo_plan_destroy(p);
    return rc;
}
