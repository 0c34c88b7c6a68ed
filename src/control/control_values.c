/* control_values.c — each value the job keeps in Redis, with its one typed owner: sealed
 * values (the job key's MAC: a forged one reads as none), the config and process hashes,
 * process ids, rank claims and owners, the spare pool, commit records and stateless claims,
 * checkpoints' completion, generation sizes, counters, liveness, the epoch and the job's
 * state. */
#include "control.h"
#include "control_internal.h"
#include "protocol.h"
#include "redis_connect.h"
#include "secret.h"
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>
#include <time.h>
#include <arpa/inet.h>
#include <sys/socket.h>

/* Copies a string reply into out; -1 with c->err set when it does not fit. */
static int copy_reply_string(ctl_t *c, const redisReply *r, char *out, size_t len, const char *what) {
    if (copy_checked(out, len, r->str, r->len) != 0) {
        ctl_set_error(c, "%s: value of %zu bytes does not fit a %zu-byte buffer", what, r->len, len);
        return -1;
    }
    return 0;
}

/* A stored integer (protocol.h's proto_int_parse: `what` in [lo, hi]) from a string reply.
 * 0, or -1 with c's error naming the value and what was found (c NULL: no error kept, for
 * the bulk reads that take a bad value as none). */
int ctl_reply_int(ctl_t *c, const redisReply *r, const char *what, long long lo, long long hi, long long *v) {
    char err[CTL_ERR_MAX];
    *v = 0;
    if (r->type != REDIS_REPLY_STRING) {
        if (c) ctl_set_error(c, "%s: expected a string reply, found type %d", what, r->type);
        return -1;
    }
    if (strlen(r->str) != r->len) { /* a NUL byte inside: not what any writer wrote */
        if (c) ctl_set_error(c, "%s: expected an integer, found a value with a NUL byte", what);
        return -1;
    }
    if (proto_int_parse(r->str, what, lo, hi, v, err, sizeof err) != 0) {
        if (c) ctl_set_error(c, "%s", err);
        return -1;
    }
    return 0;
}

int ctl_set_job_key(ctl_t *c, const char *key_hex) {
    c->keyed = job_key_derive(key_hex, "DPctl001", c->seal_key, sizeof c->seal_key) == 0;
    if (!c->keyed) ctl_set_error(c, "the job's key is not %d hex characters", JOB_KEY_HEX_LEN);
    return c->keyed ? 0 : -1;
}

/* VALUE sealed under NAME with the job key (protocol.h), malloc'd; NULL + c->err without a key. */
char *ctl_seal_value(ctl_t *c, const char *name, const char *value) {
    if (!c->keyed) {
        ctl_set_error(c, "'%s': this connection has no job key to seal it with", name);
        return NULL;
    }
    size_t cap = strlen(value) + PROTO_SEAL_OVERHEAD + 1;
    char *sealed = malloc(cap);
    if (!sealed || proto_seal(c->seal_key, c->job, name, value, sealed, cap) != 0) {
        free(sealed);
        ctl_set_error(c, "'%s': cannot seal it", name);
        return NULL;
    }
    return sealed;
}

/* A reply read back under NAME, verified: 0 with the value, or -1 + c->err. A value that does
 * not verify is refused as if it were missing, and logged: whoever wrote it lacks the key. */
static int unseal_reply_logged(ctl_t *c, const char *name, const redisReply *r, char *value, size_t len, int log) {
    c->refused = 0;
    if (r->type != REDIS_REPLY_STRING) {
        ctl_set_error(c, "'%s' is not set", name);
        return -1;
    }
    if (!c->keyed) {
        ctl_set_error(c, "'%s': this connection has no job key to verify it with", name);
        return -1;
    }
    char why[256];
    /* a NUL inside the value is cut there: the tag then covers less than it says and fails */
    if (proto_unseal(c->seal_key, c->job, name, r->str, value, len, why, sizeof why) == 0) return 0;
    ctl_set_error(c, "job '%s': %s", c->job, why);
    if (log && now_ms() - c->refused_logged_ms >= 1000) {
        c->refused_logged_ms = now_ms();
        log_msg("refused a value from redis: %s", c->err);
    }
    c->refused = 1;
    return -1;
}

