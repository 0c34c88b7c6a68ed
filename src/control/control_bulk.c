/* control_bulk.c — many keys in one round trip (MGET, pipelines, MULTI/EXEC batches), the
 * wake-up and report/event/metric lists, machines joining, the launcher's liveness and the
 * coordinator's lease. */
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

/* 1 when list is a process's wake-up list (KEY_NOTICE, KEY_ABORT), else 0 with c->err set. */
static int wake_list(ctl_t *c, ctl_key list) {
    if (list == KEY_NOTICE || list == KEY_ABORT) return 1;
    ctl_set_error(c, "wake-up: key %d is not a process's wake-up list (KEY_NOTICE or KEY_ABORT)", (int)list);
    return 0;
}

int ctl_notify(ctl_t *c, long proc_id, ctl_key list, long value) {
    char key[CTL_KEY_MAX];
    if (!wake_list(c, list)) return -1;
    ctl_make_key(c, key, sizeof key, list, proc_id, 0);
    long long n;
    return ctl_command_integer(c, &n, "RPUSH %s %ld", key, value);
}

long ctl_wait_notice(ctl_t *c, long proc_id, ctl_key list, int timeout_ms) {
    char key[CTL_KEY_MAX], timeout[32];
    if (!wake_list(c, list)) return -1;
    ctl_make_key(c, key, sizeof key, list, proc_id, 0);
    /* BLPOP takes fractional seconds; the connection's own timeout must be longer. */
    snprintf(timeout, sizeof timeout, "%.3f", timeout_ms / 1000.0);
    redisReply *r = ctl_command(c, "BLPOP %s %s", key, timeout);
    if (!r) return -1;
    long long v = 0;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        ctl_reply_int(c, r->element[1], list == KEY_NOTICE ? "notice" : "abort notice", -1, LONG_MAX, &v) != 0)
        v = -1;
    freeReplyObject(r);
    return v;
}

int ctl_alive_many(ctl_t *c, const long *procs, int n, int *alive) {
    for (int base = 0; base < n; base += MGET_CHUNK) {
        int m = n - base < MGET_CHUNK ? n - base : MGET_CHUNK;
        char keys[MGET_CHUNK][CTL_KEY_MAX];
        for (int i = 0; i < m; i++) ctl_make_key(c, keys[i], sizeof keys[i], KEY_HB, procs[base + i], 0);
        redisReply *r = ctl_mget(c, keys, m);
        if (!r) return -1;
        for (int i = 0; i < m; i++) alive[base + i] = r->element[i]->type == REDIS_REPLY_STRING;
        freeReplyObject(r);
    }
    return 0;
}

/* --- bulk access ----------------------------------------------------------------------- */

int ctl_rank_owners(ctl_t *c, int nranks, long *procs) {
    for (int base = 0; base < nranks; base += MGET_CHUNK) {
        int m = nranks - base < MGET_CHUNK ? nranks - base : MGET_CHUNK;
        char keys[MGET_CHUNK][CTL_KEY_MAX];
        for (int i = 0; i < m; i++) ctl_make_key(c, keys[i], sizeof keys[i], KEY_RANK, base + i, 0);
        redisReply *r = ctl_mget(c, keys, m);
        if (!r) return -1;
        for (int i = 0; i < m; i++) {
            const redisReply *e = r->element[i];
            long long v = 0;
            if (e->type == REDIS_REPLY_STRING) ctl_unseal_int(c, KEY_RANK, base + i, 0, e, "rank owner", 0, LONG_MAX, &v);
            procs[base + i] = (long)v;
        }
        freeReplyObject(r);
    }
    return 0;
}

int ctl_get_many(ctl_t *c, const char *const *suffixes, int n, char *values, size_t len, int *present) {
    for (int base = 0; base < n; base += MGET_CHUNK) {
        int m = n - base < MGET_CHUNK ? n - base : MGET_CHUNK;
        char keys[MGET_CHUNK][CTL_KEY_MAX];
        for (int i = 0; i < m; i++) ctl_suffix_key(c, keys[i], sizeof keys[i], suffixes[base + i]);
        redisReply *r = ctl_mget(c, keys, m);
        if (!r) return -1;
        for (int i = 0; i < m; i++) {
            const redisReply *e = r->element[i];
            char *out = values + (size_t)(base + i) * len;
            int ok = e->type == REDIS_REPLY_STRING && copy_checked(out, len, e->str, e->len) == 0;
            if (!ok && len) out[0] = '\0';
            if (present) present[base + i] = ok;
        }
        freeReplyObject(r);
    }
    return 0;
}

