/*
 * convcache.h — the conversion cache: a Hugging Face folder or a GGUF file converted once into
 * an IEBIN folder under a cache directory, keyed by the source's content, and reused by every
 * later start (`clocher convert --cache DIR SRC`, which clocherd and inference-engine run;
 * docs/CONVERT.md, "The conversion cache").
 *
 * An entry is DIR/<stem>-<16 hex digits of the key> (stem: the source's name without .gguf).
 * It exists only complete: the conversion writes DIR/<entry>.tmp.<pid> and renames it into
 * place. DIR/<entry>.lock (flock) serializes conversions of the same key, so two starts at
 * once convert once: the second waits, then finds the entry. Scratch folders left by a
 * conversion that died (killed, power cut) are removed by the next one holding the lock.
 *
 * The key is the SHA-256 (OpenSSL) of: a format tag, the converter's release number and
 * CONVCACHE_EPOCH (not the build's git description: a rebuild or a commit that leaves the
 * converter's output unchanged must not convert every cached model again), the --dtype asked
 * for, and for each file the converter reads (a GGUF: itself; a Hugging Face folder: its
 * top-level *.json, *.safetensors, *.model, *.txt, *.tiktoken and *.jinja files, by name): its
 * name, size and mtime (ns), and its content — all of it for files up to 64 MiB (configs,
 * tokenizers), else the first 4 MiB (safetensors' JSON header, GGUF's metadata and tensor
 * table), the last 1 MiB and 16 slices of 64 KiB spread evenly. Why not a hash of everything:
 * reading 40 GB at every start would cost minutes; size + mtime change whenever a download or a
 * tool rewrites a file, and the headers and samples catch a different file copied over with
 * its time kept.
 */
#ifndef CLOCHER_CLIENT_CONVCACHE_H
#define CLOCHER_CLIENT_CONVCACHE_H

#include "convert.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CONVCACHE_KEY_HEX 64 /* hex digits of the key */

/* Bump whenever `clocher convert` writes different bytes for the same source and dtype (a
 * changed quantizer, layout or manifest field): every entry made before is then missed and
 * converted again, as it must be. A release (CLOCHER_VERSION_NUMBER) does that too. */
#define CONVCACHE_EPOCH 2 /* 2: k-quant bytes as llama.cpp's quantizer (session 12) */

/* Entries used in the last CONVCACHE_EVICT_GRACE_S seconds are never evicted: a server that
 * just got an entry's path from the converter takes its shared lock right after. */
#define CONVCACHE_EVICT_GRACE_S 60

/* The key of src converted with dtype_name ("" or NULL: each tensor keeps its own dtype) into
 * hex[CONVCACHE_KEY_HEX + 1]. 0, or a negative code logged naming the file that failed. */
int convcache_key(const char *src, const char *dtype_name, char *hex);

/* The entry's folder for src under cache_dir into out[cap] (the key computed as above). */
int convcache_entry(const char *cache_dir, const char *src, const char *dtype_name, char *out,
                    size_t cap);

/*
 * The entry for src under cache_dir (created, mode 0755, when missing), converted with *o
 * unless it is already there: 0 and its path in out[cap], *converted telling which. A failed
 * conversion leaves no entry (and no scratch folder) and returns the converter's code with
 * *fault saying which side failed (convert.h).
 */
int convcache_get(const char *cache_dir, const char *src, const struct convert_opts *o,
                  const char *dtype_name, char *out, size_t cap, bool *converted,
                  enum convert_fault *fault);

/*
 * Eviction (`clocher convert --cache DIR --cache-max-gb N`, clocherd's convert.cache_max_gb):
 * while the entries under cache_dir take more than max_bytes on disk, removes the least
 * recently used one (convcache_get stamps an entry's folder mtime at each use), never `keep`
 * (the entry just served), never one used in the last CONVCACHE_EVICT_GRACE_S seconds, and
 * never one in use: a server holds a shared flock on `<entry>.lock` (MODELSRC_LOCK_SUFFIX,
 * common/modelsrc.h) for as long as it serves the entry; eviction takes it exclusively without
 * waiting and skips the entry when it cannot. An entry is renamed to a scratch name before its
 * files are removed, so it disappears at once and whole. Each removal is reported on stderr.
 * 0, or a negative code when cache_dir cannot be listed; entries that cannot be removed are
 * reported and skipped.
 */
int convcache_evict(const char *cache_dir, const char *keep, uint64_t max_bytes);

#endif
