/* coordinator.c — detection, decisions, and the no-spare fallback. */
#include "coordinator.h"

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

#define MAX_PENDING RECOVERY_MAX_RANKS
#define LIVENESS_PERIOD_MS 25
#define BATCH_MS 15 /* failures this close together go into one decision */
#define BATCH_MACHINES_MS 40 /* ... across machines */
#define LOST_SPARES_KEPT 64 /* lost spares remembered (coord_spare_arriving) */

typedef struct {
    int rank;
    char kind[16];
    int64_t t_fail_ms, t_detect_ms;
} Pending;

#define NODE_ID_MAX 128
#define ENDPOINT_MAX 300

struct Coordinator {
    ctl_t *ctl;
    const JobConfig *cfg;
    int64_t t0_wall_ms;
    char my_node[NODE_ID_MAX];
    long epoch;
    long long rollback;      /* restore point of the current epoch */
    int have_members;
    long procs[RECOVERY_MAX_RANKS];
    pid_t pids[RECOVERY_MAX_RANKS]; /* 0 when the member is not on this machine */
    char node[RECOVERY_MAX_RANKS][NODE_ID_MAX];         /* each member's machine */
    char endpoint[RECOVERY_MAX_RANKS][ENDPOINT_MAX];    /* each member's replica server, HOST:PORT */
    /* the machines with a launcher (KEY_NODES), read when a member falls silent */
    char node_ids[DP_MAX_RANKS][NODE_ID_MAX];
    int node_index[DP_MAX_RANKS], nnodes_known;
    char fence[160];         /* the lease value decisions are published under ("" = one machine) */
    char machine_probed[DP_MAX_RANKS]; /* machine k's key expired and its ranks were probed */
    double nodes_read_ms;    /* when the machine registry was last read */
    int batch_probed;        /* the batch of pending failures had its closing probe */
    double probe_due;        /* a member reported a failed collective: probe the members (0 = no) */
    int64_t probe_report_wall_ms; /* ...reported then: a death the probe confirms is dated there */
    double last_probe_ms;
    char departed[RECOVERY_MAX_RANKS]; /* the member's process exited on purpose */
    Pending pending[MAX_PENDING];
    int npending;
    double first_pending_ms;
    double suspicion_ms;     /* a comm failure was reported in this epoch, 0 = none */
    double last_liveness_ms;
    int last_step;
    double waiting_spare_since; /* no-spare fallback in progress, 0 = no */
    double persist_checked_ms;  /* when no_spare last looked whether its generation is on disk */
    int fruitless_rebuilds;     /* rebuilds decided in a row with no step committed (DecideInput's) */
    double giving_up_since;     /* give_up's persist was requested then, 0 = not giving up */
    int fenced;              /* the current epoch is closed */
    char message[2048];
    char resume[1024];       /* the command that resumes the job, for messages */
    int unrestorable;        /* a rank's state could not be restored: the job stops */
    int spares_lost;         /* spares gone (exited, or silent) since the last tick */
    int spares_wanted;       /* spares a failure lacks, for the launcher to start now */
    long lost_spares[LOST_SPARES_KEPT]; /* the newest spares dropped from the pool (coord_spare_arriving) */
    unsigned nlost_spares;
    /* The control plane's outages (issue 27, item 11): "Redis unreachable" is no evidence
     * that a process died. While it is away, and for a detect timeout after it answers again
     * (decide_control_settled), no silence is judged and nothing is decided. The view changes
     * only through decide_control_observe (pure, unit-tested). */
    ControlView view;
    long outage_epoch;            /* an outage happened in this epoch (-1: none): commit records may be stale */
    unsigned long absences;       /* ctl_absences of the connection as last seen */
    double decide_after;          /* a takeover under Sentinel: no decision before (coord_take_over) */
    DecideInput in;          /* the inputs of the next decision (large: kept off the stack) */
    Decision decision;
    /* Redis round trips the coordinator made for the failure being handled, from its detection
     * to the published decision (the launcher's own traffic on the shared connection, such as
     * draining events, is not counted): reported in the `decision` event. */
    unsigned long long rtt_failure, rtt_tick0;
    int rtt_counting;
};

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
static void member_facts(Coordinator *c, const long *procs, int n, pid_t *pids, char (*nodes)[NODE_ID_MAX],
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
    member_facts(c, c->procs, c->cfg->workers, c->pids, c->node, c->endpoint);
    c->have_members = 1;
    return 0;
}

