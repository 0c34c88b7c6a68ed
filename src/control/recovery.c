/* recovery.c — (de)serialising, publishing and reading membership decisions. */
#include "recovery.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "events.h"
#include "util.h"

int decision_format(const Decision *d, char *buf, size_t len) {
    size_t used = 0;
    if (d->world < 1 || d->world > RECOVERY_MAX_RANKS || d->nfailed < 0 || d->nfailed > d->world) return -1;
    /* Only what decision_parse accepts. */
    for (int r = 0; r < d->world; r++)
        if (d->procs[r] <= 0) return -1;
    for (int i = 0; i < d->nfailed; i++) {
        const FailedRank *f = &d->failed[i];
        if (f->rank < 0 || f->rank >= d->world || f->old_proc <= 0 || f->spare_proc != d->procs[f->rank] ||
            !f->kind[0] || strpbrk(f->kind, ": \n"))
            return -1;
    }
#define APPEND(...)                                                              \
    do {                                                                         \
        int n_ = snprintf(buf + used, len - used, __VA_ARGS__);                  \
        if (n_ < 0 || (size_t)n_ >= len - used) return -1;                       \
        used += (size_t)n_;                                                      \
    } while (0)
    if (len == 0) return -1;
    APPEND("epoch=%ld\nworld=%d\nrollback=%lld\n", d->epoch, d->world, d->rollback);
    APPEND("t_fail_ms=%" PRId64 "\nt_detect_ms=%" PRId64 "\nt_decide_ms=%" PRId64 "\n", d->t_fail_ms, d->t_detect_ms,
           d->t_decide_ms);
    for (int r = 0; r < d->world; r++) APPEND("rank=%d:%ld\n", r, d->procs[r]);
    APPEND("nfailed=%d\n", d->nfailed);
    for (int i = 0; i < d->nfailed; i++)
        APPEND("failed=%d:%s:%ld:%ld\n", d->failed[i].rank, d->failed[i].kind, d->failed[i].old_proc,
               d->failed[i].spare_proc);
#undef APPEND
    return 0;
}

