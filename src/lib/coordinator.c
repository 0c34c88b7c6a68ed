/* coordinator.c — detection, decisions, and the no-spare fallback. */
#include "coordinator.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint.h"
#include "config.h"
#include "decide.h"
#include "events.h"
#include "recovery.h"
#include "runtime.h"
#include "util.h"

#define MAX_PENDING RECOVERY_MAX_RANKS
#define LIVENESS_PERIOD_MS 25
#define BATCH_MS 15 /* failures this close together go into one decision */

typedef struct {
    int rank;
    char kind[16];
    int64_t t_fail_ms, t_detect_ms;
} Pending;

struct Coordinator {
    ctl_t *ctl;
    const JobConfig *cfg;
    int64_t t0_wall_ms;
    char my_host[256];
    long epoch;
    long long rollback;      /* restore point of the current epoch */
    int have_members;
    long procs[RECOVERY_MAX_RANKS];
    pid_t pids[RECOVERY_MAX_RANKS]; /* 0 when the member is not on this host */
    Pending pending[MAX_PENDING];
    int npending;
    double first_pending_ms;
    double suspicion_ms;     /* a comm failure was reported in this epoch, 0 = none */
    double last_liveness_ms;
    int last_step;
    double waiting_spare_since; /* no-spare fallback in progress, 0 = no */
    int fenced;              /* the current epoch is closed */
    char message[2048];
    DecideInput in;          /* the inputs of the next decision (large: kept off the stack) */
    Decision decision;
};

Coordinator *coord_create(ctl_t *ctl, const JobConfig *cfg, int64_t t0_wall_ms) {
    Coordinator *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->ctl = ctl;
    c->cfg = cfg;
    c->t0_wall_ms = t0_wall_ms;
    c->rollback = cfg->resume_step;
    gethostname(c->my_host, sizeof c->my_host - 1);
    return c;
}

void coord_free(Coordinator *c) { free(c); }

int coord_unhandled_failure(const Coordinator *c, char *kind, size_t len, int64_t *t_fail_ms) {
    if (c->npending == 0) return -1;
    snprintf(kind, len, "%s", c->pending[0].kind);
    *t_fail_ms = c->pending[0].t_fail_ms;
    return c->pending[0].rank;
}
const char *coord_message(const Coordinator *c) { return c->message; }
long coord_epoch(const Coordinator *c) { return c->epoch; }
void coord_progress(Coordinator *c, int step) { if (step > c->last_step) c->last_step = step; }

/* The pid of proc when it runs on this host, else 0. */
static pid_t local_pid(Coordinator *c, long proc) {
    char host[256], pid[32];
    if (ctl_proc_get(c->ctl, proc, "host", host, sizeof host) != 0 || strcmp(host, c->my_host) != 0) return 0;
    if (ctl_proc_get(c->ctl, proc, "pid", pid, sizeof pid) != 0) return 0;
    return (pid_t)atoi(pid);
}

/* Epoch 0's members are whoever claimed the ranks; known once every rank is claimed. */
static int load_members(Coordinator *c) {
    for (int r = 0; r < c->cfg->workers; r++) {
        long proc = ctl_rank_owner(c->ctl, r);
        if (proc <= 0) return -1;
        c->procs[r] = proc;
    }
    for (int r = 0; r < c->cfg->workers; r++) c->pids[r] = local_pid(c, c->procs[r]);
    c->have_members = 1;
    return 0;
}

static int pending_has(const Coordinator *c, int rank) {
    for (int i = 0; i < c->npending; i++)
        if (c->pending[i].rank == rank) return 1;
    return 0;
}

/* When the failure happened: an injected fault says so; a silent process failed when it last
 * heartbeated; a crash is seen within milliseconds. */
