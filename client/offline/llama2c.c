/*
 * llama2c.c — llama2.c checkpoint → IEBIN importer (see llama2c.h for the checkpoint layout).
 *
 * The checkpoint is untrusted: the header is validated and the file's exact size must match
 * what the header implies (computed with overflow checks) before anything is mapped or
 * written. Tensors are then streamed layer by layer from a read-only mapping into the IEBIN
 * writer, converted to f16/bf16 in small chunks when asked (never a second copy of the model
 * in memory).
 */
#include "llama2c.h"

#include "err.h"
#include "half.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "llama2.c checkpoints are little-endian; this importer reads them in place"
#endif

#define HEADER_BYTES 28

/* Where each tensor starts, in floats after the header, and the file size they imply. */
struct layout {
    int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
    uint64_t kv_dim, head_size, vocab;
    uint64_t emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq, wcls;
    uint64_t n_floats;   /* after the header */
    uint64_t file_bytes; /* header included */
};

/* Appends a block of n floats at the running offset: its start in *at, the cursor advanced. */
static int place(uint64_t *cursor, uint64_t *at, uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t n;
    if (dtype_mul_u64(a, b, &n) != 0 || dtype_mul_u64(n, c, &n) != 0)
        return ERR_OVERFLOW;
    *at = *cursor;
    return dtype_add_u64(*cursor, n, cursor);
}

