/* rt_async.c — deadpool.h's asynchronous collectives: dp_iallreduce, dp_iallgather and
 * dp_ibroadcast queue a request; one thread per process (started with the first request)
 * runs the queue in order on the epoch's communicator, so requests complete in the order they
 * were started, and every rank runs the same collectives in the same order on the same ring:
 * the bits do not depend on timing. A closed epoch aborts the communicator (its watcher), so
 * the request in flight fails at once and every one queued behind it fails without running.
 *
 * Threads: the application's thread starts and waits requests and runs the synchronous
 * collectives, which first wait until the queue is empty (one collective at a time on a
 * communicator); the queue's thread touches only the communicator and the request. Reporting a
 * failure (Redis) stays on the application's thread, in dp_wait. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime_internal.h"

#include "util.h"

typedef enum { RQ_ALLREDUCE, RQ_ALLGATHER, RQ_BROADCAST } rq_kind;

struct dp_request {
    struct dp_request *next; /* the queue, oldest first */
    dp_t *dp;
    rq_kind kind;
    void *buf;
    const void *in;
    size_t n;                /* elements (allreduce, allgather), bytes (broadcast) */
    comm_dtype type;
    comm_op op;
    int root;
    comm_t *comm;            /* the epoch's communicator when started */
    int timeout_ms;
    int done;                /* under aq_mu */
    comm_status st;
    char err[256];
};

static void *queue_main(void *arg) {
    dp_t *dp = arg;
    pthread_mutex_lock(&dp->aq_mu);
    for (;;) {
        while (!dp->aq_head && !dp->aq_stop) pthread_cond_wait(&dp->aq_cv, &dp->aq_mu);
        if (!dp->aq_head) break; /* stopping, nothing queued */
        dp_request *r = dp->aq_head;
        pthread_mutex_unlock(&dp->aq_mu);
        comm_status st;
        if (atomic_load(&dp->abort_step)) st = COMM_ERR_PEER; /* the epoch is closed: nothing more runs */
        else if (r->kind == RQ_ALLREDUCE) st = comm_allreduce(r->comm, r->buf, r->n, r->type, r->op, r->timeout_ms);
        else if (r->kind == RQ_ALLGATHER) {
            /* comm_allgather moves floats: any element type is n * size / 4 of them */
            size_t es = comm_dtype_size(r->type);
            st = (r->n * es) % sizeof(float) ? COMM_ERR_INVALID
                                             : comm_allgather(r->comm, r->in, r->buf, r->n * es / sizeof(float), r->timeout_ms);
        } else st = comm_broadcast(r->comm, r->buf, r->n, r->root, r->timeout_ms);
        pthread_mutex_lock(&dp->aq_mu);
        r->st = st;
        if (st != COMM_OK)
            snprintf(r->err, sizeof r->err, "%s", atomic_load(&dp->abort_step) ? "the epoch was closed" : comm_last_error(r->comm));
        r->done = 1;
        dp->aq_head = r->next;
        if (!dp->aq_head) dp->aq_tail = NULL;
        pthread_cond_broadcast(&dp->aq_done);
    }
    pthread_mutex_unlock(&dp->aq_mu);
    return NULL;
}

/* Queues r (its fields set): DP_OK, or DP_ERR when the thread cannot start (r freed). */
static dp_status enqueue(dp_t *dp, dp_request *r, dp_request **req) {
    r->dp = dp;
    r->comm = dp->comm;
    pthread_mutex_lock(&dp->aq_mu);
    if (!dp->aq_started) {
        if (pthread_create(&dp->aq_thread, NULL, queue_main, dp) != 0) {
            pthread_mutex_unlock(&dp->aq_mu);
            free(r);
            snprintf(dp->err, sizeof dp->err, "the thread of the asynchronous collectives cannot start");
            return DP_ERR;
        }
        dp->aq_started = 1;
    }
    if (dp->aq_tail) dp->aq_tail->next = r;
    else dp->aq_head = r;
    dp->aq_tail = r;
    pthread_cond_signal(&dp->aq_cv);
    pthread_mutex_unlock(&dp->aq_mu);
    *req = r;
    return DP_OK;
}

static dp_request *new_request(dp_t *dp, dp_request **req, const char *what) {
    if (req) *req = NULL;
    if (!req || !dp || !dp->comm) {
        if (dp) snprintf(dp->err, sizeof dp->err, "%s: %s", what, !req ? "no place for the request" : "not a member of an epoch");
        return NULL;
    }
    dp_request *r = calloc(1, sizeof *r);
    if (!r) snprintf(dp->err, sizeof dp->err, "%s: out of memory", what);
    return r;
}

static int type_ok(dp_t *dp, dp_dtype type, const char *what) {
    if (comm_dtype_size((comm_dtype)type) > 0 && (int)type >= 0 && type <= DP_INT64) return 1;
    snprintf(dp->err, sizeof dp->err, "%s: unknown element type %d", what, (int)type);
    return 0;
}

