/* coordinator.c — detection, decisions, and the no-spare fallback. */
#include "coordinator.h"
#include "coordinator_internal.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint.h"
#include "comm.h"
#include "config.h"
#include "decide.h"
#include "events.h"
#include "protocol.h"
#include "recovery.h"
#include "runtime.h"
#include "util.h"

Coordinator *coord_create(ctl_t *ctl, const JobConfig *cfg, int64_t t0_wall_ms, const char *node) {
    Coordinator *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->ctl = ctl;
    c->cfg = cfg;
    job_config_resume_command(cfg, c->resume, sizeof c->resume);
    c->t0_wall_ms = t0_wall_ms;
    c->rollback = cfg->resume_step;
    c->view.reachable = 1;
    c->outage_epoch = -1;
    snprintf(c->my_node, sizeof c->my_node, "%s", node);
    return c;
}

void coord_free(Coordinator *c) { free(c); }

void coord_set_fence(Coordinator *c, const char *lease) { snprintf(c->fence, sizeof c->fence, "%s", lease ? lease : ""); }

/* A launcher that takes over: the epoch, its restore point and whether it is closed are in
 * Redis; members, failures and spares are found again by the first ticks (heartbeats, exit
 * records, the events still queued), as after a start. A closed epoch with nothing pending
 * gets a rebuild once detection had its time (its members wait for a decision). */
int coord_take_over(Coordinator *c) {
    long e = ctl_epoch(c->ctl);
    if (e < 0) return -1;
    c->epoch = e;
    if (e > 0) {
        Decision *d = malloc(sizeof *d);
        if (!d || decision_read(c->ctl, e, d) != 0) { free(d); return -1; }
        c->rollback = d->rollback;
        free(d);
    }
    c->fenced = epoch_fenced(c->ctl, e) == 1;
    if (c->fenced) c->suspicion_ms = now_ms();
    /* Under Sentinel the coordinator may have been lost with the master (one machine): the
     * processes' heartbeats expired while the sentinels failed over, which says nothing about
     * them. They get one detect timeout to beat again, as after an outage (check_liveness). */
    if (ctl_replicated(c->ctl)) c->decide_after = now_ms() + c->cfg->detect_timeout_ms;
    long long ls;
    if (ctl_last_step_get(c->ctl, &ls) == 0) c->last_step = (int)ls;
    log_msg("coordinating job %s from epoch %ld (restore point step %lld%s)", ctl_job(c->ctl), e, c->rollback + 1,
            c->fenced ? ", closed: its decision is due" : "");
    return 0;
}

int coord_unhandled_failure(const Coordinator *c, char *kind, size_t len, int64_t *t_fail_ms) {
    if (c->npending == 0) return -1;
    snprintf(kind, len, "%s", c->pending[0].kind);
    *t_fail_ms = c->pending[0].t_fail_ms;
    return c->pending[0].rank;
}

const char *coord_message(const Coordinator *c) { return c->message; }

long coord_epoch(const Coordinator *c) { return c->epoch; }

void coord_progress(Coordinator *c, int step) { if (step > c->last_step) c->last_step = step; }

/* Facts of procs[0..n) in one round trip: pids[i] = its pid when it runs on this machine,
 * else 0; nodes[i] its machine and endpoints[i] its replica server (either may be NULL). */
void co_member_facts(Coordinator *c, const long *procs, int n, pid_t *pids, char (*nodes)[NODE_ID_MAX],
                         char (*endpoints)[ENDPOINT_MAX]) {
    static const ctl_proc_field fields[] = {PROC_NODE, PROC_PID, PROC_REPLICA};
    char (*v)[ENDPOINT_MAX] = n > 0 ? malloc(sizeof *v * 3 * (size_t)n) : NULL;
    for (int i = 0; i < n; i++) {
        pids[i] = 0;
        if (nodes) nodes[i][0] = 0;
        if (endpoints) endpoints[i][0] = 0;
    }
    if (!v || ctl_proc_get_many(c->ctl, procs, n, fields, 3, v[0], ENDPOINT_MAX) != 0) {
        free(v);
        return;
    }
    for (int i = 0; i < n; i++) {
        long long pid;
        if (!strcmp(v[3 * i], c->my_node) && proto_int_parse(v[3 * i + 1], "pid", 1, INT_MAX, &pid, NULL, 0) == 0)
            pids[i] = (pid_t)pid;
        if (nodes) snprintf(nodes[i], NODE_ID_MAX, "%.*s", NODE_ID_MAX - 1, v[3 * i]);
        if (endpoints) snprintf(endpoints[i], ENDPOINT_MAX, "%s", v[3 * i + 2]);
    }
    free(v);
}

