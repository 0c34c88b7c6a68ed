/* coordinator_detect.c — the coordinator's detection: failures as they come (a process's
 * exit, a failed collective, a silence, a machine's launcher gone, a probe refused), each
 * with when it happened, and what a decision needs read from the job's keys (live spares,
 * replica holders, stateless claims, what the holders hold). Deciding is coordinator.c. */
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

/* Round-trip accounting of the failure being handled (see rtt_failure). */
void co_rtt_begin(Coordinator *c) { c->rtt_tick0 = ctl_round_trips(c->ctl); }

void co_rtt_end(Coordinator *c) {
    if (c->rtt_counting) c->rtt_failure += ctl_round_trips(c->ctl) - c->rtt_tick0;
    c->rtt_tick0 = ctl_round_trips(c->ctl);
}

void co_rtt_start_counting(Coordinator *c) {
    if (!c->rtt_counting) {
        c->rtt_counting = 1;
        c->rtt_failure = 0;
    }
}

int co_pending_has(const Coordinator *c, int rank) {
    for (int i = 0; i < c->npending; i++)
        if (c->pending[i].rank == rank) return 1;
    return 0;
}

/* pending[r] = 1 for the ranks with a pending failure, for the world's ranks. */
static void pending_flags(const Coordinator *c, char *pending) {
    memset(pending, 0, (size_t)c->cfg->workers);
    for (int i = 0; i < c->npending; i++)
        if (c->pending[i].rank >= 0 && c->pending[i].rank < c->cfg->workers) pending[c->pending[i].rank] = 1;
}

/* When the failure happened: an injected fault says so; a silent process failed when it last
 * heartbeated; a crash is seen within milliseconds. */
/* When the failure happened, for the `recovered` event's total_ms. An injected fault records
 * its own time (KEY_FAULT_LAST), taken here once: however late the detection (the launcher
 * itself stopped for a while), total_ms counts from the fault. Otherwise a crash is dated at
 * its detection and a silence at the heartbeat's last sign of life. */
static int64_t failure_time(Coordinator *c, int rank, const char *kind, int64_t detected) {
    FaultRecord f;
    if (ctl_fault_last_take(c->ctl, rank, &f) == 1 && f.wall_ms <= detected) return f.wall_ms;
    if (!strcmp(kind, "crash")) return detected;
    return detected - c->cfg->detect_timeout_ms;
}

static void add_failure(Coordinator *c, int rank, const char *kind) {
    if (co_pending_has(c, rank) || c->npending >= MAX_PENDING) return;
    co_rtt_start_counting(c);
    Pending *p = &c->pending[c->npending++];
    p->rank = rank;
    snprintf(p->kind, sizeof p->kind, "%s", kind);
    p->t_detect_ms = wall_ms();
    p->t_fail_ms = failure_time(c, rank, kind, p->t_detect_ms);
    if (c->npending == 1) c->first_pending_ms = now_ms();
    log_msg("rank %d failed (%s)", rank, kind);
    /* Across machines a failure seldom comes alone (a machine's processes die together, one
     * exit report at a time): the others are probed before the decision, to be in it too. */
    if (c->cfg->nnodes > 0 && c->npending == 1 && !c->probe_due) c->probe_due = now_ms();
}

/* replace: 0 for a spare that stopped on a problem of its own (DP_EXIT_BAD_JOB), which its
 * replacement would likely hit again: never a loop of failing spares. */
static void spare_lost(Coordinator *c, long proc, int replace) {
    ctl_spare_remove(c->ctl, proc);
    if (replace) c->spares_lost++; /* the launcher may replace it */
    c->lost_spares[c->nlost_spares++ % LOST_SPARES_KEPT] = proc;
    event_emit(c->ctl, c->t0_wall_ms, "spare_lost", "\"proc\":%ld", proc);
    log_msg("spare %ld is gone", proc);
}

static void child_exited(Coordinator *c, pid_t pid, int status);

void coord_child_exited(Coordinator *c, pid_t pid, int status) {
    co_rtt_begin(c);
    child_exited(c, pid, status);
    co_rtt_end(c);
}

