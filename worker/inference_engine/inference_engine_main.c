/*
 * inference_engine_main.c — `inference-engine`: runs the reference forward pass on one IEBIN
 * model for one or more prompts and reports one JSON line per prompt (the benchmark and
 * debugging tool; the server path is clocherd + clocher-worker).
 *
 * Output contract (also in --help and docs/DESIGN.md):
 *  - stdout carries only the JSON lines (one per prompt, emitted with jansson), so that
 *    `inference-engine ... | jq` always works;
 *  - the generated text is streamed to stderr as it is produced (first measured round only;
 *    --quiet turns it off), followed by a newline; log messages also go to stderr.
 * Exit codes: 0 ok, 1 run-time failure (writing --dump-logits), 2 usage (bad flags, bad
 * prompt, prompt longer than the context, text prompt for a model without tokenizer),
 * 3 model missing or invalid, 5 engine creation failed (kernels, thread pool, forward pass,
 * sampler), 6 out of memory.
 *
 * Timing (per prompt, over the measured rounds, after --warmup unreported ones): a run starts
 * when the prompt's ids are ready (tokenization excluded) and ends when the last token has been
 * sampled. ttft = start -> first token sampled (prefill + one sample); inter-token latencies
 * are the gaps between consecutive sampled tokens (one decode forward + one sample each).
 */
#include "clocher_version.h"
#include "engine.h"
#include "modelsrc.h"
#include "mono.h"
#include "err.h"
#include "forward.h"
#include "hotrepl.h"
#include "kern.h"
#include "log.h"
#include "lora.h"
#include "model.h"
#include "pool.h"
#include "sampler.h"
#include "serve.h"
#include "tok.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum {
    EXIT_OK = 0,
    EXIT_FAIL = 1,
    EXIT_USAGE = 2,
    EXIT_MODEL = 3,
    EXIT_ENGINE = 5,
    EXIT_NOMEM = 6,
};

#define DEFAULT_MAX_NEW 128u
#define MAX_STOPS 64
#define MAX_PROMPT_IDS 4096 /* --prompt-ids given this often at most (as --concurrency) */
#define PROMPTS_FILE_MAX (256u << 20)

struct opts {
    const char *model_dir;
    /* a Hugging Face folder or a GGUF as --model-dir: the conversion cache (modelsrc.h) */
    bool no_convert;          /* --no-convert: refuse it with the `clocher convert` command */
    const char *cache_dir;    /* --cache-dir; NULL = modelsrc_cache_dir_default */
    double cache_max_gb;      /* --cache-max-gb: evict down to it after converting; 0 = never */
    const char *convert_dtype; /* --convert-dtype; NULL = the source's dtypes */
    const char *convert_program; /* --convert-program; NULL = beside this program */
    const char *prompt;       /* --prompt */
    const char *prompts_file; /* --prompts-file */
    const char *prompt_ids[MAX_PROMPT_IDS]; /* --prompt-ids, each one prompt */
    size_t n_prompt_ids;
    uint32_t max_new;
    uint32_t ctx;             /* 0 = the model's context */
    int threads;
    struct sampler_params sp;
    const char *stops[MAX_STOPS];
    size_t n_stops;
    uint32_t rounds, warmup;
    bool print_ids, no_bos, ignore_eos, quiet;
    const char *dump_logits;
    uint32_t concurrency;     /* 0: the reference path, one prompt at a time */
    const char *adapter;      /* --adapter NAME=DIR (engine path) */
    float adapter_scale;
    enum lora_pack lora_weights; /* --lora-weights */
    enum dtype kv_dtype;      /* --kv-dtype (engine path; DT_F32 = 0 by default) */
    bool kv_dtype_set;
    const char *pin;          /* --pin: none, compact (default) or scatter */
    bool batch_invariant;     /* --batch-invariant (engine path) */
};

static void usage(FILE *f)
{
    fprintf(f,
"usage: inference-engine --model-dir DIR (--prompt TEXT | --prompts-file FILE |\n"
"                        --prompt-ids 1,2,3) [options]\n"
"\n"
"Runs the reference (f32) forward pass of an IEBIN model and prints one JSON line per\n"
"prompt on stdout. The generated text is streamed to stderr (first measured round).\n"
"\n"
"input:\n"
"  --model-dir DIR        IEBIN model directory (model.ie.json, model.ie.bin); a Hugging\n"
"                         Face folder or a GGUF is converted once into the cache first\n"
"  --no-convert           refuse a Hugging Face folder or a GGUF (naming the command)\n"
"  --cache-dir DIR        the conversion cache (default $XDG_CACHE_HOME/clocher or\n"
"                         ~/.cache/clocher; docs/CONVERT.md)\n"
"  --cache-max-gb N       then evict least recently used cache entries down to N GB\n"
"  --convert-dtype D      convert with `clocher convert --dtype D` (default: the source's)\n"
"  --convert-program P    the clocher program (default: beside inference-engine)\n"
"  --prompt TEXT          one prompt, tokenized with the model's tokenizer\n"
"  --prompts-file FILE    one prompt per line (blank lines skipped), one JSON line each\n"
"  --prompt-ids LIST      token ids separated by commas, used as given (no BOS added);\n"
"                         the only form a model without tokenizer accepts; repeatable:\n"
"                         one prompt each (with --concurrency, round-robin)\n"
"  --no-bos               do not prepend BOS to text prompts (default: as the tokenizer's\n"
"                         source asks: Llama yes, GPT-2 no)\n"
"generation:\n"
"  --max-new N            tokens to generate (default %u; 0 = process the prompt only)\n"
"  --ctx N                KV cache positions (default: the model's max_seq_len)\n"
"  --ignore-eos           keep generating after the end-of-sequence token\n"
"  --stop STR             stop when the text contains STR (not emitted); repeatable\n"
"sampling (applied in this order; see docs/DESIGN.md):\n"
"  --repeat-penalty R     divide positive / multiply negative logits of recent tokens\n"
"                         (> 0, default 1 = off)\n"
"  --repeat-window N      tokens the penalty looks back on (default 64, 0 = all)\n"
"  --temperature T        >= 0 (default 1; 0 = greedy)\n"
"  --top-k K              keep the K most probable tokens (default 0 = off)\n"
"  --top-p P              nucleus: smallest set of mass >= P, in (0, 1] (default 1 = off)\n"
"  --min-p P              keep tokens with p >= P * p_max, in [0, 1] (default 0 = off)\n"
"  --seed S               RNG seed (default 0): same seed, same output\n"
"  --greedy               argmax (lowest id on ties): temperature 0, filters off\n"
"measurement:\n"
"  --threads N            compute threads (default: online CPUs)\n"
"  --pin MODE             compact (default: thread i on the i-th allowed CPU, within one\n"
"                         NUMA node when it has enough), scatter (spread over the allowed\n"
"                         CPUs) or none (the scheduler places them); more threads than\n"
"                         allowed CPUs are never pinned\n"
"  --warmup N             unreported runs before measuring (default 0)\n"
"  --rounds N             measured runs per prompt (default 1)\n"
"  --print-ids            add generated_ids and text to the JSON\n"
"  --dump-logits FILE     float32 logits of every position processed (prompt, then each\n"
"                         generated token fed back: prompt_tokens + generated_tokens - 1\n"
"                         rows, or prompt_tokens with --max-new 0), row-major\n"
"                         [position][vocab], all prompts in order (first measured round)\n"
"  --quiet                do not stream the text to stderr (nor log information)\n"
"serving engine (worker/engine/engine.h, docs/ENGINE.md):\n"
"  --concurrency N        run N requests at once through the continuous-batching engine:\n"
"                         N copies of the prompt (or the prompts round-robin) per round;\n"
"                         one JSON line per round: aggregate tps, per-request ttft/e2e/\n"
"                         tpot p50/p95, kv_hits/kv_misses (prefix-cache tokens),\n"
"                         preemptions (no text streaming, no --dump-logits)\n"
"  --adapter NAME=DIR     load a PEFT LoRA adapter and use it for every request\n"
"                         (implies --concurrency 1 unless given)\n"
"  --adapter-scale S      the adapter's request scale (default 1)\n"
"  --lora-weights auto|bf16|int8\n"
"                         how the adapter's weights are packed for the update (docs/LORA.md;\n"
"                         default auto: as the file stores them)\n"
"  --kv-dtype T           the engine's KV cache: f32 (default), f16, bf16, int8 or fp8\n"
"                         (8-bit: Hadamard-rotated rows, docs/KV.md; implies\n"
"                         --concurrency 1 unless given)\n"
"  --batch-invariant      every request batch invariant: the same tokens alone or under\n"
"                         any load, slower (docs/DESIGN.md \"Batch invariance\"; implies\n"
"                         --concurrency 1 unless given)\n"
"  -h, --help             this help\n"
"      --version          the version\n"
"\n"
"JSON keys: model, prompt_tokens, generated_tokens, finish (eos|length|stop|context),\n"
"rounds, wall_s and ttft_ms (medians over rounds), tps (generated tokens / wall time of a\n"
"run), prefill_tps, decode_tps ((generated - 1) / time from first to last token), p50_ms and\n"
"p95_ms (inter-token latency over all rounds), load_ms, rss_peak_mb (VmHWM), threads,\n"
"kv_hits and kv_misses (prefix-cache counters; this engine's contiguous cache has none: 0),\n"
"isa; for a mixture-of-experts model (gpt_oss) also arch, n_experts, n_experts_used and\n"
"active_expert_bytes_per_token (expert weights one token reads); with --print-ids\n"
"generated_ids and text (null without tokenizer); with --concurrency,\n"
"--print-ids adds generated_ids as one array of token ids per request.\n"
"\n"
"environment: IE_HUGE_PAGES=0 leaves the model's page cache as it is; by default (1) a\n"
"model cached in 4 KiB folios is re-read once in 2 MiB folios (2 MiB page-table entries)\n"
"\n"
"exit status: 0 ok, 1 run-time failure, 2 usage, 3 model missing or invalid,\n"
"             5 engine creation failed, 6 out of memory\n",
            DEFAULT_MAX_NEW);
}

