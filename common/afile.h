/*
 * afile.h — atomic file creation: write under a temporary name beside the target, fsync,
 * rename over the target, fsync the directory. A crash or error at any point leaves either the
 * old file or nothing under the final name, never a partial one.
 *
 * CLOCHER_FAULT_WRITE_LIMIT=N (bytes, tests only) makes afile_write fail with -ENOSPC once a
 * file would grow past N bytes: how the test suite simulates a full disk without root tricks.
 */
#ifndef CLOCHER_COMMON_AFILE_H
#define CLOCHER_COMMON_AFILE_H

#include <stddef.h>
#include <stdint.h>

struct afile {
    int fd;
    uint64_t written;
    char *tmp_path;   /* "<final>.tmp.XXXXXX", owned */
    char *final_path; /* owned */
};

/* Creates the temporary file. 0 or -errno (logged, naming the path). */
int afile_open(struct afile *af, const char *final_path);
/* Writes all n bytes (retries short writes and EINTR). 0 or -errno (logged). */
int afile_write(struct afile *af, const void *buf, size_t n);
/* Writes zero bytes until the file size is a multiple of `align`. */
int afile_pad(struct afile *af, uint64_t align);
/* fsync + rename + directory fsync; frees the paths. On failure the temporary is removed. */
int afile_commit(struct afile *af);
/* Closes and removes the temporary; safe after a failed open or commit (fd is -1 then). */
void afile_abort(struct afile *af);

#endif