/* Reads the n replies of a pipeline (always all of them, so that the connection stays in
 * step). 0 when none was an error, else -1 with the first error in c->err; an I/O error
 * leaves the context in error (the next call reconnects). fn, if given, sees each reply. */
static int read_pipeline(ctl_t *c, int n, const char *what, void (*fn)(int i, const redisReply *r, void *arg), void *arg) {
    int rc = 0;
    c->round_trips++;
    for (int i = 0; i < n; i++) {
        void *reply = NULL;
        if (redisGetReply(c->rc, &reply) != REDIS_OK || !reply) {
            ctl_reply_lost(c, what);
            return -1;
        }
        redisReply *r = reply;
        if (r->type == REDIS_REPLY_ERROR && rc == 0) {
            ctl_reply_refused(c, what, r->str);
            rc = -1;
        }
        if (r->type == REDIS_REPLY_ERROR && ctl_demoted_error(r->str)) c->stale = 1;
        if (fn) fn(i, r, arg);
        freeReplyObject(r);
    }
    return rc;
}

typedef struct {
    char *values;
    size_t len;
    int nfields;
} ProcFields;

static void copy_proc_fields(int i, const redisReply *r, void *arg) {
    const ProcFields *pf = arg;
    for (int f = 0; f < pf->nfields; f++) {
        char *out = pf->values + ((size_t)i * (size_t)pf->nfields + (size_t)f) * pf->len;
        const redisReply *e = r->type == REDIS_REPLY_ARRAY && (int)r->elements == pf->nfields ? r->element[f] : NULL;
        if (!e || e->type != REDIS_REPLY_STRING || copy_checked(out, pf->len, e->str, e->len) != 0) out[0] = '\0';
    }
}

int ctl_proc_get_many(ctl_t *c, const long *procs, int n, const ctl_proc_field *fields, int nfields, char *values,
                      size_t len) {
    if (nfields < 1 || nfields > 8 || len == 0) {
        ctl_set_error(c, "ctl_proc_get_many: %d fields, %zu-byte values", nfields, len);
        return -1;
    }
    const char *names[8];
    for (int f = 0; f < nfields; f++)
        if (!(names[f] = ctl_proc_field_checked(c, fields[f]))) return -1;
    for (size_t i = 0; i < (size_t)n * (size_t)nfields; i++) values[i * len] = '\0';
    if (n <= 0) return 0;
    if (ctl_ensure_connected(c) != 0) return -1;
    for (int i = 0; i < n; i++) {
        char key[CTL_KEY_MAX];
        const char *argv[10];
        ctl_make_key(c, key, sizeof key, KEY_PROC, procs[i], 0);
        argv[0] = "HMGET";
        argv[1] = key;
        for (int f = 0; f < nfields; f++) argv[2 + f] = names[f];
        if (redisAppendCommandArgv(c->rc, 2 + nfields, argv, NULL) != REDIS_OK) {
            ctl_set_error(c, "redis: HMGET: cannot queue the command");
            redisFree(c->rc); /* drop what was queued: the next call reconnects */
            c->rc = NULL;
            return -1;
        }
    }
    ProcFields pf = {values, len, nfields};
    return read_pipeline(c, n, "HMGET", copy_proc_fields, &pf);
}

int ctl_batch_begin(ctl_t *c) {
    c->batch_n = 0;
    c->batch_failed = 0;
    c->batch_multi = 0;
    if (ctl_ensure_connected(c) != 0) {
        c->batch_failed = 1;
        return -1;
    }
    return 0;
}

int ctl_batch_begin_atomic(ctl_t *c) {
    if (ctl_batch_begin(c) != 0) return -1;
    if (redisAppendCommand(c->rc, "MULTI") != REDIS_OK) {
        c->batch_failed = 1;
        return -1;
    }
    c->batch_multi = 1;
    return 0;
}

