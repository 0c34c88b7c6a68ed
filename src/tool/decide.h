/* decide.h — the coordinator's decision as a pure function.
 *
 * Given what the coordinator knows about the current epoch (members, pending failures,
 * committed generations, live spares, replica holders, ft mode), decide_next says what
 * happens next and fills the decision for epoch + 1. It does no I/O, reads no clock and
 * touches no Redis: the coordinator (coordinator.c) gathers the inputs and acts on the
 * outcome (fences, publishes, persists, reports), so every case is unit-testable
 * (tests/test_decide.c). */
#ifndef DEADPOOL_DECIDE_H
#define DEADPOOL_DECIDE_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "protocol.h"
#include "recovery.h"

/* One failed member of the current epoch, in the order the coordinator saw the failures. */
typedef struct {
    int rank;
    char kind[16];                  /* crash, hang, network, unknown */
    int64_t t_fail_ms, t_detect_ms; /* wall clock */
    /* The holders recorded for this rank's replicas (in this epoch or, for a rank that died
     * while recovering and recorded none yet, a recent one); nholders = 0 when none was
     * found. holder_alive[h]: holder h's heartbeat is live. A holder that is itself a
     * failed member of this epoch counts as lost whatever its heartbeat says. */
    int nholders;
    long holder_proc[HOLDERS_MAX];
    int holder_alive[HOLDERS_MAX];
    int holders_refused; /* 1: the newest record of them did not verify (forged in Redis) */
    /* No generation of this rank through this step carried state of its own (no DP_SHARDED
     * region, no extra bytes; control.h KEY_STATELESS), only DP_IDENTICAL regions, which every
     * rank keeps in its own snapshots: when it covers the rollback, the rank loses nothing
     * when it fails, and needs no holder as long as a member survives to provide the
     * identical state. -1: it may have some, or it is not known. */
    long long stateless_through;
} DecideFailure;

typedef struct {
    int ft;                         /* ft_mode */
    long epoch;                     /* the current epoch; the decision is for epoch + 1 */
    int world;                      /* ranks, 1 .. DP_MAX_RANKS */
    long procs[DP_MAX_RANKS];       /* procs[rank]: the member holding rank in this epoch */
    int nfailed;                    /* pending failures, 0 .. world */
    DecideFailure failed[DP_MAX_RANKS];
    long long restore_point;        /* the generation this epoch started from (-1 = initial state) */
    long long committed_min;        /* newest generation every rank committed in this epoch, -1 = none */
    int nspares;
    long spares[DP_MAX_RANKS];      /* live spares; taken in ascending proc-id order */
    int suspicion_due;              /* a failed collective with no failed member has lasted long enough */
    int64_t now_wall_ms;            /* the decision's timestamps when no failure gives them */
    int64_t checkpoint_step;        /* newest complete checkpoint in `out`, -1 = none */
    const char *resume;             /* the command that resumes the job (for messages) */
    int spare_wait;                 /* --spare-wait, seconds (for messages) */
    /* 1 while the control plane is unreachable, or came back less than a detect timeout ago
     * (decide_control_settled says 0): the processes may not have republished their commit
     * records and heartbeats yet, so nothing is decided (DECIDE_WAIT), failures wait. */
    int control_unsettled;
    /* Rebuilds with the same members decided in a row while no step was committed: a recovery
     * that keeps failing with no member failing (a transfer too slow for its bound, say) */
    int fruitless_rebuilds;
} DecideInput;

/* So many rebuilds in a row without a committed step, and the job stops (DECIDE_GIVE_UP)
 * instead of looping on a recovery that fails every time. */
#define DECIDE_MAX_FRUITLESS_REBUILDS 3

typedef enum {
    DECIDE_WAIT = 0,     /* nothing to decide yet */
    DECIDE_SWAP,         /* spares take the failed ranks: publish *out */
    DECIDE_REBUILD,      /* same members, new communicator: publish *out */
    DECIDE_NO_SPARE,     /* fewer live spares than failed ranks: persist, wait for spares; `why`
                          * says what to tell the user if none comes within --spare-wait */
    DECIDE_STATE_LOST,   /* a failed rank with state of its own lost every holder of its replicas, or
                          * every rank failed and rank 0's holders with them (the identical state): `why` */
    DECIDE_NO_FT,        /* --ft disk|none: no in-memory snapshots to hot-swap from: `why` */
    DECIDE_GIVE_UP,      /* DECIDE_MAX_FRUITLESS_REBUILDS rebuilds failed alike: persist, stop; `why` */
    DECIDE_INVALID,      /* the input is inconsistent (a world, rank or count out of range): `why` */
} decide_outcome;

/* Decides the next step. *out is filled for every outcome but DECIDE_WAIT and DECIDE_INVALID (for NO_SPARE,
 * STATE_LOST and NO_FT too, so that the caller knows the rollback generation; failed ranks
 * without a spare then have spare_proc 0): epoch + 1, world, rollback = max(committed_min,
 * restore_point), the members with each failed rank given the next spare, the earliest
 * failure time, the first failure's detection time, t_decide_ms = now_wall_ms (the caller
 * stamps it again when it publishes). `why` (may be NULL) gets the message for the user, or
 * "" when there is none. */