int ctl_unseal_reply(ctl_t *c, const char *name, const redisReply *r, char *value, size_t len) {
    return unseal_reply_logged(c, name, r, value, len, 1);
}

/* Membership (rank owners) and commit records are integers sealed under their key's suffix:
 * a forged owner or commit record reads as absent, so it can delay or stop a recovery (a rank
 * that nobody seems to own, a step that nobody seems to have committed), never hand a rank to
 * a process or roll the job back to a step of someone else's choosing. */
char *ctl_seal_int(ctl_t *c, ctl_key k, long long a, long long b, long long v) {
    char suffix[CTL_KEY_MAX], text[32];
    snprintf(text, sizeof text, "%lld", v);
    return ctl_seal_value(c, ctl_key_suffix(suffix, sizeof suffix, k, a, b), text);
}

/* 0 with *v from a sealed integer reply, -1 (c->err) when absent, forged or out of [lo, hi]. */
int ctl_unseal_int(ctl_t *c, ctl_key k, long long a, long long b, const redisReply *r, const char *what,
                      long long lo, long long hi, long long *v) {
    char suffix[CTL_KEY_MAX], text[32], err[CTL_ERR_MAX];
    *v = 0;
    if (ctl_unseal_reply(c, ctl_key_suffix(suffix, sizeof suffix, k, a, b), r, text, sizeof text) != 0) return -1;
    if (proto_int_parse(text, what, lo, hi, v, err, sizeof err) != 0) {
        ctl_set_error(c, "%s", err);
        *v = 0;
        return -1;
    }
    return 0;
}

/* SET key k(a, b) to v sealed: 0 / -1. */
static int set_sealed_int(ctl_t *c, ctl_key k, long long a, long long b, long long v) {
    char key[CTL_KEY_MAX], *sealed = ctl_seal_int(c, k, a, b, v);
    if (!sealed) return -1;
    ctl_make_key(c, key, sizeof key, k, a, b);
    int rc = ctl_command_ok(c, "SET %s %s", key, sealed);
    free(sealed);
    return rc;
}

/* GET key k(a, b) as a sealed integer in [0, hi]: the value, or -1 when absent, forged
 * (logged) or unreadable. */
static long long get_sealed_int(ctl_t *c, ctl_key k, long long a, long long b, const char *what, long long hi) {
    char key[CTL_KEY_MAX];
    ctl_make_key(c, key, sizeof key, k, a, b);
    redisReply *r = ctl_command(c, "GET %s", key);
    if (!r) return -1;
    long long v = -1;
    if (r->type != REDIS_REPLY_STRING || ctl_unseal_int(c, k, a, b, r, what, 0, hi, &v) != 0) v = -1;
    freeReplyObject(r);
    return v;
}

int ctl_config_set(ctl_t *c, ctl_config_field f, const char *value) {
    char key[CTL_KEY_MAX];
    const char *field = ctl_config_field_checked(c, f);
    char *sealed = field ? ctl_seal_value(c, field, value) : NULL;
    if (!sealed) return -1;
    ctl_make_key(c, key, sizeof key, KEY_CONFIG, 0, 0);
    int rc = ctl_command_ok(c, "HSET %s %s %s", key, field, sealed);
    free(sealed);
    return rc;
}

int ctl_config_get(ctl_t *c, ctl_config_field f, char *value, size_t len) {
    char key[CTL_KEY_MAX];
    const char *field = ctl_config_field_checked(c, f);
    if (!field) return -1;
    ctl_make_key(c, key, sizeof key, KEY_CONFIG, 0, 0);
    redisReply *r = ctl_command(c, "HGET %s %s", key, field);
    if (!r) return -1;
    int rc = ctl_unseal_reply(c, field, r, value, len);
    freeReplyObject(r);
    return rc;
}

int ctl_set_sealed(ctl_t *c, const char *suffix, const char *value) {
    char key[CTL_KEY_MAX], *sealed = ctl_seal_value(c, suffix, value);
    if (!sealed) return -1;
    ctl_suffix_key(c, key, sizeof key, suffix);
    int rc = ctl_command_ok(c, "SET %s %s", key, sealed);
    free(sealed);
    return rc;
}