/* The EXEC reply of an atomic batch: nil (aborted) or any error inside fails the batch. */
static void check_exec(int i, const redisReply *r, void *arg) {
    int *bad = arg, last = bad[1];
    if (i != last) return;
    if (r->type != REDIS_REPLY_ARRAY) { bad[0] = 1; return; }
    for (size_t k = 0; k < r->elements; k++)
        if (r->element[k]->type == REDIS_REPLY_ERROR) bad[0] = 1;
}

void ctl_batch_append(ctl_t *c, const char *fmt, ...) {
    if (c->batch_failed) return;
    va_list ap;
    va_start(ap, fmt);
    int rc = redisvAppendCommand(c->rc, fmt, ap);
    va_end(ap);
    if (rc == REDIS_OK) c->batch_n++;
    else c->batch_failed = 1;
}

void ctl_batch_set(ctl_t *c, const char *suffix, const char *value) {
    char key[CTL_KEY_MAX];
    ctl_suffix_key(c, key, sizeof key, suffix);
    ctl_batch_append(c, "SET %s %s", key, value);
}

void ctl_batch_set_sealed(ctl_t *c, const char *suffix, const char *value) {
    char *sealed = c->batch_failed ? NULL : ctl_seal_value(c, suffix, value);
    if (sealed) ctl_batch_set(c, suffix, sealed);
    else c->batch_failed = 1;
    free(sealed);
}

void ctl_batch_rank_owner(ctl_t *c, int rank, long proc_id) {
    char key[CTL_KEY_MAX], *sealed = c->batch_failed ? NULL : ctl_seal_int(c, KEY_RANK, rank, 0, proc_id);
    if (!sealed) {
        c->batch_failed = 1;
        return;
    }
    ctl_make_key(c, key, sizeof key, KEY_RANK, rank, 0);
    ctl_batch_append(c, "SET %s %s", key, sealed);
    free(sealed);
}

void ctl_batch_epoch(ctl_t *c, long epoch) {
    char key[CTL_KEY_MAX];
    ctl_make_key(c, key, sizeof key, KEY_EPOCH, 0, 0);
    ctl_batch_append(c, "SET %s %ld", key, epoch);
}

void ctl_batch_notify(ctl_t *c, long proc_id, ctl_key list, long value) {
    char key[CTL_KEY_MAX];
    if (!wake_list(c, list)) {
        c->batch_failed = 1;
        return;
    }
    ctl_make_key(c, key, sizeof key, list, proc_id, 0);
    ctl_batch_append(c, "RPUSH %s %ld", key, value);
}

void ctl_batch_spare_remove(ctl_t *c, long proc_id) {
    char key[CTL_KEY_MAX];
    ctl_make_key(c, key, sizeof key, KEY_SPARES, 0, 0);
    ctl_batch_append(c, "SREM %s %ld", key, proc_id);
}

void ctl_batch_push_key(ctl_t *c, const char *key, const char *value, int ttl_s) {
    ctl_batch_append(c, "RPUSH %s %s", key, value);
    ctl_batch_append(c, "EXPIRE %s %d", key, ttl_s);
}

int ctl_batch_end(ctl_t *c) {
    int n = c->batch_n, failed = c->batch_failed, multi = c->batch_multi;
    c->batch_n = 0;
    c->batch_failed = 0;
    c->batch_multi = 0;
    if (multi) {
        /* MULTI is queued: end the transaction, or discard it when a command could not be
         * queued; either way MULTI, the commands and EXEC/DISCARD each have a reply. */
        if (redisAppendCommand(c->rc, failed ? "DISCARD" : "EXEC") != REDIS_OK) {
            redisFree(c->rc); /* the transaction cannot be closed: drop the connection */
            c->rc = NULL;
            ctl_set_error(c, "redis: transaction: cannot queue EXEC");
            return -1;
        }
        int bad[2] = {0, n + 1};
        int rc = read_pipeline(c, n + 2, "transaction", check_exec, bad);
        if (rc == 0 && (bad[0] || failed)) {
            ctl_set_error(c, "redis: transaction: %s", failed ? "a command could not be queued" : "not executed");
            rc = -1;
        }
        return rc;
    }
    if (n == 0) {
        if (failed) ctl_set_error(c, "redis: pipeline: %s", c->rc && c->rc->errstr[0] ? c->rc->errstr : "not connected");
        return failed ? -1 : 0;
    }
    int rc = read_pipeline(c, n, "pipeline", NULL, NULL);
    if (failed && rc == 0) {
        ctl_set_error(c, "redis: pipeline: a command could not be queued");
        rc = -1;
    }
    return rc;
}