/* Parses a whole decimal integer in [lo, hi] from s[0..n). 0 / -1. */
static int parse_int_in(const char *s, size_t n, long long lo, long long hi, long long *v) {
    char tmp[32];
    if (n == 0 || n >= sizeof tmp) return -1;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    const char *digits = tmp[0] == '-' ? tmp + 1 : tmp;
    if (!*digits) return -1;
    for (const char *q = digits; *q; q++)
        if (*q < '0' || *q > '9') return -1;
    errno = 0;
    char *end;
    long long x = strtoll(tmp, &end, 10);
    if (errno || *end || x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

/* Splits s[0..n) at ':' into at most max fields. The number of fields. */
static int split_fields(const char *s, size_t n, const char **f, size_t *flen, int max) {
    int k = 0;
    const char *p = s, *end = s + n;
    for (;;) {
        const char *c = memchr(p, ':', (size_t)(end - p));
        if (k == max) return max + 1;
        f[k] = p;
        flen[k] = c ? (size_t)(c - p) : (size_t)(end - p);
        k++;
        if (!c) return k;
        p = c + 1;
    }
}

enum { SEEN_EPOCH = 1, SEEN_WORLD = 2, SEEN_ROLLBACK = 4, SEEN_TFAIL = 8, SEEN_TDETECT = 16, SEEN_TDECIDE = 32,
       SEEN_NFAILED = 64, SEEN_ALL = 127 };

/* "rank=RANK:PROC" (val, vlen) of line (n bytes, number lineno) into d. 0 / -1 + err. */
static int parse_rank_line(const char *line, size_t n, int lineno, const char *val, size_t vlen, Decision *d,
                           int *maxrank, char *err, size_t errlen) {
    const char *f[3];
    size_t fl[3];
    long long r, p;
    if (split_fields(val, vlen, f, fl, 2) != 2 || parse_int_in(f[1], fl[1], 1, LONG_MAX, &p) != 0)
        return snprintf(err, errlen, "decision line %d: '%.*s' is not rank=RANK:PROC", lineno, (int)(n < 60 ? n : 60), line), -1;
    if (parse_int_in(f[0], fl[0], 0, RECOVERY_MAX_RANKS - 1, &r) != 0)
        return snprintf(err, errlen, "decision line %d: rank '%.*s' out of [0, %d)", lineno, (int)(fl[0] < 40 ? fl[0] : 40),
                        f[0], RECOVERY_MAX_RANKS), -1;
    if (d->procs[r]) return snprintf(err, errlen, "decision line %d: rank %lld given twice", lineno, r), -1;
    d->procs[r] = (long)p;
    if (r > *maxrank) *maxrank = (int)r;
    return 0;
}

/* "failed=RANK:KIND:OLD_PROC:SPARE_PROC" into d. 0 / -1 + err. */
static int parse_failed_line(const char *line, size_t n, int lineno, const char *val, size_t vlen, Decision *d,
                             char *err, size_t errlen) {
    const char *f[5];
    size_t fl[5];
    long long r, p, q;
    if (split_fields(val, vlen, f, fl, 4) != 4 || fl[1] == 0 || fl[1] >= sizeof d->failed[0].kind ||
        memchr(f[1], ' ', fl[1]) || parse_int_in(f[2], fl[2], 1, LONG_MAX, &p) != 0 ||
        parse_int_in(f[3], fl[3], 1, LONG_MAX, &q) != 0)
        return snprintf(err, errlen, "decision line %d: '%.*s' is not failed=RANK:KIND:OLD_PROC:SPARE_PROC", lineno,
                        (int)(n < 60 ? n : 60), line), -1;
    if (parse_int_in(f[0], fl[0], 0, RECOVERY_MAX_RANKS - 1, &r) != 0)
        return snprintf(err, errlen, "decision line %d: failed rank '%.*s' out of [0, %d)", lineno,
                        (int)(fl[0] < 40 ? fl[0] : 40), f[0], RECOVERY_MAX_RANKS), -1;
    if (d->nfailed >= RECOVERY_MAX_RANKS) return snprintf(err, errlen, "decision line %d: too many failed ranks", lineno), -1;
    for (int i = 0; i < d->nfailed; i++)
        if (d->failed[i].rank == (int)r) return snprintf(err, errlen, "decision line %d: rank %lld failed twice", lineno, r), -1;
    FailedRank *fr = &d->failed[d->nfailed++];
    fr->rank = (int)r;
    memcpy(fr->kind, f[1], fl[1]);
    fr->kind[fl[1]] = 0;
    fr->old_proc = (long)p;
    fr->spare_proc = (long)q;
    return 0;
}

/* The parsed decision as a whole: every key seen, every rank owned, the failed ranks' count
 * and owners consistent. 0 / -1 + err. */
static int decision_check(const Decision *d, int seen, int nfailed, int maxrank, char *err, size_t errlen) {
    if (seen != SEEN_ALL) {
        static const char *names[] = {"epoch", "world", "rollback", "t_fail_ms", "t_detect_ms", "t_decide_ms", "nfailed"};
        for (int b = 0; b < 7; b++)
            if (!(seen & (1 << b))) return snprintf(err, errlen, "decision has no %s (truncated text?)", names[b]), -1;
    }
    if (maxrank >= d->world) return snprintf(err, errlen, "decision names rank %d, world is %d", maxrank, d->world), -1;
    for (int r = 0; r < d->world; r++)
        if (!d->procs[r])
            return snprintf(err, errlen, "decision has no owner for rank %d of %d (truncated text?)", r, d->world), -1;
    if (d->nfailed != nfailed)
        return snprintf(err, errlen, "decision lists %d failed ranks, nfailed says %d (truncated text?)", d->nfailed,
                        nfailed), -1;
    for (int i = 0; i < d->nfailed; i++) {
        const FailedRank *f = &d->failed[i];
        if (f->rank >= d->world) return snprintf(err, errlen, "decision: failed rank %d, world is %d", f->rank, d->world), -1;
        if (d->procs[f->rank] != f->spare_proc)
            return snprintf(err, errlen, "decision: failed rank %d goes to %ld but its owner is %ld", f->rank,
                            f->spare_proc, d->procs[f->rank]), -1;
    }
    return 0;
}

int decision_parse(const char *text, Decision *d, char *err, size_t errlen) {
    char dummy[8];
    if (!err || errlen == 0) { err = dummy; errlen = sizeof dummy; }
    err[0] = 0;
    memset(d, 0, sizeof *d);
    int seen = 0, nfailed = -1, maxrank = -1, lineno = 0;
    const char *line = text;
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); goto bad; } while (0)
    while (*line) {
        lineno++;
        const char *nl = strchr(line, '\n');
        if (!nl) BAD("decision line %d ('%.40s') is not terminated: truncated text", lineno, line);
        size_t n = (size_t)(nl - line);
        const char *eq = memchr(line, '=', n);
        if (!eq) BAD("decision line %d ('%.*s') is not key=value", lineno, (int)(n < 40 ? n : 40), line);
        size_t klen = (size_t)(eq - line), vlen = n - klen - 1;
        const char *val = eq + 1;
        long long v;
#define KEY(k) (klen == sizeof(k) - 1 && memcmp(line, k, klen) == 0)
#define ONCE(bit) do { if (seen & (bit)) BAD("decision line %d: '%.*s' given twice", lineno, (int)klen, line); seen |= (bit); } while (0)
#define NUM(lo, hi) do { if (parse_int_in(val, vlen, (lo), (hi), &v) != 0) BAD("decision line %d: bad value '%.*s' for %.*s", lineno, (int)(vlen < 40 ? vlen : 40), val, (int)klen, line); } while (0)
        if (KEY("epoch")) { ONCE(SEEN_EPOCH); NUM(0, LONG_MAX); d->epoch = (long)v; }
        else if (KEY("world")) {
            ONCE(SEEN_WORLD);
            if (parse_int_in(val, vlen, LLONG_MIN, LLONG_MAX, &v) != 0 || v < 1 || v > RECOVERY_MAX_RANKS)
                BAD("decision line %d: world '%.*s' out of [1, %d]", lineno, (int)(vlen < 40 ? vlen : 40), val,
                    RECOVERY_MAX_RANKS);
            d->world = (int)v;
        }
        else if (KEY("rollback")) { ONCE(SEEN_ROLLBACK); NUM(-1, LLONG_MAX); d->rollback = v; }
        else if (KEY("t_fail_ms")) { ONCE(SEEN_TFAIL); NUM(INT64_MIN, INT64_MAX); d->t_fail_ms = v; }
        else if (KEY("t_detect_ms")) { ONCE(SEEN_TDETECT); NUM(INT64_MIN, INT64_MAX); d->t_detect_ms = v; }
        else if (KEY("t_decide_ms")) { ONCE(SEEN_TDECIDE); NUM(INT64_MIN, INT64_MAX); d->t_decide_ms = v; }
        else if (KEY("nfailed")) { ONCE(SEEN_NFAILED); NUM(0, RECOVERY_MAX_RANKS); nfailed = (int)v; }
        else if (KEY("rank")) { if (parse_rank_line(line, n, lineno, val, vlen, d, &maxrank, err, errlen) != 0) goto bad; }
        else if (KEY("failed")) { if (parse_failed_line(line, n, lineno, val, vlen, d, err, errlen) != 0) goto bad; }
        else BAD("decision line %d: unknown key '%.*s'", lineno, (int)(klen < 40 ? klen : 40), line);
#undef KEY
#undef ONCE
#undef NUM
        line = nl + 1;
    }
#undef BAD
    if (decision_check(d, seen, nfailed, maxrank, err, errlen) != 0) goto bad;
    return 0;
bad:
    memset(d, 0, sizeof *d);
    return -1;
}