/* Epoch 0's members are whoever claimed the ranks; known once every rank is claimed. Two
 * round trips whatever the world: the owners (MGET), then their hosts and pids (pipelined). */
static int load_members(Coordinator *c) {
    long procs[RECOVERY_MAX_RANKS];
    if (ctl_rank_owners(c->ctl, c->cfg->workers, procs) != 0) return -1;
    for (int r = 0; r < c->cfg->workers; r++)
        if (procs[r] <= 0) return -1;
    memcpy(c->procs, procs, sizeof(long) * (size_t)c->cfg->workers);
    co_member_facts(c, c->procs, c->cfg->workers, c->pids, c->node, c->endpoint);
    c->have_members = 1;
    return 0;
}

/* Everything decide_next needs, from the coordinator's state and the job's Redis keys. */
static void gather_input(Coordinator *c, int suspicion_due) {
    DecideInput *in = &c->in;
    in->ft = c->cfg->ft;
    in->epoch = c->epoch;
    in->world = c->cfg->workers;
    memcpy(in->procs, c->procs, sizeof(long) * (size_t)in->world);
    in->nfailed = c->npending;
    in->suspicion_due = suspicion_due;
    in->now_wall_ms = wall_ms();
    in->resume = c->resume;
    in->spare_wait = c->cfg->spare_wait;
    in->restore_point = c->rollback;
    in->fruitless_rebuilds = c->fruitless_rebuilds;
    in->control_unsettled = !coord_control_settled(c);
    in->committed_min = c->outage_epoch == c->epoch ? co_committed_after_outage(c) : ctl_committed_min(c->ctl, c->epoch, c->cfg->workers);
    if (in->committed_min == -2) in->control_unsettled = 1; /* not read: decided at a later tick, not from nothing */
    in->checkpoint_step = -1;
    in->nspares = 0;
    for (int i = 0; i < c->npending; i++) {
        DecideFailure *f = &in->failed[i];
        f->rank = c->pending[i].rank;
        snprintf(f->kind, sizeof f->kind, "%s", c->pending[i].kind);
        f->t_fail_ms = c->pending[i].t_fail_ms;
        f->t_detect_ms = c->pending[i].t_detect_ms;
        f->nholders = 0;
        f->stateless_through = -1;
    }
    /* Holders, checkpoints and spares matter only when a failed rank can be hot-swapped. */
    if (c->npending == 0 || c->cfg->ft != FT_DEADPOOL) return;
    for (int i = 0; i < c->npending; i++) co_gather_holders(c, &in->failed[i]);
    co_gather_stateless(c, in);
    char err[256];
    in->checkpoint_step = checkpoint_latest(c->cfg->out, err, sizeof err);
    in->nspares = co_live_spares(c, in->spares, DP_MAX_RANKS);
}

/* Publishes decision d (a swap or a rebuild) and moves the coordinator to its epoch. */
/* Publishing is one round trip (decision_publish); the bookkeeping that no member waits for
 * (the newest step, the spares' pool, the events) comes after it. */