int ctl_notify_many(ctl_t *c, const long *procs, int n, ctl_key list, long value) {
    if (ctl_batch_begin(c) != 0) return -1;
    for (int i = 0; i < n; i++) ctl_batch_notify(c, procs[i], list, value);
    return ctl_batch_end(c);
}

/* ------------------------------------------------------------------------------------- */
/* event and metric lists                                                                 */
/* ------------------------------------------------------------------------------------- */

static int push_to_list(ctl_t *c, ctl_key list, const char *json) {
    char key[CTL_KEY_MAX];
    ctl_make_key(c, key, sizeof key, list, 0, 0);
    long long len;
    return ctl_command_integer(c, &len, "RPUSH %s %s", key, json);
}

int ctl_push_event(ctl_t *c, const char *json) { return push_to_list(c, KEY_EVENTS, json); }
/* Reports are sealed: one tells the launcher the job is done, where the model went, or that
 * it diverged. (A genuine report replayed says what it said once; the kinds that end a job
 * are sent once, at its end.) */
#define REPORTS_SEAL_NAME "reports"
int ctl_push_report(ctl_t *c, const char *text) {
    char *sealed = ctl_seal_value(c, REPORTS_SEAL_NAME, text);
    if (!sealed) return -1;
    int rc = push_to_list(c, KEY_REPORTS, sealed);
    free(sealed);
    return rc;
}

/* The line goes to the launcher that drains the list, and stays readable as the newest
 * progress for the launchers of the other machines: one round trip for both. */
int ctl_push_metric(ctl_t *c, const char *json) {
    char key[CTL_KEY_MAX], last[CTL_KEY_MAX];
    ctl_make_key(c, key, sizeof key, KEY_METRICS, 0, 0);
    ctl_key_full(c, last, sizeof last, KEY_PROGRESS, 0, 0);
    if (ctl_batch_begin(c) != 0) return -1;
    ctl_batch_append(c, "RPUSH %s %s", key, json);
    ctl_batch_append(c, "SET %s %s", last, json);
    return ctl_batch_end(c);
}

/* Reads the four pipelined replies of MULTI / LRANGE / LTRIM / EXEC and returns the EXEC
 * reply (an array whose first element is the LRANGE result), or NULL with c->err set. */
static redisReply *read_drain_transaction(ctl_t *c) {
    redisReply *exec = NULL;
    int failed = 0;
    for (int i = 0; i < 4; i++) {
        void *reply = NULL;
        if (redisGetReply(c->rc, &reply) != REDIS_OK || !reply) {
            ctl_reply_lost(c, "drain");
            if (exec) freeReplyObject(exec);
            return NULL; /* the context is now in error; the next call reconnects */
        }
        redisReply *r = reply;
        if (r->type == REDIS_REPLY_ERROR && !failed) {
            ctl_reply_refused(c, "drain", r->str);
            failed = 1;
        }
        if (i == 3) exec = r;
        else freeReplyObject(r);
    }
    if (failed || exec->type != REDIS_REPLY_ARRAY || exec->elements != 2 ||
        exec->element[0]->type != REDIS_REPLY_ARRAY) {
        if (!failed) ctl_set_error(c, "redis: drain: transaction was not executed");
        freeReplyObject(exec);
        return NULL;
    }
    return exec;
}