/* One transaction, so one round trip whatever the world: all of it happens or none of it,
 * in order (the decision and the new owners are in place before the epoch counter moves, and
 * the members are woken last). */
int decision_publish(ctl_t *c, const Decision *d, const char *fence) {
    char *text = malloc(DECISION_TEXT_MAX), key[64]; /* 128 KiB: not on a thread's stack */
    if (!text || decision_format(d, text, DECISION_TEXT_MAX) != 0 ||
        (fence ? ctl_batch_begin_fenced(c, fence) : ctl_batch_begin_atomic(c)) != 0) {
        free(text);
        return -1;
    }
    ctl_batch_set_sealed(c, ctl_key_suffix(key, sizeof key, KEY_DECISION, d->epoch, 0), text);
    for (int i = 0; i < d->nfailed; i++) ctl_batch_rank_owner(c, d->failed[i].rank, d->failed[i].spare_proc);
    ctl_batch_epoch(c, d->epoch);
    /* Under Sentinel, members act on the decision only once a replica has it: a failover
     * right after it cannot lose an epoch they already joined. */
    int replicated = ctl_replicated(c);
    for (int r = 0; r < d->world && !replicated; r++) ctl_batch_notify(c, d->procs[r], KEY_NOTICE, d->epoch);
    int rc = ctl_batch_end(c);
    free(text);
    if (rc == 0 && replicated) {
        if (ctl_wait_replica(c, 1000) != 0) log_msg("the decision of epoch %ld is not on a replica yet", d->epoch);
        rc = ctl_notify_many(c, d->procs, d->world, KEY_NOTICE, d->epoch);
    }
    return rc;
}