static void child_exited(Coordinator *c, pid_t pid, int status) {
    if (!c->have_members) return;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    /* STOPPED counts: while the coordinator runs the job is not ending, so a process that
     * stopped on its own gave up (it lost the control plane for a while) and is replaced. */
    int failed = !(code == DP_EXIT_DONE || code == DP_EXIT_FENCED || code == DP_EXIT_OUTPUT);
    /* A known exit counts before any heartbeat key expires: the process is dead for every
     * liveness check from now on (a holder killed a moment ago is not "alive"). */
    for (int r = 0; r < c->cfg->workers; r++) {
        if (c->pids[r] != pid) continue;
        ctl_heartbeat_clear(c->ctl, c->procs[r]);
        if (failed) add_failure(c, r, "crash");
        else c->departed[r] = 1; /* left on purpose (done, stopped, fenced): its silence is no failure */
        return;
    }
    long spares[DP_MAX_RANKS];
    pid_t spids[DP_MAX_RANKS];
    int n = ctl_spare_list(c->ctl, spares, DP_MAX_RANKS);
    if (n > 0) co_member_facts(c, spares, n, spids, NULL, NULL);
    for (int i = 0; i < n; i++)
        if (spids[i] == pid) {
            ctl_heartbeat_clear(c->ctl, spares[i]);
            if (failed) spare_lost(c, spares[i], code != DP_EXIT_BAD_JOB);
        }
}

void coord_comm_failure(Coordinator *c, long epoch, int64_t t_wall_ms) {
    if (epoch != c->epoch) return;
    if (c->suspicion_ms == 0) c->suspicion_ms = now_ms();
    int64_t t = t_wall_ms < wall_ms() ? t_wall_ms : wall_ms();
    if (c->probe_due == 0) c->probe_due = now_ms();
    if (c->probe_report_wall_ms == 0 || t < c->probe_report_wall_ms) c->probe_report_wall_ms = t; /* the earliest sign */
}

/* A member reported a failed collective: a peer's connection was reset, most likely because
 * the peer died. Its replica server's port answers as long as the process lives (the kernel
 * accepts for it even while it hangs), so a refused connection confirms the death at once,
 * without waiting for its heartbeat to expire: a crashed machine's ranks are all found in
 * this one probe, hence one decision. A silent port (a cut link) proves nothing: the
 * heartbeat decides then. One probe per report, at most every 50 ms. */
void co_probe_members(Coordinator *c) {
    if (!c->probe_due || !c->have_members || now_ms() - c->last_probe_ms < 50) return;
    c->probe_due = 0;
    c->last_probe_ms = now_ms();
    int world = c->cfg->workers, *dead = malloc(sizeof *dead * (size_t)world);
    int *who = malloc(sizeof *who * (size_t)world);
    char (*eps)[ENDPOINT_MAX] = malloc(sizeof *eps * (size_t)world);
    char pending[RECOVERY_MAX_RANKS];
    if (!dead || !who || !eps) { free(dead); free(who); free(eps); return; }
    /* Only the members not known to have failed (decide_probe_whom). */
    pending_flags(c, pending);
    int n = decide_probe_whom(world, c->departed, pending, who);
    for (int i = 0; i < n; i++) memcpy(eps[i], c->endpoint[who[i]], ENDPOINT_MAX);
    int *st = malloc(sizeof *st * (size_t)(n > 0 ? n : 1));
    if (st) tcp_probe_many(eps[0], ENDPOINT_MAX, n, 200, st);
    decide_probe_dead(world, who, st, n, c->departed, pending, dead); /* refused: dead */
    free(st);
    free(who);
    free(eps);
    for (int r = 0; r < world; r++)
        if (dead[r]) {
            ctl_heartbeat_clear(c->ctl, c->procs[r]);
            add_failure(c, r, "crash");
            /* it died before its peer noticed: at the latest when the report came */
            Pending *p = &c->pending[c->npending - 1];
            if (p->rank == r) p->t_fail_ms = decide_fail_time(p->t_fail_ms, c->probe_report_wall_ms);
        }
    free(dead);
    c->probe_report_wall_ms = 0; /* the next sign dates the next failure */
}

static const char *silent_kind(pid_t pid);

/* The index of machine `id` among those with a launcher (as last read), -1 if it has none. */
static int node_index_of(const Coordinator *c, const char *id) {
    for (int k = 0; k < c->nnodes_known; k++)
        if (!strcmp(c->node_ids[k], id)) return c->node_index[k];
    return -1;
}

/* Silent members: how their own machine's launcher saw them end (KEY_EXIT), and whole
 * machines lost (decide_nodes_lost); the rest failed by their silence alone. The verdicts are
 * decide_silent_members' (pure); this reads their inputs and acts on them. */