int ctl_drain(ctl_t *c, ctl_key list, int max, void (*fn)(const char *json, void *arg), void *arg) {
    if (list != KEY_EVENTS && list != KEY_METRICS && list != KEY_REPORTS) {
        char name[CTL_KEY_MAX];
        ctl_set_error(c, "drain: '%s' is not a list to drain (expected KEY_EVENTS, KEY_METRICS or KEY_REPORTS)",
                      ctl_key_suffix(name, sizeof name, list, 0, 0));
        return -1;
    }
    if (max < 0) {
        ctl_set_error(c, "drain: max must not be negative (got %d)", max);
        return -1;
    }
    if (max == 0) return 0;
    if (ctl_ensure_connected(c) != 0) return -1;
    char key[CTL_KEY_MAX];
    ctl_make_key(c, key, sizeof key, list, 0, 0);
    /* LRANGE + LTRIM in one transaction: atomic against concurrent pushes, one round trip,
     * and works on Redis versions without "LPOP key count". */
    redisAppendCommand(c->rc, "MULTI");
    redisAppendCommand(c->rc, "LRANGE %s 0 %d", key, max - 1);
    redisAppendCommand(c->rc, "LTRIM %s %d -1", key, max);
    redisAppendCommand(c->rc, "EXEC");
    c->round_trips++;
    redisReply *exec = read_drain_transaction(c);
    if (!exec) return -1;
    redisReply *items = exec->element[0];
    int n = (int)items->elements;
    for (int i = 0; i < n && fn; i++) {
        const redisReply *e = items->element[i];
        if (e->type != REDIS_REPLY_STRING) continue;
        if (list != KEY_REPORTS) {
            fn(e->str, arg);
            continue;
        }
        char *text = malloc(e->len + 1); /* a sealed value is longer than what it seals */
        if (text && ctl_unseal_reply(c, REPORTS_SEAL_NAME, e, text, e->len + 1) == 0) fn(text, arg); /* refused: logged */
        free(text);
    }
    freeReplyObject(exec);
    return n;
}

int ctl_launcher_beat(ctl_t *c, const char *who, int ttl_ms) {
    char key[CTL_KEY_MAX], seen[CTL_KEY_MAX];
    ctl_key_full(c, key, sizeof key, KEY_LAUNCHER, 0, 0);
    ctl_key_full(c, seen, sizeof seen, KEY_LAUNCHER_SEEN, 0, 0);
    char now[32];
    if (proto_int_format((long long)wall_ms(), now, sizeof now) != 0) return -1;
    return ctl_command_ok(c, "SET %s %s PX %d", key, who, ttl_ms) == 0 && ctl_command_ok(c, "SET %s %s", seen, now) == 0
               ? 0
               : -1;
}

int ctl_node_join(ctl_t *c, const char *node_id, int *index) {
    char nodes[CTL_KEY_MAX], count[CTL_KEY_MAX];
    ctl_key_full(c, nodes, sizeof nodes, KEY_NODES, 0, 0);
    ctl_key_full(c, count, sizeof count, KEY_NODE_COUNT, 0, 0);
    long long added, n;
    /* The id first: a second launcher with the same id must not take an index (a gap in
     * 0..N-1 would leave a machine's ranks unstarted). */
    if (ctl_command_integer(c, &added, "HSETNX %s %s -1", nodes, node_id) != 0) return -1; /* -1: joining */
    if (!added) { /* the id is known: a launcher of this machine that is gone takes its place back */
        redisReply *r = ctl_command(c, "HGET %s %s", nodes, node_id);
        if (!r) return -1;
        long long v = -1;
        if (r->type != REDIS_REPLY_STRING || proto_int_parse(r->str, "node index", -1, INT_MAX, &v, NULL, 0) != 0) v = -1;
        int idx = (int)v;
        freeReplyObject(r);
        char alive[CTL_KEY_MAX];
        long long exists = 1;
        ctl_key_full(c, alive, sizeof alive, KEY_NODE_ALIVE, idx, 0);
        if (idx < 0 || ctl_command_integer(c, &exists, "EXISTS %s", alive) != 0 || exists) return 0;
        *index = idx;
        return 1;
    }
    if (ctl_command_integer(c, &n, "INCR %s", count) != 0) return -1;
    *index = (int)(n - 1);
    if (ctl_command_ok(c, "HSET %s %s %d", nodes, node_id, *index) != 0) return -1;
    return 1;
}

