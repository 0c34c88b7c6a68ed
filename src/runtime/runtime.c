/* runtime.c — deadpool.h: one process's life in a job. Registration, role, heartbeat and
 * abort-watch threads; membership of an epoch (collectives, snapshots of the application's
 * regions, replica placement, persistence); and what happens when a peer fails — wait for the
 * coordinator's decision, restore the rollback generation, rebuild, go on — or, as a spare,
 * waiting warm until a decision hands it a failed rank. It knows nothing of the application:
 * state is regions and callbacks. */
#include "deadpool.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "comm.h"
#include "comm_auth.h"
#include "config.h"
#include "control.h"
#include "events.h"
#include "generation.h"
#include "inject.h"
#include "lifecycle.h"
#include "netns.h"
#include "protocol.h"
#include "recovery.h"
#include "replica.h"
#include "rng.h"
#include "runtime.h"
#include "snapshot.h"
#include "util.h"

struct dp {
    /* the process */
    redis_addr addr;
    char job[64];
    JobConfig cfg;
    char cfg_text[JOB_CONFIG_TEXT_MAX];
    int64_t t0_wall_ms;
    long proc_id;
    ctl_t *ctl;
    char bind_host[256];
    char node[128];           /* the machine this process runs on (node_id_default) */
    char resume_dir[4200];
    ReplicaServer *replicas; /* holds other ranks' snapshots; every process runs one */
    unsigned char comm_key[COMM_KEY_BYTES]; /* the data plane's key (comm_key_derive), from the job's secret */
    FaultSpec faults[INJECT_MAX];
    int nfaults;
    pthread_t hb_thread, abort_thread;
    atomic_int hb_stop;
    atomic_int job_over;      /* the launcher set the job's state to stopping/done/failed */
    atomic_int abort_step;    /* the coordinator closed our epoch: abandon the step in flight */
    atomic_int control_lost;  /* a failure waited --control-wait for an unreachable redis: persist and stop */
    atomic_long cur_epoch;
    /* The control plane's outages (issue 27, item 11): training needs Redis only to handle a
     * failure, so while it is away nothing on the training path waits for it. */
    atomic_int ctl_down;      /* a call found Redis unreachable; cleared once everything is republished */
    atomic_int down_logged;   /* ...and the heartbeat thread confirmed it (said so in the log) */
    _Atomic double down_since; /* when (now_ms) */
    pthread_mutex_t pub_mu;   /* what this process republishes when Redis is back, and the metrics queue */
    long long pub_epoch, pub_step; /* newest local commit (epoch, step; -1 none) and its rank */
    int pub_rank;
    atomic_int in_pool;       /* a spare in the spare pool */
    char reg_replica[300], reg_host[256], reg_pid[32]; /* the registration's facts */
    char *mq[8192];           /* metrics lines waiting for Redis (rank 0), oldest first: a minute of short steps */
    int mq_n, mq_dropped, mq_flushing;
    _Atomic double step_ewma; /* a step's usual time, ms (main thread): the training path's Redis bound */
    pthread_cond_t pub_cv;    /* wakes the heartbeat thread: something waits to be republished */
    int own_pending;          /* KEY_OWN_STATE not written yet (Redis was away at the commit) */
    size_t gen_bytes_pending; /* ...KEY_GEN_BYTES likewise (0: none) */
    char err[1024];           /* dp_last_error */
    /* membership */
    dp_callbacks cb;
    lc_state lc;              /* where the process is in its life (lifecycle.h); changed by lc_feed only */
    dp_role role;             /* dp_get_role: set by the lifecycle's transitions */
    int joined;               /* dp_join succeeded once (history, not the state: a process back in
                               * RETRYING may or may not have been a member; dp_finish asks) */
    int rank;
    long epoch;
    int64_t next_step;
    comm_t *comm;
    struct dp_group *groups;  /* the epoch's groups (dp_group_join), ended with the epoch */
    Snapshot *snap;
    Snapshot *restore_src;    /* a previous epoch's snapshots, kept until the next epoch commits */
    void *warm_buf;           /* a spare's buffer for the state it will restore, pages faulted in */
    size_t warm_cap;
    int warm_wanted;          /* the spare restores into warm_buf (not into its declared blocks) */
    pthread_t warm_thread;    /* grows it in the background (warm_grow_check) */
    int warm_growing;
    atomic_int warm_grown;
    void *warm_next;          /* ...into this buffer of warm_next_cap bytes */
    size_t warm_next_cap;
    size_t restore_cold;      /* bytes this recovery received into memory not faulted in before */
    size_t gen_bytes_published; /* KEY_GEN_BYTES of this rank, as this process set it */
    ctl_t *snap_ctl;          /* the snapshot threads' own connection (on_commit) */
    pthread_mutex_t snap_ctl_mu; /* ...shared by the current epoch's thread and a finishing one */
    int persist_answered;     /* the no-spare persist request of this epoch was answered */
    int64_t cur_step;
    double step_t0;           /* when the step in flight started (end of the previous commit) */
    double snapshot_wait_ms;  /* the step in flight waited this long for the previous generation */
    long long last_disk_step; /* --ft disk: newest checkpoint, steps completed */
    /* capture staging: head + table + extra of the generation in flight, and its regions */
    unsigned char *head;
    size_t head_cap;
    dp_region app_regions[GEN_MAX_REGIONS];
    SnapRegion snap_regions[GEN_MAX_REGIONS + 1];
    /* ...and its local part (snapshot.h): on ranks other than 0 the DP_IDENTICAL regions
     * behind a head of their own, kept in this rank's snapshots but not replicated */
    unsigned char *local_head;
    size_t local_head_cap;
    SnapRegion snap_locals[GEN_MAX_REGIONS + 1];
    int nlocals;
    int own_published;        /* KEY_OWN_STATE is set for this rank (by this process) */
    /* state DeadPool owns (dp_state_declare): two blocks, one per generation parity, each
     * [head area | region 0 | region 1 | ...], so that a generation is one contiguous payload */
    dp_state_spec state[GEN_MAX_REGIONS];
    size_t state_off[GEN_MAX_REGIONS]; /* of each region within a block, after the head area */
    int nstate;
    int spread_block;         /* dp_replica_spread: prefer holders outside our block of ranks */
    unsigned char *block[2];
    size_t head_area, block_bytes;
    void *restored_extra;     /* the extra state of the generation restored last */
    size_t restored_extra_len;
    int restored_identical;   /* ...and whether it carried the DP_IDENTICAL regions */
    Decision decision;        /* the one being followed (large: not on the stack) */
};

/* --- small helpers ------------------------------------------------------------------- */

/* dp_init's last failure was the control plane's absence, not a bad job (item 12): the
 * process exits as failed (DP_EXIT_FAILED), and the job replaces it, instead of tearing down. */
static atomic_int init_transient;

/* While starting: a Redis call on c failed; 1 when it was the server's absence and the bound
 * (deadline, now_ms) is not reached, after a pause: try again. */
static int retry_transient(const ctl_t *c, double deadline) {
    if (!ctl_error_transient(c) || now_ms() > deadline) {
        if (ctl_error_transient(c)) atomic_store(&init_transient, 1);
        return 0;
    }
    sleep_ms(200);
    return 1;
}

static void end_epoch_comms(dp_t *dp);
static void persist_without_control(dp_t *dp);

static void emit_error(dp_t *dp, const char *what, const char *err) {
    char esc[2048];
    log_msg("%s%s", what, err);
    json_escape(err, esc, sizeof esc);
    event_emit(dp->ctl, dp->t0_wall_ms, "error", "\"rank\":%d,\"message\":\"%s\"", dp->rank, esc);
}

static const char *key(char *buf, size_t len, ctl_key k, long long a, long long b) {
    return ctl_key_suffix(buf, len, k, a, b);
}

const char *dp_last_error(const dp_t *dp) { return dp->err; }
const char *dp_version(void) { return DEADPOOL_VERSION; }

const char *dp_status_str(dp_status st) {
    switch (st) {
    case DP_OK: return "ok";
    case DP_ERR: return "error";
    case DP_FAILED: return "failed";
    case DP_STOPPED: return "stopped";
    case DP_FENCED: return "fenced";
    }
    return "unknown";
}
dp_role dp_get_role(const dp_t *dp) { return dp->role; }
int dp_rank(const dp_t *dp) { return dp->rank; }
int dp_world(const dp_t *dp) { return dp->cfg.workers; }
int64_t dp_next_step(const dp_t *dp) { return dp->next_step; }
int64_t dp_steps(const dp_t *dp) { return dp->cfg.steps; }
uint64_t dp_seed(const dp_t *dp) { return dp->cfg.seed; }
const char *dp_out_dir(const dp_t *dp) { return dp->cfg.out; }
const char *dp_resume_dir(const dp_t *dp) { return dp->resume_dir[0] ? dp->resume_dir : NULL; }
long dp_epoch(const dp_t *dp) { return dp->epoch; }
int dp_aborted(const dp_t *dp) { return atomic_load(&((dp_t *)dp)->abort_step) != 0; }

int dp_store_prefix(const dp_t *dp, char *out, size_t len) {
    if (!dp->ctl) return -1;
    ctl_key_full(dp->ctl, out, len, KEY_APP, dp->epoch, 0);
    return 0;
}

void dp_log(const dp_t *dp, const char *fmt, ...) {
    (void)dp;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_msg("%s", msg);
}

static void set_role_log(dp_t *dp) {
    char role[32];
    if (dp->rank >= 0) snprintf(role, sizeof role, "rank %d", dp->rank);
    else snprintf(role, sizeof role, "spare");
    log_set_role(role);
}

/* Every change of the process's lifecycle state goes through here (lifecycle.h): the new
 * state, and the actions the caller carries out. An input the state does not accept is a bug:
 * it is logged, the state is kept and nothing is to be done. */
static lc_actions lc_feed(dp_t *dp, lc_input in) {
    lc_actions a;
    lc_state next = lc_step(dp->lc, in, &a);
    if (next == LC_INVALID) {
        log_msg("lifecycle: state %s does not accept %s (state kept)", lc_state_name(dp->lc), lc_input_name(in));
        return a;
    }
    dp->lc = next;
    if (a.role >= 0) dp->role = (dp_role)a.role;
    return a;
}

/* --- the control plane's outages (issue 27, item 11) ------------------------------------
 * Training needs Redis only to handle a failure. A call that finds it unreachable (its
 * server's absence: ctl_error_transient) marks the control plane down; from then on nothing on
 * the training path asks it (the fence check, rank 0's metrics line, the snapshot thread's
 * commit record), so a stall, a restart or a failover costs the step in flight at most the
 * path's bound, about one step. The heartbeat thread keeps trying; once it reaches Redis it
 * republishes whatever this process owns there (republish: Redis may have come back empty,
 * or as a replica that missed the last writes) and only then clears the mark. A failure
 * meanwhile waits --control-wait for it (wait_for_decision), then the process persists what
 * it committed and stops. */

/* confirmed: the heartbeat thread's own beat failed (logged); else a call on the training path
 * did not answer within its bound, which may be a blip of a busy machine: the heartbeat thread
 * is woken to find out at once, and a blip is over (and republished) within a round trip. */
static void control_down(dp_t *dp, const ctl_t *c, int confirmed) {
    if (!atomic_exchange(&dp->ctl_down, 1)) {
        atomic_store(&dp->down_since, now_ms());
        /* The heartbeat thread tries at once: what was not written (a commit record above all)
         * is written the moment Redis answers again, not a heartbeat period later. */
        pthread_mutex_lock(&dp->pub_mu);
        pthread_cond_broadcast(&dp->pub_cv);
        pthread_mutex_unlock(&dp->pub_mu);
    }
    if (confirmed && !atomic_exchange(&dp->down_logged, 1))
        log_msg("the control plane (redis) is unreachable (%s): training goes on; a failure now waits up to %d s for it",
                ctl_last_error(c), dp->cfg.control_wait);
}

/* After a failed call on c: was it the server's absence? */
static void note_failure(dp_t *dp, const ctl_t *c) {
    if (ctl_error_transient(c)) control_down(dp, c, 0);
}

/* The bound on a Redis call on the training path: a third of a step (the step that meets an
 * outage may pay it on each of the fence check, the commit record and, across ranks, a
 * collective's partner: about one step in all), 5 ms at least, a quarter of the detect timeout
 * at most (before the first step, that quarter). */
static int path_timeout_ms(const dp_t *dp) {
    int cap = dp->cfg.detect_timeout_ms / 4 > 5 ? dp->cfg.detect_timeout_ms / 4 : 5;
    int t = dp->step_ewma > 0 ? (int)(dp->step_ewma / 3) : cap;
    return t < 5 ? 5 : t > cap ? cap : t;
}

/* Metrics lines that could not be pushed wait here, in order (the oldest are dropped past 8192). */
static void mq_push(dp_t *dp, const char *json) {
    pthread_mutex_lock(&dp->pub_mu);
    int cap = (int)(sizeof dp->mq / sizeof dp->mq[0]);
    if (dp->mq_n == cap) {
        free(dp->mq[0]);
        memmove(dp->mq, dp->mq + 1, sizeof dp->mq[0] * (size_t)(cap - 1));
        dp->mq_n--;
        dp->mq_dropped++;
    }
    char *copy = strdup(json);
    if (copy) dp->mq[dp->mq_n++] = copy;
    pthread_mutex_unlock(&dp->pub_mu);
}

/* Sends queued lines in order on c, at most 256 a call (the heartbeat thread sends the rest at
 * its next beats: its heartbeat must not wait for a long backlog). 0 unless Redis failed. */
static int mq_flush(dp_t *dp, ctl_t *c) {
    for (int sent = 0;; sent++) {
        if (sent == 256) {
            pthread_mutex_lock(&dp->pub_mu);
            dp->mq_flushing = 0;
            pthread_mutex_unlock(&dp->pub_mu);
            return 0;
        }
        pthread_mutex_lock(&dp->pub_mu);
        if (dp->mq_n == 0) {
            dp->mq_flushing = 0;
            pthread_mutex_unlock(&dp->pub_mu);
            return 0;
        }
        dp->mq_flushing = 1; /* rank 0 queues behind us meanwhile: the lines stay in order */
        const char *json = dp->mq[0];
        pthread_mutex_unlock(&dp->pub_mu);
        int ok = ctl_push_metric(c, json) == 0;
        pthread_mutex_lock(&dp->pub_mu);
        if (ok) {
            free(dp->mq[0]);
            memmove(dp->mq, dp->mq + 1, sizeof dp->mq[0] * (size_t)(dp->mq_n - 1));
            dp->mq_n--;
        } else {
            dp->mq_flushing = 0;
        }
        pthread_mutex_unlock(&dp->pub_mu);
        if (!ok) return -1;
    }
}

/* Everything this process owns in Redis, written again: its registration, its rank (while
 * Redis has no newer epoch than ours: a replaced process must not claim its old rank back),
 * its newest commit record and what it published about its state, its place in the spare
 * pool, the newest generation it holds of every other rank (`held`: what a rank that died
 * meanwhile can be restored from, its own commit records may never have arrived), and the
 * metrics lines that waited. 0 when all of it reached Redis. */
static int republish(dp_t *dp, ctl_t *c) {
    int bad = 0;
    long cur = atomic_load(&dp->cur_epoch), e = ctl_epoch(c);
    if (e < 0) return -1;
    if (dp->reg_replica[0])
        bad |= ctl_proc_set(c, dp->proc_id, "replica", dp->reg_replica) | ctl_proc_set(c, dp->proc_id, "host", dp->reg_host) |
               ctl_proc_set(c, dp->proc_id, "node", dp->node) | ctl_proc_set(c, dp->proc_id, "pid", dp->reg_pid);
    pthread_mutex_lock(&dp->pub_mu);
    long long pe = dp->pub_epoch, ps = dp->pub_step;
    int rank = dp->pub_rank;
    pthread_mutex_unlock(&dp->pub_mu);
    char k[48];
    if (rank >= 0 && e <= cur) {
        bad |= ctl_set_rank_owner(c, rank, dp->proc_id);
        if (pe == cur && ps >= 0) bad |= ctl_committed_set(c, pe, rank, ps);
        if (dp->own_published || dp->own_pending) bad |= ctl_set(c, key(k, sizeof k, KEY_OWN_STATE, rank, 0), "1");
        pthread_mutex_lock(&dp->pub_mu);
        size_t gb = dp->gen_bytes_pending > dp->gen_bytes_published ? dp->gen_bytes_pending : dp->gen_bytes_published;
        pthread_mutex_unlock(&dp->pub_mu);
        char bytes[32];
        proto_int_format((long long)gb, bytes, sizeof bytes);
        if (gb) bad |= ctl_set(c, key(k, sizeof k, KEY_GEN_BYTES, rank, 0), bytes);
    }
    if (atomic_load(&dp->in_pool)) bad |= ctl_spare_add(c, dp->proc_id);
    size_t cap = HELD_TEXT_MAX(dp->cfg.workers);
    char *held = malloc(cap);
    HeldGen *hg = malloc(sizeof *hg * (size_t)dp->cfg.workers);
    if (held && hg) {
        int n = 0;
        for (int r = 0; r < dp->cfg.workers; r++) {
            int64_t st, ep;
            if (r != rank && replica_server_newest(dp->replicas, r, &st, &ep) == 0) hg[n++] = (HeldGen){r, st, ep};
        }
        bad |= held_format(hg, n, held, cap) != 0 ? -1 : ctl_proc_set(c, dp->proc_id, "held", held);
    }
    free(held);
    free(hg);
    bad |= mq_flush(dp, c);
    if (!bad) ctl_wait_replica(c, 1000);
    return bad ? -1 : 0;
}