static int64_t failure_time(Coordinator *c, int rank, const char *kind, int64_t detected) {
    char last[128], k[16];
    int r;
    long long t;
    char key[32];
    if (ctl_get(c->ctl, ctl_key_suffix(key, sizeof key, KEY_FAULT_LAST, 0, 0), last, sizeof last) == 0 && sscanf(last, "%15[a-z]:%d:%lld", k, &r, &t) == 3 &&
        r == rank && t <= detected && detected - t < 10LL * c->cfg->detect_timeout_ms + 5000)
        return t;
    if (!strcmp(kind, "crash")) return detected;
    return detected - c->cfg->detect_timeout_ms;
}

static void add_failure(Coordinator *c, int rank, const char *kind) {
    if (pending_has(c, rank) || c->npending >= MAX_PENDING) return;
    Pending *p = &c->pending[c->npending++];
    p->rank = rank;
    snprintf(p->kind, sizeof p->kind, "%s", kind);
    p->t_detect_ms = wall_ms();
    p->t_fail_ms = failure_time(c, rank, kind, p->t_detect_ms);
    if (c->npending == 1) c->first_pending_ms = now_ms();
    log_msg("rank %d failed (%s)", rank, kind);
}

static void spare_lost(Coordinator *c, long proc) {
    ctl_spare_remove(c->ctl, proc);
    event_emit(c->ctl, c->t0_wall_ms, "spare_lost", "\"proc\":%ld", proc);
    log_msg("spare %ld is gone", proc);
}

void coord_child_exited(Coordinator *c, pid_t pid, int status) {
    if (!c->have_members) return;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (code == DP_EXIT_DONE || code == DP_EXIT_STOPPED || code == DP_EXIT_FENCED) return;
    for (int r = 0; r < c->cfg->workers; r++) {
        if (c->pids[r] != pid) continue;
        add_failure(c, r, "crash");
        return;
    }
    long spares[DP_MAX_RANKS];
    int n = ctl_spare_list(c->ctl, spares, DP_MAX_RANKS);
    for (int i = 0; i < n; i++)
        if (local_pid(c, spares[i]) == pid) spare_lost(c, spares[i]);
}

void coord_comm_failure(Coordinator *c, long epoch) {
    if (epoch == c->epoch && c->suspicion_ms == 0) c->suspicion_ms = now_ms();
}

/* What a member whose heartbeat expired is doing, when it runs here. */
static const char *silent_kind(pid_t pid) {
    if (pid <= 0) return "unknown";
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return "crash";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *paren = strrchr(buf, ')');
    char state = paren && paren[1] == ' ' ? paren[2] : '?';
    if (state == 'T' || state == 't') return "hang";
    if (state == 'Z') return "crash";
    return "network"; /* alive and running, yet unheard: cut off from the job */
}

static void check_liveness(Coordinator *c) {
    int alive[RECOVERY_MAX_RANKS];
    if (ctl_alive_many(c->ctl, c->procs, c->cfg->workers, alive) != 0) return;
    for (int r = 0; r < c->cfg->workers; r++)
        if (!alive[r]) add_failure(c, r, silent_kind(c->pids[r]));
    long spares[DP_MAX_RANKS];
    int n = ctl_spare_list(c->ctl, spares, DP_MAX_RANKS);
    if (n <= 0) return;
    int spare_alive[DP_MAX_RANKS];
    if (ctl_alive_many(c->ctl, spares, n, spare_alive) != 0) return;
    for (int i = 0; i < n; i++)
        if (!spare_alive[i]) spare_lost(c, spares[i]);
}

/* Live spares, in process-id order. */
static int live_spares(Coordinator *c, long *out, int max) {
    long ids[DP_MAX_RANKS];
    int n = ctl_spare_list(c->ctl, ids, DP_MAX_RANKS), alive[DP_MAX_RANKS], k = 0;
    if (n <= 0 || ctl_alive_many(c->ctl, ids, n, alive) != 0) return 0;
    for (int i = 0; i < n && k < max; i++)
        if (alive[i]) out[k++] = ids[i];
    return k;
}

/* The holders of rank's replicas, recorded in this or a recent epoch (a rank that died while
 * recovering recorded none yet), with their liveness; nholders = 0 when none is found. */
