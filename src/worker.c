/* worker.c — one process's life: registration, role, heartbeat thread, training as a member
 * of an epoch, and what happens when a peer fails — wait for the coordinator's decision,
 * restore the rollback generation, rebuild the communicator, continue — or, as a spare,
 * waiting warm until a decision hands it a failed rank. */
#include "worker.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "comm.h"
#include "config.h"
#include "control.h"
#include "events.h"
#include "netns.h"
#include "recovery.h"
#include "replica.h"
#include "rng.h"
#include "snapshot.h"
#include "trainer.h"
#include "util.h"

#define MAX_REPLICAS 16

/* Exit statuses (worker.h). */
#define EXIT_DONE 0
#define EXIT_BAD_JOB 1
#define EXIT_FAILED 2
#define EXIT_STOPPED 3
#define EXIT_FENCED 4

typedef struct {
    redis_addr addr;
    const char *job;
    JobConfig cfg;
    int64_t t0_wall_ms;
    long proc_id;
    ctl_t *ctl;
    const char *bind_host;
    ReplicaServer *replicas; /* holds other ranks' snapshots; every process runs one */
    /* heartbeat thread */
    pthread_t hb_thread;
    atomic_int hb_stop;
    atomic_int job_over; /* the launcher set the job's state to stopping/done/failed */
    /* abort watcher thread: the coordinator closed our epoch, abandon the step in flight */
    pthread_t abort_thread;
    _Atomic int abort_step;
    _Atomic long cur_epoch;
} Proc;

/* Waits on the process's "abort" list; a value e+1 with e >= our epoch raises abort_step. */
static void *abort_watch_loop(void *arg) {
    Proc *p = arg;
    pthread_setname_np(pthread_self(), "dp-abort");
    char err[256];
    ctl_t *c = ctl_connect(&p->addr, p->job, 2000, err, sizeof err);
    if (!c) { log_msg("abort watcher: %s", err); return NULL; }
    while (!atomic_load(&p->hb_stop)) {
        long v = ctl_wait_notice(c, p->proc_id, "abort", 200);
        if (v < 0) sleep_ms(100);
        else if (v > 0 && v - 1 >= atomic_load(&p->cur_epoch)) atomic_store(&p->abort_step, 1);
    }
    ctl_close(c);
    return NULL;
}

static void *heartbeat_loop(void *arg) {
    Proc *p = arg;
    pthread_setname_np(pthread_self(), "dp-heartbeat");
    char err[256];
    ctl_t *c = ctl_connect(&p->addr, p->job, 2000, err, sizeof err);
    if (!c) { log_msg("heartbeat: %s", err); return NULL; }
    int period = p->cfg.detect_timeout_ms / 4, failing = 0;
    while (!atomic_load(&p->hb_stop)) {
        int ok = ctl_heartbeat(c, p->proc_id, p->cfg.detect_timeout_ms) == 0;
        if (!ok && !failing) log_msg("heartbeat failed: %s", ctl_last_error(c));
        if (ok && failing) log_msg("heartbeat restored");
        failing = !ok;
        char state[32];
        if (ctl_state_get(c, state, sizeof state) == 0 && strcmp(state, "running") != 0)
            atomic_store(&p->job_over, 1);
        sleep_ms(period > 0 ? period : 1);
    }
    ctl_close(c);
    return NULL;
}

static int read_job(Proc *p, char *err, size_t errlen) {
    static char text[65536];
    if (ctl_config_get(p->ctl, "config", text, sizeof text) != 0) {
        snprintf(err, errlen, "job '%s' not found in redis (no config): %s", p->job, ctl_last_error(p->ctl));
        return -1;
    }
    if (job_config_parse_lines(&p->cfg, text, err, errlen) != 0) return -1;
    char t0[32];
    if (ctl_config_get(p->ctl, "t0_ms", t0, sizeof t0) != 0) { snprintf(err, errlen, "job has no start time"); return -1; }
    p->t0_wall_ms = strtoll(t0, NULL, 10);
    return 0;
}

/* Claims the requested rank, or the first free one. Returns the rank, -1 if none is free. */
static int claim_rank(Proc *p, int wanted) {
    if (wanted >= 0) return ctl_claim_rank(p->ctl, wanted, p->proc_id) == 1 ? wanted : -1;
    for (int r = 0; r < p->cfg.workers; r++)
        if (ctl_claim_rank(p->ctl, r, p->proc_id) == 1) return r;
    return -1;
}


/* Everything a process needs while it is a member of an epoch. */
typedef struct Member Member;

/* What the snapshot thread needs to publish a commit and persist it. */
typedef struct {
    Member *m;
    ctl_t *ctl; /* the snapshot thread's own connection */
} CommitCtx;

struct Member {
    Proc *p;
    Trainer *t;
    int rank;
    long epoch;
    comm_t *comm;
    Snapshot *snap;
    Snapshot *restore_src; /* a previous epoch's snapshots, kept until the next epoch commits */
    CommitCtx ctx;
    char holders[1024]; /* this epoch's replica holders of my rank: "proc@host:port,..." */
};