/* ---- argument parsing --------------------------------------------------------------------- */

static bool parse_u32(const char *flag, const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || errno || s[0] == '-' || v < lo || v > hi) {
        LOG_ERR("%s: '%s' is not an integer in %u..%u", flag, s, lo, hi);
        return false;
    }
    *out = (uint32_t)v;
    return true;
}

static bool parse_float(const char *flag, const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (!*s || *end || errno || !isfinite(v)) {
        LOG_ERR("%s: '%s' is not a finite number", flag, s);
        return false;
    }
    *out = v;
    return true;
}

/*
 * --model-dir as given when it is an IEBIN folder; a Hugging Face folder or a GGUF converted
 * into the cache by the clocher program (modelsrc.h), o->model_dir then pointing at served[cap];
 * anything else (or --no-convert) refused by modelsrc_check. 0 or a negative code (logged).
 */
static int resolve_model(struct opts *o, char *served, size_t cap)
{
    int e;
    if (o->no_convert || !modelsrc_convertible(modelsrc_kind(o->model_dir, &e)))
        return modelsrc_check(o->model_dir, "--model-dir");
    char cache[4096], prog[4096];
    int rc;
    if (o->cache_dir)
        snprintf(cache, sizeof cache, "%s", o->cache_dir);
    else if ((rc = modelsrc_cache_dir_default(cache, sizeof cache)) < 0)
        return rc;
    if (o->convert_program)
        snprintf(prog, sizeof prog, "%s", o->convert_program);
    else if ((rc = modelsrc_find_clocher(prog, sizeof prog)) < 0)
        return rc;
    struct modelsrc_convert mc = {.program = prog, .src = o->model_dir, .cache_dir = cache,
                                  .dtype = o->convert_dtype, .cache_max_gb = o->cache_max_gb};
    /* held until exit (close-on-exec): no eviction removes the entry while this run reads it */
    static int served_hold = -1;
    if ((rc = modelsrc_convert(&mc, served, cap, &served_hold)) < 0)
        return rc;
    o->model_dir = served;
    return 0;
}