dp_status dp_iallreduce(dp_t *dp, void *buf, size_t n, dp_dtype type, dp_op op, dp_request **req) {
    if (dp && (!type_ok(dp, type, "dp_iallreduce") || (int)op < DP_SUM || op > DP_MIN || (!buf && n))) {
        if (req) *req = NULL;
        if ((int)op < DP_SUM || op > DP_MIN) snprintf(dp->err, sizeof dp->err, "dp_iallreduce: unknown op %d", (int)op);
        else if (!buf && n) snprintf(dp->err, sizeof dp->err, "dp_iallreduce: no buffer for %zu elements", n);
        return DP_ERR;
    }
    dp_request *r = new_request(dp, req, "dp_iallreduce");
    if (!r) return DP_ERR;
    *r = (dp_request){.kind = RQ_ALLREDUCE, .buf = buf, .n = n, .type = (comm_dtype)type, .op = (comm_op)op,
                      .timeout_ms = rt_collective_bound_ms(dp, n * comm_dtype_size((comm_dtype)type))};
    return enqueue(dp, r, req);
}

dp_status dp_iallgather(dp_t *dp, const void *in, void *out, size_t n, dp_dtype type, dp_request **req) {
    if (dp && (!type_ok(dp, type, "dp_iallgather") || ((!in || !out) && n))) {
        if (req) *req = NULL;
        if ((!in || !out) && n) snprintf(dp->err, sizeof dp->err, "dp_iallgather: no buffer for %zu elements", n);
        return DP_ERR;
    }
    if (dp && (n * comm_dtype_size((comm_dtype)type)) % sizeof(float)) {
        if (req) *req = NULL;
        snprintf(dp->err, sizeof dp->err, "dp_iallgather: %zu elements of %zu bytes are not a multiple of 4 bytes", n,
                 comm_dtype_size((comm_dtype)type));
        return DP_ERR;
    }
    dp_request *r = new_request(dp, req, "dp_iallgather");
    if (!r) return DP_ERR;
    size_t bytes = n * comm_dtype_size((comm_dtype)type) * (size_t)dp->cfg.workers;
    *r = (dp_request){.kind = RQ_ALLGATHER, .buf = out, .in = in, .n = n, .type = (comm_dtype)type,
                      .timeout_ms = rt_collective_bound_ms(dp, bytes)};
    return enqueue(dp, r, req);
}

dp_status dp_ibroadcast(dp_t *dp, void *buf, size_t nbytes, int root, dp_request **req) {
    if (dp && ((!buf && nbytes) || root < 0 || root >= dp->cfg.workers)) {
        if (req) *req = NULL;
        snprintf(dp->err, sizeof dp->err, "dp_ibroadcast: expected a buffer and a root in 0..%d, found root %d",
                 dp->cfg.workers - 1, root);
        return DP_ERR;
    }
    dp_request *r = new_request(dp, req, "dp_ibroadcast");
    if (!r) return DP_ERR;
    *r = (dp_request){.kind = RQ_BROADCAST, .buf = buf, .n = nbytes, .root = root,
                      .timeout_ms = rt_collective_bound_ms(dp, nbytes)};
    return enqueue(dp, r, req);
}

int dp_test(const dp_request *req) {
    if (!req) return 1;
    dp_t *dp = req->dp;
    pthread_mutex_lock(&dp->aq_mu);
    int done = req->done;
    pthread_mutex_unlock(&dp->aq_mu);
    return done;
}

dp_status dp_wait(dp_request *req) {
    if (!req) return DP_ERR;
    dp_t *dp = req->dp;
    pthread_mutex_lock(&dp->aq_mu);
    while (!req->done) pthread_cond_wait(&dp->aq_done, &dp->aq_mu);
    pthread_mutex_unlock(&dp->aq_mu);
    comm_status st = req->st;
    char err[sizeof req->err];
    snprintf(err, sizeof err, "%s", req->err);
    int current = req->comm == dp->comm && dp->comm;
    free(req);
    if (st == COMM_OK) return DP_OK;
    if (st == COMM_ERR_INVALID) {
        snprintf(dp->err, sizeof dp->err, "an asynchronous collective was given invalid arguments");
        return DP_ERR;
    }
    /* A request of an epoch already ended failed with it: nothing more to report. */
    if (!current || atomic_load(&dp->abort_step)) return rt_epoch_closed(dp);
    return rt_comm_failed(dp, err);
}

void rt_async_idle(dp_t *dp) {
    if (!dp->aq_started) return;
    pthread_mutex_lock(&dp->aq_mu);
    while (dp->aq_head) pthread_cond_wait(&dp->aq_done, &dp->aq_mu);
    pthread_mutex_unlock(&dp->aq_mu);
}

void rt_async_end_epoch(dp_t *dp) {
    if (!dp->aq_started) return;
    pthread_mutex_lock(&dp->aq_mu);
    int busy = dp->aq_head != NULL;
    pthread_mutex_unlock(&dp->aq_mu);
    /* Whatever is still queued belongs to the epoch that ends: it fails now, not after its bound. */
    if (busy && dp->comm) comm_abort(dp->comm);
    rt_async_idle(dp);
}

void rt_async_stop(dp_t *dp) {
    if (!dp->aq_started) return;
    rt_async_end_epoch(dp);
    pthread_mutex_lock(&dp->aq_mu);
    dp->aq_stop = 1;
    pthread_cond_signal(&dp->aq_cv);
    pthread_mutex_unlock(&dp->aq_mu);
    pthread_join(dp->aq_thread, NULL);
    dp->aq_started = 0;
}