static char job_config_text[65536];

static void report_error(Proc *p, int rank, const char *what, const char *err) {
    char esc[2048];
    log_msg("%s%s", what, err);
    json_escape(err, esc, sizeof esc);
    event_emit(p->ctl, p->t0_wall_ms, "error", "\"rank\":%d,\"message\":\"%s\"", rank, esc);
}

/* --- persistence --------------------------------------------------------------------- */

/* Writes this rank's committed state to disk; the last rank to do so completes the checkpoint. */
static void persist_generation(CommitCtx *c, const SnapHeader *h, const void *payload) {
    Proc *p = c->m->p;
    char err[1024], counter[64];
    SnapRegion all = {payload, h->length};
    if (checkpoint_write_shard(p->cfg.out, h, &all, 1, err, sizeof err) != 0) {
        log_msg("persist step %lld: %s", (long long)h->step + 1, err);
        return;
    }
    snprintf(counter, sizeof counter, "persisted:%lld", (long long)h->step);
    if (ctl_counter_incr(c->ctl, counter) != p->cfg.workers) return;
    if (checkpoint_finish(p->cfg.out, h->step, p->cfg.workers, trainer_model_config(c->m->t), job_config_text, err,
                          sizeof err) != 0) {
        log_msg("persist step %lld: %s", (long long)h->step + 1, err);
        return;
    }
    event_emit(c->ctl, p->t0_wall_ms, "checkpoint", "\"step\":%lld,\"kind\":\"persist\"", (long long)h->step + 1);
}

static void on_commit(const SnapHeader *h, const void *payload, void *arg) {
    CommitCtx *c = arg;
    ctl_committed_set(c->ctl, h->epoch, h->rank, h->step);
    int every = c->m->p->cfg.persist_every;
    if (every > 0 && (h->step + 1) % every == 0) persist_generation(c, h, payload);
}

/* --ft disk: every rank writes its live state, then rank 0 completes the checkpoint. */
static comm_status disk_checkpoint(Member *m, int step) {
    Proc *p = m->p;
    char err[1024];
    SnapRegion regions[4];
    int n = trainer_state_regions(m->t, regions);
    if (checkpoint_write_live(p->cfg.out, p->job, m->epoch, m->rank, p->cfg.workers, step, regions, n, err, sizeof err) != 0)
        log_msg("checkpoint step %d: %s", step + 1, err);
    comm_status st = comm_barrier(m->comm, job_comm_timeout_ms(&p->cfg));
    if (st != COMM_OK || m->rank != 0) return st;
    if (checkpoint_finish(p->cfg.out, step, p->cfg.workers, trainer_model_config(m->t), job_config_text, err, sizeof err) != 0)
        log_msg("checkpoint step %d: %s", step + 1, err);
    else
        event_emit(p->ctl, p->t0_wall_ms, "checkpoint", "\"step\":%d,\"kind\":\"disk\"", step + 1);
    return COMM_OK;
}

/* --- replica placement ---------------------------------------------------------------- */

/* Reads the replica server address of proc into t. 0 / -1. */
static int holder_address(Proc *p, long proc, ReplicaTarget *t, char *host, size_t hostlen) {
    char addr[300];
    if (ctl_proc_get(p->ctl, proc, "replica", addr, sizeof addr) != 0) return -1;
    char *colon = strrchr(addr, ':');
    if (!colon) return -1;
    *colon = 0;
    snprintf(t->host, sizeof t->host, "%.255s", addr);
    t->port = atoi(colon + 1);
    if (ctl_proc_get(p->ctl, proc, "host", host, hostlen) != 0) host[0] = 0;
    return 0;
}

/* Ring buddies rank+1, rank+2, ... preferring holders on another host than ours. */
static int ring_holders(Member *m, int want, ReplicaTarget *out, long *procs) {
    Proc *p = m->p;
    char my_host[256] = "", host[256];
    gethostname(my_host, sizeof my_host - 1);
    int n = 0;
    for (int pass = 0; pass < 2 && n < want; pass++) {
        for (int j = 1; j < p->cfg.workers && n < want; j++) {
            int r = (m->rank + j) % p->cfg.workers;
            long proc = ctl_rank_owner(p->ctl, r);
            ReplicaTarget t;
            if (proc <= 0 || holder_address(p, proc, &t, host, sizeof host) != 0) continue;
            int other_host = strcmp(host, my_host) != 0;
            if (other_host == (pass == 0)) { procs[n] = proc; out[n++] = t; }
        }
    }
    return n;
}

