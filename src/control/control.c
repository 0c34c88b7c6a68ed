/* control.c — the control plane client: Redis URL parsing and the per-job key namespace
 * "dp:{job}:" (config, process ids, rank claims, spare pool, heartbeats, epoch, state,
 * event/metric lists) over one blocking hiredis connection per ctl_t.
 *
 * Every command is bounded by the timeout given to ctl_connect (redisSetTimeout), so no call
 * blocks forever. After an I/O error the hiredis context is unusable; the next call
 * reconnects once before giving up, so a short Redis hiccup costs one failed call, not the
 * connection. The password is never written into an error message or a log.
 *
 * hiredis 0.14 writes with write(2), so a connection the server has closed raises SIGPIPE:
 * processes using this file must ignore SIGPIPE (launcher and worker do). */
#include "control.h"
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

#define CTL_JOB_MAX 128
#define CTL_KEY_MAX 256
#define CTL_ERR_MAX 512
#define CTL_DELETE_BATCH 512

struct ctl {
    redisContext *rc;
    redis_addr addr;
    int timeout_ms;
    char job[CTL_JOB_MAX + 1];
    char err[CTL_ERR_MAX];
    unsigned long long round_trips, mark; /* ctl_round_trips, ctl_mark */
    int batch_n, batch_failed, batch_multi; /* commands appended since ctl_batch_begin */
    int stale;                /* the server answered as a replica: reconnect (through the sentinels) */
    int replicas;             /* ctl_wait_replica: the master's replicas, as ROLE said ... */
    double replicas_checked_ms; /* ... then */
    int transient;            /* the last failure was the server's absence, not its answer (ctl_error_transient) */
    int refused;              /* the last sealed read found a value that did not verify (ctl_value_refused) */
    int state_refused;        /* the last state read was forged (logged once in a row: the state is polled) */
    double refused_logged_ms; /* when a forged value was last logged (at most one line a second: values are polled) */
    unsigned long absences;   /* such failures so far (ctl_absences) */
    unsigned char seal_key[PROTO_SEAL_KEY_BYTES]; /* the control key (ctl_set_job_key) ... */
    int keyed;                                    /* ... once set */
};

/* ------------------------------------------------------------------------------------- */
/* small helpers                                                                          */
/* ------------------------------------------------------------------------------------- */

