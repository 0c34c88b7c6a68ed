/* control_keys.c — the job's key namespace "dp:{job}:": the key table (the only place a key
 * name is spelled), the hash fields' names, keys built from it, and what spans a whole
 * namespace: deleting a job's keys, a dead run's keys, other jobs' orphaned keys. */
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

#define CTL_DELETE_BATCH 512

/* --- BEGIN the key table: the only place key names are spelled (tests/e2e_code.sh) ------
 * Every key of a job is KEY_NS JOB ":" SUFFIX, SUFFIX one of KEY_NAMES with each '#' replaced
 * by a number (a, then b: control.h's ctl_key says which) or, in a SCAN pattern, by '*'. */
#define KEY_NS "dp:"
#define KEY_ANY "*"                 /* a SCAN pattern's wildcard (any job, any key) */
#define KEY_FRESH_CLAIM "dp-fresh:" /* + JOB: ctl_job_dead_run_delete's claim, outside the job's keys */
static const char *const KEY_NAMES[KEY_COUNT] = {
    [KEY_CONFIG] = "config",
    [KEY_PROCS] = "procs",
    [KEY_RANK] = "rank:#",
    [KEY_SPARES] = "spares",
    [KEY_PROC] = "proc:#",
    [KEY_COMMITTED] = "e#:committed:#",
    [KEY_EPOCH] = "epoch",
    [KEY_NOTICE] = "notice:#",
    [KEY_ABORT] = "abort:#",
    [KEY_HB] = "hb:#",
    [KEY_STATE] = "state",
    [KEY_EVENTS] = "events",
    [KEY_METRICS] = "metrics",
    [KEY_REPORTS] = "reports",
    [KEY_DECISION] = "decision:#",
    [KEY_HOLDERS] = "e#:holders:#",
    [KEY_FENCED] = "e#:fenced",
    [KEY_GLOO] = "e#:gloo",
    [KEY_APP] = "e#:app:",
    [KEY_TIMING] = "e#:timing:#",
    [KEY_INJECTED] = "injected:#:#",
    [KEY_CHAOS] = "chaos:#",
    [KEY_FAULT_LAST] = "fault:last:#",
    [KEY_LAST_STEP] = "last_step",
    [KEY_PERSIST_REQ] = "persist:req",
    [KEY_PERSISTED] = "persisted:#",
    [KEY_JOIN_STATS] = "e#:join:#",
    [KEY_LAUNCHER] = "launcher",
    [KEY_LAUNCHER_SEEN] = "launcher:seen",
    [KEY_NODES] = "nodes",
    [KEY_NODE_COUNT] = "nodes:n",
    [KEY_NODE_ALIVE] = "node:#:alive",
    [KEY_EXIT] = "exit:#",
    [KEY_PROGRESS] = "metrics:last",
    [KEY_COORD] = "coordinator",
    [KEY_COORD_TOKEN] = "coordinator:token",
    [KEY_PERSIST_COMPLETE] = "persist:complete",
    [KEY_INVENTORY] = "inventory",
    [KEY_RESUME_HOLDER] = "resume:holder:#",
    [KEY_STATELESS] = "stateless:#",
    [KEY_GEN_BYTES] = "gen_bytes:#",
};
/* The fields of the two hashes (control.h: ctl_config_field, ctl_proc_field). */
static const char *const CONFIG_FIELD_NAMES[CFG_FIELDS] = {
    [CFG_CONFIG] = "config",
    [CFG_T0_MS] = "t0_ms",
};
static const char *const PROC_FIELD_NAMES[PROC_FIELDS] = {
    [PROC_REPLICA] = "replica",
    [PROC_HOST] = "host",
    [PROC_NODE] = "node",
    [PROC_PID] = "pid",
    [PROC_HELD] = "held",
};
/* --- END the key table ----------------------------------------------------------------- */

const char *ctl_config_field_name(ctl_config_field f) {
    return (int)f >= 0 && f < CFG_FIELDS ? CONFIG_FIELD_NAMES[f] : "?";
}
const char *ctl_proc_field_name(ctl_proc_field f) { return (int)f >= 0 && f < PROC_FIELDS ? PROC_FIELD_NAMES[f] : "?"; }

