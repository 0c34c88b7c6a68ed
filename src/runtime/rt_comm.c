/* rt_comm.c — the epoch's collectives and groups: deadpool.h's allreduce, allgather,
 * broadcast and barrier on the epoch's communicator, dp_group_join's communicators among some
 * of its ranks, and their end with the epoch. A failed collective is the step's failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime_internal.h"

#include "util.h"

int rt_epoch_store(dp_t *dp, EpochStore *es, char *err, size_t errlen) {
    ctl_key_full(dp->ctl, es->fence, sizeof es->fence, KEY_FENCED, dp->epoch, 0);
    int port = dp->addr.port;
    snprintf(es->host, sizeof es->host, "%s", dp->addr.host);
    if (ctl_replicated(dp->ctl) && ctl_server(dp->ctl, es->host, sizeof es->host, &port) != 0) {
        snprintf(err, errlen, "no Redis master reachable for the rendezvous: %s", ctl_last_error(dp->ctl));
        return -1;
    }
    es->addr = (comm_store_addr){es->host, port, dp->addr.password[0] ? dp->addr.password : NULL, es->fence, dp->comm_key};
    return 0;
}

/* The bound on a collective that moves `bytes` (per rank). Whoever fails (a crash, a hang,
 * a lost network) is found by the coordinator, which closes the epoch and aborts every
 * collective in flight at once: this bound is only the backstop for a peer stuck with nobody
 * noticing. So it follows the work the collective waits for, not the detection timeout: the
 * peers may be a step's compute apart and more (4 usual steps, the detection timeout on top),
 * and the bytes must move. Until a step has been timed (the first one, a spare's), the start
 * timeout. --comm-timeout-ms, when given, replaces the base. */
int rt_collective_bound_ms(const dp_t *dp, uint64_t bytes) {
    double base = dp->cfg.comm_timeout_ms;
    if (base <= 0) base = dp->step_ewma > 0 ? dp->cfg.detect_timeout_ms + 4 * dp->step_ewma : dp->cfg.start_timeout_ms;
    return bound_for_bytes_ms(base < 3600000 ? (int)base : 3600000, bytes);
}

/* A collective's status on communicator c (the epoch's or one of its groups'). */
static dp_status result_on(dp_t *dp, comm_t *c, comm_status st) {
    if (st == COMM_OK) return DP_OK;
    if (atomic_load(&dp->abort_step)) return rt_epoch_closed(dp);
    return rt_comm_failed(dp, comm_last_error(c));
}

static dp_status comm_result(dp_t *dp, comm_status st) { return result_on(dp, dp->comm, st); }

dp_status dp_allreduce_sum(dp_t *dp, float *buf, size_t n) {
    if (!dp->comm) return DP_ERR;
    rt_async_idle(dp); /* one collective at a time, in the order started */
    return comm_result(dp, comm_allreduce_sum(dp->comm, buf, n, rt_collective_bound_ms(dp, n * sizeof *buf)));
}

dp_status dp_allreduce_mean(dp_t *dp, float *buf, size_t n) {
    if (!dp->comm) return DP_ERR;
    rt_async_idle(dp); /* one collective at a time, in the order started */
    return comm_result(dp, comm_allreduce_mean(dp->comm, buf, n, rt_collective_bound_ms(dp, n * sizeof *buf)));
}

dp_status dp_allgather(dp_t *dp, const float *in, float *out, size_t n) {
    if (!dp->comm) return DP_ERR;
    rt_async_idle(dp); /* one collective at a time, in the order started */
    return comm_result(dp, comm_allgather(dp->comm, in, out, n, rt_collective_bound_ms(dp, n * sizeof *in * (size_t)dp->cfg.workers)));
}

dp_status dp_broadcast(dp_t *dp, void *buf, size_t nbytes, int root) {
    if (!dp->comm) return DP_ERR;
    rt_async_idle(dp); /* one collective at a time, in the order started */
    return comm_result(dp, comm_broadcast(dp->comm, buf, nbytes, root, rt_collective_bound_ms(dp, nbytes)));
}

dp_status dp_barrier(dp_t *dp) {
    if (!dp->comm) return DP_ERR;
    rt_async_idle(dp); /* one collective at a time, in the order started */
    return comm_result(dp, comm_barrier(dp->comm, rt_collective_bound_ms(dp, 0)));
}