/* 0, EXIT_USAGE (message logged), -1 for --help or -2 for --version. */
static int parse_args(int argc, char **argv, struct opts *o)
{
    enum {
        O_MODEL = 256, O_PROMPT, O_PROMPTS_FILE, O_PROMPT_IDS, O_MAX_NEW, O_CTX, O_THREADS,
        O_GREEDY, O_TEMP, O_TOP_K, O_TOP_P, O_MIN_P, O_REPEAT, O_REPEAT_WINDOW, O_SEED, O_STOP,
        O_BATCH_INVARIANT,
        O_ROUNDS, O_WARMUP, O_PRINT_IDS, O_DUMP, O_NO_BOS, O_IGNORE_EOS, O_QUIET,
        O_CONCURRENCY, O_ADAPTER, O_ADAPTER_SCALE, O_LORA_WEIGHTS, O_VERSION, O_KV_DTYPE,
        O_NO_CONVERT, O_CACHE_DIR, O_CONVERT_DTYPE, O_CONVERT_PROGRAM,
        O_PIN, O_CACHE_MAX_GB,
    };
    static const struct option lopts[] = {
        {"model-dir", required_argument, NULL, O_MODEL},
        {"prompt", required_argument, NULL, O_PROMPT},
        {"prompts-file", required_argument, NULL, O_PROMPTS_FILE},
        {"prompt-ids", required_argument, NULL, O_PROMPT_IDS},
        {"max-new", required_argument, NULL, O_MAX_NEW},
        {"ctx", required_argument, NULL, O_CTX},
        {"threads", required_argument, NULL, O_THREADS},
        {"greedy", no_argument, NULL, O_GREEDY},
        {"temperature", required_argument, NULL, O_TEMP},
        {"top-k", required_argument, NULL, O_TOP_K},
        {"top-p", required_argument, NULL, O_TOP_P},
        {"min-p", required_argument, NULL, O_MIN_P},
        {"repeat-penalty", required_argument, NULL, O_REPEAT},
        {"repeat-window", required_argument, NULL, O_REPEAT_WINDOW},
        {"seed", required_argument, NULL, O_SEED},
        {"stop", required_argument, NULL, O_STOP},
        {"rounds", required_argument, NULL, O_ROUNDS},
        {"warmup", required_argument, NULL, O_WARMUP},
        {"print-ids", no_argument, NULL, O_PRINT_IDS},
        {"dump-logits", required_argument, NULL, O_DUMP},
        {"no-bos", no_argument, NULL, O_NO_BOS},
        {"ignore-eos", no_argument, NULL, O_IGNORE_EOS},
        {"batch-invariant", no_argument, NULL, O_BATCH_INVARIANT},
        {"quiet", no_argument, NULL, O_QUIET},
        {"concurrency", required_argument, NULL, O_CONCURRENCY},
        {"adapter", required_argument, NULL, O_ADAPTER},
        {"adapter-scale", required_argument, NULL, O_ADAPTER_SCALE},
        {"lora-weights", required_argument, NULL, O_LORA_WEIGHTS},
        {"kv-dtype", required_argument, NULL, O_KV_DTYPE},
        {"no-convert", no_argument, NULL, O_NO_CONVERT},
        {"cache-dir", required_argument, NULL, O_CACHE_DIR},
        {"cache-max-gb", required_argument, NULL, O_CACHE_MAX_GB},
        {"convert-dtype", required_argument, NULL, O_CONVERT_DTYPE},
        {"convert-program", required_argument, NULL, O_CONVERT_PROGRAM},
        {"pin", required_argument, NULL, O_PIN},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, O_VERSION},
        {NULL, 0, NULL, 0},
    };
    memset(o, 0, sizeof *o);
    sampler_params_default(&o->sp);
    o->max_new = DEFAULT_MAX_NEW;
    o->rounds = 1;
    o->adapter_scale = 1.0f;
    o->pin = "compact";
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads = ncpu < 1 ? 1 : ncpu > POOL_MAX_THREADS ? POOL_MAX_THREADS : (int)ncpu;
    bool greedy = false;
    uint32_t u;
    opterr = 0; /* our own messages */
    int c;
    while ((c = getopt_long(argc, argv, ":h", lopts, NULL)) != -1) {
        switch (c) {
        case 'h': return -1;
        case O_VERSION: return -2;
        case O_MODEL: o->model_dir = optarg; break;
        case O_NO_CONVERT: o->no_convert = true; break;
        case O_CACHE_DIR: o->cache_dir = optarg; break;
        case O_CACHE_MAX_GB: {
            char *e;
            o->cache_max_gb = strtod(optarg, &e);
            if (*e || e == optarg || !(o->cache_max_gb > 0) || o->cache_max_gb > 1e6) {
                fprintf(stderr, "inference-engine: --cache-max-gb %s: expected a number of "
                                "gigabytes above 0 (at most 1e6)\n", optarg);
                return EXIT_USAGE;
            }
            break;
        }
        case O_CONVERT_DTYPE: o->convert_dtype = optarg; break; /* the converter checks it */
        case O_CONVERT_PROGRAM: o->convert_program = optarg; break;
        case O_PROMPT: o->prompt = optarg; break;
        case O_PROMPTS_FILE: o->prompts_file = optarg; break;
        case O_PROMPT_IDS:
            if (o->n_prompt_ids == MAX_PROMPT_IDS) {
                LOG_ERR("--prompt-ids: given more than %d times", MAX_PROMPT_IDS);
                return EXIT_USAGE;
            }
            o->prompt_ids[o->n_prompt_ids++] = optarg;
            break;
        case O_MAX_NEW:
            if (!parse_u32("--max-new", optarg, 0, 1u << 24, &o->max_new))
                return EXIT_USAGE;
            break;
        case O_CTX:
            if (!parse_u32("--ctx", optarg, 1, UINT32_MAX, &o->ctx))
                return EXIT_USAGE;
            break;
        case O_THREADS:
            if (!parse_u32("--threads", optarg, 1, POOL_MAX_THREADS, &u))
                return EXIT_USAGE;
            o->threads = (int)u;
            break;
        case O_PIN: {
            enum pool_pin pin;
            if (pool_pin_parse(optarg, &pin) != 0) {
                LOG_ERR("--pin: '%s' is not none, compact or scatter", optarg);
                return EXIT_USAGE;
            }
            o->pin = optarg;
            break;
        }
        case O_GREEDY: greedy = true; break;
        case O_TEMP:
            if (!parse_float("--temperature", optarg, &o->sp.temperature))
                return EXIT_USAGE;
            break;
        case O_TOP_K:
            if (!parse_u32("--top-k", optarg, 0, UINT32_MAX, &o->sp.top_k))
                return EXIT_USAGE;
            break;
        case O_TOP_P:
            if (!parse_float("--top-p", optarg, &o->sp.top_p))
                return EXIT_USAGE;
            break;
        case O_MIN_P:
            if (!parse_float("--min-p", optarg, &o->sp.min_p))
                return EXIT_USAGE;
            break;
        case O_REPEAT:
            if (!parse_float("--repeat-penalty", optarg, &o->sp.repeat_penalty))
                return EXIT_USAGE;
            break;
        case O_REPEAT_WINDOW:
            if (!parse_u32("--repeat-window", optarg, 0, UINT32_MAX, &o->sp.repeat_window))
                return EXIT_USAGE;
            break;
        case O_SEED: {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (!*optarg || *end || errno || optarg[0] == '-') {
                LOG_ERR("--seed: '%s' is not an unsigned 64-bit integer", optarg);
                return EXIT_USAGE;
            }
            o->sp.seed = v;
            break;
        }
        case O_STOP:
            if (!*optarg) {
                LOG_ERR("--stop: the stop string is empty");
                return EXIT_USAGE;
            }
            if (o->n_stops == MAX_STOPS) {
                LOG_ERR("--stop: more than %d stop strings", MAX_STOPS);
                return EXIT_USAGE;
            }
            o->stops[o->n_stops++] = optarg;
            break;
        case O_KV_DTYPE:
            if (dtype_kv_from_name(optarg, &o->kv_dtype) != 0) {
                LOG_ERR("--kv-dtype: '%s' is not one of f32, f16, bf16, int8, fp8", optarg);
                return EXIT_USAGE;
            }
            o->kv_dtype_set = true;
            break;
        case O_ROUNDS:
            if (!parse_u32("--rounds", optarg, 1, 1000, &o->rounds))
                return EXIT_USAGE;
            break;
        case O_WARMUP:
            if (!parse_u32("--warmup", optarg, 0, 1000, &o->warmup))
                return EXIT_USAGE;
            break;
        case O_PRINT_IDS: o->print_ids = true; break;
        case O_DUMP: o->dump_logits = optarg; break;
        case O_NO_BOS: o->no_bos = true; break;
        case O_IGNORE_EOS: o->ignore_eos = true; break;
        case O_BATCH_INVARIANT: o->batch_invariant = true; break;
        case O_QUIET: o->quiet = true; break;
        case O_CONCURRENCY:
            if (!parse_u32("--concurrency", optarg, 1, 4096, &o->concurrency))
                return EXIT_USAGE;
            break;
        case O_ADAPTER:
            if (!strchr(optarg, '=') || optarg[0] == '=') {
                LOG_ERR("--adapter %s: expected NAME=DIR", optarg);
                return EXIT_USAGE;
            }
            o->adapter = optarg;
            break;
        case O_ADAPTER_SCALE:
            if (!parse_float("--adapter-scale", optarg, &o->adapter_scale))
                return EXIT_USAGE;
            break;
        case O_LORA_WEIGHTS:
            if (lora_pack_parse(optarg, &o->lora_weights) != 0)
                return EXIT_USAGE; /* logged, naming the value */
            break;
        case ':':
            LOG_ERR("%s needs a value", argv[optind - 1]);
            return EXIT_USAGE;
        default:
            LOG_ERR("unknown option '%s' (see --help)", argv[optind - 1]);
            return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        LOG_ERR("unexpected argument '%s' (see --help)", argv[optind]);
        return EXIT_USAGE;
    }
    if ((o->adapter || o->kv_dtype_set) && !o->concurrency)
        o->concurrency = 1;
    if (o->batch_invariant && !o->concurrency) /* the engine's mode: the reference has no batch */
        o->concurrency = 1;
    if (o->concurrency && o->dump_logits) {
        LOG_ERR("--dump-logits works on the reference path only: not with --concurrency or "
                "--adapter");
        return EXIT_USAGE;
    }
    if (!o->model_dir) {
        LOG_ERR("--model-dir DIR is required (see --help)");
        return EXIT_USAGE;
    }
    int n_inputs = !!o->prompt + !!o->prompts_file + !!o->n_prompt_ids;
    if (n_inputs != 1) {
        LOG_ERR("give exactly one of --prompt, --prompts-file, --prompt-ids (got %d)",
                n_inputs);
        return EXIT_USAGE;
    }
    if (greedy) {
        o->sp.temperature = 0.0f;
        o->sp.top_k = 0;
        o->sp.top_p = 1.0f;
        o->sp.min_p = 0.0f;
    }
    if (sampler_params_check(&o->sp))
        return EXIT_USAGE;
    return 0;
}