int decision_read(ctl_t *c, long epoch, Decision *d) {
    char *text = malloc(DECISION_TEXT_MAX), key[64], err[256];
    int rc = -1;
    ctl_mark(c); /* a join's round trips count from reading its decision (KEY_JOIN_STATS) */
    if (text && ctl_get_sealed(c, ctl_key_suffix(key, sizeof key, KEY_DECISION, epoch, 0), text, DECISION_TEXT_MAX) == 0) {
        rc = decision_parse(text, d, err, sizeof err);
        if (rc != 0) log_msg("decision of epoch %ld refused: %s", epoch, err);
    }
    free(text);
    return rc;
}

int decision_rank_of(const Decision *d, long proc_id) {
    for (int r = 0; r < d->world; r++)
        if (d->procs[r] == proc_id) return r;
    return -1;
}

int decision_rank_replaced(const Decision *d, int rank) {
    for (int i = 0; i < d->nfailed; i++)
        if (d->failed[i].rank == rank) return 1;
    return 0;
}

int holders_record(ctl_t *c, long epoch, int rank, const char *list) {
    char key[64];
    return ctl_set_sealed(c, ctl_key_suffix(key, sizeof key, KEY_HOLDERS, epoch, rank), list);
}

int holders_read(ctl_t *c, long epoch, int rank, char *list, size_t len) {
    char key[64];
    return ctl_get_sealed(c, ctl_key_suffix(key, sizeof key, KEY_HOLDERS, epoch, rank), list, len);
}

int holders_format(const Holder *h, int n, char *out, size_t len) {
    size_t used = 0;
    if (len) out[0] = 0;
    for (int i = 0; i < n; i++) {
        int w = snprintf(out + used, len - used, "%s%ld@%s:%d", i ? "," : "", h[i].proc, h[i].host, h[i].port);
        if (w < 0 || (size_t)w >= len - used) return -1;
        used += (size_t)w;
    }
    return 0;
}

int holders_parse(const char *list, Holder *out, int max) {
    int n = 0;
    const char *p = list;
    while (*p && n < max) {
        const char *end = strchr(p, ',');
        size_t tl = end ? (size_t)(end - p) : strlen(p);
        char tok[300];
        if (tl >= sizeof tok) return -1;
        memcpy(tok, p, tl);
        tok[tl] = 0;
        char *at = strchr(tok, '@'), *colon = strrchr(tok, ':'), *e1, *e2;
        if (!at || !colon || colon < at) return -1;
        *at = 0;
        *colon = 0;
        long proc = strtol(tok, &e1, 10);
        long port = strtol(colon + 1, &e2, 10);
        if (*e1 || *e2 || proc <= 0 || port <= 0 || port > 65535 || !at[1] || strlen(at + 1) >= sizeof out->host)
            return -1;
        out[n].proc = proc;
        out[n].port = (int)port;
        snprintf(out[n].host, sizeof out[n].host, "%s", at + 1);
        n++;
        p += tl + (end ? 1 : 0);
    }
    return n;
}

int fence_epoch(ctl_t *c, long epoch) {
    char key[64];
    return ctl_set(c, ctl_key_suffix(key, sizeof key, KEY_FENCED, epoch, 0), "1");
}

void batch_fence_epoch(ctl_t *c, long epoch) {
    char key[64];
    ctl_batch_set(c, ctl_key_suffix(key, sizeof key, KEY_FENCED, epoch, 0), "1");
}

int epoch_fenced(ctl_t *c, long epoch) {
    char key[64], v[8];
    return ctl_get(c, ctl_key_suffix(key, sizeof key, KEY_FENCED, epoch, 0), v, sizeof v) == 0 ? 1 : 0;
}

/* --- reports --------------------------------------------------------------------------- */

static const char *const REPORT_NAMES[REPORT_KINDS] = {"comm_failure", "join_failed", "recovered", "diverged",
                                                       "job_done",     "model_saved", "link_down"};
static const char *const PHASE_NAMES[JOIN_PHASES] = {"rendezvous", "restore"};

const char *report_kind_name(report_kind k) { return k >= 0 && k < REPORT_KINDS ? REPORT_NAMES[k] : "?"; }
const char *join_phase_name(join_phase p) { return p >= 0 && p < JOIN_PHASES ? PHASE_NAMES[p] : "?"; }

static int report_valid(const Report *r) {
    return r->kind >= 0 && r->kind < REPORT_KINDS && r->phase >= 0 && r->phase < JOIN_PHASES && r->epoch >= -1 &&
           r->rank >= -1 && r->rank < RECOVERY_MAX_RANKS && r->step >= -1 && r->t_wall_ms >= 0 &&
           memchr(r->text, 0, sizeof r->text) != NULL;
}

