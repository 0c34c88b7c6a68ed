/* metrics_http.h — the job's live numbers in the Prometheus text exposition format, served at
 * /metrics by an embedded libmicrohttpd daemon (`deadpool run --metrics-port PORT`).
 *
 * The launcher owns a LiveMetrics value, updates it from the metrics and events it drains, and
 * publishes a copy after each drain; the daemon's own thread formats the newest published copy
 * for each request, so a scrape never touches Redis or the launcher's state. The daemon bounds
 * what a client can hold: a connection limit, an idle timeout and a per-connection memory
 * limit, so slow or malformed requests cost a socket for a few seconds and nothing else. */
#ifndef DEADPOOL_METRICS_HTTP_H
#define DEADPOOL_METRICS_HTTP_H

#include <stddef.h>

#define LIVE_KINDS_MAX 8     /* distinct failure kinds counted (crash, hang, network, comm, ...) */
#define LIVE_PHASES 6        /* detect, decide, restore, rebuild, resnapshot, first_step */
#define LIVE_CONN_KINDS 3    /* survivor_max, replacement_max, total */

typedef struct {
    char kind[16];
    double count;
} LiveKindCount;

typedef struct {
    char job[40];
    int workers, spares_configured, steps_target;
    /* From the newest metrics line (NAN until the first step). */
    double step, loss, lr, grad_norm, step_ms, tokens_per_s, epoch, committed_step, snapshot_wait_ms, t;
    double snapshot_wait_ms_total; /* summed over every step reported */
    double steps_reported;         /* metrics lines seen (recomputed steps count again) */
    double spares_available;       /* the spare pool's size (-1: unknown) */
    double eta_s;                  /* -1: not known yet */
    /* From events. */
    LiveKindCount failures[LIVE_KINDS_MAX];   /* `failure` events by kind */
    LiveKindCount recoveries[LIVE_KINDS_MAX]; /* `recovered` events by failure_kind */
    double last_recovery_ms;                  /* total_ms of the newest recovery, NAN if none */
    double last_recovery_phase_ms[LIVE_PHASES];
    /* The newest recovery's data-plane connections (NAN if unknown): made by its busiest
     * survivor, by its busiest replacement, and in all. */
    double last_recovery_connections[LIVE_CONN_KINDS];
    double steps_recomputed_total;
    double snapshot_bytes_copied, snapshot_bytes_replicated, snapshot_generations; /* snapshot_stats */
    int finished;                             /* the job is over (the server is about to stop) */
} LiveMetrics;

extern const char *const LIVE_PHASE_NAMES[LIVE_PHASES];
extern const char *const LIVE_CONN_NAMES[LIVE_CONN_KINDS];

/* Initialises m (every value unknown, nothing counted). */
void live_metrics_init(LiveMetrics *m);
/* Adds one to the counter of `kind` in a LIVE_KINDS_MAX array (the last slot takes overflow). */
void live_kind_add(LiveKindCount *counts, const char *kind);

/* The exposition text of m into buf (NUL-terminated). Its length, or -1 if buf is too small. */
int metrics_format(const LiveMetrics *m, char *buf, size_t len);

typedef struct MetricsServer MetricsServer;

/* Serves /metrics on host:port (host NULL or "" = 127.0.0.1; port 0 = any free port) from a
 * thread of its own. NULL + err if the address cannot be used. */
MetricsServer *metrics_server_start(const char *host, int port, char *err, size_t errlen);
/* The port it listens on. */
int metrics_server_port(const MetricsServer *s);
/* Replaces the values the next scrape reports. */
void metrics_server_publish(MetricsServer *s, const LiveMetrics *m);
/* Requests served (any path), for the log. */
unsigned long metrics_server_requests(MetricsServer *s);
/* Stops the daemon (open connections are closed) and frees s. NULL is fine. */
void metrics_server_stop(MetricsServer *s);

#endif
