/* metrics_http.c — /metrics in the Prometheus text format, served by libmicrohttpd. */
#include "metrics_http.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

const char *const LIVE_PHASE_NAMES[LIVE_PHASES] = {"detect", "decide", "restore", "rebuild", "resnapshot", "first_step"};
const char *const LIVE_CONN_NAMES[LIVE_CONN_KINDS] = {"survivor_max", "replacement_max", "total"};

void live_metrics_init(LiveMetrics *m) {
    memset(m, 0, sizeof *m);
    m->step = m->loss = m->lr = m->grad_norm = m->step_ms = m->tokens_per_s = NAN;
    m->epoch = m->committed_step = m->snapshot_wait_ms = m->t = NAN;
    m->spares_available = -1;
    m->eta_s = -1;
    m->last_recovery_ms = NAN;
    for (int i = 0; i < LIVE_PHASES; i++) m->last_recovery_phase_ms[i] = NAN;
    for (int i = 0; i < LIVE_CONN_KINDS; i++) m->last_recovery_connections[i] = NAN;
    /* The usual kinds exist from the start, so that a rate() over them has a zero to begin at. */
    static const char *const kinds[] = {"crash", "hang", "network"};
    for (int i = 0; i < 3; i++) {
        snprintf(m->failures[i].kind, sizeof m->failures[i].kind, "%s", kinds[i]);
        snprintf(m->recoveries[i].kind, sizeof m->recoveries[i].kind, "%s", kinds[i]);
    }
}

void live_kind_add(LiveKindCount *counts, const char *kind) {
    char clean[sizeof counts[0].kind];
    size_t n = 0;
    /* Label values stay plain: [a-z0-9_], capitals lowered, anything else becomes '_'. */
    for (const char *p = kind ? kind : ""; *p && n + 1 < sizeof clean; p++)
        clean[n++] = *p >= 'A' && *p <= 'Z' ? (char)(*p - 'A' + 'a')
                   : (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_' ? *p : '_';
    clean[n] = 0;
    if (!n) snprintf(clean, sizeof clean, "unknown");
    int i = 0;
    for (; i < LIVE_KINDS_MAX - 1 && counts[i].kind[0]; i++)
        if (!strcmp(counts[i].kind, clean)) break;
    if (!counts[i].kind[0]) snprintf(counts[i].kind, sizeof counts[i].kind, "%s", clean);
    else if (i == LIVE_KINDS_MAX - 1 && strcmp(counts[i].kind, clean) != 0)
        snprintf(counts[i].kind, sizeof counts[i].kind, "other");
    counts[i].count += 1;
}

/* --- the exposition text ------------------------------------------------------------- */

typedef struct {
    char *buf;
    size_t len, used;
    int overflow;
} Out;

static void put(Out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Out *o, const char *fmt, ...) {
    if (o->overflow) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->used, o->len - o->used, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= o->len - o->used) {
        o->overflow = 1;
        return;
    }
    o->used += (size_t)n;
}

/* A sample value as Prometheus reads it: integers without a fraction, NaN and ±Inf spelled out. */
static void put_value(Out *o, double v) {
    if (isnan(v)) put(o, "NaN\n");
    else if (isinf(v)) put(o, "%sInf\n", v > 0 ? "+" : "-");
    else if (v == floor(v) && fabs(v) < 1e15) put(o, "%.0f\n", v);
    else put(o, "%.10g\n", v);
}

