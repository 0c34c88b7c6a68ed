/* worker.c — process lifecycle: registration, role, heartbeat thread, spare wait, training. */
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
#include "replica.h"
#include "snapshot.h"
#include "trainer.h"
#include "util.h"

#define MAX_REPLICAS 16

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
} Proc;

static void *heartbeat_loop(void *arg) {
    Proc *p = arg;
    char err[256];
    ctl_t *c = ctl_connect(&p->addr, p->job, 2000, err, sizeof err);
    if (!c) { log_msg("heartbeat: %s", err); return NULL; }
    int period = p->cfg.heartbeat_ttl_ms / 3;
    while (!atomic_load(&p->hb_stop)) {
        if (ctl_heartbeat(c, p->proc_id, p->cfg.heartbeat_ttl_ms) != 0)
            log_msg("heartbeat failed: %s", ctl_last_error(c));
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

static int run_spare(Proc *p) {
    log_set_role("spare");
    if (ctl_spare_add(p->ctl, p->proc_id) != 0) { log_msg("cannot join the spare pool: %s", ctl_last_error(p->ctl)); return 1; }
    event_emit(p->ctl, p->t0_wall_ms, "spare_joined", "\"proc\":%ld,\"pid\":%d", p->proc_id, (int)getpid());
    while (!atomic_load(&p->job_over)) sleep_ms(20);
    ctl_spare_remove(p->ctl, p->proc_id);
    return 0;
}

/* committed: newest step (1-based) that every rank can restore, 0 if none. */
static void push_metrics(Proc *p, const StepStats *s, long epoch, long long committed) {
    char json[640];
    snprintf(json, sizeof json,
             "{\"step\":%d,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,\"step_ms\":%.3f,"
             "\"tokens_per_s\":%.1f,\"epoch\":%ld,\"committed_step\":%lld,\"snapshot_wait_ms\":%.3f,\"t\":%.3f}",
             s->step + 1, s->loss, s->lr, s->grad_norm, s->step_ms, s->tokens_per_s, epoch, committed,
             s->snapshot_wait_ms, (double)(wall_ms() - p->t0_wall_ms) / 1e3);
    ctl_push_metric(p->ctl, json);
}

static int save_final_model(Proc *p, Trainer *t) {
    char path[1200], err[1024], esc[2048];
    snprintf(path, sizeof path, "%s/model.bin", p->cfg.out);
    if (trainer_save_model(t, path, err, sizeof err) != 0) {
        json_escape(err, esc, sizeof esc);
        event_emit(p->ctl, p->t0_wall_ms, "error", "\"rank\":0,\"message\":\"%s\"", esc);
        log_msg("%s", err);
        return 1;
    }
    json_escape(path, esc, sizeof esc);
    event_emit(p->ctl, p->t0_wall_ms, "model_saved", "\"path\":\"%s\"", esc);
    return 0;
}

/* What the snapshot thread needs to publish a commit and persist it. */
typedef struct {
    Proc *p;
    Trainer *t;
    ctl_t *ctl; /* the snapshot thread's own connection */
} CommitCtx;

static char job_config_text[65536];

/* Writes this rank's committed state to disk; the last rank to do so completes the checkpoint. */
static void persist_generation(CommitCtx *c, const SnapHeader *h, const void *payload) {
    char err[1024], counter[64];
    SnapRegion all = {payload, h->length};
    if (checkpoint_write_shard(c->p->cfg.out, h, &all, 1, err, sizeof err) != 0) {
        log_msg("persist step %lld: %s", (long long)h->step + 1, err);
        return;
    }
    snprintf(counter, sizeof counter, "persisted:%lld", (long long)h->step);
    if (ctl_counter_incr(c->ctl, counter) != c->p->cfg.workers) return;
    if (checkpoint_finish(c->p->cfg.out, h->step, c->p->cfg.workers, trainer_model_config(c->t), job_config_text, err,
                          sizeof err) != 0) {
        log_msg("persist step %lld: %s", (long long)h->step + 1, err);
        return;
    }
    event_emit(c->ctl, c->p->t0_wall_ms, "checkpoint", "\"step\":%lld,\"kind\":\"persist\"", (long long)h->step + 1);
}

static void on_commit(const SnapHeader *h, const void *payload, void *arg) {
    CommitCtx *c = arg;
    ctl_committed_set(c->ctl, h->rank, h->step);
    int every = c->p->cfg.persist_every;
    if (every > 0 && (h->step + 1) % every == 0) persist_generation(c, h, payload);
}

/* Reads "host:port" of proc's replica server into t. 0 / -1. */
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
static int ring_holders(Proc *p, int rank, int want, ReplicaTarget *out) {
    char my_host[256] = "", host[256];
    gethostname(my_host, sizeof my_host - 1);
    int n = 0;
    for (int pass = 0; pass < 2 && n < want; pass++) {
        for (int j = 1; j < p->cfg.workers && n < want; j++) {
            int r = (rank + j) % p->cfg.workers;
            long proc = ctl_rank_owner(p->ctl, r);
            ReplicaTarget t;
            if (proc <= 0 || holder_address(p, proc, &t, host, sizeof host) != 0) continue;
            int other_host = strcmp(host, my_host) != 0;
            if (other_host == (pass == 0)) out[n++] = t;
        }
    }
    return n;
}

/* Spares (sorted by process id) rank, rank+1, ... mod S; waits for enough spares to register. */
static int spare_holders(Proc *p, int rank, int want, ReplicaTarget *out) {
    long ids[4096];
    int n = 0;
    double deadline = now_ms() + p->cfg.start_timeout_ms;
    while ((n = ctl_spare_list(p->ctl, ids, 4096)) < want && now_ms() < deadline) sleep_ms(10);
    if (n < want) return -1;
    char host[256];
    for (int j = 0; j < want; j++)
        if (holder_address(p, ids[(rank + j) % n], &out[j], host, sizeof host) != 0) return -1;
    return want;
}

static Snapshot *start_snapshots(Proc *p, Trainer *t, int rank, long epoch, CommitCtx *ctx, char *err, size_t errlen) {
    ReplicaTarget targets[MAX_REPLICAS];
    int want = p->cfg.replicas;
    int n;
    if (!strcmp(p->cfg.replica_placement, "spares")) {
        n = spare_holders(p, rank, want, targets);
        if (n < 0) { snprintf(err, errlen, "--replica-placement spares: fewer than %d spares registered", want); return NULL; }
    } else {
        if (want > p->cfg.workers - 1) want = p->cfg.workers - 1;
        n = ring_holders(p, rank, want, targets);
        if (n < want) { snprintf(err, errlen, "only %d of %d ring replica holders are registered", n, want); return NULL; }
    }
    if (rank == 0 && n < p->cfg.replicas)
        log_msg("%d worker(s): %d replica(s) per rank instead of %d", p->cfg.workers, n, p->cfg.replicas);
    ctx->ctl = ctl_connect(&p->addr, p->job, 5000, err, errlen);
    if (!ctx->ctl) return NULL;
    SnapRegion regions[4];
    int nregions = trainer_state_regions(t, regions);
    SnapshotConfig sc = {.job = p->job, .epoch = epoch, .rank = rank, .world = p->cfg.workers, .regions = regions,
                         .nregions = nregions, .targets = targets, .ntargets = n, .timeout_ms = p->cfg.comm_timeout_ms,
                         .on_commit = on_commit, .arg = ctx};
    Snapshot *s = snapshot_create(&sc, err, errlen);
    if (!s) { ctl_close(ctx->ctl); ctx->ctl = NULL; }
    return s;
}

/* --ft disk: every rank writes its live state, then rank 0 completes the checkpoint. */
static comm_status disk_checkpoint(Proc *p, Trainer *t, comm_t *comm, int rank, long epoch, int step) {
    char err[1024];
    SnapRegion regions[4];
    int n = trainer_state_regions(t, regions);
    if (checkpoint_write_live(p->cfg.out, p->job, epoch, rank, p->cfg.workers, step, regions, n, err, sizeof err) != 0)
        log_msg("checkpoint step %d: %s", step + 1, err);
    comm_status st = comm_barrier(comm, p->cfg.comm_timeout_ms);
    if (st != COMM_OK || rank != 0) return st;
    if (checkpoint_finish(p->cfg.out, step, p->cfg.workers, trainer_model_config(t), job_config_text, err, sizeof err) != 0)
        log_msg("checkpoint step %d: %s", step + 1, err);
    else
        event_emit(p->ctl, p->t0_wall_ms, "checkpoint", "\"step\":%d,\"kind\":\"disk\"", step + 1);
    return COMM_OK;
}

static void report_error(Proc *p, int rank, const char *what, const char *err) {
    char esc[2048];
    log_msg("%s%s", what, err);
    json_escape(err, esc, sizeof esc);
    event_emit(p->ctl, p->t0_wall_ms, "error", "\"rank\":%d,\"message\":\"%s\"", rank, esc);
}

/* The newest step every rank can restore, for the metrics line (1-based, 0 = none). */
static long long committed_step(Proc *p, Snapshot *snap, int last_disk_step) {
    if (snap) {
        long long c = ctl_committed_min(p->ctl, p->cfg.workers);
        return c >= 0 ? c + 1 : 0;
    }
    return last_disk_step;
}

static int train_loop(Proc *p, Trainer *t, comm_t *comm, Snapshot *snap, int rank, long epoch) {
    char esc[2048];
    int disk = !strcmp(p->cfg.ft, "disk");
    int last_disk_step = 0;
    for (int step = trainer_first_step(t); step < p->cfg.steps; step++) {
        if (atomic_load(&p->job_over)) return 3;
        StepStats s;
        comm_status st = trainer_step(t, comm, step, &s);
        if (st == COMM_OK && disk && (step + 1) % p->cfg.ckpt_every == 0) {
            st = disk_checkpoint(p, t, comm, rank, epoch, step);
            last_disk_step = step + 1;
        }
        if (st != COMM_OK) {
            log_msg("step %d: %s: %s", step + 1, comm_status_str(st), comm_last_error(comm));
            json_escape(comm_last_error(comm), esc, sizeof esc);
            event_emit(p->ctl, p->t0_wall_ms, "comm_failure", "\"rank\":%d,\"step\":%d,\"error\":\"%s\",\"message\":\"%s\"",
                       rank, step + 1, comm_status_str(st), esc);
            return 2;
        }
        if (rank == 0) push_metrics(p, &s, epoch, committed_step(p, snap, last_disk_step));
    }
    return 0;
}

static void report_snapshot_stats(Proc *p, Snapshot *snap, int rank) {
    SnapshotStats st;
    snapshot_stats(snap, &st);
    event_emit(p->ctl, p->t0_wall_ms, "snapshot_stats",
               "\"rank\":%d,\"captures\":%llu,\"commits\":%llu,\"failures\":%llu,\"waits\":%llu,"
               "\"wait_ms_total\":%.3f,\"bytes_copied\":%llu,\"bytes_replicated\":%llu,\"copy_ms_mean\":%.3f,"
               "\"replicate_ms_mean\":%.3f",
               rank, (unsigned long long)st.captures, (unsigned long long)st.commits, (unsigned long long)st.failures,
               (unsigned long long)st.waits, st.wait_ms_total, (unsigned long long)st.bytes_copied,
               (unsigned long long)st.bytes_replicated, st.captures ? st.copy_ms_total / st.captures : 0.0,
               st.captures ? st.replicate_ms_total / st.captures : 0.0);
}

static int run_worker(Proc *p, int rank) {
    char role[32], err[1024];
    snprintf(role, sizeof role, "rank %d", rank);
    log_set_role(role);
    Trainer *t = trainer_create(&p->cfg, rank, p->cfg.workers, err, sizeof err);
    if (!t) { report_error(p, rank, "", err); return 1; }
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    event_emit(p->ctl, p->t0_wall_ms, "rank_joined", "\"rank\":%d,\"proc\":%ld,\"pid\":%d,\"host\":\"%s\"",
               rank, p->proc_id, (int)getpid(), host);

    long epoch = ctl_epoch(p->ctl);
    char prefix[256];
    snprintf(prefix, sizeof prefix, "dp:%s:e%ld:gloo", p->job, epoch);
    comm_store_addr store = {p->addr.host, p->addr.port, p->addr.password[0] ? p->addr.password : NULL};
    comm_t *comm = comm_create(&store, prefix, rank, p->cfg.workers, p->bind_host, p->cfg.start_timeout_ms,
                               err, sizeof err);
    if (!comm) {
        report_error(p, rank, "joining the communicator failed: ", err);
        trainer_free(t);
        return 2;
    }
    CommitCtx ctx = {.p = p, .t = t};
    Snapshot *snap = NULL;
    int rc = 0;
    if (!strcmp(p->cfg.ft, "deadpool")) {
        snap = start_snapshots(p, t, rank, epoch, &ctx, err, sizeof err);
        if (!snap) { report_error(p, rank, "snapshots: ", err); rc = 1; }
        else trainer_attach_snapshot(t, snap);
    }
    if (rc == 0) rc = train_loop(p, t, comm, snap, rank, epoch);
    if (rc == 0 && rank == 0) rc = save_final_model(p, t);
    if (snap) {
        snapshot_drain(snap, p->cfg.comm_timeout_ms);
        report_snapshot_stats(p, snap, rank);
        /* Every rank's last replication is done before anyone closes its replica server. */
        if (rc == 0) comm_barrier(comm, p->cfg.comm_timeout_ms);
        snapshot_destroy(snap);
        ctl_close(ctx.ctl);
    }
    comm_destroy(comm);
    trainer_free(t);
    return rc;
}

/* Every process holds replicas: start the server and tell the job where it is. */
static int start_replica_server(Proc *p, char *err, size_t errlen) {
    p->replicas = replica_server_start(p->bind_host, 0, p->job, err, errlen);
    if (!p->replicas) return -1;
    char addr[300], host[256] = "";
    snprintf(addr, sizeof addr, "%s:%d", p->bind_host, replica_server_port(p->replicas));
    gethostname(host, sizeof host - 1);
    if (ctl_proc_set(p->ctl, p->proc_id, "replica", addr) != 0 || ctl_proc_set(p->ctl, p->proc_id, "host", host) != 0) {
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
    if (redis_addr_parse(a->redis_url, &p.addr, err, sizeof err) != 0) { log_msg("%s", err); return 1; }
    p.ctl = ctl_connect(&p.addr, a->job, 5000, err, sizeof err);
    if (!p.ctl) { log_msg("%s", err); return 1; }
    if (read_job(&p, err, sizeof err) != 0) { log_msg("%s", err); ctl_close(p.ctl); return 1; }
    job_config_serialize(&p.cfg, job_config_text, sizeof job_config_text);
    p.proc_id = ctl_new_proc_id(p.ctl);
    if (p.proc_id < 0) { log_msg("registration failed: %s", ctl_last_error(p.ctl)); ctl_close(p.ctl); return 1; }
    if (start_replica_server(&p, err, sizeof err) != 0) { log_msg("%s", err); ctl_close(p.ctl); return 1; }
    ctl_heartbeat(p.ctl, p.proc_id, p.cfg.heartbeat_ttl_ms);
    pthread_create(&p.hb_thread, NULL, heartbeat_loop, &p);

    int rank = a->spare ? -1 : claim_rank(&p, a->rank);
    if (!a->spare && a->rank >= 0 && rank < 0) log_msg("rank %d is taken; joining as a spare", a->rank);
    int rc = rank >= 0 ? run_worker(&p, rank) : run_spare(&p);

    atomic_store(&p.hb_stop, 1);
    pthread_join(p.hb_thread, NULL);
    replica_server_stop(p.replicas);
    ctl_close(p.ctl);
    return rc;
}
