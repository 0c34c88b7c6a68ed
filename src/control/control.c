/* control.c — the control plane's connection: one blocking hiredis connection per ctl_t
 * (TCP, a unix socket, or through Redis Sentinel to the master), its errors classed, and
 * the commands every other part of the client sends through it (control_internal.h).
 *
 * Every command is bounded by the timeout given to ctl_connect (redisSetTimeout), so no call
 * blocks forever. After an I/O error the hiredis context is unusable; the next call
 * reconnects once before giving up, so a short Redis hiccup costs one failed call, not the
 * connection. The password is never written into an error message or a log.
 *
 * hiredis 0.14 writes with write(2), so a connection the server has closed raises SIGPIPE:
 * processes using this file must ignore SIGPIPE (launcher and worker do).
 *
 * The client's other parts: redis_url.c (URLs), control_keys.c (the key table and the
 * job's namespace), control_values.c (each value's typed owner), control_bulk.c (many keys
 * in one round trip, lists, machines and the coordinator's lease). */
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

/* An error is the server's answer (not transient) unless the caller classes it after. */
void ctl_set_error(ctl_t *c, const char *fmt, ...) {
    c->transient = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
}

static struct timeval ms_to_timeval(int ms) {
    if (ms <= 0) ms = 1;
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    return tv;
}

/* ------------------------------------------------------------------------------------- */
/* connection                                                                             */
/* ------------------------------------------------------------------------------------- */

/* Job names become part of keys and of the SCAN pattern in ctl_job_delete: restricting them
 * to [A-Za-z0-9._-] keeps one job from matching another ("a" vs "a:b", "a*"). */
int ctl_job_name_valid(const char *job) {
    size_t n = strlen(job);
    if (n == 0 || n > CTL_JOB_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)job[i];
        if (!name_char(ch)) return 0;
    }
    return 1;
}

/* AUTH when a password is set, then PING so that a server requiring a password we lack is
 * reported now rather than at the first command. */
/* A server at its client limit answers a new connection "-ERR max number of clients reached"
 * and closes it: the connection is tried again (see open_context_retry), it is no bad job. */
static int limit_reached(const char *msg) { return strcmp(msg, "ERR max number of clients reached") == 0; }

static int error_code_transient(int code);

static int authenticate_and_ping(redisContext *rc, const char *password, char *err, size_t errlen, int *transient) {
    redisReply *r;
    if (password[0]) {
        r = redisCommand(rc, "AUTH %s", password);
        if (!r) {
            *transient = error_code_transient(rc->err) ? 2 : 0;
            set_err(err, errlen, "redis: AUTH failed: %s", rc->errstr);
            return -1;
        }
        int bad = r->type == REDIS_REPLY_ERROR;
        if (bad && limit_reached(r->str)) {
            *transient = 1;
            set_err(err, errlen, "redis: %s", r->str);
        } else if (bad) {
            set_err(err, errlen, "redis: authentication failed");
        }
        freeReplyObject(r);
        if (bad) return -1;
    }
    r = redisCommand(rc, "PING");
    if (!r) {
        *transient = error_code_transient(rc->err) ? 2 : 0;
        set_err(err, errlen, "redis: PING failed: %s", rc->errstr);
        return -1;
    }
    int rc_ok = 0;
    if (r->type == REDIS_REPLY_ERROR) {
        *transient = limit_reached(r->str);
        if (strncmp(r->str, "NOAUTH", 6) == 0)
            set_err(err, errlen, "redis: authentication failed: the server requires a password "
                                 "(put it in the URL or in DEADPOOL_REDIS_PASSWORD)");
        else
            set_err(err, errlen, "redis: PING refused: %s", r->str);
        rc_ok = -1;
    }
    freeReplyObject(r);
    return rc_ok;
}

/* Whether this thread's last failed connection failed for the server's absence (see
 * ctl_connect_error_transient). */
static _Thread_local int connect_transient;

/* One connected, authenticated hiredis context with the command timeout set, or NULL;
 * *transient then says whether trying again soon may work: 1 the server is at its client
 * limit, 2 it did not answer (gone, reset, silent: hiredis's error code says which). */
static redisContext *open_server(const redis_addr *addr, int timeout_ms, char *err, size_t errlen, int *transient);

/* Asks the sentinels, in order, for the master's address, connects to it and checks that it
 * is a master (a sentinel that has not seen a failover yet can name the old one). */
