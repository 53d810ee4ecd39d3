/*
 * ctl.h — the control messages a worker sends its supervisor: a private sd_notify.
 *
 * Each worker inherits one end of a SOCK_SEQPACKET socketpair (clocher-worker --control-fd)
 * and sends short text datagrams of "KEY=VALUE" lines, as a service does to systemd. The keys,
 * their values and the limits are the contract in shm/heritage.h (HERITAGE_CTL_KEYS: READY=1,
 * WATCHDOG=1, HOT_BYTES=<n>, HOT_TENSORS=<n>, STATUS=<text>); the worker formats them with
 * heritage_ctl_format, this file parses them.
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

#include "heritage.h"

#include <stddef.h>

/*
 * Parses one datagram of `len` bytes. 0 and *out, or ERR_FORMAT (logged, naming `who` — e.g.
 * "worker 1 (pid 42)" — the line and what is wrong): empty message, NUL byte, a line without
 * '=', an unknown key, a key given twice, a bad value, a datagram over HERITAGE_CTL_MSG_MAX.
 */
int ctl_parse(const char *who, const char *buf, size_t len, struct heritage_ctl_msg *out);

#endif