/* Key k's suffix into buf: its numbers a then b, or '*' for each when pattern. */
static const char *expand_key(char *buf, size_t len, ctl_key k, long long a, long long b, int pattern) {
    const char *name = k >= 0 && k < KEY_COUNT && KEY_NAMES[k] ? KEY_NAMES[k] : "unknown";
    size_t used = 0;
    int nth = 0;
    if (len == 0) return buf;
    for (const char *p = name; *p && used + 1 < len; p++) {
        if (*p != '#') {
            buf[used++] = *p;
            continue;
        }
        int n = pattern ? snprintf(buf + used, len - used, "%s", KEY_ANY) : snprintf(buf + used, len - used, "%lld", nth++ ? b : a);
        used = n < 0 || (size_t)n >= len - used ? len - 1 : used + (size_t)n;
    }
    buf[used] = 0;
    return buf;
}

/* KEY_NS JOB ":" SUFFIX into key. */
static void job_key(char *key, size_t cap, const char *job, const char *suffix) {
    snprintf(key, cap, KEY_NS "%s:%s", job, suffix);
}

/* This job's key k with its numbers a and b. */
const char *ctl_make_key(const ctl_t *c, char *key, size_t cap, ctl_key k, long long a, long long b) {
    char suffix[CTL_KEY_MAX];
    job_key(key, cap, c->job, expand_key(suffix, sizeof suffix, k, a, b, 0));
    return key;
}

/* A job key from a suffix the caller formed (ctl_key_suffix's, or a test's own). */
void ctl_suffix_key(const ctl_t *c, char *key, size_t cap, const char *suffix) { job_key(key, cap, c->job, suffix); }

/* ------------------------------------------------------------------------------------- */
/* the hash fields' names; keys built from the table                                    */
/* ------------------------------------------------------------------------------------- */

/* A field of ctl_config_field / ctl_proc_field: its name, or NULL with c's error set. */
const char *ctl_config_field_checked(ctl_t *c, ctl_config_field f) {
    if ((int)f >= 0 && f < CFG_FIELDS) return CONFIG_FIELD_NAMES[f];
    ctl_set_error(c, "config field %d: not a ctl_config_field", (int)f);
    return NULL;
}
const char *ctl_proc_field_checked(ctl_t *c, ctl_proc_field f) {
    if ((int)f >= 0 && f < PROC_FIELDS) return PROC_FIELD_NAMES[f];
    ctl_set_error(c, "process field %d: not a ctl_proc_field", (int)f);
    return NULL;
}

const char *ctl_key_suffix(char *buf, size_t len, ctl_key k, long long a, long long b) {
    return expand_key(buf, len, k, a, b, 0);
}

const char *ctl_key_pattern(const ctl_t *c, char *buf, size_t len, ctl_key k) {
    char suffix[CTL_KEY_MAX];
    job_key(buf, len, c->job, expand_key(suffix, sizeof suffix, k, 0, 0, 1));
    return buf;
}

const char *ctl_key_full(const ctl_t *c, char *buf, size_t len, ctl_key k, long long a, long long b) {
    return ctl_make_key(c, buf, len, k, a, b);
}

/* ------------------------------------------------------------------------------------- */
/* job deletion                                                                           */
/* ------------------------------------------------------------------------------------- */

/* DEL the keys of one SCAN page (argv built from the reply's strings). */
static int delete_scan_page(ctl_t *c, const redisReply *keys) {
    size_t done = 0;
    while (done < keys->elements) {
        size_t batch = keys->elements - done;
        if (batch > CTL_DELETE_BATCH) batch = CTL_DELETE_BATCH;
        const char *argv[CTL_DELETE_BATCH + 1];
        size_t argvlen[CTL_DELETE_BATCH + 1];
        argv[0] = "DEL";
        argvlen[0] = 3;
        for (size_t i = 0; i < batch; i++) {
            argv[i + 1] = keys->element[done + i]->str;
            argvlen[i + 1] = keys->element[done + i]->len;
        }
        redisReply *r = ctl_argv_command(c, (int)batch + 1, argv, argvlen, "DEL");
        if (!r) return -1;
        freeReplyObject(r);
        done += batch;
    }
    return 0;
}

