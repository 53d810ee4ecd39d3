/* convcache_md.h — SHA-256 over a stream for convcache.c's key (convcache_md.c: OpenSSL's EVP,
 * kept out of the files that include common/err.h, whose ERR_STATE OpenSSL also declares). */
#ifndef CLOCHER_CLIENT_CONVCACHE_MD_H
#define CLOCHER_CLIENT_CONVCACHE_MD_H

#include <stddef.h>

/* A new SHA-256 context, or NULL. */
void *convcache_md_new(void);
void convcache_md_update(void *md, const void *p, size_t n);
/* Writes the 32-byte digest into out and frees the context. */
void convcache_md_final(void *md, unsigned char *out);

#endif
