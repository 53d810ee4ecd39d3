/*
 * cmd_convert.c — `clocher convert SRC OUT_DIR [--dtype D] [--quant-manifest FILE]
 * [--calib-ids FILE | --calib FILE] [--gate-* X] ...`, and `clocher convert --cache DIR SRC`
 * (the conversion cache clocherd and inference-engine use: convcache.h).
 *
 * With calibration the quantized model is written to a scratch directory beside OUT_DIR and a
 * float32 reference beside it; OUT_DIR is replaced only when the gate passes, so a refused
 * conversion leaves OUT_DIR exactly as it was (docs/CONVERT.md, "Calibration gate").
 */
#include "calib.h"
#include "cmds.h"
#include "convcache.h"
#include "convert.h"
#include "quant_manifest.h"

#include "err.h"
#include "log.h"
#include "path.h"

#include <errno.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clocher convert SRC OUT_DIR [--dtype f32|f16|bf16|int8|int4] [--embd-dtype D]\n                       [--tokenizer FILE]"
            " [--from llama2c|hf|gguf]\n"
            "       clocher convert --cache DIR SRC [--dtype D] [--cache-max-gb N]\n\n"
            "Converts a llama2.c checkpoint, a Hugging Face directory (config.json +\n"
            "safetensors) or a GGUF file into an IEBIN model directory. The format is\n"
            "detected unless --from names it. --dtype converts the weight matrices (norms stay\n"
            "f32); without it each matrix keeps its source dtype (GGUF Q8_0/Q4_0 stay native).\n"
            "int8 = q8_0 (blocks of 32, f16 scale), int4 = q4_0 (groups of 32, f16 scale).\n"
            "Other int4 layouts (docs/IEBIN.md): q4_g64, q4_g128 (f16 scale per group of\n"
            "64/128), q4z_g32, q4z_g64, q4z_g128 (f16 scale + f16 offset per group).\n"
            "k-quants (GGUF's layouts, super-blocks of 256): q4_k, q5_k, q6_k.\n"
            "--embd-dtype D gives the token embedding and the classifier their own dtype.\n"
            "--tokenizer takes a tokenizer.model, tokenizer.json, tokenizer.bin or .gguf.\n"
            "Nothing under OUT_DIR loads unless the conversion completed.\n\n"
            "--rounding nearest|search  int4 scales: round to nearest (default) or a per-group\n"
            "                       error-minimising search (slower conversion)\n"
            "--quant-manifest FILE  per-tensor dtypes by name pattern (docs/CONVERT.md)\n"
            "--calib-ids FILE       calibration token ids (decimal, space/comma separated)\n"
            "--calib FILE           calibration text, tokenized with the model's tokenizer\n"
            "--calib-report FILE    write the calibration report as JSON (- = stdout)\n"
            "--calib-threads N      threads for the calibration run (default 1)\n"
            "--gate-kld X           refuse if the mean KL divergence vs f32 exceeds X\n"
            "--gate-top1 Y          refuse if top-1 agreement with f32 is below Y (0..1)\n"
            "--gate-cos Z           refuse if any weight's output cosine vs f32 is below Z\n"
            "A refused conversion exits with 4 and leaves OUT_DIR untouched.\n\n"
            "--cache DIR            convert SRC (a Hugging Face folder or a GGUF) into the\n"
            "                       conversion cache under DIR, keyed by SRC's content, unless\n"
            "                       it is there already, and print the IEBIN folder's path on\n"
            "                       stdout (what clocherd and inference-engine run; progress\n"
            "                       lines on stderr; docs/CONVERT.md, \"The conversion cache\")\n"
            "--cache-max-gb N       then remove the least recently used entries until the\n"
            "                       cache holds at most N GB (never one in use or just used)\n");
}

/* The exit code of a finished convert_model (its reason was logged where it was found). */
static int convert_exit(int rc, enum convert_fault fault)
{
    if (rc == 0)
        return CMD_EXIT_OK;
    if (rc == ERR_USAGE)
        return CMD_EXIT_USAGE;
    return fault == CONVERT_FAULT_OUTPUT || rc == -ENOMEM ? CMD_EXIT_FAIL : CMD_EXIT_INPUT;
}