/* ---- prompts ----------------------------------------------------------------------------- */

struct prompt {
    int32_t *ids;
    size_t n;
};

struct prompts {
    struct prompt *v;
    size_t n, cap;
};

static void prompts_free(struct prompts *ps)
{
    for (size_t i = 0; i < ps->n; i++)
        free(ps->v[i].ids);
    free(ps->v);
}

/* Takes ownership of ids. */
static int prompts_add(struct prompts *ps, int32_t *ids, size_t n)
{
    if (ps->n == ps->cap) {
        size_t nc = ps->cap ? ps->cap * 2 : 4;
        struct prompt *nv = realloc(ps->v, nc * sizeof *nv);
        if (!nv) {
            free(ids);
            LOG_ERR("out of memory for %zu prompts", nc);
            return -ENOMEM;
        }
        ps->v = nv;
        ps->cap = nc;
    }
    ps->v[ps->n++] = (struct prompt){ids, n};
    return 0;
}

/* "1,2,3" -> ids; EXIT_USAGE on a malformed list (logged). */
static int parse_ids(const char *s, struct prompts *ps)
{
    size_t n = 1;
    for (const char *p = s; *p; p++)
        n += *p == ',';
    int32_t *ids = malloc(n * sizeof *ids);
    if (!ids) {
        LOG_ERR("out of memory for %zu prompt ids", n);
        return -ENOMEM;
    }
    const char *p = s;
    for (size_t i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long long v = (*p >= '0' && *p <= '9') ? strtoll(p, &end, 10) : -1;
        if (v < 0 || errno || v > INT32_MAX || (*end != ',' && *end != '\0')) {
            LOG_ERR("--prompt-ids: element %zu of '%s' is not a token id (a non-negative "
                    "integer; ids are separated by commas)",
                    i, s);
            free(ids);
            return EXIT_USAGE;
        }
        ids[i] = (int32_t)v;
        p = end + (*end == ',');
    }
    return prompts_add(ps, ids, n);
}

static int encode_text(const struct tok *tok, const char *text, size_t len, bool bos,
                       struct prompts *ps, const char *what)
{
    int32_t *ids;
    size_t n;
    int rc = tok_encode(tok, text, len, bos, &ids, &n);
    if (rc) {
        LOG_ERR("%s: cannot tokenize the prompt", what);
        return rc == -ENOMEM ? rc : EXIT_USAGE;
    }
    return prompts_add(ps, ids, n);
}

static int read_prompts_file(const char *path, const struct tok *tok, bool bos,
                             struct prompts *ps)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        LOG_ERR("--prompts-file %s: %s", path, strerror(errno));
        return EXIT_USAGE;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (cap - len < 65536) {
            if (cap >= PROMPTS_FILE_MAX) {
                LOG_ERR("--prompts-file %s: larger than %u bytes", path, PROMPTS_FILE_MAX);
                rc = EXIT_USAGE;
                goto out;
            }
            size_t nc = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, nc);
            if (!nb) {
                LOG_ERR("--prompts-file %s: out of memory", path);
                rc = -ENOMEM;
                goto out;
            }
            buf = nb;
            cap = nc;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                LOG_ERR("--prompts-file %s: read error", path);
                rc = EXIT_USAGE;
                goto out;
            }
            break;
        }
    }
    for (size_t at = 0, line = 1; at < len; line++) {
        char *nl = memchr(buf + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - buf) : len, n = end - at;
        if (n && buf[at + n - 1] == '\r')
            n--;
        if (n) {
            char what[64];
            snprintf(what, sizeof what, "--prompts-file line %zu", line);
            if ((rc = encode_text(tok, buf + at, n, bos, ps, what)))
                goto out;
        }
        at = end + 1;
    }
    if (ps->n == 0) {
        LOG_ERR("--prompts-file %s: no prompts (every line is blank)", path);
        rc = EXIT_USAGE;
    }
out:
    free(buf);
    fclose(f);
    return rc;
}

/* ---- measurement helpers ----------------------------------------------------------------- */


/* VmHWM of this process in MiB, or -1 when /proc is unavailable. */
static double rss_peak_mb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1.0;
    char line[256];
    double mb = -1.0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) {
            mb = (double)kb / 1024.0;
            break;
        }
    }
    fclose(f);
    return mb;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* q-quantile (nearest rank) of v[0..n) (sorted in place); 0 when empty. */
static double quantile(double *v, size_t n, double q)
{
    if (n == 0)
        return 0.0;
    qsort(v, n, sizeof *v, cmp_double);
    size_t rank = (size_t)ceil(q * (double)n);
    return v[rank ? rank - 1 : 0];
}

/* ---- the engine ------------------------------------------------------------------------- */

struct engine_ctx {
    const struct opts *o;
    struct model *model;
    struct tok *tok;
    struct forward *fwd;
    struct sampler *smp;
    struct sampler_stop stop;
    int32_t eos;              /* -1: none */
    float *logits;            /* [cap_rows][vocab] */
    size_t cap_rows;
    int32_t *hist;            /* [cap_hist] prompt + generated */
    size_t cap_hist;
    char *piece;              /* [tok_stream_max_out] */
    size_t piece_cap;
    FILE *dump;
};

enum finish { FIN_LENGTH, FIN_EOS, FIN_STOP, FIN_CONTEXT };
static const char *const finish_names[] = {"length", "eos", "stop", "context"};

struct run_out {
    size_t n_gen;             /* tokens sampled */
    enum finish finish;
    double wall_s, ttft_s, prefill_s, decode_s;
    double *itl;              /* [n_gen - 1] inter-token gaps, seconds (caller's buffer) */
    char *text;               /* emitted text (malloc'd, with a tokenizer), else NULL */
    size_t text_len, text_cap;
};

