/* secret.h — the job's secret and the keys derived from it.
 *
 * The job key (64 hex characters, a crypto_kdf key) is what every process of a job holds and
 * nothing outside it does. It never lives in Redis: Redis is storage the job does not trust
 * (docs/RELIABILITY.md). A launcher computes it from a secret its machines share
 * (job_key_from_secret: DEADPOOL_JOB_SECRET under Slurm, a --secret-file across machines, or
 * one it draws for a one-machine job, replica_secret_new) and hands it to its processes in DEADPOOL_JOB_KEY. Each
 * channel (the data plane, the replica channel, the values in Redis) derives its own key from
 * it under a context of its own, so one key says nothing about another. */
#ifndef DEADPOOL_SECRET_H
#define DEADPOOL_SECRET_H

#include <stddef.h>

#define DP_ENV_JOB_KEY "DEADPOOL_JOB_KEY" /* the job key, from the process's launcher */
#define JOB_KEY_HEX_LEN 64
#define JOB_SECRET_MIN 16  /* characters of a shared secret, at least */
#define JOB_SECRET_MAX 1024

/* keylen bytes of key from the job key (hex of crypto_kdf_KEYBYTES bytes, nothing after it)
 * under context (8 characters, libsodium's crypto_kdf), subkey id 1. 0, or -1 for a key that
 * is not exactly that. */
int job_key_derive(const char *key_hex, const char context[8], unsigned char *key, size_t keylen);

/* BLAKE2b-256 of LABEL ":" JOB ":" SECRET, in hex: a key of job for one use, the label naming
 * the use (two labels never give the same key). 0, or -1 when libsodium does not start. */
int job_secret_hash(const char *label, const char *job, const char *secret, char hex[JOB_KEY_HEX_LEN + 1]);

/* The job key of job from a secret its machines share: job_secret_hash("deadpool-job-key").
 * 0, or -1 (+ err) for a secret shorter than JOB_SECRET_MIN. Never the Redis password
 * (slurm.c hashes under "deadpool-redis"). */
int job_key_from_secret(const char *secret, const char *job, char hex[JOB_KEY_HEX_LEN + 1], char *err, size_t errlen);

/* The shared secret in a --secret-file: one line of JOB_SECRET_MIN to JOB_SECRET_MAX characters
 * in a regular file of this user's, mode 0600. 0 / -1 + err naming the file and the problem. */
int job_secret_file_read(const char *path, char *secret, size_t len, char *err, size_t errlen);

/* This process's job key from DEADPOOL_JOB_KEY. 0 / -1 + err saying where it comes from. */
int job_key_from_env(char hex[JOB_KEY_HEX_LEN + 1], char *err, size_t errlen);

#endif
