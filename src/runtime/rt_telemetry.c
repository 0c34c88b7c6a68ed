/* rt_telemetry.c — what a process tells the job while it trains, and keeps telling it: the
 * heartbeat thread, rank 0's metrics lines (queued while Redis is away), the `recovered` and
 * `snapshot_stats` events, and the control plane's outages: Redis marked down, and this
 * process's keys republished once it is back. */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime_internal.h"

#include "events.h"
#include "protocol.h"
#include "util.h"

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
void rt_control_down(dp_t *dp, const ctl_t *c, int confirmed) {
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
void rt_note_failure(dp_t *dp, const ctl_t *c) {
    if (ctl_error_transient(c)) rt_control_down(dp, c, 0);
}

/* The bound on a Redis call on the training path: a third of a step (the step that meets an
 * outage may pay it on each of the fence check, the commit record and, across ranks, a
 * collective's partner: about one step in all), 5 ms at least, a quarter of the detect timeout
 * at most (before the first step, that quarter). */
int rt_path_timeout_ms(const dp_t *dp) {
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
        bad |= ctl_proc_set(c, dp->proc_id, PROC_REPLICA, dp->reg_replica) | ctl_proc_set(c, dp->proc_id, PROC_HOST, dp->reg_host) |
               ctl_proc_set(c, dp->proc_id, PROC_NODE, dp->node) | ctl_proc_set(c, dp->proc_id, PROC_PID, dp->reg_pid);
    pthread_mutex_lock(&dp->pub_mu);
    long long pe = dp->pub_epoch, ps = dp->pub_step;
    int rank = dp->pub_rank;
    pthread_mutex_unlock(&dp->pub_mu);
    if (rank >= 0 && e <= cur) {
        bad |= ctl_set_rank_owner(c, rank, dp->proc_id);
        pthread_mutex_lock(&dp->pub_mu);
        int own_seen = dp->own_seen;
        size_t gb = dp->gen_bytes_pending > dp->gen_bytes_published ? dp->gen_bytes_pending : dp->gen_bytes_published;
        pthread_mutex_unlock(&dp->pub_mu);
        if (pe == cur && ps >= 0) bad |= ctl_committed_set(c, pe, rank, ps, own_seen ? -1 : ps);
        if (gb) bad |= ctl_gen_bytes_set(c, rank, (long long)gb);
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
        bad |= held_format(hg, n, held, cap) != 0 ? -1 : ctl_proc_set(c, dp->proc_id, PROC_HELD, held);
    }
    free(held);
    free(hg);
    bad |= mq_flush(dp, c);
    if (!bad) ctl_wait_replica(c, 1000);
    return bad ? -1 : 0;
}

/* Redis may be away the moment the thread starts (stalled while the job's processes start).
 * A thread that gave up then would leave the process without heartbeat (declared dead once
 * Redis is back) or without its abort watch: it tries again, with the control plane marked
 * down meanwhile (nothing on the training path waits for it). */
ctl_t *rt_thread_connect(dp_t *dp, const char *who) {
    char err[256];
    for (int logged = 0; !atomic_load(&dp->hb_stop);) {
        ctl_t *c = ctl_connect(&dp->addr, dp->job, 2000, err, sizeof err);
        if (c) {
            ctl_set_job_key(c, dp->job_key); /* any connection of the process verifies what it reads */
            return c;
        }
        if (!ctl_connect_error_transient()) break;
        if (!logged++) log_msg("%s: %s; trying again", who, err);
        rt_control_down(dp, NULL, 0);
        sleep_ms(200);
    }
    if (!atomic_load(&dp->hb_stop)) log_msg("%s: %s", who, err);
    return NULL;
}

void *rt_heartbeat_loop(void *arg) {
    dp_t *dp = arg;
    pthread_setname_np(pthread_self(), "dp-heartbeat");
    ctl_t *c = rt_thread_connect(dp, "heartbeat");
    if (!c) return NULL;
    int period = dp->cfg.detect_timeout_ms / 4;
    /* The beat keeps its generous timeout (2 s): a slow Redis still gets the heartbeat, and a
     * stalled one answers the beat waiting in its socket the moment it runs again. */
    while (!atomic_load(&dp->hb_stop)) {
        int ok = ctl_heartbeat(c, dp->proc_id, dp->cfg.detect_timeout_ms) == 0;
        if (!ok) rt_control_down(dp, c, 1); /* not answering our heartbeat, whatever the reason */
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
        job_state state;
        if (ok && ctl_state_get(c, &state) == 1 && state != JOB_STATE_RUNNING) atomic_store(&dp->job_over, 1);
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

/* committed: newest step (1-based) that every rank can restore, 0 if none; with the control
 * plane away, this rank's own newest commit. */
static long long committed_step(dp_t *dp, int ask) {
    if (!dp->snap) return dp->last_disk_step;
    long long c = ask ? ctl_committed_min(dp->ctl, dp->epoch, dp->cfg.workers) : -2;
    if (c == -2 && ask) rt_note_failure(dp, dp->ctl);
    if (c == -2) c = snapshot_committed(dp->snap);
    return c >= 0 ? c + 1 : 0;
}

/* Rank 0's metrics line: pushed at once, bounded by about a step; queued behind lines that
 * wait for Redis (the heartbeat thread sends them, in order, when it is back). */
void rt_push_metrics(dp_t *dp, int64_t step, const dp_metrics *m, double step_ms) {
    pthread_mutex_lock(&dp->pub_mu);
    int direct = !atomic_load(&dp->ctl_down) && dp->mq_n == 0 && !dp->mq_flushing;
    pthread_mutex_unlock(&dp->pub_mu);
    int saved = ctl_timeout(dp->ctl);
    if (direct) ctl_set_timeout(dp->ctl, rt_path_timeout_ms(dp));
    long long committed = committed_step(dp, direct);
    if (atomic_load(&dp->ctl_down)) direct = 0;
    char json[640], app[128] = "";
    double tokens = m ? m->tokens : 0.0;
    /* No metrics from the loop (a DDP program under the deadpool backend): no loss, lr or
     * gradient norm in the line, rather than zeros that read as values. */
    if (m) snprintf(app, sizeof app, "\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,", m->loss, m->lr, m->grad_norm);
    snprintf(json, sizeof json,
             "{\"step\":%lld,%s\"step_ms\":%.3f,"
             "\"tokens_per_s\":%.1f,\"epoch\":%ld,\"committed_step\":%lld,\"snapshot_wait_ms\":%.3f,\"t\":%.3f}",
             (long long)step + 1, app, step_ms, step_ms > 0 ? tokens / (step_ms / 1e3) : 0.0, dp->epoch, committed,
             dp->snapshot_wait_ms, (double)(wall_ms() - dp->t0_wall_ms) / 1e3);
    if (!direct) {
        mq_push(dp, json);
    } else if (ctl_push_metric(dp->ctl, json) != 0) {
        rt_note_failure(dp, dp->ctl);
        mq_push(dp, json);
    }
    ctl_set_timeout(dp->ctl, saved);
}

/* Rank 0 of a new epoch, after its first step: one `recovered` event with the timeline. */
void rt_report_recovery(dp_t *dp) {
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
    /* Data-plane connections made for this epoch: by a survivor (a member of the epoch before),
     * by the replacements, and dialed in all (each connection is dialed once). */
    long long surv_max = -1, surv_min = -1, new_max = -1, dialed_total = 0;
    int world = dp->cfg.workers;
    JoinTiming *tm = malloc(sizeof *tm * (size_t)world);
    JoinStats *js = malloc(sizeof *js * (size_t)world);
    int *has_t = malloc(sizeof *has_t * (size_t)world), *has_s = malloc(sizeof *has_s * (size_t)world);
    long long last = 0;
    if (!tm || !js || !has_t || !has_s || !warm) goto out;
    if (ctl_joins_get(dp->ctl, dp->epoch, world, tm, has_t, js, has_s, &last) != 0 || last < 0) last = 0;
    for (int r = 0; r < world; r++) { /* a member that wrote no record is skipped */
        if (has_t[r]) {
            const JoinTiming *t = &tm[r];
            warm[r] = t->warm;
            if (t->restore_ms > restore) restore = t->restore_ms;
            if (t->rebuild_ms > rebuild) rebuild = t->rebuild_ms;
            if (t->resnapshot_ms > resnap) resnap = t->resnapshot_ms;
            if (t->resumed_wall_ms > resumed) resumed = t->resumed_wall_ms;
        }
        if (has_s[r]) {
            const JoinStats *s = &js[r];
            unsigned long long rtt = (unsigned long long)s->ctl_round_trips + (unsigned long long)s->store_round_trips;
            if (rtt > rtt_max) rtt_max = rtt;
            rtt_total += rtt;
            if (s->rendezvous_ms > rendezvous) rendezvous = s->rendezvous_ms;
            if (s->barrier_ms > barrier) barrier = s->barrier_ms;
            if (s->wait_ms > rwait) rwait = s->wait_ms;
            if (s->connect_ms > rconnect) rconnect = s->connect_ms;
            if (!first_in || s->entered_wall_ms < first_in) first_in = s->entered_wall_ms;
            long long made = s->dialed + s->accepted;
            int replaced = 0;
            for (int i = 0; i < d->nfailed; i++) replaced |= d->failed[i].rank == r;
            long long *hi = replaced ? &new_max : &surv_max;
            if (made > *hi) *hi = made;
            if (!replaced && (surv_min < 0 || made < surv_min)) surv_min = made;
            dialed_total += s->dialed;
            if (s->entered_wall_ms > last_in) last_in = s->entered_wall_ms;
        }
    }
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
                   "\"restore_warm\":%s,\"survivor_connections_max\":%lld,\"survivor_connections_min\":%lld,"
                   "\"replacement_connections_max\":%lld,\"connections_total\":%lld",
                   dp->epoch, d->failed[i].rank, d->failed[i].spare_proc, d->failed[i].kind, d->rollback + 1,
                   (long long)(d->t_detect_ms - d->t_fail_ms), (long long)(d->t_decide_ms - d->t_detect_ms), restore,
                   rebuild, resnap, total, first_step, last - (d->rollback + 1), world, rendezvous, rwait,
                   rconnect, last_in - first_in, last_in ? last_in - (long long)d->t_decide_ms : 0, barrier, rtt_max,
                   rtt_total, (long long)d->t_fail_ms, resumed, warm[d->failed[i].rank] ? "true" : "false", surv_max,
                   surv_min, new_max, dialed_total);
    }
    if (d->nfailed == 0)
        event_emit(dp->ctl, dp->t0_wall_ms, "recovered",
                   "\"epoch\":%ld,\"rank\":-1,\"failure_kind\":\"comm\",\"rollback_step\":%lld,\"total_ms\":%lld",
                   dp->epoch, d->rollback + 1, total);
out:
    free(warm);
    free(tm);
    free(js);
    free(has_t);
    free(has_s);
}

void rt_report_snapshot_stats(dp_t *dp) {
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