static int text_append(struct run_out *r, const char *s, size_t n, bool stream)
{
    if (stream && n) {
        fwrite(s, 1, n, stderr);
        fflush(stderr);
    }
    if (r->text_len + n + 1 > r->text_cap) {
        size_t nc = r->text_cap ? r->text_cap : 256;
        while (nc < r->text_len + n + 1)
            nc *= 2;
        char *nb = realloc(r->text, nc);
        if (!nb) {
            LOG_ERR("out of memory for %zu bytes of generated text", nc);
            return -ENOMEM;
        }
        r->text = nb;
        r->text_cap = nc;
    }
    memcpy(r->text + r->text_len, s, n);
    r->text_len += n;
    r->text[r->text_len] = '\0';
    return 0;
}

/* Decodes a sampled token and runs it through the stop strings; *stopped when one matched. */
static int emit_token(struct engine_ctx *E, struct tok_stream *ts, int32_t id, struct run_out *r,
                      bool stream, bool *stopped)
{
    *stopped = false;
    if ((uint32_t)id >= tok_vocab_size(E->tok))
        return 0; /* a padding row of a model whose vocabulary exceeds the tokenizer's */
    size_t n;
    int rc = tok_stream_push(ts, id, E->piece, E->piece_cap, &n);
    if (rc)
        return rc;
    const char *emit;
    size_t n_emit;
    if ((rc = sampler_stop_push(&E->stop, E->piece, n, &emit, &n_emit, stopped)))
        return rc;
    return text_append(r, emit, n_emit, stream);
}

/* End of a generation without a stop string: what the stream and the stop matcher hold. */
static int flush_text(struct engine_ctx *E, struct tok_stream *ts, struct run_out *r,
                      bool stream)
{
    size_t n;
    int rc = tok_stream_flush(ts, E->piece, E->piece_cap, &n);
    if (rc)
        return rc;
    const char *emit;
    size_t n_emit;
    bool stopped;
    if ((rc = sampler_stop_push(&E->stop, E->piece, n, &emit, &n_emit, &stopped)) ||
        (rc = text_append(r, emit, n_emit, stream)))
        return rc;
    if (!stopped) {
        sampler_stop_flush(&E->stop, &emit, &n_emit);
        rc = text_append(r, emit, n_emit, stream);
    }
    return rc;
}

/* Writes rows [n][vocab] of logits to the dump file; EXIT_FAIL on error (logged). */
static int dump_rows(struct engine_ctx *E, const float *rows, size_t n)
{
    size_t vocab = E->model->hp.vocab_size;
    if (fwrite(rows, sizeof(float), n * vocab, E->dump) != n * vocab) {
        LOG_ERR("--dump-logits %s: write failed: %s", E->o->dump_logits, strerror(errno));
        return EXIT_FAIL;
    }
    return 0;
}

/*
 * One generation for prompt p. `measured_first`: stream the text and write the dump in this
 * run. r->itl and E->hist have room for every token the context allows (max_gen in
 * run_prompt). Returns 0 or a negative code / EXIT_*.
 */
static int run_one(struct engine_ctx *E, const struct prompt *p, bool measured_first,
                   struct run_out *r)
{
    const struct opts *o = E->o;
    const size_t vocab = E->model->hp.vocab_size;
    const bool stream = measured_first && E->tok && !o->quiet;
    FILE *dump = measured_first ? E->dump : NULL;
    int rc;

    r->n_gen = 0;
    r->finish = FIN_LENGTH;
    r->text_len = 0;
    if (r->text)
        r->text[0] = '\0';
    (void)forward_truncate(E->fwd, 0); /* 0 is always a valid prefix */
    sampler_reset(E->smp);
    sampler_stop_reset(&E->stop);
    struct tok_stream ts;
    if (E->tok) {
        tok_stream_init(&ts, E->tok);
        ts.at_start = false; /* the text continues the prompt: keep its leading space */
    }
    memcpy(E->hist, p->ids, p->n * sizeof *p->ids);
    size_t n_hist = p->n;

    /* prefill: every row when dumping, else the last one */
    const double t0 = mono_sec();
    if ((rc = forward_eval(E->fwd, p->ids, p->n, dump ? FORWARD_LOGITS_ALL : FORWARD_LOGITS_LAST,
                           E->logits)))
        return rc;
    const float *logits = dump ? E->logits + (p->n - 1) * vocab : E->logits;
    const double t_pf = mono_sec();
    if (dump && (rc = dump_rows(E, E->logits, p->n)))
        return rc;
    double t_prev = t_pf, t_first = t_pf;

    for (uint32_t i = 0; i < o->max_new; i++) {
        int32_t id = sampler_sample(E->smp, logits, E->hist, n_hist);
        if (id < 0)
            return id; /* non-finite logits: the sampler logged it */
        double t = mono_sec();
        if (i == 0)
            t_first = t;
        else
            r->itl[i - 1] = t - t_prev;
        t_prev = t;
        E->hist[n_hist++] = id;
        r->n_gen++;
        if (id == E->eos && !o->ignore_eos) {
            r->finish = FIN_EOS;
            break;
        }
        if (E->tok) {
            bool stopped;
            if ((rc = emit_token(E, &ts, id, r, stream, &stopped)))
                return rc;
            if (stopped) {
                r->finish = FIN_STOP;
                break;
            }
        }
        if (i + 1 == o->max_new)
            break;
        if (forward_pos(E->fwd) == forward_max_seq(E->fwd)) {
            r->finish = FIN_CONTEXT;
            break;
        }
        if ((rc = forward_eval(E->fwd, &id, 1, FORWARD_LOGITS_LAST, E->logits)))
            return rc;
        logits = E->logits;
        if (dump && (rc = dump_rows(E, E->logits, 1)))
            return rc;
    }
    const double t_end = r->n_gen ? t_prev : t_pf;
    if (E->tok && r->finish != FIN_STOP && (rc = flush_text(E, &ts, r, stream)))
        return rc;
    if (stream)
        fputc('\n', stderr);
    r->wall_s = t_end - t0;
    r->ttft_s = r->n_gen ? t_first - t0 : 0.0;
    r->prefill_s = t_pf - t0;
    r->decode_s = r->n_gen > 1 ? t_end - t_first : 0.0;
    return 0;
}

/* Exit code for a failure code from the engine's calls. */
static int exit_for(int rc, int otherwise)
{
    if (rc == -ENOMEM)
        return EXIT_NOMEM;
    if (rc > 0)
        return rc; /* already an EXIT_* */
    return otherwise;
}

static int json_set(json_t *obj, const char *key, json_t *v)
{
    if (!v || json_object_set_new(obj, key, v)) {
        LOG_ERR("out of memory building the JSON report");
        return -ENOMEM;
    }
    return 0;
}

/*
 * A mixture-of-experts model's fields (gpt_oss): "arch", "n_experts", "n_experts_used" and
 * "active_expert_bytes_per_token", the expert weight bytes one token reads (n_experts_used
 * experts' gate, up and down in every layer; the biases aside). Nothing for a dense model.
 */
static int json_moe_fields(json_t *j, const struct model *m)
{
    if (!m->moe)
        return 0;
    uint64_t bytes = 0;
    for (uint32_t l = 0; l < m->hp.n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        bytes += (uint64_t)m->hp.n_experts_used *
                 ((uint64_t)L->gate_exps[0].rows * L->gate_exps[0].row_bytes +
                  (uint64_t)L->up_exps[0].rows * L->up_exps[0].row_bytes +
                  (uint64_t)L->down_exps[0].rows * L->down_exps[0].row_bytes);
    }
    int rc;
    if ((rc = json_set(j, "arch", json_string(m->im->arch))) ||
        (rc = json_set(j, "n_experts", json_integer(m->hp.n_experts))) ||
        (rc = json_set(j, "n_experts_used", json_integer(m->hp.n_experts_used))) ||
        (rc = json_set(j, "active_expert_bytes_per_token", json_integer((json_int_t)bytes))))
        return rc;
    return 0;
}