/* Moves the finished scratch model into place; an existing OUT_DIR is renamed aside first and
 * removed once the new one is in (a crash between the renames leaves both, never neither). */
static int install_dir(const char *tmp, const char *out_dir)
{
    if (rename(tmp, out_dir) == 0)
        return 0;
    if (errno != EEXIST && errno != ENOTEMPTY) {
        LOG_ERR("%s: cannot move the converted model into place: %s", out_dir, strerror(errno));
        return -errno;
    }
    char old[4096];
    snprintf(old, sizeof old, "%s.old.%ld", out_dir, (long)getpid());
    if (rename(out_dir, old) != 0 || rename(tmp, out_dir) != 0) {
        LOG_ERR("%s: cannot replace the previous model: %s", out_dir, strerror(errno));
        return -errno;
    }
    path_rm_tree(old);
    return 0;
}

/*
 * convert → reference f32 conversion → calibration → gate → install. Scratch directories sit
 * beside OUT_DIR (same file system, so the final rename is atomic) and are always removed.
 */
static int convert_calibrated(const char *src, const char *out_dir, const struct convert_opts *o,
                              const char *ids_path, const char *text_path, const char *report,
                              unsigned threads, const struct calib_gate *gate)
{
    char tmpq[4096], tmpr[4096];
    long pid = (long)getpid();
    if (snprintf(tmpq, sizeof tmpq, "%s.calib-quant.%ld", out_dir, pid) >= (int)sizeof tmpq ||
        snprintf(tmpr, sizeof tmpr, "%s.calib-ref.%ld", out_dir, pid) >= (int)sizeof tmpr) {
        fprintf(stderr, "clocher convert: OUT_DIR path is too long\n");
        return CMD_EXIT_USAGE;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    struct calib_report r = {0};
    int code, rc;
    enum convert_fault fault = CONVERT_FAULT_SOURCE;
    if (ids_path && (rc = calib_read_ids(ids_path, &ids, &n)) != 0)
        return convert_exit(rc, fault);
    rc = convert_model(src, tmpq, o, &fault);
    if (rc) {
        code = convert_exit(rc, fault);
        goto out;
    }
    struct convert_opts ref = *o;
    ref.manifest = NULL;
    ref.dtype_set = true;
    ref.dtype = DT_F32;
    ref.embd_dtype_set = false;
    if ((rc = convert_model(src, tmpr, &ref, &fault)) != 0) {
        code = convert_exit(rc, fault);
        goto out;
    }
    if (text_path && (rc = calib_read_text(text_path, tmpr, &ids, &n)) != 0) {
        code = convert_exit(rc, fault);
        goto out;
    }
    fault = CONVERT_FAULT_SOURCE; /* from here a failure is about the calibration inputs */
    if ((rc = calib_run(tmpr, tmpq, ids, n, threads, &r)) != 0) {
        code = convert_exit(rc, fault);
        goto out;
    }
    int verdict = calib_check(&r, gate);
    fprintf(stderr,
            "calibration: %zu positions, KL divergence mean %.6g max %.6g, top-1 agreement "
            "%.4f, lowest output cosine %.6f%s\n",
            r.positions, r.kld_mean, r.kld_max, r.top1, r.cosine_min,
            verdict ? " — REFUSED, nothing written" : "");
    if (report && calib_write_report(&r, gate, verdict, report) != 0) {
        code = CMD_EXIT_FAIL;
        goto out;
    }
    if (verdict) {
        code = CMD_EXIT_QUALITY;
        goto out;
    }
    code = install_dir(tmpq, out_dir) == 0 ? CMD_EXIT_OK : CMD_EXIT_FAIL;
out:
    calib_report_free(&r);
    free(ids);
    path_rm_tree(tmpr);
    path_rm_tree(tmpq);
    return code;
}

/* `--cache DIR SRC`: the entry's path on stdout, converted first when missing. Only --dtype
 * and --from shape a cache entry: the other options (`other`) would need a place in its key. */
static int convert_into_cache(const char *cache_dir, double max_gb, int n_pos,
                              const char *const *pos, const struct convert_opts *o,
                              const char *dtype_name, bool other)
{
    if (n_pos != 1) {
        fprintf(stderr, "clocher convert: --cache DIR takes one SRC (a Hugging Face folder or a "
                        "GGUF file), got %d arguments\n", n_pos);
        return CMD_EXIT_USAGE;
    }
    if (other) {
        fprintf(stderr, "clocher convert: --cache takes --dtype, --from and --cache-max-gb "
                        "only; convert with other options into a folder of your own "
                        "(clocher convert SRC OUT_DIR ...)\n");
        return CMD_EXIT_USAGE;
    }
    char out[4096];
    bool converted;
    enum convert_fault fault;
    int rc = convcache_get(cache_dir, pos[0], o, dtype_name, out, sizeof out, &converted, &fault);
    if (rc)
        return convert_exit(rc, fault);
    if (!converted)
        fprintf(stderr, "using %s, converted before from %s\n", out, pos[0]);
    /* a cache that cannot be trimmed still serves: the entry is there */
    if (max_gb > 0)
        (void)convcache_evict(cache_dir, out, (uint64_t)(max_gb * 1e9));
    printf("%s\n", out);
    return fflush(stdout) == 0 ? CMD_EXIT_OK : CMD_EXIT_FAIL;
}

int cmd_convert(int argc, char **argv)
{
    struct convert_opts o = {.progress = isatty(2)};
    const char *pos[2];
    int n_pos = 0;
    const char *manifest_path = NULL, *calib_ids = NULL, *calib_text = NULL, *calib_report = NULL;
    unsigned calib_threads = 1;
    struct calib_gate gate = {NAN, NAN, NAN};
    bool gated = false;
    const char *cache_dir = NULL, *dtype_name = NULL;
    double cache_max_gb = 0; /* 0: no eviction */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return CMD_EXIT_OK;
        } else if (!strcmp(a, "--dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            o.dtype_set = true;
            if (!strcmp(d, "int8"))
                d = "q8_0"; /* int8 weights: blocks of 32 with an f16 scale (GGML Q8_0) */
            else if (!strcmp(d, "int4"))
                d = "q4_0"; /* int4 weights: groups of 32 with an f16 scale (GGML Q4_0) */
            dtype_name = d; /* after the aliases: int8 and q8_0 share a cache entry */
            if (dtype_from_name(d, &o.dtype) != 0) {
                fprintf(stderr, "clocher convert: --dtype %s: expected f32, f16, bf16, int8 "
                                "(q8_0), int4 (q4_0), q4_g64, q4_g128, q4z_g32, q4z_g64, "
                                "q4z_g128, q4_k, q5_k or q6_k\n", d);
                return CMD_EXIT_USAGE;
            }
        } else if (!strcmp(a, "--embd-dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            o.embd_dtype_set = true;
            if (!strcmp(d, "int8"))
                d = "q8_0";
            else if (!strcmp(d, "int4"))
                d = "q4_0";
            if (dtype_from_name(d, &o.embd_dtype) != 0) {
                fprintf(stderr, "clocher convert: --embd-dtype %s: expected f32, f16, bf16, int8 or int4\n", d);
                return CMD_EXIT_USAGE;
            }
        } else if (!strcmp(a, "--rounding") && i + 1 < argc) {
            const char *r = argv[++i];
            if (strcmp(r, "nearest") && strcmp(r, "search")) {
                fprintf(stderr, "clocher convert: --rounding %s: expected nearest or search\n", r);
                return CMD_EXIT_USAGE;
            }
            o.rounding_search = !strcmp(r, "search");
        } else if (!strcmp(a, "--quant-manifest") && i + 1 < argc) {
            manifest_path = argv[++i];
        } else if (!strcmp(a, "--calib-ids") && i + 1 < argc) {
            calib_ids = argv[++i];
        } else if (!strcmp(a, "--calib") && i + 1 < argc) {
            calib_text = argv[++i];
        } else if (!strcmp(a, "--calib-report") && i + 1 < argc) {
            calib_report = argv[++i];
        } else if (!strcmp(a, "--calib-threads") && i + 1 < argc) {
            char *e;
            long v = strtol(argv[++i], &e, 10);
            if (*e || v < 1 || v > 256) {
                fprintf(stderr, "clocher convert: --calib-threads %s: expected 1..256\n", argv[i]);
                return CMD_EXIT_USAGE;
            }
            calib_threads = (unsigned)v;
        } else if ((!strcmp(a, "--gate-kld") || !strcmp(a, "--gate-top1") ||
                    !strcmp(a, "--gate-cos")) && i + 1 < argc) {
            char *e;
            double v = strtod(argv[++i], &e);
            bool frac = strcmp(a, "--gate-kld") != 0;
            if (*e || !(v >= 0) || (frac && v > 1) || isinf(v)) {
                fprintf(stderr, "clocher convert: %s %s: expected a number %s\n", a, argv[i],
                        frac ? "in [0, 1]" : ">= 0");
                return CMD_EXIT_USAGE;
            }
            if (!strcmp(a, "--gate-kld"))
                gate.max_kld = v;
            else if (!strcmp(a, "--gate-top1"))
                gate.min_top1 = v;
            else
                gate.min_cosine = v;
            gated = true;
        } else if (!strcmp(a, "--cache") && i + 1 < argc) {
            cache_dir = argv[++i];
        } else if (!strcmp(a, "--cache-max-gb") && i + 1 < argc) {
            char *e;
            cache_max_gb = strtod(argv[++i], &e);
            if (*e || e == argv[i] || !(cache_max_gb > 0) || cache_max_gb > 1e6) {
                fprintf(stderr, "clocher convert: --cache-max-gb %s: expected a number of "
                                "gigabytes above 0 (at most 1e6)\n", argv[i]);
                return CMD_EXIT_USAGE;
            }
        } else if (!strcmp(a, "--tokenizer") && i + 1 < argc) {
            o.tokenizer = argv[++i];
        } else if (!strcmp(a, "--from") && i + 1 < argc) {
            const char *f = argv[++i];
            if (!strcmp(f, "llama2c"))
                o.from = CONVERT_LLAMA2C;
            else if (!strcmp(f, "hf"))
                o.from = CONVERT_HF;
            else if (!strcmp(f, "gguf"))
                o.from = CONVERT_GGUF;
            else {
                fprintf(stderr, "clocher convert: --from %s: expected llama2c, hf or gguf\n", f);
                return CMD_EXIT_USAGE;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "clocher convert: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return CMD_EXIT_USAGE;
        } else if (n_pos < 2) {
            pos[n_pos++] = a;
        } else {
            fprintf(stderr, "clocher convert: unexpected argument '%s'\n", a);
            return CMD_EXIT_USAGE;
        }
    }
    if (cache_max_gb > 0 && !cache_dir) {
        fprintf(stderr, "clocher convert: --cache-max-gb goes with --cache DIR\n");
        return CMD_EXIT_USAGE;
    }
    if (cache_dir)
        return convert_into_cache(cache_dir, cache_max_gb, n_pos, pos, &o, dtype_name,
                                  manifest_path || calib_ids || calib_text || gated ||
                                      calib_report || o.embd_dtype_set || o.tokenizer);
    if (n_pos != 2) {
        usage(stderr);
        return CMD_EXIT_USAGE;
    }
    if (calib_ids && calib_text) {
        fprintf(stderr, "clocher convert: give --calib-ids or --calib, not both\n");
        return CMD_EXIT_USAGE;
    }
    if ((gated || calib_report) && !calib_ids && !calib_text) {
        fprintf(stderr, "clocher convert: --gate-* and --calib-report need calibration data "
                        "(--calib-ids FILE or --calib FILE)\n");
        return CMD_EXIT_USAGE;
    }
    struct quant_manifest *qm = NULL;
    if (manifest_path) {
        int rc = qm_load(manifest_path, &qm);
        if (rc)
            return rc == -ENOMEM ? CMD_EXIT_FAIL : CMD_EXIT_INPUT; /* logged by qm_load */
        o.manifest = qm;
    }
    int code;
    if (calib_ids || calib_text)
        code = convert_calibrated(pos[0], pos[1], &o, calib_ids, calib_text, calib_report,
                                  calib_threads, &gate);
    else {
        enum convert_fault fault;
        int rc = convert_model(pos[0], pos[1], &o, &fault);
        code = convert_exit(rc, fault);
    }
    qm_free(qm);
    return code;
}
