/*
 * topo.h — the machine's NUMA topology as clocherd sees it, and the plan that places workers
 * on it (one per NUMA node by default, or N workers sharing the CPUs).
 *
 * Discovery goes through libnuma on the real machine, restricted to the CPUs this process may
 * run on (systemd's CPUAffinity=, a container's cpuset). For tests and for planning a machine
 * you are not on, a directory shaped like /sys/devices/system/node (nodeN/cpulist files, an
 * optional "online" file) can be read instead: clocherd --topology-root DIR or the environment
 * variable CLOCHER_TOPOLOGY_ROOT. Nodes without CPUs (memory-only, CXL) are skipped.
 *
 * NOTES: plain data, owned by the supervisor; immutable once built.
 */
#ifndef CLOCHER_DAEMON_TOPO_H
#define CLOCHER_DAEMON_TOPO_H

#include <stdbool.h>
#include <stddef.h>

#define TOPO_MAX_CPUS 4096  /* CPU ids are < this */
#define TOPO_MAX_NODES 1024 /* node ids are < this */
#define TOPO_ENV_ROOT "CLOCHER_TOPOLOGY_ROOT"

struct topo_node {
    int id;
    size_t n_cpus;
    int *cpus; /* [n_cpus] ascending */
};

struct topo {
    bool numa;              /* false: libnuma unavailable, one pseudo-node 0 with every CPU */
    size_t n_nodes;
    struct topo_node *nodes; /* [n_nodes] ascending id, each with >= 1 CPU */
};

/*
 * Discovers the topology. root NULL: libnuma (the real machine); otherwise the fake sysfs tree
 * at root. 0 and *out, or a negative code, logged naming the file and what is wrong:
 * -errno (unreadable directory/file), ERR_FORMAT (a malformed cpulist), ERR_RANGE (ids beyond
 * the limits), ERR_NOT_FOUND (no node with a CPU).
 */
int topo_discover(const char *root, struct topo **out);
void topo_destroy(struct topo *t);

/*
 * Parses a Linux CPU list ("0-3,8,10-11", trailing newline allowed; "" = empty) into ascending,
 * duplicate-free ids < TOPO_MAX_CPUS. *cpus is malloc'd (NULL when empty). `what` names the
 * source in messages. 0, ERR_FORMAT or ERR_RANGE.
 */
int topo_cpulist_parse(const char *what, const char *s, int **cpus, size_t *n);
/* Formats ids (ascending) as a compact list ("0-3,8") into buf; truncation returns ERR_RANGE. */
int topo_cpulist_format(const int *cpus, size_t n, char *buf, size_t cap);

/* One worker's share of the machine. */
struct topo_share {
    int node;        /* the node whose memory it binds to (its CPUs' node) */
    size_t n_cpus;
    int *cpus;       /* [n_cpus] ascending, all on `node` */
};

struct topo_plan {
    size_t n;
    struct topo_share *shares; /* [n], ordered by node then CPU */
};

/*
 * Places n_workers workers (0 = one per node). With more workers than nodes, each worker goes
 * to the node with the most CPUs per worker placed so far (ties: the lowest id), and each node's
 * CPUs are split into contiguous, near-equal runs. With fewer workers than nodes, the nodes with
 * the most CPUs are used (ties: lowest id), one worker each — a worker never spans nodes, so its
 * memory stays local. ERR_RANGE (logged) when a node would get a worker without a CPU.
 */
int topo_plan_create(const struct topo *t, unsigned n_workers, struct topo_plan **out);
void topo_plan_destroy(struct topo_plan *p);

#endif
