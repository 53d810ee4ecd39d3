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
 * The key is the SHA-256 (OpenSSL) of: a format tag, the converter's version, the --dtype
 * asked for, and for each file the converter reads (a GGUF: itself; a Hugging Face folder: its
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

#define CONVCACHE_KEY_HEX 64 /* hex digits of the key */

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

#endif