/* ---- the serving engine: --concurrency ---------------------------------------------------- */

struct conc_req {
    bool done;
    int error;
    enum engine_finish reason;
    uint32_t prompt_tokens, generated;
    double ttft_ms, tpot_ms, e2e_ms;
    int32_t *ids;             /* [n_ids] generated tokens, kept for --print-ids */
    size_t n_ids, cap_ids;
    bool keep_ids;
};

static void conc_event(const struct engine_event *ev, void *ud)
{
    (void)ud;
    struct conc_req *r = ev->user;
    if (ev->kind == ENGINE_EV_TOKEN && ev->token >= 0 && r->keep_ids) {
        if (r->n_ids == r->cap_ids) {
            size_t cap = r->cap_ids ? 2 * r->cap_ids : 64;
            int32_t *p = realloc(r->ids, cap * sizeof *p);
            if (!p) {
                r->error = -ENOMEM;
                return;
            }
            r->ids = p, r->cap_ids = cap;
        }
        r->ids[r->n_ids++] = ev->token;
    } else if (ev->kind == ENGINE_EV_ERROR) {
        r->error = ev->code;
        LOG_ERR("request %llu failed: %s", (unsigned long long)ev->id,
                ev->message ? ev->message : "?");
    } else if (ev->kind == ENGINE_EV_FINISH) {
        r->done = true;
        r->reason = ev->reason;
        r->prompt_tokens = ev->prompt_tokens;
        r->generated = ev->generated_tokens;
        r->ttft_ms = ev->ttft_ms;
        r->tpot_ms = ev->tpot_ms;
        r->e2e_ms = ev->e2e_ms;
    }
}

/* One JSON line per measured round of N concurrent requests through the engine. */
static int run_concurrent(const struct opts *o, const struct prompts *ps, double load_ms)
{
    const uint32_t N = o->concurrency;
    struct engine_config ec = {
        .model_dir = o->model_dir,
        .n_threads = o->threads,
        .pin = serve_pin_prepare((unsigned)o->threads, o->pin),
        .kv_dtype = o->kv_dtype,
        .max_step_tokens = N > 256 ? N : 256,
        .max_running = N,
        .max_queue = N,
        .prefix_cache = true,
        .lora_pack = (int)o->lora_weights,
    };
    struct engine *e = NULL;
    struct conc_req *reqs = calloc(N, sizeof *reqs);
    double *v = malloc(N * sizeof *v);
    char *aname = NULL;
    int rc;
    if (!reqs || !v) {
        LOG_ERR("out of memory for %u requests", N);
        rc = -ENOMEM;
        goto out;
    }
    const double t_load = mono_sec();
    if ((rc = engine_create(&ec, conc_event, NULL, &e))) {
        rc = exit_for(rc, rc == ERR_RANGE ? EXIT_USAGE : EXIT_MODEL);
        goto out;
    }
    if (o->adapter) {
        const char *eq = strchr(o->adapter, '=');
        if (!(aname = strndup(o->adapter, (size_t)(eq - o->adapter)))) {
            rc = -ENOMEM;
            goto out;
        }
        if ((rc = engine_load_adapter(e, aname, eq + 1))) {
            rc = exit_for(rc, EXIT_USAGE);
            goto out;
        }
    }
    load_ms += (mono_sec() - t_load) * 1e3;
    const char *const *stops = o->n_stops ? o->stops : NULL;
    for (uint32_t round = 0; round < o->warmup + o->rounds; round++) {
        struct engine_metrics m0, m1;
        engine_get_metrics(e, &m0);
        for (uint32_t i = 0; i < N; i++) {
            free(reqs[i].ids);
            reqs[i] = (struct conc_req){.keep_ids = o->print_ids};
        }
        const double t0 = mono_sec();
        for (uint32_t i = 0; i < N; i++) {
            const struct prompt *p = &ps->v[i % ps->n];
            struct engine_request r = {
                .prompt = p->ids, .n_prompt = p->n, .max_new = o->max_new,
                .temperature = o->sp.temperature, .top_p = o->sp.top_p, .min_p = o->sp.min_p,
                .repeat_penalty = o->sp.repeat_penalty, .top_k = o->sp.top_k,
                .repeat_window = o->sp.repeat_window, .seed = o->sp.seed + i,
                .stop = stops, .n_stop = o->n_stops, .adapter = aname,
                .adapter_scale = o->adapter_scale, .priority = ENGINE_PRIO_NORMAL,
                .user = &reqs[i], .ignore_eos = o->ignore_eos,
                .batch_invariant = o->batch_invariant,
            };
            uint64_t id;
            if ((rc = engine_submit(e, &r, &id))) {
                rc = exit_for(rc, EXIT_USAGE);
                goto out;
            }
        }
        size_t active = 1;
        while (active)
            if ((rc = engine_step(e, &active))) {
                rc = exit_for(rc, EXIT_FAIL);
                goto out;
            }
        const double wall = mono_sec() - t0;
        engine_get_metrics(e, &m1);
        if (round < o->warmup)
            continue;
        uint64_t gen = 0, prompt = 0;
        for (uint32_t i = 0; i < N; i++) {
            if (reqs[i].error) {
                rc = EXIT_FAIL;
                goto out;
            }
            gen += reqs[i].generated;
            prompt += reqs[i].prompt_tokens;
        }
        json_t *j = json_object();
        if (!j) {
            rc = -ENOMEM;
            goto out;
        }
        double q[6];
        for (int k = 0; k < 3; k++) {
            for (uint32_t i = 0; i < N; i++)
                v[i] = k == 0 ? reqs[i].ttft_ms : k == 1 ? reqs[i].e2e_ms : reqs[i].tpot_ms;
            q[2 * k] = quantile(v, N, 0.50);
            q[2 * k + 1] = quantile(v, N, 0.95);
        }
        if ((rc = json_set(j, "model", json_string(o->model_dir))) ||
            (rc = json_set(j, "concurrency", json_integer(N))) ||
            (rc = json_set(j, "round", json_integer(round - o->warmup))) ||
            (rc = json_set(j, "prompt_tokens", json_integer((json_int_t)prompt))) ||
            (rc = json_set(j, "generated_tokens", json_integer((json_int_t)gen))) ||
            (rc = json_set(j, "wall_s", json_real(wall))) ||
            (rc = json_set(j, "tps", json_real(wall > 0 ? (double)gen / wall : 0))) ||
            (rc = json_set(j, "ttft_p50_ms", json_real(q[0]))) ||
            (rc = json_set(j, "ttft_p95_ms", json_real(q[1]))) ||
            (rc = json_set(j, "e2e_p50_ms", json_real(q[2]))) ||
            (rc = json_set(j, "e2e_p95_ms", json_real(q[3]))) ||
            (rc = json_set(j, "p50_ms", json_real(q[4]))) ||
            (rc = json_set(j, "p95_ms", json_real(q[5]))) ||
            (rc = json_set(j, "kv_hits", json_integer((json_int_t)(m1.prefix_hit_tokens -
                                                                  m0.prefix_hit_tokens)))) ||
            (rc = json_set(j, "kv_misses", json_integer((json_int_t)(m1.prefix_miss_tokens -
                                                                    m0.prefix_miss_tokens)))) ||
            (rc = json_set(j, "preemptions",
                           json_integer((json_int_t)(m1.preemptions - m0.preemptions)))) ||
            (rc = json_set(j, "load_ms", json_real(load_ms))) ||
            (rc = json_set(j, "rss_peak_mb", json_real(rss_peak_mb()))) ||
            (rc = json_set(j, "threads", json_integer(o->threads))) ||
            (rc = json_set(j, "isa", json_string(kern_isa_name(kern_isa())))) ||
            (rc = json_moe_fields(j, engine_model(e)))) {
            json_decref(j);
            goto out;
        }
        if (o->print_ids) {
            /* one array per request, in submission order */
            json_t *all = json_array();
            for (uint32_t i = 0; all && i < N; i++) {
                json_t *one = json_array();
                for (size_t k = 0; one && k < reqs[i].n_ids; k++)
                    json_array_append_new(one, json_integer(reqs[i].ids[k]));
                if (!one || json_array_append_new(all, one) < 0) {
                    json_decref(all);
                    all = NULL;
                }
            }
            if (!all || (rc = json_set(j, "generated_ids", all))) {
                json_decref(j);
                rc = -ENOMEM;
                goto out;
            }
        }
        char *line = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        if (!line) {
            rc = -ENOMEM;
            goto out;
        }
        printf("%s\n", line);
        fflush(stdout);
        free(line);
    }
    rc = 0;
out:
    engine_destroy(e);
    free(aname);
    for (uint32_t i = 0; reqs && i < N; i++)
        free(reqs[i].ids);
    free(reqs);
    free(v);
    return rc;
}