static redisContext *open_context(const redis_addr *addr, int timeout_ms, char *err, size_t errlen, int *transient) {
    if (addr->nsentinels == 0) return open_server(addr, timeout_ms, err, errlen, transient);
    struct timeval tv = ms_to_timeval(timeout_ms < 1000 ? timeout_ms : 1000);
    char why[CTL_ERR_MAX] = "no sentinel answered";
    for (int i = 0; i < addr->nsentinels; i++) {
        redisContext *s = dp_redis_connect(addr->sentinel_host[i], addr->sentinel_port[i], tv);
        if (!s || s->err) {
            if (s && !*transient) *transient = error_code_transient(s->err) ? 2 : 0;
            snprintf(why, sizeof why, "sentinel %s:%d: %s", addr->sentinel_host[i], addr->sentinel_port[i], s ? s->errstr : "out of memory");
            if (s) redisFree(s);
            continue;
        }
        redisSetTimeout(s, tv);
        if (addr->password[0]) { /* sentinels guarded by the job's password; one without any says so */
            redisReply *a = redisCommand(s, "AUTH %s", addr->password);
            if (a) freeReplyObject(a);
        }
        redisReply *r = redisCommand(s, "SENTINEL get-master-addr-by-name %s", addr->master);
        if (!r || (r->type == REDIS_REPLY_ERROR && limit_reached(r->str))) *transient = 1; /* a sentinel at its limit */
        redis_addr m = *addr;
        int found = r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[0]->type == REDIS_REPLY_STRING &&
                    r->element[1]->type == REDIS_REPLY_STRING &&
                    copy_checked(m.host, sizeof m.host, r->element[0]->str, r->element[0]->len) == 0;
        if (found) m.port = atoi(r->element[1]->str);
        else snprintf(why, sizeof why, "sentinel %s:%d does not know master '%s'", addr->sentinel_host[i], addr->sentinel_port[i], addr->master);
        if (r) freeReplyObject(r);
        redisFree(s);
        if (!found) continue;
        m.nsentinels = 0;
        redisContext *rc = open_server(&m, timeout_ms, why, sizeof why, transient);
        if (!rc) continue;
        redisReply *role = redisCommand(rc, "ROLE");
        int master = role && role->type == REDIS_REPLY_ARRAY && role->elements > 0 && role->element[0]->type == REDIS_REPLY_STRING &&
                     !strcmp(role->element[0]->str, "master");
        if (role) freeReplyObject(role);
        if (master) return rc;
        if (!*transient) *transient = 2; /* a failover in progress: an outage of the control plane */
        snprintf(why, sizeof why, "%s:%d, named by sentinel %s:%d, is not a master (a failover in progress)", m.host, m.port,
                 addr->sentinel_host[i], addr->sentinel_port[i]);
        redisFree(rc);
    }
    set_err(err, errlen, "redis: master '%s': %s", addr->master, why);
    if (!*transient) *transient = 2; /* no sentinel named a reachable master: a failover may be under way */
    return NULL;
}

static redisContext *open_server(const redis_addr *addr, int timeout_ms, char *err, size_t errlen, int *transient) {
    struct timeval tv = ms_to_timeval(timeout_ms);
    redisContext *rc = dp_redis_connect(addr->host, addr->port, tv);
    if (!rc) {
        set_err(err, errlen, "redis: out of memory connecting to %s:%d", addr->host, addr->port);
        return NULL;
    }
    if (rc->err) {
        *transient = error_code_transient(rc->err) ? 2 : 0;
        if (addr->host[0] == '/')
            set_err(err, errlen, "redis: cannot connect to unix socket %s: %s", addr->host, rc->errstr);
        else
            set_err(err, errlen, "redis: cannot connect to %s:%d: %s", addr->host, addr->port, rc->errstr);
        redisFree(rc);
        return NULL;
    }
    if (redisSetTimeout(rc, tv) != REDIS_OK) {
        set_err(err, errlen, "redis: cannot set the command timeout: %s", rc->errstr);
        redisFree(rc);
        return NULL;
    }
    if (authenticate_and_ping(rc, addr->password, err, errlen, transient) != 0) {
        redisFree(rc);
        return NULL;
    }
    return rc;
}

/* open_context, tried again while it fails in a way that can pass (the server at its client
 * limit, a dropped connection; with `outage` also a refused connection or a failover under
 * way), with a backoff of 20 ms doubling to 500 ms (and jitter, so that many processes do not
 * come back in step), all of it within timeout_ms: a flood of strangers' connections or a
 * blink of the server costs a delay inside the bound that already applied, not the job. Bad
 * passwords and the like fail at once. A connection lost later (ctl_ensure_connected) does not
 * wait out a control plane that is down (outage 0): its callers decide how long to wait. */
