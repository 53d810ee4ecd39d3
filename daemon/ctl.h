/*
 * ctl.h — the control messages a worker sends its supervisor: a private sd_notify.
 *
 * Each worker inherits one end of a SOCK_SEQPACKET socketpair (clocher-worker --control-fd)
 * and sends short text datagrams of "KEY=VALUE" lines, as a service does to systemd:
 *
 *   READY=1          the model and adapters are loaded: route requests here
 *   WATCHDOG=1       the worker's loop is alive (about once a second)
 *   HOT_BYTES=<n>    bytes of hot tensors replicated into node-local memory
 *   HOT_TENSORS=<n>  how many tensors those are
 *   STATUS=<text>    free text for the log (printable ASCII, at most 127 bytes)
 *
 * Why a socket and not a word in the shared-memory region: the supervisor keeps away from
 * memory a worker writes (PostgreSQL's postmaster rule). A datagram cannot be half-written
 * or scribbled over by a dying worker, its size is bounded by the kernel, EOF comes with the
 * worker's death, and liveness is measured on the supervisor's own clock. The parser below
 * still treats every byte as untrusted.
 *
 * NOTES: pure parsing, no state; any thread.
 */
#ifndef CLOCHER_DAEMON_CTL_H
#define CLOCHER_DAEMON_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CTL_MSG_MAX 512    /* longer datagrams are refused (MSG_TRUNC) */
#define CTL_STATUS_MAX 128 /* STATUS text, NUL included */

struct ctl_msg {
    bool ready;
    bool watchdog;
    bool has_hot_bytes;
    uint64_t hot_bytes;
    bool has_hot_tensors;
    uint64_t hot_tensors;
    char status[CTL_STATUS_MAX]; /* "" when absent */
};

/*
 * Parses one datagram of `len` bytes. 0 and *out, or ERR_FORMAT (logged, naming `who` — e.g.
 * "worker 1 (pid 42)" — the line and what is wrong): empty message, NUL byte, a line without
 * '=', an unknown key, a key given twice, a bad value.
 */
int ctl_parse(const char *who, const char *buf, size_t len, struct ctl_msg *out);

#endif