/* Runs warmup + rounds for prompt `idx` and prints its JSON line. */
static int run_prompt(struct engine_ctx *E, size_t idx, const struct prompt *p, bool indexed,
                      double load_ms, int threads)
{
    const struct opts *o = E->o;
    const uint32_t S = forward_max_seq(E->fwd);
    if (p->n == 0) {
        LOG_ERR("prompt %zu is empty (no tokens)", idx);
        return EXIT_USAGE;
    }
    if (p->n > S) {
        LOG_ERR("prompt %zu has %zu tokens: more than the context of %u positions", idx, p->n,
                S);
        return EXIT_USAGE;
    }
    for (size_t i = 0; i < p->n; i++)
        if (p->ids[i] < 0 || (uint32_t)p->ids[i] >= E->model->hp.vocab_size) {
            LOG_ERR("prompt %zu: token %zu: id %d is outside the model's vocabulary of %u", idx,
                    i, (int)p->ids[i], E->model->hp.vocab_size);
            return EXIT_USAGE;
        }

    int rc = 0;
    const size_t vocab = E->model->hp.vocab_size;
    size_t rows = E->dump ? p->n : 1;
    if (rows > E->cap_rows) {
        float *nl = realloc(E->logits, rows * vocab * sizeof *nl);
        if (!nl) {
            LOG_ERR("out of memory for %zu x %zu logits", rows, vocab);
            return -ENOMEM;
        }
        E->logits = nl;
        E->cap_rows = rows;
    }
    /* at most one token per free position, plus the last (sampled, never fed back) */
    const size_t max_gen = o->max_new < (size_t)S - p->n + 1 ? o->max_new : (size_t)S - p->n + 1;
    if (p->n + max_gen > E->cap_hist) {
        int32_t *nh = realloc(E->hist, (p->n + max_gen) * sizeof *nh);
        if (!nh) {
            LOG_ERR("out of memory for a history of %zu tokens", p->n + max_gen);
            return -ENOMEM;
        }
        E->hist = nh;
        E->cap_hist = p->n + max_gen;
    }
    struct run_out r = {0};
    size_t n_itl = (size_t)o->rounds * (max_gen ? max_gen : 1);
    double *itl_all = malloc(n_itl * sizeof *itl_all);
    double *walls = malloc(o->rounds * sizeof *walls), *ttfts = malloc(o->rounds * sizeof *ttfts);
    r.itl = malloc((max_gen ? max_gen : 1) * sizeof *r.itl);
    json_t *j = json_object(), *ids = NULL;
    if (!itl_all || !walls || !ttfts || !r.itl || !j) {
        LOG_ERR("out of memory for the measurements of %u rounds", o->rounds);
        rc = -ENOMEM;
        goto out;
    }
    for (uint32_t w = 0; w < o->warmup; w++)
        if ((rc = run_one(E, p, false, &r)))
            goto out;
    size_t k_itl = 0;
    double sum_wall = 0, sum_gen = 0, sum_prefill = 0, sum_decode = 0, sum_decode_tok = 0;
    for (uint32_t k = 0; k < o->rounds; k++) {
        if ((rc = run_one(E, p, k == 0, &r)))
            goto out;
        walls[k] = r.wall_s;
        ttfts[k] = r.ttft_s;
        sum_wall += r.wall_s;
        sum_gen += (double)r.n_gen;
        sum_prefill += r.prefill_s;
        sum_decode += r.decode_s;
        sum_decode_tok += r.n_gen > 1 ? (double)(r.n_gen - 1) : 0.0;
        for (size_t i = 0; i + 1 < r.n_gen; i++)
            itl_all[k_itl++] = r.itl[i];
    }

    const char *name = E->model->im->name && *E->model->im->name ? E->model->im->name
                                                                   : o->model_dir;
    double rounds = (double)o->rounds;
    if ((indexed && (rc = json_set(j, "index", json_integer((json_int_t)idx)))) ||
        (rc = json_set(j, "model", json_string(name))) ||
        (rc = json_set(j, "prompt_tokens", json_integer((json_int_t)p->n))) ||
        (rc = json_set(j, "generated_tokens", json_integer((json_int_t)r.n_gen))) ||
        (rc = json_set(j, "finish", json_string(finish_names[r.finish]))) ||
        (rc = json_set(j, "rounds", json_integer(o->rounds))) ||
        (rc = json_set(j, "wall_s", json_real(quantile(walls, o->rounds, 0.5)))) ||
        (rc = json_set(j, "tps", json_real(sum_wall > 0 ? sum_gen / sum_wall : 0.0))) ||
        (rc = json_set(j, "prefill_tps",
                       json_real(sum_prefill > 0 ? (double)p->n * rounds / sum_prefill : 0.0))) ||
        (rc = json_set(j, "decode_tps",
                       json_real(sum_decode > 0 ? sum_decode_tok / sum_decode : 0.0))) ||
        (rc = json_set(j, "ttft_ms", json_real(1e3 * quantile(ttfts, o->rounds, 0.5)))) ||
        (rc = json_set(j, "p50_ms", json_real(1e3 * quantile(itl_all, k_itl, 0.5)))) ||
        (rc = json_set(j, "p95_ms", json_real(1e3 * quantile(itl_all, k_itl, 0.95)))) ||
        (rc = json_set(j, "load_ms", json_real(load_ms))) ||
        (rc = json_set(j, "rss_peak_mb", json_real(rss_peak_mb()))) ||
        (rc = json_set(j, "threads", json_integer(threads))) ||
        (rc = json_set(j, "kv_hits", json_integer(0))) ||
        (rc = json_set(j, "kv_misses", json_integer(0))) ||
        (rc = json_set(j, "isa", json_string(kern_isa_name(kern_isa())))) ||
        (rc = json_moe_fields(j, E->model)))
        goto out;
    if (o->print_ids) {
        if ((rc = json_set(j, "generated_ids", ids = json_array())))
            goto out;
        for (size_t i = 0; i < r.n_gen; i++)
            if (json_array_append_new(ids, json_integer(E->hist[p->n + i]))) {
                LOG_ERR("out of memory building the JSON report");
                rc = -ENOMEM;
                goto out;
            }
        json_t *text = E->tok ? json_stringn(r.text ? r.text : "", r.text_len) : json_null();
        if ((rc = json_set(j, "text", text)))
            goto out;
    }
    char *line = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
    if (!line) {
        LOG_ERR("out of memory printing the JSON report");
        rc = -ENOMEM;
        goto out;
    }
    printf("%s\n", line);
    fflush(stdout);
    free(line);
out:
    json_decref(j);
    free(r.itl);
    free(r.text);
    free(itl_all);
    free(walls);
    free(ttfts);
    return rc;
}