static redisContext *open_context_retry(const redis_addr *addr, int timeout_ms, int outage, char *err, size_t errlen) {
    double deadline = now_ms() + timeout_ms;
    int backoff = 20;
    for (;;) {
        int left = (int)(deadline - now_ms()), transient = 0;
        redisContext *rc = open_context(addr, left > 1 ? left : 1, err, errlen, &transient);
        connect_transient = rc == NULL && transient != 0;
        if (rc || !transient || (transient == 2 && !outage)) return rc;
        int pause = backoff / 2 + (int)(random() % (backoff / 2 + 1));
        if (now_ms() + pause >= deadline) return NULL;
        sleep_ms(pause);
        backoff = backoff * 2 > 500 ? 500 : backoff * 2;
    }
}

ctl_t *ctl_connect(const redis_addr *addr, const char *job, int timeout_ms, char *err, size_t errlen) {
    if (!addr || !job) {
        set_err(err, errlen, "ctl_connect: missing address or job name");
        return NULL;
    }
    if (!ctl_job_name_valid(job)) {
        set_err(err, errlen, "job name '%.*s': use 1-%d letters, digits, '.', '_' or '-'",
                CTL_JOB_MAX, job, CTL_JOB_MAX);
        return NULL;
    }
    if (timeout_ms <= 0) {
        set_err(err, errlen, "ctl_connect: timeout must be positive (got %d ms)", timeout_ms);
        return NULL;
    }
    ctl_t *c = calloc(1, sizeof *c);
    if (!c) {
        set_err(err, errlen, "ctl_connect: out of memory");
        return NULL;
    }
    c->addr = *addr;
    c->timeout_ms = timeout_ms;
    snprintf(c->job, sizeof c->job, "%s", job);
    c->rc = open_context_retry(addr, timeout_ms, 1, err, errlen);
    if (!c->rc) {
        ctl_close(c);
        return NULL;
    }
    return c;
}

void ctl_close(ctl_t *c) {
    if (!c) return;
    if (c->rc) redisFree(c->rc);
    memset(c->addr.password, 0, sizeof c->addr.password);
    explicit_bzero(c->seal_key, sizeof c->seal_key);
    free(c);
}

const char *ctl_job(const ctl_t *c) { return c ? c->job : ""; }

const char *ctl_last_error(const ctl_t *c) { return c ? c->err : "ctl: no connection"; }

/* The server is no master any more (a failover demoted it, or it is loading): with sentinels,
 * the next command finds the new one. */
int ctl_demoted_error(const char *msg) {
    return !strncmp(msg, "READONLY", 8) || !strncmp(msg, "MASTERDOWN", 10) || !strncmp(msg, "LOADING", 7);
}

/* hiredis's error codes for a server that did not answer (gone, reset, silent past the timeout),
 * as opposed to one that answered with an error (REDIS_ERR_PROTOCOL, REDIS_ERR_OOM, a reply). */
static int error_code_transient(int code) {
    return code == REDIS_ERR_IO || code == REDIS_ERR_EOF
#ifdef REDIS_ERR_TIMEOUT
           || code == REDIS_ERR_TIMEOUT
#endif
        ;
}

/* Every call's failure is classed by these two (ctl_error_transient), whatever way it talks to
 * the server (one command, an argv command, a pipeline, a transaction). The server did not
 * answer (gone, reset, silent past the timeout): transient, and the context is in error, so
 * the next call reconnects. */
void ctl_reply_lost(ctl_t *c, const char *what) {
    ctl_set_error(c, "redis: %s%s%s", what, what[0] ? ": " : "", c->rc->errstr[0] ? c->rc->errstr : "no reply");
    c->transient = error_code_transient(c->rc->err);
    c->absences += (unsigned long)c->transient;
}

/* The server answered with an error: not transient, unless it is no master any more (the next
 * connection finds the one that is). */
void ctl_reply_refused(ctl_t *c, const char *what, const char *msg) {
    ctl_set_error(c, "redis: %s%s%s", what, what[0] ? ": " : "", msg);
    if (ctl_demoted_error(msg)) c->stale = 1;
    c->transient = ctl_demoted_error(msg);
}

/* Every call starts here: its failure is classed afresh (c->transient). A context that failed
 * an I/O call (timeout, reset) cannot be reused, hiredis may still owe it a reply: it is
 * replaced by a fresh connection. */
