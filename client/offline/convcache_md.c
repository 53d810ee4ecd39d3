/* convcache_md.c — SHA-256 over a stream for convcache.c's key, through OpenSSL's EVP API.
 * Apart because OpenSSL's headers declare an ERR_STATE that common/err.h also names. */
#include "convcache_md.h"

#include <openssl/evp.h>

void *convcache_md_new(void)
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(md);
        md = NULL;
    }
    return md;
}

void convcache_md_update(void *md, const void *p, size_t n) { EVP_DigestUpdate(md, p, n); }

void convcache_md_final(void *md, unsigned char *out)
{
    unsigned n = 0;
    EVP_DigestFinal_ex(md, out, &n);
    EVP_MD_CTX_free(md);
}