decide_outcome decide_next(const DecideInput *in, Decision *out, char *why, size_t whylen);

/* Whole-machine loss: which members fail together with silent ones. node[r] is the index of
 * rank r's machine among those with a launcher (-1: none, e.g. a process joined by hand);
 * alive[r] its heartbeat; node_alive[k] machine k's launcher key (nnodes entries). A machine
 * whose launcher is silent and which has a silent member is lost as a whole: every member on
 * it gets fail[r] = 1, the ones still heartbeating too, so that the loss is one decision and
 * not one per heartbeat expiry. A silent member on a machine whose launcher is alive fails
 * alone (its launcher would have reported an exit: it hangs or is cut off by itself). The
 * number of members marked. */
int decide_nodes_lost(int world, const int *node, const int *alive, const int *node_alive, int nnodes, int *fail);

/* Resuming without a shared filesystem: inventories[i] is what machine i has on disk
 * (checkpoint_inventory's text, protocol.h: inventory_parse; one that parser refuses counts
 * for nothing). The newest step whose state files of all `world` ranks are on some machine,
 * -1 if none. `why` (may be NULL) is "" when the newest step is complete and every inventory
 * parsed; otherwise it names the newest step's missing ranks (an older step was chosen, or
 * none), or says that no machine has a checkpoint, and then the first refused inventory with
 * the parser's error. */
int64_t resume_choose(const char *const *inventories, int n, int world, char *why, size_t whylen);

/* --- the control plane's outages (issue 27, item 11) -----------------------------------
 * "Redis unreachable" is no evidence that a process died: heartbeats that could not be read,
 * or that expired while nobody could renew them, say nothing. The coordinator's view of the
 * control plane: */
typedef struct {
    double now_ms;               /* monotonic */
    int reachable;               /* the last query answered */
    double back_since_ms;        /* when it answered again after its last outage (0 = never away) */
    int detect_timeout_ms;
} DecideControl;

/* 1 when silence may be read as a death and a decision may be taken: the control plane answers
 * and its last outage ended at least a detect timeout ago (every process had a whole heartbeat
 * life to beat again and republish what it owns). 0 otherwise. */
int decide_control_settled(const DecideControl *c);

/* The spares a decision may use: the live ones, in the pool's order, at most max, and not one
 * on a machine where a failed rank ran (a crashed machine's spares still heartbeat for up to a
 * detect timeout; a spare that dies while it joins costs a second decision). spare_node[i]:
 * spare i's machine ("" or NULL unknown); failed_node: the failed ranks' machines (nfailed 0
 * on one machine). Writes their ids to out; returns how many. */
int decide_spares_usable(const long *ids, const int *alive, const char *const *spare_node, int n,
                         const char *const *failed_node, int nfailed, long *out, int max);

/* How the coordinator's view of the control plane changes with one liveness query. */
typedef struct {
    int reachable;               /* the last query answered (starts 1) */
    double back_since_ms;        /* when it answered again after its last outage (0 = never away) */
    double unreachable_since_ms; /* the outage in progress began (0 = none) */
    double last_ok_ms;           /* when a query last answered (0 = never) */
} ControlView;
typedef enum {
    CONTROL_OK,         /* answered, as before */
    CONTROL_WENT_AWAY,  /* did not answer, after answering: an outage begins */
    CONTROL_STILL_AWAY, /* did not answer, again */
    CONTROL_BACK,       /* answered after not answering, or a call on the connection found
                         * Redis absent since the last query (an outage that was over before it) */
    CONTROL_STALE,      /* answered, but the last answer is older than half a heartbeat's life
                         * (Redis stalled, or this query waited that long): keys may have expired
                         * while nobody could renew them */
} control_seen;
/* The view after a query at now_ms: answered (1/0), and whether the connection counted Redis
 * absent since the last query. BACK and STALE restart the settling time (back_since_ms). */
control_seen decide_control_observe(ControlView *v, int answered, int absent_meanwhile, double now_ms, int detect_timeout_ms);
/* The coordinator itself blocked waited_ms on a call Redis answered (a WAIT for a replica):
 * Redis ran meanwhile, so that time is no gap in the view. */
void decide_control_waited(ControlView *v, double waited_ms);

/* The newest generation every rank can restore, after an outage: committed[r] is rank r's
 * commit record in Redis (-1 none), exact for the members that live (they republished it);
 * a failed rank's record may be older than what it really committed (written while Redis was
 * away, its records never arrived), so for failed[r] != 0 held[r], the newest generation the
 * rank's live holders all have in this epoch (-1 unknown), counts when it is newer. Every rank
 * commits k + 1 only after every rank committed k, so the result is in every survivor's
 * buffers and in every failed rank's holders. The minimum over the ranks, -1 when some rank
 * has nothing. */
