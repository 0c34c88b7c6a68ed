/* secret.c — the job's secret and the keys derived from it (libsodium's KDF and BLAKE2b). */
#include "secret.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

int job_key_derive(const char *key_hex, const char context[8], unsigned char *key, size_t keylen) {
    unsigned char bin[crypto_kdf_KEYBYTES];
    size_t got = 0;
    const char *end = NULL;
    if (!key_hex || !key || sodium_init() < 0) return -1;
    int rc = sodium_hex2bin(bin, sizeof bin, key_hex, strlen(key_hex), NULL, &got, &end) == 0 &&
                     got == sizeof bin && end && *end == '\0'
                 ? crypto_kdf_derive_from_key(key, keylen, 1, context, bin)
                 : -1;
    sodium_memzero(bin, sizeof bin);
    return rc == 0 ? 0 : -1;
}

int job_secret_hash(const char *label, const char *job, const char *secret, char hex[JOB_KEY_HEX_LEN + 1]) {
    unsigned char h[JOB_KEY_HEX_LEN / 2];
    crypto_generichash_state st;
    if (sodium_init() < 0 || crypto_generichash_init(&st, NULL, 0, sizeof h) != 0) return -1;
    crypto_generichash_update(&st, (const unsigned char *)label, strlen(label));
    crypto_generichash_update(&st, (const unsigned char *)":", 1);
    crypto_generichash_update(&st, (const unsigned char *)job, strlen(job));
    crypto_generichash_update(&st, (const unsigned char *)":", 1);
    crypto_generichash_update(&st, (const unsigned char *)secret, strlen(secret));
    crypto_generichash_final(&st, h, sizeof h);
    sodium_bin2hex(hex, JOB_KEY_HEX_LEN + 1, h, sizeof h);
    sodium_memzero(h, sizeof h);
    return 0;
}

int job_key_from_secret(const char *secret, const char *job, char hex[JOB_KEY_HEX_LEN + 1], char *err, size_t errlen) {
    size_t n = secret ? strlen(secret) : 0;
    if (n < JOB_SECRET_MIN) {
        set_err(err, errlen, "the job's secret has %zu characters: at least %d are needed", n, JOB_SECRET_MIN);
        return -1;
    }
    if (job_secret_hash("deadpool-job-key", job, secret, hex) != 0) {
        set_err(err, errlen, "libsodium did not initialise");
        return -1;
    }
    return 0;
}

int job_secret_file_read(const char *path, char *secret, size_t len, char *err, size_t errlen) {
    if (private_line_read(path, "the job's secret", secret, len, err, errlen) != 0) return -1;
    if (strlen(secret) < JOB_SECRET_MIN) {
        set_err(err, errlen, "%s: the secret has %zu characters, at least %d are needed (e.g. head -c 32 /dev/urandom "
                "| od -An -tx1 | tr -d ' \\n' > %s)", path, strlen(secret), JOB_SECRET_MIN, path);
        sodium_memzero(secret, len);
        return -1;
    }
    return 0;
}

int job_key_from_env(char hex[JOB_KEY_HEX_LEN + 1], char *err, size_t errlen) {
    const char *v = getenv(DP_ENV_JOB_KEY);
    unsigned char probe[16]; /* crypto_kdf_BYTES_MIN */
    if (!v || !*v) {
        set_err(err, errlen, "%s is not set: a process of a job gets the job's key from its launcher (deadpool run), "
                "or from `deadpool worker --secret-file FILE` when started by hand; it is never in Redis",
                DP_ENV_JOB_KEY);
        return -1;
    }
    if (strlen(v) != JOB_KEY_HEX_LEN || job_key_derive(v, "DPprobe0", probe, sizeof probe) != 0) {
        set_err(err, errlen, "%s: expected %d hex characters, found %zu characters", DP_ENV_JOB_KEY, JOB_KEY_HEX_LEN,
                strlen(v));
        return -1;
    }
    sodium_memzero(probe, sizeof probe);
    memcpy(hex, v, JOB_KEY_HEX_LEN + 1);
    return 0;
}
