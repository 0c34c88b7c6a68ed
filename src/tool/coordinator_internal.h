/* coordinator_internal.h — what the coordinator's two files share (not included outside
 * src/tool): its state, and the calls between detection and deciding. The API is
 * coordinator.h. */
#ifndef DEADPOOL_COORDINATOR_INTERNAL_H
#define DEADPOOL_COORDINATOR_INTERNAL_H

#include <stdint.h>
#include <sys/types.h>

#include "coordinator.h"
#include "decide.h"
#include "recovery.h"

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

void co_member_facts(Coordinator *c, const long *procs, int n, pid_t *pids, char (*nodes)[NODE_ID_MAX],
                         char (*endpoints)[ENDPOINT_MAX]);
void co_rtt_begin(Coordinator *c);
void co_rtt_end(Coordinator *c);
void co_rtt_start_counting(Coordinator *c);
int co_pending_has(const Coordinator *c, int rank);
void co_probe_members(Coordinator *c);
void co_wait_replica(Coordinator *c, int timeout_ms);
void co_check_liveness(Coordinator *c);
int co_live_spares(Coordinator *c, long *out, int max);
void co_gather_holders(Coordinator *c, DecideFailure *f);
void co_gather_stateless(Coordinator *c, DecideInput *in);
long long co_committed_after_outage(Coordinator *c);

#endif
