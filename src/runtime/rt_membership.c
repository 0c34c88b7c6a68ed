/* rt_membership.c — a process becoming and staying a member: joining an epoch's collectives,
 * a spare waiting warm until a decision hands it a rank, following the coordinator's
 * decisions through a recovery (restore the rollback generation, rebuild, go on), and
 * dp_join and dp_recover themselves. The rest of deadpool.h's flow is runtime.c. */
#include "deadpool.h"

#include <dirent.h>
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
#include <sys/resource.h>
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
#include "protocol.h"
#include "recovery.h"
#include "replica.h"
#include "runtime.h"
#include "runtime_internal.h"
#include "secret.h"
#include "snapshot.h"
#include "util.h"
/* --- membership ---------------------------------------------------------------------- */

static int join_communicator(dp_t *dp, int timeout_ms, char *err, size_t errlen) {
    char prefix[256];
    ctl_key_full(dp->ctl, prefix, sizeof prefix, KEY_GLOO, dp->epoch, 0);
    EpochStore es;
    if (rt_epoch_store(dp, &es, err, errlen) != 0) return -1;
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
        double wait, connect;
        int dialed, accepted;
        comm_rendezvous_ms(dp->comm, &wait, &connect);
        comm_connections(dp->comm, &dialed, &accepted);
        JoinStats js = {.ctl_round_trips = (long long)ctl_round_trips_since_mark(dp->ctl) + 1,
                        .store_round_trips = (long long)comm_store_round_trips(dp->comm), .rendezvous_ms = t1 - t0,
                        .barrier_ms = now_ms() - t1, .wait_ms = wait, .connect_ms = connect, .entered_wall_ms = entered,
                        .dialed = dialed, .accepted = accepted};
        ctl_join_stats_set(dp->ctl, dp->epoch, dp->rank, &js);
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
    rt_set_role_log(dp);
    replica_server_set_min_epoch(dp->replicas, d->epoch);
    dp->restore_cold = 0;
    if (rt_restore_generation(dp, dp->restore_src, d->rollback, err, errlen) != 0) return LC_IN_RESTORE_FAILED;
    rt_lc_feed(dp, LC_IN_RESTORED); /* REJOINING: a failure from here on is the rendezvous' */
    log_msg("restored step %lld in %.1f ms", d->rollback + 1, now_ms() - t0);
    rt_maybe_inject_in_recovery(dp);
    double t1 = now_ms();
    /* Everyone is warm and restores in parallel: if a member does not show up within this
     * bound it died during recovery, and the coordinator will decide again. */
    int join_timeout = 2 * dp->cfg.detect_timeout_ms + 3000;
    if (join_communicator(dp, join_timeout, err, errlen) != 0) return LC_IN_JOIN_FAILED;
    int state_lost = 0;
    if (d->rollback >= 0 && rt_share_and_rebuild(dp, &state_lost, err, errlen) != DP_OK)
        return state_lost ? LC_IN_RESTORE_FAILED : LC_IN_JOIN_FAILED;
    double t2 = now_ms();
    if (dp->cfg.ft == FT_DEADPOOL) {
        if (rt_start_snapshots(dp, err, errlen) != 0) return LC_IN_JOIN_FAILED;
        /* The restore point is snapshotted again in the new epoch; the first step waits for
         * its commit before reducing (as every step does), so this overlaps with that step's
         * forward/backward. Until then the old buffers stay as a second copy. */
        if (d->rollback >= 0 && rt_capture_zero_copy(dp, d->rollback, dp->restored_extra, dp->restored_extra_len) == 0) {
            int n = rt_gather_regions(dp, d->rollback, dp->restored_extra, dp->restored_extra_len);
            if (n < 0) { snprintf(err, errlen, "%s", dp->err); return LC_IN_JOIN_FAILED; }
            snapshot_capture_regions(dp->snap, d->rollback, dp->snap_regions, n, dp->snap_locals, dp->nlocals);
        }
    }
    JoinTiming jt = {.restore_ms = t1 - t0, .rebuild_ms = t2 - t1, .resnapshot_ms = now_ms() - t2,
                     .resumed_wall_ms = wall_ms(), .warm = dp->restore_cold == 0};
    ctl_join_timing_set(dp->ctl, dp->epoch, dp->rank, &jt);
    dp->step_t0 = now_ms();
    return LC_IN_JOINED;
}

/* wait_for_decision's loop, its Redis calls bounded by the caller. */
static long wait_for_decision_within(dp_t *dp, int timeout_ms) {
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
        if (e < 0) rt_note_failure(dp, dp->ctl);
        if (e > dp->epoch) return e;
        if (dp->rank >= 0) rt_answer_persist_request(dp);
        if (ctl_wait_notice(dp->ctl, dp->proc_id, KEY_NOTICE, 100) < 0) sleep_ms(100); /* Redis unreachable */
    }
    return -1;
}

/* Waits (bounded) for a decision newer than our epoch. The decision's epoch, 0 when the job
 * ended, -1 on timeout. */