int ctl_get_sealed(ctl_t *c, const char *suffix, char *value, size_t len) {
    char key[CTL_KEY_MAX];
    ctl_suffix_key(c, key, sizeof key, suffix);
    redisReply *r = ctl_command(c, "GET %s", key);
    if (!r) return -1;
    int rc = ctl_unseal_reply(c, suffix, r, value, len);
    freeReplyObject(r);
    return rc;
}

/* INCR of one of the job's counters: the new value, or -1. */
static long incr_key(ctl_t *c, ctl_key k) {
    char key[CTL_KEY_MAX];
    ctl_make_key(c, key, sizeof key, k, 0, 0);
    long long v;
    if (ctl_command_integer(c, &v, "INCR %s", key) != 0) return -1;
    return (long)v;
}

long ctl_new_proc_id(ctl_t *c) { return incr_key(c, KEY_PROCS); }

int ctl_proc_claim(ctl_t *c, long proc_id, long pid) {
    char key[CTL_KEY_MAX], v[32];
    ctl_make_key(c, key, sizeof key, KEY_PROC, proc_id, 0);
    long long set;
    if (ctl_command_integer(c, &set, "HSETNX %s %s %ld", key, ctl_proc_field_name(PROC_PID), pid) != 0) return -1;
    if (set == 1) return 1;
    if (ctl_proc_get(c, proc_id, PROC_PID, v, sizeof v) != 0) return -1;
    return atol(v) == pid;
}

int ctl_claim_rank(ctl_t *c, int rank, long proc_id) {
    char key[CTL_KEY_MAX], *sealed = ctl_seal_int(c, KEY_RANK, rank, 0, proc_id);
    if (!sealed) return -1;
    ctl_make_key(c, key, sizeof key, KEY_RANK, rank, 0);
    redisReply *r = ctl_command(c, "SET %s %s NX", key, sealed);
    free(sealed);
    if (!r) return -1;
    int claimed = r->type == REDIS_REPLY_STATUS; /* "OK"; NIL when the key already exists */
    freeReplyObject(r);
    return claimed;
}

long ctl_rank_owner(ctl_t *c, int rank) {
    char key[CTL_KEY_MAX];
    ctl_make_key(c, key, sizeof key, KEY_RANK, rank, 0);
    redisReply *r = ctl_command(c, "GET %s", key);
    if (!r) return -1;
    long long owner = 0;
    if (r->type == REDIS_REPLY_STRING && ctl_unseal_int(c, KEY_RANK, rank, 0, r, "rank owner", 0, LONG_MAX, &owner) != 0)
        owner = c->refused ? 0 : -1; /* forged: nobody's (a claim then finds it taken: a delay, never a member) */
    freeReplyObject(r);
    return owner;
}

int ctl_spare_add(ctl_t *c, long proc_id) {
    char key[CTL_KEY_MAX];
    ctl_make_key(c, key, sizeof key, KEY_SPARES, 0, 0);
    long long added;
    return ctl_command_integer(c, &added, "SADD %s %ld", key, proc_id);
}

int ctl_spare_remove(ctl_t *c, long proc_id) {
    char key[CTL_KEY_MAX];
    ctl_make_key(c, key, sizeof key, KEY_SPARES, 0, 0);
    long long removed;
    return ctl_command_integer(c, &removed, "SREM %s %ld", key, proc_id);
}

long ctl_spare_count(ctl_t *c) {
    char key[CTL_KEY_MAX];
    ctl_make_key(c, key, sizeof key, KEY_SPARES, 0, 0);
    long long n;
    if (ctl_command_integer(c, &n, "SCARD %s", key) != 0) return -1;
    return (long)n;
}

static int compare_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

int ctl_spare_list(ctl_t *c, long *ids, int max) {
    char key[CTL_KEY_MAX];
    ctl_make_key(c, key, sizeof key, KEY_SPARES, 0, 0);
    redisReply *r = ctl_command(c, "SMEMBERS %s", key);
    if (!r) return -1;
    int n = 0;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements && n < max; i++) {
        long long id;
        if (ctl_reply_int(NULL, r->element[i], "spare", 1, LONG_MAX, &id) == 0) ids[n++] = (long)id;
    }
    freeReplyObject(r);
    qsort(ids, (size_t)n, sizeof *ids, compare_long);
    return n;
}