int report_format(const Report *r, char *buf, size_t len) {
    if (!report_valid(r)) return -1;
    int n = snprintf(buf, len, "%s %ld %d %lld %" PRId64 " %s\n%s", REPORT_NAMES[r->kind], r->epoch, r->rank, r->step,
                     r->t_wall_ms, PHASE_NAMES[r->phase], r->text);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

static int name_index(const char *s, size_t n, const char *const *names, int count) {
    for (int i = 0; i < count; i++)
        if (strlen(names[i]) == n && memcmp(s, names[i], n) == 0) return i;
    return -1;
}

int report_parse(const char *text, size_t n, Report *r, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    const char *nl = memchr(text, '\n', n);
    if (!nl) return set_err(err, errlen, "report: no header line"), -1;
    /* the header: six fields separated by single spaces */
    const char *f[6];
    size_t fl[6];
    const char *p = text;
    for (int i = 0; i < 6; i++) {
        const char *end = i < 5 ? memchr(p, ' ', (size_t)(nl - p)) : nl;
        if (!end) return set_err(err, errlen, "report: expected 6 header fields, found %d", i + 1), -1;
        f[i] = p;
        fl[i] = (size_t)(end - p);
        p = end + 1;
    }
    if (memchr(f[5], ' ', fl[5])) return set_err(err, errlen, "report: more than 6 header fields"), -1;
    long long epoch, rank, step, t;
    int kind = name_index(f[0], fl[0], REPORT_NAMES, REPORT_KINDS), phase = name_index(f[5], fl[5], PHASE_NAMES, JOIN_PHASES);
    if (kind < 0) return set_err(err, errlen, "report: unknown kind '%.*s'", (int)(fl[0] < 32 ? fl[0] : 32), f[0]), -1;
    if (phase < 0) return set_err(err, errlen, "report: unknown phase '%.*s'", (int)(fl[5] < 32 ? fl[5] : 32), f[5]), -1;
    if (parse_int_in(f[1], fl[1], -1, LONG_MAX, &epoch) != 0 || parse_int_in(f[2], fl[2], -1, RECOVERY_MAX_RANKS - 1, &rank) != 0 ||
        parse_int_in(f[3], fl[3], -1, LLONG_MAX, &step) != 0 || parse_int_in(f[4], fl[4], 0, LLONG_MAX, &t) != 0)
        return set_err(err, errlen, "report: a number out of range or malformed (epoch, rank < %d, step, time)", RECOVERY_MAX_RANKS), -1;
    size_t tl = n - (size_t)(nl + 1 - text);
    if (tl >= sizeof r->text) return set_err(err, errlen, "report: text of %zu bytes, at most %zu", tl, sizeof r->text - 1), -1;
    if (memchr(nl + 1, 0, tl)) return set_err(err, errlen, "report: a NUL byte in the text"), -1;
    r->kind = (report_kind)kind;
    r->phase = (join_phase)phase;
    r->epoch = (long)epoch;
    r->rank = (int)rank;
    r->step = step;
    r->t_wall_ms = (int64_t)t;
    memcpy(r->text, nl + 1, tl);
    r->text[tl] = 0;
    return 0;
}

int report_send(ctl_t *c, int64_t t0_wall_ms, const Report *r) {
    char buf[REPORT_TEXT_MAX], esc[2 * sizeof r->text];
    if (report_format(r, buf, sizeof buf) != 0) return -1;
    int rc = ctl_push_report(c, buf);
    json_escape(r->text, esc, sizeof esc);
    switch (r->kind) { /* the event line of the same record */
    case REPORT_COMM_FAILURE:
        event_emit(c, t0_wall_ms, "comm_failure", "\"rank\":%d,\"step\":%lld,\"epoch\":%ld,\"message\":\"%s\"", r->rank,
                   r->step, r->epoch, esc);
        break;
    case REPORT_JOIN_FAILED:
        event_emit(c, t0_wall_ms, "join_failed", "\"rank\":%d,\"epoch\":%ld,\"phase\":\"%s\",\"message\":\"%s\"", r->rank,
                   r->epoch, PHASE_NAMES[r->phase], esc);
        break;
    case REPORT_DIVERGED: event_emit(c, t0_wall_ms, "diverged", "\"step\":%lld,\"message\":\"%s\"", r->step, esc); break;
    case REPORT_JOB_DONE: event_emit(c, t0_wall_ms, "job_done", "\"steps\":%lld", r->step); break;
    case REPORT_MODEL_SAVED: event_emit(c, t0_wall_ms, "model_saved", "\"path\":\"%s\"", esc); break;
    case REPORT_RECOVERED: /* its line, with the recovery's timings, is the runtime's "recovered" */
    case REPORT_LINK_DOWN: /* ... and "fault_injected" */
    case REPORT_KINDS: break;
    }
    return rc;
}