static void decide(Coordinator *c, Decision *d) {
    d->t_decide_ms = wall_ms();
    if (decision_publish(c->ctl, d, c->fence[0] ? c->fence : NULL) != 0) {
        log_msg("publishing the decision failed: %s", ctl_last_error(c->ctl));
        return;
    }
    co_rtt_end(c);
    unsigned long long rtt = c->rtt_failure;
    c->rtt_counting = 0;
    if (ctl_batch_begin(c->ctl) == 0) {
        ctl_batch_last_step(c->ctl, c->last_step);
        for (int i = 0; i < d->nfailed; i++) ctl_batch_spare_remove(c->ctl, d->failed[i].spare_proc);
        if (ctl_batch_end(c->ctl) != 0) log_msg("recording the decision's step and spares: %s", ctl_last_error(c->ctl));
    }
    for (int i = 0; i < d->nfailed; i++)
        event_emit(c->ctl, c->t0_wall_ms, "failure", "\"rank\":%d,\"proc\":%ld,\"kind\":\"%s\",\"epoch\":%ld",
                   d->failed[i].rank, d->failed[i].old_proc, d->failed[i].kind, c->epoch);
    event_emit(c->ctl, c->t0_wall_ms, "decision",
               "\"epoch\":%ld,\"rollback_step\":%lld,\"failed\":%d,\"world\":%d,\"redis_round_trips\":%llu",
               d->epoch, d->rollback + 1, d->nfailed, d->world, rtt);
    for (int i = 0; i < d->nfailed; i++) {
        log_msg("epoch %ld: spare %ld takes rank %d; rolling back to step %lld", d->epoch, d->failed[i].spare_proc,
                d->failed[i].rank, d->rollback + 1);
        pid_t old = c->pids[d->failed[i].rank];
        /* A stopped ex-member is woken so that it finds itself fenced and leaves. */
        if (old > 0) kill(old, SIGCONT);
    }
    if (d->rollback > c->rollback) c->fruitless_rebuilds = 0; /* a step was committed in between */
    if (d->nfailed == 0) c->fruitless_rebuilds++;
    c->epoch = d->epoch;
    c->rollback = d->rollback;
    memcpy(c->procs, d->procs, sizeof(long) * (size_t)d->world);
    long spares[RECOVERY_MAX_RANKS];
    pid_t spids[RECOVERY_MAX_RANKS];
    for (int i = 0; i < d->nfailed; i++) spares[i] = d->failed[i].spare_proc;
    char (*nodes)[NODE_ID_MAX] = malloc(sizeof *nodes * (size_t)(d->nfailed > 0 ? d->nfailed : 1));
    char (*eps)[ENDPOINT_MAX] = malloc(sizeof *eps * (size_t)(d->nfailed > 0 ? d->nfailed : 1));
    if (nodes && eps) co_member_facts(c, spares, d->nfailed, spids, nodes, eps);
    for (int i = 0; i < d->nfailed; i++) {
        int r = d->failed[i].rank;
        if (!nodes || !eps) spids[i] = 0;
        snprintf(c->node[r], NODE_ID_MAX, "%s", nodes && eps ? nodes[i] : "");
        snprintf(c->endpoint[r], ENDPOINT_MAX, "%s", nodes && eps ? eps[i] : "");
    }
    free(nodes);
    free(eps);
    for (int i = 0; i < d->nfailed; i++) {
        c->pids[d->failed[i].rank] = spids[i];
        c->departed[d->failed[i].rank] = 0;
    }
    c->npending = 0;
    c->batch_probed = 0;
    c->suspicion_ms = 0;
    c->waiting_spare_since = 0;
    c->fenced = 0;
}

/* Closes the epoch before deciding: from now on no member changes its state in it (members
 * check the fence before every optimizer update), and every member abandons the step it is
 * computing. Generation g = min committed then stays in every buffer and holder whatever the
 * members still do (see snapshot.h), so the decision need not wait for them. */
static void close_epoch(Coordinator *c) {
    if (c->fenced) return;
    /* One round trip: the fence first, then every member's wake-up (0 means nothing), and
     * every rank waiting in the epoch's rendezvous (a failure during a recovery) is woken. */
    if (ctl_batch_begin(c->ctl) == 0) {
        char prefix[256], wake[300];
        batch_fence_epoch(c->ctl, c->epoch);
        for (int r = 0; r < c->cfg->workers; r++) ctl_batch_notify(c->ctl, c->procs[r], KEY_ABORT, c->epoch + 1);
        ctl_key_full(c->ctl, prefix, sizeof prefix, KEY_GLOO, c->epoch, 0);
        for (int r = 0; r < c->cfg->workers; r++) {
            comm_wake_key(prefix, r, wake, sizeof wake);
            ctl_batch_push_key(c->ctl, wake, COMM_WAKE_ABORT, 3600);
        }
    }
    int closed = ctl_batch_end(c->ctl);
    if (closed == 0) co_wait_replica(c, 1000); /* under Sentinel: the fence survives a failover */
    if (closed != 0) {
        /* Redis trouble: the fence alone is what makes the epoch closed; try it on its own. */
        log_msg("closing epoch %ld: %s", c->epoch, ctl_last_error(c->ctl));
        if (fence_epoch(c->ctl, c->epoch) != 0 && ctl_error_transient(c->ctl)) return; /* not closed: tried again */
        ctl_notify_many(c->ctl, c->procs, c->cfg->workers, KEY_ABORT, c->epoch + 1);
    }
    c->fenced = 1;
}