/* Spares (sorted by process id) rank, rank+1, ... mod S; waits for enough spares to register. */
static int spare_holders(Member *m, int want, ReplicaTarget *out, long *procs) {
    Proc *p = m->p;
    long ids[4096];
    int n = 0;
    double deadline = now_ms() + p->cfg.start_timeout_ms;
    while ((n = ctl_spare_list(p->ctl, ids, 4096)) < want && now_ms() < deadline) sleep_ms(10);
    if (n < want) return -1;
    char host[256];
    for (int j = 0; j < want; j++) {
        procs[j] = ids[(m->rank + j) % n];
        if (holder_address(p, procs[j], &out[j], host, sizeof host) != 0) return -1;
    }
    return want;
}

static int start_snapshots(Member *m, char *err, size_t errlen) {
    Proc *p = m->p;
    ReplicaTarget targets[MAX_REPLICAS];
    long procs[MAX_REPLICAS];
    int want = p->cfg.replicas, n;
    if (!strcmp(p->cfg.replica_placement, "spares")) {
        n = spare_holders(m, want, targets, procs);
        if (n < 0) { snprintf(err, errlen, "--replica-placement spares: fewer than %d spares registered", want); return -1; }
    } else {
        if (want > p->cfg.workers - 1) want = p->cfg.workers - 1;
        n = ring_holders(m, want, targets, procs);
        if (n < want) { snprintf(err, errlen, "only %d of %d ring replica holders are registered", n, want); return -1; }
    }
    if (m->rank == 0 && m->epoch == 0 && n < p->cfg.replicas)
        log_msg("%d worker(s): %d replica(s) per rank instead of %d", p->cfg.workers, n, p->cfg.replicas);
    size_t used = 0;
    m->holders[0] = 0;
    for (int i = 0; i < n && used < sizeof m->holders; i++)
        used += (size_t)snprintf(m->holders + used, sizeof m->holders - used, "%s%ld@%s:%d", i ? "," : "", procs[i],
                                 targets[i].host, targets[i].port);
    holders_record(p->ctl, m->epoch, m->rank, m->holders);
    if (!m->ctx.ctl) m->ctx.ctl = ctl_connect(&p->addr, p->job, 5000, err, errlen);
    if (!m->ctx.ctl) return -1;
    m->ctx.m = m;
    SnapRegion regions[4];
    int nregions = trainer_state_regions(m->t, regions);
    SnapshotConfig sc = {.job = p->job, .epoch = m->epoch, .rank = m->rank, .world = p->cfg.workers,
                         .regions = regions, .nregions = nregions, .targets = targets, .ntargets = n,
                         .timeout_ms = job_comm_timeout_ms(&p->cfg),
                         .allow_pull = !strcmp(p->cfg.replica_transport, "auto"), .on_commit = on_commit, .arg = &m->ctx};
    m->snap = snapshot_create(&sc, err, errlen);
    if (!m->snap) return -1;
    trainer_attach_snapshot(m->t, m->snap);
    return 0;
}

/* --- fault injection ------------------------------------------------------------------ */

static void fire_fault(Member *m, const char *kind, int step) {
    Proc *p = m->p;
    char value[128];
    snprintf(value, sizeof value, "%s:%d:%lld", kind, m->rank, (long long)wall_ms());
    ctl_set(p->ctl, "fault:last", value); /* the failure time, for total_ms */
    event_emit(p->ctl, p->t0_wall_ms, "fault_injected", "\"kind\":\"%s\",\"rank\":%d,\"step\":%d,\"pid\":%d", kind,
               m->rank, step + 1, (int)getpid());
    log_msg("injecting %s at step %d", kind, step + 1);
    if (!strcmp(kind, "kill")) raise(SIGKILL);
    else if (!strcmp(kind, "stop")) raise(SIGSTOP);
    else if (!strcmp(kind, "netdown")) netns_cut_own_link();
}

/* Faults from --inject and --chaos fire once each, even when the step is re-run after a
 * rollback (SET NX in Redis). They fire mid-step, after the forward/backward (the trainer's
 * mid-step hook): where a real failure most likely strikes. */
static void maybe_inject(void *arg, int step) {
    Member *m = arg;
    Proc *p = m->p;
    const char *at = p->cfg.inject;
    for (int i = 0; *at; i++) {
        char kind[16], key[64];
        int rank, when, n = 0;
        if (sscanf(at, "%15[a-z]:%d@%d%n", kind, &rank, &when, &n) != 3) break;
        at += n + (at[n] == ',');
        snprintf(key, sizeof key, "injected:%d", i);
        if (strcmp(kind, "rkill") != 0 && rank == m->rank && when == step + 1 && ctl_set_nx(p->ctl, key, "1") == 1)
            fire_fault(m, kind, step);
    }
    if (p->cfg.chaos > 0.0f) {
        uint64_t h = rng_hash4(p->cfg.seed, (uint64_t)step, 0xC4A05ULL, 0);
        double u = (double)(h >> 11) / 9007199254740992.0;
        char key[64];
        snprintf(key, sizeof key, "chaos:%d", step);
        if (u < p->cfg.chaos && (int)((h >> 3) % (uint64_t)p->cfg.workers) == m->rank && step > 0 &&
            ctl_set_nx(p->ctl, key, "1") == 1)
            fire_fault(m, (h >> 40) & 1 ? "stop" : "kill", step);
    }
}