/* Calls page(c, keys, arg) for each SCAN page of keys matching pattern (never KEYS, which
 * blocks the server). page returns 0 to go on, 1 to stop early, -1 on error. */
static int scan_pages(ctl_t *c, const char *pattern, int (*page)(ctl_t *, const redisReply *, void *), void *arg) {
    char cursor[32] = "0";
    do {
        redisReply *r = ctl_command(c, "SCAN %s MATCH %s COUNT 1000", cursor, pattern);
        if (!r) return -1;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY ||
            copy_checked(cursor, sizeof cursor, r->element[0]->str, r->element[0]->len) != 0) {
            ctl_set_error(c, "redis: SCAN: unexpected reply");
            freeReplyObject(r);
            return -1;
        }
        int rc = page(c, r->element[1], arg);
        freeReplyObject(r);
        if (rc != 0) return rc < 0 ? -1 : 0;
    } while (strcmp(cursor, "0") != 0);
    return 0;
}

static int delete_page(ctl_t *c, const redisReply *keys, void *arg) {
    (void)arg;
    return delete_scan_page(c, keys);
}

/* Deletes every key "dp:{job}:*". This also removes the comm layer's rendezvous keys, which
 * live under the same prefix. Deleting while scanning is safe: SCAN still returns every key
 * that existed for the whole scan. */
static int delete_job_keys(ctl_t *c, const char *job) {
    char pattern[CTL_KEY_MAX];
    job_key(pattern, sizeof pattern, job, KEY_ANY);
    return scan_pages(c, pattern, delete_page, NULL);
}

int ctl_job_delete(ctl_t *c) {
    if (ctl_ensure_connected(c) != 0) return -1;
    return delete_job_keys(c, c->job);
}

static int any_key_page(ctl_t *c, const redisReply *keys, void *arg) {
    (void)c;
    if (keys->elements == 0) return 0;
    *(int *)arg = 1;
    return 1;
}

/* Collects the job names of a page of KEY_CONFIG keys of any job into arg (a char[][CTL_JOB_MAX+1] list). */
typedef struct {
    char (*jobs)[CTL_JOB_MAX + 1];
    int n, cap;
} JobList;

static int config_page(ctl_t *c, const redisReply *keys, void *arg) {
    (void)c;
    JobList *l = arg;
    char tail[CTL_KEY_MAX]; /* ":" + the config key's suffix */
    tail[0] = ':';
    expand_key(tail + 1, sizeof tail - 1, KEY_CONFIG, 0, 0, 0);
    size_t ns = strlen(KEY_NS), tl = strlen(tail);
    for (size_t i = 0; i < keys->elements && l->n < l->cap; i++) {
        const redisReply *k = keys->element[i];
        if (k->type != REDIS_REPLY_STRING || k->len <= ns + tl || strncmp(k->str, KEY_NS, ns) != 0) continue;
        size_t jl = k->len - ns - tl;
        if (jl == 0 || jl > CTL_JOB_MAX || strcmp(k->str + ns + jl, tail) != 0) continue;
        memcpy(l->jobs[l->n], k->str + ns, jl);
        l->jobs[l->n][jl] = 0;
        if (ctl_job_name_valid(l->jobs[l->n])) l->n++;
    }
    return 0;
}