static int read_layout(const char *path, int fd, struct layout *lo, struct iebin_hparams *hp)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        LOG_ERR("%s: fstat failed: %s", path, strerror(e));
        return -e;
    }
    if (!S_ISREG(st.st_mode)) {
        LOG_ERR("%s: not a regular file", path);
        return ERR_FORMAT;
    }
    if (st.st_size < HEADER_BYTES) {
        LOG_ERR("%s: %lld bytes, too short for the %d-byte llama2.c header (truncated)", path,
                (long long)st.st_size, HEADER_BYTES);
        return ERR_TRUNCATED;
    }
    int32_t h[7];
    ssize_t r;
    do
        r = pread(fd, h, sizeof h, 0);
    while (r < 0 && errno == EINTR);
    if (r != (ssize_t)sizeof h) {
        int e = r < 0 ? errno : EIO;
        LOG_ERR("%s: cannot read the header: %s", path, strerror(e));
        return -e;
    }
    static const char *const names[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                         "n_kv_heads", "vocab_size", "seq_len"};
    for (int i = 0; i < 7; i++) {
        /* vocab_size's sign is a flag; INT32_MIN has no positive counterpart */
        bool bad = i == 5 ? (h[i] == 0 || h[i] == INT32_MIN) : h[i] <= 0;
        if (bad) {
            LOG_ERR("%s: header: %s is %d, must be %s", path, names[i], h[i],
                    i == 5 ? "non-zero" : "> 0");
            return ERR_RANGE;
        }
    }
    memset(lo, 0, sizeof *lo);
    lo->dim = h[0], lo->hidden_dim = h[1], lo->n_layers = h[2], lo->n_heads = h[3];
    lo->n_kv_heads = h[4], lo->vocab_size = h[5], lo->seq_len = h[6];
    if (lo->dim % lo->n_heads != 0) {
        LOG_ERR("%s: header: dim %d is not a multiple of n_heads %d", path, lo->dim,
                lo->n_heads);
        return ERR_RANGE;
    }
    if (lo->n_kv_heads > lo->n_heads || lo->n_heads % lo->n_kv_heads != 0) {
        LOG_ERR("%s: header: n_heads %d is not a multiple of n_kv_heads %d", path, lo->n_heads,
                lo->n_kv_heads);
        return ERR_RANGE;
    }
    lo->vocab = (uint64_t)(lo->vocab_size < 0 ? -(int64_t)lo->vocab_size : lo->vocab_size);
    lo->head_size = (uint64_t)(lo->dim / lo->n_heads);
    lo->kv_dim = lo->head_size * (uint64_t)lo->n_kv_heads;

    memset(hp, 0, sizeof *hp);
    hp->dim = (uint32_t)lo->dim;
    hp->n_layers = (uint32_t)lo->n_layers;
    hp->n_heads = (uint32_t)lo->n_heads;
    hp->n_kv_heads = (uint32_t)lo->n_kv_heads;
    hp->head_dim = (uint32_t)lo->head_size;
    hp->ffn_dim = (uint32_t)lo->hidden_dim;
    hp->vocab_size = (uint32_t)lo->vocab;
    hp->max_seq_len = (uint32_t)lo->seq_len;
    hp->rope_theta = LLAMA2C_ROPE_THETA;
    hp->rms_eps = LLAMA2C_RMS_EPS;
    hp->tied_embeddings = lo->vocab_size > 0;
    char what[4200];
    snprintf(what, sizeof what, "%s (llama2.c header)", path);
    int rc = iebin_check_hparams(hp, what); /* also bounds every product below */
    if (rc != 0)
        return rc;

    uint64_t c = 0, L = (uint64_t)lo->n_layers, d = (uint64_t)lo->dim;
    uint64_t hid = (uint64_t)lo->hidden_dim;
    rc = place(&c, &lo->emb, lo->vocab, d, 1);
    rc = rc ? rc : place(&c, &lo->rms_att, L, d, 1);
    rc = rc ? rc : place(&c, &lo->wq, L, d, d);
    rc = rc ? rc : place(&c, &lo->wk, L, lo->kv_dim, d);
    rc = rc ? rc : place(&c, &lo->wv, L, lo->kv_dim, d);
    rc = rc ? rc : place(&c, &lo->wo, L, d, d);
    rc = rc ? rc : place(&c, &lo->rms_ffn, L, d, 1);
    rc = rc ? rc : place(&c, &lo->w1, L, hid, d);
    rc = rc ? rc : place(&c, &lo->w2, L, d, hid);
    rc = rc ? rc : place(&c, &lo->w3, L, hid, d);
    rc = rc ? rc : place(&c, &lo->rms_final, d, 1, 1);
    /* freq_cis_real then freq_cis_imag, seq_len*head_size/2 each (head_size is even) */
    rc = rc ? rc : place(&c, &lo->freq, (uint64_t)lo->seq_len, lo->head_size, 1);
    if (lo->vocab_size < 0)
        rc = rc ? rc : place(&c, &lo->wcls, lo->vocab, d, 1);
    uint64_t bytes;
    rc = rc ? rc : dtype_mul_u64(c, 4, &bytes);
    rc = rc ? rc : dtype_add_u64(bytes, HEADER_BYTES, &bytes);
    if (rc != 0) {
        LOG_ERR("%s: header: the tensor sizes overflow 64 bits", path);
        return ERR_OVERFLOW;
    }
    lo->n_floats = c;
    lo->file_bytes = bytes;
    if ((uint64_t)st.st_size != bytes) {
        LOG_ERR("%s: %lld bytes, but its header (dim %d, hidden_dim %d, n_layers %d, n_heads %d, "
                "n_kv_heads %d, vocab_size %d, seq_len %d) implies %llu%s",
                path, (long long)st.st_size, lo->dim, lo->hidden_dim, lo->n_layers, lo->n_heads,
                lo->n_kv_heads, lo->vocab_size, lo->seq_len, (unsigned long long)bytes,
                (uint64_t)st.st_size < bytes ? " (truncated)" : " (trailing bytes)");
        return (uint64_t)st.st_size < bytes ? ERR_TRUNCATED : ERR_MISMATCH;
    }
    return 0;
}

