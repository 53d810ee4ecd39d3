/*
 * hotrepl.h — hot tensor replication: give a worker node-local copies of the model's most
 * used weights.
 *
 * Every worker maps the same model.ie.bin (MAP_PRIVATE, read-only), so its pages are the page
 * cache's, shared by all workers and resident on whichever NUMA node first read them: the
 * workers of the other nodes stream their weights across the interconnect on every token.
 * Replication copies chosen tensors into anonymous memory on the worker's node and moves the
 * copy over the original pages of the worker's own mapping (mremap MREMAP_FIXED), so every
 * pointer the engine already holds keeps working and now reads local memory. The copies go in
 * chunks of 64 MiB, so memory grows by one chunk at most (replicating a whole 13 GB model
 * stays within the 16 GB of issue 13, instead of holding a second 13 GB beside the mapping),
 * and in transparent huge pages placed at the same offset within 2 MiB as the pages they
 * replace, so they keep 2 MiB page-table entries (see hotrepl_hugify for why). Pages are
 * replicated whole (tensors are 64-byte aligned, not page aligned: a boundary page shared by
 * two tensors is copied with both).
 *
 * What is hot: every weight matrix is read once per generated token, so bytes-per-token is the
 * same for all of them; the classifier (output, or the tied embedding) comes first because
 * every decode step reads all of it, then layers in order (0, 1, ...) with their norms, then
 * the rest. The token embedding of an untied model is last: each token reads one row of it.
 * With a limit, tensors are taken in that order while they fit.
 *
 * What is not read is not copied: given the engine's struct model, tensors whose stored bytes
 * the forward pass no longer reads (q4_0/q8_0 matrices repacked into panels at load, model.h
 * model_reads_stored) are left shared, so the budget goes to tensors that are read. The
 * panels themselves are anonymous memory first touched by the loading worker, so already on
 * its node. A tied tok_embd whose classifier has panels then ranks as an embedding (last).
 * Those unread tensors are not even resident in this process (model_release_stored_rows):
 * hotrepl_hugify_model does not re-populate them, and hotrepl_apply releases them again at its
 * end.
 *
 * clocher-worker applies it when IE_HOT_REPLICATE=1 (IE_HOT_REPL_LIMIT_MB caps the bytes),
 * after the engine has mapped the model and before it serves.
 *
 * NOTES: best called before the worker serves (the copies cost time and, while they exist
 * alongside the shared pages, memory). It is nevertheless safe against concurrent readers:
 * mremap swaps the pages under the address-space lock, so a reader faults in either the old or
 * the new page, and both hold the same bytes.
 */
#ifndef CLOCHER_WORKER_HOTREPL_H
#define CLOCHER_WORKER_HOTREPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct model;

struct hotrepl_report {
    size_t n_mappings;        /* mappings of model.ie.bin found in this process */
    size_t n_tensors;         /* tensors replicated (per mapping) */
    uint64_t bytes;           /* bytes copied, pages rounded, all mappings */
    size_t n_skipped;         /* tensors left shared because of the limit */
    uint64_t skipped_bytes;
    size_t n_unread;          /* tensors left shared because nothing reads their stored bytes */
    uint64_t unread_bytes;
    char first[128], last[128]; /* first and last tensor replicated, in hotness order */
};

/*
 * Replicates the hottest tensors of the model in `model_dir` into memory on NUMA node `node`
 * (-1 = wherever this thread's memory policy puts it), at most limit_bytes (0 = all), inside
 * every mapping of its model.ie.bin that this process holds. `m`: the loaded model whose
 * readers decide which tensors are read (model_reads_stored), or NULL to treat every tensor
 * as read; with m, its unread ranges are released again at the end (model_release_stored_rows:
 * a copy reads whole pages, and a page fault maps its neighbours too). 0 with *rep filled (n_mappings 0 when the model is not mapped: nothing to do), or
 * a negative code, logged: the model's manifest errors (iebin_open), -errno from
 * /proc/self/maps, mmap, mbind, mremap.
 */
int hotrepl_apply(const char *model_dir, const struct model *m, int node, uint64_t limit_bytes,
                  struct hotrepl_report *rep);

struct hotrepl_huge_report {
    size_t n_mappings;     /* mappings of model.ie.bin found in this process */
    uint64_t file_bytes;   /* the file's size */
    uint64_t pmd_bytes;    /* bytes this process maps with 2 MiB entries afterwards (all files) */
    bool skipped;          /* nothing done: the mappings were already >= 90% 2 MiB entries */
    uint64_t unread_bytes; /* hugify_model: the model's unread ranges (model_unread_ranges),
                            * neither re-populated nor counted in the 90% */
    uint64_t released_bytes; /* hugify_default_model: dropped from the model's mapping after */
};