static long wait_for_decision(dp_t *dp, int timeout_ms) {
    /* Each Redis call of the wait is bounded by a quarter of --control-wait (500 ms at least,
     * for the 100 ms BLPOP; never more than the connection's own bound): a call blocked on a
     * stalled server for the connection's 5 s would let an outage outlast --control-wait
     * unnoticed (a survivor whose join had failed kept nothing on disk). */
    int saved = ctl_timeout(dp->ctl), bound = job_control_outage_ms(&dp->cfg) / 4;
    if (bound < 500) bound = 500;
    if (bound < saved) ctl_set_timeout(dp->ctl, bound);
    long e = wait_for_decision_within(dp, timeout_ms);
    ctl_set_timeout(dp->ctl, saved);
    return e;
}

/* LC_ACT_PERSIST_LOCAL: the control plane is lost; what this process committed goes to disk. */
void rt_control_lost_persist(dp_t *dp, char *err, size_t errlen) {
    rt_persist_without_control(dp);
    snprintf(err, errlen, "the control plane (redis) is lost");
}

/* LC_ACT_REPORT_FENCED: epoch e does not include this process. */
void rt_report_fenced(dp_t *dp, long e) {
    log_msg("fenced: epoch %ld no longer includes this process; leaving", e);
    event_emit(dp->ctl, dp->t0_wall_ms, "fenced", "\"proc\":%ld,\"pid\":%d,\"epoch\":%ld", dp->proc_id, (int)getpid(), e);
}

/* WAITING or RETRYING (LC_ACT_AWAIT_DECISION): waits for the coordinator's decision and feeds
 * the lifecycle what came of it: a decision naming this process (read into d), one fencing
 * it, the job over, the control plane lost, or nothing in time. The actions of that
 * transition. */
lc_actions rt_await_decision(dp_t *dp, Decision *d, long *epoch) {
    long e = wait_for_decision(dp, dp->cfg.spare_wait * 1000 + 4 * dp->cfg.detect_timeout_ms + 30000);
    *epoch = e;
    if (e == 0) return rt_lc_feed(dp, atomic_load(&dp->control_lost) ? LC_IN_CONTROL_LOST : LC_IN_JOB_OVER);
    if (e < 0 || decision_read(dp->ctl, e, d) != 0) return rt_lc_feed(dp, LC_IN_NO_DECISION);
    return rt_lc_feed(dp, decision_rank_of(d, dp->proc_id) < 0 ? LC_IN_FENCED : LC_IN_DECISION_MINE);
}

/* RETRYING (a join failed; a: the transition's actions): reports it, drops the epoch's
 * communicators and waits for the next decision. DP_OK with d read when one names this
 * process (RESTORING); else how the wait ended: DP_STOPPED (the job ended, or the control
 * plane is lost), DP_FENCED, DP_ERR (no decision came). */
static dp_status retry_after_failed_join(dp_t *dp, lc_actions a, Decision *d, char *err, size_t errlen) {
    /* JOIN_RESTORE: this rank's state is unreachable (the coordinator stops the job rather
     * than hand the next spare the same hopeless decision); otherwise a member is missing
     * and the coordinator decides again. */
    if (a.flags & LC_ACT_REPORT_JOIN_FAILED) {
        Report r = {.kind = REPORT_JOIN_FAILED, .epoch = dp->epoch, .rank = dp->rank, .step = -1, .t_wall_ms = wall_ms(),
                    .phase = a.phase};
        snprintf(r.text, sizeof r.text, "%s", err);
        report_send(dp->ctl, dp->t0_wall_ms, &r);
    }
    if (a.flags & LC_ACT_END_COMMS) rt_end_epoch_comms(dp);
    if (!(a.flags & LC_ACT_AWAIT_DECISION)) return DP_ERR; /* not reached: the lifecycle logged why */
    long e;
    a = rt_await_decision(dp, d, &e);
    if (a.flags & LC_ACT_PERSIST_LOCAL) rt_control_lost_persist(dp, err, errlen);
    if (dp->lc == LC_STOPPED) return DP_STOPPED;
    if (dp->lc == LC_FAILED) {
        snprintf(err, errlen, "no recovery decision arrived: giving up");
        return DP_ERR;
    }
    if (a.flags & LC_ACT_REPORT_FENCED) rt_report_fenced(dp, e);
    if (dp->lc == LC_FENCED) return DP_FENCED;
    return a.flags & LC_ACT_RESTORE ? DP_OK : DP_ERR; /* DP_ERR: not reached, the lifecycle logged why */
}

/* RESTORING (a decision named this process): follows decisions until this process is a
 * working member of one: DP_OK (RESUMING), else as retry_after_failed_join. */
dp_status rt_follow_decisions(dp_t *dp, Decision *d, char *err, size_t errlen) {
    for (;;) {
        lc_input outcome = join_epoch(dp, d, err, errlen);
        lc_actions a = rt_lc_feed(dp, outcome);
        if (dp->lc == LC_RESUMING) return DP_OK;
        /* Usually a member died while recovering; the coordinator decides again. */
        log_msg("joining epoch %ld failed: %s", dp->epoch, err);
        dp_status st = retry_after_failed_join(dp, a, d, err, errlen);
        if (st != DP_OK) return st;
    }
}

