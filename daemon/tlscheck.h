/*
 * tlscheck.h — whether the configured TLS files hold what gRPC will want from them, read with
 * OpenSSL at configuration time (kept apart from config.c: OpenSSL's headers and err.h both
 * name ERR_STATE).
 */
#ifndef CLOCHER_DAEMON_TLSCHECK_H
#define CLOCHER_DAEMON_TLSCHECK_H

#include <stddef.h>

/* cert: a PEM certificate chain; key: a PEM private key of that certificate; ca (NULL = none):
 * PEM certificates. NULL if all is well (or cert is NULL), else the configuration key at fault
 * ("cert", "key", "client_ca") with why[cap] naming the file and what it lacks. */
const char *tlscheck_files(const char *cert, const char *key, const char *ca, char *why,
                           size_t cap);

#endif