/* "rkill:RANK@EPOCH": the process taking RANK dies while it recovers into EPOCH (a failure
 * during recovery). */
static void maybe_inject_in_recovery(Member *m) {
    const char *at = m->p->cfg.inject;
    for (int i = 0; *at; i++) {
        char kind[16], key[64];
        int rank, epoch, n = 0;
        if (sscanf(at, "%15[a-z]:%d@%d%n", kind, &rank, &epoch, &n) != 3) break;
        at += n + (at[n] == ',');
        snprintf(key, sizeof key, "injected:%d", i);
        if (!strcmp(kind, "rkill") && rank == m->rank && epoch == m->epoch && ctl_set_nx(m->p->ctl, key, "1") == 1)
            fire_fault(m, "kill", -1);
    }
}

/* --- training ------------------------------------------------------------------------- */

/* committed: newest step (1-based) that every rank can restore, 0 if none. */
static void push_metrics(Member *m, const StepStats *s, long long committed) {
    Proc *p = m->p;
    char json[640];
    snprintf(json, sizeof json,
             "{\"step\":%d,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,\"step_ms\":%.3f,"
             "\"tokens_per_s\":%.1f,\"epoch\":%ld,\"committed_step\":%lld,\"snapshot_wait_ms\":%.3f,\"t\":%.3f}",
             s->step + 1, s->loss, s->lr, s->grad_norm, s->step_ms, s->tokens_per_s, m->epoch, committed,
             s->snapshot_wait_ms, (double)(wall_ms() - p->t0_wall_ms) / 1e3);
    ctl_push_metric(p->ctl, json);
}

static long long committed_step(Member *m, int last_disk_step) {
    if (m->snap) {
        long long c = ctl_committed_min(m->p->ctl, m->epoch, m->p->cfg.workers);
        return c >= 0 ? c + 1 : 0;
    }
    return last_disk_step;
}

static void report_recovery(Member *m);

static int epoch_closed(void *arg) {
    Member *m = arg;
    return epoch_fenced(m->p->ctl, m->epoch) == 1;
}

/* Trains until the last step (EXIT_DONE), a stop request (EXIT_STOPPED), or a failure
 * (EXIT_FAILED: the caller recovers). */
static int train_loop(Member *m) {
    Proc *p = m->p;
    char esc[2048];
    int disk = !strcmp(p->cfg.ft, "disk");
    int last_disk_step = 0, first = 1;
    for (int step = trainer_first_step(m->t); step < p->cfg.steps; step++) {
        if (atomic_load(&p->job_over)) return EXIT_STOPPED;
        double t0 = now_ms();
        StepStats s;
        train_status ts = trainer_step(m->t, m->comm, step, &s);
        comm_status st = COMM_OK;
        if (ts == TRAIN_OK && disk && (step + 1) % p->cfg.ckpt_every == 0) {
            st = disk_checkpoint(m, step);
            last_disk_step = step + 1;
            /* A synchronous checkpoint is part of the step it follows. */
            double ms = now_ms() - t0;
            s.tokens_per_s *= s.step_ms / ms;
            s.step_ms = ms;
        }
        if (ts == TRAIN_FENCED) {
            log_msg("step %d abandoned: epoch %ld was closed after a failure", step + 1, m->epoch);
            return EXIT_FAILED;
        }
        if (ts != TRAIN_OK || st != COMM_OK) {
            const char *what = ts == TRAIN_SNAPSHOT ? "replication of the previous snapshot failed" : comm_last_error(m->comm);
            log_msg("step %d: %s", step + 1, what);
            json_escape(what, esc, sizeof esc);
            event_emit(p->ctl, p->t0_wall_ms, "comm_failure", "\"rank\":%d,\"step\":%d,\"epoch\":%ld,\"message\":\"%s\"",
                       m->rank, step + 1, m->epoch, esc);
            return EXIT_FAILED;
        }
        if (m->rank == 0) {
            push_metrics(m, &s, committed_step(m, last_disk_step));
            if (first && m->epoch > 0) report_recovery(m);
        }
        if (first && m->restore_src) { /* the new epoch has committed its restore point */
            snapshot_abandon(m->restore_src);
            m->restore_src = NULL;
        }
        first = 0;
    }
    return EXIT_DONE;
}