/* --- threads: heartbeat, abort watch ------------------------------------------------- */

/* Waits on the process's "abort" list; a value e+1 with e >= our epoch raises abort_step. */
static void *abort_watch_loop(void *arg) {
    dp_t *dp = arg;
    pthread_setname_np(pthread_self(), "dp-abort");
    char err[256];
    ctl_t *c = ctl_connect(&dp->addr, dp->job, 2000, err, sizeof err);
    if (!c) { log_msg("abort watcher: %s", err); return NULL; }
    while (!atomic_load(&dp->hb_stop)) {
        long v = ctl_wait_notice(c, dp->proc_id, KEY_ABORT, 200);
        if (v < 0) sleep_ms(100);
        else if (v > 0 && v - 1 >= atomic_load(&dp->cur_epoch)) atomic_store(&dp->abort_step, 1);
    }
    ctl_close(c);
    return NULL;
}

static void *heartbeat_loop(void *arg) {
    dp_t *dp = arg;
    pthread_setname_np(pthread_self(), "dp-heartbeat");
    char err[256];
    ctl_t *c = ctl_connect(&dp->addr, dp->job, 2000, err, sizeof err);
    if (!c) { log_msg("heartbeat: %s", err); return NULL; }
    int period = dp->cfg.detect_timeout_ms / 4;
    /* The beat keeps its generous timeout (2 s): a slow Redis still gets the heartbeat, and a
     * stalled one answers the beat waiting in its socket the moment it runs again. */
    while (!atomic_load(&dp->hb_stop)) {
        int ok = ctl_heartbeat(c, dp->proc_id, dp->cfg.detect_timeout_ms) == 0;
        if (!ok) control_down(dp, c, 1); /* not answering our heartbeat, whatever the reason */
        if (ok && atomic_load(&dp->ctl_down)) {
            if (republish(dp, c) == 0) {
                if (atomic_exchange(&dp->down_logged, 0))
                    log_msg("the control plane is back after %.1f s: this process's keys are republished",
                            (now_ms() - atomic_load(&dp->down_since)) / 1e3);
                atomic_store(&dp->ctl_down, 0);
            }
        } else if (ok) {
            mq_flush(dp, c); /* lines a failed push left behind */
        }
        char state[32];
        if (ok && ctl_state_get(c, state, sizeof state) == 0 && strcmp(state, "running") != 0)
            atomic_store(&dp->job_over, 1);
        /* The next beat after a period, or at once when a call elsewhere found Redis away. */
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        long long ns = until.tv_nsec + (long long)(period > 0 ? period : 1) * 1000000LL;
        until.tv_sec += (time_t)(ns / 1000000000LL);
        until.tv_nsec = (long)(ns % 1000000000LL);
        pthread_mutex_lock(&dp->pub_mu);
        if (!atomic_load(&dp->hb_stop)) pthread_cond_timedwait(&dp->pub_cv, &dp->pub_mu, &until);
        pthread_mutex_unlock(&dp->pub_mu);
    }
    ctl_close(c);
    return NULL;
}

/* --- joining the job ----------------------------------------------------------------- */

static int read_job(dp_t *dp, char *err, size_t errlen) {
    if (ctl_config_get(dp->ctl, "config", dp->cfg_text, sizeof dp->cfg_text) != 0) {
        snprintf(err, errlen, "job '%s' not found in redis (no config): %s", dp->job, ctl_last_error(dp->ctl));
        return -1;
    }
    if (ctl_launcher_alive(dp->ctl) == 0) { /* its keys outlived a launcher killed with -9 */
        snprintf(err, errlen, "job '%s' has no launcher running (its launcher key expired): it ended or its launcher "
                 "died; start it again (deadpool run ... --resume OUT)", dp->job);
        return -1;
    }
    if (job_config_parse_lines(&dp->cfg, dp->cfg_text, err, errlen) != 0) return -1;
    /* Each machine of a multi-node job writes into its own --out. */
    const char *out = getenv(DP_ENV_OUT), *resume = getenv(DP_ENV_RESUME);
    if (out && *out) snprintf(dp->cfg.out, sizeof dp->cfg.out, "%s", out);
    if (resume && *resume) snprintf(dp->cfg.resume, sizeof dp->cfg.resume, "%s", resume);
    char t0[32];
    if (ctl_config_get(dp->ctl, "t0_ms", t0, sizeof t0) != 0) { snprintf(err, errlen, "job has no start time"); return -1; }
    long long t0v;
    if (proto_int_parse(t0, "config t0_ms", 0, LLONG_MAX, &t0v, err, errlen) != 0) return -1;
    dp->t0_wall_ms = t0v;
    dp->nfaults = inject_parse(dp->cfg.inject, dp->cfg.workers, dp->faults, INJECT_MAX, err, errlen);
    if (dp->nfaults < 0) return -1;
    if (dp->cfg.resume_step >= 0) {
        char d[4200];
        checkpoint_path(d, sizeof d, dp->cfg.resume, dp->cfg.resume_step, "");
        d[strlen(d) - 1] = 0; /* the directory, without the trailing '/' */
        snprintf(dp->resume_dir, sizeof dp->resume_dir, "%s", d);
    }
    return 0;
}

/* Claims rank r for us: 1 claimed, 0 taken, -1 Redis failed (a transient error is retried
 * within --control-wait; a claim whose answer was lost finds its own proc id there). */
static int claim_one(dp_t *dp, int r) {
    for (double deadline = now_ms() + job_control_outage_ms(&dp->cfg);;) {
        int got = ctl_claim_rank(dp->ctl, r, dp->proc_id);
        if (got == 0 && ctl_rank_owner(dp->ctl, r) == dp->proc_id) return 1;
        if (got >= 0) return got;
        if (!retry_transient(dp->ctl, deadline)) return -1;
    }
}

/* Claims the requested rank, or the first free one. Returns the rank, -1 if none is free,
 * -2 when Redis failed. */
static int claim_rank(dp_t *dp, int wanted) {
    if (wanted >= 0) {
        int got = claim_one(dp, wanted);
        return got == 1 ? wanted : got < 0 ? -2 : -1;
    }
    for (int r = 0; r < dp->cfg.workers; r++) {
        int got = claim_one(dp, r);
        if (got == 1) return r;
        if (got < 0) return -2;
    }
    return -1;
}

/* Every process holds replicas: start the server and tell the job where it is. The replica
 * channel's key is derived from the job's secret, which only the job's Redis holds (the
 * launcher drew it); it is never logged, and the server keeps the only copy of the key. The
 * data plane's key (comm_key_derive, independent of the replica key) is kept for comm_create. */
static int start_replica_server(dp_t *dp, char *err, size_t errlen) {
    char secret[REPLICA_SECRET_HEX_LEN + 2];
    unsigned char key[REPLICA_KEY_BYTES];
    int got;
    for (double deadline = now_ms() + job_control_outage_ms(&dp->cfg);;)
        if ((got = ctl_config_get(dp->ctl, "secret", secret, sizeof secret)) == 0 || !retry_transient(dp->ctl, deadline)) break;
    int keyed = got == 0 && replica_key_derive(secret, key) == 0 && comm_key_derive(secret, dp->comm_key) == 0;
    explicit_bzero(secret, sizeof secret);
    if (!keyed && got != 0 && ctl_error_transient(dp->ctl)) {
        snprintf(err, errlen, "reading the job's secret: %s", ctl_last_error(dp->ctl));
        return -1;
    }
    if (!keyed) {
        snprintf(err, errlen, "job '%s' has no valid replica channel secret in redis (published by an older "
                 "deadpool?)", dp->job);
        return -1;
    }
    dp->replicas = replica_server_start(dp->bind_host, 0, dp->job, dp->cfg.workers, dp->proc_id, key, err, errlen);
    explicit_bzero(key, sizeof key);
    if (!dp->replicas) return -1;
    char *addr = dp->reg_replica, *host = dp->reg_host, *pid = dp->reg_pid;
    Endpoint me = {.port = replica_server_port(dp->replicas)};
    snprintf(me.host, sizeof me.host, "%s", dp->bind_host);
    if (endpoint_format(&me, addr, sizeof dp->reg_replica) != 0 || proto_int_format(getpid(), pid, sizeof dp->reg_pid) != 0) {
        snprintf(err, errlen, "the replica server's address '%s' port %d is not a valid endpoint", me.host, me.port);
        return -1;
    }
    gethostname(host, sizeof dp->reg_host - 1);
    for (double deadline = now_ms() + job_control_outage_ms(&dp->cfg);;) { /* a transient error is retried */
        if (ctl_proc_set(dp->ctl, dp->proc_id, "replica", addr) == 0 && ctl_proc_set(dp->ctl, dp->proc_id, "host", host) == 0 &&
            ctl_proc_set(dp->ctl, dp->proc_id, "node", dp->node) == 0 && ctl_proc_set(dp->ctl, dp->proc_id, "pid", pid) == 0)
            return 0;
        if (!ctl_error_transient(dp->ctl) || now_ms() > deadline) break;
        sleep_ms(200);
    }
    snprintf(err, errlen, "registering the replica server failed: %s", ctl_last_error(dp->ctl));
    init_transient = ctl_error_transient(dp->ctl);
    return -1;
}