static void gather_holders(Coordinator *c, DecideFailure *f) {
    char list[HOLDERS_TEXT_MAX];
    long e = c->epoch;
    f->nholders = 0;
    while (e >= 0 && e > c->epoch - 4 && holders_read(c->ctl, e, f->rank, list, sizeof list) != 0) e--;
    if (e < 0 || e <= c->epoch - 4) return;
    Holder holders[HOLDERS_MAX];
    int nh = holders_parse(list, holders, HOLDERS_MAX);
    if (nh <= 0) return;
    for (int h = 0; h < nh; h++) {
        f->holder_proc[h] = holders[h].proc;
        f->holder_alive[h] = 0;
    }
    f->nholders = nh;
    if (ctl_alive_many(c->ctl, f->holder_proc, nh, f->holder_alive) != 0)
        for (int h = 0; h < nh; h++) f->holder_alive[h] = 0;
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
    in->out = c->cfg->out;
    in->spare_wait = c->cfg->spare_wait;
    in->restore_point = c->rollback;
    in->committed_min = ctl_committed_min(c->ctl, c->epoch, c->cfg->workers);
    in->checkpoint_step = -1;
    in->nspares = 0;
    for (int i = 0; i < c->npending; i++) {
        DecideFailure *f = &in->failed[i];
        f->rank = c->pending[i].rank;
        snprintf(f->kind, sizeof f->kind, "%s", c->pending[i].kind);
        f->t_fail_ms = c->pending[i].t_fail_ms;
        f->t_detect_ms = c->pending[i].t_detect_ms;
        f->nholders = 0;
    }
    /* Holders, checkpoints and spares matter only when a failed rank can be hot-swapped. */
    if (c->npending == 0 || c->cfg->ft != FT_DEADPOOL) return;
    for (int i = 0; i < c->npending; i++) gather_holders(c, &in->failed[i]);
    char err[256];
    in->checkpoint_step = checkpoint_latest(c->cfg->out, err, sizeof err);
    in->nspares = live_spares(c, in->spares, DP_MAX_RANKS);
}

/* Publishes decision d (a swap or a rebuild) and moves the coordinator to its epoch. */
static void decide(Coordinator *c, Decision *d) {
    char last[32];
    snprintf(last, sizeof last, "%d", c->last_step);
    char key[32];
    ctl_set(c->ctl, ctl_key_suffix(key, sizeof key, KEY_LAST_STEP, 0, 0), last);
    d->t_decide_ms = wall_ms();
    for (int i = 0; i < d->nfailed; i++) {
        ctl_spare_remove(c->ctl, d->failed[i].spare_proc);
        event_emit(c->ctl, c->t0_wall_ms, "failure", "\"rank\":%d,\"proc\":%ld,\"kind\":\"%s\",\"epoch\":%ld",
                   d->failed[i].rank, d->failed[i].old_proc, d->failed[i].kind, c->epoch);
    }
    if (decision_publish(c->ctl, d) != 0) {
        log_msg("publishing the decision failed: %s", ctl_last_error(c->ctl));
        return;
    }
    event_emit(c->ctl, c->t0_wall_ms, "decision", "\"epoch\":%ld,\"rollback_step\":%lld,\"failed\":%d", d->epoch,
               d->rollback + 1, d->nfailed);
    for (int i = 0; i < d->nfailed; i++) {
        log_msg("epoch %ld: spare %ld takes rank %d; rolling back to step %lld", d->epoch, d->failed[i].spare_proc,
                d->failed[i].rank, d->rollback + 1);
        pid_t old = c->pids[d->failed[i].rank];
        /* A stopped ex-member is woken so that it finds itself fenced and leaves. */
        if (old > 0) kill(old, SIGCONT);
    }
    c->epoch = d->epoch;
    c->rollback = d->rollback;
    memcpy(c->procs, d->procs, sizeof(long) * (size_t)d->world);
    for (int i = 0; i < d->nfailed; i++) c->pids[d->failed[i].rank] = local_pid(c, d->failed[i].spare_proc);
    c->npending = 0;
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
    fence_epoch(c->ctl, c->epoch);
    for (int r = 0; r < c->cfg->workers; r++) ctl_notify(c->ctl, c->procs[r], "abort", c->epoch + 1); /* 0 means nothing */
    c->fenced = 1;
}