static void report_snapshot_stats(Member *m) {
    SnapshotStats st;
    snapshot_stats(m->snap, &st);
    event_emit(m->p->ctl, m->p->t0_wall_ms, "snapshot_stats",
               "\"rank\":%d,\"epoch\":%ld,\"captures\":%llu,\"commits\":%llu,\"failures\":%llu,\"waits\":%llu,"
               "\"wait_ms_total\":%.3f,\"bytes_copied\":%llu,\"bytes_replicated\":%llu,\"copy_ms_mean\":%.3f,"
               "\"replicate_ms_mean\":%.3f,\"bytes_pulled\":%llu,\"cpu_ms\":%.1f,\"holder_cpu_ms\":%.1f,"
               "\"warmup_ms\":%.1f,\"warmup_cpu_ms\":%.1f",
               m->rank, m->epoch, (unsigned long long)st.captures, (unsigned long long)st.commits,
               (unsigned long long)st.failures, (unsigned long long)st.waits, st.wait_ms_total,
               (unsigned long long)st.bytes_copied, (unsigned long long)st.bytes_replicated,
               st.captures ? st.copy_ms_total / st.captures : 0.0, st.captures ? st.replicate_ms_total / st.captures : 0.0,
               (unsigned long long)st.bytes_pulled, st.cpu_ms_total, replica_server_cpu_ms(m->p->replicas), st.warmup_ms,
               st.warmup_cpu_ms);
}

/* --- membership: joining an epoch, recovering from a failure --------------------------- */

/* Fetches rank's generation `step` from any holder recorded in recent epochs. 0 / -1. */
static int fetch_from_holders(Member *m, int rank, long long step, SnapHeader *h, void **payload) {
    Proc *p = m->p;
    for (long e = m->epoch - 1; e >= 0 && e >= m->epoch - 4; e--) {
        char list[1024];
        if (holders_read(p->ctl, e, rank, list, sizeof list) != 0) continue;
        for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
            char *at = strchr(tok, '@'), *colon = strrchr(tok, ':');
            if (!at || !colon) continue;
            *colon = 0;
            char err[256];
            ReplicaConn *c = replica_connect(at + 1, atoi(colon + 1), 1000, 0, err, sizeof err);
            if (!c) continue;
            replica_status st = replica_get(c, p->job, rank, step, h, payload, job_comm_timeout_ms(&p->cfg));
            replica_close(c);
            if (st == REPLICA_OK && h->step == step) return 0;
            if (st == REPLICA_OK) { free(*payload); *payload = NULL; }
        }
    }
    return -1;
}

static int restore_in_place(const SnapHeader *h, const void *payload, void *arg) {
    Member *m = arg;
    char err[256];
    if (trainer_restore(m->t, h, payload, err, sizeof err) == 0) return 0;
    log_msg("local copy of step %lld unusable: %s", (long long)h->step + 1, err);
    return -1;
}

/* Puts this rank's shard at generation `rollback`: from our own ping-pong buffer, else from a
 * replica holder, else (the resumed checkpoint) from disk; -1 means the initial state. */
static int restore_generation(Member *m, Snapshot *old, long long rollback, char *err, size_t errlen) {
    if (rollback < 0) {
        trainer_reinit(m->t);
        return 0;
    }
    SnapHeader h;
    void *payload = NULL;
    if (old && snapshot_local_use(old, rollback, restore_in_place, m) == 0) return 0;
    int found = fetch_from_holders(m, m->rank, rollback, &h, &payload) == 0;
    if (!found && rollback == m->p->cfg.resume_step)
        found = checkpoint_read_shard(m->p->cfg.resume, rollback, m->rank, &h, &payload, err, errlen) == 0;
    if (!found) {
        snprintf(err, errlen, "no copy of rank %d's state at step %lld is reachable", m->rank, rollback + 1);
        return -1;
    }
    int rc = trainer_restore(m->t, &h, payload, err, errlen);
    free(payload);
    return rc;
}

static int join_communicator(Member *m, int timeout_ms, char *err, size_t errlen) {
    Proc *p = m->p;
    char prefix[256], fence[256];
    snprintf(prefix, sizeof prefix, "dp:%s:e%ld:gloo", p->job, m->epoch);
    snprintf(fence, sizeof fence, "dp:%s:e%ld:fenced", p->job, m->epoch); /* see fence_epoch */
    comm_store_addr store = {p->addr.host, p->addr.port, p->addr.password[0] ? p->addr.password : NULL, fence};
    m->comm = comm_create(&store, prefix, m->rank, p->cfg.workers, p->bind_host, timeout_ms, err, errlen);
    return m->comm ? 0 : -1;
}