int ctl_ensure_connected(ctl_t *c) {
    c->transient = 0;
    if (c->stale && c->addr.nsentinels > 0 && c->rc) {
        redisFree(c->rc);
        c->rc = NULL;
    }
    c->stale = 0;
    if (c->rc && c->rc->err == 0) return 0;
    if (c->rc) {
        redisFree(c->rc);
        c->rc = NULL;
    }
    char err[CTL_ERR_MAX];
    c->rc = open_context_retry(&c->addr, c->timeout_ms, 0, err, sizeof err);
    if (!c->rc) {
        ctl_set_error(c, "%s", err);
        c->transient = 1;
        c->absences++; /* connect, AUTH or PING did not complete (a refused AUTH is not transient either, but
                           * the password is the job's own: a server that restarted without it is still coming up) */
        return -1;
    }
    return 0;
}

/* The reply of the command just sent, or NULL with the failure classed. */
static redisReply *checked_reply(ctl_t *c, redisReply *r, const char *what) {
    if (!r) {
        ctl_reply_lost(c, what);
        return NULL;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        ctl_reply_refused(c, what, r->str);
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

/* Runs one command. Returns the reply (caller frees), or NULL with c->err set on I/O error
 * or when Redis answered with an error. */
static redisReply *ctl_vcommand(ctl_t *c, const char *fmt, va_list ap) {
    if (ctl_ensure_connected(c) != 0) return NULL;
    c->round_trips++;
    return checked_reply(c, redisvCommand(c->rc, fmt, ap), "");
}

/* One command in argv form (lens NULL: C strings), as ctl_vcommand. */
redisReply *ctl_argv_command(ctl_t *c, int argc, const char **argv, const size_t *lens, const char *what) {
    if (ctl_ensure_connected(c) != 0) return NULL;
    c->round_trips++;
    return checked_reply(c, redisCommandArgv(c->rc, argc, argv, lens), what);
}

redisReply *ctl_command(ctl_t *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = ctl_vcommand(c, fmt, ap);
    va_end(ap);
    return r;
}

/* Like ctl_command, but expects an integer reply. 0 and *out, or -1. */
int ctl_command_integer(ctl_t *c, long long *out, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = ctl_vcommand(c, fmt, ap);
    va_end(ap);
    if (!r) return -1;
    int rc = 0;
    if (r->type == REDIS_REPLY_INTEGER) {
        *out = r->integer;
    } else {
        ctl_set_error(c, "redis: unexpected reply type %d (expected an integer)", r->type);
        rc = -1;
    }
    freeReplyObject(r);
    return rc;
}

/* Runs a command whose reply carries nothing we need. 0 / -1. */
int ctl_command_ok(ctl_t *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = ctl_vcommand(c, fmt, ap);
    va_end(ap);
    if (!r) return -1;
    freeReplyObject(r);
    return 0;
}

unsigned long long ctl_round_trips(const ctl_t *c) { return c ? c->round_trips : 0; }
void ctl_mark(ctl_t *c) { if (c) c->mark = c->round_trips; }
unsigned long long ctl_round_trips_since_mark(const ctl_t *c) { return c ? c->round_trips - c->mark : 0; }

int ctl_server_config_set(ctl_t *c, const char *param, const char *value) {
    return ctl_command_ok(c, "CONFIG SET %s %s", param, value);
}

static int64_t realtime_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int ctl_clock_offset(ctl_t *c, int64_t *offset_ms) {
    int64_t best_rtt = -1;
    for (int i = 0; i < 5; i++) {
        int64_t t0 = realtime_us();
        redisReply *r = ctl_command(c, "TIME");
        int64_t t1 = realtime_us();
        if (!r) return -1;
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[0]->type == REDIS_REPLY_STRING &&
            r->element[1]->type == REDIS_REPLY_STRING && (best_rtt < 0 || t1 - t0 < best_rtt)) {
            int64_t server_us = strtoll(r->element[0]->str, NULL, 10) * 1000000 + strtoll(r->element[1]->str, NULL, 10);
            best_rtt = t1 - t0;
            *offset_ms = (server_us - (t0 + t1) / 2) / 1000;
        }
        freeReplyObject(r);
    }
    return best_rtt < 0 ? -1 : 0;
}

int ctl_server(ctl_t *c, char *host, size_t len, int *port) {
    if (ctl_ensure_connected(c) != 0) return -1;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(c->rc->fd, (struct sockaddr *)&ss, &sl) != 0) return -1;
    int v6 = ss.ss_family == AF_INET6;
    const void *a = v6 ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
    *port = ntohs(v6 ? ((struct sockaddr_in6 *)&ss)->sin6_port : ((struct sockaddr_in *)&ss)->sin_port);
    return inet_ntop(ss.ss_family, a, host, (socklen_t)len) ? 0 : -1;
}

