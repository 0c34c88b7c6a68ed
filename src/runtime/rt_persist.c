/* rt_persist.c — committed state: its records in Redis as each generation commits, and its
 * copies on disk: every --persist-every, every --ckpt-every with --ft disk, the no-spare
 * persist request, and what a process keeps when the control plane is lost. */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime_internal.h"

#include "checkpoint.h"
#include "events.h"
#include "protocol.h"
#include "util.h"

static int app_checkpoint(void *arg, const char *dir, int64_t step, int world, char *err, size_t errlen) {
    dp_t *dp = arg;
    return dp->cb.checkpoint ? dp->cb.checkpoint(dp->cb.arg, dir, step, world, err, errlen) : 0;
}

/* The checkpoint this job resumed from, when it is in the job's own --out: rotation keeps it
 * while the job runs (checkpoint.h), -1 otherwise. */
static int64_t pinned_step(const dp_t *dp) {
    return dp->cfg.resume_step >= 0 && strcmp(dp->cfg.resume, dp->cfg.out) == 0 ? dp->cfg.resume_step : -1;
}

/* Rank `h->rank`'s state of h->step is on disk: count it (once per rank) and, as the last
 * rank, complete the checkpoint. */
static void count_persisted(dp_t *dp, ctl_t *c, const SnapHeader *h, const char *kind) {
    char err[1024];
    if (ctl_persisted_add(c, h->step, h->rank) != dp->cfg.workers) return;
    if (dp->cfg.nnodes > 0) { /* each machine has its ranks' files: complete across machines */
        log_msg("checkpoint of step %lld complete: every rank's state is on its machine's disk (--resume gathers them)",
                (long long)h->step + 1);
        ctl_persist_complete_set(c, h->step);
        event_emit(c, dp->t0_wall_ms, "checkpoint", "\"step\":%lld,\"kind\":\"%s\",\"machines\":true",
                   (long long)h->step + 1, kind);
        return;
    }
    if (checkpoint_finish(dp->cfg.out, h->step, dp->cfg.workers, dp->cfg_text, app_checkpoint, dp, pinned_step(dp), err,
                          sizeof err) != 0) {
        log_msg("checkpoint of step %lld: %s", (long long)h->step + 1, err);
        return;
    }
    event_emit(c, dp->t0_wall_ms, "checkpoint", "\"step\":%lld,\"kind\":\"%s\"", (long long)h->step + 1, kind);
}

void rt_persist_generation(dp_t *dp, ctl_t *c, const SnapHeader *h, const void *payload) {
    char err[1024];
    SnapRegion all = {payload, h->length};
    if (checkpoint_write_shard(dp->cfg.out, h, &all, 1, err, sizeof err) != 0 ||
        (dp->cfg.nnodes > 0 && checkpoint_write_config(dp->cfg.out, h->step, dp->cfg_text, err, sizeof err) != 0)) {
        log_msg("persist step %lld: %s", (long long)h->step + 1, err);
        return;
    }
    count_persisted(dp, c, h, "persist");
    long long g = dp->cfg.nnodes > 0 ? ctl_persist_complete(c) : -1;
    if (g >= 0) checkpoint_prune_below(dp->cfg.out, g, pinned_step(dp));
}

/* Runs on a snapshot thread: the previous epoch's may still be finishing a generation (its
 * wait was aborted with the epoch) while the new epoch's commits, and both use snap_ctl. */
void rt_on_commit(const SnapHeader *h, const void *payload, void *arg) {
    dp_t *dp = arg;
    pthread_mutex_lock(&dp->snap_ctl_mu);
    pthread_mutex_lock(&dp->pub_mu); /* what republish writes again when Redis was away */
    if (h->epoch > dp->pub_epoch || (h->epoch == dp->pub_epoch && h->step > dp->pub_step)) {
        dp->pub_epoch = h->epoch;
        dp->pub_step = h->step;
    }
    if (gen_own_state(payload, h->length)) dp->own_seen = 1;
    int own_seen = dp->own_seen;
    pthread_mutex_unlock(&dp->pub_mu);
    /* The next step's reduction waits for this callback: with the control plane away it
     * writes nothing (republish does, once Redis is back), and otherwise each call is bounded
     * by about a step, so that a stall that begins now costs at most that. */
    if (!atomic_load(&dp->ctl_down)) {
        int saved = ctl_timeout(dp->snap_ctl);
        ctl_set_timeout(dp->snap_ctl, rt_path_timeout_ms(dp));
        int failed = 0;
        if (h->length > dp->gen_bytes_published) {
            if (ctl_gen_bytes_set(dp->snap_ctl, h->rank, (long long)h->length) == 0)
                dp->gen_bytes_published = h->length; /* what a waiting spare sizes its buffer for */
            else failed = 1;
        }
        /* With the commit record, while nothing of ours was ever in a generation: the claim
         * that a coordinator counting this step as committed reads (decide.h, stateless). */
        if (!failed && ctl_committed_set(dp->snap_ctl, h->epoch, h->rank, h->step, own_seen ? -1 : h->step) != 0)
            failed = 1;
        if (failed) rt_control_down(dp, dp->snap_ctl, 0); /* owed: the heartbeat thread writes it as soon as it can */
        else ctl_wait_replica(dp->snap_ctl, 1000); /* under Sentinel: a committed generation survives a failover */
        ctl_set_timeout(dp->snap_ctl, saved);
    }
    pthread_mutex_lock(&dp->pub_mu);
    if (h->length > dp->gen_bytes_published && h->length > dp->gen_bytes_pending) dp->gen_bytes_pending = h->length;
    pthread_mutex_unlock(&dp->pub_mu);
    int every = dp->cfg.persist_every;
    if (every > 0 && (h->step + 1) % every == 0) rt_persist_generation(dp, dp->snap_ctl, h, payload);
    pthread_mutex_unlock(&dp->snap_ctl_mu);
}