static void family(Out *o, const char *name, const char *type, const char *help) {
    put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One unlabelled gauge, left out while its value is unknown (NaN). */
/* One gauge family with a value per label (names[i]: values[i] * scale); the unknown (NAN)
 * are left out, the family too when all are. */
static void labelled_gauges(Out *o, const char *name, const char *help, const char *label, const char *const *names,
                            const double *values, int n, double scale) {
    int any = 0;
    for (int i = 0; i < n; i++) any |= !isnan(values[i]);
    if (!any) return;
    family(o, name, "gauge", help);
    for (int i = 0; i < n; i++) {
        if (isnan(values[i])) continue;
        put(o, "%s{%s=\"%s\"} ", name, label, names[i]);
        put_value(o, values[i] * scale);
    }
}

static void gauge(Out *o, const char *name, const char *help, double v) {
    if (isnan(v)) return;
    family(o, name, "gauge", help);
    put(o, "%s ", name);
    put_value(o, v);
}

static void kind_counter(Out *o, const char *name, const char *help, const LiveKindCount *c) {
    family(o, name, "counter", help);
    for (int i = 0; i < LIVE_KINDS_MAX && c[i].kind[0]; i++) {
        put(o, "%s{kind=\"%s\"} ", name, c[i].kind);
        put_value(o, c[i].count);
    }
}

/* The job's counters: waits, steps, snapshot bytes and generations, failures, recoveries. */
static void counters(Out *o, const LiveMetrics *m) {
    family(o, "deadpool_snapshot_wait_seconds_total", "counter", "Time all steps waited for the previous snapshot.");
    put(o, "deadpool_snapshot_wait_seconds_total ");
    put_value(o, m->snapshot_wait_ms_total / 1e3);
    family(o, "deadpool_steps_reported_total", "counter", "Steps completed, recomputed ones counted again.");
    put(o, "deadpool_steps_reported_total ");
    put_value(o, m->steps_reported);
    family(o, "deadpool_snapshot_bytes_total", "counter",
           "Snapshot bytes, by kind (copied: into host memory, replicated: to holders), as each process reports them "
           "when it leaves an epoch.");
    put(o, "deadpool_snapshot_bytes_total{kind=\"copied\"} ");
    put_value(o, m->snapshot_bytes_copied);
    put(o, "deadpool_snapshot_bytes_total{kind=\"replicated\"} ");
    put_value(o, m->snapshot_bytes_replicated);
    family(o, "deadpool_snapshot_generations_total", "counter", "Snapshot generations captured, summed over the ranks that reported.");
    put(o, "deadpool_snapshot_generations_total ");
    put_value(o, m->snapshot_generations);
    kind_counter(o, "deadpool_failures_total", "Failures the coordinator acted on, by kind.", m->failures);
    kind_counter(o, "deadpool_recoveries_total", "Recoveries completed (training resumed), by failure kind.", m->recoveries);
    family(o, "deadpool_steps_recomputed_total", "counter", "Steps computed again after rollbacks.");
    put(o, "deadpool_steps_recomputed_total ");
    put_value(o, m->steps_recomputed_total);
}

int metrics_format(const LiveMetrics *m, char *buf, size_t len) {
    Out o = {.buf = buf, .len = len};
    if (!len) return -1;
    buf[0] = 0;
    family(&o, "deadpool_job_info", "gauge", "The job: its id, always 1.");
    put(&o, "deadpool_job_info{job=\"%s\"} 1\n", m->job);
    gauge(&o, "deadpool_job_running", "1 while the job runs, 0 once it is over.", m->finished ? 0 : 1);
    gauge(&o, "deadpool_workers", "Data-parallel ranks of the job.", m->workers);
    gauge(&o, "deadpool_steps_target", "Optimizer steps the job runs in all.", m->steps_target);
    gauge(&o, "deadpool_step", "Newest step completed (1-based; goes back after a rollback).", m->step);
    gauge(&o, "deadpool_loss", "Training loss of the newest step.", m->loss);
    gauge(&o, "deadpool_learning_rate", "Learning rate of the newest step.", m->lr);
    gauge(&o, "deadpool_grad_norm", "Gradient norm of the newest step.", m->grad_norm);
    gauge(&o, "deadpool_step_duration_seconds", "Wall time of the newest step.", m->step_ms / 1e3);
    gauge(&o, "deadpool_tokens_per_second", "Training throughput of the newest step.", m->tokens_per_s);
    gauge(&o, "deadpool_epoch", "Membership epoch (one more after each recovery).", m->epoch);
    gauge(&o, "deadpool_committed_step", "Newest step every rank can restore from memory.", m->committed_step);
    gauge(&o, "deadpool_job_elapsed_seconds", "Job time of the newest step, since the job started.", m->t);
    if (m->eta_s >= 0) gauge(&o, "deadpool_eta_seconds", "Estimated time until the last step.", m->eta_s);
    if (m->spares_available >= 0)
        gauge(&o, "deadpool_spares_available", "Warm spares waiting in the pool.", m->spares_available);
    gauge(&o, "deadpool_snapshot_wait_seconds", "Time the newest step waited for the previous snapshot.",
          m->snapshot_wait_ms / 1e3);
    counters(&o, m);
    gauge(&o, "deadpool_last_recovery_seconds", "From the newest failure until training resumed.", m->last_recovery_ms / 1e3);
    labelled_gauges(&o, "deadpool_last_recovery_phase_seconds", "The newest recovery's phases.", "phase",
                    LIVE_PHASE_NAMES, m->last_recovery_phase_ms, LIVE_PHASES, 1e-3);
    labelled_gauges(&o, "deadpool_last_recovery_connections",
                    "Data-plane connections the newest recovery made (dialed + accepted): on its busiest survivor, "
                    "its busiest replacement, and in all.",
                    "who", LIVE_CONN_NAMES, m->last_recovery_connections, LIVE_CONN_KINDS, 1);
    return o.overflow ? -1 : (int)o.used;
}

/* --- the daemon ----------------------------------------------------------------------
 * Nobody who can reach the port can keep scrapers out (another user of the machine, anything
 * on the network with --bind). libmicrohttpd's idle timeout restarts at every byte received,
 * so a client that sends its request one byte a second would hold a connection for ever, and
 * a few dozen of them used to fill the connection limit (32). Now:
 *  - the limit is far above any scraper's need: 1024 connections (a quarter of the descriptor
 *    limit when that is lower);
 *  - a connection must have sent its whole request head within HEADER_MS of being accepted (or
 *    of its previous response, on a kept-alive connection), however steadily it trickles;
 *  - at most PENDING_MAX connections may be waiting for their request head at once: a new one
 *    beyond that closes the oldest waiting one. So strangers never fill the limit, and a
 *    scraper, which sends its request at once, is served.
 * Every connection is noted when libmicrohttpd starts it (MHD_OPTION_NOTIFY_CONNECTION) and
 * leaves the waiting list when its request head is complete (the access handler runs) or it
 * closes; the waiting ones are looked at whenever a connection starts (what a stranger can do
 * harm to), by libmicrohttpd's one internal thread, the thread that closes connections too: a
 * connection is shut down (shutdown(2), libmicrohttpd then closes it) only while its socket is
 * certainly still open. No per-address limit (MHD_OPTION_PER_IP_CONNECTION_LIMIT): a local
 * stranger and a local Prometheus both come from 127.0.0.1, so it would let the stranger lock
 * the scraper out. */
#define HEADER_MS 3000  /* the whole request head within this */
#define PENDING_MAX 256 /* connections waiting for their request head; a new one beyond closes the oldest */
#define CONN_MAX 1024   /* connections in all */

typedef struct Pending {
    struct MHD_Connection *c;
    double since;         /* accepted, or its previous response sent (now_ms) */
    int waiting;          /* on the waiting list: its request head is not complete */
    struct Pending *prev, *next;
} Pending;

struct MetricsServer {
    struct MHD_Daemon *daemon;
    pthread_mutex_t mu;
    LiveMetrics m;
    int port;
    unsigned long requests;
    /* libmicrohttpd's thread only: the connections waiting for their request head, oldest first */
    Pending *head, *tail;
    int pending, pending_max;
    unsigned long cut; /* connections closed for being too slow or the oldest of too many */
};

static double mono_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void pending_unlink(MetricsServer *s, Pending *p) {
    if (!p->waiting) return;
    if (p->prev) p->prev->next = p->next;
    else s->head = p->next;
    if (p->next) p->next->prev = p->prev;
    else s->tail = p->prev;
    p->prev = p->next = NULL;
    p->waiting = 0;
    s->pending--;
}

static void pending_append(MetricsServer *s, Pending *p) {
    p->since = mono_now_ms();
    p->waiting = 1;
    p->prev = s->tail;
    p->next = NULL;
    if (s->tail) s->tail->next = p;
    else s->head = p;
    s->tail = p;
    s->pending++;
}

/* Ends a waiting connection: libmicrohttpd sees its socket shut and closes it. */
static void pending_cut(MetricsServer *s, Pending *p) {
    const union MHD_ConnectionInfo *i = MHD_get_connection_info(p->c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (i) shutdown(i->connect_fd, SHUT_RDWR);
    pending_unlink(s, p);
    s->cut++;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    MetricsServer *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        Pending *p = *socket_context;
        if (p) pending_unlink(s, p);
        free(p);
        *socket_context = NULL;
        return;
    }
    double now = mono_now_ms();
    while (s->head && now - s->head->since > HEADER_MS) pending_cut(s, s->head); /* too slow */
    if (s->pending >= s->pending_max && s->head) pending_cut(s, s->head);          /* too many */
    Pending *p = calloc(1, sizeof *p);
    if (!p) return;
    p->c = c;
    pending_append(s, p);
    *socket_context = p;
}

/* A request was answered: a kept-alive connection waits for its next request head afresh. */
static void on_completed(void *cls, struct MHD_Connection *c, void **req_cls, enum MHD_RequestTerminationCode toe) {
    (void)req_cls;
    (void)toe;
    MetricsServer *s = cls;
    const union MHD_ConnectionInfo *i = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    Pending *p = i ? i->socket_context : NULL;
    if (p && !p->waiting) pending_append(s, p);
}

static enum MHD_Result respond(struct MHD_Connection *c, unsigned status, const char *type, const char *body, size_t n) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **req_cls) {
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)req_cls;
    MetricsServer *s = cls;
    static const char plain[] = "text/plain; charset=utf-8";
    /* the request head is complete: no longer a connection that waits for one */
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (ci && ci->socket_context) pending_unlink(s, ci->socket_context);
    pthread_mutex_lock(&s->mu);
    s->requests++;
    pthread_mutex_unlock(&s->mu);
    /* Anything but GET/HEAD is refused at once; libmicrohttpd discards a body it never hands us. */
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
        static const char msg[] = "only GET and HEAD\n";
        return respond(c, MHD_HTTP_METHOD_NOT_ALLOWED, plain, msg, sizeof msg - 1);
    }
    if (!strcmp(url, "/metrics")) {
        LiveMetrics m;
        pthread_mutex_lock(&s->mu);
        m = s->m;
        pthread_mutex_unlock(&s->mu);
        char body[16384];
        int n = metrics_format(&m, body, sizeof body);
        if (n < 0) {
            static const char msg[] = "metrics exceed the buffer\n";
            return respond(c, MHD_HTTP_INTERNAL_SERVER_ERROR, plain, msg, sizeof msg - 1);
        }
        return respond(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body, (size_t)n);
    }
    if (!strcmp(url, "/")) {
        static const char msg[] = "DeadPool job: Prometheus metrics at /metrics\n";
        return respond(c, MHD_HTTP_OK, plain, msg, sizeof msg - 1);
    }
    static const char msg[] = "not found: the metrics are at /metrics\n";
    return respond(c, MHD_HTTP_NOT_FOUND, plain, msg, sizeof msg - 1);
}