/* No spare left: make the newest committed generation durable, so that nothing committed is
 * lost even if no spare ever comes. Members write their own states; the lowest surviving
 * rank also writes each failed rank's state, fetched from its replica holders. */
static void persist_for_fallback(Coordinator *c, long long g) {
    PersistRequest *p = calloc(1, sizeof *p);
    if (!p) return;
    p->epoch = c->epoch;
    p->step = g;
    p->writer = -1;
    for (int r = 0; r < c->cfg->workers && p->writer < 0; r++)
        if (!co_pending_has(c, r)) p->writer = r;
    for (int i = 0; i < c->npending && i < DP_MAX_RANKS; i++) p->failed[p->nfailed++] = c->pending[i].rank;
    if (ctl_persist_request_set(c->ctl, p) == -2) log_msg("the persist request of step %lld cannot be written (a step < 0?)", g + 1);
    free(p);
    ctl_notify_many(c->ctl, c->procs, c->cfg->workers, KEY_NOTICE, -1);
}

long long coord_persist_on_stop(Coordinator *c) {
    long long g = ctl_committed_min(c->ctl, c->epoch, c->cfg->workers);
    if (g < c->rollback) g = c->rollback;
    if (g < 0) return -1;
    persist_for_fallback(c, g); /* the request first: members answer it once they wait */
    close_epoch(c);             /* so that they stop training and wait */
    return g;
}

/* Ends c->message (n bytes written so far) with where the work is: the newest complete
 * checkpoint in --out and the command that continues from it, else `none`. */
static void say_newest_checkpoint(Coordinator *c, int n, const char *none) {
    char err[256];
    int64_t ck = checkpoint_latest(c->cfg->out, err, sizeof err);
    if (n < 0 || (size_t)n >= sizeof c->message) return;
    if (ck >= 0)
        snprintf(c->message + n, sizeof c->message - (size_t)n, "continue from the checkpoint of step %lld with `%s`",
                 (long long)ck + 1, c->resume);
    else
        snprintf(c->message + n, sizeof c->message - (size_t)n, "%s", none);
}

int coord_persisted(Coordinator *c, long long g) {
    char err[256];
    if (c->cfg->nnodes == 0) return checkpoint_latest(c->cfg->out, err, sizeof err) >= g;
    return ctl_persist_complete(c->ctl) >= g;
}

/* No live spare for every failed rank: persist generation g once, then wait --spare-wait
 * seconds for spares; after that the job fails with `why`, once g is on disk (or with what
 * is, when it is not within COORD_PERSIST_WAIT_MS: the message never names a checkpoint that is
 * not there). */
static coord_state no_spare(Coordinator *c, long long g, const char *why) {
    if (c->waiting_spare_since == 0) {
        c->waiting_spare_since = now_ms();
        event_emit(c->ctl, c->t0_wall_ms, "no_spare", "\"failed\":%d,\"spares\":%d,\"rollback_step\":%lld,\"wait_s\":%d",
                   c->npending, c->in.nspares, g + 1, c->cfg->spare_wait);
        /* One machine: the launcher can start what is missing (a spare that was not there
         * when the ranks failed is as good as one that was). */
        char persisting[1200] = "nothing is committed yet, so nothing is persisted"; /* failed as the job started */
        if (g >= 0) snprintf(persisting, sizeof persisting, "step %lld is being persisted to %s/ckpt", g + 1, c->cfg->out);
        if (c->cfg->nnodes == 0 && c->cfg->respawn_spares) {
            c->spares_wanted = c->npending - c->in.nspares;
            log_msg("%d rank(s) failed and %d spare(s) are in the pool: %d more wanted (started, or still starting); "
                    "%s meanwhile", c->npending, c->in.nspares, c->spares_wanted, persisting);
        } else {
            const char *rf = getenv(DP_ENV_REDIS_FILE);  /* the launcher's: URL and password, 0600 */
            const char *sf = getenv(DP_ENV_SECRET_FILE); /* the secret it drew, 0600 (else the user's file) */
            log_msg("%d rank(s) failed and %d spare(s) are left: %s; waiting up to %d s for a spare (deadpool worker "
                    "--spare --job %s %s%s --secret-file %s)", c->npending, c->in.nspares, persisting, c->cfg->spare_wait,
                    ctl_job(c->ctl), rf ? "--redis-file " : "--redis URL", rf ? rf : "", sf ? sf : "FILE");
        }
        if (c->cfg->ft == FT_DEADPOOL && g >= 0) persist_for_fallback(c, g);
    }
    double waited = now_ms() - c->waiting_spare_since, spare_wait = c->cfg->spare_wait * 1000.0;
    if (waited < spare_wait) return COORD_RUNNING;
    /* Looked at every 100 ms, not at every tick (2 ms now): a directory scan, or across
     * machines a Redis read. */
    int on_disk = c->cfg->ft != FT_DEADPOOL || g < 0;
    if (!on_disk && now_ms() - c->persist_checked_ms >= 100) {
        c->persist_checked_ms = now_ms();
        on_disk = coord_persisted(c, g);
    }
    if (on_disk) {
        snprintf(c->message, sizeof c->message, "%s", why);
        return COORD_FAILED;
    }
    if (waited < spare_wait + COORD_PERSIST_WAIT_MS) return COORD_RUNNING;
    int n = snprintf(c->message, sizeof c->message,
                     "no spare joined within %d s, and step %lld, the newest every rank committed, was not written to "
                     "%s/ckpt within %d s (the processes' messages above say why); ",
                     c->cfg->spare_wait, g + 1, c->cfg->out, COORD_PERSIST_WAIT_MS / 1000);
    say_newest_checkpoint(c, n, "no checkpoint exists");
    return COORD_FAILED;
}