/* --ft disk: every rank writes its live state, then rank 0 completes the checkpoint. */
dp_status rt_disk_checkpoint(dp_t *dp, int64_t step, const void *extra, size_t extra_len) {
    char err[1024];
    int n = rt_gather_regions(dp, step, extra, extra_len);
    if (n < 0) return DP_ERR;
    if (checkpoint_write_live(dp->cfg.out, dp->job, dp->epoch, dp->rank, dp->cfg.workers, step, dp->snap_regions, n, err,
                              sizeof err) != 0)
        log_msg("checkpoint step %lld: %s", (long long)step + 1, err);
    if (comm_barrier(dp->comm, rt_collective_bound_ms(dp, dp->block_bytes)) != COMM_OK) return DP_FAILED;
    dp->last_disk_step = step + 1;
    if (dp->rank != 0) return DP_OK;
    if (checkpoint_finish(dp->cfg.out, step, dp->cfg.workers, dp->cfg_text, app_checkpoint, dp, pinned_step(dp), err,
                          sizeof err) != 0)
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
void rt_answer_persist_request(dp_t *dp) {
    char err[256];
    PersistRequest pr;
    if (dp->persist_answered) return;
    int got = ctl_persist_request_get(dp->ctl, &pr, err, sizeof err);
    if (got < 0) log_msg("ignoring the persist request: %s", err);
    if (got != 1) return;
    if (pr.epoch != dp->epoch) return;
    long long g = pr.step;
    int writer = pr.writer;
    dp->persist_answered = 1;
    SnapHeader h;
    void *payload = NULL;
    /* A survivor whose join failed has no snapshots of the new epoch yet, or none that
     * committed: what it committed is in the old epoch's, kept until the new one commits. */
    Snapshot *s = dp->snap;
    if (!s || snapshot_local_copy(s, g, &h, &payload) != 0) {
        s = dp->restore_src;
        if (!s || snapshot_local_copy(s, g, &h, &payload) != 0) {
            log_msg("cannot persist step %lld: not in the local snapshot buffers", g + 1);
            return;
        }
    }
    rt_persist_generation(dp, dp->ctl, &h, payload);
    free(payload);
    if (writer != dp->rank) return;
    for (int i = 0; i < pr.nfailed; i++) {
        int rank = pr.failed[i];
        payload = NULL;
        if (rt_fetch_from_holders(dp, rank, g, dp->epoch, &h, &payload) != 0) {
            StatelessPersist sp = {dp, rank, -1};
            if (!rt_rank_stateless(dp, rank, g) || snapshot_local_use(s, g, persist_as_stateless, &sp) != 0 || sp.rc != 0)
                log_msg("cannot persist rank %d's step %lld: no holder has it", rank, g + 1);
            continue;
        }
        rt_persist_generation(dp, dp->ctl, &h, payload);
        if (!rt_payload_is_ours(dp, payload)) free(payload);
    }
}

/* Without a control plane nobody can decide a recovery: every rank writes the generations in
 * its ping-pong buffers to disk (the newest one every rank committed is among them, see
 * snapshot.h), and rank 0 completes the newest step all ranks wrote (a shared filesystem:
 * one machine, or --out on shared storage). Bounded; no Redis involved. */
void rt_persist_without_control(dp_t *dp) {
    Snapshot *s = dp->snap ? dp->snap : dp->restore_src;
    if (!s) return;
    snapshot_drain(s, rt_collective_bound_ms(dp, dp->block_bytes));
    /* A join that failed after starting the new epoch's snapshots left them empty: what this
     * process committed is still in the old epoch's, kept until the new epoch commits. */
    if (snapshot_committed(s) < 0 && s == dp->snap && dp->restore_src) {
        s = dp->restore_src;
        snapshot_drain(s, rt_collective_bound_ms(dp, dp->block_bytes));
    }
    int64_t newest = snapshot_committed(s), g[2] = {newest, newest - dp->cfg.snapshot_every};
    if (newest < 0) return; /* nothing committed (a spare that took a rank): nothing to write or complete */
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
            if (checkpoint_finish(dp->cfg.out, g[i], dp->cfg.workers, dp->cfg_text, app_checkpoint, dp, pinned_step(dp),
                                  err, sizeof err) == 0)
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