/* Becomes rank `d`-says of epoch d->epoch: restore, rebuild, resnapshot. 0, or -1 + err. */
static int join_epoch(Member *m, const Decision *d, char *err, size_t errlen) {
    Proc *p = m->p;
    double t0 = now_ms();
    /* The old snapshots stay until the new epoch has committed its restore point: if this
     * join fails, they are still the only local copy. */
    if (m->snap) {
        snapshot_abandon(m->restore_src);
        m->restore_src = m->snap;
        m->snap = NULL;
    }
    trainer_attach_snapshot(m->t, NULL);
    atomic_store(&p->cur_epoch, d->epoch);
    atomic_store(&p->abort_step, 0);
    m->epoch = d->epoch;
    m->rank = decision_rank_of(d, p->proc_id);
    trainer_set_rank(m->t, m->rank);
    replica_server_set_min_epoch(p->replicas, d->epoch);
    if (restore_generation(m, m->restore_src, d->rollback, err, errlen) != 0) return -1;
    log_msg("restored step %lld in %.1f ms", d->rollback + 1, now_ms() - t0);
    maybe_inject_in_recovery(m);
    double t1 = now_ms();
    /* Everyone is warm and restores in parallel: if a member does not show up within this
     * bound it died during recovery, and the coordinator will decide again. */
    int join_timeout = 2 * p->cfg.detect_timeout_ms + 3000;
    if (join_communicator(m, join_timeout, err, errlen) != 0) return -1;
    if (trainer_sync_params(m->t, m->comm) != COMM_OK) {
        snprintf(err, errlen, "rebuilding the parameters failed: %s", comm_last_error(m->comm));
        return -1;
    }
    double t2 = now_ms();
    if (!strcmp(p->cfg.ft, "deadpool")) {
        if (start_snapshots(m, err, errlen) != 0) return -1;
        /* The restore point is snapshotted again in the new epoch; the first step waits for
         * its commit before reducing (as every step does), so this overlaps with that step's
         * forward/backward. Until then the old buffers stay as a second copy. */
        if (d->rollback >= 0) snapshot_capture(m->snap, d->rollback);
    }
    char key[64], value[128];
    snprintf(key, sizeof key, "e%ld:timing:%d", m->epoch, m->rank);
    snprintf(value, sizeof value, "%.3f %.3f %.3f %lld", t1 - t0, t2 - t1, now_ms() - t2, (long long)wall_ms());
    ctl_set(p->ctl, key, value);
    return 0;
}

/* Rank 0 of a new epoch, after its first step: one `recovered` event with the timeline. */
static void report_recovery(Member *m) {
    Proc *p = m->p;
    Decision d;
    if (decision_read(p->ctl, m->epoch, &d) != 0) return;
    /* The slowest member sets each phase; training resumed when the last member did. */
    double restore = 0, rebuild = 0, resnap = 0;
    long long resumed = 0;
    for (int r = 0; r < p->cfg.workers; r++) {
        char key[64], value[128];
        double a, b, c;
        long long w;
        snprintf(key, sizeof key, "e%ld:timing:%d", m->epoch, r);
        if (ctl_get(p->ctl, key, value, sizeof value) == 0 && sscanf(value, "%lf %lf %lf %lld", &a, &b, &c, &w) == 4) {
            if (a > restore) restore = a;
            if (b > rebuild) rebuild = b;
            if (c > resnap) resnap = c;
            if (w > resumed) resumed = w;
        }
    }
    char last[32] = "0";
    ctl_get(p->ctl, "last_step", last, sizeof last);
    long long total = resumed - d.t_fail_ms, first_step = wall_ms() - d.t_fail_ms;
    for (int i = 0; i < d.nfailed; i++) {
        event_emit(p->ctl, p->t0_wall_ms, "recovered",
                   "\"epoch\":%ld,\"rank\":%d,\"spare\":%ld,\"failure_kind\":\"%s\",\"rollback_step\":%lld,"
                   "\"detect_ms\":%lld,\"decide_ms\":%lld,\"restore_ms\":%.1f,\"rebuild_ms\":%.1f,\"resnapshot_ms\":%.1f,"
                   "\"total_ms\":%lld,\"first_step_done_ms\":%lld,\"steps_recomputed\":%lld",
                   m->epoch, d.failed[i].rank, d.failed[i].spare_proc, d.failed[i].kind, d.rollback + 1,
                   (long long)(d.t_detect_ms - d.t_fail_ms), (long long)(d.t_decide_ms - d.t_detect_ms), restore, rebuild,
                   resnap, total, first_step, atoll(last) - (d.rollback + 1));
        printf("[deadpool] recovered rank %d (%s) with spare %ld: training resumed %lld ms after the failure, "
               "rolled back to step %lld\n", d.failed[i].rank, d.failed[i].kind, d.failed[i].spare_proc, total,
               d.rollback + 1);
    }
    if (d.nfailed == 0)
        event_emit(p->ctl, p->t0_wall_ms, "recovered",
                   "\"epoch\":%ld,\"rank\":-1,\"failure_kind\":\"comm\",\"rollback_step\":%lld,\"total_ms\":%lld",
                   m->epoch, d.rollback + 1, total);
}

/* The coordinator found no spare: write our committed generation to disk so the job can be
 * resumed even if none ever comes. Once per request. */
static void answer_persist_request(Member *m, int *done) {
    char req[64];
    long e;
    long long g;
    if (*done || ctl_get(m->p->ctl, "persist:req", req, sizeof req) != 0 || sscanf(req, "%ld:%lld", &e, &g) != 2 ||
        e != m->epoch || g < 0)
        return;
    *done = 1;
    SnapHeader h;
    void *payload = NULL;
    if (!m->snap || snapshot_local_copy(m->snap, g, &h, &payload) != 0) {
        log_msg("cannot persist step %lld: not in the local snapshot buffers", g + 1);
        return;
    }
    CommitCtx ctx = {.m = m, .ctl = m->p->ctl};
    persist_generation(&ctx, &h, payload);
    free(payload);
}

