/*
 * cmd_adapters.c — `clocher adapters list | load NAME PATH | unload NAME`: the LoRA adapters
 * of clocherd (ListAdapters, LoadAdapter, UnloadAdapter).
 *
 * Exit codes (cmds.h): 0 ok; 1 local failure; 2 usage; 5 daemon unreachable; 6 the daemon
 * refused (NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, INVALID_ARGUMENT: printed).
 */
#include "cmds.h"

#include "genreq.h"
#include "rpc.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clocher adapters list [--json] [connection flags]\n"
            "       clocher adapters load NAME PATH [connection flags]\n"
            "       clocher adapters unload NAME [connection flags]\n"
            "\n"
            "The daemon's LoRA adapters. `list` shows those the API key's tenant may use (name,\n"
            "rank, alpha, target modules, requests using it now). `load` makes every worker load\n"
            "the PEFT directory PATH (adapter_config.json + adapter_model.safetensors) as NAME;\n"
            "PATH is read by the daemon, on its machine: a relative PATH is made absolute\n"
            "against this directory. `unload` removes NAME once its requests are done.\n"
            "Loading and unloading need a tenant allowed every adapter (\"*\").\n"
            "\n"
            "  --json               `list`: one JSON object per adapter and line\n"
            "  -h, --help           this help\n"
            "\n%s\n"
            "exit status: 0 ok, 1 local failure, 2 usage, 5 daemon unreachable,\n"
            "             6 the daemon refused (status printed)\n",
            RPC_OPTIONS_HELP);
}

static void print_info(const Clocher__V1__AdapterInfo *a, bool json)
{
    if (json) {
        json_t *o = json_object(), *t = json_array();
        json_object_set_new(o, "name", json_string(a->name ? a->name : ""));
        json_object_set_new(o, "rank", json_integer(a->rank));
        json_object_set_new(o, "alpha", json_real(a->alpha));
        for (size_t i = 0; i < a->n_target_modules; i++)
            json_array_append_new(t, json_string(a->target_modules[i]));
        json_object_set_new(o, "target_modules", t);
        json_object_set_new(o, "active_requests", json_integer(a->active_requests));
        char *s = json_dumps(o, JSON_COMPACT);
        if (s)
            printf("%s\n", s);
        free(s);
        json_decref(o);
        return;
    }
    printf("%-24s %5u %8g  ", a->name ? a->name : "", a->rank, (double)a->alpha);
    for (size_t i = 0; i < a->n_target_modules; i++)
        printf("%s%s", i ? "," : "", a->target_modules[i]);
    printf("%s  %u\n", a->n_target_modules ? "" : "-", a->active_requests);
}

int cmd_adapters(int argc, char **argv)
{
    struct rpc_opts o;
    rpc_opts_init(&o, 60); /* loading reads and checks a whole adapter on every worker */
    bool json = false;
    static const struct option longopts[] = {
        RPC_LONG_OPTIONS,
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    int opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        int rc = rpc_opts_set(&o, "adapters", opt, optarg);
        if (rc < 0)
            return CMD_EXIT_USAGE;
        if (rc > 0)
            continue;
        switch (opt) {
        case 'j':
            json = true;
            break;
        case 'h':
            usage(stdout);
            return CMD_EXIT_OK;
        default: /* ':' (an option without its value) or '?' */
            rpc_opt_error("adapters", opt, argv);
            return CMD_EXIT_USAGE;
        }
    }
    int n = argc - optind;
    char **a = argv + optind;
    if (n == 0) {
        fprintf(stderr, "clocher adapters: which action? list, load NAME PATH or unload NAME\n");
        return CMD_EXIT_USAGE;
    }
    const char *action = a[0];
    int want = strcmp(action, "list") == 0     ? 1
               : strcmp(action, "load") == 0   ? 3
               : strcmp(action, "unload") == 0 ? 2
                                               : 0;
    if (!want) {
        fprintf(stderr, "clocher adapters: unknown action '%s' (list, load, unload)\n", action);
        return CMD_EXIT_USAGE;
    }
    if (n != want) {
        fprintf(stderr, "clocher adapters: usage: %s\n",
                want == 1 ? "adapters list" : want == 3 ? "adapters load NAME PATH"
                                                        : "adapters unload NAME");
        return CMD_EXIT_USAGE;
    }
    if (json && want != 1) {
        fprintf(stderr, "clocher adapters: --json goes with `list`\n");
        return CMD_EXIT_USAGE;
    }
    char abs_path[PATH_MAX];
    if (want == 3 && a[2][0] != '/') {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd) ||
            (size_t)snprintf(abs_path, sizeof abs_path, "%s/%s", cwd, a[2]) >= sizeof abs_path) {
            fprintf(stderr, "clocher adapters: cannot make '%s' absolute\n", a[2]);
            return CMD_EXIT_FAIL;
        }
        a[2] = abs_path;
    }

    struct rpc_client *c;
    int rc = rpc_client_create("adapters", &o, &c);
    if (rc < 0)
        return rpc_exit_code(rc);
    struct rpc_status st = {0};
    ProtobufCMessage *resp = NULL;
    const char *what;
    if (want == 1) {
        what = "ListAdapters";
        Clocher__V1__ListAdaptersRequest q = CLOCHER__V1__LIST_ADAPTERS_REQUEST__INIT;
        rc = rpc_unary(c, RPC_M_LIST_ADAPTERS, &q.base,
                       &clocher__v1__list_adapters_response__descriptor, &resp, &st);
        if (rc == 0) {
            const Clocher__V1__ListAdaptersResponse *r = (void *)resp;
            if (!json)
                printf("%-24s %5s %8s  %s  %s\n", "NAME", "RANK", "ALPHA", "TARGETS", "ACTIVE");
            for (size_t i = 0; i < r->n_adapters; i++)
                print_info(r->adapters[i], json);
        }
    } else if (want == 3) {
        what = "LoadAdapter";
        Clocher__V1__LoadAdapterRequest q = CLOCHER__V1__LOAD_ADAPTER_REQUEST__INIT;
        q.name = a[1];
        q.path = a[2];
        rc = rpc_unary(c, RPC_M_LOAD_ADAPTER, &q.base,
                       &clocher__v1__load_adapter_response__descriptor, &resp, &st);
        if (rc == 0) {
            const Clocher__V1__LoadAdapterResponse *r = (void *)resp;
            printf("loaded %s", a[1]);
            if (r->adapter)
                printf(" (rank %u, alpha %g)", r->adapter->rank, (double)r->adapter->alpha);
            printf("\n");
        }
    } else {
        what = "UnloadAdapter";
        Clocher__V1__UnloadAdapterRequest q = CLOCHER__V1__UNLOAD_ADAPTER_REQUEST__INIT;
        q.name = a[1];
        rc = rpc_unary(c, RPC_M_UNLOAD_ADAPTER, &q.base,
                       &clocher__v1__unload_adapter_response__descriptor, &resp, &st);
        if (rc == 0)
            printf("unloaded %s\n", a[1]);
    }
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    if (rc == RPC_ERR_STATUS)
        rpc_print_status("adapters", what, &st);
    else if (rc < 0)
        fprintf(stderr, "clocher adapters: %s: %s\n", what, st.message);
    rpc_client_destroy(c);
    if (rc == 0 && fflush(stdout) != 0) {
        fprintf(stderr, "clocher adapters: writing to standard output: %s\n", strerror(errno));
        return CMD_EXIT_FAIL;
    }
    return rpc_exit_code(rc);
}