/* The recovery keeps failing with no process failing (DECIDE_GIVE_UP): generation g is
 * persisted, and once it is on disk (or COORD_PERSIST_WAIT_MS later) the job fails with `why`
 * and where the work is. */
static coord_state give_up(Coordinator *c, long long g, const char *why) {
    if (c->giving_up_since == 0) {
        c->giving_up_since = now_ms();
        log_msg("%s; persisting step %lld to %s/ckpt", why, g + 1, c->cfg->out);
        if (c->cfg->ft == FT_DEADPOOL && g >= 0) persist_for_fallback(c, g);
    }
    int on_disk = c->cfg->ft != FT_DEADPOOL || g < 0;
    if (!on_disk && now_ms() - c->persist_checked_ms >= 100) {
        c->persist_checked_ms = now_ms();
        on_disk = coord_persisted(c, g);
    }
    if (!on_disk && now_ms() - c->giving_up_since < COORD_PERSIST_WAIT_MS) return COORD_RUNNING;
    say_newest_checkpoint(c, snprintf(c->message, sizeof c->message, "%s; ", why), "no checkpoint exists");
    return COORD_FAILED;
}

int coord_spares_wanted(Coordinator *c) {
    int n = c->spares_wanted;
    c->spares_wanted = 0;
    return n;
}

int coord_spare_arriving(const Coordinator *c, long proc) {
    for (int r = 0; r < c->cfg->workers; r++)
        if (c->procs[r] == proc) return 0;
    for (int i = 0; i < c->in.nspares; i++)
        if (c->in.spares[i] == proc) return 0;
    for (int i = 0; i < LOST_SPARES_KEPT; i++)
        if (c->lost_spares[i] == proc) return 0;
    return 1;
}

int coord_tick_due_ms(const Coordinator *c) {
    if (!c->have_members || c->npending > 0 || c->suspicion_ms > 0) return 2;
    int due = (int)(c->last_liveness_ms + LIVENESS_PERIOD_MS - now_ms());
    return due < 1 ? 1 : due;
}

void coord_join_failed(Coordinator *c, long epoch, int rank, int restore_failed, const char *why) {
    /* A rendezvous that failed without a member failing (it timed out: the machine was too
     * busy for the bound, say) leaves every member waiting for a decision that no failure
     * would bring: it counts like a failed collective, so the epoch is rebuilt with the same
     * members once no failure has shown up for as long as detection takes. */
    if (!restore_failed) {
        coord_comm_failure(c, epoch, wall_ms());
        return;
    }
    if (epoch != c->epoch || c->unrestorable) return;
    /* The new process of `rank` verified every copy it could reach and none was usable: the
     * next spare would get the same decision and fail alike. Stop instead, saying where the
     * newest intact state is. */
    int n = snprintf(c->message, sizeof c->message,
                     "rank %d's state of step %lld could not be restored (%.600s), so it is lost from memory; ", rank,
                     c->rollback + 1, why);
    say_newest_checkpoint(c, n, "no checkpoint exists (--replicas 2 or --persist-every K would have kept one)");
    c->unrestorable = 1;
}