/* Round-trip accounting of the failure being handled (see rtt_failure). */
static void rtt_begin(Coordinator *c) { c->rtt_tick0 = ctl_round_trips(c->ctl); }
static void rtt_end(Coordinator *c) {
    if (c->rtt_counting) c->rtt_failure += ctl_round_trips(c->ctl) - c->rtt_tick0;
    c->rtt_tick0 = ctl_round_trips(c->ctl);
}
static void rtt_start_counting(Coordinator *c) {
    if (!c->rtt_counting) {
        c->rtt_counting = 1;
        c->rtt_failure = 0;
    }
}

static int pending_has(const Coordinator *c, int rank) {
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
    if (pending_has(c, rank) || c->npending >= MAX_PENDING) return;
    rtt_start_counting(c);
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
    rtt_begin(c);
    child_exited(c, pid, status);
    rtt_end(c);
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
    if (n > 0) member_facts(c, spares, n, spids, NULL, NULL);
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
static void probe_members(Coordinator *c) {
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
static void wait_replica(Coordinator *c, int timeout_ms) {
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
    wait_replica(c, 1000);
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

static void check_liveness(Coordinator *c) {
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
        if (!alive[r] && !c->departed[r] && !pending_has(c, r)) {
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
static int live_spares(Coordinator *c, long *out, int max) {
    static long ids[DP_MAX_RANKS];
    static int alive[DP_MAX_RANKS];
    static pid_t pids[DP_MAX_RANKS];
    static char nodes[DP_MAX_RANKS][NODE_ID_MAX];
    static const char *spare_node[DP_MAX_RANKS], *failed_node[DP_MAX_RANKS];
    int n = ctl_spare_list(c->ctl, ids, DP_MAX_RANKS), nfailed = 0;
    if (n <= 0 || ctl_alive_many(c->ctl, ids, n, alive) != 0) return 0;
    if (c->cfg->nnodes > 0) {
        member_facts(c, ids, n, pids, nodes, NULL);
        for (int i = 0; i < n; i++) spare_node[i] = nodes[i];
        for (int f = 0; f < c->npending && nfailed < DP_MAX_RANKS; f++) failed_node[nfailed++] = c->node[c->pending[f].rank];
    }
    return decide_spares_usable(ids, alive, c->cfg->nnodes > 0 ? spare_node : NULL, n, failed_node, nfailed, out, max);
}

/* The holders of rank's replicas, recorded in this or a recent epoch (a rank that died while
 * recovering recorded none yet), with their liveness; nholders = 0 when none is found. */
static void gather_holders(Coordinator *c, DecideFailure *f) {
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
static void gather_stateless(Coordinator *c, DecideInput *in) {
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
    gather_holders(c, &f);
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
static long long committed_after_outage(Coordinator *c) {
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
    in->committed_min = c->outage_epoch == c->epoch ? committed_after_outage(c) : ctl_committed_min(c->ctl, c->epoch, c->cfg->workers);
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
    for (int i = 0; i < c->npending; i++) gather_holders(c, &in->failed[i]);
    gather_stateless(c, in);
    char err[256];
    in->checkpoint_step = checkpoint_latest(c->cfg->out, err, sizeof err);
    in->nspares = live_spares(c, in->spares, DP_MAX_RANKS);
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
    rtt_end(c);
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
    if (nodes && eps) member_facts(c, spares, d->nfailed, spids, nodes, eps);
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
    if (closed == 0) wait_replica(c, 1000); /* under Sentinel: the fence survives a failover */
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
        if (!pending_has(c, r)) p->writer = r;
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
    rtt_begin(c);
    coord_state s = tick(c, spares_used);
    rtt_end(c);
    return s;
}

/* 1 when every member that has not failed, and every spare in the pool, has a heartbeat. */
static int others_beat(Coordinator *c) {
    int alive[DP_MAX_RANKS];
    long spares[DP_MAX_RANKS];
    if (ctl_alive_many(c->ctl, c->procs, c->cfg->workers, alive) != 0) return 0;
    for (int r = 0; r < c->cfg->workers; r++)
        if (!alive[r] && !c->departed[r] && !pending_has(c, r)) return 0;
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
        check_liveness(c);
    }
    probe_members(c);
    /* A failed collective with no failed member, for long enough: rebuild the communicator. */
    int suspicion_due = c->npending == 0 && c->suspicion_ms > 0 && now - c->suspicion_ms > 1.5 * c->cfg->detect_timeout_ms;
    if (c->npending == 0 && !suspicion_due) return COORD_RUNNING;
    /* With the control plane away nothing can be closed or published: the failure waits for it
     * (the launcher bounds the wait: --control-wait). */
    if (!c->view.reachable) return COORD_RUNNING;
    rtt_start_counting(c);
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
        probe_members(c);
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