int ctl_proc_set(ctl_t *c, long proc_id, ctl_proc_field f, const char *value) {
    char key[CTL_KEY_MAX];
    const char *field = ctl_proc_field_checked(c, f);
    if (!field) return -1;
    ctl_make_key(c, key, sizeof key, KEY_PROC, proc_id, 0);
    return ctl_command_ok(c, "HSET %s %s %s", key, field, value);
}

int ctl_proc_get(ctl_t *c, long proc_id, ctl_proc_field f, char *value, size_t len) {
    char key[CTL_KEY_MAX];
    const char *field = ctl_proc_field_checked(c, f);
    if (!field) return -1;
    ctl_make_key(c, key, sizeof key, KEY_PROC, proc_id, 0);
    redisReply *r = ctl_command(c, "HGET %s %s", key, field);
    if (!r) return -1;
    int rc = -1;
    if (r->type == REDIS_REPLY_STRING) rc = copy_reply_string(c, r, value, len, field);
    else ctl_set_error(c, "process %ld has no '%s'", proc_id, field);
    freeReplyObject(r);
    return rc;
}

int ctl_committed_set(ctl_t *c, long epoch, int rank, long long step, long long stateless_through) {
    if (stateless_through < 0) return set_sealed_int(c, KEY_COMMITTED, epoch, rank, step);
    char key[CTL_KEY_MAX], *sealed = ctl_seal_int(c, KEY_COMMITTED, epoch, rank, step);
    char *claim = ctl_seal_int(c, KEY_STATELESS, rank, 0, stateless_through);
    if (!sealed || !claim) {
        free(sealed);
        free(claim);
        return -1;
    }
    ctl_make_key(c, key, sizeof key, KEY_COMMITTED, epoch, rank);
    /* one MSET: atomic, so whoever reads the commit can read the claim */
    char ckey[CTL_KEY_MAX];
    ctl_make_key(c, ckey, sizeof ckey, KEY_STATELESS, rank, 0);
    int rc = ctl_command_ok(c, "MSET %s %s %s %s", ckey, claim, key, sealed);
    free(sealed);
    free(claim);
    return rc;
}

long long ctl_stateless_through(ctl_t *c, int rank) {
    return get_sealed_int(c, KEY_STATELESS, rank, 0, "stateless", LLONG_MAX);
}

int ctl_gen_bytes_set(ctl_t *c, int rank, long long bytes) { return set_sealed_int(c, KEY_GEN_BYTES, rank, 0, bytes); }


/* One MGET of keys[0..n), n <= MGET_CHUNK (argv form: the key count varies). The array reply
 * of n elements (caller frees), or NULL with c->err set. */
