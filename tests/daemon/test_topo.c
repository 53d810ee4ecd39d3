/*
 * test_topo.c — NUMA topology from fake sysfs trees (shaped like /sys/devices/system/node),
 * CPU list parsing/formatting, worker placement, and discovery on this machine.
 */
#include "testutil.h"

#include "err.h"
#include "topo.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void write_node(const char *root, int id, const char *cpulist)
{
    char d[4096];
    snprintf(d, sizeof d, "%s/node%d", root, id);
    assert_int_equal(mkdir(d, 0755), 0);
    tu_write_file(tu_path(d, "cpulist"), cpulist, strlen(cpulist));
}

static void assert_cpus(const int *cpus, size_t n, const char *want)
{
    char buf[256];
    assert_int_equal(topo_cpulist_format(cpus, n, buf, sizeof buf), 0);
    assert_string_equal(buf, want);
}

static void test_cpulist_parse(void **state)
{
    (void)state;
    int *c;
    size_t n;
    assert_int_equal(topo_cpulist_parse("x", "0-3,8,10-11\n", &c, &n), 0);
    assert_int_equal(n, 7);
    assert_int_equal(c[4], 8);
    assert_cpus(c, n, "0-3,8,10-11");
    free(c);
    /* unordered and overlapping input comes out sorted, without duplicates */
    assert_int_equal(topo_cpulist_parse("x", "5,1-2,2-3,5", &c, &n), 0);
    assert_cpus(c, n, "1-3,5");
    free(c);
    assert_int_equal(topo_cpulist_parse("x", "\n", &c, &n), 0);
    assert_int_equal(n, 0);
    assert_null(c);

    static const struct {
        const char *s;
        int code;
        const char *needle;
    } bad[] = {
        {"0-", ERR_FORMAT, "expected a number"},
        {"3-1", ERR_FORMAT, "range 3-1 is reversed"},
        {"1,", ERR_FORMAT, "trailing comma"},
        {"1;2", ERR_FORMAT, "unexpected character 0x3b"},
        {"a", ERR_FORMAT, "expected a number"},
        {"0-99999", ERR_RANGE, "CPU id beyond 4095"},
        {"1\n2", ERR_FORMAT, "after the end of line"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tu_log_capture_begin();
        int rc = topo_cpulist_parse("node7/cpulist", bad[i].s, &c, &n);
        tu_log_capture_end();
        if (rc != bad[i].code)
            fail_msg("\"%s\": got %s", bad[i].s, err_name(rc));
        tu_assert_log_contains("node7/cpulist", bad[i].needle, NULL);
        assert_null(c);
    }
    char small[4];
    int ids[] = {0, 1, 2, 7, 9};
    assert_int_equal(topo_cpulist_format(ids, 5, small, sizeof small), ERR_RANGE);
}

static void test_two_nodes(void **state)
{
    (void)state;
    char *root = tu_mkdtemp();
    write_node(root, 0, "0-7\n");
    write_node(root, 1, "8-15\n");
    tu_write_file(tu_path(root, "online"), "0-1\n", 4);
    tu_write_file(tu_path(root, "possible"), "0-3\n", 4); /* ignored: only nodeN + online */
    struct topo *t;
    assert_int_equal(topo_discover(root, &t), 0);
    assert_int_equal(t->n_nodes, 2);
    assert_true(t->numa);
    assert_int_equal(t->nodes[0].id, 0);
    assert_int_equal(t->nodes[1].id, 1);
    assert_cpus(t->nodes[1].cpus, t->nodes[1].n_cpus, "8-15");

    /* workers 0: one per node */
    struct topo_plan *p;
    assert_int_equal(topo_plan_create(t, 0, &p), 0);
    assert_int_equal(p->n, 2);
    assert_int_equal(p->shares[0].node, 0);
    assert_cpus(p->shares[0].cpus, p->shares[0].n_cpus, "0-7");
    assert_int_equal(p->shares[1].node, 1);
    assert_cpus(p->shares[1].cpus, p->shares[1].n_cpus, "8-15");
    topo_plan_destroy(p);

    /* 4 workers: two per node, each half a node */
    assert_int_equal(topo_plan_create(t, 4, &p), 0);
    assert_int_equal(p->n, 4);
    assert_int_equal(p->shares[1].node, 0);
    assert_cpus(p->shares[1].cpus, p->shares[1].n_cpus, "4-7");
    assert_int_equal(p->shares[2].node, 1);
    assert_cpus(p->shares[2].cpus, p->shares[2].n_cpus, "8-11");
    topo_plan_destroy(p);

    /* 1 worker: one node (never spanning two) */
    assert_int_equal(topo_plan_create(t, 1, &p), 0);
    assert_int_equal(p->n, 1);
    assert_int_equal(p->shares[0].node, 0);
    assert_int_equal(p->shares[0].n_cpus, 8);
    topo_plan_destroy(p);

    /* more workers than CPUs */
    tu_log_capture_begin();
    assert_int_equal(topo_plan_create(t, 17, &p), ERR_RANGE);
    tu_log_capture_end();
    tu_assert_log_contains("17 workers", "16 CPUs", NULL);
    topo_destroy(t);
    tu_rmtree(root);
    free(root);
}

static void test_uneven_nodes(void **state)
{
    (void)state;
    char *root = tu_mkdtemp();
    write_node(root, 0, "0-1\n");
    write_node(root, 1, "2-7,16-17\n");
    write_node(root, 2, "\n"); /* memory only */
    write_node(root, 3, "8-9\n");
    tu_write_file(tu_path(root, "online"), "0-2\n", 4); /* node3 offline */
    struct topo *t;
    assert_int_equal(topo_discover(root, &t), 0);
    assert_int_equal(t->n_nodes, 2);
    assert_int_equal(t->nodes[1].n_cpus, 8);

    /* 5 workers over 2 + 8 CPUs: node 1 takes 4 (2 CPUs each), node 0 one */
    struct topo_plan *p;
    assert_int_equal(topo_plan_create(t, 5, &p), 0);
    assert_int_equal(p->n, 5);
    assert_int_equal(p->shares[0].node, 0);
    assert_cpus(p->shares[0].cpus, p->shares[0].n_cpus, "0-1");
    for (int i = 1; i < 5; i++) {
        assert_int_equal(p->shares[i].node, 1);
        assert_int_equal(p->shares[i].n_cpus, 2);
    }
    assert_cpus(p->shares[4].cpus, p->shares[4].n_cpus, "16-17");
    topo_plan_destroy(p);

    /* 3 workers: ratios 8/1 > 2/1 -> node1, 8/2 > 2/1 -> node1, 8/3 > 2/1 -> node1: all on
     * node 1, split 3+3+2 */
    assert_int_equal(topo_plan_create(t, 3, &p), 0);
    assert_cpus(p->shares[0].cpus, p->shares[0].n_cpus, "2-4");
    assert_cpus(p->shares[1].cpus, p->shares[1].n_cpus, "5-7");
    assert_cpus(p->shares[2].cpus, p->shares[2].n_cpus, "16-17");
    topo_plan_destroy(p);
    topo_destroy(t);
    tu_rmtree(root);
    free(root);
}

static void test_bad_trees(void **state)
{
    (void)state;
    struct topo *t;
    char *root = tu_mkdtemp();

    /* no node at all */
    tu_log_capture_begin();
    assert_int_equal(topo_discover(root, &t), ERR_NOT_FOUND);
    tu_log_capture_end();
    tu_assert_log_contains("no NUMA node with a usable CPU", NULL);

    /* a node directory without cpulist */
    char d[4096];
    snprintf(d, sizeof d, "%s/node0", root);
    mkdir(d, 0755);
    tu_log_capture_begin();
    assert_int_equal(topo_discover(root, &t), -ENOENT);
    tu_log_capture_end();
    tu_assert_log_contains("node0/cpulist", NULL);

    /* a malformed cpulist names its file */
    tu_write_file(tu_path(d, "cpulist"), "0-x\n", 4);
    tu_log_capture_begin();
    assert_int_equal(topo_discover(root, &t), ERR_FORMAT);
    tu_log_capture_end();
    tu_assert_log_contains("node0/cpulist", "expected a number", NULL);

    /* a CPU claimed by two nodes */
    tu_write_file(tu_path(d, "cpulist"), "0-3\n", 4);
    write_node(root, 1, "3-4\n");
    tu_log_capture_begin();
    assert_int_equal(topo_discover(root, &t), ERR_FORMAT);
    tu_log_capture_end();
    tu_assert_log_contains("CPU 3 is listed by node0 and node1", NULL);

    /* a malformed online file */
    tu_write_file(tu_path(d, "cpulist"), "0-2\n", 4);
    tu_write_file(tu_path(root, "online"), "0-", 2);
    tu_log_capture_begin();
    assert_int_equal(topo_discover(root, &t), ERR_FORMAT);
    tu_log_capture_end();
    tu_assert_log_contains("/online", NULL);

    /* missing root */
    tu_log_capture_begin();
    assert_int_equal(topo_discover("/nonexistent/clocher/topo", &t), -ENOENT);
    tu_log_capture_end();
    tu_assert_log_contains("/nonexistent/clocher/topo", NULL);
    tu_rmtree(root);
    free(root);
}

/* On this machine: the CPUs discovered are exactly the ones we may run on. */
static void test_this_machine(void **state)
{
    (void)state;
    struct topo *t;
    assert_int_equal(topo_discover(NULL, &t), 0);
    cpu_set_t allowed;
    assert_int_equal(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    size_t total = 0;
    for (size_t i = 0; i < t->n_nodes; i++) {
        total += t->nodes[i].n_cpus;
        for (size_t k = 0; k < t->nodes[i].n_cpus; k++)
            assert_true(CPU_ISSET(t->nodes[i].cpus[k], &allowed));
    }
    assert_int_equal(total, (size_t)CPU_COUNT(&allowed));
    /* --workers N up to the CPU count splits them without overlap */
    struct topo_plan *p;
    assert_int_equal(topo_plan_create(t, (unsigned)total, &p), 0);
    assert_int_equal(p->n, total);
    for (size_t i = 0; i < p->n; i++)
        assert_int_equal(p->shares[i].n_cpus, 1);
    topo_plan_destroy(p);
    topo_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpulist_parse), cmocka_unit_test(test_two_nodes),
        cmocka_unit_test(test_uneven_nodes),  cmocka_unit_test(test_bad_trees),
        cmocka_unit_test(test_this_machine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