int main(int argc, char **argv)
{
    log_set_ident("inference-engine");
    struct opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc == -1) {
        usage(stdout);
        return EXIT_OK;
    }
    if (rc == -2) {
        printf("inference-engine %s\n", CLOCHER_VERSION);
        return EXIT_OK;
    }
    if (rc)
        return rc;
    /* a Hugging Face folder or a GGUF: converted once into the cache, or with --no-convert
     * refused naming the `clocher convert` command (not "cannot open the manifest") */
    char served[4096];
    if ((rc = resolve_model(&o, served, sizeof served)) < 0)
        return rc == ERR_CANCELLED ? EXIT_OK : EXIT_MODEL;

    struct engine_ctx E = {.o = &o, .eos = -1};
    struct prompts ps = {0};
    struct pool *pool = NULL;
    int code = EXIT_OK;

    if (kern_init()) {
        code = EXIT_ENGINE;
        goto out;
    }
    const double t_load = mono_sec();
    if ((rc = model_open(o.model_dir, 0, &E.model))) {
        code = exit_for(rc, EXIT_MODEL);
        goto out;
    }
    /* 2 MiB page-table entries for the weights (IE_HUGE_PAGES=0: off; hotrepl.h): a cache
     * warmed in 4 KiB folios is re-read once, here; the engine's own mapping (--concurrency)
     * then maps the same 2 MiB folios. The repacked matrices' stored rows stay out of the
     * mapping (model_release_stored_rows: the weights resident once) */
    struct hotrepl_huge_report huge;
    const enum log_level lv = log_get_level();
    if (o.quiet && lv > LOG_LEVEL_WARN) /* --quiet: stderr holds warnings and errors only */
        log_set_level(LOG_LEVEL_WARN);
    rc = hotrepl_hugify_default_model(o.model_dir, E.model, &huge);
    log_set_level(lv);
    if (rc) {
        code = EXIT_USAGE;
        goto out;
    }
    const struct iebin_hparams *hp = &E.model->hp;
    if (E.model->im->tokenizer_path) {
        if ((rc = tok_load(E.model->im->tokenizer_path, &E.tok))) {
            code = exit_for(rc, EXIT_MODEL);
            goto out;
        }
        if (tok_vocab_size(E.tok) > hp->vocab_size) {
            LOG_ERR("%s: the tokenizer has %u tokens, more than the model's vocab_size %u",
                    E.model->im->tokenizer_path, tok_vocab_size(E.tok), hp->vocab_size);
            code = EXIT_MODEL;
            goto out;
        }
        E.eos = tok_eos(E.tok);
    }
    const double load_ms = (mono_sec() - t_load) * 1e3;

    /* prompts */
    if (!E.tok && (o.prompt || o.prompts_file || o.n_stops)) {
        LOG_ERR("%s: the model has no tokenizer: give the prompt as --prompt-ids (and no "
                "--stop strings)",
                o.model_dir);
        code = EXIT_USAGE;
        goto out;
    }
    bool bos = E.tok && !o.no_bos && tok_add_bos(E.tok);
    rc = 0;
    if (o.n_prompt_ids)
        for (size_t i = 0; i < o.n_prompt_ids && !rc; i++)
            rc = parse_ids(o.prompt_ids[i], &ps);
    else if (o.prompt)
        rc = encode_text(E.tok, o.prompt, strlen(o.prompt), bos, &ps, "--prompt");
    else
        rc = read_prompts_file(o.prompts_file, E.tok, bos, &ps);
    if (rc) {
        code = exit_for(rc, EXIT_USAGE);
        goto out;
    }

    if (o.concurrency) {
        /* the engine opens its own model (and panels): this one would be a second copy */
        model_close(E.model);
        E.model = NULL;
        if ((rc = run_concurrent(&o, &ps, load_ms)))
            code = exit_for(rc, EXIT_FAIL);
        goto out;
    }

    /* engine */
    enum pool_pin pin = POOL_PIN_NONE;
    (void)pool_pin_parse(serve_pin_prepare((unsigned)o.threads, o.pin), &pin); /* a valid name */
    if (o.threads > 1 && (rc = pool_create(o.threads, pin, &pool))) {
        code = exit_for(rc, EXIT_ENGINE);
        goto out;
    }
    if (o.ctx > hp->max_seq_len) {
        LOG_ERR("--ctx %u exceeds the model's context length %u", o.ctx, hp->max_seq_len);
        code = EXIT_USAGE;
        goto out;
    }
    struct forward_config fc = {.max_seq = o.ctx, .pool = pool};
    if ((rc = forward_create(E.model, &fc, &E.fwd)) ||
        (rc = sampler_create(&o.sp, hp->vocab_size, &E.smp)) ||
        (rc = sampler_stop_init(&E.stop, o.stops, o.n_stops))) {
        code = exit_for(rc, EXIT_ENGINE);
        goto out;
    }
    if (E.tok) {
        E.piece_cap = tok_stream_max_out(E.tok);
        if (!(E.piece = malloc(E.piece_cap))) {
            LOG_ERR("out of memory");
            code = EXIT_NOMEM;
            goto out;
        }
    }
    if (o.dump_logits && !(E.dump = fopen(o.dump_logits, "wb"))) {
        LOG_ERR("--dump-logits %s: %s", o.dump_logits, strerror(errno));
        code = EXIT_FAIL;
        goto out;
    }

    for (size_t i = 0; i < ps.n; i++)
        if ((rc = run_prompt(&E, i, &ps.v[i], o.prompts_file != NULL, load_ms,
                             pool ? pool_threads(pool) : 1))) {
            code = exit_for(rc, EXIT_FAIL);
            goto out;
        }
    if (E.dump && fclose(E.dump)) {
        E.dump = NULL;
        LOG_ERR("--dump-logits %s: %s", o.dump_logits, strerror(errno));
        code = EXIT_FAIL;
    }
    E.dump = NULL;
out:
    if (E.dump)
        fclose(E.dump);
    free(E.piece);
    free(E.hist);
    free(E.logits);
    sampler_stop_fini(&E.stop);
    sampler_destroy(E.smp);
    forward_destroy(E.fwd);
    pool_destroy(pool);
    prompts_free(&ps);
    tok_free(E.tok);
    model_close(E.model);
    return code;
}
