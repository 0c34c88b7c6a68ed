/* runtime.c — deadpool.h: one process's life in a job. Registration, role, heartbeat and
 * abort-watch threads; membership of an epoch (collectives, snapshots of the application's
 * regions, replica placement, persistence); and what happens when a peer fails — wait for the
 * coordinator's decision, restore the rollback generation, rebuild, go on — or, as a spare,
 * waiting warm until a decision hands it a failed rank. It knows nothing of the application:
 * state is regions and callbacks. */
#include "deadpool.h"

#include <errno.h>
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
#include "config.h"
#include "control.h"
#include "events.h"
#include "generation.h"
#include "inject.h"
#include "netns.h"
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
    char resume_dir[4200];
    ReplicaServer *replicas; /* holds other ranks' snapshots; every process runs one */
    FaultSpec faults[INJECT_MAX];
    int nfaults;
    pthread_t hb_thread, abort_thread;
    atomic_int hb_stop;
    atomic_int job_over;      /* the launcher set the job's state to stopping/done/failed */
    atomic_int abort_step;    /* the coordinator closed our epoch: abandon the step in flight */
    atomic_long cur_epoch;
    char err[1024];           /* dp_last_error */
    /* membership */
    dp_callbacks cb;
    dp_role role;
    int joined;               /* dp_join succeeded once */
    int rank;
    long epoch;
    int64_t next_step;
    comm_t *comm;
    Snapshot *snap;
    Snapshot *restore_src;    /* a previous epoch's snapshots, kept until the next epoch commits */
    ctl_t *snap_ctl;          /* the snapshot thread's own connection (on_commit) */
    int first_commit_pending; /* the epoch's first step is not committed yet */
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
    Decision decision;        /* the one being followed (large: not on the stack) */
};

/* --- small helpers ------------------------------------------------------------------- */

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

/* --- threads: heartbeat, abort watch ------------------------------------------------- */