int node_id_default(char *buf, size_t len) {
    char host[256] = "", boot[64] = "";
    gethostname(host, sizeof host - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    int ok = f && fgets(boot, sizeof boot, f) != NULL;
    if (f) fclose(f);
    boot[strcspn(boot, "\n")] = 0;
    snprintf(buf, len, "%.100s-%.12s", host[0] ? host : "host", boot);
    node_id_clean(buf);
    return ok && boot[0] ? 0 : -1;
}

void node_id_clean(char *id) {
    for (char *p = id; *p; p++)
        if (!name_char((unsigned char)*p)) *p = '_';
}

static void options_from_env(dp_options *o) {
    const char *rank = getenv(DP_ENV_RANK), *spare = getenv(DP_ENV_SPARE);
    if (!o->redis_url) o->redis_url = getenv(DP_ENV_REDIS);
    if (!o->job) o->job = getenv(DP_ENV_JOB);
    if (!o->bind_host) o->bind_host = getenv(DP_ENV_BIND);
    if (!o->spare && spare && !strcmp(spare, "1")) o->spare = 1;
    if (o->rank < 0 && rank && *rank) o->rank = atoi(rank);
}

static void free_process(dp_t *dp) {
    if (dp->hb_thread) {
        atomic_store(&dp->hb_stop, 1);
        pthread_mutex_lock(&dp->pub_mu);
        pthread_cond_broadcast(&dp->pub_cv);
        pthread_mutex_unlock(&dp->pub_mu);
        pthread_join(dp->hb_thread, NULL);
        if (dp->abort_thread) pthread_join(dp->abort_thread, NULL);
    }
    replica_server_stop(dp->replicas);
    /* A spare gone on purpose says so now rather than let its heartbeat expire (a janitor need
     * not wait for it). Not a member: its silence before the launcher has seen its exit could
     * read as a failure. Skipped when the control plane is lost. */
    if (dp->ctl && dp->proc_id > 0 && dp->rank < 0 && !atomic_load(&dp->control_lost))
        ctl_heartbeat_clear(dp->ctl, dp->proc_id);
    if (dp->ctl) ctl_close(dp->ctl);
    for (int i = 0; i < dp->mq_n; i++) free(dp->mq[i]);
    free(dp->head);
    free(dp->local_head);
    free(dp->warm_buf);
    free(dp->block[0]);
    free(dp->block[1]);
    free(dp->restored_extra);
    explicit_bzero(dp->comm_key, sizeof dp->comm_key);
    free(dp);
}

dp_t *dp_init(const dp_options *opts, char *err, size_t errlen) {
    struct sigaction pipe_was;
    if (sigaction(SIGPIPE, NULL, &pipe_was) == 0 && pipe_was.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
    dp_options o = {.rank = -1};
    if (opts) o = *opts;
    options_from_env(&o);
    if (!o.redis_url || !o.job) {
        snprintf(err, errlen, "no job to join: expected %s and %s in the environment (start the program with `deadpool "
                 "run -- PROGRAM`) or in dp_options", DP_ENV_REDIS, DP_ENV_JOB);
        return NULL;
    }
    dp_t *dp = calloc(1, sizeof *dp);
    if (!dp) { snprintf(err, errlen, "out of memory"); return NULL; }
    dp->rank = -1;
    dp->pub_rank = -1;
    dp->pub_epoch = dp->pub_step = -1;
    pthread_mutex_init(&dp->snap_ctl_mu, NULL);
    pthread_mutex_init(&dp->pub_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&dp->pub_cv, &ca);
    pthread_condattr_destroy(&ca);
    snprintf(dp->job, sizeof dp->job, "%s", o.job);
    snprintf(dp->bind_host, sizeof dp->bind_host, "%s", o.bind_host && *o.bind_host ? o.bind_host : "127.0.0.1");
    const char *node = getenv(DP_ENV_NODE), *proc = getenv(DP_ENV_PROC);
    if (node && *node) {
        snprintf(dp->node, sizeof dp->node, "%s", node);
        node_id_clean(dp->node);
    } else {
        node_id_default(dp->node, sizeof dp->node);
    }
    log_set_role(o.spare ? "spare" : "rank");
    if (redis_addr_parse(o.redis_url, &dp->addr, err, errlen) != 0) goto fail;
    /* Every Redis call of the start is retried while it fails for the server's absence (a
     * restart, a stall, a failover), within --control-wait (60 s until the job's own is read):
     * such an error says nothing about the job, and a bad job stops it (item 12). */
    double deadline = now_ms() + job_control_outage_ms(&dp->cfg);
    while (!(dp->ctl = ctl_connect(&dp->addr, dp->job, 5000, err, errlen))) {
        if (!ctl_connect_error_transient() || now_ms() > deadline) {
            if (ctl_connect_error_transient()) atomic_store(&init_transient, 1);
            goto fail;
        }
        sleep_ms(200);
    }
    int64_t offset;
    if (ctl_clock_offset(dp->ctl, &offset) == 0) wall_clock_offset_set(offset); /* the job's one clock */
    /* A process the launcher started belongs to a live job: a config or launcher key missing
     * for a moment is a Redis that came back empty, and the launcher is writing them again. */
    double republished_by = now_ms() + 5000;
    int spawned = proc && atol(proc) > 0;
    while (read_job(dp, err, errlen) != 0) {
        if (spawned && !ctl_error_transient(dp->ctl) && now_ms() < republished_by) {
            sleep_ms(100);
            continue;
        }
        if (!retry_transient(dp->ctl, deadline)) goto fail;
    }
    deadline = now_ms() + job_control_outage_ms(&dp->cfg);
    if (!o.spare && o.rank >= dp->cfg.workers) { /* refused now, not later by the collectives */
        snprintf(err, errlen, "--rank %d: job '%s' has %d ranks (0 to %d)", o.rank, dp->job, dp->cfg.workers,
                 dp->cfg.workers - 1);
        goto fail;
    }
    /* A launcher draws its processes' ids, so that it can report their exits by id. Read once:
     * a process this one starts must not take the same id. */
    dp->proc_id = proc && atol(proc) > 0 ? atol(proc) : ctl_new_proc_id(dp->ctl);
    while (dp->proc_id < 0 && retry_transient(dp->ctl, deadline)) dp->proc_id = ctl_new_proc_id(dp->ctl);
    unsetenv(DP_ENV_PROC);
    if (dp->proc_id < 0) { snprintf(err, errlen, "registration failed: %s", ctl_last_error(dp->ctl)); goto fail; }
    if (start_replica_server(dp, err, errlen) != 0) goto fail;
    ctl_heartbeat(dp->ctl, dp->proc_id, dp->cfg.detect_timeout_ms);
    pthread_create(&dp->hb_thread, NULL, heartbeat_loop, dp);
    pthread_create(&dp->abort_thread, NULL, abort_watch_loop, dp);
    dp->rank = o.spare ? -1 : claim_rank(dp, o.rank);
    if (dp->rank == -2) {
        snprintf(err, errlen, "claiming a rank failed: %s", ctl_last_error(dp->ctl));
        goto fail;
    }
    if (!o.spare && o.rank >= 0 && dp->rank < 0) log_msg("rank %d is taken; joining as a spare", o.rank);
    dp->pub_rank = dp->rank;
    lc_feed(dp, dp->rank >= 0 ? LC_IN_RANK_CLAIMED : LC_IN_NO_RANK); /* NEW or SPARE, and the role */
    ctl_wait_replica(dp->ctl, 1000); /* the registration (replica address, machine, rank) on a replica */
    dp->next_step = dp->cfg.resume_step + 1;
    set_role_log(dp);
    return dp;
fail:
    free_process(dp);
    return NULL;
}

/* --- generations: capture and restore ------------------------------------------------ */

/* --- state DeadPool owns ---------------------------------------------------------------
 * dp_state(id, k) is generation k of a declared region, in block[gen_block(k, every)] (every:
 * --snapshot-every; without in-memory snapshots, never: every update but the first is in
 * place, as in a loop without DeadPool). A snapshot generation k ((k + 1) % every == 0) is
 * snapshotted where it lies (no copy: capture_zero_copy); the update of step k + 1 reads it
 * and writes the other block, and the updates up to the next snapshot k + every write that
 * other block in place. Why block[gen_block(k)] stays intact as long as a rollback may need k:
 * the next write to it is the update of step k + every + 1, which comes after this rank's
 * gradient reduction of that step; every rank enters that reduction only after committing
 * snapshot k + every (dp_step_before_reduce waits for it), so by then the newest generation
 * every rank committed is k + every or later, and it is in the other block (docs/DESIGN.md,
 * zero-copy state). */

void dp_replica_spread(dp_t *dp, int block) { dp->spread_block = block > 0 ? block : 0; }

dp_status dp_state_declare(dp_t *dp, const dp_state_spec *specs, int n, char *err, size_t errlen) {
    if (dp->joined || dp->nstate) {
        snprintf(err, errlen, "dp_state_declare: call it once, before dp_join");
        return DP_ERR;
    }
    if (n <= 0 || n > GEN_MAX_REGIONS) {
        snprintf(err, errlen, "dp_state_declare: expected 1..%d regions, found %d", GEN_MAX_REGIONS, n);
        return DP_ERR;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < i; j++)
            if (specs[j].id == specs[i].id) {
                snprintf(err, errlen, "dp_state_declare: region id %u declared twice", specs[i].id);
                return DP_ERR;
            }
        dp->state[i] = specs[i];
        dp->state_off[i] = off;
        off += specs[i].len;
    }
    /* Room for the largest head a generation of these regions can have (64 KiB of extra). */
    dp->head_area = (gen_head_bytes(n, DP_STATE_EXTRA_MAX) + 63) & ~(size_t)63;
    dp->block_bytes = dp->head_area + off;
    for (int b = 0; b < 2; b++) {
        dp->block[b] = alloc_huge(dp->block_bytes);
        if (!dp->block[b]) {
            snprintf(err, errlen, "dp_state_declare: out of memory for 2 x %zu bytes", dp->block_bytes);
            return DP_ERR;
        }
        prefault(dp->block[b], dp->block_bytes); /* a spare restores into them: no faults then */
    }
    dp->nstate = n;
    return DP_OK;
}

static int state_every(const dp_t *dp) { return dp->cfg.ft == FT_DEADPOOL ? dp->cfg.snapshot_every : INT_MAX; }

/* The block that holds generation gen of the declared state. */
static unsigned char *block_of(const dp_t *dp, int64_t gen) { return dp->block[gen_block(gen, state_every(dp))]; }

static int state_index(const dp_t *dp, uint32_t id) {
    for (int i = 0; i < dp->nstate; i++)
        if (dp->state[i].id == id) return i;
    return -1;
}

/* Generation gen of the k-th declared region. */
static unsigned char *state_at(const dp_t *dp, int k, int64_t gen) {
    return block_of(dp, gen) + dp->head_area + dp->state_off[k];
}

void *dp_state(const dp_t *dp, uint32_t id, int64_t gen) {
    int k = state_index(dp, id);
    return k < 0 ? NULL : state_at(dp, k, gen);
}

/* The declared regions of generation gen into out (dp->nstate of them). */
static void declared_regions(const dp_t *dp, int64_t gen, dp_region *out) {
    for (int k = 0; k < dp->nstate; k++)
        out[k] = (dp_region){dp->state[k].id, DP_SHARDED, state_at(dp, k, gen), dp->state[k].len};
}

/* The application's regions now, then the declared state of generation gen. -1 + dp->err. */
static int app_regions(dp_t *dp, int64_t gen, dp_region *out, int max) {
    int n = dp->cb.regions(dp->cb.arg, out, max);
    if (n < 0 || n > max) {
        snprintf(dp->err, sizeof dp->err, "the regions callback reported %d regions, expected 0..%d", n, max);
        return -1;
    }
    if (n + dp->nstate > max) {
        snprintf(dp->err, sizeof dp->err, "%d regions and %d declared: more than %d", n, dp->nstate, max);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (state_index(dp, out[i].id) >= 0) {
            snprintf(dp->err, sizeof dp->err, "region %u is both declared (dp_state_declare) and reported", out[i].id);
            return -1;
        }
    declared_regions(dp, gen, out + n);
    return n + dp->nstate;
}

/* The local part of generation `step` (see struct dp): same[0..n), all DP_IDENTICAL, as a
 * generation payload of its own in dp->snap_locals; nothing when n is 0. 0, -1 + dp->err. */
static int local_part(dp_t *dp, int64_t step, const dp_region *same, int n) {
    dp->nlocals = 0;
    if (n == 0) return 0;
    size_t hb = gen_head_bytes(n, 0);
    if (hb > dp->local_head_cap) {
        unsigned char *grown = realloc(dp->local_head, hb);
        if (!grown) { snprintf(dp->err, sizeof dp->err, "out of memory for a generation head"); return -1; }
        dp->local_head = grown;
        dp->local_head_cap = hb;
    }
    gen_head_write(dp->local_head, dp->cfg.seed, step + 1, same, n, NULL, 0);
    dp->snap_locals[0] = (SnapRegion){dp->local_head, hb};
    for (int i = 0; i < n; i++) dp->snap_locals[i + 1] = (SnapRegion){same[i].ptr, same[i].len};
    dp->nlocals = n + 1;
    return 0;
}

/* Generation `step` as one payload where it lies, when it is a snapshot generation (the
 * next update writes the other block: gen_block) and all of this rank's state is declared:
 * the head goes right before the regions in its block and the snapshot thread replicates from
 * there. 1 captured, 0 not possible (copy as usual; e.g. a restore point from a checkpoint
 * between two snapshots, whose successor is updated in place). */
static int capture_zero_copy(dp_t *dp, int64_t step, const void *extra, size_t extra_len) {
    if (!dp->nstate || block_of(dp, step) == block_of(dp, step + 1) || extra_len > DP_STATE_EXTRA_MAX) return 0;
    dp_region now[GEN_MAX_REGIONS];
    int n = dp->cb.regions(dp->cb.arg, now, GEN_MAX_REGIONS);
    if (n < 0) return 0;
    for (int i = 0; i < n; i++)
        if (now[i].kind == DP_SHARDED || dp->rank == 0) return 0; /* state of its own to copy */
    if (local_part(dp, step, now, n) != 0) return 0; /* the identical regions, kept here only */
    dp_region kept[GEN_MAX_REGIONS];
    declared_regions(dp, step, kept);
    size_t hb = gen_head_bytes(dp->nstate, extra_len);
    unsigned char *payload = block_of(dp, step) + dp->head_area - hb;
    gen_head_write(payload, dp->cfg.seed, step + 1, kept, dp->nstate, extra, extra_len);
    return snapshot_capture_external(dp->snap, step, payload, hb + dp->block_bytes - dp->head_area, dp->snap_locals,
                                     dp->nlocals) == 0;
}

/* The application's regions now, with the snapshot regions of this rank's generation: the
 * head first, then the regions it replicates: its own, and on rank 0 the identical ones too
 * (so that they outlive every member failing at once). Every other rank keeps the identical
 * regions in the local part (local_part): any survivor can provide them after a rollback.
 * The number of snapshot regions, -1 + dp->err. */
static int gather_regions(dp_t *dp, int64_t step, const void *extra, size_t extra_len) {
    int n = app_regions(dp, step, dp->app_regions, GEN_MAX_REGIONS);
    if (n < 0) return -1;
    dp_region kept[GEN_MAX_REGIONS], same[GEN_MAX_REGIONS];
    int k = 0, m = 0;
    for (int i = 0; i < n; i++) {
        if (dp->app_regions[i].kind == DP_SHARDED || dp->rank == 0) kept[k++] = dp->app_regions[i];
        else same[m++] = dp->app_regions[i];
    }
    if (local_part(dp, step, same, m) != 0) return -1;
    size_t hb = gen_head_bytes(k, extra_len);
    if (hb > dp->head_cap) {
        unsigned char *grown = realloc(dp->head, hb);
        if (!grown) { snprintf(dp->err, sizeof dp->err, "out of memory for a generation head"); return -1; }
        dp->head = grown;
        dp->head_cap = hb;
    }
    gen_head_write(dp->head, dp->cfg.seed, step + 1, kept, k, extra, extra_len);
    dp->snap_regions[0] = (SnapRegion){dp->head, hb};
    for (int i = 0; i < k; i++) dp->snap_regions[i + 1] = (SnapRegion){kept[i].ptr, kept[i].len};
    return k + 1;
}

/* Copies each saved region into the application's region of the same id (declared state
 * is restored by restore_declared, before). */
static int default_restore(dp_t *dp, const dp_generation *g, char *err, size_t errlen) {
    dp_region now[GEN_MAX_REGIONS];
    int n = dp->cb.regions(dp->cb.arg, now, GEN_MAX_REGIONS);
    for (int i = 0; i < g->nregions; i++) {
        const dp_region *s = &g->regions[i];
        if (state_index(dp, s->id) >= 0) continue;
        int found = 0;
        for (int j = 0; j < n && !found; j++) {
            if (now[j].id != s->id) continue;
            found = 1;
            if (now[j].len != s->len) {
                snprintf(err, errlen, "region %u: saved %zu bytes, the application has %zu", s->id, s->len, now[j].len);
                return -1;
            }
            memcpy(now[j].ptr, s->ptr, s->len);
        }
        if (!found) {
            snprintf(err, errlen, "region %u is in the generation but not among the application's regions (give a "
                     "restore callback to allocate it)", s->id);
            return -1;
        }
    }
    return 0;
}

/* Declared state of generation g into its block (g->step & 1); nothing to copy when g is
 * that block already (a survivor rolling back to its own newest generation). */
static int restore_declared(dp_t *dp, const dp_generation *g, char *err, size_t errlen) {
    int seen = 0;
    for (int i = 0; i < g->nregions; i++) {
        int k = state_index(dp, g->regions[i].id);
        if (k < 0) continue;
        seen++;
        if (g->regions[i].len != dp->state[k].len) {
            snprintf(err, errlen, "region %u: saved %zu bytes, declared %zu", g->regions[i].id, g->regions[i].len,
                     dp->state[k].len);
            return -1;
        }
        void *dst = state_at(dp, k, g->step);
        if (dst != g->regions[i].ptr) memmove(dst, g->regions[i].ptr, g->regions[i].len);
    }
    if (g->rank == dp->rank && seen != dp->nstate) {
        snprintf(err, errlen, "the generation holds %d of the %d declared regions", seen, dp->nstate);
        return -1;
    }
    return 0;
}

static int app_restore(dp_t *dp, const dp_generation *g, char *err, size_t errlen) {
    if (restore_declared(dp, g, err, errlen) != 0) return -1;
    if (dp->cb.restore) return dp->cb.restore(dp->cb.arg, g, err, errlen);
    return default_restore(dp, g, err, errlen);
}

/* Checks a verified payload of this rank (with its local part local[0..local_len), from this
 * rank's own snapshot; 0 bytes: none) and hands it to the application: one generation. */
static int restore_payload(dp_t *dp, const SnapHeader *h, const void *payload, const void *local, size_t local_len,
                           char *err, size_t errlen) {
    if (h->rank != dp->rank || h->world != dp->cfg.workers) {
        snprintf(err, errlen, "state of rank %d of %d offered to rank %d of %d", h->rank, h->world, dp->rank,
                 dp->cfg.workers);
        return -1;
    }
    dp_region regions[2 * GEN_MAX_REGIONS];
    dp_generation g = {.step = h->step, .rank = h->rank, .world = h->world}, l = g;
    uint64_t seed, lseed = dp->cfg.seed;
    int64_t next, lnext = h->step + 1;
    if (gen_parse(payload, h->length, &g, regions, GEN_MAX_REGIONS, &seed, &next, err, errlen) != 0) return -1;
    if (local_len && gen_parse(local, local_len, &l, regions + g.nregions, GEN_MAX_REGIONS, &lseed, &lnext, err, errlen) != 0)
        return -1;
    if (seed != dp->cfg.seed || next != h->step + 1 || lseed != seed || lnext != next) {
        snprintf(err, errlen, "state of step %lld: taken with seed %llu, next step %lld; this job has seed %llu",
                 (long long)h->step + 1, (unsigned long long)seed, (long long)next, (unsigned long long)dp->cfg.seed);
        return -1;
    }
    if (local_len) g.nregions += l.nregions;
    dp->restored_identical = 0;
    for (int i = 0; i < g.nregions; i++) dp->restored_identical |= regions[i].kind == DP_IDENTICAL;
    /* Kept for the restore point's snapshot in the new epoch, which must carry it too. */
    void *copy = malloc(g.extra_len ? g.extra_len : 1);
    if (!copy) { snprintf(err, errlen, "out of memory for %zu bytes of extra state", g.extra_len); return -1; }
    if (g.extra_len) memcpy(copy, g.extra, g.extra_len);
    free(dp->restored_extra);
    dp->restored_extra = copy;
    dp->restored_extra_len = g.extra_len;
    return app_restore(dp, &g, err, errlen);
}

static int restore_in_place(const SnapHeader *h, const void *payload, const void *local, size_t local_len, void *arg) {
    dp_t *dp = arg;
    char err[512];
    if (restore_payload(dp, h, payload, local, local_len, err, sizeof err) == 0) return 0;
    log_msg("local copy of step %lld unusable: %s", (long long)h->step + 1, err);
    return -1;
}

/* Where a fetched generation lands: this rank's own generation straight into its block of
 * declared state (head right before the regions, as capture_zero_copy lays it out, so that
 * nothing is copied after), anything else in the spare's warm buffer when it fits; NULL: a
 * fresh buffer. */
typedef struct {
    dp_t *dp;
    int64_t own_step; /* INT64_MIN: not this rank's generation */
} Placement;

static void *place_restore(void *arg, uint64_t length) {
    Placement *p = arg;
    dp_t *dp = p->dp;
    size_t regions = dp->block_bytes - dp->head_area;
    if (p->own_step != INT64_MIN && dp->nstate && length >= regions && length - regions <= dp->head_area)
        return block_of(dp, p->own_step) + dp->head_area - (length - regions);
    if (dp->warm_buf && length <= dp->warm_cap) return dp->warm_buf;
    dp->restore_cold += length; /* into a fresh buffer: faulted in as it arrives */
    return NULL;
}

/* A payload in memory DeadPool keeps (not to be freed). */
static int payload_is_ours(const dp_t *dp, const void *p) {
    const unsigned char *b = p;
    if (b && b == dp->warm_buf) return 1;
    for (int i = 0; i < 2; i++)
        if (dp->block[i] && b >= dp->block[i] && b < dp->block[i] + dp->block_bytes) return 1;
    return 0;
}

/* Fetches rank's generation `step` from any holder recorded in recent epochs, where
 * place_restore says (else *payload is malloc'ed). 0 / -1. */
static int fetch_from_holders(dp_t *dp, int rank, long long step, long newest_epoch, SnapHeader *h, void **payload) {
    for (long e = newest_epoch; e >= 0 && e >= newest_epoch - 3; e--) {
        char list[HOLDERS_TEXT_MAX];
        Holder holders[HOLDERS_MAX];
        if (holders_read(dp->ctl, e, rank, list, sizeof list) != 0) continue;
        int n = holders_parse(list, holders, HOLDERS_MAX);
        for (int i = 0; i < n; i++) {
            char err[256];
            /* Connecting includes the holder's proof of the job's key, so it waits for the
             * holder's threads like the GET does: the same bound, not a bare TCP connect's. */
            ReplicaConn *c = replica_connect(holders[i].host, holders[i].port, holders[i].proc,
                                             job_comm_timeout_ms(&dp->cfg), 0, replica_server_key(dp->replicas), err,
                                             sizeof err);
            if (!c) {
                log_msg("rank %d's holder %s:%d: %s", rank, holders[i].host, holders[i].port, err);
                continue;
            }
            Placement pl = {dp, rank == dp->rank ? step : INT64_MIN};
            replica_status st = replica_get_into(c, dp->job, rank, step, h, place_restore, &pl, payload,
                                                 job_comm_timeout_ms(&dp->cfg));
            replica_close(c);
            if (st == REPLICA_OK && h->step == step) return 0;
            if (st == REPLICA_OK && !payload_is_ours(dp, *payload)) free(*payload);
            *payload = NULL;
        }
    }
    return -1;
}

/* Rank's state of the resumed checkpoint: from this machine's disk, else (machines without a
 * shared filesystem) from the launcher that serves it from its machine's disk (verified on
 * the way like any replica). 0 / -1 + err. */
static int read_resumed_state(dp_t *dp, int rank, SnapHeader *h, void **payload, char *err, size_t errlen) {
    int64_t step = dp->cfg.resume_step;
    if (checkpoint_read_shard(dp->cfg.resume, step, rank, h, payload, err, errlen) == 0) return 0;
    char k[48], where[300];
    if (dp->cfg.nnodes == 0) return -1;
    /* The machine that has it may still be loading its files (a spare machine joins last). */
    double deadline = now_ms() + dp->cfg.start_timeout_ms;
    while (ctl_get(dp->ctl, key(k, sizeof k, KEY_RESUME_HOLDER, rank, 0), where, sizeof where) != 0) {
        if (now_ms() > deadline) {
            snprintf(err, errlen, "rank %d's state of step %lld is neither on this machine's disk nor offered by "
                     "another machine within --start-timeout-ms", rank, (long long)step + 1);
            return -1;
        }
        sleep_ms(50);
    }
    Endpoint ep;
    if (endpoint_parse(where, &ep, err, errlen) != 0) return -1;
    char cerr[256];
    ReplicaConn *c = replica_connect(ep.host, ep.port, 0 /* a launcher */, job_comm_timeout_ms(&dp->cfg) + 5000,
                                     0, replica_server_key(dp->replicas), cerr, sizeof cerr);
    if (!c) {
        snprintf(err, errlen, "rank %d's state of step %lld: not on this machine, and its machine's launcher at %s:%d "
                 "cannot be reached: %s", rank, (long long)step + 1, ep.host, ep.port, cerr);
        return -1;
    }
    replica_status st = replica_get(c, dp->job, rank, step, h, payload, job_comm_timeout_ms(&dp->cfg) + 5000);
    replica_close(c);
    if (st == REPLICA_OK && h->step == step) return 0;
    if (st == REPLICA_OK) free(*payload);
    *payload = NULL;
    snprintf(err, errlen, "rank %d's state of step %lld from %s:%d: %s", rank, (long long)step + 1, ep.host, ep.port,
             st == REPLICA_OK ? "another step" : replica_status_str(st));
    return -1;
}

/* 1 when no generation of `rank` carried state of its own (KEY_OWN_STATE is absent) since
 * the job started or resumed, so that any generation g of it other than the resumed
 * checkpoint's (whose files exist) holds the identical state at most; 0 when one did, or when
 * Redis cannot say. */
static int rank_stateless(dp_t *dp, int rank, long long g) {
    if (g == dp->cfg.resume_step) return 0;
    char k[48], value[8];
    const char *suffix = key(k, sizeof k, KEY_OWN_STATE, rank, 0);
    int present = 1;
    return ctl_get_many(dp->ctl, &suffix, 1, value, sizeof value, &present) == 0 && !present;
}

/* 1 when this rank need not fetch generation `rollback`: it has nothing of its own and some
 * member survives to provide the identical state (or the rank is not 0, whose replica alone
 * carries it). */
static int nothing_of_its_own(dp_t *dp, long long rollback) {
    int survivors = dp->decision.world - dp->decision.nfailed;
    if (dp->rank == 0 && survivors <= 0) return 0;
    return rank_stateless(dp, dp->rank, rollback);
}

/* Puts this rank's state at generation `rollback`: from our own ping-pong buffer, else (a
 * rank with nothing of its own) an empty generation, else from a replica holder, else (the
 * resumed checkpoint) from disk; -1 means the initial state. */
static int restore_generation(dp_t *dp, Snapshot *old, long long rollback, char *err, size_t errlen) {
    dp->next_step = rollback + 1;
    if (rollback < 0) {
        dp->cb.reset(dp->cb.arg);
        return 0;
    }
    if (old && snapshot_local_use(old, rollback, restore_in_place, dp) == 0) return 0;
    if (nothing_of_its_own(dp, rollback)) { /* its identical state comes with the broadcast (share_and_rebuild) */
        log_msg("rank %d has no state of its own: nothing to fetch for step %lld", dp->rank, rollback + 1);
        free(dp->restored_extra);
        dp->restored_extra = NULL;
        dp->restored_extra_len = 0;
        dp->restored_identical = 0;
        dp_generation g = {.step = rollback, .rank = dp->rank, .world = dp->cfg.workers};
        return app_restore(dp, &g, err, errlen);
    }
    SnapHeader h;
    void *payload = NULL;
    int found = fetch_from_holders(dp, dp->rank, rollback, dp->epoch - 1, &h, &payload) == 0;
    if (!found && rollback == dp->cfg.resume_step) found = read_resumed_state(dp, dp->rank, &h, &payload, err, errlen) == 0;
    if (!found) {
        snprintf(err, errlen, "no copy of rank %d's state at step %lld is reachable", dp->rank, rollback + 1);
        return -1;
    }
    int rc = restore_payload(dp, &h, payload, NULL, 0, err, errlen);
    if (!payload_is_ours(dp, payload)) free(payload);
    return rc;
}

/* A spare's state arrives from a holder (and the identical state in the broadcast after it)
 * into memory that should not be touched for the first time then: the kernel's first-touch
 * faults cost 150 ms for 31 MiB on this VM, twice the transfer. At join the buffer holds the
 * largest generation this process could be asked to restore as the state is sized then: every
 * region as rank 0 keeps them (sharded and identical); state that appears later (optimizer
 * moments allocated at the first step) grows it while the spare waits (warm_grow_check). */
static void warm_restore_buffer(dp_t *dp) {
    dp_region r[GEN_MAX_REGIONS];
    if (dp->nstate && dp->cb.regions(dp->cb.arg, r, GEN_MAX_REGIONS) == 0) return; /* all declared: lands in a block */
    dp->warm_wanted = 1;
    int n = app_regions(dp, 0, r, GEN_MAX_REGIONS);
    if (n < 0) return;
    size_t bytes = gen_head_bytes(n, DP_STATE_EXTRA_MAX); /* extra state: a cursor, an RNG */
    for (int i = 0; i < n; i++) bytes += r[i].len;
    void *b = alloc_huge(bytes);
    if (!b) return; /* only slower */
    prefault(b, bytes);
    dp->warm_buf = b;
    dp->warm_cap = bytes;
}

static void *warm_grow_thread(void *arg) {
    dp_t *dp = arg;
    void *b = alloc_huge(dp->warm_next_cap);
    if (b) prefault(b, dp->warm_next_cap);
    dp->warm_next = b; /* only slower without it */
    atomic_store(&dp->warm_grown, 1);
    return NULL;
}

/* Takes the grown buffer once the thread is done (wait: wait for it). */
static void warm_grow_finish(dp_t *dp, int wait) {
    if (!dp->warm_growing || (!wait && !atomic_load(&dp->warm_grown))) return;
    pthread_join(dp->warm_thread, NULL);
    dp->warm_growing = 0;
    if (!dp->warm_next) return;
    free(dp->warm_buf);
    dp->warm_buf = dp->warm_next;
    dp->warm_cap = dp->warm_next_cap;
    dp->warm_next = NULL;
}

/* While a spare waits: when a rank has committed a generation larger than the warm buffer
 * (KEY_GEN_BYTES: what a spare fetches, and bounds the identical state's broadcast), a new
 * one is allocated and faulted in on a thread of its own, so that a decision is never late
 * for it. One MGET of the world's keys. */
static void warm_grow_check(dp_t *dp) {
    warm_grow_finish(dp, 0);
    if (!dp->warm_wanted || dp->warm_growing) return;
    int world = dp->cfg.workers;
    char (*names)[48] = malloc(sizeof *names * (size_t)world), (*values)[24] = malloc(sizeof *values * (size_t)world);
    const char **suffixes = malloc(sizeof *suffixes * (size_t)world);
    size_t want = 0;
    if (names && values && suffixes) {
        for (int r = 0; r < world; r++) suffixes[r] = key(names[r], sizeof names[r], KEY_GEN_BYTES, r, 0);
        if (ctl_get_many(dp->ctl, suffixes, world, values[0], sizeof values[0], NULL) == 0)
            for (int r = 0; r < world; r++) {
                long long b;
                if (values[r][0] && proto_int_parse(values[r], "gen_bytes", 0, LLONG_MAX, &b, NULL, 0) == 0 && (size_t)b > want)
                    want = (size_t)b;
            }
    }
    free(names);
    free(values);
    free(suffixes);
    if (want <= dp->warm_cap) return;
    dp->warm_next_cap = want;
    atomic_store(&dp->warm_grown, 0);
    dp->warm_growing = pthread_create(&dp->warm_thread, NULL, warm_grow_thread, dp) == 0;
}

static void release_warm_buffer(dp_t *dp) {
    warm_grow_finish(dp, 1);
    free(dp->warm_buf);
    dp->warm_buf = NULL;
    dp->warm_cap = 0;
}

/* 1 if the application reports a DP_IDENTICAL region now. */
static int reports_identical(dp_t *dp) {
    dp_region r[GEN_MAX_REGIONS];
    int n = dp->cb.regions(dp->cb.arg, r, GEN_MAX_REGIONS);
    for (int i = 0; i < n; i++)
        if (r[i].kind == DP_IDENTICAL) return 1;
    return 0;
}

/* After a restore: the lowest rank whose restored generation carried the DP_IDENTICAL regions
 * (a survivor from its own snapshot, rank 0 from its replica or its checkpoint file)
 * broadcasts them, and the ranks whose generation lacked them (a spare that took another
 * rank, a rank other than 0 resuming from disk) hand them to the application: a second
 * restore call. Then the application rebuilds what is derived. *state_lost (may be NULL) is
 * set when no member restored the identical state: trying again cannot help. */
static dp_status share_and_rebuild(dp_t *dp, int *state_lost, char *err, size_t errlen) {
    if (dp->cfg.workers > 1) {
        int world = dp->cfg.workers, from = -1, to = job_comm_timeout_ms(&dp->cfg);
        float *has = malloc(sizeof *has * (size_t)world);
        if (!has) { snprintf(err, errlen, "out of memory for %d flags", world); return DP_ERR; }
        has[dp->rank] = dp->restored_identical ? 1.0f : 0.0f;
        comm_status st = comm_allgather(dp->comm, has + dp->rank, has, 1, to);
        for (int r = 0; r < world && from < 0 && st == COMM_OK; r++)
            if (has[r] != 0.0f) from = r;
        free(has);
        if (st != COMM_OK) goto comm_failed;
        if (from < 0 && reports_identical(dp)) { /* no use trying again: the job stops (join_failed) */
            if (state_lost) *state_lost = 1;
            snprintf(err, errlen, "no member restored the state every rank holds identically (DP_IDENTICAL) of step %lld",
                     (long long)dp->next_step);
            return DP_ERR;
        }
        dp_region all[GEN_MAX_REGIONS], same[GEN_MAX_REGIONS];
        unsigned char *blob = NULL;
        uint64_t size = 0;
        int k = 0;
        if (dp->rank == from) {
            int n = dp->cb.regions(dp->cb.arg, all, GEN_MAX_REGIONS);
            for (int i = 0; i < n; i++)
                if (all[i].kind == DP_IDENTICAL) same[k++] = all[i];
            size = gen_head_bytes(k, 0);
            for (int i = 0; i < k; i++) size += same[i].len;
        }
        if (from >= 0 && comm_broadcast(dp->comm, &size, sizeof size, from, to) != COMM_OK) goto comm_failed;
        if (size > gen_head_bytes(0, 0)) {
            /* A spare's restored generation is in the application by now: its warm buffer is free. */
            int warm = dp->warm_buf && size <= dp->warm_cap;
            blob = warm ? dp->warm_buf : malloc(size);
            if (!blob) { snprintf(err, errlen, "out of memory for %llu bytes of identical state", (unsigned long long)size); return DP_ERR; }
            if (!warm && !dp->restored_identical) dp->restore_cold += size;
            if (dp->rank == from) {
                gen_head_write(blob, dp->cfg.seed, dp->next_step, same, k, NULL, 0);
                size_t off = gen_head_bytes(k, 0);
                for (int i = 0; i < k; i++) { memcpy(blob + off, same[i].ptr, same[i].len); off += same[i].len; }
            }
            if (comm_broadcast(dp->comm, blob, size, from, to) != COMM_OK) {
                if (!warm) free(blob);
                goto comm_failed;
            }
            if (!dp->restored_identical) {
                dp_region regions[GEN_MAX_REGIONS];
                dp_generation g = {.step = dp->next_step - 1, .rank = from, .world = world};
                uint64_t seed;
                int64_t next;
                int rc = gen_parse(blob, size, &g, regions, GEN_MAX_REGIONS, &seed, &next, err, errlen);
                if (rc == 0) rc = app_restore(dp, &g, err, errlen);
                if (rc != 0) {
                    if (!warm) free(blob);
                    return DP_ERR;
                }
            }
            if (!warm) free(blob);
        }
    }
    if (dp->cb.rebuild) {
        dp->err[0] = '\0';
        dp_status st = dp->cb.rebuild(dp, dp->cb.arg);
        if (st != DP_OK) { /* a collective's failure is in dp->err (comm_failed), else the epoch's */
            const char *why = dp->err[0] ? dp->err : comm_last_error(dp->comm);
            snprintf(err, errlen, "rebuilding the derived state failed: %s", why[0] ? why : "the application's rebuild failed");
            return st == DP_ERR ? DP_ERR : DP_FAILED;
        }
    }
    return DP_OK;
comm_failed:
    snprintf(err, errlen, "broadcasting the identical state failed: %s", comm_last_error(dp->comm));
    return DP_FAILED;
}

/* --- persistence --------------------------------------------------------------------- */

static int app_checkpoint(void *arg, const char *dir, int64_t step, int world, char *err, size_t errlen) {
    dp_t *dp = arg;
    return dp->cb.checkpoint ? dp->cb.checkpoint(dp->cb.arg, dir, step, world, err, errlen) : 0;
}

/* Rank `h->rank`'s state of h->step is on disk: count it (once per rank) and, as the last
 * rank, complete the checkpoint. */
static void count_persisted(dp_t *dp, ctl_t *c, const SnapHeader *h, const char *kind) {
    char k[64], err[1024];
    if (ctl_set_add_count(c, key(k, sizeof k, KEY_PERSISTED, h->step, 0), h->rank) != dp->cfg.workers) return;
    if (dp->cfg.nnodes > 0) { /* each machine has its ranks' files: complete across machines */
        log_msg("checkpoint of step %lld complete: every rank's state is on its machine's disk (--resume gathers them)",
                (long long)h->step + 1);
        char done[32];
        if (proto_int_format((long long)h->step, done, sizeof done) == 0) ctl_set(c, key(k, sizeof k, KEY_PERSIST_COMPLETE, 0, 0), done);
        event_emit(c, dp->t0_wall_ms, "checkpoint", "\"step\":%lld,\"kind\":\"%s\",\"machines\":true",
                   (long long)h->step + 1, kind);
        return;
    }
    if (checkpoint_finish(dp->cfg.out, h->step, dp->cfg.workers, dp->cfg_text, app_checkpoint, dp, err, sizeof err) != 0) {
        log_msg("checkpoint of step %lld: %s", (long long)h->step + 1, err);
        return;
    }
    event_emit(c, dp->t0_wall_ms, "checkpoint", "\"step\":%lld,\"kind\":\"%s\"", (long long)h->step + 1, kind);
}

static void persist_generation(dp_t *dp, ctl_t *c, const SnapHeader *h, const void *payload) {
    char err[1024];
    SnapRegion all = {payload, h->length};
    if (checkpoint_write_shard(dp->cfg.out, h, &all, 1, err, sizeof err) != 0 ||
        (dp->cfg.nnodes > 0 && checkpoint_write_config(dp->cfg.out, h->step, dp->cfg_text, err, sizeof err) != 0)) {
        log_msg("persist step %lld: %s", (long long)h->step + 1, err);
        return;
    }
    count_persisted(dp, c, h, "persist");
    char k[32], done[32];
    long long g;
    if (dp->cfg.nnodes > 0 && ctl_get(c, key(k, sizeof k, KEY_PERSIST_COMPLETE, 0, 0), done, sizeof done) == 0 &&
        proto_int_parse(done, "persist:complete", 0, LLONG_MAX, &g, NULL, 0) == 0)
        checkpoint_prune_below(dp->cfg.out, g);
}

/* Runs on a snapshot thread: the previous epoch's may still be finishing a generation (its
 * wait was aborted with the epoch) while the new epoch's commits, and both use snap_ctl. */
static void on_commit(const SnapHeader *h, const void *payload, void *arg) {
    dp_t *dp = arg;
    pthread_mutex_lock(&dp->snap_ctl_mu);
    pthread_mutex_lock(&dp->pub_mu); /* what republish writes again when Redis was away */
    if (h->epoch > dp->pub_epoch || (h->epoch == dp->pub_epoch && h->step > dp->pub_step)) {
        dp->pub_epoch = h->epoch;
        dp->pub_step = h->step;
    }
    pthread_mutex_unlock(&dp->pub_mu);
    /* The next step's reduction waits for this callback: with the control plane away it
     * writes nothing (republish does, once Redis is back), and otherwise each call is bounded
     * by about a step, so that a stall that begins now costs at most that. */
    if (!atomic_load(&dp->ctl_down)) {
        int saved = ctl_timeout(dp->snap_ctl);
        ctl_set_timeout(dp->snap_ctl, path_timeout_ms(dp));
        /* Before the commit is published: a coordinator that counts this generation as committed
         * must also see that the rank has state of its own (decide.h, stateless). */
        char k[48];
        int failed = 0;
        if (!dp->own_published && gen_own_state(payload, h->length)) {
            if (ctl_set(dp->snap_ctl, key(k, sizeof k, KEY_OWN_STATE, h->rank, 0), "1") == 0) dp->own_published = 1;
            else failed = dp->own_pending = 1;
        }
        char bytes[32];
        proto_int_format((long long)h->length, bytes, sizeof bytes);
        if (!failed && h->length > dp->gen_bytes_published) {
            if (ctl_set(dp->snap_ctl, key(k, sizeof k, KEY_GEN_BYTES, h->rank, 0), bytes) == 0)
                dp->gen_bytes_published = h->length; /* what a waiting spare sizes its buffer for */
            else failed = 1;
        }
        if (!failed && ctl_committed_set(dp->snap_ctl, h->epoch, h->rank, h->step) != 0) failed = 1;
        if (failed) control_down(dp, dp->snap_ctl, 0); /* owed: the heartbeat thread writes it as soon as it can */
        else ctl_wait_replica(dp->snap_ctl, 1000); /* under Sentinel: a committed generation survives a failover */
        ctl_set_timeout(dp->snap_ctl, saved);
    } else {
        if (!dp->own_published && gen_own_state(payload, h->length)) dp->own_pending = 1;
    }
    pthread_mutex_lock(&dp->pub_mu);
    if (h->length > dp->gen_bytes_published && h->length > dp->gen_bytes_pending) dp->gen_bytes_pending = h->length;
    pthread_mutex_unlock(&dp->pub_mu);
    int every = dp->cfg.persist_every;
    if (every > 0 && (h->step + 1) % every == 0) persist_generation(dp, dp->snap_ctl, h, payload);
    pthread_mutex_unlock(&dp->snap_ctl_mu);
}

/* --ft disk: every rank writes its live state, then rank 0 completes the checkpoint. */
static dp_status disk_checkpoint(dp_t *dp, int64_t step, const void *extra, size_t extra_len) {
    char err[1024];
    int n = gather_regions(dp, step, extra, extra_len);
    if (n < 0) return DP_ERR;
    if (checkpoint_write_live(dp->cfg.out, dp->job, dp->epoch, dp->rank, dp->cfg.workers, step, dp->snap_regions, n, err,
                              sizeof err) != 0)
        log_msg("checkpoint step %lld: %s", (long long)step + 1, err);
    if (comm_barrier(dp->comm, job_comm_timeout_ms(&dp->cfg)) != COMM_OK) return DP_FAILED;
    dp->last_disk_step = step + 1;
    if (dp->rank != 0) return DP_OK;
    if (checkpoint_finish(dp->cfg.out, step, dp->cfg.workers, dp->cfg_text, app_checkpoint, dp, err, sizeof err) != 0)
        log_msg("checkpoint step %lld: %s", (long long)step + 1, err);
    else
        event_emit(dp->ctl, dp->t0_wall_ms, "checkpoint", "\"step\":%lld,\"kind\":\"disk\"", (long long)step + 1);
    return DP_OK;
}

/* A failed rank with nothing of its own whose replicas are gone too: its generation `g` was the
 * identical state (rank 0: a head and its regions, which is what this survivor's local part
 * is) or an empty head (any other rank). Written from there. */
typedef struct {
    dp_t *dp;
    int rank, rc;
} StatelessPersist;

static int persist_as_stateless(const SnapHeader *h, const void *payload, const void *local, size_t local_len, void *arg) {
    (void)payload;
    StatelessPersist *p = arg;
    dp_t *dp = p->dp;
    unsigned char empty[sizeof(GenHead)];
    gen_head_write(empty, dp->cfg.seed, h->step + 1, NULL, 0, NULL, 0);
    SnapRegion r = p->rank == 0 && local_len ? (SnapRegion){local, local_len} : (SnapRegion){empty, sizeof empty};
    char err[1024];
    if (checkpoint_write_live(dp->cfg.out, dp->job, h->epoch, p->rank, dp->cfg.workers, h->step, &r, 1, err, sizeof err) != 0) {
        log_msg("persist rank %d's step %lld: %s", p->rank, (long long)h->step + 1, err);
        return -1;
    }
    SnapHeader as = *h;
    as.rank = p->rank;
    count_persisted(dp, dp->ctl, &as, "persist");
    p->rc = 0;
    return 0;
}

/* The coordinator found no spare: write our committed generation to disk so the job can be
 * resumed even if none ever comes; the named writer also writes the failed ranks' states
 * from their replicas. Once per request. */
static void answer_persist_request(dp_t *dp) {
    char req[PERSIST_REQ_TEXT_MAX], k[32], err[256];
    PersistRequest pr;
    if (dp->persist_answered || ctl_get(dp->ctl, key(k, sizeof k, KEY_PERSIST_REQ, 0, 0), req, sizeof req) != 0) return;
    if (persist_request_parse(req, &pr, err, sizeof err) != 0) {
        log_msg("ignoring the persist request: %s", err);
        return;
    }
    if (pr.epoch != dp->epoch) return;
    long long g = pr.step;
    int writer = pr.writer;
    dp->persist_answered = 1;
    SnapHeader h;
    void *payload = NULL;
    if (!dp->snap || snapshot_local_copy(dp->snap, g, &h, &payload) != 0) {
        log_msg("cannot persist step %lld: not in the local snapshot buffers", g + 1);
        return;
    }
    persist_generation(dp, dp->ctl, &h, payload);
    free(payload);
    if (writer != dp->rank) return;
    for (int i = 0; i < pr.nfailed; i++) {
        int rank = pr.failed[i];
        payload = NULL;
        if (fetch_from_holders(dp, rank, g, dp->epoch, &h, &payload) != 0) {
            StatelessPersist sp = {dp, rank, -1};
            if (!rank_stateless(dp, rank, g) || snapshot_local_use(dp->snap, g, persist_as_stateless, &sp) != 0 || sp.rc != 0)
                log_msg("cannot persist rank %d's step %lld: no holder has it", rank, g + 1);
            continue;
        }
        persist_generation(dp, dp->ctl, &h, payload);
        if (!payload_is_ours(dp, payload)) free(payload);
    }
}

/* --- replica placement and snapshots ------------------------------------------------- */

/* A process's replica server address and host never change (a process id names one process),
 * so they are cached for the life of this process: a recovery looks up the new member only,
 * and a spare taking a rank looks up everyone in one round trip. */
typedef struct {
    long proc;
    Holder h;
    char node[128];
} ProcFacts;

static struct {
    pthread_mutex_t lock;
    char job[64];
    ProcFacts *v;
    int n, cap;
} proc_facts_cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Facts of procs[0..n) into out (out[i].proc = 0 when proc i has registered no replica
 * server), the unknown ones fetched in one round trip. 0 / -1 (Redis unreachable). */
static int proc_facts(dp_t *dp, const long *procs, int n, ProcFacts *out) {
    static const char *const fields[] = {"replica", "node"};
    pthread_mutex_lock(&proc_facts_cache.lock);
    if (strcmp(proc_facts_cache.job, dp->job) != 0) { /* another job in this process */
        snprintf(proc_facts_cache.job, sizeof proc_facts_cache.job, "%s", dp->job);
        proc_facts_cache.n = 0;
    }
    long *missing = malloc(sizeof *missing * (size_t)(n > 0 ? n : 1));
    int *where = malloc(sizeof *where * (size_t)(n > 0 ? n : 1)), m = 0, rc = 0;
    if (!missing || !where) rc = -1;
    for (int i = 0; i < n && rc == 0; i++) {
        out[i].proc = 0;
        for (int k = 0; k < proc_facts_cache.n; k++)
            if (proc_facts_cache.v[k].proc == procs[i]) { out[i] = proc_facts_cache.v[k]; break; }
        if (!out[i].proc && procs[i] > 0) { missing[m] = procs[i]; where[m++] = i; }
    }
    char (*v)[300] = m > 0 && rc == 0 ? malloc(sizeof *v * 2 * (size_t)m) : NULL;
    if (m > 0 && (!v || ctl_proc_get_many(dp->ctl, missing, m, fields, 2, v[0], sizeof v[0]) != 0)) rc = -1;
    for (int j = 0; j < m && rc == 0; j++) {
        ProcFacts *f = &out[where[j]];
        Endpoint ep;
        if (endpoint_parse(v[2 * j], &ep, NULL, 0) != 0) continue; /* not registered (yet) */
        f->proc = missing[j];
        f->h.proc = missing[j];
        snprintf(f->h.host, sizeof f->h.host, "%s", ep.host);
        f->h.port = ep.port;
        snprintf(f->node, sizeof f->node, "%.127s", v[2 * j + 1]);
        if (proc_facts_cache.n == proc_facts_cache.cap) {
            int cap = proc_facts_cache.cap ? 2 * proc_facts_cache.cap : 64;
            ProcFacts *grown = realloc(proc_facts_cache.v, sizeof *grown * (size_t)cap);
            if (!grown) continue; /* not cached: looked up again next time */
            proc_facts_cache.v = grown;
            proc_facts_cache.cap = cap;
        }
        proc_facts_cache.v[proc_facts_cache.n++] = *f;
    }
    pthread_mutex_unlock(&proc_facts_cache.lock);
    free(v);
    free(missing);
    free(where);
    return rc;
}

/* owners[r] = the process of rank r in this epoch: from the decision being followed, else one
 * MGET. 0 / -1. */
static int current_owners(dp_t *dp, long *owners) {
    int world = dp->cfg.workers;
    if (dp->epoch > 0 && dp->decision.epoch == dp->epoch && dp->decision.world == world) {
        memcpy(owners, dp->decision.procs, sizeof *owners * (size_t)world);
        return 0;
    }
    return ctl_rank_owners(dp->ctl, world, owners);
}

/* The order in which rank looks for holders among the other ranks: offsets P, 2P, ... first
 * (with P ranks per machine, the same local rank on the next machines: one holder per
 * machine, and each machine holds one replica of each other machine's ranks), then the rest
 * of the ring rank+1, rank+2, ... (P = 0: the plain ring). offsets gets world - 1 entries. */
void holder_offsets(int world, int per_node, int *offsets) {
    int n = 0;
    if (per_node > 0 && per_node < world)
        for (int j = per_node; j < world; j += per_node) offsets[n++] = j;
    for (int j = 1; j < world; j++)
        if (!(per_node > 0 && per_node < world && j % per_node == 0)) offsets[n++] = j;
}

void holder_order(int world, int per_node, int block, int rank, int *order) {
    int m = world - 1, n = 0;
    int *off = malloc(sizeof *off * (size_t)(m > 0 ? m : 1));
    if (!off) { /* the plain ring */
        for (int j = 1; j < world; j++) order[j - 1] = (rank + j) % world;
        return;
    }
    holder_offsets(world, per_node, off);
    /* a stable partition: other blocks first */
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < m; j++) {
            int r = (rank + off[j]) % world, other = block <= 0 || r / block != rank / block;
            if (other == (pass == 0)) order[n++] = r;
        }
    free(off);
}

/* Holders of this rank's replicas: on other machines than ours and than each other's (so
 * that losing any `want` machines leaves a copy), in holder_offsets order. A single-machine
 * job falls back to holders on this machine; a multi-node job only when no other machine runs
 * a rank any more (a holder beside its owner dies with it: it says so). At most two round trips whatever the world: the owners (from the
 * decision being joined, else one MGET) and the facts of the processes not cached yet. */
static int ring_holders(dp_t *dp, int want, Holder *out) {
    int world = dp->cfg.workers, m = world - 1, n = 0;
    long *owners = malloc(sizeof *owners * (size_t)world), *ring = malloc(sizeof *ring * (size_t)(m > 0 ? m : 1));
    int *order = malloc(sizeof *order * (size_t)(m > 0 ? m : 1));
    ProcFacts *f = malloc(sizeof *f * (size_t)(m > 0 ? m : 1));
    const char *used[HOLDERS_MAX + 1];
    int ok = owners && ring && f && order && current_owners(dp, owners) == 0;
    if (ok) holder_order(world, dp->cfg.nnodes > 0 ? dp->cfg.nproc_per_node : 0, dp->spread_block, dp->rank, order);
    for (int j = 0; ok && j < m; j++) ring[j] = owners[order[j]];
    if (ok) ok = proc_facts(dp, ring, m, f) == 0;
    used[0] = dp->node;
    /* pass 0: a machine not used yet; pass 1: any other machine; pass 2 (one machine only): ours */
    for (int pass = 0; ok && pass < 3 && n < want; pass++) {
        if (pass == 2 && dp->cfg.nnodes > 0 && n == 0)
            log_msg("no other machine runs a rank of the job now: this rank's replicas stay on its machine, which it "
                    "cannot survive losing");
        if (pass == 2 && dp->cfg.nnodes > 0 && n > 0) break;
        for (int j = 0; j < m && n < want; j++) {
            if (f[j].proc <= 0) continue;
            int seen = 0, taken = 0;
            for (int u = 0; u <= n; u++) seen |= !strcmp(f[j].node, used[u]);
            for (int u = 0; u < n; u++) taken |= out[u].proc == f[j].proc;
            if (taken || (pass == 0 && seen) || (pass == 1 && !strcmp(f[j].node, dp->node))) continue;
            out[n] = f[j].h;
            used[++n] = f[j].node;
        }
    }
    free(owners);
    free(ring);
    free(order);
    free(f);
    return n;
}

int dp_local_rank(dp_t *dp) {
    if (dp->rank <= 0) return dp->rank; /* rank 0 is first wherever it runs: no Redis needed */
    int world = dp->cfg.workers, below = 0;
    long *owners = malloc(sizeof *owners * (size_t)world);
    ProcFacts *f = malloc(sizeof *f * (size_t)world);
    int ok = owners && f && current_owners(dp, owners) == 0;
    if (ok) ok = proc_facts(dp, owners, dp->rank, f) == 0;
    for (int r = 0; ok && r < dp->rank; r++) below += f[r].proc > 0 && !strcmp(f[r].node, dp->node);
    free(owners);
    free(f);
    return ok ? below : -1;
}

/* Spares (sorted by process id) rank, rank+1, ... mod S; waits for enough spares to register. */
static int spare_holders(dp_t *dp, int want, Holder *out) {
    long ids[DP_MAX_RANKS], chosen[HOLDERS_MAX] = {0};
    int n = 0;
    double deadline = now_ms() + dp->cfg.start_timeout_ms;
    while ((n = ctl_spare_list(dp->ctl, ids, DP_MAX_RANKS)) < want && now_ms() < deadline) sleep_ms(10);
    if (n < want || want > HOLDERS_MAX) return -1;
    ProcFacts f[HOLDERS_MAX];
    for (int j = 0; j < want; j++) chosen[j] = ids[(dp->rank + j) % n];
    if (proc_facts(dp, chosen, want, f) != 0) return -1;
    for (int j = 0; j < want; j++) {
        if (!f[j].proc) return -1;
        out[j] = f[j].h;
    }
    return want;
}

static int start_snapshots(dp_t *dp, char *err, size_t errlen) {
    Holder holders[HOLDERS_MAX];
    ReplicaTarget targets[HOLDERS_MAX];
    int want = dp->cfg.replicas, n;
    /* One worker has no ring peer: its replica goes to a spare (a lone rank must survive too). */
    if (dp->cfg.replica_placement == PLACE_SPARES || (dp->cfg.workers == 1 && dp->cfg.spares > 0)) {
        n = spare_holders(dp, want, holders);
        if (n < 0) { snprintf(err, errlen, "--replica-placement spares: fewer than %d spares registered", want); return -1; }
    } else {
        if (want > dp->cfg.workers - 1) want = dp->cfg.workers - 1;
        n = ring_holders(dp, want, holders);
        if (n < want) { snprintf(err, errlen, "only %d of %d ring replica holders are registered", n, want); return -1; }
    }
    if (dp->rank == 0 && dp->epoch == 0 && n < dp->cfg.replicas)
        log_msg("%d worker(s): %d replica(s) per rank instead of %d", dp->cfg.workers, n, dp->cfg.replicas);
    char list[HOLDERS_TEXT_MAX];
    holders_format(holders, n, list, sizeof list);
    holders_record(dp->ctl, dp->epoch, dp->rank, list);
    ctl_wait_replica(dp->ctl, 1000); /* a recovery looks the holders up: on a replica before it commits */
    for (int i = 0; i < n; i++) {
        snprintf(targets[i].host, sizeof targets[i].host, "%s", holders[i].host);
        targets[i].port = holders[i].port;
        targets[i].proc = holders[i].proc;
    }
    if (!dp->snap_ctl) dp->snap_ctl = ctl_connect(&dp->addr, dp->job, 5000, err, errlen);
    if (!dp->snap_ctl) return -1;
    /* The buffers are sized from the state as it is now; they grow if it does. */
    size_t hint = 0;
    int nr = gather_regions(dp, dp->next_step - 1, NULL, 0);
    for (int i = 0; i < nr; i++) hint += dp->snap_regions[i].len;
    SnapshotConfig sc = {.job = dp->job, .epoch = dp->epoch, .rank = dp->rank, .world = dp->cfg.workers,
                         .bytes_hint = hint, .targets = targets, .ntargets = n, .timeout_ms = job_comm_timeout_ms(&dp->cfg),
                         .allow_pull = dp->cfg.replica_transport == TRANSPORT_AUTO,
                         .external = dp->nstate > 0 && nr == dp->nstate + 1,
                         .key = replica_server_key(dp->replicas), .on_commit = on_commit, .arg = dp,
                         .abort = &dp->abort_step};
    dp->snap = snapshot_create(&sc, err, errlen);
    return dp->snap ? 0 : -1;
}

/* --- fault injection ----------------------------------------------------------------- */

static void fire_fault(dp_t *dp, fault_kind kind, long long step) {
    char value[FAULT_RECORD_TEXT_MAX], k[32];
    const char *name = fault_kind_name(kind == FAULT_RKILL ? FAULT_KILL : kind);
    FaultRecord fr = {.rank = dp->rank, .wall_ms = wall_ms()};
    snprintf(fr.kind, sizeof fr.kind, "%s", name);
    if (fault_record_format(&fr, value, sizeof value) == 0)
        ctl_set(dp->ctl, key(k, sizeof k, KEY_FAULT_LAST, dp->rank, 0), value); /* the failure time, for total_ms */
    event_emit(dp->ctl, dp->t0_wall_ms, "fault_injected", "\"kind\":\"%s\",\"rank\":%d,\"step\":%lld,\"pid\":%d", name,
               dp->rank, step + 1, (int)getpid());
    log_msg("injecting %s at step %lld", name, step + 1);
    if (kind == FAULT_KILL || kind == FAULT_RKILL) raise(SIGKILL);
    else if (kind == FAULT_STOP) raise(SIGSTOP);
    else if (kind == FAULT_NETDOWN) {
        Report r = {.kind = REPORT_LINK_DOWN, .epoch = dp->epoch, .rank = dp->rank, .step = step + 1, .t_wall_ms = wall_ms()};
        report_send(dp->ctl, dp->t0_wall_ms, &r); /* before the link is gone */
        netns_cut_own_link();
    }
}

/* Faults from --inject and --chaos fire once each, even when the step is re-run after a
 * rollback (SET NX in Redis). They fire mid-step, after the forward/backward: where a real
 * failure most likely strikes. */
static void maybe_inject(dp_t *dp, int64_t step) {
    char k[32];
    for (int i = 0; i < dp->nfaults; i++) {
        const FaultSpec *f = &dp->faults[i];
        if (f->kind == FAULT_CORRUPT) {
            /* Every process may hold the rank's replicas: each damages its own copies, once. */
            if (f->at == step + 1 && ctl_set_nx(dp->ctl, key(k, sizeof k, KEY_INJECTED, i, dp->proc_id), "1") == 1) {
                replica_server_corrupt_rank(dp->replicas, f->rank);
                event_emit(dp->ctl, dp->t0_wall_ms, "fault_injected", "\"kind\":\"corrupt\",\"rank\":%d,\"holder\":%ld,"
                           "\"step\":%lld", f->rank, dp->proc_id, (long long)step + 1);
            }
        } else if (f->kind != FAULT_RKILL && f->rank == dp->rank && f->at == step + 1 &&
                   ctl_set_nx(dp->ctl, key(k, sizeof k, KEY_INJECTED, i, 0), "1") == 1) {
            fire_fault(dp, f->kind, step);
        }
    }
    if (dp->cfg.chaos > 0.0f) {
        uint64_t h = rng_hash4(dp->cfg.seed, (uint64_t)step, 0xC4A05ULL, 0);
        double u = (double)(h >> 11) / 9007199254740992.0;
        if (u < dp->cfg.chaos && (int)((h >> 3) % (uint64_t)dp->cfg.workers) == dp->rank && step > 0 &&
            ctl_set_nx(dp->ctl, key(k, sizeof k, KEY_CHAOS, step, 0), "1") == 1)
            fire_fault(dp, (h >> 40) & 1 ? FAULT_STOP : FAULT_KILL, step);
    }
}

/* rkill: the process taking RANK dies while it recovers into EPOCH. */
static void maybe_inject_in_recovery(dp_t *dp) {
    char k[32];
    for (int i = 0; i < dp->nfaults; i++) {
        const FaultSpec *f = &dp->faults[i];
        if (f->kind == FAULT_RKILL && f->rank == dp->rank && f->at == dp->epoch &&
            ctl_set_nx(dp->ctl, key(k, sizeof k, KEY_INJECTED, i, 0), "1") == 1)
            fire_fault(dp, FAULT_RKILL, -1);
    }
}

/* --- membership ---------------------------------------------------------------------- */

/* Where the epoch's rendezvous happens: under Sentinel the master the control connection
 * found last; the epoch's fence key ends a rendezvous nobody will complete (see fence_epoch). */
typedef struct {
    char host[256], fence[256];
    comm_store_addr addr;
} EpochStore;

static int epoch_store(dp_t *dp, EpochStore *es, char *err, size_t errlen) {
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

static int join_communicator(dp_t *dp, int timeout_ms, char *err, size_t errlen) {
    char prefix[256];
    ctl_key_full(dp->ctl, prefix, sizeof prefix, KEY_GLOO, dp->epoch, 0);
    EpochStore es;
    if (epoch_store(dp, &es, err, errlen) != 0) return -1;
    double t0 = now_ms();
    int64_t entered = wall_ms();
    dp->comm = comm_create(&es.addr, prefix, dp->rank, dp->cfg.workers, dp->bind_host, timeout_ms, err, errlen);
    if (!dp->comm) return -1;
    double t1 = now_ms();
    /* Ranks leave the rendezvous at different times (a full mesh of N ranks on few cores takes
     * a while); the first collective must not spend its short timeout waiting for the last one
     * to finish connecting. So everyone meets here, under the rendezvous' own bound. */
    if (comm_barrier(dp->comm, timeout_ms) != COMM_OK) {
        snprintf(err, errlen, "the first barrier of epoch %ld failed: %s", dp->epoch, comm_last_error(dp->comm));
        return -1;
    }
    if (dp->epoch > 0) { /* what this join cost, for the `recovered` event (report_recovery) */
        char k[64], v[JOIN_STATS_TEXT_MAX];
        double wait, connect;
        comm_rendezvous_ms(dp->comm, &wait, &connect);
        JoinStats js = {.ctl_round_trips = (long long)ctl_round_trips_since_mark(dp->ctl) + 1,
                        .store_round_trips = (long long)comm_store_round_trips(dp->comm), .rendezvous_ms = t1 - t0,
                        .barrier_ms = now_ms() - t1, .wait_ms = wait, .connect_ms = connect, .entered_wall_ms = entered};
        if (join_stats_format(&js, v, sizeof v) == 0) ctl_set(dp->ctl, key(k, sizeof k, KEY_JOIN_STATS, dp->epoch, dp->rank), v);
    }
    return 0;
}

/* Becomes the rank `d` says in epoch d->epoch: restore, rebuild, resnapshot (the lifecycle's
 * RESTORING, then REJOINING). The outcome as the lifecycle's input: LC_IN_JOINED, or
 * LC_IN_RESTORE_FAILED / LC_IN_JOIN_FAILED + err. */
static lc_input join_epoch(dp_t *dp, const Decision *d, char *err, size_t errlen) {
    double t0 = now_ms();
    /* The old snapshots stay until the new epoch has committed its restore point: if this
     * join fails, they are still the only local copy. */
    if (dp->snap) {
        snapshot_abandon(dp->restore_src);
        dp->restore_src = dp->snap;
        dp->snap = NULL;
    }
    atomic_store(&dp->cur_epoch, d->epoch);
    atomic_store(&dp->abort_step, 0);
    dp->epoch = d->epoch;
    dp->persist_answered = 0;
    dp->rank = decision_rank_of(d, dp->proc_id); /* the role came with the decision (lc_feed) */
    pthread_mutex_lock(&dp->pub_mu);
    dp->pub_rank = dp->rank;
    pthread_mutex_unlock(&dp->pub_mu);
    set_role_log(dp);
    replica_server_set_min_epoch(dp->replicas, d->epoch);
    dp->restore_cold = 0;
    if (restore_generation(dp, dp->restore_src, d->rollback, err, errlen) != 0) return LC_IN_RESTORE_FAILED;
    lc_feed(dp, LC_IN_RESTORED); /* REJOINING: a failure from here on is the rendezvous' */
    log_msg("restored step %lld in %.1f ms", d->rollback + 1, now_ms() - t0);
    maybe_inject_in_recovery(dp);
    double t1 = now_ms();
    /* Everyone is warm and restores in parallel: if a member does not show up within this
     * bound it died during recovery, and the coordinator will decide again. */
    int join_timeout = 2 * dp->cfg.detect_timeout_ms + 3000;
    if (join_communicator(dp, join_timeout, err, errlen) != 0) return LC_IN_JOIN_FAILED;
    int state_lost = 0;
    if (d->rollback >= 0 && share_and_rebuild(dp, &state_lost, err, errlen) != DP_OK)
        return state_lost ? LC_IN_RESTORE_FAILED : LC_IN_JOIN_FAILED;
    double t2 = now_ms();
    if (dp->cfg.ft == FT_DEADPOOL) {
        if (start_snapshots(dp, err, errlen) != 0) return LC_IN_JOIN_FAILED;
        /* The restore point is snapshotted again in the new epoch; the first step waits for
         * its commit before reducing (as every step does), so this overlaps with that step's
         * forward/backward. Until then the old buffers stay as a second copy. */
        if (d->rollback >= 0 && capture_zero_copy(dp, d->rollback, dp->restored_extra, dp->restored_extra_len) == 0) {
            int n = gather_regions(dp, d->rollback, dp->restored_extra, dp->restored_extra_len);
            if (n < 0) { snprintf(err, errlen, "%s", dp->err); return LC_IN_JOIN_FAILED; }
            snapshot_capture_regions(dp->snap, d->rollback, dp->snap_regions, n, dp->snap_locals, dp->nlocals);
        }
    }
    char k[64], value[JOIN_TIMING_TEXT_MAX];
    JoinTiming jt = {.restore_ms = t1 - t0, .rebuild_ms = t2 - t1, .resnapshot_ms = now_ms() - t2,
                     .resumed_wall_ms = wall_ms(), .warm = dp->restore_cold == 0};
    if (join_timing_format(&jt, value, sizeof value) == 0) ctl_set(dp->ctl, key(k, sizeof k, KEY_TIMING, dp->epoch, dp->rank), value);
    dp->step_t0 = now_ms();
    return LC_IN_JOINED;
}

/* Waits (bounded) for a decision newer than our epoch. The decision's epoch, 0 when the job
 * ended, -1 on timeout. */
static long wait_for_decision(dp_t *dp, int timeout_ms) {
    double start = now_ms(), deadline = start + timeout_ms;
    while (now_ms() < deadline) {
        if (atomic_load(&dp->job_over) || atomic_load(&dp->control_lost)) return 0;
        /* A failure needs the control plane: it waits --control-wait for it (the heartbeat
         * thread sees it come back and republishes), then the process keeps what it committed
         * on disk and stops (dp_recover). */
        if (atomic_load(&dp->ctl_down)) {
            double away = atomic_load(&dp->down_since);
            if (now_ms() - (away > start ? away : start) > job_control_outage_ms(&dp->cfg)) {
                log_msg("the control plane (redis) has been unreachable for %d s while a failure waits for it: stopping "
                        "with the committed state", dp->cfg.control_wait);
                atomic_store(&dp->control_lost, 1);
                return 0;
            }
            sleep_ms(50);
            deadline += 50; /* the decision's own bound starts when the control plane is back */
            continue;
        }
        long e = ctl_epoch(dp->ctl);
        if (e < 0) note_failure(dp, dp->ctl);
        if (e > dp->epoch) return e;
        if (dp->rank >= 0) answer_persist_request(dp);
        if (ctl_wait_notice(dp->ctl, dp->proc_id, KEY_NOTICE, 100) < 0) sleep_ms(100); /* Redis unreachable */
    }
    return -1;
}

/* LC_ACT_PERSIST_LOCAL: the control plane is lost; what this process committed goes to disk. */
static void control_lost_persist(dp_t *dp, char *err, size_t errlen) {
    persist_without_control(dp);
    snprintf(err, errlen, "the control plane (redis) is lost");
}

/* LC_ACT_REPORT_FENCED: epoch e does not include this process. */
static void report_fenced(dp_t *dp, long e) {
    log_msg("fenced: epoch %ld no longer includes this process; leaving", e);
    event_emit(dp->ctl, dp->t0_wall_ms, "fenced", "\"proc\":%ld,\"pid\":%d,\"epoch\":%ld", dp->proc_id, (int)getpid(), e);
}

/* WAITING or RETRYING (LC_ACT_AWAIT_DECISION): waits for the coordinator's decision and feeds
 * the lifecycle what came of it: a decision naming this process (read into d), one fencing
 * it, the job over, the control plane lost, or nothing in time. The actions of that
 * transition. */
static lc_actions await_decision(dp_t *dp, Decision *d, long *epoch) {
    long e = wait_for_decision(dp, dp->cfg.spare_wait * 1000 + 4 * dp->cfg.detect_timeout_ms + 30000);
    *epoch = e;
    if (e == 0) return lc_feed(dp, atomic_load(&dp->control_lost) ? LC_IN_CONTROL_LOST : LC_IN_JOB_OVER);
    if (e < 0 || decision_read(dp->ctl, e, d) != 0) return lc_feed(dp, LC_IN_NO_DECISION);
    return lc_feed(dp, decision_rank_of(d, dp->proc_id) < 0 ? LC_IN_FENCED : LC_IN_DECISION_MINE);
}

/* RESTORING (a decision named this process): follows decisions until this process is a
 * working member of one: DP_OK (RESUMING), DP_STOPPED (the job ended, or the control plane
 * is lost), DP_FENCED (not a member any more), DP_ERR (no decision came). */
static dp_status follow_decisions(dp_t *dp, Decision *d, char *err, size_t errlen) {
    for (;;) {
        lc_input outcome = join_epoch(dp, d, err, errlen);
        lc_actions a = lc_feed(dp, outcome);
        if (dp->lc == LC_RESUMING) return DP_OK;
        /* Usually a member died while recovering; the coordinator decides again. */
        log_msg("joining epoch %ld failed: %s", dp->epoch, err);
        /* JOIN_RESTORE: this rank's state is unreachable (the coordinator stops the job rather
         * than hand the next spare the same hopeless decision); otherwise a member is missing
         * and the coordinator decides again. */
        if (a.flags & LC_ACT_REPORT_JOIN_FAILED) {
            Report r = {.kind = REPORT_JOIN_FAILED, .epoch = dp->epoch, .rank = dp->rank, .step = -1,
                        .t_wall_ms = wall_ms(), .phase = a.phase};
            snprintf(r.text, sizeof r.text, "%s", err);
            report_send(dp->ctl, dp->t0_wall_ms, &r);
        }
        if (a.flags & LC_ACT_END_COMMS) end_epoch_comms(dp);
        if (!(a.flags & LC_ACT_AWAIT_DECISION)) return DP_ERR; /* not reached: the lifecycle logged why */
        long e;
        a = await_decision(dp, d, &e);
        if (a.flags & LC_ACT_PERSIST_LOCAL) control_lost_persist(dp, err, errlen);
        if (dp->lc == LC_STOPPED) return DP_STOPPED;
        if (dp->lc == LC_FAILED) {
            snprintf(err, errlen, "no recovery decision arrived: giving up");
            return DP_ERR;
        }
        if (a.flags & LC_ACT_REPORT_FENCED) report_fenced(dp, e);
        if (dp->lc == LC_FENCED) return DP_FENCED;
        if (!(a.flags & LC_ACT_RESTORE)) return DP_ERR; /* not reached: the lifecycle logged why */
    }
}

static dp_status join_initial(dp_t *dp, char *err, size_t errlen) {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    event_emit(dp->ctl, dp->t0_wall_ms, "rank_joined", "\"rank\":%d,\"proc\":%ld,\"pid\":%d,\"host\":\"%s\"", dp->rank,
               dp->proc_id, (int)getpid(), host);
    dp->epoch = 0;
    if (join_communicator(dp, dp->cfg.start_timeout_ms, err, errlen) != 0) {
        emit_error(dp, "joining the communicator failed: ", err);
        lc_feed(dp, LC_IN_START_FAILED);
        return DP_FAILED;
    }
    if (dp->cfg.resume_step >= 0) { /* resumed from disk: every rank restores its state file */
        SnapHeader h;
        void *payload = NULL;
        int rc = read_resumed_state(dp, dp->rank, &h, &payload, err, errlen);
        if (rc == 0) rc = restore_payload(dp, &h, payload, NULL, 0, err, errlen);
        free(payload);
        if (rc != 0) { emit_error(dp, "resume: ", err); lc_feed(dp, LC_IN_START_FAILED); return DP_ERR; }
        if (share_and_rebuild(dp, NULL, err, errlen) != DP_OK) {
            emit_error(dp, "resume: ", err);
            lc_feed(dp, LC_IN_START_FAILED);
            return DP_FAILED;
        }
    }
    if (dp->cfg.ft == FT_DEADPOOL && start_snapshots(dp, err, errlen) != 0) {
        emit_error(dp, "snapshots: ", err);
        lc_feed(dp, LC_IN_START_FAILED);
        return DP_ERR;
    }
    dp->step_t0 = now_ms();
    lc_feed(dp, LC_IN_STARTED); /* STEPPING */
    return DP_OK;
}

/* A spare is warm (the application built its state before dp_join) and waits for a decision
 * that names it. */
static dp_status join_as_spare(dp_t *dp, char *err, size_t errlen) {
    warm_restore_buffer(dp); /* before entering the pool: a decision may name us at once */
    /* The epoch before entering the pool: a decision that names us can only come after it,
     * and may come before the next line runs (a failure waiting for a spare is decided the
     * moment one joins): read after, it would be taken as already seen. */
    long seen = ctl_epoch(dp->ctl);
    for (double deadline = now_ms() + job_control_outage_ms(&dp->cfg); ctl_spare_add(dp->ctl, dp->proc_id) != 0;)
        if (!retry_transient(dp->ctl, deadline)) {
            snprintf(err, errlen, "cannot join the spare pool: %s", ctl_last_error(dp->ctl));
            lc_feed(dp, LC_IN_START_FAILED);
            return DP_ERR;
        }
    atomic_store(&dp->in_pool, 1);
    ctl_wait_replica(dp->ctl, 1000);
    event_emit(dp->ctl, dp->t0_wall_ms, "spare_joined", "\"proc\":%ld,\"pid\":%d", dp->proc_id, (int)getpid());
    Decision *d = &dp->decision;
    double last = now_ms(), launcher_checked = now_ms(), launcher_missing = 0, warm_checked = 0;
    int rejoin = 0;
    int launcher_gone = 0;
    while (!atomic_load(&dp->job_over) && !atomic_load(&dp->control_lost)) {
        if (ctl_wait_notice(dp->ctl, dp->proc_id, KEY_NOTICE, 100) < 0) sleep_ms(100); /* redis unreachable: no spin */
        /* With a shared Redis, a launcher killed with -9 leaves the job's keys (and us) behind.
         * Its key expired and stayed away for --spare-wait: a launcher merely stopped for a
         * while gets that long to come back (the job waits as long for a spare). */
        if (now_ms() - launcher_checked > 1000) {
            launcher_checked = now_ms();
            int alive = ctl_launcher_alive(dp->ctl);
            if (alive != 0) launcher_missing = 0;
            else if (!launcher_missing) launcher_missing = now_ms();
            else if (now_ms() - launcher_missing >= dp->cfg.spare_wait * 1000.0) {
                log_msg("the job's launcher is gone (its key expired %d s ago): leaving the spare pool", dp->cfg.spare_wait);
                launcher_gone = 1;
                break;
            }
        }
        if (now_ms() - warm_checked > 200) { /* state that appeared since: the buffer grows */
            warm_checked = now_ms();
            warm_grow_check(dp);
        }
        /* A gap longer than the detect timeout: this spare was stopped (or starved) and the
         * coordinator has dropped it from the pool. Back and warm, it joins again. */
        if (now_ms() - last > dp->cfg.detect_timeout_ms) rejoin = 1;
        last = now_ms();
        long e = ctl_epoch(dp->ctl);
        if (e > seen) {
            seen = e;
            if (decision_read(dp->ctl, e, d) == 0 && decision_rank_of(d, dp->proc_id) >= 0) {
                log_msg("taking over rank %d in epoch %ld", decision_rank_of(d, dp->proc_id), e);
                lc_actions a = lc_feed(dp, LC_IN_DECISION_MINE); /* RESTORING */
                if (a.flags & LC_ACT_LEAVE_POOL) {
                    atomic_store(&dp->in_pool, 0);
                    ctl_spare_remove(dp->ctl, dp->proc_id);
                    warm_grow_finish(dp, 1); /* started long before, if at all: what is left is cheaper than faulting */
                }
                dp_status st = a.flags & LC_ACT_RESTORE ? follow_decisions(dp, d, err, errlen) : DP_ERR;
                release_warm_buffer(dp);
                return st;
            }
        }
        if (rejoin && ctl_heartbeat(dp->ctl, dp->proc_id, dp->cfg.detect_timeout_ms) == 0 &&
            ctl_spare_add(dp->ctl, dp->proc_id) == 0) {
            log_msg("back after a silence longer than %d ms: rejoining the spare pool", dp->cfg.detect_timeout_ms);
            event_emit(dp->ctl, dp->t0_wall_ms, "spare_joined", "\"proc\":%ld,\"pid\":%d,\"rejoined\":1", dp->proc_id,
                       (int)getpid());
            rejoin = 0;
        }
    }
    /* The job ended (or its launcher is gone), or the control plane is lost: STOPPED. */
    lc_actions a = lc_feed(dp, atomic_load(&dp->control_lost) && !launcher_gone ? LC_IN_CONTROL_LOST : LC_IN_JOB_OVER);
    if (a.flags & LC_ACT_LEAVE_POOL) {
        atomic_store(&dp->in_pool, 0);
        ctl_spare_remove(dp->ctl, dp->proc_id);
    }
    release_warm_buffer(dp);
    return DP_STOPPED;
}

dp_status dp_join(dp_t *dp, const dp_callbacks *cb, char *err, size_t errlen) {
    if (!cb || !cb->regions || !cb->reset) {
        snprintf(err, errlen, "dp_join: the regions and reset callbacks are required");
        return DP_ERR;
    }
    dp->cb = *cb;
    dp_status st = dp->lc == LC_SPARE ? join_as_spare(dp, err, errlen) : join_initial(dp, err, errlen);
    if (st == DP_OK) dp->joined = 1;
    else snprintf(dp->err, sizeof dp->err, "%s", err);
    return st;
}

/* --- the step ------------------------------------------------------------------------ */

static dp_status comm_failed(dp_t *dp, const char *what) {
    log_msg("step %lld: %s", (long long)dp->cur_step + 1, what);
    /* With the control plane away the report could not arrive: the coordinator finds the
     * failure through the exit or the silence, once Redis is back. */
    if (!atomic_load(&dp->ctl_down)) {
        Report r = {.kind = REPORT_COMM_FAILURE, .epoch = dp->epoch, .rank = dp->rank,
                    .step = (long long)dp->cur_step + 1, .t_wall_ms = wall_ms()};
        snprintf(r.text, sizeof r.text, "%s", what);
        report_send(dp->ctl, dp->t0_wall_ms, &r);
    }
    snprintf(dp->err, sizeof dp->err, "%s", what);
    return DP_FAILED;
}

static dp_status epoch_closed(dp_t *dp) {
    log_msg("step %lld abandoned: epoch %ld was closed after a failure", (long long)dp->cur_step + 1, dp->epoch);
    snprintf(dp->err, sizeof dp->err, "epoch %ld was closed after a failure", dp->epoch);
    return DP_FAILED;
}

dp_status dp_step_before_reduce(dp_t *dp, int64_t step) {
    dp->cur_step = step;
    if (atomic_load(&dp->job_over)) {
        lc_feed(dp, LC_IN_JOB_OVER); /* STOPPED */
        return DP_STOPPED;
    }
    maybe_inject(dp, step);
    if (atomic_load(&dp->abort_step)) return epoch_closed(dp);
    /* No rank reduces step k+1 before its generation k is committed (see snapshot.h). */
    dp->snapshot_wait_ms = 0;
    if (dp->snap && snapshot_wait_previous(dp->snap, &dp->snapshot_wait_ms) != 0)
        return atomic_load(&dp->abort_step) ? epoch_closed(dp) /* the wait ended with the epoch */
                                            : comm_failed(dp, "replication of the previous snapshot failed");
    return DP_OK;
}

/* The fence check, bounded by about a step. While the control plane is away it is skipped:
 * nobody can close the epoch then (the coordinator closes it through the same Redis, and
 * decides nothing until the processes have republished after its return), and the abort
 * watcher still ends the step when a close reaches it. */
dp_status dp_step_before_update(dp_t *dp) {
    if (atomic_load(&dp->abort_step)) return epoch_closed(dp);
    if (atomic_load(&dp->ctl_down)) return DP_OK;
    int saved = ctl_timeout(dp->ctl);
    ctl_set_timeout(dp->ctl, path_timeout_ms(dp));
    char k[64], v[8];
    int fenced = ctl_get(dp->ctl, key(k, sizeof k, KEY_FENCED, dp->epoch, 0), v, sizeof v) == 0;
    if (!fenced) note_failure(dp, dp->ctl);
    ctl_set_timeout(dp->ctl, saved);
    if (fenced) return epoch_closed(dp);
    return DP_OK;
}

/* committed: newest step (1-based) that every rank can restore, 0 if none; with the control
 * plane away, this rank's own newest commit. */
static long long committed_step(dp_t *dp, int ask) {
    if (!dp->snap) return dp->last_disk_step;
    long long c = ask ? ctl_committed_min(dp->ctl, dp->epoch, dp->cfg.workers) : -2;
    if (c == -2 && ask) note_failure(dp, dp->ctl);
    if (c == -2) c = snapshot_committed(dp->snap);
    return c >= 0 ? c + 1 : 0;
}

/* Rank 0's metrics line: pushed at once, bounded by about a step; queued behind lines that
 * wait for Redis (the heartbeat thread sends them, in order, when it is back). */
static void push_metrics(dp_t *dp, int64_t step, const dp_metrics *m, double step_ms) {
    pthread_mutex_lock(&dp->pub_mu);
    int direct = !atomic_load(&dp->ctl_down) && dp->mq_n == 0 && !dp->mq_flushing;
    pthread_mutex_unlock(&dp->pub_mu);
    int saved = ctl_timeout(dp->ctl);
    if (direct) ctl_set_timeout(dp->ctl, path_timeout_ms(dp));
    long long committed = committed_step(dp, direct);
    if (atomic_load(&dp->ctl_down)) direct = 0;
    char json[640];
    double tokens = m ? m->tokens : 0.0;
    snprintf(json, sizeof json,
             "{\"step\":%lld,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,\"step_ms\":%.3f,"
             "\"tokens_per_s\":%.1f,\"epoch\":%ld,\"committed_step\":%lld,\"snapshot_wait_ms\":%.3f,\"t\":%.3f}",
             (long long)step + 1, m ? m->loss : 0.0, m ? m->lr : 0.0, m ? m->grad_norm : 0.0, step_ms,
             step_ms > 0 ? tokens / (step_ms / 1e3) : 0.0, dp->epoch, committed, dp->snapshot_wait_ms,
             (double)(wall_ms() - dp->t0_wall_ms) / 1e3);
    if (!direct) {
        mq_push(dp, json);
    } else if (ctl_push_metric(dp->ctl, json) != 0) {
        note_failure(dp, dp->ctl);
        mq_push(dp, json);
    }
    ctl_set_timeout(dp->ctl, saved);
}

/* Rank 0 of a new epoch, after its first step: one `recovered` event with the timeline. */
static void report_recovery(dp_t *dp) {
    Report over = {.kind = REPORT_RECOVERED, .epoch = dp->epoch, .rank = dp->rank, .step = -1, .t_wall_ms = wall_ms()};
    report_send(dp->ctl, dp->t0_wall_ms, &over); /* the launcher may start replacement spares now */
    Decision *d = &dp->decision; /* the epoch's own: it is what we joined */
    if (decision_read(dp->ctl, dp->epoch, d) != 0) return;
    /* The slowest member sets each phase; training resumed when the last member did. Every
     * member's timing and join costs, and the newest step, in one MGET (per 256 keys). */
    double restore = 0, rebuild = 0, resnap = 0, rendezvous = 0, barrier = 0, rwait = 0, rconnect = 0;
    int *warm = calloc((size_t)dp->cfg.workers, sizeof *warm);
    long long resumed = 0, first_in = 0, last_in = 0;
    unsigned long long rtt_max = 0, rtt_total = 0;
    int world = dp->cfg.workers, nk = 2 * world + 1;
    char (*names)[64] = malloc(sizeof *names * (size_t)nk), (*values)[128] = malloc(sizeof *values * (size_t)nk);
    const char **suffixes = malloc(sizeof *suffixes * (size_t)nk);
    if (!names || !values || !suffixes || !warm) { free(names); free(values); free(suffixes); free(warm); return; }
    for (int r = 0; r < world; r++) {
        suffixes[r] = key(names[r], sizeof names[r], KEY_TIMING, dp->epoch, r);
        suffixes[world + r] = key(names[world + r], sizeof names[world + r], KEY_JOIN_STATS, dp->epoch, r);
    }
    suffixes[2 * world] = key(names[2 * world], sizeof names[2 * world], KEY_LAST_STEP, 0, 0);
    if (ctl_get_many(dp->ctl, suffixes, nk, values[0], sizeof values[0], NULL) != 0)
        for (int i = 0; i < nk; i++) values[i][0] = 0;
    for (int r = 0; r < world; r++) { /* an absent record ("") is a member that wrote none: skipped */
        JoinTiming t;
        JoinStats s;
        char err[256];
        if (values[r][0] && join_timing_parse(values[r], &t, err, sizeof err) != 0) log_msg("rank %d: %s", r, err);
        else if (values[r][0]) {
            warm[r] = t.warm;
            if (t.restore_ms > restore) restore = t.restore_ms;
            if (t.rebuild_ms > rebuild) rebuild = t.rebuild_ms;
            if (t.resnapshot_ms > resnap) resnap = t.resnapshot_ms;
            if (t.resumed_wall_ms > resumed) resumed = t.resumed_wall_ms;
        }
        if (values[world + r][0] && join_stats_parse(values[world + r], &s, err, sizeof err) != 0) log_msg("rank %d: %s", r, err);
        else if (values[world + r][0]) {
            unsigned long long rtt = (unsigned long long)s.ctl_round_trips + (unsigned long long)s.store_round_trips;
            if (rtt > rtt_max) rtt_max = rtt;
            rtt_total += rtt;
            if (s.rendezvous_ms > rendezvous) rendezvous = s.rendezvous_ms;
            if (s.barrier_ms > barrier) barrier = s.barrier_ms;
            if (s.wait_ms > rwait) rwait = s.wait_ms;
            if (s.connect_ms > rconnect) rconnect = s.connect_ms;
            if (!first_in || s.entered_wall_ms < first_in) first_in = s.entered_wall_ms;
            if (s.entered_wall_ms > last_in) last_in = s.entered_wall_ms;
        }
    }
    long long last = 0;
    if (values[2 * world][0] && proto_int_parse(values[2 * world], "last_step", 0, LLONG_MAX, &last, NULL, 0) != 0) last = 0;
    free(names);
    free(values);
    free(suffixes);
    long long total = resumed - d->t_fail_ms, first_step = wall_ms() - d->t_fail_ms;
    for (int i = 0; i < d->nfailed; i++) {
        event_emit(dp->ctl, dp->t0_wall_ms, "recovered",
                   "\"epoch\":%ld,\"rank\":%d,\"spare\":%ld,\"failure_kind\":\"%s\",\"rollback_step\":%lld,"
                   "\"detect_ms\":%lld,\"decide_ms\":%lld,\"restore_ms\":%.1f,\"rebuild_ms\":%.1f,\"resnapshot_ms\":%.1f,"
                   "\"total_ms\":%lld,\"first_step_done_ms\":%lld,\"steps_recomputed\":%lld,\"world\":%d,"
                   "\"rendezvous_ms\":%.1f,\"rendezvous_wait_ms\":%.1f,\"rendezvous_connect_ms\":%.1f,"
                   "\"rendezvous_spread_ms\":%lld,\"rendezvous_last_in_ms\":%lld,\"barrier_ms\":%.1f,"
                   "\"join_round_trips_max\":%llu,"
                   "\"join_round_trips_total\":%llu,\"failed_wall_ms\":%lld,\"resumed_wall_ms\":%lld,"
                   "\"restore_warm\":%s",
                   dp->epoch, d->failed[i].rank, d->failed[i].spare_proc, d->failed[i].kind, d->rollback + 1,
                   (long long)(d->t_detect_ms - d->t_fail_ms), (long long)(d->t_decide_ms - d->t_detect_ms), restore,
                   rebuild, resnap, total, first_step, last - (d->rollback + 1), world, rendezvous, rwait,
                   rconnect, last_in - first_in, last_in ? last_in - (long long)d->t_decide_ms : 0, barrier, rtt_max,
                   rtt_total, (long long)d->t_fail_ms, resumed, warm[d->failed[i].rank] ? "true" : "false");
    }
    free(warm);
    if (d->nfailed == 0)
        event_emit(dp->ctl, dp->t0_wall_ms, "recovered",
                   "\"epoch\":%ld,\"rank\":-1,\"failure_kind\":\"comm\",\"rollback_step\":%lld,\"total_ms\":%lld",
                   dp->epoch, d->rollback + 1, total);
}

/* The step's loss or gradient norm is not finite: its state is never committed. Every rank
 * sees the same (reduced) values, so every rank comes here: each persists its newest
 * committed generation, and once all have (a barrier), rank 0 tells the job why it stops and
 * where the last good state is. No restart: a NaN that would recur cannot loop. */
static dp_status diverged(dp_t *dp, int64_t step, const dp_metrics *m) {
    long long good = -1;
    if (dp->snap) {
        snapshot_drain(dp->snap, job_comm_timeout_ms(&dp->cfg));
        good = snapshot_committed(dp->snap);
        SnapHeader h;
        void *payload = NULL;
        if (good >= 0 && snapshot_local_copy(dp->snap, good, &h, &payload) == 0) {
            persist_generation(dp, dp->ctl, &h, payload);
            free(payload);
        }
    } else if (dp->cfg.ft == FT_DISK) {
        good = dp->last_disk_step - 1;
    }
    comm_barrier(dp->comm, job_comm_timeout_ms(&dp->cfg)); /* every rank's state is on disk */
    if (dp->rank == 0) {
        char cmd[1024];
        Report r = {.kind = REPORT_DIVERGED, .epoch = dp->epoch, .rank = dp->rank, .step = (long long)step + 1,
                    .t_wall_ms = wall_ms()};
        if (good >= 0)
            snprintf(r.text, sizeof r.text, "step %lld: loss %g, gradient norm %g: training diverged and nothing after step %lld "
                     "was committed. The state of step %lld is in %.700s/ckpt; continue with `%s` and, say, a smaller "
                     "learning rate", (long long)step + 1, m->loss, m->grad_norm, good + 1, good + 1, dp->cfg.out,
                     job_config_resume_command(&dp->cfg, cmd, sizeof cmd));
        else
            snprintf(r.text, sizeof r.text, "step %lld: loss %g, gradient norm %g: training diverged before any state was "
                     "committed", (long long)step + 1, m->loss, m->grad_norm);
        report_send(dp->ctl, dp->t0_wall_ms, &r);
    }
    snprintf(dp->err, sizeof dp->err, "training diverged at step %lld", (long long)step + 1);
    return DP_STOPPED;
}

dp_status dp_step_commit(dp_t *dp, int64_t step, const void *extra, size_t extra_len, const dp_metrics *m) {
    dp_status st = DP_OK;
    if (m && (!isfinite(m->loss) || !isfinite(m->grad_norm))) {
        lc_actions a = lc_feed(dp, LC_IN_DIVERGED); /* STOPPED */
        if (a.flags & LC_ACT_PERSIST_COMMITTED) return diverged(dp, step, m);
        snprintf(dp->err, sizeof dp->err, "training diverged at step %lld", (long long)step + 1);
        return DP_STOPPED;
    }
    if (dp->snap && (step + 1) % dp->cfg.snapshot_every == 0) {
        snapshot_wait_previous(dp->snap, NULL); /* the head buffer is the thread's until then */
        if (!capture_zero_copy(dp, step, extra, extra_len)) {
            int n = gather_regions(dp, step, extra, extra_len);
            if (n < 0 || snapshot_capture_regions(dp->snap, step, dp->snap_regions, n, dp->snap_locals, dp->nlocals) != 0)
                return DP_ERR;
        }
    } else if (dp->cfg.ft == FT_DISK && (step + 1) % dp->cfg.ckpt_every == 0) {
        /* A synchronous checkpoint is part of the step it follows. */
        st = disk_checkpoint(dp, step, extra, extra_len);
        if (st == DP_FAILED) return comm_failed(dp, comm_last_error(dp->comm));
        if (st != DP_OK) return st;
    }
    dp->next_step = step + 1;
    double t = now_ms();
    lc_actions a = lc_feed(dp, LC_IN_COMMITTED); /* STEPPING; from RESUMING: the epoch's first commit */
    if (a.flags & LC_ACT_STEP_TIME) /* the usual step time: the bound on the training path's Redis calls */
        dp->step_ewma = dp->step_ewma > 0 ? 0.9 * dp->step_ewma + 0.1 * (t - dp->step_t0) : t - dp->step_t0;
    if (dp->rank == 0) {
        push_metrics(dp, step, m, t - dp->step_t0);
        if (a.flags & LC_ACT_FIRST_COMMIT) report_recovery(dp);
    }
    if ((a.flags & LC_ACT_FIRST_COMMIT) && dp->restore_src) { /* the new epoch has committed its restore point */
        snapshot_abandon(dp->restore_src);
        dp->restore_src = NULL;
    }
    dp->step_t0 = now_ms();
    return DP_OK;
}

/* Without a control plane nobody can decide a recovery: every rank writes the generations in
 * its ping-pong buffers to disk (the newest one every rank committed is among them, see
 * snapshot.h), and rank 0 completes the newest step all ranks wrote (a shared filesystem:
 * one machine, or --out on shared storage). Bounded; no Redis involved. */
static void persist_without_control(dp_t *dp) {
    Snapshot *s = dp->snap ? dp->snap : dp->restore_src;
    if (!s) return;
    snapshot_drain(s, job_comm_timeout_ms(&dp->cfg));
    int64_t newest = snapshot_committed(s), g[2] = {newest, newest - dp->cfg.snapshot_every};
    char err[1024], cmd[1024];
    for (int i = 0; i < 2; i++) {
        SnapHeader h;
        void *payload = NULL;
        if (g[i] < 0 || snapshot_local_copy(s, g[i], &h, &payload) != 0) continue;
        SnapRegion all = {payload, h.length};
        if (checkpoint_write_shard(dp->cfg.out, &h, &all, 1, err, sizeof err) != 0) log_msg("persist: %s", err);
        free(payload);
        /* A rank that died meanwhile writes nothing: its holders write its state of the same
         * step from their replicas (verified again as they are read). */
        for (int r = 0; r < dp->cfg.workers; r++) {
            char name[32], path[4200];
            snprintf(name, sizeof name, "rank_%05d.state", r);
            checkpoint_path(path, sizeof path, dp->cfg.out, g[i], name);
            if (r == dp->rank || access(path, F_OK) == 0 ||
                replica_server_lookup(dp->replicas, r, g[i], &h, &payload) != REPLICA_OK)
                continue;
            SnapRegion held = {payload, h.length};
            if (h.step == g[i] && checkpoint_write_shard(dp->cfg.out, &h, &held, 1, err, sizeof err) != 0)
                log_msg("persist rank %d: %s", r, err);
            free(payload);
        }
    }
    if (dp->rank != 0) return;
    double deadline = now_ms() + 2.0 * dp->cfg.detect_timeout_ms + 10000;
    for (;;) {
        for (int i = 0; i < 2; i++) {
            int all = g[i] >= 0;
            for (int r = 0; r < dp->cfg.workers && all; r++) {
                char name[32], path[4200];
                snprintf(name, sizeof name, "rank_%05d.state", r);
                checkpoint_path(path, sizeof path, dp->cfg.out, g[i], name);
                all = access(path, F_OK) == 0;
            }
            if (!all) continue;
            if (checkpoint_finish(dp->cfg.out, g[i], dp->cfg.workers, dp->cfg_text, app_checkpoint, dp, err, sizeof err) == 0)
                log_msg("the control plane is lost: the state of step %lld is in %s/ckpt; continue with `%s`",
                        (long long)g[i] + 1, dp->cfg.out, job_config_resume_command(&dp->cfg, cmd, sizeof cmd));
            else
                log_msg("the control plane is lost and the checkpoint of step %lld failed: %s", (long long)g[i] + 1, err);
            return;
        }
        if (now_ms() > deadline) {
            log_msg("the control plane is lost and not every rank's state reached %s/ckpt in time", dp->cfg.out);
            return;
        }
        sleep_ms(50);
    }
}

dp_status dp_recover(dp_t *dp, char *err, size_t errlen) {
    lc_actions a = lc_feed(dp, LC_IN_STEP_FAILED); /* WAITING */
    if (a.flags & LC_ACT_END_COMMS) end_epoch_comms(dp);
    Decision *d = &dp->decision;
    long e = 0;
    if (atomic_load(&dp->control_lost)) a = lc_feed(dp, LC_IN_CONTROL_LOST); /* lost while an earlier failure waited */
    else if (a.flags & LC_ACT_AWAIT_DECISION) a = await_decision(dp, d, &e);
    else a = (lc_actions){.role = -1}; /* not reached: the lifecycle logged why */
    if (a.flags & LC_ACT_PERSIST_LOCAL) control_lost_persist(dp, err, errlen);
    if (dp->lc == LC_STOPPED) return DP_STOPPED;
    if (a.flags & LC_ACT_REPORT_FENCED) report_fenced(dp, e);
    if (dp->lc == LC_FENCED) return DP_FENCED;
    if (!(a.flags & LC_ACT_RESTORE)) { /* FAILED: no decision came */
        snprintf(err, errlen, "no recovery decision arrived: giving up");
        log_msg("%s", err);
        return DP_ERR;
    }
    return follow_decisions(dp, d, err, errlen);
}

/* --- collectives --------------------------------------------------------------------- */

/* A collective's status on communicator c (the epoch's or one of its groups'). */
static dp_status result_on(dp_t *dp, comm_t *c, comm_status st) {
    if (st == COMM_OK) return DP_OK;
    if (atomic_load(&dp->abort_step)) return epoch_closed(dp);
    return comm_failed(dp, comm_last_error(c));
}

static dp_status comm_result(dp_t *dp, comm_status st) { return result_on(dp, dp->comm, st); }

dp_status dp_allreduce_sum(dp_t *dp, float *buf, size_t n) {
    if (!dp->comm) return DP_ERR;
    return comm_result(dp, comm_allreduce_sum(dp->comm, buf, n, job_comm_timeout_ms(&dp->cfg)));
}

dp_status dp_allreduce_mean(dp_t *dp, float *buf, size_t n) {
    if (!dp->comm) return DP_ERR;
    return comm_result(dp, comm_allreduce_mean(dp->comm, buf, n, job_comm_timeout_ms(&dp->cfg)));
}

dp_status dp_allgather(dp_t *dp, const float *in, float *out, size_t n) {
    if (!dp->comm) return DP_ERR;
    return comm_result(dp, comm_allgather(dp->comm, in, out, n, job_comm_timeout_ms(&dp->cfg)));
}

dp_status dp_broadcast(dp_t *dp, void *buf, size_t nbytes, int root) {
    if (!dp->comm) return DP_ERR;
    return comm_result(dp, comm_broadcast(dp->comm, buf, nbytes, root, job_comm_timeout_ms(&dp->cfg)));
}

dp_status dp_barrier(dp_t *dp) {
    if (!dp->comm) return DP_ERR;
    return comm_result(dp, comm_barrier(dp->comm, job_comm_timeout_ms(&dp->cfg)));
}

/* --- groups --------------------------------------------------------------------------- */

struct dp_group {
    dp_t *dp;
    comm_t *comm;
    int index, size;
    struct dp_group *next;
};

/* Groups first: each is a child of the epoch's communicator (comm_create_group). */
static void end_epoch_comms(dp_t *dp) {
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
    if (epoch_store(dp, &es, err, errlen) != 0) return NULL;
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
    return group_result(g, comm_allreduce_sum(g->comm, buf, n, job_comm_timeout_ms(&g->dp->cfg)));
}

dp_status dp_group_allreduce_mean(dp_group *g, float *buf, size_t n) {
    return group_result(g, comm_allreduce_mean(g->comm, buf, n, job_comm_timeout_ms(&g->dp->cfg)));
}

dp_status dp_group_allgather(dp_group *g, const float *in, float *out, size_t n) {
    return group_result(g, comm_allgather(g->comm, in, out, n, job_comm_timeout_ms(&g->dp->cfg)));
}

dp_status dp_group_send(dp_group *g, const void *buf, size_t nbytes, int dst, uint32_t tag) {
    return group_result(g, comm_send(g->comm, buf, nbytes, dst, tag));
}

dp_status dp_group_recv(dp_group *g, void *buf, size_t nbytes, int src, uint32_t tag) {
    return group_result(g, comm_recv(g->comm, buf, nbytes, src, tag, job_comm_timeout_ms(&g->dp->cfg)));
}

dp_status dp_group_wait_sends(dp_group *g) {
    return group_result(g, comm_wait_sends(g->comm, job_comm_timeout_ms(&g->dp->cfg)));
}

/* --- leaving ------------------------------------------------------------------------- */

static void report_snapshot_stats(dp_t *dp) {
    SnapshotStats st;
    snapshot_stats(dp->snap, &st);
    event_emit(dp->ctl, dp->t0_wall_ms, "snapshot_stats",
               "\"rank\":%d,\"epoch\":%ld,\"captures\":%llu,\"commits\":%llu,\"failures\":%llu,\"waits\":%llu,"
               "\"wait_ms_total\":%.3f,\"bytes_copied\":%llu,\"bytes_replicated\":%llu,\"copy_ms_mean\":%.3f,"
               "\"replicate_ms_mean\":%.3f,\"bytes_pulled\":%llu,\"cpu_ms\":%.1f,\"holder_cpu_ms\":%.1f,"
               "\"warmup_ms\":%.1f,\"warmup_cpu_ms\":%.1f",
               dp->rank, dp->epoch, (unsigned long long)st.captures, (unsigned long long)st.commits,
               (unsigned long long)st.failures, (unsigned long long)st.waits, st.wait_ms_total,
               (unsigned long long)st.bytes_copied, (unsigned long long)st.bytes_replicated,
               st.captures ? st.copy_ms_total / st.captures : 0.0, st.captures ? st.replicate_ms_total / st.captures : 0.0,
               (unsigned long long)st.bytes_pulled, st.cpu_ms_total, replica_server_cpu_ms(dp->replicas), st.warmup_ms,
               st.warmup_cpu_ms);
}

int dp_finish(dp_t *dp, dp_status how) {
    if (!dp) return atomic_load(&init_transient) ? DP_EXIT_FAILED : DP_EXIT_BAD_JOB;
    int rc = how == DP_OK ? DP_EXIT_DONE
           : how == DP_STOPPED ? DP_EXIT_STOPPED
           : how == DP_FENCED ? DP_EXIT_FENCED
           : !dp->joined && !atomic_load(&init_transient) ? DP_EXIT_BAD_JOB
           : how == DP_ERR && dp->next_step >= dp->cfg.steps ? DP_EXIT_OUTPUT /* trained, then failed to write */
           : DP_EXIT_FAILED;
    /* Every step done: DONE. Any other status leaves the state as it is (the step or the call
     * that ended the loop moved it already, or the application gave up on its own). */
    lc_actions a = how == DP_OK ? lc_feed(dp, LC_IN_FINISHED) : (lc_actions){.role = -1};
    int done = (a.flags & LC_ACT_REPORT_DONE) != 0;
    if (dp->snap) {
        snapshot_drain(dp->snap, job_comm_timeout_ms(&dp->cfg));
        report_snapshot_stats(dp);
        /* Every rank's last replication is done before anyone closes its replica server. */
        if (done) comm_barrier(dp->comm, job_comm_timeout_ms(&dp->cfg));
        snapshot_destroy(dp->snap);
    }
    /* Rank 0 says the job is done once every rank is: the launcher ends the job on it. That
     * and the metrics lines still queued need the control plane: with it away, rank 0 waits
     * for it (--control-wait at most: after that the launcher sees every rank exit 0). */
    if (done && dp->rank == 0) {
        double until = now_ms() + job_control_outage_ms(&dp->cfg);
        for (;;) {
            pthread_mutex_lock(&dp->pub_mu);
            int queued = dp->mq_n;
            pthread_mutex_unlock(&dp->pub_mu);
            if ((!atomic_load(&dp->ctl_down) && !queued) || now_ms() > until) break;
            sleep_ms(50);
        }
    }
    if (done && dp->rank == 0) {
        Report r = {.kind = REPORT_JOB_DONE, .epoch = dp->epoch, .rank = 0, .step = (long long)dp->next_step,
                    .t_wall_ms = wall_ms()};
        report_send(dp->ctl, dp->t0_wall_ms, &r);
    }
    snapshot_abandon(dp->restore_src);
    if (dp->snap_ctl) ctl_close(dp->snap_ctl);
    end_epoch_comms(dp);
    free_process(dp);
    return rc;
}

void dp_output_saved(dp_t *dp, const char *path) {
    Report r = {.kind = REPORT_MODEL_SAVED, .epoch = dp->epoch, .rank = dp->rank, .step = -1, .t_wall_ms = wall_ms()};
    if (snprintf(r.text, sizeof r.text, "%s", path) >= (int)sizeof r.text) log_msg("output path too long to report: %s", path);
    report_send(dp->ctl, dp->t0_wall_ms, &r);
}

/* --- checkpoints --------------------------------------------------------------------- */

int dp_checkpoint_read(const char *dir, int rank, int (*fn)(void *arg, const dp_generation *g), void *arg, char *err,
                       size_t errlen) {
    SnapHeader h;
    void *payload = NULL;
    if (checkpoint_read_state(dir, rank, -1, &h, &payload, err, errlen) != 0) return -1;
    dp_region regions[GEN_MAX_REGIONS];
    dp_generation g = {.step = h.step, .rank = h.rank, .world = h.world};
    uint64_t seed;
    int64_t next;
    int rc = gen_parse(payload, h.length, &g, regions, GEN_MAX_REGIONS, &seed, &next, err, errlen);
    if (rc == 0) rc = fn(arg, &g);
    free(payload);
    return rc;
}

/* --- launching: the environment a job's process is started with ------------------------ */

void worker_env_set(const WorkerArgs *a) {
    char rank[32];
    setenv(DP_ENV_REDIS, a->redis_url, 1);
    setenv(DP_ENV_JOB, a->job, 1);
    if (a->bind_host) setenv(DP_ENV_BIND, a->bind_host, 1);
    else unsetenv(DP_ENV_BIND);
    if (a->spare) setenv(DP_ENV_SPARE, "1", 1);
    else unsetenv(DP_ENV_SPARE);
    snprintf(rank, sizeof rank, "%d", a->rank);
    if (a->rank >= 0) setenv(DP_ENV_RANK, rank, 1);
    else unsetenv(DP_ENV_RANK);
    if (a->node) setenv(DP_ENV_NODE, a->node, 1);
    if (a->out) setenv(DP_ENV_OUT, a->out, 1);
    if (a->resume) setenv(DP_ENV_RESUME, a->resume, 1);
    snprintf(rank, sizeof rank, "%ld", a->proc);
    if (a->proc > 0) setenv(DP_ENV_PROC, rank, 1);
    else unsetenv(DP_ENV_PROC);
}

int program_argv(const JobConfig *c, const char *self_exe, char *buf, size_t len, char **argv, int max) {
    char *parts[1024];
    int n = job_config_program_argv(c, buf, len, parts, 1024), k = 0;
    for (int i = 0; i < n && k < max - 2; i++) {
        if (i == 0 && !strcmp(parts[0], DP_BUILTIN_PROGRAM)) {
            argv[k++] = (char *)self_exe;
            argv[k++] = "train";
        } else {
            argv[k++] = parts[i];
        }
    }
    argv[k] = NULL;
    return k;
}

int worker_exec(const WorkerArgs *a, const char *self_exe) {
    char err[1024];
    redis_addr addr;
    if (redis_addr_parse(a->redis_url, &addr, err, sizeof err) != 0) { log_msg("%s", err); return DP_EXIT_BAD_JOB; }
    ctl_t *c = ctl_connect(&addr, a->job, 5000, err, sizeof err);
    if (!c) { log_msg("%s", err); return DP_EXIT_BAD_JOB; }
    /* Heap, not stack: the config and the program are large. This process becomes the
     * program below, so they are never freed. */
    char *text = malloc(JOB_CONFIG_TEXT_MAX), *buf = malloc(sizeof ((JobConfig *)0)->program);
    JobConfig *cfg = malloc(sizeof *cfg);
    if (!text || !buf || !cfg) { log_msg("out of memory"); return DP_EXIT_BAD_JOB; }
    if (ctl_config_get(c, "config", text, JOB_CONFIG_TEXT_MAX) != 0) {
        log_msg("job '%s' not found in redis at %s:%d", a->job, addr.host, addr.port);
        ctl_close(c);
        return DP_EXIT_BAD_JOB;
    }
    if (ctl_launcher_alive(c) == 0) {
        log_msg("job '%s' has no launcher running (its launcher key expired): it ended or its launcher died", a->job);
        ctl_close(c);
        return DP_EXIT_BAD_JOB;
    }
    ctl_close(c);
    if (job_config_parse_lines(cfg, text, err, sizeof err) != 0) { log_msg("job config: %s", err); return DP_EXIT_BAD_JOB; }
    char *argv[1100];
    if (program_argv(cfg, self_exe, buf, sizeof cfg->program, argv, 1100) < 1) { log_msg("job has no program"); return DP_EXIT_BAD_JOB; }
    /* The password travels in its own variable, never in the URL nor on a command line. */
    char url[4200];
    redis_addr_format(&addr, url, sizeof url);
    WorkerArgs env = *a;
    env.redis_url = url;
    worker_env_set(&env);
    if (addr.password[0]) setenv(DP_ENV_PASSWORD, addr.password, 1);
    fflush(NULL);
    execvp(argv[0], argv);
    log_msg("cannot run %s: %s", argv[0], strerror(errno));
    return DP_EXIT_BAD_JOB;
}