static void ctl_set_error(ctl_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An error is the server's answer (not transient) unless the caller classes it after. */
static void ctl_set_error(ctl_t *c, const char *fmt, ...) {
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

/* Copies src into dst (capacity cap). 0, or -1 when it does not fit. */
static int copy_checked(char *dst, size_t cap, const char *src, size_t n) {
    if (n >= cap) return -1;
    memcpy(dst, src, n);
    dst[n] = '\0';
    return 0;
}

/* A URL's port (stored values are parsed by protocol.h's proto_int_parse: reply_int). */
static int parse_long(const char *s, size_t n, long *out) {
    char buf[32];
    if (n == 0 || n >= sizeof buf) return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *end = NULL;
    errno = 0;
    long v = strtol(buf, &end, 10);
    if (errno != 0 || *end != '\0') return -1;
    *out = v;
    return 0;
}

/* ------------------------------------------------------------------------------------- */
/* URL parsing                                                                            */
/* ------------------------------------------------------------------------------------- */

/* The URL as it may appear in messages: the password part replaced by "***". */
static void redact_url(const char *url, char *out, size_t outlen) {
    const char *scheme_end = strstr(url, "://");
    const char *auth = scheme_end ? scheme_end + 3 : url;
    const char *at = strrchr(auth, '@');
    if (!at) {
        snprintf(out, outlen, "%s", url);
        return;
    }
    snprintf(out, outlen, "%.*s***%s", (int)(auth - url), url, at);
}

static int hex_value(int ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Percent-decodes src[0..n) into dst so passwords may contain '@', '/' or ':'.
 * 0, or -1 on a malformed escape / overflow. */
static int percent_decode(const char *src, size_t n, char *dst, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int ch = (unsigned char)src[i];
        if (ch == '%') {
            if (i + 2 >= n) return -1; /* needs two hex digits */
            int hi = hex_value((unsigned char)src[i + 1]);
            int lo = hex_value((unsigned char)src[i + 2]);
            if (hi < 0 || lo < 0) return -1;
            ch = hi * 16 + lo;
            i += 2;
        }
        if (ch == 0 || o + 1 >= cap) return -1;
        dst[o++] = (char)ch;
    }
    dst[o] = '\0';
    return 0;
}

/* Parses the "user:password" part of the URL (without the '@'). Only an empty user is
 * accepted because redis_addr has no user name. Messages never include the password. */
static int parse_userinfo(const char *ui, size_t n, const char *shown, redis_addr *out,
                          char *err, size_t errlen) {
    const char *colon = memchr(ui, ':', n);
    if (!colon) {
        set_err(err, errlen, "redis URL '%s': credentials must be written ':PASSWORD@'", shown);
        return -1;
    }
    if (colon != ui) {
        set_err(err, errlen, "redis URL '%s': user names are not supported, write ':PASSWORD@'", shown);
        return -1;
    }
    const char *pw = colon + 1;
    size_t pwlen = n - (size_t)(pw - ui);
    if (pwlen == 0) {
        set_err(err, errlen, "redis URL '%s': empty password", shown);
        return -1;
    }
    if (percent_decode(pw, pwlen, out->password, sizeof out->password) != 0) {
        set_err(err, errlen, "redis URL '%s': password is too long or has a bad %%-escape", shown);
        return -1;
    }
    return 0;
}

/* Parses "HOST:PORT" or "[IPV6]:PORT" (hostport[0..n)) into out->host / out->port. */
static int parse_hostport(const char *hp, size_t n, const char *shown, redis_addr *out,
                          char *err, size_t errlen) {
    const char *host = hp, *host_end, *rest;
    if (n > 0 && hp[0] == '[') { /* bracketed IPv6 literal */
        const char *close = memchr(hp, ']', n);
        if (!close) {
            set_err(err, errlen, "redis URL '%s': unterminated '[' in host", shown);
            return -1;
        }
        host = hp + 1;
        host_end = close;
        rest = close + 1;
    } else {
        /* The last ':' starts the port, so an unbracketed IPv6 literal ("::1:6379", as
         * "redis://%s:%d" would print it) still parses. */
        host_end = memrchr(hp, ':', n);
        if (!host_end) host_end = hp + n;
        rest = host_end;
    }
    size_t hostlen = (size_t)(host_end - host);
    if (hostlen == 0) {
        set_err(err, errlen, "redis URL '%s': missing host", shown);
        return -1;
    }
    if (copy_checked(out->host, sizeof out->host, host, hostlen) != 0) {
        set_err(err, errlen, "redis URL '%s': host name is too long", shown);
        return -1;
    }
    const char *end = hp + n;
    if (rest >= end || *rest != ':' || rest + 1 == end) {
        set_err(err, errlen, "redis URL '%s': missing port", shown);
        return -1;
    }
    const char *port = rest + 1;
    long p = 0;
    for (const char *q = port; q < end; q++) {
        if (!isdigit((unsigned char)*q)) {
            set_err(err, errlen, "redis URL '%s': port must be a number", shown);
            return -1;
        }
    }
    if (parse_long(port, (size_t)(end - port), &p) != 0 || p < 1 || p > 65535) {
        set_err(err, errlen, "redis URL '%s': port must be between 1 and 65535", shown);
        return -1;
    }
    out->port = (int)p;
    return 0;
}

/* Fills out->password from DEADPOOL_REDIS_PASSWORD when the URL carried none. */
static int password_from_env(redis_addr *out, char *err, size_t errlen) {
    const char *env = getenv("DEADPOOL_REDIS_PASSWORD");
    if (!env || !*env) return 0;
    if (copy_checked(out->password, sizeof out->password, env, strlen(env)) != 0) {
        set_err(err, errlen, "DEADPOOL_REDIS_PASSWORD is too long (at most %zu bytes)",
                sizeof out->password - 1);
        return -1;
    }
    return 0;
}

/* "[:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER" after "redis-sentinel://". */
static int parse_sentinel_url(const char *p, const char *shown, redis_addr *out, char *err, size_t errlen) {
    const char *at = strrchr(p, '@');
    const char *hp = p;
    if (at) {
        if (parse_userinfo(p, (size_t)(at - p), shown, out, err, errlen) != 0) goto fail;
        hp = at + 1;
    }
    const char *slash = strchr(hp, '/');
    if (!slash || !slash[1] || strchr(slash + 1, '/')) {
        set_err(err, errlen, "redis URL '%s': expected /MASTER (the name the sentinels monitor) after the sentinels", shown);
        goto fail;
    }
    if (copy_checked(out->master, sizeof out->master, slash + 1, strlen(slash + 1)) != 0) {
        set_err(err, errlen, "redis URL '%s': master name is too long", shown);
        goto fail;
    }
    for (const char *h = hp; h < slash;) {
        const char *comma = memchr(h, ',', (size_t)(slash - h));
        const char *end = comma ? comma : slash;
        if (out->nsentinels == REDIS_SENTINELS_MAX) {
            set_err(err, errlen, "redis URL '%s': at most %d sentinels", shown, REDIS_SENTINELS_MAX);
            goto fail;
        }
        if (parse_hostport(h, (size_t)(end - h), shown, out, err, errlen) != 0) goto fail;
        memcpy(out->sentinel_host[out->nsentinels], out->host, sizeof out->host);
        out->sentinel_port[out->nsentinels++] = out->port;
        h = comma ? comma + 1 : slash;
    }
    if (out->nsentinels == 0) {
        set_err(err, errlen, "redis URL '%s': no sentinel given", shown);
        goto fail;
    }
    if (out->password[0] == '\0' && password_from_env(out, err, errlen) != 0) goto fail;
    return 0;
fail:
    memset(out->password, 0, sizeof out->password);
    return -1;
}

void redis_addr_format(const redis_addr *a, char *buf, size_t len) {
    if (a->nsentinels == 0 && a->host[0] == '/') {
        snprintf(buf, len, "unix://%s", a->host);
        return;
    }
    if (a->nsentinels == 0) {
        int v6 = strchr(a->host, ':') != NULL;
        snprintf(buf, len, "redis://%s%s%s:%d", v6 ? "[" : "", a->host, v6 ? "]" : "", a->port);
        return;
    }
    size_t used = (size_t)snprintf(buf, len, "redis-sentinel://");
    for (int i = 0; i < a->nsentinels && used < len; i++) {
        int v6 = strchr(a->sentinel_host[i], ':') != NULL;
        used += (size_t)snprintf(buf + used, len - used, "%s%s%s%s:%d", i ? "," : "", v6 ? "[" : "", a->sentinel_host[i],
                                 v6 ? "]" : "", a->sentinel_port[i]);
    }
    if (used < len) snprintf(buf + used, len - used, "/%s", a->master);
}

/* "[:PASSWORD@]/PATH" after "unix://": a Redis that listens on a unix socket (the embedded one
 * of a one-machine job). The path is kept in out->host (a host never starts with '/'), port 0. */
static int parse_unix_url(const char *p, const char *shown, redis_addr *out, char *err, size_t errlen) {
    const char *at = strrchr(p, '@');
    const char *path = p;
    if (at) {
        if (parse_userinfo(p, (size_t)(at - p), shown, out, err, errlen) != 0) goto fail;
        path = at + 1;
    }
    if (path[0] != '/' || path[1] == 0) {
        set_err(err, errlen, "redis URL '%s': expected unix:///PATH (an absolute path to the socket)", shown);
        goto fail;
    }
    if (strlen(path) >= REDIS_UNIX_PATH_MAX) {
        set_err(err, errlen, "redis URL '%s': socket path is longer than %d bytes", shown, REDIS_UNIX_PATH_MAX - 1);
        goto fail;
    }
    snprintf(out->host, sizeof out->host, "%s", path);
    out->port = 0;
    if (out->password[0] == '\0' && password_from_env(out, err, errlen) != 0) goto fail;
    return 0;
fail:
    memset(out->password, 0, sizeof out->password);
    return -1;
}

int redis_addr_parse(const char *url, redis_addr *out, char *err, size_t errlen) {
    if (!url || !out) {
        set_err(err, errlen, "redis URL: missing");
        return -1;
    }
    memset(out, 0, sizeof *out);
    char shown[600];
    redact_url(url, shown, sizeof shown);

    const char *p = url;
    const char *scheme_end = strstr(url, "://");
    int sentinel = 0;
    if (scheme_end) {
        sentinel = (size_t)(scheme_end - url) == 14 && strncmp(url, "redis-sentinel", 14) == 0;
        if ((size_t)(scheme_end - url) == 4 && strncmp(url, "unix", 4) == 0)
            return parse_unix_url(scheme_end + 3, shown, out, err, errlen);
        if (!sentinel && ((size_t)(scheme_end - url) != 5 || strncmp(url, "redis", 5) != 0)) {
            set_err(err, errlen, "redis URL '%s': unsupported scheme (expected redis://, redis-sentinel:// or unix://)", shown);
            return -1;
        }
        p = scheme_end + 3;
    }
    if (sentinel) return parse_sentinel_url(p, shown, out, err, errlen);
    size_t n = strlen(p);
    if (n > 0 && p[n - 1] == '/') n--; /* trailing "/" allowed */

    /* The last '@' separates credentials from the host, so an unescaped '@' in the password
     * still parses; a '/' before the host would otherwise be taken for a path. */
    const char *at = NULL;
    for (size_t i = 0; i < n; i++)
        if (p[i] == '@') at = p + i;
    const char *hp = p;
    if (at) {
        if (parse_userinfo(p, (size_t)(at - p), shown, out, err, errlen) != 0) goto fail;
        hp = at + 1;
    }
    size_t hplen = n - (size_t)(hp - p);
    if (memchr(hp, '/', hplen)) {
        set_err(err, errlen, "redis URL '%s': unexpected path after the port (database numbers are not supported)", shown);
        goto fail;
    }
    if (hplen == 0) {
        set_err(err, errlen, "redis URL '%s': missing host", shown);
        goto fail;
    }
    if (parse_hostport(hp, hplen, shown, out, err, errlen) != 0) goto fail;
    if (out->password[0] == '\0' && password_from_env(out, err, errlen) != 0) goto fail;
    return 0;
fail:
    memset(out->password, 0, sizeof out->password); /* do not leave a half-parsed secret */
    return -1;
}

/* ------------------------------------------------------------------------------------- */
/* connection                                                                             */
/* ------------------------------------------------------------------------------------- */

/* Job names become part of keys and of the SCAN pattern in ctl_job_delete: restricting them
 * to [A-Za-z0-9._-] keeps one job from matching another ("a" vs "a:b", "a*"). */
static int job_name_valid(const char *job) {
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
 * passwords and the like fail at once. A connection lost later (ensure_connected) does not
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
    if (!job_name_valid(job)) {
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
static int demoted_error(const char *msg) {
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
static void reply_lost(ctl_t *c, const char *what) {
    ctl_set_error(c, "redis: %s%s%s", what, what[0] ? ": " : "", c->rc->errstr[0] ? c->rc->errstr : "no reply");
    c->transient = error_code_transient(c->rc->err);
    c->absences += (unsigned long)c->transient;
}

/* The server answered with an error: not transient, unless it is no master any more (the next
 * connection finds the one that is). */
static void reply_refused(ctl_t *c, const char *what, const char *msg) {
    ctl_set_error(c, "redis: %s%s%s", what, what[0] ? ": " : "", msg);
    if (demoted_error(msg)) c->stale = 1;
    c->transient = demoted_error(msg);
}

/* Every call starts here: its failure is classed afresh (c->transient). A context that failed
 * an I/O call (timeout, reset) cannot be reused, hiredis may still owe it a reply: it is
 * replaced by a fresh connection. */
static int ensure_connected(ctl_t *c) {
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
        reply_lost(c, what);
        return NULL;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        reply_refused(c, what, r->str);
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

/* Runs one command. Returns the reply (caller frees), or NULL with c->err set on I/O error
 * or when Redis answered with an error. */
static redisReply *ctl_vcommand(ctl_t *c, const char *fmt, va_list ap) {
    if (ensure_connected(c) != 0) return NULL;
    c->round_trips++;
    return checked_reply(c, redisvCommand(c->rc, fmt, ap), "");
}

/* One command in argv form (lens NULL: C strings), as ctl_vcommand. */
static redisReply *ctl_argv_command(ctl_t *c, int argc, const char **argv, const size_t *lens, const char *what) {
    if (ensure_connected(c) != 0) return NULL;
    c->round_trips++;
    return checked_reply(c, redisCommandArgv(c->rc, argc, argv, lens), what);
}

static redisReply *ctl_command(ctl_t *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = ctl_vcommand(c, fmt, ap);
    va_end(ap);
    return r;
}

/* Like ctl_command, but expects an integer reply. 0 and *out, or -1. */
static int ctl_command_integer(ctl_t *c, long long *out, const char *fmt, ...) {
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
static int ctl_command_ok(ctl_t *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = ctl_vcommand(c, fmt, ap);
    va_end(ap);
    if (!r) return -1;
    freeReplyObject(r);
    return 0;
}

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
static const char *make_key(const ctl_t *c, char *key, size_t cap, ctl_key k, long long a, long long b) {
    char suffix[CTL_KEY_MAX];
    job_key(key, cap, c->job, expand_key(suffix, sizeof suffix, k, a, b, 0));
    return key;
}

/* A job key from a suffix the caller formed (ctl_key_suffix's, or a test's own). */
static void suffix_key(const ctl_t *c, char *key, size_t cap, const char *suffix) { job_key(key, cap, c->job, suffix); }

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
static int reply_int(ctl_t *c, const redisReply *r, const char *what, long long lo, long long hi, long long *v) {
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

/* ------------------------------------------------------------------------------------- */
/* configuration, membership, heartbeats, epoch, state                                    */
/* ------------------------------------------------------------------------------------- */

/* A field of ctl_config_field / ctl_proc_field: its name, or NULL with c's error set. */
static const char *config_field(ctl_t *c, ctl_config_field f) {
    if ((int)f >= 0 && f < CFG_FIELDS) return CONFIG_FIELD_NAMES[f];
    ctl_set_error(c, "config field %d: not a ctl_config_field", (int)f);
    return NULL;
}
static const char *proc_field(ctl_t *c, ctl_proc_field f) {
    if ((int)f >= 0 && f < PROC_FIELDS) return PROC_FIELD_NAMES[f];
    ctl_set_error(c, "process field %d: not a ctl_proc_field", (int)f);
    return NULL;
}

int ctl_set_job_key(ctl_t *c, const char *key_hex) {
    c->keyed = job_key_derive(key_hex, "DPctl001", c->seal_key, sizeof c->seal_key) == 0;
    if (!c->keyed) ctl_set_error(c, "the job's key is not %d hex characters", JOB_KEY_HEX_LEN);
    return c->keyed ? 0 : -1;
}

/* VALUE sealed under NAME with the job key (protocol.h), malloc'd; NULL + c->err without a key. */
static char *seal_value(ctl_t *c, const char *name, const char *value) {
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

static int unseal_reply(ctl_t *c, const char *name, const redisReply *r, char *value, size_t len) {
    return unseal_reply_logged(c, name, r, value, len, 1);
}

/* Membership (rank owners) and commit records are integers sealed under their key's suffix:
 * a forged owner or commit record reads as absent, so it can delay or stop a recovery (a rank
 * that nobody seems to own, a step that nobody seems to have committed), never hand a rank to
 * a process or roll the job back to a step of someone else's choosing. */
static char *seal_int(ctl_t *c, ctl_key k, long long a, long long b, long long v) {
    char suffix[CTL_KEY_MAX], text[32];
    snprintf(text, sizeof text, "%lld", v);
    return seal_value(c, ctl_key_suffix(suffix, sizeof suffix, k, a, b), text);
}

/* 0 with *v from a sealed integer reply, -1 (c->err) when absent, forged or out of [lo, hi]. */
static int unseal_int(ctl_t *c, ctl_key k, long long a, long long b, const redisReply *r, const char *what,
                      long long lo, long long hi, long long *v) {
    char suffix[CTL_KEY_MAX], text[32], err[CTL_ERR_MAX];
    *v = 0;
    if (unseal_reply(c, ctl_key_suffix(suffix, sizeof suffix, k, a, b), r, text, sizeof text) != 0) return -1;
    if (proto_int_parse(text, what, lo, hi, v, err, sizeof err) != 0) {
        ctl_set_error(c, "%s", err);
        *v = 0;
        return -1;
    }
    return 0;
}

/* SET key k(a, b) to v sealed: 0 / -1. */
static int set_sealed_int(ctl_t *c, ctl_key k, long long a, long long b, long long v) {
    char key[CTL_KEY_MAX], *sealed = seal_int(c, k, a, b, v);
    if (!sealed) return -1;
    make_key(c, key, sizeof key, k, a, b);
    int rc = ctl_command_ok(c, "SET %s %s", key, sealed);
    free(sealed);
    return rc;
}

/* GET key k(a, b) as a sealed integer in [0, hi]: the value, or -1 when absent, forged
 * (logged) or unreadable. */
static long long get_sealed_int(ctl_t *c, ctl_key k, long long a, long long b, const char *what, long long hi) {
    char key[CTL_KEY_MAX];
    make_key(c, key, sizeof key, k, a, b);
    redisReply *r = ctl_command(c, "GET %s", key);
    if (!r) return -1;
    long long v = -1;
    if (r->type != REDIS_REPLY_STRING || unseal_int(c, k, a, b, r, what, 0, hi, &v) != 0) v = -1;
    freeReplyObject(r);
    return v;
}

int ctl_config_set(ctl_t *c, ctl_config_field f, const char *value) {
    char key[CTL_KEY_MAX];
    const char *field = config_field(c, f);
    char *sealed = field ? seal_value(c, field, value) : NULL;
    if (!sealed) return -1;
    make_key(c, key, sizeof key, KEY_CONFIG, 0, 0);
    int rc = ctl_command_ok(c, "HSET %s %s %s", key, field, sealed);
    free(sealed);
    return rc;
}

int ctl_config_get(ctl_t *c, ctl_config_field f, char *value, size_t len) {
    char key[CTL_KEY_MAX];
    const char *field = config_field(c, f);
    if (!field) return -1;
    make_key(c, key, sizeof key, KEY_CONFIG, 0, 0);
    redisReply *r = ctl_command(c, "HGET %s %s", key, field);
    if (!r) return -1;
    int rc = unseal_reply(c, field, r, value, len);
    freeReplyObject(r);
    return rc;
}

int ctl_set_sealed(ctl_t *c, const char *suffix, const char *value) {
    char key[CTL_KEY_MAX], *sealed = seal_value(c, suffix, value);
    if (!sealed) return -1;
    suffix_key(c, key, sizeof key, suffix);
    int rc = ctl_command_ok(c, "SET %s %s", key, sealed);
    free(sealed);
    return rc;
}

int ctl_get_sealed(ctl_t *c, const char *suffix, char *value, size_t len) {
    char key[CTL_KEY_MAX];
    suffix_key(c, key, sizeof key, suffix);
    redisReply *r = ctl_command(c, "GET %s", key);
    if (!r) return -1;
    int rc = unseal_reply(c, suffix, r, value, len);
    freeReplyObject(r);
    return rc;
}

/* INCR of one of the job's counters: the new value, or -1. */
static long incr_key(ctl_t *c, ctl_key k) {
    char key[CTL_KEY_MAX];
    make_key(c, key, sizeof key, k, 0, 0);
    long long v;
    if (ctl_command_integer(c, &v, "INCR %s", key) != 0) return -1;
    return (long)v;
}

long ctl_new_proc_id(ctl_t *c) { return incr_key(c, KEY_PROCS); }

int ctl_proc_claim(ctl_t *c, long proc_id, long pid) {
    char key[CTL_KEY_MAX], v[32];
    make_key(c, key, sizeof key, KEY_PROC, proc_id, 0);
    long long set;
    if (ctl_command_integer(c, &set, "HSETNX %s %s %ld", key, PROC_FIELD_NAMES[PROC_PID], pid) != 0) return -1;
    if (set == 1) return 1;
    if (ctl_proc_get(c, proc_id, PROC_PID, v, sizeof v) != 0) return -1;
    return atol(v) == pid;
}

int ctl_claim_rank(ctl_t *c, int rank, long proc_id) {
    char key[CTL_KEY_MAX], *sealed = seal_int(c, KEY_RANK, rank, 0, proc_id);
    if (!sealed) return -1;
    make_key(c, key, sizeof key, KEY_RANK, rank, 0);
    redisReply *r = ctl_command(c, "SET %s %s NX", key, sealed);
    free(sealed);
    if (!r) return -1;
    int claimed = r->type == REDIS_REPLY_STATUS; /* "OK"; NIL when the key already exists */
    freeReplyObject(r);
    return claimed;
}

long ctl_rank_owner(ctl_t *c, int rank) {
    char key[CTL_KEY_MAX];
    make_key(c, key, sizeof key, KEY_RANK, rank, 0);
    redisReply *r = ctl_command(c, "GET %s", key);
    if (!r) return -1;
    long long owner = 0;
    if (r->type == REDIS_REPLY_STRING && unseal_int(c, KEY_RANK, rank, 0, r, "rank owner", 0, LONG_MAX, &owner) != 0)
        owner = c->refused ? 0 : -1; /* forged: nobody's (a claim then finds it taken: a delay, never a member) */
    freeReplyObject(r);
    return owner;
}

int ctl_spare_add(ctl_t *c, long proc_id) {
    char key[CTL_KEY_MAX];
    make_key(c, key, sizeof key, KEY_SPARES, 0, 0);
    long long added;
    return ctl_command_integer(c, &added, "SADD %s %ld", key, proc_id);
}

int ctl_spare_remove(ctl_t *c, long proc_id) {
    char key[CTL_KEY_MAX];
    make_key(c, key, sizeof key, KEY_SPARES, 0, 0);
    long long removed;
    return ctl_command_integer(c, &removed, "SREM %s %ld", key, proc_id);
}

long ctl_spare_count(ctl_t *c) {
    char key[CTL_KEY_MAX];
    make_key(c, key, sizeof key, KEY_SPARES, 0, 0);
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
    make_key(c, key, sizeof key, KEY_SPARES, 0, 0);
    redisReply *r = ctl_command(c, "SMEMBERS %s", key);
    if (!r) return -1;
    int n = 0;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements && n < max; i++) {
        long long id;
        if (reply_int(NULL, r->element[i], "spare", 1, LONG_MAX, &id) == 0) ids[n++] = (long)id;
    }
    freeReplyObject(r);
    qsort(ids, (size_t)n, sizeof *ids, compare_long);
    return n;
}

int ctl_proc_set(ctl_t *c, long proc_id, ctl_proc_field f, const char *value) {
    char key[CTL_KEY_MAX];
    const char *field = proc_field(c, f);
    if (!field) return -1;
    make_key(c, key, sizeof key, KEY_PROC, proc_id, 0);
    return ctl_command_ok(c, "HSET %s %s %s", key, field, value);
}

int ctl_proc_get(ctl_t *c, long proc_id, ctl_proc_field f, char *value, size_t len) {
    char key[CTL_KEY_MAX];
    const char *field = proc_field(c, f);
    if (!field) return -1;
    make_key(c, key, sizeof key, KEY_PROC, proc_id, 0);
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
    char key[CTL_KEY_MAX], *sealed = seal_int(c, KEY_COMMITTED, epoch, rank, step);
    char *claim = seal_int(c, KEY_STATELESS, rank, 0, stateless_through);
    if (!sealed || !claim) {
        free(sealed);
        free(claim);
        return -1;
    }
    make_key(c, key, sizeof key, KEY_COMMITTED, epoch, rank);
    /* one MSET: atomic, so whoever reads the commit can read the claim */
    char ckey[CTL_KEY_MAX];
    make_key(c, ckey, sizeof ckey, KEY_STATELESS, rank, 0);
    int rc = ctl_command_ok(c, "MSET %s %s %s %s", ckey, claim, key, sealed);
    free(sealed);
    free(claim);
    return rc;
}

long long ctl_stateless_through(ctl_t *c, int rank) {
    return get_sealed_int(c, KEY_STATELESS, rank, 0, "stateless", LLONG_MAX);
}

int ctl_gen_bytes_set(ctl_t *c, int rank, long long bytes) { return set_sealed_int(c, KEY_GEN_BYTES, rank, 0, bytes); }

#define MGET_CHUNK 256

/* One MGET of keys[0..n), n <= MGET_CHUNK (argv form: the key count varies). The array reply
 * of n elements (caller frees), or NULL with c->err set. */
static redisReply *ctl_mget(ctl_t *c, char (*keys)[CTL_KEY_MAX], int n) {
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

const char *ctl_key_suffix(char *buf, size_t len, ctl_key k, long long a, long long b) {
    return expand_key(buf, len, k, a, b, 0);
}

const char *ctl_key_pattern(const ctl_t *c, char *buf, size_t len, ctl_key k) {
    char suffix[CTL_KEY_MAX];
    job_key(buf, len, c->job, expand_key(suffix, sizeof suffix, k, 0, 0, 1));
    return buf;
}

const char *ctl_key_full(const ctl_t *c, char *buf, size_t len, ctl_key k, long long a, long long b) {
    return make_key(c, buf, len, k, a, b);
}

long long ctl_persisted_add(ctl_t *c, long long step, int rank) {
    char key[CTL_KEY_MAX], *sealed = seal_int(c, KEY_PERSISTED, step, 0, rank);
    if (!sealed) return -1;
    make_key(c, key, sizeof key, KEY_PERSISTED, step, 0);
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
            unseal_int(c, KEY_PERSISTED, step, 0, r->element[i], "persisted rank", 0, DP_MAX_RANKS - 1, &v) == 0)
            n++;
    }
    freeReplyObject(r);
    return n;
}

int ctl_persist_complete_set(ctl_t *c, long long step) { return set_sealed_int(c, KEY_PERSIST_COMPLETE, 0, 0, step); }

long long ctl_persist_complete(ctl_t *c) { return get_sealed_int(c, KEY_PERSIST_COMPLETE, 0, 0, "persist:complete", LLONG_MAX); }

long long ctl_counter_incr(ctl_t *c, const char *name) {
    char key[CTL_KEY_MAX];
    suffix_key(c, key, sizeof key, name);
    long long v;
    if (ctl_command_integer(c, &v, "INCR %s", key) != 0) return -1;
    return v;
}

int ctl_set(ctl_t *c, const char *suffix, const char *value) {
    char key[CTL_KEY_MAX];
    suffix_key(c, key, sizeof key, suffix);
    return ctl_command_ok(c, "SET %s %s", key, value);
}

static int get_or_take(ctl_t *c, const char *cmd, const char *suffix, char *value, size_t len) {
    char key[CTL_KEY_MAX];
    suffix_key(c, key, sizeof key, suffix);
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
    suffix_key(c, key, sizeof key, suffix);
    redisReply *r = ctl_command(c, "SET %s %s NX", key, value);
    if (!r) return -1;
    int set = r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    return set;
}

int ctl_set_rank_owner(ctl_t *c, int rank, long proc_id) { return set_sealed_int(c, KEY_RANK, rank, 0, proc_id); }

int ctl_epoch_set(ctl_t *c, long epoch) {
    char key[CTL_KEY_MAX];
    make_key(c, key, sizeof key, KEY_EPOCH, 0, 0);
    return ctl_command_ok(c, "SET %s %ld", key, epoch);
}

/* 1 when list is a process's wake-up list (KEY_NOTICE, KEY_ABORT), else 0 with c->err set. */
static int wake_list(ctl_t *c, ctl_key list) {
    if (list == KEY_NOTICE || list == KEY_ABORT) return 1;
    ctl_set_error(c, "wake-up: key %d is not a process's wake-up list (KEY_NOTICE or KEY_ABORT)", (int)list);
    return 0;
}

int ctl_notify(ctl_t *c, long proc_id, ctl_key list, long value) {
    char key[CTL_KEY_MAX];
    if (!wake_list(c, list)) return -1;
    make_key(c, key, sizeof key, list, proc_id, 0);
    long long n;
    return ctl_command_integer(c, &n, "RPUSH %s %ld", key, value);
}

long ctl_wait_notice(ctl_t *c, long proc_id, ctl_key list, int timeout_ms) {
    char key[CTL_KEY_MAX], timeout[32];
    if (!wake_list(c, list)) return -1;
    make_key(c, key, sizeof key, list, proc_id, 0);
    /* BLPOP takes fractional seconds; the connection's own timeout must be longer. */
    snprintf(timeout, sizeof timeout, "%.3f", timeout_ms / 1000.0);
    redisReply *r = ctl_command(c, "BLPOP %s %s", key, timeout);
    if (!r) return -1;
    long long v = 0;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        reply_int(c, r->element[1], list == KEY_NOTICE ? "notice" : "abort notice", -1, LONG_MAX, &v) != 0)
        v = -1;
    freeReplyObject(r);
    return v;
}

int ctl_alive_many(ctl_t *c, const long *procs, int n, int *alive) {
    for (int base = 0; base < n; base += MGET_CHUNK) {
        int m = n - base < MGET_CHUNK ? n - base : MGET_CHUNK;
        char keys[MGET_CHUNK][CTL_KEY_MAX];
        for (int i = 0; i < m; i++) make_key(c, keys[i], sizeof keys[i], KEY_HB, procs[base + i], 0);
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
        for (int i = 0; i < m; i++) make_key(c, keys[i], sizeof keys[i], KEY_RANK, base + i, 0);
        redisReply *r = ctl_mget(c, keys, m);
        if (!r) return -1;
        for (int i = 0; i < m; i++) {
            const redisReply *e = r->element[i];
            long long v = 0;
            if (e->type == REDIS_REPLY_STRING) unseal_int(c, KEY_RANK, base + i, 0, e, "rank owner", 0, LONG_MAX, &v);
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
        for (int i = 0; i < m; i++) suffix_key(c, keys[i], sizeof keys[i], suffixes[base + i]);
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
            reply_lost(c, what);
            return -1;
        }
        redisReply *r = reply;
        if (r->type == REDIS_REPLY_ERROR && rc == 0) {
            reply_refused(c, what, r->str);
            rc = -1;
        }
        if (r->type == REDIS_REPLY_ERROR && demoted_error(r->str)) c->stale = 1;
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
        if (!(names[f] = proc_field(c, fields[f]))) return -1;
    for (size_t i = 0; i < (size_t)n * (size_t)nfields; i++) values[i * len] = '\0';
    if (n <= 0) return 0;
    if (ensure_connected(c) != 0) return -1;
    for (int i = 0; i < n; i++) {
        char key[CTL_KEY_MAX];
        const char *argv[10];
        make_key(c, key, sizeof key, KEY_PROC, procs[i], 0);
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
    if (ensure_connected(c) != 0) {
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

static void batch_append(ctl_t *c, const char *fmt, ...) {
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
    suffix_key(c, key, sizeof key, suffix);
    batch_append(c, "SET %s %s", key, value);
}

void ctl_batch_set_sealed(ctl_t *c, const char *suffix, const char *value) {
    char *sealed = c->batch_failed ? NULL : seal_value(c, suffix, value);
    if (sealed) ctl_batch_set(c, suffix, sealed);
    else c->batch_failed = 1;
    free(sealed);
}

void ctl_batch_rank_owner(ctl_t *c, int rank, long proc_id) {
    char key[CTL_KEY_MAX], *sealed = c->batch_failed ? NULL : seal_int(c, KEY_RANK, rank, 0, proc_id);
    if (!sealed) {
        c->batch_failed = 1;
        return;
    }
    make_key(c, key, sizeof key, KEY_RANK, rank, 0);
    batch_append(c, "SET %s %s", key, sealed);
    free(sealed);
}

void ctl_batch_epoch(ctl_t *c, long epoch) {
    char key[CTL_KEY_MAX];
    make_key(c, key, sizeof key, KEY_EPOCH, 0, 0);
    batch_append(c, "SET %s %ld", key, epoch);
}

void ctl_batch_notify(ctl_t *c, long proc_id, ctl_key list, long value) {
    char key[CTL_KEY_MAX];
    if (!wake_list(c, list)) {
        c->batch_failed = 1;
        return;
    }
    make_key(c, key, sizeof key, list, proc_id, 0);
    batch_append(c, "RPUSH %s %ld", key, value);
}

void ctl_batch_spare_remove(ctl_t *c, long proc_id) {
    char key[CTL_KEY_MAX];
    make_key(c, key, sizeof key, KEY_SPARES, 0, 0);
    batch_append(c, "SREM %s %ld", key, proc_id);
}

void ctl_batch_push_key(ctl_t *c, const char *key, const char *value, int ttl_s) {
    batch_append(c, "RPUSH %s %s", key, value);
    batch_append(c, "EXPIRE %s %d", key, ttl_s);
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

unsigned long long ctl_round_trips(const ctl_t *c) { return c ? c->round_trips : 0; }
void ctl_mark(ctl_t *c) { if (c) c->mark = c->round_trips; }
unsigned long long ctl_round_trips_since_mark(const ctl_t *c) { return c ? c->round_trips - c->mark : 0; }

int ctl_server_config_set(ctl_t *c, const char *param, const char *value) {
    return ctl_command_ok(c, "CONFIG SET %s %s", param, value);
}

int ctl_heartbeat_clear(ctl_t *c, long proc_id) {
    char key[CTL_KEY_MAX];
    make_key(c, key, sizeof key, KEY_HB, proc_id, 0);
    return ctl_command_ok(c, "DEL %s", key);
}

int ctl_heartbeat(ctl_t *c, long proc_id, int ttl_ms) {
    if (ttl_ms <= 0) {
        ctl_set_error(c, "heartbeat: ttl must be positive (got %d ms)", ttl_ms);
        return -1;
    }
    char key[CTL_KEY_MAX];
    make_key(c, key, sizeof key, KEY_HB, proc_id, 0);
    return ctl_command_ok(c, "SET %s 1 PX %d", key, ttl_ms);
}

int ctl_alive(ctl_t *c, long proc_id) {
    char key[CTL_KEY_MAX];
    make_key(c, key, sizeof key, KEY_HB, proc_id, 0);
    long long n;
    if (ctl_command_integer(c, &n, "EXISTS %s", key) != 0) return -1;
    return n > 0;
}

long ctl_epoch(ctl_t *c) {
    char key[CTL_KEY_MAX];
    make_key(c, key, sizeof key, KEY_EPOCH, 0, 0);
    redisReply *r = ctl_command(c, "GET %s", key);
    if (!r) return -1;
    long long epoch = 0; /* absent before the first increment */
    if (r->type == REDIS_REPLY_STRING && reply_int(c, r, "epoch", 0, LONG_MAX, &epoch) != 0) epoch = -1;
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
    suffix_key(c, key, sizeof key, ctl_key_suffix(suffix, sizeof suffix, KEY_STATE, 0, 0));
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

/* ------------------------------------------------------------------------------------- */
/* event and metric lists                                                                 */
/* ------------------------------------------------------------------------------------- */

static int push_to_list(ctl_t *c, ctl_key list, const char *json) {
    char key[CTL_KEY_MAX];
    make_key(c, key, sizeof key, list, 0, 0);
    long long len;
    return ctl_command_integer(c, &len, "RPUSH %s %s", key, json);
}

int ctl_push_event(ctl_t *c, const char *json) { return push_to_list(c, KEY_EVENTS, json); }
/* Reports are sealed: one tells the launcher the job is done, where the model went, or that
 * it diverged. (A genuine report replayed says what it said once; the kinds that end a job
 * are sent once, at its end.) */
#define REPORTS_SEAL_NAME "reports"
int ctl_push_report(ctl_t *c, const char *text) {
    char *sealed = seal_value(c, REPORTS_SEAL_NAME, text);
    if (!sealed) return -1;
    int rc = push_to_list(c, KEY_REPORTS, sealed);
    free(sealed);
    return rc;
}

/* The line goes to the launcher that drains the list, and stays readable as the newest
 * progress for the launchers of the other machines: one round trip for both. */
int ctl_push_metric(ctl_t *c, const char *json) {
    char key[CTL_KEY_MAX], last[CTL_KEY_MAX];
    make_key(c, key, sizeof key, KEY_METRICS, 0, 0);
    ctl_key_full(c, last, sizeof last, KEY_PROGRESS, 0, 0);
    if (ctl_batch_begin(c) != 0) return -1;
    batch_append(c, "RPUSH %s %s", key, json);
    batch_append(c, "SET %s %s", last, json);
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
            reply_lost(c, "drain");
            if (exec) freeReplyObject(exec);
            return NULL; /* the context is now in error; the next call reconnects */
        }
        redisReply *r = reply;
        if (r->type == REDIS_REPLY_ERROR && !failed) {
            reply_refused(c, "drain", r->str);
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
    if (ensure_connected(c) != 0) return -1;
    char key[CTL_KEY_MAX];
    make_key(c, key, sizeof key, list, 0, 0);
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
        if (text && unseal_reply(c, REPORTS_SEAL_NAME, e, text, e->len + 1) == 0) fn(text, arg); /* refused: logged */
        free(text);
    }
    freeReplyObject(exec);
    return n;
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
    if (ensure_connected(c) != 0) return -1;
    return delete_job_keys(c, c->job);
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

int ctl_hash_set(ctl_t *c, const char *suffix, const char *field, const char *value) {
    char key[CTL_KEY_MAX];
    suffix_key(c, key, sizeof key, suffix);
    return ctl_command_ok(c, "HSET %s %s %s", key, field, value);
}

int ctl_hash_getall(ctl_t *c, const char *suffix, char *fields, size_t flen, char *values, size_t vlen, int max) {
    char key[CTL_KEY_MAX];
    suffix_key(c, key, sizeof key, suffix);
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

int ctl_exit_report(ctl_t *c, long proc, const char *how) {
    char key[CTL_KEY_MAX], hb[CTL_KEY_MAX];
    ctl_key_full(c, key, sizeof key, KEY_EXIT, proc, 0);
    make_key(c, hb, sizeof hb, KEY_HB, proc, 0);
    if (ctl_batch_begin(c) != 0) return -1;
    /* How first: whoever sees the heartbeat gone finds why. */
    batch_append(c, "SET %s %s EX 86400", key, how);
    batch_append(c, "DEL %s", hb);
    return ctl_batch_end(c);
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
    if (ensure_connected(c) != 0) return -1;
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
    if (ensure_connected(c) != 0) return -1;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(c->rc->fd, (struct sockaddr *)&ss, &sl) != 0) return -1;
    const void *a = ss.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                                             : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
    return inet_ntop(ss.ss_family, a, buf, (socklen_t)len) ? 0 : -1;
}

int ctl_launcher_alive(ctl_t *c) {
    char key[CTL_KEY_MAX];
    ctl_key_full(c, key, sizeof key, KEY_LAUNCHER, 0, 0);
    long long n;
    if (ctl_command_integer(c, &n, "EXISTS %s", key) != 0) return -1;
    return n > 0;
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
        if (job_name_valid(l->jobs[l->n])) l->n++;
    }
    return 0;
}

int ctl_job_dead_run(ctl_t *c, long long *seen_ms) {
    if (seen_ms) *seen_ms = 0;
    if (ensure_connected(c) != 0) return -1;
    char key[CTL_KEY_MAX], suffix[32], pattern[CTL_KEY_MAX];
    long long n;
    make_key(c, key, sizeof key, KEY_CONFIG, 0, 0);
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
    if (ensure_connected(c) != 0) return -1;
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
    if (ensure_connected(c) != 0) return -1;
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

/* ------------------------------------------------------------------------------------- */
/* a URL with its password in a file                                                      */
/* ------------------------------------------------------------------------------------- */

/* The URL of addr with ":PASSWORD@" (percent-encoded but for unreserved characters). */
static int format_with_password(const redis_addr *a, char *buf, size_t len) {
    char plain[4200], pw[3 * sizeof a->password + 1];
    redis_addr_format(a, plain, sizeof plain);
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)a->password; *p && o + 4 < sizeof pw; p++) {
        if (isalnum(*p) || *p == '-' || *p == '.' || *p == '_' || *p == '~') pw[o++] = (char)*p;
        else o += (size_t)snprintf(pw + o, sizeof pw - o, "%%%02X", *p);
    }
    pw[o] = 0;
    const char *rest = strstr(plain, "://");
    if (!rest) return -1;
    rest += 3;
    int n = a->password[0] ? snprintf(buf, len, "%.*s:%s@%s", (int)(rest - plain), plain, pw, rest)
                           : snprintf(buf, len, "%s", plain);
    explicit_bzero(pw, sizeof pw);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

int redis_file_write(const redis_addr *addr, const char *dir, char *path, size_t len, char *err, size_t errlen) {
    char url[5000];
    if (format_with_password(addr, url, sizeof url) != 0) {
        set_err(err, errlen, "redis file: the URL is too long");
        return -1;
    }
    int n = snprintf(path, len, "%s/redis", dir);
    int rc = n > 0 && (size_t)n < len ? private_line_write(path, url, err, errlen) : -1;
    explicit_bzero(url, sizeof url);
    return rc;
}

int redis_file_read(const char *path, char *url, size_t len, char *err, size_t errlen) {
    return private_line_read(path, "a redis URL", url, len, err, errlen);
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

int ctl_committed_get_many(ctl_t *c, long epoch, int nranks, long long *steps) {
    for (int base = 0; base < nranks; base += MGET_CHUNK) {
        int n = nranks - base < MGET_CHUNK ? nranks - base : MGET_CHUNK;
        char keys[MGET_CHUNK][CTL_KEY_MAX];
        for (int i = 0; i < n; i++) make_key(c, keys[i], sizeof keys[i], KEY_COMMITTED, epoch, base + i);
        redisReply *r = ctl_mget(c, keys, n);
        if (!r) return -1;
        for (int i = 0; i < n; i++)
            if (r->element[i]->type != REDIS_REPLY_STRING ||
                unseal_int(c, KEY_COMMITTED, epoch, base + i, r->element[i], "committed", 0, LLONG_MAX, &steps[base + i]) != 0)
                steps[base + i] = -1;
        freeReplyObject(r);
    }
    return 0;
}

int ctl_stateless_through_many(ctl_t *c, const int *ranks, int n, long long *through) {
    for (int base = 0; base < n; base += MGET_CHUNK) {
        int m = n - base < MGET_CHUNK ? n - base : MGET_CHUNK;
        char keys[MGET_CHUNK][CTL_KEY_MAX];
        for (int i = 0; i < m; i++) make_key(c, keys[i], sizeof keys[i], KEY_STATELESS, ranks[base + i], 0);
        redisReply *r = ctl_mget(c, keys, m);
        if (!r) {
            for (int i = base; i < n; i++) through[i] = -1;
            return -1;
        }
        for (int i = 0; i < m; i++)
            if (r->element[i]->type != REDIS_REPLY_STRING ||
                unseal_int(c, KEY_STATELESS, ranks[base + i], 0, r->element[i], "stateless", 0, LLONG_MAX, &through[base + i]) != 0)
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
        for (int i = 0; i < n; i++) make_key(c, keys[i], sizeof keys[i], KEY_GEN_BYTES, base + i, 0);
        redisReply *r = ctl_mget(c, keys, n);
        if (!r) return max;
        for (int i = 0; i < n; i++) {
            long long b;
            if (r->element[i]->type == REDIS_REPLY_STRING &&
                unseal_int(c, KEY_GEN_BYTES, base + i, 0, r->element[i], "gen_bytes", 0, LLONG_MAX, &b) == 0 && b > max)
                max = b;
        }
        freeReplyObject(r);
    }
    return max;
}

int redis_url_scrub(char *url) {
    char *scheme_end = strstr(url, "://");
    char *auth = scheme_end ? scheme_end + 3 : url;
    char *at = strrchr(auth, '@');
    char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
    if (!colon || colon + 1 == at) return 0;
    memset(colon + 1, '*', (size_t)(at - colon - 1));
    return 1;
}

int ctl_counter_at_least(ctl_t *c, const char *name, long long value) {
    char key[CTL_KEY_MAX];
    suffix_key(c, key, sizeof key, name);
    long long v;
    return ctl_command_integer(c, &v,
                               "EVAL %s 1 %s %lld",
                               "local v = tonumber(redis.call('GET', KEYS[1]) or '0') "
                               "if v < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) return 1 end return 0",
                               key, value);
}