int llama2c_check_weights(const char *checkpoint_path)
{
    int fd = open(checkpoint_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        LOG_ERR("%s: cannot open the checkpoint: %s", checkpoint_path, strerror(e));
        return -e;
    }
    struct layout lo;
    struct iebin_hparams hp;
    int rc = read_layout(checkpoint_path, fd, &lo, &hp);
    void *map = NULL;
    if (rc == 0 && (map = mmap(NULL, (size_t)lo.file_bytes, PROT_READ, MAP_PRIVATE, fd, 0)) ==
                       MAP_FAILED) {
        map = NULL;
        rc = -errno;
        LOG_ERR("%s: mmap failed: %s", checkpoint_path, strerror(errno));
    }
    close(fd);
    if (rc != 0)
        return rc;
    const float *f = (const float *)((const char *)map + HEADER_BYTES); /* 4-byte aligned */
    uint64_t n = (lo.file_bytes - HEADER_BYTES) / sizeof(float);
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(f[i])) { /* broken weights would only surface as broken logits */
            LOG_ERR("%s: weight %llu (byte offset %llu) is %s: a checkpoint with non-finite "
                    "weights is broken",
                    checkpoint_path, (unsigned long long)i,
                    (unsigned long long)(HEADER_BYTES + i * sizeof(float)),
                    isnan(f[i]) ? "NaN" : "infinite");
            rc = ERR_RANGE;
            break;
        }
    munmap(map, (size_t)lo.file_bytes);
    return rc;
}

int llama2c_read_hparams(const char *checkpoint_path, struct iebin_hparams *hp)
{
    int fd = open(checkpoint_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        LOG_ERR("%s: cannot open the checkpoint: %s", checkpoint_path, strerror(e));
        return -e;
    }
    struct layout lo;
    int rc = read_layout(checkpoint_path, fd, &lo, hp);
    close(fd);
    return rc;
}

/* Streams n floats as one tensor, converting to dt (norms are always passed as DT_F32). */
static int put_tensor(struct iebin_writer *w, const char *path, const char *name, enum dtype dt,
                      uint64_t rows, uint64_t cols, int n_dims, const float *src)
{
    uint64_t shape[2] = {rows, cols};
    uint64_t n = rows * cols; /* bounded by the file size already checked */
    int rc = iebin_writer_begin(w, name, dt, n_dims == 1 ? &shape[1] : shape, n_dims);
    if (rc != 0)
        return rc;
    if (dt == DT_F32)
        return (rc = iebin_writer_write(w, src, n * 4)) ? rc : iebin_writer_end(w);
    enum { CHUNK = 16384 };
    uint16_t buf[CHUNK];
    for (uint64_t i = 0; i < n; i += CHUNK) {
        size_t k = n - i < CHUNK ? (size_t)(n - i) : CHUNK;
        for (size_t j = 0; j < k; j++) {
            float x = src[i + j];
            if (dt == DT_BF16) {
                buf[j] = half_f32_to_bf16(x);
                continue;
            }
            buf[j] = half_f32_to_f16(x);
            if (isfinite(x) && (buf[j] & 0x7c00u) == 0x7c00u) {
                LOG_ERR("%s: tensor '%s': element %llu = %g does not fit in f16 (max 65504)",
                        path, name, (unsigned long long)(i + j), (double)x);
                return ERR_RANGE;
            }
        }
        if ((rc = iebin_writer_write(w, buf, (uint64_t)k * 2)) != 0)
            return rc;
    }
    return iebin_writer_end(w);
}

/* "dir/stories260K.bin" -> "stories260K" */
static char *default_name(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 4 && strcmp(base + n - 4, ".bin") == 0)
        n -= 4;
    return strndup(base, n);
}

