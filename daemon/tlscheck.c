/*
 * tlscheck.c — the TLS files of the configuration read with OpenSSL (see tlscheck.h): a file
 * that is not PEM, or a key that is not the certificate's, is refused when the configuration
 * is read, not when the listener starts.
 */
#include "tlscheck.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdbool.h>
#include <stdio.h>

/* The first PEM certificate (or private key) of path, NULL if there is none. */
static void *read_pem(const char *path, bool private_key)
{
    BIO *b = BIO_new_file(path, "r");
    void *obj = NULL;
    if (b) {
        obj = private_key ? (void *)PEM_read_bio_PrivateKey(b, NULL, NULL, NULL)
                          : (void *)PEM_read_bio_X509(b, NULL, NULL, NULL);
        BIO_free(b);
    }
    ERR_clear_error();
    return obj;
}

const char *tlscheck_files(const char *cert, const char *key, const char *ca, char *why,
                           size_t cap)
{
    if (!cert)
        return NULL;
    const char *bad = NULL;
    X509 *x = read_pem(cert, false);
    EVP_PKEY *k = x && key ? read_pem(key, true) : NULL;
    if (!x) {
        bad = "cert";
        snprintf(why, cap, "%s is not a PEM certificate (\"-----BEGIN CERTIFICATE-----\")", cert);
    } else if (key && !k) {
        bad = "key";
        snprintf(why, cap, "%s is not a PEM private key (\"-----BEGIN PRIVATE KEY-----\")", key);
    } else if (k && X509_check_private_key(x, k) != 1) {
        ERR_clear_error();
        bad = "key";
        snprintf(why, cap, "%s is not the private key of the certificate %s", key, cert);
    } else if (ca) {
        X509 *c = read_pem(ca, false);
        if (!c) {
            bad = "client_ca";
            snprintf(why, cap, "%s is not a PEM certificate (\"-----BEGIN CERTIFICATE-----\")",
                     ca);
        }
        X509_free(c);
    }
    X509_free(x);
    EVP_PKEY_free(k);
    return bad;
}