static void silent_members(Coordinator *c, const int *alive) {
    int world = c->cfg->workers;
    int *node = malloc(sizeof *node * (size_t)world);
    silent_verdict *verdict = malloc(sizeof *verdict * (size_t)world);
    int64_t *t_exit = malloc(sizeof *t_exit * (size_t)world);
    int *node_alive = calloc(DP_MAX_RANKS, sizeof *node_alive);
    ExitRecord *ex = malloc(sizeof *ex * (size_t)world);
    int *index = malloc(sizeof *index * DP_MAX_RANKS), *present = malloc(sizeof *present * DP_MAX_RANKS);
    if (!node || !verdict || !t_exit || !node_alive || !ex || !index || !present) goto out;
    ctl_exits_get(c->ctl, c->procs, world, ex); /* unknown where it fails: nothing known of how they ended */
    /* The machines as registered now (a spare machine may have joined since the last look). */
    int known = ctl_nodes_read(c->ctl, c->node_ids[0], NODE_ID_MAX, c->node_index, DP_MAX_RANKS);
    if (known >= 0) c->nnodes_known = known;
    for (int r = 0; r < world; r++) node[r] = node_index_of(c, c->node[r]);
    int nn = 0;
    for (int k = 0; k < c->nnodes_known; k++)
        if (c->node_index[k] >= 0 && c->node_index[k] < DP_MAX_RANKS) index[nn++] = c->node_index[k];
    if (nn > 0 && ctl_nodes_alive(c->ctl, index, nn, present) == 0) {
        for (int k = 0; k < nn; k++) node_alive[index[k]] = present[k];
    } else {
        for (int k = 0; k < DP_MAX_RANKS; k++) node_alive[k] = 1; /* unknown: nobody is lost as a whole */
    }
    int mine = node_index_of(c, c->my_node); /* this launcher runs: its machine is not lost */
    if (mine >= 0 && mine < DP_MAX_RANKS) node_alive[mine] = 1;
    char pending[RECOVERY_MAX_RANKS];
    pending_flags(c, pending);
    int bad = decide_silent_members(world, alive, c->departed, pending, ex, node, node_alive, DP_MAX_RANKS, verdict, t_exit);
    if (bad >= 0) {
        snprintf(c->message, sizeof c->message, "rank %d's process stopped on a bad job (its machine's log says why)", bad);
        c->unrestorable = 1;
    }
    for (int r = 0; r < world; r++) {
        switch (verdict[r]) {
        case SILENT_NONE: continue;
        case SILENT_DEPARTED: c->departed[r] = 1; continue;
        case SILENT_NODE: add_failure(c, r, "node"); break;
        case SILENT_CRASH: add_failure(c, r, "crash"); break;
        case SILENT_PROC: add_failure(c, r, silent_kind(c->pids[r])); break;
        }
        /* its machine's launcher saw the exit then (a coordinator taking over learns it late) */
        Pending *p = c->npending ? &c->pending[c->npending - 1] : NULL;
        if (p && p->rank == r) p->t_fail_ms = decide_fail_time(p->t_fail_ms, t_exit[r]);
    }
out:
    free(node);
    free(verdict);
    free(t_exit);
    free(node_alive);
    free(ex);
    free(index);
    free(present);
}

/* What a member whose heartbeat expired is doing, when it runs here. */
static const char *silent_kind(pid_t pid) {
    if (pid <= 0) return "unknown";
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return decide_silent_kind(NULL); /* gone */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return decide_silent_kind(buf); /* stopped: hang; zombie: crash; running yet unheard: network */
}

/* Machines whose launcher key expired: their ranks are probed once (a crashed machine's ranks
 * refuse at once, however long the survivors' step still runs before a collective would find
 * the reset). The key comes back when a launcher was merely slow: nothing happens then. */
static void watch_machines(Coordinator *c) {
    double now = now_ms();
    if (c->nnodes_known == 0 || now - c->nodes_read_ms > 1000) { /* spare machines join */
        int n = ctl_nodes_read(c->ctl, c->node_ids[0], NODE_ID_MAX, c->node_index, DP_MAX_RANKS);
        if (n >= 0) c->nnodes_known = n;
        c->nodes_read_ms = now;
    }
    static int present[DP_MAX_RANKS];
    int n = c->nnodes_known;
    if (n == 0 || ctl_nodes_alive(c->ctl, c->node_index, n, present) != 0) return;
    static const char *ids[DP_MAX_RANKS], *rank_node[RECOVERY_MAX_RANKS];
    for (int k = 0; k < n; k++) ids[k] = c->node_ids[k];
    for (int r = 0; r < c->cfg->workers; r++) rank_node[r] = c->node[r];
    if (decide_machines_to_probe(n, c->node_index, ids, present, c->my_node, rank_node, c->cfg->workers,
                                 c->machine_probed, DP_MAX_RANKS) > 0) {
        int64_t t = wall_ms() - node_alive_ttl_ms(c->cfg); /* it went silent before */
        if (!c->probe_due) c->probe_due = now;
        if (c->probe_report_wall_ms == 0 || t < c->probe_report_wall_ms) c->probe_report_wall_ms = t;
    }
}