static coord_state tick(Coordinator *c, int *spares_used);

coord_state coord_tick(Coordinator *c, int *spares_used) {
    co_rtt_begin(c);
    coord_state s = tick(c, spares_used);
    co_rtt_end(c);
    return s;
}

/* 1 when every member that has not failed, and every spare in the pool, has a heartbeat. */
static int others_beat(Coordinator *c) {
    int alive[DP_MAX_RANKS];
    long spares[DP_MAX_RANKS];
    if (ctl_alive_many(c->ctl, c->procs, c->cfg->workers, alive) != 0) return 0;
    for (int r = 0; r < c->cfg->workers; r++)
        if (!alive[r] && !c->departed[r] && !co_pending_has(c, r)) return 0;
    int n = ctl_spare_list(c->ctl, spares, DP_MAX_RANKS);
    if (n < 0 || (n > 0 && ctl_alive_many(c->ctl, spares, n, alive) != 0)) return 0;
    for (int i = 0; i < n; i++)
        if (!alive[i]) return 0;
    return 1;
}

static coord_state tick(Coordinator *c, int *spares_used) {
    *spares_used = c->spares_lost; /* lost spares are replaced like used ones */
    c->spares_lost = 0;
    if (c->unrestorable) return COORD_FAILED;
    if (!c->have_members && load_members(c) != 0) return COORD_RUNNING;
    double now = now_ms();
    if (now - c->last_liveness_ms >= LIVENESS_PERIOD_MS) {
        c->last_liveness_ms = now;
        co_check_liveness(c);
    }
    co_probe_members(c);
    /* A failed collective with no failed member, for long enough: rebuild the communicator. */
    int suspicion_due = c->npending == 0 && c->suspicion_ms > 0 && now - c->suspicion_ms > 1.5 * c->cfg->detect_timeout_ms;
    if (c->npending == 0 && !suspicion_due) return COORD_RUNNING;
    /* With the control plane away nothing can be closed or published: the failure waits for it
     * (the launcher bounds the wait: --control-wait). */
    if (!c->view.reachable) return COORD_RUNNING;
    co_rtt_start_counting(c);
    /* Close the epoch at once, then batch failures that come close together into one decision. */
    close_epoch(c);
    if (!c->fenced) return COORD_RUNNING; /* Redis failed again: the next tick closes it */
    /* Across machines a batch lasts longer and ends with a probe: processes killed together
     * close their ports only after their memory is torn down, tens of ms for a large one. */
    int batch = c->cfg->nnodes > 0 ? BATCH_MACHINES_MS : BATCH_MS;
    if (c->npending > 0 && now - c->first_pending_ms < batch) return COORD_RUNNING;
    /* Back from an outage: the processes republish (their commit records above all) before
     * anything is decided. */
    if (!coord_control_settled(c)) return COORD_RUNNING;
    /* After a takeover under Sentinel the holders' heartbeats may be coming back: deciding
     * before every other member and spare beats again would take live ones for dead (waits at
     * most the detect timeout). */
    if (c->npending > 0 && now < c->decide_after) {
        if (!others_beat(c)) return COORD_RUNNING;
        c->decide_after = 0;
    }
    if (c->npending > 0 && c->cfg->nnodes > 0 && !c->batch_probed) {
        c->batch_probed = 1;
        c->probe_due = now;
        c->last_probe_ms = 0;
        co_probe_members(c);
    }
    gather_input(c, suspicion_due);
    char why[sizeof c->message];
    decide_outcome o = decide_next(&c->in, &c->decision, why, sizeof why);
    switch (o) {
    case DECIDE_WAIT:
        return COORD_RUNNING;
    case DECIDE_SWAP:
    case DECIDE_REBUILD: {
        int used = c->decision.nfailed;
        decide(c, &c->decision);
        *spares_used += used;
        return COORD_RUNNING;
    }
    case DECIDE_NO_SPARE:
        return no_spare(c, c->decision.rollback, why);
    case DECIDE_GIVE_UP:
        return give_up(c, c->decision.rollback, why);
    case DECIDE_STATE_LOST:
    case DECIDE_NO_FT:
    case DECIDE_INVALID:
        snprintf(c->message, sizeof c->message, "%s", why);
        return COORD_FAILED;
    }
    return COORD_RUNNING;
}
