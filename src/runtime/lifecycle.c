/* lifecycle.c — a process's lifecycle as a pure transition function (see lifecycle.h). */
#include "lifecycle.h"

#include "runtime.h"

static const char *const STATE_NAMES[LC_STATES] = {
    "init", "new", "spare", "restoring", "rejoining", "resuming", "stepping", "waiting", "retrying",
    "done", "stopped", "fenced", "failed",
};

static const char *const INPUT_NAMES[LC_INPUTS] = {
    "rank_claimed", "no_rank", "started", "start_failed", "decision_mine", "fenced", "restored", "restore_failed",
    "join_failed", "joined", "committed", "step_failed", "job_over", "control_lost", "no_decision", "diverged",
    "finished",
};

const char *lc_state_name(lc_state s) { return s >= 0 && s < LC_STATES ? STATE_NAMES[s] : "invalid"; }
const char *lc_input_name(lc_input in) { return (int)in >= 0 && in < LC_INPUTS ? INPUT_NAMES[in] : "invalid"; }

int lc_terminal(lc_state s) { return s == LC_DONE || s == LC_STOPPED || s == LC_FENCED || s == LC_FAILED; }

int lc_exit_status(dp_status how, dp_role role, int joined, int transient, int trained) {
    int took_a_rank = joined || role == DP_ROLE_SURVIVOR || role == DP_ROLE_RECOVERED;
    return how == DP_OK ? DP_EXIT_DONE
         : how == DP_STOPPED ? DP_EXIT_STOPPED
         : how == DP_FENCED ? DP_EXIT_FENCED
         : !took_a_rank && !transient ? DP_EXIT_BAD_JOB
         : how == DP_ERR && trained ? DP_EXIT_OUTPUT /* trained, then failed to write */
         : DP_EXIT_FAILED;
}

/* A failed join: report it (from where), drop the epoch's communicators, wait for the next
 * decision. */
static lc_state join_failed(lc_actions *a, join_phase phase) {
    a->flags = LC_ACT_REPORT_JOIN_FAILED | LC_ACT_END_COMMS | LC_ACT_AWAIT_DECISION;
    a->phase = phase;
    return LC_RETRYING;
}

/* A member (RESUMING or STEPPING): the step's outcomes. */
static lc_state member(lc_state s, lc_input in, lc_actions *a) {
    switch (in) {
    case LC_IN_COMMITTED:
        a->flags = s == LC_RESUMING ? LC_ACT_FIRST_COMMIT : LC_ACT_STEP_TIME;
        return LC_STEPPING;
    case LC_IN_STEP_FAILED:
        a->flags = LC_ACT_END_COMMS | LC_ACT_AWAIT_DECISION;
        return LC_WAITING;
    case LC_IN_JOB_OVER: return LC_STOPPED;
    case LC_IN_DIVERGED:
        a->flags = LC_ACT_PERSIST_COMMITTED;
        return LC_STOPPED;
    case LC_IN_FINISHED:
        a->flags = LC_ACT_REPORT_DONE;
        return LC_DONE;
    default: return LC_INVALID;
    }
}