int ctl_node_beat(ctl_t *c, int index, int ttl_ms) {
    char key[CTL_KEY_MAX];
    ctl_key_full(c, key, sizeof key, KEY_NODE_ALIVE, index, 0);
    return ctl_command_ok(c, "SET %s 1 PX %d", key, ttl_ms);
}

int ctl_nodes_read(ctl_t *c, char *ids, size_t idlen, int *index, int max) {
    char suffix[CTL_KEY_MAX], (*v)[16] = malloc(sizeof *v * (size_t)(max > 0 ? max : 1));
    int n = v ? ctl_hash_getall(c, ctl_key_suffix(suffix, sizeof suffix, KEY_NODES, 0, 0), ids, idlen, v[0], sizeof v[0], max) : -1;
    for (int i = 0; i < n; i++) {
        long long x;
        index[i] = proto_int_parse(v[i], "node index", -1, INT_MAX, &x, NULL, 0) == 0 ? (int)x : -1;
    }
    free(v);
    return n;
}

long long ctl_lease_acquire(ctl_t *c, const char *holder, int ttl_ms, char *value, size_t len) {
    static const char *script =
        "if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end "
        "local t = redis.call('INCR', KEYS[2]) "
        "redis.call('SET', KEYS[1], ARGV[1] .. ':' .. t, 'PX', ARGV[2]) return t";
    char key[CTL_KEY_MAX], token[CTL_KEY_MAX];
    ctl_key_full(c, key, sizeof key, KEY_COORD, 0, 0);
    ctl_key_full(c, token, sizeof token, KEY_COORD_TOKEN, 0, 0);
    long long t;
    /* Redis writes the value (HOLDER .. ':' .. TOKEN) as lease_value_format does: a holder
     * the format refuses is refused here, before anything is taken. */
    LeaseValue lv = {.token = 1};
    snprintf(lv.holder, sizeof lv.holder, "%s", holder);
    if (strlen(holder) >= sizeof lv.holder || lease_value_format(&lv, value, len) != 0) {
        ctl_set_error(c, "lease: holder '%.80s' is not 1 to 63 of [A-Za-z0-9_.-]", holder);
        return -1;
    }
    if (ctl_command_integer(c, &t, "EVAL %s 2 %s %s %s %d", script, key, token, holder, ttl_ms) != 0) return -1;
    lv.token = t;
    if (t > 0 && lease_value_format(&lv, value, len) != 0) {
        ctl_set_error(c, "lease: the value does not fit %zu bytes", len);
        return -1;
    }
    return t;
}

int ctl_lease_renew(ctl_t *c, const char *value, int ttl_ms) {
    static const char *script =
        "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1";
    char key[CTL_KEY_MAX];
    ctl_key_full(c, key, sizeof key, KEY_COORD, 0, 0);
    long long r;
    if (ctl_command_integer(c, &r, "EVAL %s 1 %s %s %d", script, key, value, ttl_ms) != 0) return -1;
    return r == 1;
}

int ctl_batch_begin_fenced(ctl_t *c, const char *value) {
    char key[CTL_KEY_MAX];
    ctl_key_full(c, key, sizeof key, KEY_COORD, 0, 0);
    if (ctl_command_ok(c, "WATCH %s", key) != 0) return -1;
    redisReply *r = ctl_command(c, "GET %s", key);
    int ours = r && r->type == REDIS_REPLY_STRING && !strcmp(r->str, value);
    if (r) freeReplyObject(r);
    if (!ours) {
        ctl_command_ok(c, "UNWATCH");
        ctl_set_error(c, "the coordinator's lease is no longer ours: a newer coordinator decides");
        return -1;
    }
    return ctl_batch_begin_atomic(c);
}

int ctl_launcher_alive(ctl_t *c) {
    char key[CTL_KEY_MAX];
    ctl_key_full(c, key, sizeof key, KEY_LAUNCHER, 0, 0);
    long long n;
    if (ctl_command_integer(c, &n, "EXISTS %s", key) != 0) return -1;
    return n > 0;
}