/* The control plane answers again after an outage: what the coordinator owns there is written
 * again (Redis may be back empty, or be a replica that missed the last writes): the epoch
 * counter, the rank owners, the fence of a closed epoch. The processes republish their own. */
/* WAIT for the replica (under Sentinel): it blocks up to timeout_ms when the replica is gone
 * (a crashed machine's replica stays in the master's list until its replication timeout).
 * An answer within the bound shows Redis ran meanwhile, so the time is not a stall of the
 * control plane: the liveness view moves on by it (else every fence after a machine loss
 * would look like an outage and hold the decisions a detect timeout). */
void co_wait_replica(Coordinator *c, int timeout_ms) {
    unsigned long absences = ctl_absences(c->ctl);
    double t = now_ms();
    ctl_wait_replica(c->ctl, timeout_ms);
    if (ctl_absences(c->ctl) == absences) decide_control_waited(&c->view, now_ms() - t);
}

static void republish(Coordinator *c) {
    long e = ctl_epoch(c->ctl);
    if (e >= 0 && e < c->epoch) ctl_epoch_set(c->ctl, c->epoch);
    if (c->have_members)
        for (int r = 0; r < c->cfg->workers; r++) ctl_set_rank_owner(c->ctl, r, c->procs[r]);
    if (c->fenced) fence_epoch(c->ctl, c->epoch);
    co_wait_replica(c, 1000);
}

int coord_control_settled(const Coordinator *c) {
    DecideControl dc = {.now_ms = now_ms(), .reachable = c->view.reachable, .back_since_ms = c->view.back_since_ms,
                        .detect_timeout_ms = c->cfg->detect_timeout_ms};
    return decide_control_settled(&dc);
}

int coord_is_member(const Coordinator *c, pid_t pid) {
    for (int r = 0; c->have_members && r < c->cfg->workers; r++)
        if (c->pids[r] == pid) return 1;
    return 0;
}

void co_check_liveness(Coordinator *c) {
    int alive[RECOVERY_MAX_RANKS];
    if (c->cfg->nnodes > 0) watch_machines(c);
    double now = now_ms();
    int answered = ctl_alive_many(c->ctl, c->procs, c->cfg->workers, alive) == 0;
    /* A call on the shared connection failed for Redis's absence since we last looked (a
     * restart that was over before this query, say): an outage too. */
    int absent = ctl_absences(c->ctl) != c->absences;
    c->absences = ctl_absences(c->ctl);
    double away_since = c->view.unreachable_since_ms;
    control_seen seen = decide_control_observe(&c->view, answered, absent, now, c->cfg->detect_timeout_ms);
    if (seen == CONTROL_WENT_AWAY)
        log_msg("the control plane (redis) is unreachable (%s): no failure is judged or decided until it is back",
                ctl_last_error(c->ctl));
    if (seen == CONTROL_BACK)
        log_msg("the control plane is back after %.1f s: the processes get %d ms to republish",
                away_since > 0 ? (now - away_since) / 1e3 : 0.0, c->cfg->detect_timeout_ms);
    /* Away, back, or stale: commit records and heartbeats may be out of date in this epoch;
     * the processes get a detect timeout to beat again and republish before silence counts. */
    if (seen != CONTROL_OK) c->outage_epoch = c->epoch;
    if (seen == CONTROL_BACK || seen == CONTROL_STALE) republish(c);
    if (!answered || !coord_control_settled(c)) return;
    for (int r = 0; r < c->cfg->workers; r++)
        if (!alive[r] && !c->departed[r] && !co_pending_has(c, r)) {
            silent_members(c, alive);
            break;
        }
    long spares[DP_MAX_RANKS];
    int n = ctl_spare_list(c->ctl, spares, DP_MAX_RANKS);
    if (n <= 0) return;
    int spare_alive[DP_MAX_RANKS];
    if (ctl_alive_many(c->ctl, spares, n, spare_alive) != 0) return;
    for (int i = 0; i < n; i++)
        if (!spare_alive[i]) spare_lost(c, spares[i], 1);
}

/* Live spares, in process-id order. Across machines, not the spares of a machine a failed rank
 * ran on: a crashed machine's spares still heartbeat for up to a detect timeout, and a spare
 * that dies while it joins costs a second decision. */