redisReply *ctl_mget(ctl_t *c, char (*keys)[CTL_KEY_MAX], int n) {
    const char *argv[MGET_CHUNK + 1];
    argv[0] = "MGET";
    for (int i = 0; i < n; i++) argv[i + 1] = keys[i];
    redisReply *r = ctl_argv_command(c, n + 1, argv, NULL, "MGET");
    if (r && (r->type != REDIS_REPLY_ARRAY || (int)r->elements != n)) {
        ctl_set_error(c, "redis: MGET of %d keys: expected %d values, found a reply of type %d", n, n, r->type);
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

long long ctl_committed_min(ctl_t *c, long epoch, int nranks) {
    long long *steps = malloc(sizeof *steps * (size_t)(nranks > 0 ? nranks : 1)), min = LLONG_MAX;
    if (!steps || ctl_committed_get_many(c, epoch, nranks, steps) != 0) {
        free(steps);
        return -2;
    }
    for (int i = 0; i < nranks; i++)
        if (steps[i] < min) min = steps[i]; /* -1: a rank has committed nothing */
    free(steps);
    return min == LLONG_MAX ? -1 : min;
}

long long ctl_persisted_add(ctl_t *c, long long step, int rank) {
    char key[CTL_KEY_MAX], *sealed = ctl_seal_int(c, KEY_PERSISTED, step, 0, rank);
    if (!sealed) return -1;
    ctl_make_key(c, key, sizeof key, KEY_PERSISTED, step, 0);
    /* One script: of members added at the same time only the last one sees them all, and a
     * member added again sees none (with SADD and SMEMBERS apart, two could see them all, and
     * both would finish the same checkpoint). A member is a sealed rank (the seal is the same
     * for the same rank and step, so a rank counts once); one that does not verify is
     * someone else's and counts for nothing. */
    redisReply *r = ctl_command(c, "EVAL %s 1 %s %s",
                                "if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return {} end "
                                "return redis.call('SMEMBERS', KEYS[1])",
                                key, sealed);
    free(sealed);
    if (!r) return -1;
    if (r->type != REDIS_REPLY_ARRAY) {
        ctl_set_error(c, "redis: unexpected reply to SADD+SMEMBERS");
        freeReplyObject(r);
        return -1;
    }
    long long n = 0;
    for (size_t i = 0; i < r->elements; i++) {
        long long v;
        if (r->element[i]->type == REDIS_REPLY_STRING &&
            ctl_unseal_int(c, KEY_PERSISTED, step, 0, r->element[i], "persisted rank", 0, DP_MAX_RANKS - 1, &v) == 0)
            n++;
    }
    freeReplyObject(r);
    return n;
}

int ctl_persist_complete_set(ctl_t *c, long long step) { return set_sealed_int(c, KEY_PERSIST_COMPLETE, 0, 0, step); }

long long ctl_persist_complete(ctl_t *c) { return get_sealed_int(c, KEY_PERSIST_COMPLETE, 0, 0, "persist:complete", LLONG_MAX); }

long long ctl_counter_incr(ctl_t *c, const char *name) {
    char key[CTL_KEY_MAX];
    ctl_suffix_key(c, key, sizeof key, name);
    long long v;
    if (ctl_command_integer(c, &v, "INCR %s", key) != 0) return -1;
    return v;
}

int ctl_set(ctl_t *c, const char *suffix, const char *value) {
    char key[CTL_KEY_MAX];
    ctl_suffix_key(c, key, sizeof key, suffix);
    return ctl_command_ok(c, "SET %s %s", key, value);
}

static int get_or_take(ctl_t *c, const char *cmd, const char *suffix, char *value, size_t len) {
    char key[CTL_KEY_MAX];
    ctl_suffix_key(c, key, sizeof key, suffix);
    redisReply *r = ctl_command(c, "%s %s", cmd, key);
    if (!r) return -1;
    int rc = -1;
    if (r->type == REDIS_REPLY_STRING) rc = copy_reply_string(c, r, value, len, suffix);
    else ctl_set_error(c, "key '%s' is not set", suffix);
    freeReplyObject(r);
    return rc;
}

int ctl_get(ctl_t *c, const char *suffix, char *value, size_t len) { return get_or_take(c, "GET", suffix, value, len); }
int ctl_take(ctl_t *c, const char *suffix, char *value, size_t len) { return get_or_take(c, "GETDEL", suffix, value, len); }

int ctl_set_nx(ctl_t *c, const char *suffix, const char *value) {
    char key[CTL_KEY_MAX];
    ctl_suffix_key(c, key, sizeof key, suffix);
    redisReply *r = ctl_command(c, "SET %s %s NX", key, value);
    if (!r) return -1;
    int set = r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    return set;
}

int ctl_set_rank_owner(ctl_t *c, int rank, long proc_id) { return set_sealed_int(c, KEY_RANK, rank, 0, proc_id); }

int ctl_epoch_set(ctl_t *c, long epoch) {
    char key[CTL_KEY_MAX];
    ctl_make_key(c, key, sizeof key, KEY_EPOCH, 0, 0);
    return ctl_command_ok(c, "SET %s %ld", key, epoch);
}

int ctl_heartbeat_clear(ctl_t *c, long proc_id) {
    char key[CTL_KEY_MAX];
    ctl_make_key(c, key, sizeof key, KEY_HB, proc_id, 0);
    return ctl_command_ok(c, "DEL %s", key);
}

int ctl_heartbeat(ctl_t *c, long proc_id, int ttl_ms) {
    if (ttl_ms <= 0) {
        ctl_set_error(c, "heartbeat: ttl must be positive (got %d ms)", ttl_ms);
        return -1;
    }
    char key[CTL_KEY_MAX];
    ctl_make_key(c, key, sizeof key, KEY_HB, proc_id, 0);
    return ctl_command_ok(c, "SET %s 1 PX %d", key, ttl_ms);
}

int ctl_alive(ctl_t *c, long proc_id) {
    char key[CTL_KEY_MAX];
    ctl_make_key(c, key, sizeof key, KEY_HB, proc_id, 0);
    long long n;
    if (ctl_command_integer(c, &n, "EXISTS %s", key) != 0) return -1;
    return n > 0;
}

long ctl_epoch(ctl_t *c) {
    char key[CTL_KEY_MAX];
    ctl_make_key(c, key, sizeof key, KEY_EPOCH, 0, 0);
    redisReply *r = ctl_command(c, "GET %s", key);
    if (!r) return -1;
    long long epoch = 0; /* absent before the first increment */
    if (r->type == REDIS_REPLY_STRING && ctl_reply_int(c, r, "epoch", 0, LONG_MAX, &epoch) != 0) epoch = -1;
    freeReplyObject(r);
    return epoch;
}

long ctl_epoch_incr(ctl_t *c) { return incr_key(c, KEY_EPOCH); }

/* The state is sealed: a forged "done" or "failed" would stop every process of the job and
 * lose its state in memory (it did, before it was sealed). */
int ctl_state_set(ctl_t *c, job_state state) {
    char suffix[64];
    if ((int)state < 0 || state >= JOB_STATES) {
        ctl_set_error(c, "job state %d: not a job_state", (int)state);
        return -1;
    }
    return ctl_set_sealed(c, ctl_key_suffix(suffix, sizeof suffix, KEY_STATE, 0, 0), job_state_name(state));
}

/* An absent state is 0, so a poller can tell "not set yet" (or "gone") from an error; a state
 * that does not verify is absent too (logged the first time in a row: pollers read it often). */
int ctl_state_get(ctl_t *c, job_state *state) {
    char key[CTL_KEY_MAX], suffix[64], text[32], err[CTL_ERR_MAX];
    ctl_suffix_key(c, key, sizeof key, ctl_key_suffix(suffix, sizeof suffix, KEY_STATE, 0, 0));
    redisReply *r = ctl_command(c, "GET %s", key);
    if (!r) return -1;
    int rc = 0;
    if (r->type == REDIS_REPLY_STRING) {
        job_state st = JOB_STATE_FAILED;
        rc = unseal_reply_logged(c, suffix, r, text, sizeof text, !c->state_refused) == 0 ? 1 : -1;
        c->state_refused = rc < 0 && c->refused;
        if (c->state_refused) { /* forged: as if absent */
            freeReplyObject(r);
            return 0;
        }
        if (rc == 1 && job_state_parse(text, &st, err, sizeof err) != 0) {
            ctl_set_error(c, "%s", err);
            rc = -1;
        }
        if (rc == 1) *state = st;
    }
    freeReplyObject(r);
    return rc;
}

int ctl_hash_set(ctl_t *c, const char *suffix, const char *field, const char *value) {
    char key[CTL_KEY_MAX];
    ctl_suffix_key(c, key, sizeof key, suffix);
    return ctl_command_ok(c, "HSET %s %s %s", key, field, value);
}

int ctl_hash_getall(ctl_t *c, const char *suffix, char *fields, size_t flen, char *values, size_t vlen, int max) {
    char key[CTL_KEY_MAX];
    ctl_suffix_key(c, key, sizeof key, suffix);
    redisReply *r = ctl_command(c, "HGETALL %s", key);
    if (!r) return -1;
    int n = 0;
    if (r->type == REDIS_REPLY_ARRAY)
        for (size_t i = 0; i + 1 < r->elements && n < max; i += 2) {
            const redisReply *f = r->element[i], *v = r->element[i + 1];
            if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING ||
                copy_checked(fields + (size_t)n * flen, flen, f->str, f->len) != 0 ||
                copy_checked(values + (size_t)n * vlen, vlen, v->str, v->len) != 0)
                continue;
            n++;
        }
    freeReplyObject(r);
    return n;
}

int ctl_exit_report(ctl_t *c, long proc, const ExitRecord *e) {
    char key[CTL_KEY_MAX], hb[CTL_KEY_MAX], how[EXIT_RECORD_TEXT_MAX];
    if (exit_record_format(e, how, sizeof how) != 0) {
        ctl_set_error(c, "process %ld's exit record does not format", proc);
        return -1;
    }
    ctl_key_full(c, key, sizeof key, KEY_EXIT, proc, 0);
    ctl_make_key(c, hb, sizeof hb, KEY_HB, proc, 0);
    if (ctl_batch_begin(c) != 0) return -1;
    /* How first: whoever sees the heartbeat gone finds why. */
    ctl_batch_append(c, "SET %s %s EX 86400", key, how);
    ctl_batch_append(c, "DEL %s", hb);
    return ctl_batch_end(c);
}

int ctl_committed_get_many(ctl_t *c, long epoch, int nranks, long long *steps) {
    for (int base = 0; base < nranks; base += MGET_CHUNK) {
        int n = nranks - base < MGET_CHUNK ? nranks - base : MGET_CHUNK;
        char keys[MGET_CHUNK][CTL_KEY_MAX];
        for (int i = 0; i < n; i++) ctl_make_key(c, keys[i], sizeof keys[i], KEY_COMMITTED, epoch, base + i);
        redisReply *r = ctl_mget(c, keys, n);
        if (!r) return -1;
        for (int i = 0; i < n; i++)
            if (r->element[i]->type != REDIS_REPLY_STRING ||
                ctl_unseal_int(c, KEY_COMMITTED, epoch, base + i, r->element[i], "committed", 0, LLONG_MAX, &steps[base + i]) != 0)
                steps[base + i] = -1;
        freeReplyObject(r);
    }
    return 0;
}

int ctl_stateless_through_many(ctl_t *c, const int *ranks, int n, long long *through) {
    for (int base = 0; base < n; base += MGET_CHUNK) {
        int m = n - base < MGET_CHUNK ? n - base : MGET_CHUNK;
        char keys[MGET_CHUNK][CTL_KEY_MAX];
        for (int i = 0; i < m; i++) ctl_make_key(c, keys[i], sizeof keys[i], KEY_STATELESS, ranks[base + i], 0);
        redisReply *r = ctl_mget(c, keys, m);
        if (!r) {
            for (int i = base; i < n; i++) through[i] = -1;
            return -1;
        }
        for (int i = 0; i < m; i++)
            if (r->element[i]->type != REDIS_REPLY_STRING ||
                ctl_unseal_int(c, KEY_STATELESS, ranks[base + i], 0, r->element[i], "stateless", 0, LLONG_MAX, &through[base + i]) != 0)
                through[base + i] = -1;
        freeReplyObject(r);
    }
    return 0;
}

long long ctl_gen_bytes_max(ctl_t *c, int world) {
    long long max = 0;
    for (int base = 0; base < world; base += MGET_CHUNK) {
        int n = world - base < MGET_CHUNK ? world - base : MGET_CHUNK;
        char keys[MGET_CHUNK][CTL_KEY_MAX];
        for (int i = 0; i < n; i++) ctl_make_key(c, keys[i], sizeof keys[i], KEY_GEN_BYTES, base + i, 0);
        redisReply *r = ctl_mget(c, keys, n);
        if (!r) return max;
        for (int i = 0; i < n; i++) {
            long long b;
            if (r->element[i]->type == REDIS_REPLY_STRING &&
                ctl_unseal_int(c, KEY_GEN_BYTES, base + i, 0, r->element[i], "gen_bytes", 0, LLONG_MAX, &b) == 0 && b > max)
                max = b;
        }
        freeReplyObject(r);
    }
    return max;
}

int ctl_counter_at_least(ctl_t *c, const char *name, long long value) {
    char key[CTL_KEY_MAX];
    ctl_suffix_key(c, key, sizeof key, name);
    long long v;
    return ctl_command_integer(c, &v,
                               "EVAL %s 1 %s %lld",
                               "local v = tonumber(redis.call('GET', KEYS[1]) or '0') "
                               "if v < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) return 1 end return 0",
                               key, value);
}