long long decide_committed_min(int world, const long long *committed, const int *failed, const long long *held);

/* "wait", "swap", "rebuild", "no_spare", "state_lost", "no_ft", "invalid". */
const char *decide_outcome_name(decide_outcome o);

/* --- silence, probes and machines (coordinator.c): the choices, without the I/O ---------- */

/* What a local member whose heartbeat expired is doing, from the text of its /proc/PID/stat
 * (NULL: the file could not be opened, the process is gone). The state is the field after the
 * comm, which is in parentheses and may itself hold spaces and ')': it is read after the last
 * ')'. "hang" when stopped (T, t), "crash" for a zombie (Z) or no file, else "network" (it
 * runs, yet is unheard: cut off from the job), also when the text has no state to read. */
const char *decide_silent_kind(const char *stat);

/* Whom a probe of the members asks (coordinator.c probe_members, after a failed collective or
 * a machine's expired key): the ranks of 0..world neither departed (left on purpose) nor
 * pending (known failed: a cut-off machine's ranks would only make the probe wait out its
 * bound), in rank order. Writes their ranks to who; returns how many. */
int decide_probe_whom(int world, const char *departed, const char *pending, int *who);

/* What the probe of who[0..n) says. state[i] is tcp_probe_many's answer for who[i]: 1 something
 * listens, 0 refused, -1 no answer. A refused replica port confirms a death (the kernel of a
 * live machine answers for a live process, even a hung one): dead[r] = 1, a crash, unless r is
 * departed or pending. No answer proves nothing (a cut link: the heartbeat decides). state
 * NULL (no probe was made): nobody. dead has world entries, the others 0; returns how many. */
int decide_probe_dead(int world, const int *who, const int *state, int n, const char *departed, const char *pending,
                      int *dead);

/* When a confirmed failure happened: t_fail_ms, or earlier_ms when it is earlier and > 0 (the
 * report that led to the probe: the process died before its peer noticed; the exit record its
 * machine's launcher wrote). */
int64_t decide_fail_time(int64_t t_fail_ms, int64_t earlier_ms);

/* Machines whose launcher key expired (coordinator.c watch_machines), to have their ranks
 * probed once: a crashed machine's ranks refuse at once, however long the survivors' step runs
 * before a collective would find the reset. Machine k of n, as registered: index[k] its slot
 * in probed (0 .. nprobed; a machine outside is skipped), id[k] its name, present[k] its
 * launcher key is there. A machine is newly probed, probed[index[k]] = 1, when its key is
 * absent, it is not `mine` (this launcher runs, so its machine is not lost), one of the ranks
 * 0..world runs on it (rank_node[r] equals id[k]) and it was not probed already. A key that is
 * there again (a launcher merely slow), and mine, clear the mark. Returns how many machines
 * were newly marked (> 0: a probe is due). */
int decide_machines_to_probe(int n, const int *index, const char *const *id, const int *present, const char *mine,
                             const char *const *rank_node, int world, char *probed, int nprobed);

/* What becomes of a rank when members fall silent (coordinator.c silent_members). */
typedef enum {
    SILENT_NONE = 0,  /* nothing: it heartbeats (and its machine is not lost), or it departed or
                       * failed already */
    SILENT_DEPARTED,  /* its exit record says it left on purpose (done, fenced, output): it is
                       * departed, its silence is no failure */
    SILENT_NODE,      /* lost with its machine (decide_nodes_lost): a failure of kind "node" */
    SILENT_CRASH,     /* silent, and its machine's launcher recorded a crash: "crash" */
    SILENT_PROC,      /* silent, no crash recorded: its kind from /proc (decide_silent_kind), or
                       * "unknown" when it does not run on this machine */
} silent_verdict;

/* The verdict on each of the ranks 0..world (at most DP_MAX_RANKS) once the liveness query
 * found some silent. alive[r]: its heartbeat; departed[r], pending[r]: it left on purpose, it
 * failed already (verdict SILENT_NONE); ex[r]: its exit record (how EXITED_HOWS: none, or
 * malformed); node[r], node_alive[0..nnodes): as decide_nodes_lost. In this order: a departed
 * record makes a silent rank departed (and alive for the machine loss); a rank on a lost
 * machine fails with it, heartbeating or not; a silent rank with a crash record crashed; any
 * other silent one is classed by its process. t_exit_ms[r] (may be NULL): when the exit
 * record of a failing rank says it ended, to date the failure earlier (decide_fail_time), 0
 * when there is none. Returns the highest silent rank whose process stopped on a bad job (the
 * job cannot go on: its machine's log says why; the rank still gets its verdict), -1 if none
 * (and for a world out of range, when nothing is written). */
int decide_silent_members(int world, const int *alive, const char *departed, const char *pending, const ExitRecord *ex,
                          const int *node, const int *node_alive, int nnodes, silent_verdict *verdict, int64_t *t_exit_ms);

#endif