/* WAITING or RETRYING: what the coordinator decided, or why no decision is coming. */
static lc_state waiting(lc_state s, lc_input in, lc_actions *a) {
    switch (in) {
    case LC_IN_DECISION_MINE:
        /* A member whose step failed: a survivor. After a failed join the role stays what the
         * first decision made it: a survivor's is survivor already, and a spare whose takeover
         * failed is still a spare taking a rank (recovered), not a member that rolls back from
         * buffers of its own (it may never have committed that rank's state). The restore does
         * not depend on the role: rt_restore_generation uses this process's own buffers only
         * when they hold a generation of its rank at the rollback step (checked by
         * rt_restore_payload), else a holder or the disk, as for any spare. The coordinator
         * counts it as the member of its rank (as it is since the decision that named it) and
         * among the survivors; the restore does not count on it for the identical state
         * (rt_restore.c: nothing_of_its_own, identical_from_replica). */
        a->flags = LC_ACT_RESTORE;
        if (s == LC_WAITING) a->role = DP_ROLE_SURVIVOR;
        return LC_RESTORING;
    case LC_IN_FENCED:
        a->flags = LC_ACT_REPORT_FENCED;
        return LC_FENCED;
    case LC_IN_JOB_OVER: return LC_STOPPED;
    case LC_IN_CONTROL_LOST:
        /* After a failed join too: a survivor still holds what it committed before (the old
         * epoch's snapshots stay until the new epoch commits), and with every member retrying
         * nobody else would write the job's checkpoint. A spare that took a rank and committed
         * nothing of it has nothing to write (rt_persist_without_control returns at once). */
        a->flags = LC_ACT_PERSIST_LOCAL;
        return LC_STOPPED;
    case LC_IN_NO_DECISION: return LC_FAILED;
    default: return LC_INVALID;
    }
}

static lc_state transition(lc_state s, lc_input in, lc_actions *a) {
    switch (s) {
    case LC_INIT:
        if (in == LC_IN_RANK_CLAIMED) { a->role = DP_ROLE_INITIAL; return LC_NEW; }
        if (in == LC_IN_NO_RANK) { a->role = DP_ROLE_SPARE; return LC_SPARE; }
        return LC_INVALID;
    case LC_NEW:
        if (in == LC_IN_STARTED) return LC_STEPPING;
        if (in == LC_IN_START_FAILED) return LC_FAILED;
        if (in == LC_IN_JOIN_FAILED) { /* epoch 0's rendezvous: a member died or hung as the job started */
            a->role = DP_ROLE_SURVIVOR; /* a member that outlived a failure, with nothing committed yet */
            return join_failed(a, JOIN_RENDEZVOUS);
        }
        return LC_INVALID;
    case LC_SPARE:
        switch (in) {
        case LC_IN_DECISION_MINE:
            a->flags = LC_ACT_LEAVE_POOL | LC_ACT_RESTORE;
            a->role = DP_ROLE_RECOVERED;
            return LC_RESTORING;
        case LC_IN_JOB_OVER:
        case LC_IN_CONTROL_LOST:
            a->flags = LC_ACT_LEAVE_POOL;
            return LC_STOPPED;
        case LC_IN_START_FAILED: return LC_FAILED; /* the pool refused it: it never entered */
        default: return LC_INVALID;
        }
    case LC_RESTORING:
        if (in == LC_IN_RESTORED) { a->flags = LC_ACT_REJOIN; return LC_REJOINING; }
        if (in == LC_IN_RESTORE_FAILED) return join_failed(a, JOIN_RESTORE);
        return LC_INVALID;
    case LC_REJOINING:
        if (in == LC_IN_JOINED) return LC_RESUMING;
        if (in == LC_IN_JOIN_FAILED) return join_failed(a, JOIN_RENDEZVOUS);
        /* No member restored the identical state: as hopeless as a restore of our own. */
        if (in == LC_IN_RESTORE_FAILED) return join_failed(a, JOIN_RESTORE);
        return LC_INVALID;
    case LC_RESUMING:
    case LC_STEPPING: return member(s, in, a);
    case LC_WAITING:
    case LC_RETRYING: return waiting(s, in, a);
    default: return LC_INVALID; /* terminal states, and anything out of range */
    }
}

lc_state lc_step(lc_state s, lc_input in, lc_actions *a) {
    *a = (lc_actions){.flags = 0, .phase = JOIN_RENDEZVOUS, .role = -1};
    if ((int)in < 0 || in >= LC_INPUTS) return LC_INVALID;
    lc_state next = transition(s, in, a);
    if (next == LC_INVALID) *a = (lc_actions){.flags = 0, .phase = JOIN_RENDEZVOUS, .role = -1};
    return next;
}