/* Waits (bounded) for a decision newer than the member's epoch. The decision's epoch, 0 when
 * the job ended, -1 on timeout. */
static long wait_for_decision(Member *m, int timeout_ms) {
    Proc *p = m->p;
    double deadline = now_ms() + timeout_ms;
    int persisted = 0;
    while (now_ms() < deadline) {
        if (atomic_load(&p->job_over)) return 0;
        long e = ctl_epoch(p->ctl);
        if (e > m->epoch) return e;
        answer_persist_request(m, &persisted);
        if (ctl_wait_notice(p->ctl, p->proc_id, "notice", 100) < 0) sleep_ms(100); /* Redis unreachable */
    }
    return -1;
}

/* Runs as a member until the job ends; recovers from failures of other members. */
static int member_run(Member *m, Decision *first) {
    Proc *p = m->p;
    char err[1024], role[32];
    int rc;
    for (;;) {
        snprintf(role, sizeof role, "rank %d", m->rank);
        log_set_role(role);
        if (first) {
            if (join_epoch(m, first, err, sizeof err) != 0) {
                /* Usually a member died while recovering; the coordinator decides again. */
                char esc[2048];
                log_msg("joining epoch %ld failed: %s", m->epoch, err);
                json_escape(err, esc, sizeof esc);
                event_emit(p->ctl, p->t0_wall_ms, "join_failed", "\"rank\":%d,\"epoch\":%ld,\"message\":\"%s\"",
                           m->rank, m->epoch, esc);
                rc = EXIT_FAILED;
            } else {
                rc = train_loop(m);
            }
            first = NULL;
        } else {
            rc = train_loop(m);
        }
        if (rc != EXIT_FAILED) break;
        comm_destroy(m->comm);
        m->comm = NULL;
        long e = wait_for_decision(m, p->cfg.spare_wait * 1000 + 4 * p->cfg.detect_timeout_ms + 30000);
        if (e == 0) { rc = EXIT_STOPPED; break; }
        static Decision d;
        if (e < 0 || decision_read(p->ctl, e, &d) != 0) {
            log_msg("no recovery decision arrived: giving up");
            break;
        }
        if (decision_rank_of(&d, p->proc_id) < 0) {
            log_msg("fenced: epoch %ld no longer includes this process; leaving", e);
            event_emit(p->ctl, p->t0_wall_ms, "fenced", "\"proc\":%ld,\"pid\":%d,\"epoch\":%ld", p->proc_id,
                       (int)getpid(), e);
            rc = EXIT_FENCED;
            break;
        }
        first = &d;
    }
    if (rc == EXIT_DONE && m->rank == 0) {
        char path[1200];
        snprintf(path, sizeof path, "%s/model.bin", p->cfg.out);
        if (trainer_save_model(m->t, path, err, sizeof err) != 0) {
            report_error(p, 0, "", err);
            rc = EXIT_FAILED;
        } else {
            char esc[2048];
            json_escape(path, esc, sizeof esc);
            event_emit(p->ctl, p->t0_wall_ms, "model_saved", "\"path\":\"%s\"", esc);
        }
    }
    if (m->snap) {
        snapshot_drain(m->snap, job_comm_timeout_ms(&p->cfg));
        report_snapshot_stats(m);
        /* Every rank's last replication is done before anyone closes its replica server. */
        if (rc == EXIT_DONE) comm_barrier(m->comm, job_comm_timeout_ms(&p->cfg));
        snapshot_destroy(m->snap);
    }
    snapshot_abandon(m->restore_src);
    if (m->ctx.ctl) ctl_close(m->ctx.ctl);
    comm_destroy(m->comm);
    return rc;
}

static int run_initial_member(Proc *p, int rank) {
    char err[1024];
    Member m = {.p = p, .rank = rank};
    log_set_role("rank");
    m.t = trainer_create(&p->cfg, rank, p->cfg.workers, err, sizeof err);
    if (!m.t) { report_error(p, rank, "", err); return EXIT_BAD_JOB; }
    trainer_set_fence_check(m.t, epoch_closed, &m);
    trainer_set_abort_flag(m.t, &p->abort_step);
    trainer_set_mid_step_hook(m.t, maybe_inject, &m);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    event_emit(p->ctl, p->t0_wall_ms, "rank_joined", "\"rank\":%d,\"proc\":%ld,\"pid\":%d,\"host\":\"%s\"",
               rank, p->proc_id, (int)getpid(), host);
    m.epoch = 0;
    int rc = EXIT_DONE;
    if (join_communicator(&m, p->cfg.start_timeout_ms, err, sizeof err) != 0) {
        report_error(p, rank, "joining the communicator failed: ", err);
        rc = EXIT_FAILED;
    } else if (!strcmp(p->cfg.ft, "deadpool") && start_snapshots(&m, err, sizeof err) != 0) {
        report_error(p, rank, "snapshots: ", err);
        rc = EXIT_BAD_JOB;
    }
    if (rc == EXIT_DONE) rc = member_run(&m, NULL);
    else comm_destroy(m.comm);
    trainer_free(m.t);
    return rc;
}