MetricsServer *metrics_server_start(const char *host, int port, char *err, size_t errlen) {
    if (!host || !host[0]) host = "127.0.0.1";
    if (port < 0 || port > 65535) {
        snprintf(err, errlen, "metrics port %d: expected 0..65535", port);
        return NULL;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    int gai = getaddrinfo(host, NULL, &hints, &ai);
    if (gai != 0 || !ai) {
        snprintf(err, errlen, "metrics server: cannot resolve '%s': %s", host, gai_strerror(gai));
        return NULL;
    }
    struct sockaddr_storage sa;
    memset(&sa, 0, sizeof sa);
    memcpy(&sa, ai->ai_addr, ai->ai_addrlen < sizeof sa ? ai->ai_addrlen : sizeof sa);
    int v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    if (v6) ((struct sockaddr_in6 *)&sa)->sin6_port = htons((uint16_t)port);
    else ((struct sockaddr_in *)&sa)->sin_port = htons((uint16_t)port);

    MetricsServer *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "metrics server: out of memory");
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    live_metrics_init(&s->m);
    /* One internal thread polls every connection (no thread per client); a client may hold a
     * connection 5 s idle at most and must send its request head within HEADER_MS, CONN_MAX
     * connections in all, 16 KiB of request each (a longer header is answered 431 and closed). */
    unsigned conn_max = CONN_MAX;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 4 < conn_max)
        conn_max = rl.rlim_cur / 4 < 16 ? 16 : (unsigned)(rl.rlim_cur / 4);
    s->pending_max = (int)(conn_max / 4 < PENDING_MAX ? conn_max / 4 : PENDING_MAX);
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | (v6 ? MHD_USE_IPv6 : 0);
    /* The daemon's thread inherits this mask: every signal (Ctrl-C, SIGCHLD) stays with the
     * caller's threads, whose poll() it must interrupt. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    errno = 0;
    s->daemon = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, s,
                                 MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                                 MHD_OPTION_CONNECTION_LIMIT, conn_max,
                                 MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)5,
                                 MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)16384,
                                 MHD_OPTION_END);
    int start_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    errno = start_errno;
    if (!s->daemon) {
        snprintf(err, errlen, "metrics server: cannot listen on %s:%d%s%s", host, port, errno ? ": " : "",
                 errno ? strerror(errno) : "");
        pthread_mutex_destroy(&s->mu);
        free(s);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info && info->port ? info->port : port;
    return s;
}

int metrics_server_port(const MetricsServer *s) { return s ? s->port : 0; }

void metrics_server_publish(MetricsServer *s, const LiveMetrics *m) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->m = *m;
    pthread_mutex_unlock(&s->mu);
}

unsigned long metrics_server_requests(MetricsServer *s) {
    if (!s) return 0;
    pthread_mutex_lock(&s->mu);
    unsigned long n = s->requests;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void metrics_server_stop(MetricsServer *s) {
    if (!s) return;
    MHD_stop_daemon(s->daemon);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