int llama2c_convert(const char *checkpoint_path, const char *tokenizer_json,
                    size_t tokenizer_json_len, const char *out_dir, enum dtype dtype,
                    const char *name)
{
    int rc;
    struct iebin_writer *w = NULL;
    void *map = NULL;
    struct layout lo;
    struct iebin_hparams hp;
    char *dname = NULL;
    if (dtype != DT_F32 && dtype != DT_F16 && dtype != DT_BF16) {
        const struct dtype_info *di = dtype_info(dtype);
        LOG_ERR("%s: llama2.c import writes f32, f16 or bf16, not %s", checkpoint_path,
                di ? di->name : "an unknown dtype");
        return ERR_UNSUPPORTED;
    }
    int fd = open(checkpoint_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        LOG_ERR("%s: cannot open the checkpoint: %s", checkpoint_path, strerror(errno));
        return rc;
    }
    if ((rc = read_layout(checkpoint_path, fd, &lo, &hp)) != 0)
        goto out;
    map = mmap(NULL, (size_t)lo.file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        map = NULL;
        rc = -errno;
        LOG_ERR("%s: mmap failed: %s", checkpoint_path, strerror(errno));
        goto out;
    }
    madvise(map, (size_t)lo.file_bytes, MADV_SEQUENTIAL); /* a hint; failure is harmless */
    const float *f = (const float *)((const char *)map + HEADER_BYTES); /* 4-byte aligned */

    if (!name && !(name = dname = default_name(checkpoint_path))) {
        LOG_ERR("%s: out of memory", checkpoint_path);
        rc = -ENOMEM;
        goto out;
    }
    if ((rc = iebin_writer_create(out_dir, "llama", name, &hp, &w)) != 0)
        goto out;
    if (tokenizer_json && (rc = iebin_writer_set_tokenizer(w, tokenizer_json,
                                                           tokenizer_json_len)) != 0)
        goto out;

    uint64_t d = hp.dim, kv = lo.kv_dim, hid = hp.ffn_dim, V = lo.vocab;
    const char *p = checkpoint_path;
    if ((rc = put_tensor(w, p, IEBIN_T_TOK_EMBD, dtype, V, d, 2, f + lo.emb)) != 0)
        goto out;
    for (uint64_t l = 0; l < hp.n_layers; l++) {
        /* float *wq; // [n_layers][dim][dim]: layer l starts l*dim*dim floats in */
        const struct {
            const char *suffix;
            uint64_t base, rows, cols;
            int n_dims;
        } t[] = {
            {IEBIN_T_ATTN_NORM, lo.rms_att, 1, d, 1}, {IEBIN_T_ATTN_Q, lo.wq, d, d, 2},
            {IEBIN_T_ATTN_K, lo.wk, kv, d, 2},        {IEBIN_T_ATTN_V, lo.wv, kv, d, 2},
            {IEBIN_T_ATTN_O, lo.wo, d, d, 2},         {IEBIN_T_FFN_NORM, lo.rms_ffn, 1, d, 1},
            {IEBIN_T_FFN_GATE, lo.w1, hid, d, 2},     {IEBIN_T_FFN_UP, lo.w3, hid, d, 2},
            {IEBIN_T_FFN_DOWN, lo.w2, d, hid, 2},
        };
        for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
            char tn[IEBIN_NAME_MAX];
            snprintf(tn, sizeof tn, "blk.%llu.%s", (unsigned long long)l, t[i].suffix);
            const float *src = f + t[i].base + l * t[i].rows * t[i].cols;
            enum dtype dt = t[i].n_dims == 1 ? DT_F32 : dtype;
            if ((rc = put_tensor(w, p, tn, dt, t[i].rows, t[i].cols, t[i].n_dims, src)) != 0)
                goto out;
        }
    }
    if ((rc = put_tensor(w, p, IEBIN_T_OUTPUT_NORM, DT_F32, 1, d, 1, f + lo.rms_final)) != 0)
        goto out;
    if (!hp.tied_embeddings &&
        (rc = put_tensor(w, p, IEBIN_T_OUTPUT, dtype, V, d, 2, f + lo.wcls)) != 0)
        goto out;
    rc = iebin_writer_finish(w);
    w = NULL;
out:
    iebin_writer_abort(w);
    if (map)
        munmap(map, (size_t)lo.file_bytes);
    close(fd);
    free(dname);
    return rc;
}
