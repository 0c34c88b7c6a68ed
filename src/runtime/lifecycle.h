/* lifecycle.h — one process's life in a job as a state machine: a pure transition function.
 *
 * lc_step(state, input, &actions) says which state a process of the job is in after an
 * event, and what runtime.c does about it (the actions). It does no I/O, reads no clock and
 * touches no Redis, so every transition is unit-testable (tests/test_lifecycle.c); runtime.c
 * observes the events (a decision read from Redis, a failed restore, the job's state turning
 * "stopping" ...), feeds them here and carries out the actions. An input the state does not
 * accept is a bug in the caller: lc_step returns LC_INVALID and no action, never a silent
 * no-op.
 *
 *                  INIT (dp_init)
 *      rank claimed |    | no rank
 *                   v    v
 *                 NEW    SPARE --job over, control lost [leave pool]-------------> (STOPPED)
 *                  |       |   \--start failed (the pool refused it)-------------> (FAILED)
 *          started |       | decision names it [leave pool, restore]
 *  (start failed:  |       v
 *     -> FAILED)   |   RESTORING <--decision names it [restore]-- RETRYING <------------+
 *                  |       | restored [rejoin]  \ restore failed                         |
 *                  |       v                     +-------------------------------------->+
 *                  |   REJOINING --join failed, state lost-------------------------------+
 *                  |       |    (into RETRYING: [report join_failed, end comms, await])
 *                  |       | joined        RETRYING --fenced--> (FENCED); --job over--> (STOPPED);
 *                  |       v               --control lost [persist]--> (STOPPED); --no decision--> (FAILED)
 *                  |   RESUMING --committed [first commit]--+
 *                  v                                         v
 *              STEPPING <------------------------------------+
 *               |  ^ committed [step time]
 *               |  +--'
 *               | step failed [end comms, await]     (RESUMING alike: step failed,
 *               v                                      job over, diverged, finished)
 *              WAITING --decision names it [restore]--> RESTORING
 *                      --fenced [report]--> (FENCED)   --job over--> (STOPPED)
 *                      --control lost [persist]--> (STOPPED)   --no decision--> (FAILED)
 *   STEPPING --job over--> (STOPPED)  --diverged [persist]--> (STOPPED)  --finished [report]--> (DONE)
 *
 * (X): terminal, accepts no input. docs/DESIGN.md has the full table. */
#ifndef DEADPOOL_LIFECYCLE_H
#define DEADPOOL_LIFECYCLE_H

#include "deadpool.h"
#include "recovery.h"

typedef enum {
    LC_INVALID = -1, /* lc_step's answer to an input the state does not accept */
    /* dp_init has registered the process and not claimed a rank yet: the one state before the
     * process knows whether it trains or waits. */
    LC_INIT = 0,
    /* A rank is claimed and dp_join has not made the process a member of epoch 0 yet (it
     * rendezvouses, restores a resumed checkpoint, starts its snapshots). Distinct from
     * STEPPING: nothing is committed yet. A rendezvous that fails (a member died or hung as the
     * job started) is a failed join: it waits for the decision that replaces that member, as a
     * survivor. Any other failure here ends the process. */
    LC_NEW,
    /* A warm spare: the application built its state, and the process waits in the spare pool
     * for a decision that names it. It owns no rank, holds other ranks' replicas, and is the
     * only state that leaves the pool. */
    LC_SPARE,
    /* A decision named this process: it restores the decision's rollback generation (its own
     * buffers, a holder, the disk). A failure here is the restore's (join phase "restore":
     * the coordinator stops the job rather than hand the same hopeless decision on). */
    LC_RESTORING,
    /* Restored: the new epoch's rendezvous, the identical state's broadcast, the
     * application's rebuild and the resnapshot of the restore point. A failure here is
     * usually a member that died while recovering (join phase "rendezvous": decide again). */
    LC_REJOINING,
    /* A member of a new epoch whose first step is not committed yet: the previous epoch's
     * snapshots are kept as the only other copy until it is, the step's time is not a usual
     * step's, and rank 0 reports the recovery when it commits. */
    LC_RESUMING,
    /* A member training: steps commit one after the other. */
    LC_STEPPING,
    /* A step failed (a collective, the epoch closed, a replication): dp_recover waits for the
     * coordinator's decision. With the control plane lost meanwhile it persists what it
     * committed. */
    LC_WAITING,
    /* Joining a new epoch failed (it reported join_failed): it waits for the next decision.
     * Apart from WAITING because it holds no epoch of its own any more. A control plane lost
     * here persists what it committed, as WAITING does: a survivor still has its old epoch's
     * snapshots; a spare that took a rank has nothing committed, and writes nothing. */
    LC_RETRYING,
    /* Terminal. Every step done (dp_finish with DP_OK). */
    LC_DONE,
    /* Terminal. The job ended (stopping, done or failed elsewhere; its launcher gone), the
     * control plane was lost past --control-wait, or training diverged. */
    LC_STOPPED,
    /* Terminal. A newer decision does not include this process (it hung or was cut off). */
    LC_FENCED,
    /* Terminal. No decision came in time, or dp_join could not make the process a member or a
     * spare. */
    LC_FAILED,
    LC_STATES
} lc_state;