/* A spare builds its trainer up front (warm), then waits for a decision that names it. */
static int run_spare(Proc *p) {
    char err[1024];
    log_set_role("spare");
    Member m = {.p = p, .rank = -1};
    m.t = trainer_create(&p->cfg, 0, p->cfg.workers, err, sizeof err);
    if (!m.t) { report_error(p, -1, "spare: ", err); return EXIT_BAD_JOB; }
    trainer_set_fence_check(m.t, epoch_closed, &m);
    trainer_set_abort_flag(m.t, &p->abort_step);
    trainer_set_mid_step_hook(m.t, maybe_inject, &m);
    if (ctl_spare_add(p->ctl, p->proc_id) != 0) {
        log_msg("cannot join the spare pool: %s", ctl_last_error(p->ctl));
        trainer_free(m.t);
        return EXIT_BAD_JOB;
    }
    event_emit(p->ctl, p->t0_wall_ms, "spare_joined", "\"proc\":%ld,\"pid\":%d", p->proc_id, (int)getpid());
    int rc = EXIT_DONE;
    long seen = ctl_epoch(p->ctl);
    while (!atomic_load(&p->job_over)) {
        ctl_wait_notice(p->ctl, p->proc_id, "notice", 100);
        long e = ctl_epoch(p->ctl);
        if (e <= seen) continue;
        seen = e;
        static Decision d;
        if (decision_read(p->ctl, e, &d) != 0 || decision_rank_of(&d, p->proc_id) < 0) continue;
        log_msg("taking over rank %d in epoch %ld", decision_rank_of(&d, p->proc_id), e);
        m.rank = decision_rank_of(&d, p->proc_id);
        rc = member_run(&m, &d);
        break;
    }
    ctl_spare_remove(p->ctl, p->proc_id);
    trainer_free(m.t);
    return rc;
}

/* Every process holds replicas: start the server and tell the job where it is. */
static int start_replica_server(Proc *p, char *err, size_t errlen) {
    p->replicas = replica_server_start(p->bind_host, 0, p->job, err, errlen);
    if (!p->replicas) return -1;
    char addr[300], host[256] = "", pid[32];
    snprintf(addr, sizeof addr, "%s:%d", p->bind_host, replica_server_port(p->replicas));
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    gethostname(host, sizeof host - 1);
    if (ctl_proc_set(p->ctl, p->proc_id, "replica", addr) != 0 || ctl_proc_set(p->ctl, p->proc_id, "host", host) != 0 ||
        ctl_proc_set(p->ctl, p->proc_id, "pid", pid) != 0) {
        snprintf(err, errlen, "registering the replica server failed: %s", ctl_last_error(p->ctl));
        return -1;
    }
    return 0;
}

int worker_main(const WorkerArgs *a) {
    signal(SIGPIPE, SIG_IGN);
    Proc p;
    memset(&p, 0, sizeof p);
    p.job = a->job;
    p.bind_host = a->bind_host;
    char err[1024];
    if (redis_addr_parse(a->redis_url, &p.addr, err, sizeof err) != 0) { log_msg("%s", err); return EXIT_BAD_JOB; }
    p.ctl = ctl_connect(&p.addr, a->job, 5000, err, sizeof err);
    if (!p.ctl) { log_msg("%s", err); return EXIT_BAD_JOB; }
    if (read_job(&p, err, sizeof err) != 0) { log_msg("%s", err); ctl_close(p.ctl); return EXIT_BAD_JOB; }
    job_config_serialize(&p.cfg, job_config_text, sizeof job_config_text);
    p.proc_id = ctl_new_proc_id(p.ctl);
    if (p.proc_id < 0) { log_msg("registration failed: %s", ctl_last_error(p.ctl)); ctl_close(p.ctl); return EXIT_BAD_JOB; }
    if (start_replica_server(&p, err, sizeof err) != 0) { log_msg("%s", err); ctl_close(p.ctl); return EXIT_BAD_JOB; }
    ctl_heartbeat(p.ctl, p.proc_id, p.cfg.detect_timeout_ms);
    pthread_create(&p.hb_thread, NULL, heartbeat_loop, &p);
    pthread_create(&p.abort_thread, NULL, abort_watch_loop, &p);

    int rank = a->spare ? -1 : claim_rank(&p, a->rank);
    if (!a->spare && a->rank >= 0 && rank < 0) log_msg("rank %d is taken; joining as a spare", a->rank);
    int rc = rank >= 0 ? run_initial_member(&p, rank) : run_spare(&p);

    atomic_store(&p.hb_stop, 1);
    pthread_join(p.hb_thread, NULL);
    pthread_join(p.abort_thread, NULL);
    replica_server_stop(p.replicas);
    ctl_close(p.ctl);
    return rc;
}