/* No spare left: make the newest committed generation durable, so that nothing committed is
 * lost even if no spare ever comes. Members write their own states; the lowest surviving
 * rank also writes each failed rank's state, fetched from its replica holders. */
static void persist_for_fallback(Coordinator *c, long long g) {
    char req[64 + 8 * MAX_PENDING], key[64];
    int writer = -1;
    for (int r = 0; r < c->cfg->workers && writer < 0; r++)
        if (!pending_has(c, r)) writer = r;
    size_t used = (size_t)snprintf(req, sizeof req, "%ld:%lld:%d:", c->epoch, g, writer);
    for (int i = 0; i < c->npending && used < sizeof req; i++)
        used += (size_t)snprintf(req + used, sizeof req - used, "%s%d", i ? "," : "", c->pending[i].rank);
    ctl_set(c->ctl, ctl_key_suffix(key, sizeof key, KEY_PERSIST_REQ, 0, 0), req);
    for (int r = 0; r < c->cfg->workers; r++) ctl_notify(c->ctl, c->procs[r], "notice", -1);
}

/* No live spare for every failed rank: persist generation g once, then wait --spare-wait
 * seconds for spares; after that the job fails with `why`. */
static coord_state no_spare(Coordinator *c, long long g, const char *why) {
    if (c->waiting_spare_since == 0) {
        c->waiting_spare_since = now_ms();
        event_emit(c->ctl, c->t0_wall_ms, "no_spare", "\"failed\":%d,\"rollback_step\":%lld,\"wait_s\":%d", c->npending,
                   g + 1, c->cfg->spare_wait);
        log_msg("%d rank(s) failed and no spare is left: step %lld is being persisted to %s/ckpt; waiting up to %d s "
                "for a spare (deadpool worker --spare --job %s --redis URL)", c->npending, g + 1, c->cfg->out,
                c->cfg->spare_wait, ctl_job(c->ctl));
        if (c->cfg->ft == FT_DEADPOOL) persist_for_fallback(c, g);
    }
    if (now_ms() - c->waiting_spare_since < c->cfg->spare_wait * 1000.0) return COORD_RUNNING;
    snprintf(c->message, sizeof c->message, "%s", why);
    return COORD_FAILED;
}

int coord_tick_due_ms(const Coordinator *c) {
    if (!c->have_members || c->npending > 0 || c->suspicion_ms > 0) return 2;
    int due = (int)(c->last_liveness_ms + LIVENESS_PERIOD_MS - now_ms());
    return due < 1 ? 1 : due;
}

coord_state coord_tick(Coordinator *c, int *spares_used) {
    *spares_used = 0;
    if (!c->have_members && load_members(c) != 0) return COORD_RUNNING;
    double now = now_ms();
    if (now - c->last_liveness_ms >= LIVENESS_PERIOD_MS) {
        c->last_liveness_ms = now;
        check_liveness(c);
    }
    /* A failed collective with no failed member, for long enough: rebuild the communicator. */
    int suspicion_due = c->npending == 0 && c->suspicion_ms > 0 && now - c->suspicion_ms > 1.5 * c->cfg->detect_timeout_ms;
    if (c->npending == 0 && !suspicion_due) return COORD_RUNNING;
    /* Close the epoch at once, then batch failures that come close together into one decision. */
    close_epoch(c);
    if (c->npending > 0 && now - c->first_pending_ms < BATCH_MS) return COORD_RUNNING;
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
        *spares_used = used;
        return COORD_RUNNING;
    }
    case DECIDE_NO_SPARE:
        return no_spare(c, c->decision.rollback, why);
    case DECIDE_STATE_LOST:
    case DECIDE_NO_FT:
    case DECIDE_INVALID:
        snprintf(c->message, sizeof c->message, "%s", why);
        return COORD_FAILED;
    }
    return COORD_RUNNING;
}
