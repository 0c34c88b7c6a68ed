/* secret.c — keys derived from the job's secret (libsodium's KDF). */
#include "secret.h"

#include <sodium.h>
#include <string.h>

int job_key_derive(const char *secret_hex, const char context[8], unsigned char *key, size_t keylen) {
    unsigned char bin[crypto_kdf_KEYBYTES];
    size_t got = 0;
    const char *end = NULL;
    if (!secret_hex || !key || sodium_init() < 0) return -1;
    int rc = sodium_hex2bin(bin, sizeof bin, secret_hex, strlen(secret_hex), NULL, &got, &end) == 0 &&
                     got == sizeof bin && end && *end == '\0'
                 ? crypto_kdf_derive_from_key(key, keylen, 1, context, bin)
                 : -1;
    sodium_memzero(bin, sizeof bin);
    return rc == 0 ? 0 : -1;
}
