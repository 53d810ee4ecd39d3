/*
 * cmd_synth_adapter.c — `clocher synth-adapter BASE_DIR OUT_DIR --rank R [--alpha A]
 * [--targets q,k,v,o,gate,up,down] [--seed N] [--dtype f32|f16|bf16] [--strength S]`: writes a deterministic
 * random LoRA adapter in PEFT form for an IEBIN base model (synth_adapter.h).
 */
#include "cmds.h"

#include "err.h"
#include "iebin.h"
#include "log.h"
#include "lora.h"
#include "synth_adapter.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clocher synth-adapter BASE_DIR OUT_DIR --rank R [--alpha A]\n"
            "                             [--targets q,k,v,o,gate,up,down] [--seed N]\n"
            "                             [--dtype f32|f16|bf16] [--strength S]\n"
            "\n"
            "Writes a deterministic random LoRA adapter in Hugging Face PEFT form\n"
            "(adapter_config.json + adapter_model.safetensors) for the IEBIN model in BASE_DIR.\n"
            "Unlike a freshly initialised PEFT adapter, lora_B is non-zero: each adapted\n"
            "projection's output moves by about S times its size.\n"
            "\n"
            "  --rank R      LoRA rank r, 1..%u (required)\n"
            "  --alpha A     lora_alpha (default: R, i.e. scaling 1)\n"
            "  --targets L   comma-separated projections: q k v o gate up down (or q_proj, ...),\n"
            "                or 'all' (default: q,v)\n"
            "  --seed N      PRNG seed (default 0); same seed, same bytes\n"
            "  --dtype T     tensor dtype written: f32 (default), f16 or bf16\n"
            "  --strength S  relative change of each adapted projection, 0 < S <= 10\n"
            "                (default %.2f)\n",
            LORA_MAX_RANK, (double)SYNTH_ADAPTER_STRENGTH);
}

static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (!s || !*s || *s == '-' || *s == '+')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

static int parse_targets(const char *s, uint32_t *mask)
{
    *mask = 0;
    if (strcmp(s, "all") == 0) {
        *mask = (1u << LORA_TARGET_COUNT) - 1u;
        return 0;
    }
    const char *p = s;
    while (*p) {
        size_t n = strcspn(p, ",");
        int found = -1;
        for (int t = 0; t < LORA_TARGET_COUNT; t++) {
            const char *m = lora_target_name((enum lora_target)t);
            size_t short_len = strlen(m) - strlen("_proj");
            if ((n == strlen(m) && memcmp(p, m, n) == 0) ||
                (n == short_len && memcmp(p, m, n) == 0))
                found = t;
        }
        if (found < 0) {
            fprintf(stderr, "clocher synth-adapter: --targets: unknown projection '%.*s' "
                            "(known: q k v o gate up down)\n",
                    (int)n, p);
            return -1;
        }
        *mask |= 1u << found;
        p += n;
        if (*p == ',' && *++p == '\0')
            return -1; /* trailing comma */
    }
    return *mask ? 0 : -1;
}

int cmd_synth_adapter(int argc, char **argv)
{
    static const struct option opts[] = {
        {"rank", required_argument, NULL, 'r'},  {"alpha", required_argument, NULL, 'a'},
        {"targets", required_argument, NULL, 't'}, {"seed", required_argument, NULL, 's'},
        {"dtype", required_argument, NULL, 'd'}, {"strength", required_argument, NULL, 'S'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct synth_adapter_opts o = {
        .target_mask = 1u << LORA_Q | 1u << LORA_V,
        .dtype = DT_F32,
    };
    bool have_alpha = false;
    uint64_t v;
    int c;
    optind = 0; /* GNU: full re-initialisation (tests call commands more than once) */
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'r':
            if (parse_u64(optarg, LORA_MAX_RANK, &v) != 0 || v == 0) {
                fprintf(stderr, "clocher synth-adapter: --rank '%s': expected 1..%u\n", optarg,
                        LORA_MAX_RANK);
                return CMD_EXIT_USAGE;
            }
            o.rank = (uint32_t)v;
            break;
        case 'a': {
            double a;
            if (parse_double(optarg, &a) != 0 || a == 0.0 || fabs(a) > 1e30) {
                fprintf(stderr, "clocher synth-adapter: --alpha '%s': expected a finite, "
                                "non-zero number\n",
                        optarg);
                return CMD_EXIT_USAGE;
            }
            o.alpha = (float)a;
            have_alpha = true;
            break;
        }
        case 'S': {
            double a;
            if (parse_double(optarg, &a) != 0 || !(a > 0.0 && a <= 10.0)) {
                fprintf(stderr, "clocher synth-adapter: --strength '%s': expected a number in "
                                "(0, 10]\n",
                        optarg);
                return CMD_EXIT_USAGE;
            }
            o.strength = (float)a;
            break;
        }
        case 't':
            if (parse_targets(optarg, &o.target_mask) != 0) {
                fprintf(stderr, "clocher synth-adapter: --targets '%s': expected a "
                                "comma-separated list of q k v o gate up down, or all\n",
                        optarg);
                return CMD_EXIT_USAGE;
            }
            break;
        case 's':
            if (parse_u64(optarg, UINT64_MAX, &v) != 0) {
                fprintf(stderr, "clocher synth-adapter: --seed '%s': expected an unsigned "
                                "integer\n",
                        optarg);
                return CMD_EXIT_USAGE;
            }
            o.seed = v;
            break;
        case 'd':
            if (dtype_from_name(optarg, &o.dtype) != 0 ||
                (o.dtype != DT_F32 && o.dtype != DT_F16 && o.dtype != DT_BF16)) {
                fprintf(stderr, "clocher synth-adapter: --dtype '%s': expected f32, f16 or "
                                "bf16\n",
                        optarg);
                return CMD_EXIT_USAGE;
            }
            break;
        case 'h':
            usage(stdout);
            return CMD_EXIT_OK;
        default:
            fprintf(stderr, "clocher synth-adapter: unknown or incomplete option '%s'\n\n",
                    argv[optind - 1]);
            usage(stderr);
            return CMD_EXIT_USAGE;
        }
    }
    if (argc - optind != 2 || o.rank == 0) {
        fprintf(stderr, "clocher synth-adapter: %s\n\n",
                argc - optind != 2 ? "expected BASE_DIR and OUT_DIR" : "--rank is required");
        usage(stderr);
        return CMD_EXIT_USAGE;
    }
    if (!have_alpha)
        o.alpha = (float)o.rank;
    const char *base_dir = argv[optind], *out_dir = argv[optind + 1];

    struct iebin_model *m;
    if (iebin_open_ex(base_dir, IEBIN_OPEN_LAZY, &m) != 0)
        return CMD_EXIT_INPUT; /* the reason was logged */
    int rc = synth_adapter_write(m, out_dir, &o);
    iebin_close(m);
    if (rc != 0)
        return CMD_EXIT_FAIL;
    return CMD_EXIT_OK;
}