int co_live_spares(Coordinator *c, long *out, int max) {
    static long ids[DP_MAX_RANKS];
    static int alive[DP_MAX_RANKS];
    static pid_t pids[DP_MAX_RANKS];
    static char nodes[DP_MAX_RANKS][NODE_ID_MAX];
    static const char *spare_node[DP_MAX_RANKS], *failed_node[DP_MAX_RANKS];
    int n = ctl_spare_list(c->ctl, ids, DP_MAX_RANKS), nfailed = 0;
    if (n <= 0 || ctl_alive_many(c->ctl, ids, n, alive) != 0) return 0;
    if (c->cfg->nnodes > 0) {
        co_member_facts(c, ids, n, pids, nodes, NULL);
        for (int i = 0; i < n; i++) spare_node[i] = nodes[i];
        for (int f = 0; f < c->npending && nfailed < DP_MAX_RANKS; f++) failed_node[nfailed++] = c->node[c->pending[f].rank];
    }
    return decide_spares_usable(ids, alive, c->cfg->nnodes > 0 ? spare_node : NULL, n, failed_node, nfailed, out, max);
}

/* The holders of rank's replicas, recorded in this or a recent epoch (a rank that died while
 * recovering recorded none yet), with their liveness; nholders = 0 when none is found. */
void co_gather_holders(Coordinator *c, DecideFailure *f) {
    char list[HOLDERS_TEXT_MAX];
    long e = c->epoch;
    f->nholders = 0;
    f->holders_refused = 0;
    while (e >= 0 && e > c->epoch - 4 && holders_read(c->ctl, e, f->rank, list, sizeof list) != 0) {
        if (ctl_value_refused(c->ctl)) f->holders_refused = 1;
        e--;
    }
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

/* Each failed rank's verified claim to have had nothing of its own through some step
 * (ctl_stateless_through; -1: none), read after the committed generations: a rank writes it
 * with its commit record. One MGET, whatever the number of failed ranks. */
void co_gather_stateless(Coordinator *c, DecideInput *in) {
    int ranks[DP_MAX_RANKS];
    long long through[DP_MAX_RANKS];
    for (int i = 0; i < in->nfailed; i++) ranks[i] = in->failed[i].rank;
    ctl_stateless_through_many(c->ctl, ranks, in->nfailed, through); /* -1 each on an error */
    for (int i = 0; i < in->nfailed; i++) in->failed[i].stateless_through = through[i];
}

/* The newest generation of `rank` that all its live holders reported holding in this epoch
 * when they republished after an outage (their proc hash's `held`: "R:STEP:EPOCH,..."), -1
 * when none did. */
static long long held_by_holders(Coordinator *c, int rank) {
    DecideFailure f = {.rank = rank};
    co_gather_holders(c, &f);
    long long min = -1;
    char *held = malloc(HELD_TEXT_MAX(DP_MAX_RANKS));
    HeldGen *g = malloc(sizeof *g * DP_MAX_RANKS);
    for (int h = 0; held && g && h < f.nholders; h++) {
        char err[256];
        if (!f.holder_alive[h] || ctl_proc_get(c->ctl, f.holder_proc[h], PROC_HELD, held, HELD_TEXT_MAX(DP_MAX_RANKS)) != 0)
            continue;
        int n = held_parse(held, g, DP_MAX_RANKS, err, sizeof err);
        if (n < 0) log_msg("process %ld: %s", f.holder_proc[h], err);
        for (int i = 0; i < n; i++)
            if (g[i].rank == rank && g[i].epoch == c->epoch && (min < 0 || g[i].step < min)) min = g[i].step;
    }
    free(held);
    free(g);
    return min;
}

/* committed_min after an outage in this epoch (decide_committed_min): a rank that died while
 * Redis was away may have committed more than its records say; its holders know. */
long long co_committed_after_outage(Coordinator *c) {
    int world = c->cfg->workers;
    long long *committed = malloc(sizeof *committed * (size_t)world), *held = malloc(sizeof *held * (size_t)world);
    int *failed = calloc((size_t)world, sizeof *failed);
    long long min = -2;
    if (committed && held && failed && ctl_committed_get_many(c->ctl, c->epoch, world, committed) == 0) {
        for (int r = 0; r < world; r++) held[r] = -1;
        for (int i = 0; i < c->npending; i++) {
            int r = c->pending[i].rank;
            failed[r] = 1;
            held[r] = held_by_holders(c, r);
        }
        min = decide_committed_min(world, committed, failed, held);
        log_msg("after the control plane's outage: the newest generation every rank can restore is step %lld", min + 1);
    }
    free(committed);
    free(held);
    free(failed);
    return min;
}