int ctl_job_dead_run(ctl_t *c, long long *seen_ms) {
    if (seen_ms) *seen_ms = 0;
    if (ctl_ensure_connected(c) != 0) return -1;
    char key[CTL_KEY_MAX], suffix[32], pattern[CTL_KEY_MAX];
    long long n;
    ctl_make_key(c, key, sizeof key, KEY_CONFIG, 0, 0);
    if (ctl_command_integer(c, &n, "EXISTS %s", key) != 0) return -1;
    if (n == 0) return 0;
    ctl_key_full(c, key, sizeof key, KEY_LAUNCHER, 0, 0);
    if (ctl_command_integer(c, &n, "EXISTS %s", key) != 0) return -1;
    if (n > 0) return 0;
    static const ctl_key alive[] = {KEY_NODE_ALIVE, KEY_HB};
    for (int i = 0; i < 2; i++) {
        int live = 0;
        ctl_key_pattern(c, pattern, sizeof pattern, alive[i]);
        if (scan_pages(c, pattern, any_key_page, &live) != 0) return -1;
        if (live) return 0;
    }
    char seen[32] = "";
    long long t;
    if (seen_ms && ctl_get(c, ctl_key_suffix(suffix, sizeof suffix, KEY_LAUNCHER_SEEN, 0, 0), seen, sizeof seen) == 0 &&
        proto_int_parse(seen, "launcher:seen", 0, LLONG_MAX, &t, NULL, 0) == 0)
        *seen_ms = t;
    return 1;
}

int ctl_job_dead_run_delete(ctl_t *c, int ttl_ms) {
    if (ctl_ensure_connected(c) != 0) return -1;
    /* the claim is outside the job's keys (KEY_NS JOB ":*"): the deletion leaves it standing */
    char claim[CTL_KEY_MAX];
    snprintf(claim, sizeof claim, KEY_FRESH_CLAIM "%s", c->job);
    redisReply *r = ctl_command(c, "SET %s 1 NX PX %d", claim, ttl_ms);
    if (!r) return -1;
    int got = r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (!got) return 0;
    return delete_job_keys(c, c->job) == 0 ? 1 : -1;
}

int ctl_orphan_jobs_delete(ctl_t *c, long long grace_ms) {
    if (ctl_ensure_connected(c) != 0) return -1;
    enum { MAX_SEEN = 4096 }; /* a first pass is enough: the next launcher sweeps again */
    JobList l = {.jobs = malloc(sizeof *l.jobs * MAX_SEEN), .n = 0, .cap = MAX_SEEN};
    if (!l.jobs) return -1;
    int removed = 0;
    char configs[CTL_KEY_MAX], cs[CTL_KEY_MAX];
    job_key(configs, sizeof configs, KEY_ANY, expand_key(cs, sizeof cs, KEY_CONFIG, 0, 0, 0));
    if (scan_pages(c, configs, config_page, &l) != 0) { free(l.jobs); return -1; }
    for (int i = 0; i < l.n; i++) {
        if (strcmp(l.jobs[i], c->job) == 0) continue;
        char key[CTL_KEY_MAX], pattern[CTL_KEY_MAX];
        long long n;
        char suffix[32];
        job_key(key, sizeof key, l.jobs[i], ctl_key_suffix(suffix, sizeof suffix, KEY_LAUNCHER, 0, 0));
        if (ctl_command_integer(c, &n, "EXISTS %s", key) != 0) { removed = -1; break; }
        if (n > 0) continue;
        char seen[32], full[CTL_KEY_MAX];
        job_key(full, sizeof full, l.jobs[i], ctl_key_suffix(suffix, sizeof suffix, KEY_LAUNCHER_SEEN, 0, 0));
        redisReply *r = ctl_command(c, "GET %s", full);
        if (!r) { removed = -1; break; }
        long long t = 0;
        int judged = r->type == REDIS_REPLY_STRING && copy_checked(seen, sizeof seen, r->str, r->len) == 0 &&
                     proto_int_parse(seen, "launcher:seen", 0, LLONG_MAX, &t, NULL, 0) == 0;
        freeReplyObject(r);
        if (!judged || wall_ms() - t < grace_ms) continue; /* too recent, or not ours */
        int live = 0; /* a heartbeat: some process of that job still runs */
        char hbs[CTL_KEY_MAX];
        job_key(pattern, sizeof pattern, l.jobs[i], expand_key(hbs, sizeof hbs, KEY_HB, 0, 0, 1));
        if (scan_pages(c, pattern, any_key_page, &live) != 0) { removed = -1; break; }
        if (live) continue;
        if (delete_job_keys(c, l.jobs[i]) != 0) { removed = -1; break; }
        removed++;
    }
    free(l.jobs);
    return removed;
}