/* Waits on the process's "abort" list; a value e+1 with e >= our epoch raises abort_step. */
static void *abort_watch_loop(void *arg) {
    dp_t *dp = arg;
    pthread_setname_np(pthread_self(), "dp-abort");
    char err[256];
    ctl_t *c = ctl_connect(&dp->addr, dp->job, 2000, err, sizeof err);
    if (!c) { log_msg("abort watcher: %s", err); return NULL; }
    while (!atomic_load(&dp->hb_stop)) {
        long v = ctl_wait_notice(c, dp->proc_id, "abort", 200);
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
    int period = dp->cfg.detect_timeout_ms / 4, failing = 0;
    while (!atomic_load(&dp->hb_stop)) {
        int ok = ctl_heartbeat(c, dp->proc_id, dp->cfg.detect_timeout_ms) == 0;
        if (!ok && !failing) log_msg("heartbeat failed: %s", ctl_last_error(c));
        if (ok && failing) log_msg("heartbeat restored");
        failing = !ok;
        char state[32];
        if (ctl_state_get(c, state, sizeof state) == 0 && strcmp(state, "running") != 0)
            atomic_store(&dp->job_over, 1);
        sleep_ms(period > 0 ? period : 1);
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
    if (job_config_parse_lines(&dp->cfg, dp->cfg_text, err, errlen) != 0) return -1;
    char t0[32];
    if (ctl_config_get(dp->ctl, "t0_ms", t0, sizeof t0) != 0) { snprintf(err, errlen, "job has no start time"); return -1; }
    dp->t0_wall_ms = strtoll(t0, NULL, 10);
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

/* Claims the requested rank, or the first free one. Returns the rank, -1 if none is free. */
static int claim_rank(dp_t *dp, int wanted) {
    if (wanted >= 0) return ctl_claim_rank(dp->ctl, wanted, dp->proc_id) == 1 ? wanted : -1;
    for (int r = 0; r < dp->cfg.workers; r++)
        if (ctl_claim_rank(dp->ctl, r, dp->proc_id) == 1) return r;
    return -1;
}

/* Every process holds replicas: start the server and tell the job where it is. */
static int start_replica_server(dp_t *dp, char *err, size_t errlen) {
    dp->replicas = replica_server_start(dp->bind_host, 0, dp->job, err, errlen);
    if (!dp->replicas) return -1;
    char addr[300], host[256] = "", pid[32];
    snprintf(addr, sizeof addr, "%s:%d", dp->bind_host, replica_server_port(dp->replicas));
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    gethostname(host, sizeof host - 1);
    if (ctl_proc_set(dp->ctl, dp->proc_id, "replica", addr) != 0 || ctl_proc_set(dp->ctl, dp->proc_id, "host", host) != 0 ||
        ctl_proc_set(dp->ctl, dp->proc_id, "pid", pid) != 0) {
        snprintf(err, errlen, "registering the replica server failed: %s", ctl_last_error(dp->ctl));
        return -1;
    }
    return 0;
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
        pthread_join(dp->hb_thread, NULL);
        if (dp->abort_thread) pthread_join(dp->abort_thread, NULL);
    }
    replica_server_stop(dp->replicas);
    if (dp->ctl) ctl_close(dp->ctl);
    free(dp->head);
    free(dp);
}

dp_t *dp_init(const dp_options *opts, char *err, size_t errlen) {
    signal(SIGPIPE, SIG_IGN);
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
    snprintf(dp->job, sizeof dp->job, "%s", o.job);
    snprintf(dp->bind_host, sizeof dp->bind_host, "%s", o.bind_host && *o.bind_host ? o.bind_host : "127.0.0.1");
    log_set_role(o.spare ? "spare" : "rank");
    if (redis_addr_parse(o.redis_url, &dp->addr, err, errlen) != 0) goto fail;
    dp->ctl = ctl_connect(&dp->addr, dp->job, 5000, err, errlen);
    if (!dp->ctl || read_job(dp, err, errlen) != 0) goto fail;
    dp->proc_id = ctl_new_proc_id(dp->ctl);
    if (dp->proc_id < 0) { snprintf(err, errlen, "registration failed: %s", ctl_last_error(dp->ctl)); goto fail; }
    if (start_replica_server(dp, err, errlen) != 0) goto fail;
    ctl_heartbeat(dp->ctl, dp->proc_id, dp->cfg.detect_timeout_ms);
    pthread_create(&dp->hb_thread, NULL, heartbeat_loop, dp);
    pthread_create(&dp->abort_thread, NULL, abort_watch_loop, dp);
    dp->rank = o.spare ? -1 : claim_rank(dp, o.rank);
    if (!o.spare && o.rank >= 0 && dp->rank < 0) log_msg("rank %d is taken; joining as a spare", o.rank);
    dp->role = dp->rank >= 0 ? DP_ROLE_INITIAL : DP_ROLE_SPARE;
    dp->next_step = dp->cfg.resume_step + 1;
    set_role_log(dp);
    return dp;
fail:
    free_process(dp);
    return NULL;
}

/* --- generations: capture and restore ------------------------------------------------ */

/* The application's regions now, with the snapshot regions of this rank's generation:
 * the head first, then the regions this rank keeps (identical ones on rank 0 only). The
 * number of snapshot regions, -1 + dp->err. */
static int gather_regions(dp_t *dp, int64_t step, const void *extra, size_t extra_len) {
    int n = dp->cb.regions(dp->cb.arg, dp->app_regions, GEN_MAX_REGIONS);
    if (n < 0 || n > GEN_MAX_REGIONS) {
        snprintf(dp->err, sizeof dp->err, "the regions callback reported %d regions, expected 0..%d", n, GEN_MAX_REGIONS);
        return -1;
    }
    dp_region kept[GEN_MAX_REGIONS];
    int k = 0;
    for (int i = 0; i < n; i++)
        if (dp->app_regions[i].kind == DP_SHARDED || dp->rank == 0) kept[k++] = dp->app_regions[i];
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

/* Copies each saved region into the application's region of the same id. */
static int default_restore(dp_t *dp, const dp_generation *g, char *err, size_t errlen) {
    dp_region now[GEN_MAX_REGIONS];
    int n = dp->cb.regions(dp->cb.arg, now, GEN_MAX_REGIONS);
    for (int i = 0; i < g->nregions; i++) {
        const dp_region *s = &g->regions[i];
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

static int app_restore(dp_t *dp, const dp_generation *g, char *err, size_t errlen) {
    if (dp->cb.restore) return dp->cb.restore(dp->cb.arg, g, err, errlen);
    return default_restore(dp, g, err, errlen);
}

/* Checks a verified payload of this rank and hands it to the application. */
static int restore_payload(dp_t *dp, const SnapHeader *h, const void *payload, char *err, size_t errlen) {
    if (h->rank != dp->rank || h->world != dp->cfg.workers) {
        snprintf(err, errlen, "state of rank %d of %d offered to rank %d of %d", h->rank, h->world, dp->rank,
                 dp->cfg.workers);
        return -1;
    }
    dp_region regions[GEN_MAX_REGIONS];
    dp_generation g = {.step = h->step, .rank = h->rank, .world = h->world};
    uint64_t seed;
    int64_t next;
    if (gen_parse(payload, h->length, &g, regions, GEN_MAX_REGIONS, &seed, &next, err, errlen) != 0) return -1;
    if (seed != dp->cfg.seed || next != h->step + 1) {
        snprintf(err, errlen, "state of step %lld: taken with seed %llu, next step %lld; this job has seed %llu",
                 (long long)h->step + 1, (unsigned long long)seed, (long long)next, (unsigned long long)dp->cfg.seed);
        return -1;
    }
    return app_restore(dp, &g, err, errlen);
}

static int restore_in_place(const SnapHeader *h, const void *payload, void *arg) {
    dp_t *dp = arg;
    char err[512];
    if (restore_payload(dp, h, payload, err, sizeof err) == 0) return 0;
    log_msg("local copy of step %lld unusable: %s", (long long)h->step + 1, err);
    return -1;
}

/* Fetches rank's generation `step` from any holder recorded in recent epochs. 0 / -1. */
static int fetch_from_holders(dp_t *dp, int rank, long long step, long newest_epoch, SnapHeader *h, void **payload) {
    for (long e = newest_epoch; e >= 0 && e >= newest_epoch - 3; e--) {
        char list[HOLDERS_TEXT_MAX];
        Holder holders[HOLDERS_MAX];
        if (holders_read(dp->ctl, e, rank, list, sizeof list) != 0) continue;
        int n = holders_parse(list, holders, HOLDERS_MAX);
        for (int i = 0; i < n; i++) {
            char err[256];
            ReplicaConn *c = replica_connect(holders[i].host, holders[i].port, 1000, 0, err, sizeof err);
            if (!c) continue;
            replica_status st = replica_get(c, dp->job, rank, step, h, payload, job_comm_timeout_ms(&dp->cfg));
            replica_close(c);
            if (st == REPLICA_OK && h->step == step) return 0;
            if (st == REPLICA_OK) { free(*payload); *payload = NULL; }
        }
    }
    return -1;
}

/* Puts this rank's state at generation `rollback`: from our own ping-pong buffer, else from
 * a replica holder, else (the resumed checkpoint) from disk; -1 means the initial state. */
static int restore_generation(dp_t *dp, Snapshot *old, long long rollback, char *err, size_t errlen) {
    dp->next_step = rollback + 1;
    if (rollback < 0) {
        dp->cb.reset(dp->cb.arg);
        return 0;
    }
    if (old && snapshot_local_use(old, rollback, restore_in_place, dp) == 0) return 0;
    SnapHeader h;
    void *payload = NULL;
    int found = fetch_from_holders(dp, dp->rank, rollback, dp->epoch - 1, &h, &payload) == 0;
    if (!found && rollback == dp->cfg.resume_step)
        found = checkpoint_read_shard(dp->cfg.resume, rollback, dp->rank, &h, &payload, err, errlen) == 0;
    if (!found) {
        snprintf(err, errlen, "no copy of rank %d's state at step %lld is reachable", dp->rank, rollback + 1);
        return -1;
    }
    int rc = restore_payload(dp, &h, payload, err, errlen);
    free(payload);
    return rc;
}

/* After a restore: rank 0 broadcasts the DP_IDENTICAL regions (only it keeps them), the other
 * ranks hand them to the application; then the application rebuilds what is derived. */
static dp_status share_and_rebuild(dp_t *dp, char *err, size_t errlen) {
    if (dp->cfg.workers > 1) {
        dp_region all[GEN_MAX_REGIONS], same[GEN_MAX_REGIONS];
        unsigned char *blob = NULL;
        uint64_t size = 0;
        int k = 0;
        if (dp->rank == 0) {
            int n = dp->cb.regions(dp->cb.arg, all, GEN_MAX_REGIONS);
            for (int i = 0; i < n; i++)
                if (all[i].kind == DP_IDENTICAL) same[k++] = all[i];
            size = gen_head_bytes(k, 0);
            for (int i = 0; i < k; i++) size += same[i].len;
        }
        if (comm_broadcast(dp->comm, &size, sizeof size, 0, job_comm_timeout_ms(&dp->cfg)) != COMM_OK) goto comm_failed;
        if (size > gen_head_bytes(0, 0)) {
            blob = malloc(size);
            if (!blob) { snprintf(err, errlen, "out of memory for %llu bytes of identical state", (unsigned long long)size); return DP_ERR; }
            if (dp->rank == 0) {
                gen_head_write(blob, dp->cfg.seed, dp->next_step, same, k, NULL, 0);
                size_t off = gen_head_bytes(k, 0);
                for (int i = 0; i < k; i++) { memcpy(blob + off, same[i].ptr, same[i].len); off += same[i].len; }
            }
            if (comm_broadcast(dp->comm, blob, size, 0, job_comm_timeout_ms(&dp->cfg)) != COMM_OK) { free(blob); goto comm_failed; }
            if (dp->rank != 0) {
                dp_region regions[GEN_MAX_REGIONS];
                dp_generation g = {.step = dp->next_step - 1, .rank = 0, .world = dp->cfg.workers};
                uint64_t seed;
                int64_t next;
                int rc = gen_parse(blob, size, &g, regions, GEN_MAX_REGIONS, &seed, &next, err, errlen);
                if (rc == 0) rc = app_restore(dp, &g, err, errlen);
                if (rc != 0) { free(blob); return DP_ERR; }
            }
            free(blob);
        }
    }
    if (dp->cb.rebuild && dp->cb.rebuild(dp, dp->cb.arg) != DP_OK) {
        snprintf(err, errlen, "rebuilding the derived state failed: %s", comm_last_error(dp->comm));
        return DP_FAILED;
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
    if (checkpoint_finish(dp->cfg.out, h->step, dp->cfg.workers, dp->cfg_text, app_checkpoint, dp, err, sizeof err) != 0) {
        log_msg("checkpoint of step %lld: %s", (long long)h->step + 1, err);
        return;
    }
    event_emit(c, dp->t0_wall_ms, "checkpoint", "\"step\":%lld,\"kind\":\"%s\"", (long long)h->step + 1, kind);
}

static void persist_generation(dp_t *dp, ctl_t *c, const SnapHeader *h, const void *payload) {
    char err[1024];
    SnapRegion all = {payload, h->length};
    if (checkpoint_write_shard(dp->cfg.out, h, &all, 1, err, sizeof err) != 0) {
        log_msg("persist step %lld: %s", (long long)h->step + 1, err);
        return;
    }
    count_persisted(dp, c, h, "persist");
}

static void on_commit(const SnapHeader *h, const void *payload, void *arg) {
    dp_t *dp = arg;
    ctl_committed_set(dp->snap_ctl, h->epoch, h->rank, h->step);
    int every = dp->cfg.persist_every;
    if (every > 0 && (h->step + 1) % every == 0) persist_generation(dp, dp->snap_ctl, h, payload);
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

/* The coordinator found no spare: write our committed generation to disk so the job can be
 * resumed even if none ever comes; the named writer also writes the failed ranks' states
 * from their replicas. Once per request. */
static void answer_persist_request(dp_t *dp) {
    char req[64 + 8 * DP_MAX_RANKS], k[32]; /* "epoch:step:writer:rank,rank,..." (coordinator.c) */
    long e;
    long long g;
    int writer, used = 0;
    if (dp->persist_answered || ctl_get(dp->ctl, key(k, sizeof k, KEY_PERSIST_REQ, 0, 0), req, sizeof req) != 0 ||
        sscanf(req, "%ld:%lld:%d:%n", &e, &g, &writer, &used) < 3 || used == 0 || e != dp->epoch || g < 0)
        return;
    char *failed = req + used;
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
    for (char *tok = strtok(failed, ","); tok; tok = strtok(NULL, ",")) {
        int rank = atoi(tok);
        payload = NULL;
        if (fetch_from_holders(dp, rank, g, dp->epoch, &h, &payload) != 0) {
            log_msg("cannot persist rank %d's step %lld: no holder has it", rank, g + 1);
            continue;
        }
        persist_generation(dp, dp->ctl, &h, payload);
        free(payload);
    }
}

/* --- replica placement and snapshots ------------------------------------------------- */

/* Reads the replica server address of proc. 0 / -1. */
static int holder_address(dp_t *dp, long proc, Holder *h, char *host, size_t hostlen) {
    char addr[300];
    if (ctl_proc_get(dp->ctl, proc, "replica", addr, sizeof addr) != 0) return -1;
    char *colon = strrchr(addr, ':');
    if (!colon) return -1;
    *colon = 0;
    h->proc = proc;
    snprintf(h->host, sizeof h->host, "%.255s", addr);
    h->port = atoi(colon + 1);
    if (ctl_proc_get(dp->ctl, proc, "host", host, hostlen) != 0) host[0] = 0;
    return 0;
}

/* Ring buddies rank+1, rank+2, ... preferring holders on another host than ours. */
static int ring_holders(dp_t *dp, int want, Holder *out) {
    char my_host[256] = "", host[256];
    gethostname(my_host, sizeof my_host - 1);
    int n = 0;
    for (int pass = 0; pass < 2 && n < want; pass++) {
        for (int j = 1; j < dp->cfg.workers && n < want; j++) {
            long proc = ctl_rank_owner(dp->ctl, (dp->rank + j) % dp->cfg.workers);
            Holder h;
            if (proc <= 0 || holder_address(dp, proc, &h, host, sizeof host) != 0) continue;
            if ((strcmp(host, my_host) != 0) == (pass == 0)) out[n++] = h;
        }
    }
    return n;
}

/* Spares (sorted by process id) rank, rank+1, ... mod S; waits for enough spares to register. */
static int spare_holders(dp_t *dp, int want, Holder *out) {
    long ids[DP_MAX_RANKS];
    int n = 0;
    double deadline = now_ms() + dp->cfg.start_timeout_ms;
    while ((n = ctl_spare_list(dp->ctl, ids, DP_MAX_RANKS)) < want && now_ms() < deadline) sleep_ms(10);
    if (n < want) return -1;
    char host[256];
    for (int j = 0; j < want; j++)
        if (holder_address(dp, ids[(dp->rank + j) % n], &out[j], host, sizeof host) != 0) return -1;
    return want;
}

static int start_snapshots(dp_t *dp, char *err, size_t errlen) {
    Holder holders[HOLDERS_MAX];
    ReplicaTarget targets[HOLDERS_MAX];
    int want = dp->cfg.replicas, n;
    if (dp->cfg.replica_placement == PLACE_SPARES) {
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
    for (int i = 0; i < n; i++) {
        snprintf(targets[i].host, sizeof targets[i].host, "%s", holders[i].host);
        targets[i].port = holders[i].port;
    }
    if (!dp->snap_ctl) dp->snap_ctl = ctl_connect(&dp->addr, dp->job, 5000, err, errlen);
    if (!dp->snap_ctl) return -1;
    /* The buffers are sized from the state as it is now; they grow if it does. */
    size_t hint = 0;
    int nr = gather_regions(dp, dp->next_step - 1, NULL, 0);
    for (int i = 0; i < nr; i++) hint += dp->snap_regions[i].len;
    SnapshotConfig sc = {.job = dp->job, .epoch = dp->epoch, .rank = dp->rank, .world = dp->cfg.workers,
                         .bytes_hint = hint, .targets = targets, .ntargets = n, .timeout_ms = job_comm_timeout_ms(&dp->cfg),
                         .allow_pull = dp->cfg.replica_transport == TRANSPORT_AUTO, .on_commit = on_commit, .arg = dp};
    dp->snap = snapshot_create(&sc, err, errlen);
    return dp->snap ? 0 : -1;
}

/* --- fault injection ----------------------------------------------------------------- */

static void fire_fault(dp_t *dp, fault_kind kind, long long step) {
    char value[128], k[32];
    const char *name = fault_kind_name(kind == FAULT_RKILL ? FAULT_KILL : kind);
    snprintf(value, sizeof value, "%s:%d:%lld", name, dp->rank, (long long)wall_ms());
    ctl_set(dp->ctl, key(k, sizeof k, KEY_FAULT_LAST, 0, 0), value); /* the failure time, for total_ms */
    event_emit(dp->ctl, dp->t0_wall_ms, "fault_injected", "\"kind\":\"%s\",\"rank\":%d,\"step\":%lld,\"pid\":%d", name,
               dp->rank, step + 1, (int)getpid());
    log_msg("injecting %s at step %lld", name, step + 1);
    if (kind == FAULT_KILL || kind == FAULT_RKILL) raise(SIGKILL);
    else if (kind == FAULT_STOP) raise(SIGSTOP);
    else if (kind == FAULT_NETDOWN) netns_cut_own_link();
}

/* Faults from --inject and --chaos fire once each, even when the step is re-run after a
 * rollback (SET NX in Redis). They fire mid-step, after the forward/backward: where a real
 * failure most likely strikes. */
static void maybe_inject(dp_t *dp, int64_t step) {
    char k[32];
    for (int i = 0; i < dp->nfaults; i++) {
        const FaultSpec *f = &dp->faults[i];
        if (f->kind != FAULT_RKILL && f->rank == dp->rank && f->at == step + 1 &&
            ctl_set_nx(dp->ctl, key(k, sizeof k, KEY_INJECTED, i, 0), "1") == 1)
            fire_fault(dp, f->kind, step);
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

static int join_communicator(dp_t *dp, int timeout_ms, char *err, size_t errlen) {
    char prefix[256], fence[256];
    ctl_key_full(dp->ctl, prefix, sizeof prefix, KEY_GLOO, dp->epoch, 0);
    ctl_key_full(dp->ctl, fence, sizeof fence, KEY_FENCED, dp->epoch, 0); /* see fence_epoch */
    comm_store_addr store = {dp->addr.host, dp->addr.port, dp->addr.password[0] ? dp->addr.password : NULL, fence};
    dp->comm = comm_create(&store, prefix, dp->rank, dp->cfg.workers, dp->bind_host, timeout_ms, err, errlen);
    return dp->comm ? 0 : -1;
}

/* Becomes the rank `d` says in epoch d->epoch: restore, rebuild, resnapshot. 0, or -1 + err. */
static int join_epoch(dp_t *dp, const Decision *d, char *err, size_t errlen) {
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
    int was_member = dp->rank >= 0;
    dp->rank = decision_rank_of(d, dp->proc_id);
    dp->role = was_member && dp->role != DP_ROLE_SPARE ? DP_ROLE_SURVIVOR : DP_ROLE_RECOVERED;
    set_role_log(dp);
    replica_server_set_min_epoch(dp->replicas, d->epoch);
    if (restore_generation(dp, dp->restore_src, d->rollback, err, errlen) != 0) return -1;
    log_msg("restored step %lld in %.1f ms", d->rollback + 1, now_ms() - t0);
    maybe_inject_in_recovery(dp);
    double t1 = now_ms();
    /* Everyone is warm and restores in parallel: if a member does not show up within this
     * bound it died during recovery, and the coordinator will decide again. */
    int join_timeout = 2 * dp->cfg.detect_timeout_ms + 3000;
    if (join_communicator(dp, join_timeout, err, errlen) != 0) return -1;
    if (d->rollback >= 0 && share_and_rebuild(dp, err, errlen) != DP_OK) return -1;
    double t2 = now_ms();
    if (dp->cfg.ft == FT_DEADPOOL) {
        if (start_snapshots(dp, err, errlen) != 0) return -1;
        /* The restore point is snapshotted again in the new epoch; the first step waits for
         * its commit before reducing (as every step does), so this overlaps with that step's
         * forward/backward. Until then the old buffers stay as a second copy. */
        if (d->rollback >= 0) {
            int n = gather_regions(dp, d->rollback, NULL, 0);
            if (n < 0) { snprintf(err, errlen, "%s", dp->err); return -1; }
            snapshot_capture_regions(dp->snap, d->rollback, dp->snap_regions, n);
        }
    }
    char k[64], value[128];
    snprintf(value, sizeof value, "%.3f %.3f %.3f %lld", t1 - t0, t2 - t1, now_ms() - t2, (long long)wall_ms());
    ctl_set(dp->ctl, key(k, sizeof k, KEY_TIMING, dp->epoch, dp->rank), value);
    dp->first_commit_pending = 1;
    dp->step_t0 = now_ms();
    return 0;
}

/* Waits (bounded) for a decision newer than our epoch. The decision's epoch, 0 when the job
 * ended, -1 on timeout. */
static long wait_for_decision(dp_t *dp, int timeout_ms) {
    double deadline = now_ms() + timeout_ms;
    while (now_ms() < deadline) {
        if (atomic_load(&dp->job_over)) return 0;
        long e = ctl_epoch(dp->ctl);
        if (e > dp->epoch) return e;
        if (dp->rank >= 0) answer_persist_request(dp);
        if (ctl_wait_notice(dp->ctl, dp->proc_id, "notice", 100) < 0) sleep_ms(100); /* Redis unreachable */
    }
    return -1;
}

/* Follows decisions until this process is a working member of one: DP_OK, DP_STOPPED (the
 * job ended), DP_FENCED (not a member any more), DP_ERR (no decision came). */
static dp_status follow_decisions(dp_t *dp, Decision *d, char *err, size_t errlen) {
    for (;;) {
        if (join_epoch(dp, d, err, errlen) == 0) return DP_OK;
        /* Usually a member died while recovering; the coordinator decides again. */
        char esc[2048];
        log_msg("joining epoch %ld failed: %s", dp->epoch, err);
        json_escape(err, esc, sizeof esc);
        event_emit(dp->ctl, dp->t0_wall_ms, "join_failed", "\"rank\":%d,\"epoch\":%ld,\"message\":\"%s\"", dp->rank,
                   dp->epoch, esc);
        comm_destroy(dp->comm);
        dp->comm = NULL;
        long e = wait_for_decision(dp, dp->cfg.spare_wait * 1000 + 4 * dp->cfg.detect_timeout_ms + 30000);
        if (e == 0) return DP_STOPPED;
        if (e < 0 || decision_read(dp->ctl, e, d) != 0) {
            snprintf(err, errlen, "no recovery decision arrived: giving up");
            return DP_ERR;
        }
        if (decision_rank_of(d, dp->proc_id) < 0) {
            log_msg("fenced: epoch %ld no longer includes this process; leaving", e);
            event_emit(dp->ctl, dp->t0_wall_ms, "fenced", "\"proc\":%ld,\"pid\":%d,\"epoch\":%ld", dp->proc_id,
                       (int)getpid(), e);
            return DP_FENCED;
        }
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
        return DP_FAILED;
    }
    if (dp->cfg.resume_step >= 0) { /* resumed from disk: every rank restores its state file */
        SnapHeader h;
        void *payload = NULL;
        int rc = checkpoint_read_shard(dp->cfg.resume, dp->cfg.resume_step, dp->rank, &h, &payload, err, errlen);
        if (rc == 0) rc = restore_payload(dp, &h, payload, err, errlen);
        free(payload);
        if (rc != 0) { emit_error(dp, "resume: ", err); return DP_ERR; }
        if (share_and_rebuild(dp, err, errlen) != DP_OK) { emit_error(dp, "resume: ", err); return DP_FAILED; }
    }
    if (dp->cfg.ft == FT_DEADPOOL && start_snapshots(dp, err, errlen) != 0) {
        emit_error(dp, "snapshots: ", err);
        return DP_ERR;
    }
    dp->step_t0 = now_ms();
    return DP_OK;
}

/* A spare is warm (the application built its state before dp_join) and waits for a decision
 * that names it. */
static dp_status join_as_spare(dp_t *dp, char *err, size_t errlen) {
    if (ctl_spare_add(dp->ctl, dp->proc_id) != 0) {
        snprintf(err, errlen, "cannot join the spare pool: %s", ctl_last_error(dp->ctl));
        return DP_ERR;
    }
    event_emit(dp->ctl, dp->t0_wall_ms, "spare_joined", "\"proc\":%ld,\"pid\":%d", dp->proc_id, (int)getpid());
    long seen = ctl_epoch(dp->ctl);
    Decision *d = &dp->decision;
    while (!atomic_load(&dp->job_over)) {
        ctl_wait_notice(dp->ctl, dp->proc_id, "notice", 100);
        long e = ctl_epoch(dp->ctl);
        if (e <= seen) continue;
        seen = e;
        if (decision_read(dp->ctl, e, d) != 0 || decision_rank_of(d, dp->proc_id) < 0) continue;
        log_msg("taking over rank %d in epoch %ld", decision_rank_of(d, dp->proc_id), e);
        ctl_spare_remove(dp->ctl, dp->proc_id);
        return follow_decisions(dp, d, err, errlen);
    }
    ctl_spare_remove(dp->ctl, dp->proc_id);
    return DP_STOPPED;
}

dp_status dp_join(dp_t *dp, const dp_callbacks *cb, char *err, size_t errlen) {
    if (!cb || !cb->regions || !cb->reset) {
        snprintf(err, errlen, "dp_join: the regions and reset callbacks are required");
        return DP_ERR;
    }
    dp->cb = *cb;
    dp_status st = dp->role == DP_ROLE_SPARE ? join_as_spare(dp, err, errlen) : join_initial(dp, err, errlen);
    if (st == DP_OK) dp->joined = 1;
    else snprintf(dp->err, sizeof dp->err, "%s", err);
    return st;
}

/* --- the step ------------------------------------------------------------------------ */

static dp_status comm_failed(dp_t *dp, const char *what) {
    char esc[2048];
    log_msg("step %lld: %s", (long long)dp->cur_step + 1, what);
    json_escape(what, esc, sizeof esc);
    event_emit(dp->ctl, dp->t0_wall_ms, "comm_failure", "\"rank\":%d,\"step\":%lld,\"epoch\":%ld,\"message\":\"%s\"",
               dp->rank, (long long)dp->cur_step + 1, dp->epoch, esc);
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
    if (atomic_load(&dp->job_over)) return DP_STOPPED;
    maybe_inject(dp, step);
    if (atomic_load(&dp->abort_step)) return epoch_closed(dp);
    /* No rank reduces step k+1 before its generation k is committed (see snapshot.h). */
    dp->snapshot_wait_ms = 0;
    if (dp->snap && snapshot_wait_previous(dp->snap, &dp->snapshot_wait_ms) != 0)
        return comm_failed(dp, "replication of the previous snapshot failed");
    return DP_OK;
}

dp_status dp_step_before_update(dp_t *dp) {
    if (epoch_fenced(dp->ctl, dp->epoch) == 1) return epoch_closed(dp);
    return DP_OK;
}

/* committed: newest step (1-based) that every rank can restore, 0 if none. */
static long long committed_step(dp_t *dp) {
    if (!dp->snap) return dp->last_disk_step;
    long long c = ctl_committed_min(dp->ctl, dp->epoch, dp->cfg.workers);
    return c >= 0 ? c + 1 : 0;
}

static void push_metrics(dp_t *dp, int64_t step, const dp_metrics *m, double step_ms) {
    char json[640];
    double tokens = m ? m->tokens : 0.0;
    snprintf(json, sizeof json,
             "{\"step\":%lld,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,\"step_ms\":%.3f,"
             "\"tokens_per_s\":%.1f,\"epoch\":%ld,\"committed_step\":%lld,\"snapshot_wait_ms\":%.3f,\"t\":%.3f}",
             (long long)step + 1, m ? m->loss : 0.0, m ? m->lr : 0.0, m ? m->grad_norm : 0.0, step_ms,
             step_ms > 0 ? tokens / (step_ms / 1e3) : 0.0, dp->epoch, committed_step(dp), dp->snapshot_wait_ms,
             (double)(wall_ms() - dp->t0_wall_ms) / 1e3);
    ctl_push_metric(dp->ctl, json);
}

/* Rank 0 of a new epoch, after its first step: one `recovered` event with the timeline. */
static void report_recovery(dp_t *dp) {
    Decision *d = &dp->decision; /* the epoch's own: it is what we joined */
    if (decision_read(dp->ctl, dp->epoch, d) != 0) return;
    /* The slowest member sets each phase; training resumed when the last member did. */
    double restore = 0, rebuild = 0, resnap = 0;
    long long resumed = 0;
    char k[64], value[128];
    for (int r = 0; r < dp->cfg.workers; r++) {
        double a, b, c;
        long long w;
        if (ctl_get(dp->ctl, key(k, sizeof k, KEY_TIMING, dp->epoch, r), value, sizeof value) == 0 &&
            sscanf(value, "%lf %lf %lf %lld", &a, &b, &c, &w) == 4) {
            if (a > restore) restore = a;
            if (b > rebuild) rebuild = b;
            if (c > resnap) resnap = c;
            if (w > resumed) resumed = w;
        }
    }
    char last[32] = "0";
    ctl_get(dp->ctl, key(k, sizeof k, KEY_LAST_STEP, 0, 0), last, sizeof last);
    long long total = resumed - d->t_fail_ms, first_step = wall_ms() - d->t_fail_ms;
    for (int i = 0; i < d->nfailed; i++) {
        event_emit(dp->ctl, dp->t0_wall_ms, "recovered",
                   "\"epoch\":%ld,\"rank\":%d,\"spare\":%ld,\"failure_kind\":\"%s\",\"rollback_step\":%lld,"
                   "\"detect_ms\":%lld,\"decide_ms\":%lld,\"restore_ms\":%.1f,\"rebuild_ms\":%.1f,\"resnapshot_ms\":%.1f,"
                   "\"total_ms\":%lld,\"first_step_done_ms\":%lld,\"steps_recomputed\":%lld",
                   dp->epoch, d->failed[i].rank, d->failed[i].spare_proc, d->failed[i].kind, d->rollback + 1,
                   (long long)(d->t_detect_ms - d->t_fail_ms), (long long)(d->t_decide_ms - d->t_detect_ms), restore,
                   rebuild, resnap, total, first_step, atoll(last) - (d->rollback + 1));
        printf("[deadpool] recovered rank %d (%s) with spare %ld: training resumed %lld ms after the failure, "
               "rolled back to step %lld\n", d->failed[i].rank, d->failed[i].kind, d->failed[i].spare_proc, total,
               d->rollback + 1);
    }
    if (d->nfailed == 0)
        event_emit(dp->ctl, dp->t0_wall_ms, "recovered",
                   "\"epoch\":%ld,\"rank\":-1,\"failure_kind\":\"comm\",\"rollback_step\":%lld,\"total_ms\":%lld",
                   dp->epoch, d->rollback + 1, total);
}

dp_status dp_step_commit(dp_t *dp, int64_t step, const void *extra, size_t extra_len, const dp_metrics *m) {
    dp_status st = DP_OK;
    if (dp->snap && (step + 1) % dp->cfg.snapshot_every == 0) {
        snapshot_wait_previous(dp->snap, NULL); /* the head buffer is the thread's until then */
        int n = gather_regions(dp, step, extra, extra_len);
        if (n < 0 || snapshot_capture_regions(dp->snap, step, dp->snap_regions, n) != 0) return DP_ERR;
    } else if (dp->cfg.ft == FT_DISK && (step + 1) % dp->cfg.ckpt_every == 0) {
        /* A synchronous checkpoint is part of the step it follows. */
        st = disk_checkpoint(dp, step, extra, extra_len);
        if (st == DP_FAILED) return comm_failed(dp, comm_last_error(dp->comm));
        if (st != DP_OK) return st;
    }
    dp->next_step = step + 1;
    double t = now_ms();
    if (dp->rank == 0) {
        push_metrics(dp, step, m, t - dp->step_t0);
        if (dp->first_commit_pending && dp->epoch > 0) report_recovery(dp);
    }
    if (dp->first_commit_pending && dp->restore_src) { /* the new epoch has committed its restore point */
        snapshot_abandon(dp->restore_src);
        dp->restore_src = NULL;
    }
    dp->first_commit_pending = 0;
    dp->step_t0 = now_ms();
    return DP_OK;
}

dp_status dp_recover(dp_t *dp, char *err, size_t errlen) {
    comm_destroy(dp->comm);
    dp->comm = NULL;
    long e = wait_for_decision(dp, dp->cfg.spare_wait * 1000 + 4 * dp->cfg.detect_timeout_ms + 30000);
    if (e == 0) return DP_STOPPED;
    Decision *d = &dp->decision;
    if (e < 0 || decision_read(dp->ctl, e, d) != 0) {
        snprintf(err, errlen, "no recovery decision arrived: giving up");
        log_msg("%s", err);
        return DP_ERR;
    }
    if (decision_rank_of(d, dp->proc_id) < 0) {
        log_msg("fenced: epoch %ld no longer includes this process; leaving", e);
        event_emit(dp->ctl, dp->t0_wall_ms, "fenced", "\"proc\":%ld,\"pid\":%d,\"epoch\":%ld", dp->proc_id, (int)getpid(), e);
        return DP_FENCED;
    }
    return follow_decisions(dp, d, err, errlen);
}

/* --- collectives --------------------------------------------------------------------- */

static dp_status comm_result(dp_t *dp, comm_status st) {
    if (st == COMM_OK) return DP_OK;
    if (atomic_load(&dp->abort_step)) return epoch_closed(dp);
    return comm_failed(dp, comm_last_error(dp->comm));
}

dp_status dp_allreduce_sum(dp_t *dp, float *buf, size_t n) {
    if (!dp->comm) return DP_ERR;
    return comm_result(dp, comm_allreduce_sum(dp->comm, buf, n, job_comm_timeout_ms(&dp->cfg)));
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
    if (!dp) return DP_EXIT_BAD_JOB;
    int rc = how == DP_OK ? DP_EXIT_DONE
           : how == DP_STOPPED ? DP_EXIT_STOPPED
           : how == DP_FENCED ? DP_EXIT_FENCED
           : dp->joined ? DP_EXIT_FAILED : DP_EXIT_BAD_JOB;
    if (dp->snap) {
        snapshot_drain(dp->snap, job_comm_timeout_ms(&dp->cfg));
        report_snapshot_stats(dp);
        /* Every rank's last replication is done before anyone closes its replica server. */
        if (rc == DP_EXIT_DONE) comm_barrier(dp->comm, job_comm_timeout_ms(&dp->cfg));
        snapshot_destroy(dp->snap);
    }
    /* Rank 0 says the job is done once every rank is: the launcher ends the job on it. */
    if (rc == DP_EXIT_DONE && dp->rank == 0)
        event_emit(dp->ctl, dp->t0_wall_ms, "job_done", "\"steps\":%lld", (long long)dp->next_step);
    snapshot_abandon(dp->restore_src);
    if (dp->snap_ctl) ctl_close(dp->snap_ctl);
    comm_destroy(dp->comm);
    free_process(dp);
    return rc;
}

void dp_output_saved(dp_t *dp, const char *path) {
    char esc[2048];
    json_escape(path, esc, sizeof esc);
    event_emit(dp->ctl, dp->t0_wall_ms, "model_saved", "\"path\":\"%s\"", esc);
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
    char rank[16];
    setenv(DP_ENV_REDIS, a->redis_url, 1);
    setenv(DP_ENV_JOB, a->job, 1);
    if (a->bind_host) setenv(DP_ENV_BIND, a->bind_host, 1);
    else unsetenv(DP_ENV_BIND);
    if (a->spare) setenv(DP_ENV_SPARE, "1", 1);
    else unsetenv(DP_ENV_SPARE);
    snprintf(rank, sizeof rank, "%d", a->rank);
    if (a->rank >= 0) setenv(DP_ENV_RANK, rank, 1);
    else unsetenv(DP_ENV_RANK);
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
    ctl_close(c);
    if (job_config_parse_lines(cfg, text, err, sizeof err) != 0) { log_msg("job config: %s", err); return DP_EXIT_BAD_JOB; }
    char *argv[1100];
    if (program_argv(cfg, self_exe, buf, sizeof cfg->program, argv, 1100) < 1) { log_msg("job has no program"); return DP_EXIT_BAD_JOB; }
    /* The password travels in its own variable, never in the URL nor on a command line. */
    char url[400];
    snprintf(url, sizeof url, "redis://%s:%d", addr.host, addr.port);
    WorkerArgs env = *a;
    env.redis_url = url;
    worker_env_set(&env);
    if (addr.password[0]) setenv(DP_ENV_PASSWORD, addr.password, 1);
    fflush(NULL);
    execvp(argv[0], argv);
    log_msg("cannot run %s: %s", argv[0], strerror(errno));
    return DP_EXIT_BAD_JOB;
}