/* --- groups --------------------------------------------------------------------------- */

struct dp_group {
    dp_t *dp;
    comm_t *comm;
    int index, size;
    struct dp_group *next;
};

/* Groups first: each is a child of the epoch's communicator (comm_create_group). */
void rt_end_epoch_comms(dp_t *dp) {
    rt_async_end_epoch(dp);
    while (dp->groups) {
        struct dp_group *g = dp->groups;
        dp->groups = g->next;
        comm_destroy(g->comm);
        free(g);
    }
    comm_destroy(dp->comm);
    dp->comm = NULL;
}

dp_group *dp_group_join(dp_t *dp, const char *name, int index, int size, char *err, size_t errlen) {
    if (!dp->comm) { snprintf(err, errlen, "dp_group_join: not a member of an epoch"); return NULL; }
    size_t nlen = name ? strlen(name) : 0;
    for (size_t i = 0; i < nlen; i++)
        if (!name_char((unsigned char)name[i]) && name[i] != '.') nlen = 0;
    if (nlen == 0 || nlen > 64 || size < 1 || size > dp->cfg.workers || index < 0 || index >= size) {
        snprintf(err, errlen, "dp_group_join: expected a name of 1..64 letters, digits, '_', '-' or '.' and 0 <= index < "
                 "size <= %d, found '%s' index %d size %d", dp->cfg.workers, name ? name : "(null)", index, size);
        return NULL;
    }
    char prefix[256];
    ctl_key_full(dp->ctl, prefix, sizeof prefix, KEY_GLOO, dp->epoch, 0);
    size_t pl = strlen(prefix);
    snprintf(prefix + pl, sizeof prefix - pl, "/g/%s", name);
    EpochStore es;
    if (rt_epoch_store(dp, &es, err, errlen) != 0) return NULL;
    struct dp_group *g = calloc(1, sizeof *g);
    if (!g) { snprintf(err, errlen, "out of memory"); return NULL; }
    int timeout = 2 * dp->cfg.detect_timeout_ms + 3000; /* as the epoch's own rendezvous */
    g->comm = comm_create_group(dp->comm, &es.addr, prefix, index, size, dp->bind_host, timeout, err, errlen);
    if (g->comm && comm_barrier(g->comm, timeout) != COMM_OK) {
        snprintf(err, errlen, "group %s: the first barrier failed: %s", name, comm_last_error(g->comm));
        comm_destroy(g->comm);
        g->comm = NULL;
    }
    if (!g->comm) { free(g); return NULL; }
    *g = (struct dp_group){dp, g->comm, index, size, dp->groups};
    dp->groups = g;
    return g;
}

int dp_group_index(const dp_group *g) { return g->index; }
int dp_group_size(const dp_group *g) { return g->size; }

static dp_status group_result(dp_group *g, comm_status st) { return result_on(g->dp, g->comm, st); }

dp_status dp_group_allreduce_sum(dp_group *g, float *buf, size_t n) {
    return group_result(g, comm_allreduce_sum(g->comm, buf, n, rt_collective_bound_ms(g->dp, n * sizeof *buf)));
}

dp_status dp_group_allreduce_mean(dp_group *g, float *buf, size_t n) {
    return group_result(g, comm_allreduce_mean(g->comm, buf, n, rt_collective_bound_ms(g->dp, n * sizeof *buf)));
}

dp_status dp_group_allgather(dp_group *g, const float *in, float *out, size_t n) {
    return group_result(g, comm_allgather(g->comm, in, out, n, rt_collective_bound_ms(g->dp, n * sizeof *in * (size_t)g->size)));
}

dp_status dp_group_send(dp_group *g, const void *buf, size_t nbytes, int dst, uint32_t tag) {
    return group_result(g, comm_send(g->comm, buf, nbytes, dst, tag));
}

dp_status dp_group_recv(dp_group *g, void *buf, size_t nbytes, int src, uint32_t tag) {
    return group_result(g, comm_recv(g->comm, buf, nbytes, src, tag, rt_collective_bound_ms(g->dp, nbytes)));
}

dp_status dp_group_wait_sends(dp_group *g) {
    return group_result(g, comm_wait_sends(g->comm, rt_collective_bound_ms(g->dp, 0)));
}