/* Epoch 0's rendezvous or broadcast failed: a member died or hung as the job started (its
 * epoch was closed, or it never came). The coordinator replaces it as it would in a step, and
 * this process, a survivor with nothing committed, follows that decision (rolling back to the
 * start, or to the resumed checkpoint) instead of stopping the job as a bad one. */
static dp_status start_rendezvous_failed(dp_t *dp, char *err, size_t errlen) {
    lc_actions a = rt_lc_feed(dp, LC_IN_JOIN_FAILED); /* RETRYING */
    dp_status st = retry_after_failed_join(dp, a, &dp->decision, err, errlen);
    return st == DP_OK ? rt_follow_decisions(dp, &dp->decision, err, errlen) : st;
}

static dp_status join_initial(dp_t *dp, char *err, size_t errlen) {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    event_emit(dp->ctl, dp->t0_wall_ms, "rank_joined", "\"rank\":%d,\"proc\":%ld,\"pid\":%d,\"host\":\"%s\"", dp->rank,
               dp->proc_id, (int)getpid(), host);
    dp->epoch = 0;
    rt_maybe_inject_in_recovery(dp); /* rkill:R@0: a member dies as the job starts */
    if (join_communicator(dp, dp->cfg.start_timeout_ms, err, errlen) != 0) {
        rt_emit_error(dp, "joining the communicator failed: ", err);
        return start_rendezvous_failed(dp, err, errlen);
    }
    if (dp->cfg.resume_step >= 0) { /* resumed from disk: every rank restores its state file */
        SnapHeader h;
        void *payload = NULL;
        int rc = rt_read_resumed_state(dp, dp->rank, &h, &payload, err, errlen);
        if (rc == 0) rc = rt_restore_payload(dp, &h, payload, NULL, 0, err, errlen);
        free(payload);
        if (rc != 0) { rt_emit_error(dp, "resume: ", err); rt_lc_feed(dp, LC_IN_START_FAILED); return DP_ERR; }
        if (rt_share_and_rebuild(dp, NULL, err, errlen) != DP_OK) {
            rt_emit_error(dp, "resume: ", err);
            return start_rendezvous_failed(dp, err, errlen);
        }
    }
    /* Redis away while the job starts is no bad job (item 12): tried again within
     * --control-wait; past it, the process exits as failed and is replaced. */
    for (double deadline = now_ms() + job_control_outage_ms(&dp->cfg); dp->cfg.ft == FT_DEADPOOL;) {
        int rc = rt_start_snapshots(dp, err, errlen);
        if (rc == 0) break;
        if (rc == -2 && now_ms() < deadline) {
            sleep_ms(200);
            continue;
        }
        if (rc == -2) atomic_store(&rt_init_transient, 1);
        rt_emit_error(dp, "snapshots: ", err);
        rt_lc_feed(dp, LC_IN_START_FAILED);
        return DP_ERR;
    }
    dp->step_t0 = now_ms();
    rt_lc_feed(dp, LC_IN_STARTED); /* STEPPING */
    return DP_OK;
}

/* A spare is warm (the application built its state before dp_join) and waits for a decision
 * that names it. */
static dp_status join_as_spare(dp_t *dp, char *err, size_t errlen) {
    rt_warm_restore_buffer(dp); /* before entering the pool: a decision may name us at once */
    /* The epoch before entering the pool: a decision that names us can only come after it,
     * and may come before the next line runs (a failure waiting for a spare is decided the
     * moment one joins): read after, it would be taken as already seen. */
    long seen = ctl_epoch(dp->ctl);
    for (double deadline = now_ms() + job_control_outage_ms(&dp->cfg); ctl_spare_add(dp->ctl, dp->proc_id) != 0;)
        if (!rt_retry_transient(dp->ctl, deadline)) {
            snprintf(err, errlen, "cannot join the spare pool: %s", ctl_last_error(dp->ctl));
            rt_lc_feed(dp, LC_IN_START_FAILED);
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
            rt_warm_grow_check(dp);
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
                rt_priority_default();
                lc_actions a = rt_lc_feed(dp, LC_IN_DECISION_MINE); /* RESTORING */
                if (a.flags & LC_ACT_LEAVE_POOL) {
                    atomic_store(&dp->in_pool, 0);
                    ctl_spare_remove(dp->ctl, dp->proc_id);
                    rt_warm_grow_finish(dp, 1); /* started long before, if at all: what is left is cheaper than faulting */
                }
                dp_status st = a.flags & LC_ACT_RESTORE ? rt_follow_decisions(dp, d, err, errlen) : DP_ERR;
                rt_release_warm_buffer(dp);
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
    lc_actions a = rt_lc_feed(dp, atomic_load(&dp->control_lost) && !launcher_gone ? LC_IN_CONTROL_LOST : LC_IN_JOB_OVER);
    if (a.flags & LC_ACT_LEAVE_POOL) {
        atomic_store(&dp->in_pool, 0);
        ctl_spare_remove(dp->ctl, dp->proc_id);
    }
    rt_release_warm_buffer(dp);
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