/* The number of entries of SENTINEL <what> <master>, -1 on error. */
static int sentinel_count(redisContext *s, const char *what, const char *master) {
    redisReply *r = redisCommand(s, "SENTINEL %s %s", what, master);
    int n = r && r->type == REDIS_REPLY_ARRAY ? (int)r->elements : -1;
    if (r) freeReplyObject(r);
    return n;
}

int sentinel_wait_ready(const redis_addr *a, int timeout_ms, char *err, size_t errlen) {
    double deadline = now_ms() + timeout_ms;
    int replicas = -1, peers = -1;
    while (now_ms() < deadline) {
        struct timeval tv = ms_to_timeval(500);
        redisContext *s = dp_redis_connect(a->sentinel_host[0], a->sentinel_port[0], tv);
        if (s && !s->err) {
            redisSetTimeout(s, tv);
            if (a->password[0]) {
                redisReply *r = redisCommand(s, "AUTH %s", a->password);
                if (r) freeReplyObject(r);
            }
            replicas = sentinel_count(s, "replicas", a->master);
            peers = sentinel_count(s, "sentinels", a->master);
        }
        if (s) redisFree(s);
        if (replicas >= 1 && peers >= a->nsentinels - 1) return 0;
        sleep_ms(100);
    }
    set_err(err, errlen, "sentinels not ready within %d ms (they see %d replica(s) and %d other sentinel(s))", timeout_ms,
            replicas, peers);
    return -1;
}

int ctl_replicated(const ctl_t *c) { return c->addr.nsentinels > 0; }

int ctl_wait_replica(ctl_t *c, int timeout_ms) {
    if (c->addr.nsentinels == 0) return 0;
    /* A master without a replica (the new one, until another joins) would make every critical
     * write wait out the timeout: ROLE says how many it has, looked at every 2 s. */
    double now = now_ms();
    if (now - c->replicas_checked_ms > 2000) {
        redisReply *r = ctl_command(c, "ROLE");
        c->replicas = r && r->type == REDIS_REPLY_ARRAY && r->elements >= 3 && r->element[2]->type == REDIS_REPLY_ARRAY
                          ? (int)r->element[2]->elements
                          : 0;
        if (r) freeReplyObject(r);
        c->replicas_checked_ms = now;
    }
    if (c->replicas == 0) return -1;
    /* The server's WAIT must end well before this connection's own timeout: a reply that
     * arrives after it reads as Redis gone (an outage) rather than as "not acknowledged". */
    if (timeout_ms > c->timeout_ms / 2) timeout_ms = c->timeout_ms / 2 > 0 ? c->timeout_ms / 2 : 1;
    long long acked = 0;
    if (ctl_command_integer(c, &acked, "WAIT 1 %d", timeout_ms) != 0) return -1;
    if (acked < 1) c->replicas = 0; /* gone meanwhile: look again at the next check */
    return acked >= 1 ? 0 : -1;
}

int ctl_local_addr(ctl_t *c, char *buf, size_t len) {
    if (ctl_ensure_connected(c) != 0) return -1;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(c->rc->fd, (struct sockaddr *)&ss, &sl) != 0) return -1;
    const void *a = ss.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                                             : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
    return inet_ntop(ss.ss_family, a, buf, (socklen_t)len) ? 0 : -1;
}

/* --- outages (issue 27, items 11 and 12) ------------------------------------------------ */

int ctl_error_transient(const ctl_t *c) { return c ? c->transient : 0; }
int ctl_value_refused(const ctl_t *c) { return c ? c->refused : 0; }
int ctl_connect_error_transient(void) { return connect_transient; }
unsigned long ctl_absences(const ctl_t *c) { return c ? c->absences : 0; }

void ctl_set_timeout(ctl_t *c, int timeout_ms) {
    if (!c || timeout_ms <= 0) return;
    c->timeout_ms = timeout_ms;
    if (c->rc && c->rc->err == 0) redisSetTimeout(c->rc, ms_to_timeval(timeout_ms));
}

int ctl_timeout(const ctl_t *c) { return c ? c->timeout_ms : 0; }
