/* protocol.c — the control plane's values: one format/parse pair each (protocol.h). */
#include "protocol.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "util.h"

/* How much of a found field an error message quotes. */
#define QUOTE 40
#define Q(n) (int)((n) < QUOTE ? (n) : QUOTE)

/* A field: s[0..n) of a value. */
typedef struct {
    const char *s;
    size_t n;
} Field;

/* Splits s at sep into exactly `want` fields (the last runs to the end). The number found
 * when it is not `want` (counting on past `want`), else want. */
static int split(const char *s, char sep, Field *f, int want) {
    int k = 0;
    const char *p = s;
    for (;;) {
        const char *c = strchr(p, sep);
        if (k < want) {
            f[k].s = p;
            f[k].n = c ? (size_t)(c - p) : strlen(p);
        }
        k++;
        if (!c) return k;
        p = c + 1;
    }
}

/* A whole decimal integer in [lo, hi] from f: an optional '-', 1 to 19 digits. 0 / -1. */
static int int_field(Field f, long long lo, long long hi, long long *v) {
    size_t i = f.n > 0 && f.s[0] == '-' ? 1 : 0;
    if (f.n <= i || f.n - i > 19) return -1;
    for (size_t k = i; k < f.n; k++)
        if (f.s[k] < '0' || f.s[k] > '9') return -1;
    char tmp[24];
    memcpy(tmp, f.s, f.n);
    tmp[f.n] = 0;
    errno = 0;
    char *end;
    long long x = strtoll(tmp, &end, 10);
    if (errno || *end || x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

/* A duration: 1 to 12 digits, optionally '.' and 1 to 3 digits. 0 / -1. */
static int ms_field(Field f, double *v) {
    size_t i = 0, ip = 0, fp = 0;
    while (i < f.n && f.s[i] >= '0' && f.s[i] <= '9') i++, ip++;
    if (i < f.n && f.s[i] == '.') {
        i++;
        while (i < f.n && f.s[i] >= '0' && f.s[i] <= '9') i++, fp++;
        if (fp == 0) return -1;
    }
    if (i != f.n || ip == 0 || ip > 12 || fp > 3) return -1;
    char tmp[24];
    memcpy(tmp, f.s, f.n);
    tmp[f.n] = 0;
    *v = strtod(tmp, NULL);
    return 0;
}

static int ms_ok(double v) { return isfinite(v) && v >= 0 && v < 1e12; }

/* Appends one formatted piece to buf (used so far in *used). 0 / -1 when it does not fit. */
static int put(char *buf, size_t len, size_t *used, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int put(char *buf, size_t len, size_t *used, const char *fmt, ...) {
    if (*used >= len) return -1;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *used, len - *used, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= len - *used) return -1;
    *used += (size_t)n;
    return 0;
}

/* --- integers ------------------------------------------------------------------------- */

int proto_int_format(long long v, char *buf, size_t len) {
    size_t used = 0;
    return put(buf, len, &used, "%lld", v);
}

int proto_int_parse(const char *s, const char *what, long long lo, long long hi, long long *v, char *err, size_t errlen) {
    Field f = {s, strlen(s)};
    *v = 0;
    if (int_field(f, lo, hi, v) != 0) {
        set_err(err, errlen, "%s: expected an integer in [%lld, %lld], found '%.*s'", what, lo, hi, Q(f.n), s);
        return -1;
    }
    return 0;
}

/* --- KEY_FAULT_LAST -------------------------------------------------------------------- */

static int kind_ok(const char *k, size_t n) {
    if (n == 0 || n > 15) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((k[i] >= 'a' && k[i] <= 'z') || k[i] == '_')) return 0;
    return 1;
}

int fault_record_format(const FaultRecord *f, char *buf, size_t len) {
    size_t n = strnlen(f->kind, sizeof f->kind), used = 0;
    if (!kind_ok(f->kind, n) || f->rank < 0 || f->rank >= DP_MAX_RANKS || f->wall_ms < 0) return -1;
    return put(buf, len, &used, "%s:%d:%" PRId64, f->kind, f->rank, f->wall_ms);
}

int fault_record_parse(const char *s, FaultRecord *f, char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    Field x[3];
    long long rank, t;
    int n = split(s, ':', x, 3);
    if (n != 3) return set_err(err, errlen, "fault record: expected KIND:RANK:WALL_MS (3 fields), found %d in '%.*s'", n, Q(strlen(s)), s), -1;
    if (!kind_ok(x[0].s, x[0].n))
        return set_err(err, errlen, "fault record: kind: expected 1 to 15 of [a-z_], found '%.*s'", Q(x[0].n), x[0].s), -1;
    if (int_field(x[1], 0, DP_MAX_RANKS - 1, &rank) != 0)
        return set_err(err, errlen, "fault record: rank: expected an integer in [0, %d), found '%.*s'", DP_MAX_RANKS, Q(x[1].n), x[1].s), -1;
    if (int_field(x[2], 0, INT64_MAX, &t) != 0)
        return set_err(err, errlen, "fault record: wall_ms: expected an integer >= 0, found '%.*s'", Q(x[2].n), x[2].s), -1;
    memcpy(f->kind, x[0].s, x[0].n);
    f->rank = (int)rank;
    f->wall_ms = t;
    return 0;
}

/* --- KEY_PERSIST_REQ ------------------------------------------------------------------- */

int persist_request_format(const PersistRequest *p, char *buf, size_t len) {
    size_t used = 0;
    if (p->epoch < 0 || p->step < 0 || p->writer < -1 || p->writer >= DP_MAX_RANKS || p->nfailed < 0 ||
        p->nfailed > DP_MAX_RANKS)
        return -1;
    for (int i = 0; i < p->nfailed; i++) {
        if (p->failed[i] < 0 || p->failed[i] >= DP_MAX_RANKS) return -1;
        for (int j = 0; j < i; j++)
            if (p->failed[j] == p->failed[i]) return -1;
    }
    if (put(buf, len, &used, "%ld:%lld:%d:", p->epoch, p->step, p->writer) != 0) return -1;
    for (int i = 0; i < p->nfailed; i++)
        if (put(buf, len, &used, "%s%d", i ? "," : "", p->failed[i]) != 0) return -1;
    return 0;
}

int persist_request_parse(const char *s, PersistRequest *p, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    Field x[4];
    long long e, g, w;
    int n = split(s, ':', x, 4);
    if (n != 4)
        return set_err(err, errlen, "persist request: expected EPOCH:STEP:WRITER:RANKS (4 fields), found %d in '%.*s'", n,
                       Q(strlen(s)), s), -1;
    if (int_field(x[0], 0, LONG_MAX, &e) != 0)
        return set_err(err, errlen, "persist request: epoch: expected an integer >= 0, found '%.*s'", Q(x[0].n), x[0].s), -1;
    if (int_field(x[1], 0, LLONG_MAX, &g) != 0)
        return set_err(err, errlen, "persist request: step: expected an integer >= 0, found '%.*s'", Q(x[1].n), x[1].s), -1;
    if (int_field(x[2], -1, DP_MAX_RANKS - 1, &w) != 0)
        return set_err(err, errlen, "persist request: writer: expected a rank in [-1, %d), found '%.*s'", DP_MAX_RANKS,
                       Q(x[2].n), x[2].s), -1;
    unsigned char seen[(DP_MAX_RANKS + 7) / 8] = {0};
    const char *q = x[3].s, *end = x[3].s + x[3].n;
    int k = 0;
    while (x[3].n > 0) {
        const char *c = memchr(q, ',', (size_t)(end - q));
        Field r = {q, c ? (size_t)(c - q) : (size_t)(end - q)};
        long long rank;
        if (int_field(r, 0, DP_MAX_RANKS - 1, &rank) != 0) {
            memset(p, 0, sizeof *p);
            return set_err(err, errlen, "persist request: failed rank %d: expected an integer in [0, %d), found '%.*s'", k + 1,
                           DP_MAX_RANKS, Q(r.n), r.s), -1;
        }
        if (seen[rank / 8] & (1u << (rank % 8))) {
            memset(p, 0, sizeof *p);
            return set_err(err, errlen, "persist request: failed rank %lld listed twice", rank), -1;
        }
        seen[rank / 8] |= (unsigned char)(1u << (rank % 8));
        p->failed[k++] = (int)rank;
        if (!c) break;
        q = c + 1;
    }
    p->epoch = (long)e;
    p->step = g;
    p->writer = (int)w;
    p->nfailed = k;
    return 0;
}

/* --- KEY_TIMING and KEY_JOIN_STATS ---------------------------------------------------- */

int join_timing_format(const JoinTiming *t, char *buf, size_t len) {
    size_t used = 0;
    if (!ms_ok(t->restore_ms) || !ms_ok(t->rebuild_ms) || !ms_ok(t->resnapshot_ms) || t->resumed_wall_ms < 0 ||
        (t->warm != 0 && t->warm != 1))
        return -1;
    if (put(buf, len, &used, "%.3f %.3f %.3f %" PRId64 " %d", t->restore_ms, t->rebuild_ms, t->resnapshot_ms,
            t->resumed_wall_ms, t->warm) != 0)
        return -1;
    JoinTiming back; /* a value just under 10^12 may round up to 13 digits */
    return join_timing_parse(buf, &back, NULL, 0);
}

int join_timing_parse(const char *s, JoinTiming *t, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    static const char *const names[] = {"restore_ms", "rebuild_ms", "resnapshot_ms", "resumed_wall_ms", "warm"};
    Field x[5];
    int n = split(s, ' ', x, 5);
    if (n != 5)
        return set_err(err, errlen, "join timing: expected RESTORE_MS REBUILD_MS RESNAPSHOT_MS RESUMED_WALL_MS WARM "
                       "(5 fields, single spaces), found %d in '%.*s'", n, Q(strlen(s)), s), -1;
    double *ms[] = {&t->restore_ms, &t->rebuild_ms, &t->resnapshot_ms};
    for (int i = 0; i < 3; i++)
        if (ms_field(x[i], ms[i]) != 0) {
            memset(t, 0, sizeof *t);
            return set_err(err, errlen, "join timing: %s: expected a duration in ms (up to 12 digits, 3 decimals), found '%.*s'",
                           names[i], Q(x[i].n), x[i].s), -1;
        }
    long long w, warm;
    if (int_field(x[3], 0, INT64_MAX, &w) != 0) {
        memset(t, 0, sizeof *t);
        return set_err(err, errlen, "join timing: resumed_wall_ms: expected an integer >= 0, found '%.*s'", Q(x[3].n), x[3].s), -1;
    }
    if (int_field(x[4], 0, 1, &warm) != 0) {
        memset(t, 0, sizeof *t);
        return set_err(err, errlen, "join timing: warm: expected 0 or 1, found '%.*s'", Q(x[4].n), x[4].s), -1;
    }
    t->resumed_wall_ms = w;
    t->warm = (int)warm;
    return 0;
}

int join_stats_format(const JoinStats *s, char *buf, size_t len) {
    size_t used = 0;
    if (s->ctl_round_trips < 0 || s->store_round_trips < 0 || !ms_ok(s->rendezvous_ms) || !ms_ok(s->barrier_ms) ||
        !ms_ok(s->wait_ms) || !ms_ok(s->connect_ms) || s->entered_wall_ms < 0 || s->dialed < 0 || s->accepted < 0)
        return -1;
    if (put(buf, len, &used, "%lld %lld %.3f %.3f %.3f %.3f %" PRId64 " %lld %lld", s->ctl_round_trips,
            s->store_round_trips, s->rendezvous_ms, s->barrier_ms, s->wait_ms, s->connect_ms, s->entered_wall_ms,
            s->dialed, s->accepted) != 0)
        return -1;
    JoinStats back;
    return join_stats_parse(buf, &back, NULL, 0);
}

int join_stats_parse(const char *text, JoinStats *s, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    static const char *const names[] = {"ctl_round_trips", "store_round_trips", "rendezvous_ms", "barrier_ms",
                                        "wait_ms",         "connect_ms",        "entered_wall_ms", "dialed",
                                        "accepted"};
    Field x[9];
    int n = split(text, ' ', x, 9);
    if (n != 9)
        return set_err(err, errlen, "join stats: expected CTL_RTT STORE_RTT RENDEZVOUS_MS BARRIER_MS WAIT_MS CONNECT_MS "
                       "ENTERED_WALL_MS DIALED ACCEPTED (9 fields, single spaces), found %d in '%.*s'", n,
                       Q(strlen(text)), text), -1;
    long long *ints[] = {&s->ctl_round_trips, &s->store_round_trips};
    double *ms[] = {&s->rendezvous_ms, &s->barrier_ms, &s->wait_ms, &s->connect_ms};
    long long w;
    int bad = -1;
    for (int i = 0; i < 2 && bad < 0; i++)
        if (int_field(x[i], 0, LLONG_MAX, ints[i]) != 0) bad = i;
    for (int i = 0; i < 4 && bad < 0; i++)
        if (ms_field(x[2 + i], ms[i]) != 0) bad = 2 + i;
    if (bad < 0 && int_field(x[6], 0, INT64_MAX, &w) != 0) bad = 6;
    if (bad < 0 && int_field(x[7], 0, INT_MAX, &s->dialed) != 0) bad = 7;
    if (bad < 0 && int_field(x[8], 0, INT_MAX, &s->accepted) != 0) bad = 8;
    if (bad >= 0) {
        memset(s, 0, sizeof *s);
        return set_err(err, errlen, "join stats: %s: expected %s, found '%.*s'", names[bad],
                       bad >= 2 && bad < 6 ? "a duration in ms (up to 12 digits, 3 decimals)"
                       : bad >= 7 ? "an integer 0..2147483647" : "an integer >= 0",
                       Q(x[bad].n), x[bad].s), -1;
    }
    s->entered_wall_ms = w;
    return 0;
}

/* --- KEY_EXIT -------------------------------------------------------------------------- */

static const char *const EXIT_HOWS[EXITED_HOWS] = {"crash", "departed", "bad_job"};

int exit_record_format(const ExitRecord *e, char *buf, size_t len) {
    size_t used = 0;
    if (e->how < 0 || e->how >= EXITED_HOWS || e->wall_ms < 0) return -1;
    return put(buf, len, &used, "%s:%" PRId64, EXIT_HOWS[e->how], e->wall_ms);
}

int exit_record_parse(const char *s, ExitRecord *e, char *err, size_t errlen) {
    memset(e, 0, sizeof *e);
    Field x[2];
    long long t;
    int n = split(s, ':', x, 2), how = -1;
    if (n != 2) return set_err(err, errlen, "exit record: expected HOW:WALL_MS (2 fields), found %d in '%.*s'", n, Q(strlen(s)), s), -1;
    for (int i = 0; i < EXITED_HOWS; i++)
        if (strlen(EXIT_HOWS[i]) == x[0].n && !memcmp(EXIT_HOWS[i], x[0].s, x[0].n)) how = i;
    if (how < 0)
        return set_err(err, errlen, "exit record: how: expected crash, departed or bad_job, found '%.*s'", Q(x[0].n), x[0].s), -1;
    if (int_field(x[1], 0, INT64_MAX, &t) != 0)
        return set_err(err, errlen, "exit record: wall_ms: expected an integer >= 0, found '%.*s'", Q(x[1].n), x[1].s), -1;
    e->how = (exit_how)how;
    e->wall_ms = t;
    return 0;
}

/* --- KEY_LAUNCHER ---------------------------------------------------------------------- */

static int host_char_ok(unsigned char ch, int space_ok) { return ch > 0x20 ? ch != 0x7f : space_ok && ch == ' '; }

int launcher_id_format(const LauncherId *l, char *buf, size_t len) {
    size_t n = strnlen(l->host, sizeof l->host), used = 0;
    if (n >= sizeof l->host || l->pid <= 0) return -1;
    for (size_t i = 0; i < n; i++)
        if (!host_char_ok((unsigned char)l->host[i], 0)) return -1;
    return put(buf, len, &used, "%s %d", l->host, l->pid);
}

int launcher_id_parse(const char *s, LauncherId *l, char *err, size_t errlen) {
    memset(l, 0, sizeof *l);
    Field x[2];
    long long pid;
    int n = split(s, ' ', x, 2);
    if (n != 2) return set_err(err, errlen, "launcher: expected HOST PID (2 fields, one space), found %d in '%.*s'", n, Q(strlen(s)), s), -1;
    if (x[0].n >= sizeof l->host) return set_err(err, errlen, "launcher: host: expected at most %zu bytes, found %zu", sizeof l->host - 1, x[0].n), -1;
    for (size_t i = 0; i < x[0].n; i++)
        if (!host_char_ok((unsigned char)x[0].s[i], 0))
            return set_err(err, errlen, "launcher: host: a control character (byte %zu) in '%.*s'", i, Q(x[0].n), x[0].s), -1;
    if (int_field(x[1], 1, INT_MAX, &pid) != 0)
        return set_err(err, errlen, "launcher: pid: expected an integer in [1, %d], found '%.*s'", INT_MAX, Q(x[1].n), x[1].s), -1;
    memcpy(l->host, x[0].s, x[0].n);
    l->pid = (int)pid;
    return 0;
}

/* --- KEY_COORD ------------------------------------------------------------------------- */

static int holder_ok(const char *h, size_t n) {
    if (n == 0 || n > 63) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = h[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-'))
            return 0;
    }
    return 1;
}

int lease_value_format(const LeaseValue *l, char *buf, size_t len) {
    size_t used = 0;
    if (!holder_ok(l->holder, strnlen(l->holder, sizeof l->holder)) || l->token < 1) return -1;
    return put(buf, len, &used, "%s:%lld", l->holder, l->token);
}

int lease_value_parse(const char *s, LeaseValue *l, char *err, size_t errlen) {
    memset(l, 0, sizeof *l);
    Field x[2];
    long long t;
    int n = split(s, ':', x, 2);
    if (n != 2) return set_err(err, errlen, "lease: expected HOLDER:TOKEN (2 fields), found %d in '%.*s'", n, Q(strlen(s)), s), -1;
    if (!holder_ok(x[0].s, x[0].n))
        return set_err(err, errlen, "lease: holder: expected 1 to 63 of [A-Za-z0-9_.-], found '%.*s'", Q(x[0].n), x[0].s), -1;
    if (int_field(x[1], 1, LLONG_MAX, &t) != 0)
        return set_err(err, errlen, "lease: token: expected an integer >= 1, found '%.*s'", Q(x[1].n), x[1].s), -1;
    memcpy(l->holder, x[0].s, x[0].n);
    l->token = t;
    return 0;
}

/* --- endpoints ------------------------------------------------------------------------- */

int endpoint_format(const Endpoint *e, char *buf, size_t len) {
    size_t n = strnlen(e->host, sizeof e->host), used = 0;
    if (n == 0 || n >= sizeof e->host || e->port < 1 || e->port > 65535) return -1;
    for (size_t i = 0; i < n; i++)
        if (!host_char_ok((unsigned char)e->host[i], 1)) return -1;
    return put(buf, len, &used, "%s:%d", e->host, e->port);
}

int endpoint_parse(const char *s, Endpoint *e, char *err, size_t errlen) {
    memset(e, 0, sizeof *e);
    const char *colon = strrchr(s, ':');
    if (!colon) return set_err(err, errlen, "endpoint: expected HOST:PORT, found '%.*s' (no ':')", Q(strlen(s)), s), -1;
    Field host = {s, (size_t)(colon - s)}, port = {colon + 1, strlen(colon + 1)};
    long long p;
    if (host.n == 0 || host.n >= sizeof e->host)
        return set_err(err, errlen, "endpoint: host: expected 1 to %zu bytes, found %zu", sizeof e->host - 1, host.n), -1;
    for (size_t i = 0; i < host.n; i++)
        if (!host_char_ok((unsigned char)host.s[i], 1))
            return set_err(err, errlen, "endpoint: host: a control character (byte %zu) in '%.*s'", i, Q(host.n), host.s), -1;
    if (int_field(port, 1, 65535, &p) != 0)
        return set_err(err, errlen, "endpoint: port: expected an integer in [1, 65535], found '%.*s'", Q(port.n), port.s), -1;
    memcpy(e->host, host.s, host.n);
    e->port = (int)p;
    return 0;
}

/* --- a process's "held" field ---------------------------------------------------------- */

static int held_ok(const HeldGen *h) { return h->rank >= 0 && h->rank < DP_MAX_RANKS && h->step >= -1 && h->epoch >= 0; }

int held_format(const HeldGen *h, int n, char *buf, size_t len) {
    size_t used = 0;
    if (len == 0) return -1;
    buf[0] = 0;
    for (int i = 0; i < n; i++)
        if (!held_ok(&h[i]) || put(buf, len, &used, "%s%d:%lld:%lld", i ? "," : "", h[i].rank, h[i].step, h[i].epoch) != 0)
            return -1;
    return 0;
}

int held_parse(const char *s, HeldGen *h, int max, char *err, size_t errlen) {
    int k = 0;
    const char *p = s;
    while (*p) {
        const char *c = strchr(p, ',');
        size_t n = c ? (size_t)(c - p) : strlen(p);
        char tok[80];
        Field x[3];
        long long r, st, ep;
        if (k == max) {
            memset(h, 0, sizeof *h * (size_t)max);
            return set_err(err, errlen, "held: more than %d entries", max), -1;
        }
        int fields = 0;
        if (n < sizeof tok) {
            memcpy(tok, p, n);
            tok[n] = 0;
            fields = split(tok, ':', x, 3);
        }
        if (fields != 3 || int_field(x[0], 0, DP_MAX_RANKS - 1, &r) != 0 || int_field(x[1], -1, LLONG_MAX, &st) != 0 ||
            int_field(x[2], 0, LLONG_MAX, &ep) != 0) {
            memset(h, 0, sizeof *h * (size_t)max);
            return set_err(err, errlen, "held: entry %d: expected RANK:STEP:EPOCH (rank in [0, %d), step >= -1, epoch >= 0), "
                           "found '%.*s'", k + 1, DP_MAX_RANKS, Q(n), p), -1;
        }
        h[k].rank = (int)r;
        h[k].step = st;
        h[k].epoch = ep;
        k++;
        if (!c) break;
        p = c + 1;
        if (!*p) { /* a trailing comma */
            memset(h, 0, sizeof *h * (size_t)max);
            return set_err(err, errlen, "held: entry %d is empty (a trailing ',')", k + 1), -1;
        }
    }
    return k;
}

/* --- KEY_INVENTORY's values ------------------------------------------------------------- */

/* Entry i follows entry i - 1 in the grammar's order: a lower step, or the same step and a
 * higher rank. */
static int inventory_in_order(const InventoryEntry *e, int i) {
    return i == 0 || e[i].step < e[i - 1].step || (e[i].step == e[i - 1].step && e[i].rank > e[i - 1].rank);
}

int inventory_format(const InventoryEntry *e, int n, char *buf, size_t len) {
    size_t used = 0;
    if (len == 0) return -1;
    buf[0] = 0;
    for (int i = 0; i < n; i++) {
        if (e[i].step < 0 || e[i].rank < 0 || e[i].rank >= DP_MAX_RANKS || !inventory_in_order(e, i)) return -1;
        int rc = i > 0 && e[i].step == e[i - 1].step ? put(buf, len, &used, ",%d", e[i].rank)
                                                     : put(buf, len, &used, "%s%" PRId64 ":%d", i ? ";" : "", e[i].step, e[i].rank);
        if (rc != 0) return -1;
    }
    return 0;
}

int inventory_parse(const char *s, InventoryEntry *e, int max, char *err, size_t errlen) {
    int k = 0, group = 0;
    const char *p = s;
    while (*p) {
        const char *semi = strchr(p, ';');
        size_t gn = semi ? (size_t)(semi - p) : strlen(p);
        const char *colon = memchr(p, ':', gn);
        long long step;
        group++;
        if (!colon || int_field((Field){p, (size_t)(colon - p)}, 0, INT64_MAX, &step) != 0) {
            memset(e, 0, sizeof *e * (size_t)max);
            return set_err(err, errlen, "inventory: group %d: expected STEP:R,R,... (step >= 0), found '%.*s'", group,
                           Q(gn), p), -1;
        }
        if (k > 0 && step >= e[k - 1].step) {
            long long prev = e[k - 1].step;
            memset(e, 0, sizeof *e * (size_t)max);
            return set_err(err, errlen, "inventory: group %d: expected a step below %lld (newest first), found %lld",
                           group, prev, step), -1;
        }
        const char *r = colon + 1, *end = p + gn;
        for (int first = 1;; first = 0) {
            const char *comma = memchr(r, ',', (size_t)(end - r));
            Field f = {r, comma ? (size_t)(comma - r) : (size_t)(end - r)};
            long long rank;
            if (int_field(f, 0, DP_MAX_RANKS - 1, &rank) != 0) {
                memset(e, 0, sizeof *e * (size_t)max);
                return set_err(err, errlen, "inventory: group %d (step %lld): expected a rank in [0, %d), found '%.*s'",
                               group, step, DP_MAX_RANKS, Q(f.n), f.s), -1;
            }
            if (!first && rank <= e[k - 1].rank) {
                int prev = e[k - 1].rank;
                memset(e, 0, sizeof *e * (size_t)max);
                return set_err(err, errlen, "inventory: group %d (step %lld): expected a rank above %d (ascending), found %lld",
                               group, step, prev, rank), -1;
            }
            if (k == max) {
                memset(e, 0, sizeof *e * (size_t)max);
                return set_err(err, errlen, "inventory: more than %d entries", max), -1;
            }
            e[k].step = step;
            e[k].rank = (int)rank;
            k++;
            if (!comma) break;
            r = comma + 1;
        }
        if (!semi) break;
        p = semi + 1;
        if (!*p) {
            memset(e, 0, sizeof *e * (size_t)max);
            return set_err(err, errlen, "inventory: group %d is empty (a trailing ';')", group + 1), -1;
        }
    }
    return k;
}

/* --- the collective rendezvous's keys ------------------------------------------------------ */

int proto_rdzv_key(char *buf, size_t len, const char *prefix, proto_rdzv which, int rank) {
    size_t used = 0;
    int rc = -1;
    if (len == 0) return -1;
    buf[0] = 0;
    if (!prefix) prefix = "";
    switch (which) {
    case PROTO_RDZV_MEMBER: rc = put(buf, len, &used, "%s/m/%d", prefix, rank); break;
    case PROTO_RDZV_ARRIVALS: rc = put(buf, len, &used, "%s/n", prefix); break;
    case PROTO_RDZV_WAKE: rc = put(buf, len, &used, "%s/w/%d", prefix, rank); break;
    }
    if (rc != 0) buf[0] = 0;
    return rc;
}

/* --- KEY_STATE ------------------------------------------------------------------------- */

static const char *const JOB_STATE_NAMES[JOB_STATES] = {"running", "stopping", "done", "failed"};

const char *job_state_name(job_state s) { return s >= 0 && s < JOB_STATES ? JOB_STATE_NAMES[s] : "?"; }

int job_state_parse(const char *s, job_state *st, char *err, size_t errlen) {
    for (int i = 0; i < JOB_STATES; i++)
        if (!strcmp(s, JOB_STATE_NAMES[i])) {
            *st = (job_state)i;
            return 0;
        }
    *st = JOB_STATE_RUNNING;
    return set_err(err, errlen, "job state: expected running, stopping, done or failed, found '%.*s'", Q(strlen(s)), s), -1;
}

/* --- sealed values ------------------------------------------------------------------------ */

static void seal_tag(const unsigned char key[PROTO_SEAL_KEY_BYTES], const char *job, const char *name,
                     const char *value, size_t vlen, unsigned char tag[crypto_auth_BYTES]) {
    crypto_auth_hmacsha512256_state st;
    static const char domain[] = "deadpool-seal-1";
    crypto_auth_hmacsha512256_init(&st, key, PROTO_SEAL_KEY_BYTES);
    crypto_auth_hmacsha512256_update(&st, (const unsigned char *)domain, sizeof domain); /* with its NUL */
    crypto_auth_hmacsha512256_update(&st, (const unsigned char *)job, strlen(job) + 1);
    crypto_auth_hmacsha512256_update(&st, (const unsigned char *)name, strlen(name) + 1);
    crypto_auth_hmacsha512256_update(&st, (const unsigned char *)value, vlen);
    crypto_auth_hmacsha512256_final(&st, tag);
}

int proto_seal(const unsigned char key[PROTO_SEAL_KEY_BYTES], const char *job, const char *name, const char *value,
               char *buf, size_t len) {
    unsigned char tag[crypto_auth_BYTES];
    size_t vlen = value ? strlen(value) : 0;
    if (!buf || len == 0) return -1;
    buf[0] = 0;
    if (!key || !job || !name || !value || sodium_init() < 0 || vlen + PROTO_SEAL_OVERHEAD + 1 > len) return -1;
    seal_tag(key, job, name, value, vlen, tag);
    sodium_bin2hex(buf, 2 * sizeof tag + 1, tag, sizeof tag);
    buf[2 * sizeof tag] = '.';
    memcpy(buf + PROTO_SEAL_OVERHEAD, value, vlen + 1);
    return 0;
}

int proto_unseal(const unsigned char key[PROTO_SEAL_KEY_BYTES], const char *job, const char *name, const char *s,
                 char *value, size_t len, char *err, size_t errlen) {
    unsigned char want[crypto_auth_BYTES], got[crypto_auth_BYTES];
    if (value && len) value[0] = 0;
    size_t n = s ? strlen(s) : 0;
    if (!value || !len || !key || !job || !name || sodium_init() < 0) {
        set_err(err, errlen, "%s: nothing to unseal into", name ? name : "value");
        return -1;
    }
    if (n < PROTO_SEAL_OVERHEAD || s[PROTO_SEAL_OVERHEAD - 1] != '.' ||
        strspn(s, "0123456789abcdef") != PROTO_SEAL_OVERHEAD - 1) {
        set_err(err, errlen, "%s: expected a sealed value (64 hex digits of its tag, '.', the value), found %zu "
                "bytes that are not", name, n);
        return -1;
    }
    if (n - PROTO_SEAL_OVERHEAD + 1 > len) {
        set_err(err, errlen, "%s: a sealed value of %zu bytes, more than the %zu expected", name,
                n - PROTO_SEAL_OVERHEAD, len - 1);
        return -1;
    }
    sodium_hex2bin(got, sizeof got, s, PROTO_SEAL_OVERHEAD - 1, NULL, NULL, NULL);
    seal_tag(key, job, name, s + PROTO_SEAL_OVERHEAD, n - PROTO_SEAL_OVERHEAD, want);
    if (sodium_memcmp(want, got, sizeof want) != 0) {
        set_err(err, errlen, "%s: its tag does not verify with the job's key: written by someone without it, or "
                "by another job or incarnation; ignored", name);
        return -1;
    }
    memcpy(value, s + PROTO_SEAL_OVERHEAD, n - PROTO_SEAL_OVERHEAD + 1);
    return 0;
}