/*
 * Re-reads the page cache of the model in `model_dir` in 2 MiB folios, so that this process's
 * mappings of model.ie.bin (and every later one, while the pages stay cached) map the weights
 * with 2 MiB page-table entries instead of 4 KiB ones. Nothing is copied: per 64 MiB chunk,
 * this process's mappings drop their entries (MADV_DONTNEED: the file's bytes, read again on
 * the next touch), the chunk's cached pages are dropped (POSIX_FADV_DONTNEED: clean pages that
 * no other process maps), and the chunk is read again through MADV_HUGEPAGE mappings
 * (MADV_POPULATE_READ: readahead allocates PMD-sized folios and maps them whole), so memory
 * grows by one chunk at most and the mappings end populated as MAP_POPULATE left them.
 *
 * Why: decode reads every weight once per token; on a virtual machine each 4 KiB TLB miss is a
 * two-dimensional page walk, and gpt-oss-20b decoded 2.4-6.8x slower through 4 KiB entries
 * than through 2 MiB ones (docs/PERFORMANCE.md "gpt-oss-20b"). A file read without
 * MADV_HUGEPAGE is cached in small folios, and a mapping of small folios cannot use 2 MiB
 * entries (MADV_COLLAPSE answers EINVAL for file pages without CONFIG_READ_ONLY_THP_FOR_FS).
 *
 * Safe against concurrent readers (a dropped entry faults the same bytes back in). Pages that
 * another process maps stay cached as they are (4 KiB entries there); a mapping that does not
 * start on a 2 MiB boundary gets 4 KiB entries. 0 with *rep filled (n_mappings 0: the model
 * is not mapped by this process; its page cache is re-read all the same), or a negative code,
 * logged: the manifest's errors (iebin_open), -errno from open, mmap, madvise (-EINVAL:
 * a kernel before 5.14, without MADV_POPULATE_READ).
 */
int hotrepl_hugify(const char *model_dir, struct hotrepl_huge_report *rep);

/*
 * hotrepl_hugify for a process whose model `m` (NULL: as hotrepl_hugify) reads some tensors
 * through panels only (model_unread_ranges): those ranges are not re-populated in any mapping
 * of model.ie.bin in this process (each is taken to be a model with the same panels: the same
 * file, ISA and knobs), so the repacked weights are not made resident a second time, and the
 * ">= 90% in 2 MiB entries" of hotrepl_hugify_default counts only the bytes they keep
 * (rep->unread_bytes). The page cache is still re-read whole: other processes may read those
 * ranges. Codes as hotrepl_hugify, and model_unread_ranges's -ENOMEM.
 */
int hotrepl_hugify_model(const char *model_dir, const struct model *m,
                         struct hotrepl_huge_report *rep);

/*
 * The default at start (clocher-worker before hot replication, inference-engine after loading):
 * hotrepl_hugify unless IE_HUGE_PAGES=0, skipped (rep->skipped) when this process's mappings of
 * model.ie.bin are already mapped with 2 MiB entries for >= 90% of the file, FilePmdMapped of
 * /proc/self/smaps_rollup (the usual case: iebin.c maps with MADV_HUGEPAGE and
 * MADV_POPULATE_READ, so a file read cold comes in as 2 MiB folios; hugify is for a page cache
 * warmed in small folios by a reader without MADV_HUGEPAGE). Logs what it did; a failure of
 * hotrepl_hugify is a warning (the mappings still work, in 4 KiB pages). 0 with *rep (zeroed
 * when turned off or failed), or ERR_RANGE naming IE_HUGE_PAGES when it is not 0 or 1.
 */
int hotrepl_hugify_default(const char *model_dir, struct hotrepl_huge_report *rep);

/*
 * The same for the process's model `m` (NULL: hotrepl_hugify_default): hotrepl_hugify_model,
 * then, whatever it did (skipped, done, off, failed), model_release_stored_rows(m) (counted in
 * rep->released_bytes, logged), so the weights are resident once (ADR 0004 addendum "weights
 * resident once"). What inference-engine, the worker and engine_bench call once the engine's
 * model is open. A failed release is a warning (memory, not correctness). Codes as
 * hotrepl_hugify_default.
 */
int hotrepl_hugify_default_model(const char *model_dir, const struct model *m,
                                 struct hotrepl_huge_report *rep);

#endif
