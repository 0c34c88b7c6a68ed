/* secret.h — the keys derived from the job's secret. The launcher draws the secret
 * (replica_secret_new) and keeps it in the job's Redis config; whoever can read that is the
 * job. Each channel derives its own key from it under a context of its own, so one key says
 * nothing about another. */
#ifndef DEADPOOL_SECRET_H
#define DEADPOOL_SECRET_H

#include <stddef.h>

/* keylen bytes of key from the secret (hex of crypto_kdf_KEYBYTES bytes, nothing after it)
 * under context (8 characters, libsodium's crypto_kdf), subkey id 1. 0, or -1 for a secret
 * that is not exactly that. */
int job_key_derive(const char *secret_hex, const char context[8], unsigned char *key, size_t keylen);

#endif