typedef enum {
    LC_IN_RANK_CLAIMED,   /* dp_init claimed a rank */
    LC_IN_NO_RANK,        /* dp_init: a spare (asked for, or every rank taken) */
    LC_IN_STARTED,        /* dp_join: a member of epoch 0 */
    LC_IN_START_FAILED,   /* dp_join failed: epoch 0's resume or snapshots, or the spare pool */
    LC_IN_DECISION_MINE,  /* a decision newer than our epoch names this process */
    LC_IN_FENCED,         /* a decision newer than our epoch does not name this process */
    LC_IN_RESTORED,       /* the rollback generation is restored */
    LC_IN_RESTORE_FAILED, /* no copy of this rank's state, or of the identical state, is usable */
    LC_IN_JOIN_FAILED,    /* the new epoch's rendezvous, broadcast, rebuild or resnapshot failed;
                           * in NEW: epoch 0's rendezvous or broadcast (a member died as it started) */
    LC_IN_JOINED,         /* a member of the new epoch */
    LC_IN_COMMITTED,      /* dp_step_commit committed a step */
    LC_IN_STEP_FAILED,    /* a step failed (comm failure, epoch closed, replication): dp_recover */
    LC_IN_JOB_OVER,       /* the job's state is not "running" any more, or its launcher is gone */
    LC_IN_CONTROL_LOST,   /* a failure waited --control-wait for an unreachable control plane */
    LC_IN_NO_DECISION,    /* no decision arrived within the bound */
    LC_IN_DIVERGED,       /* the step's loss or gradient norm is not finite */
    LC_IN_FINISHED,       /* dp_finish with DP_OK: every step done */
    LC_INPUTS
} lc_input;

/* What runtime.c does on a transition (lc_actions.flags). */
enum {
    LC_ACT_LEAVE_POOL = 1 << 0,        /* leave the spare pool; its warm buffer goes once the restore is done */
    LC_ACT_RESTORE = 1 << 1,           /* join the decided epoch: restore its rollback generation */
    LC_ACT_REJOIN = 1 << 2,            /* rendezvous, share the identical state, rebuild, resnapshot */
    LC_ACT_REPORT_JOIN_FAILED = 1 << 3, /* report join_failed, in lc_actions.phase */
    LC_ACT_END_COMMS = 1 << 4,         /* end the epoch's communicators */
    LC_ACT_AWAIT_DECISION = 1 << 5,    /* wait (bounded) for the coordinator's next decision */
    LC_ACT_STEP_TIME = 1 << 6,         /* the step's time counts in the usual step time */
    LC_ACT_FIRST_COMMIT = 1 << 7,      /* drop the previous epoch's snapshots; rank 0 reports the recovery */
    LC_ACT_PERSIST_LOCAL = 1 << 8,     /* write the committed generations to disk without the control plane */
    LC_ACT_PERSIST_COMMITTED = 1 << 9, /* write the newest committed generation, rank 0 says why it stops */
    LC_ACT_REPORT_FENCED = 1 << 10,    /* log and emit `fenced` */
    LC_ACT_REPORT_DONE = 1 << 11,      /* the last replication done on every rank; rank 0 reports job_done */
};

typedef struct {
    unsigned flags;   /* LC_ACT_* */
    join_phase phase; /* with LC_ACT_REPORT_JOIN_FAILED: where the join failed */
    int role;         /* the process's dp_role from now on, -1 unchanged */
} lc_actions;

/* The state after `in` in state `s`, with what to do in *a (always written). LC_INVALID with
 * no action when `s` does not accept `in` (any input in a terminal state, an out-of-range
 * state or input). */
lc_state lc_step(lc_state s, lc_input in, lc_actions *a);
/* 1 for DONE, STOPPED, FENCED and FAILED. */
int lc_terminal(lc_state s);
/* dp_finish's exit status (runtime.h's dp_exit) for a process that leaves with `how` in role
 * `role` (dp_get_role): joined, dp_join returned DP_OK once; transient, its last failure to
 * start was the control plane's absence; trained, every step is done. A bad job (a replacement
 * would fail alike, the launcher stops the job) only for a process that never took a rank: an
 * initial rank whose start failed, a spare the pool refused. A spare named by a decision
 * (role recovered, or survivor) that gives up after a failed takeover exits as failed, as a
 * member would: the takeover failed, not the job (and a restore that failed for a bad job's
 * reason is reported as join_failed "restore", on which the coordinator stops the job). */
int lc_exit_status(dp_status how, dp_role role, int joined, int transient, int trained);
const char *lc_state_name(lc_state s);
const char *lc_input_name(lc_input in);

#endif
