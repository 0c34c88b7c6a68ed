/* test_lifecycle.c — a process's lifecycle (lifecycle.h), a pure transition function: each
 * transition the end-to-end tests drive (named after the test that drives it), the walks of
 * whole recoveries as runtime.c feeds them, and every other (state, input) pair rejected. */
#include <stdio.h>
#include <string.h>

#include "deadpool.h"
#include "harness.h"
#include "lifecycle.h"
#include "recovery.h"
#include "runtime.h"

/* One transition: from `s` on `in` to `next` with exactly these actions. */
static void expect(lc_state s, lc_input in, lc_state next, unsigned flags, int role) {
    lc_actions a;
    memset(&a, 0xAB, sizeof a); /* lc_step must write every field */
    lc_state got = lc_step(s, in, &a);
    CHECK(got == next, "%s + %s: %s, expected %s", lc_state_name(s), lc_input_name(in), lc_state_name(got),
          lc_state_name(next));
    CHECK(a.flags == flags, "%s + %s: actions 0x%x, expected 0x%x", lc_state_name(s), lc_input_name(in), a.flags, flags);
    CHECK(a.role == role, "%s + %s: role %d, expected %d", lc_state_name(s), lc_input_name(in), a.role, role);
}

/* A failed join: it reports where, ends the epoch's communicators and waits. */
static void expect_join_failed(lc_state s, lc_input in, join_phase phase) {
    lc_actions a;
    expect(s, in, LC_RETRYING, LC_ACT_REPORT_JOIN_FAILED | LC_ACT_END_COMMS | LC_ACT_AWAIT_DECISION, -1);
    lc_step(s, in, &a);
    CHECK(a.phase == phase, "%s + %s: phase %s, expected %s", lc_state_name(s), lc_input_name(in),
          join_phase_name(a.phase), join_phase_name(phase));
}

/* --- dp_init and dp_join ---------------------------------------------------------------- */

static void test_init_claims_a_rank(void) { expect(LC_INIT, LC_IN_RANK_CLAIMED, LC_NEW, 0, DP_ROLE_INITIAL); }

/* e2e_hotswap's spares, and a process whose rank is taken. */
static void test_init_without_rank_is_a_spare(void) { expect(LC_INIT, LC_IN_NO_RANK, LC_SPARE, 0, DP_ROLE_SPARE); }

static void test_member_starts_stepping(void) { expect(LC_NEW, LC_IN_STARTED, LC_STEPPING, 0, -1); }

/* A resume or the first snapshots that fail: no epoch to recover into. */
static void test_failed_start_fails(void) { expect(LC_NEW, LC_IN_START_FAILED, LC_FAILED, 0, -1); }

static void test_spare_refused_by_the_pool_fails(void) { expect(LC_SPARE, LC_IN_START_FAILED, LC_FAILED, 0, -1); }

/* --- the step ----------------------------------------------------------------------------- */

static void test_commit_keeps_stepping(void) { expect(LC_STEPPING, LC_IN_COMMITTED, LC_STEPPING, LC_ACT_STEP_TIME, -1); }

/* The new epoch's first commit: the old snapshots go, rank 0 reports `recovered`, and the
 * step's time (a recovery's) is not a usual step's. */
static void test_first_commit_of_an_epoch(void) {
    expect(LC_RESUMING, LC_IN_COMMITTED, LC_STEPPING, LC_ACT_FIRST_COMMIT, -1);
}

/* e2e_hotswap crash_kill9 (a survivor's collective fails), hang_sigstop (the epoch closed). */
static void test_step_failure_waits_for_a_decision(void) {
    expect(LC_STEPPING, LC_IN_STEP_FAILED, LC_WAITING, LC_ACT_END_COMMS | LC_ACT_AWAIT_DECISION, -1);
}

/* A failure in an epoch's first step (no end-to-end test aims at it). */
static void test_step_failure_before_the_first_commit(void) {
    expect(LC_RESUMING, LC_IN_STEP_FAILED, LC_WAITING, LC_ACT_END_COMMS | LC_ACT_AWAIT_DECISION, -1);
}

/* e2e_torch torch_ctrl_c_keeps_the_work: Ctrl-C turns the job's state "stopping" mid-training. */
static void test_job_over_while_stepping(void) {
    expect(LC_STEPPING, LC_IN_JOB_OVER, LC_STOPPED, 0, -1);
    expect(LC_RESUMING, LC_IN_JOB_OVER, LC_STOPPED, 0, -1);
}

static void test_divergence_persists_and_stops(void) {
    expect(LC_STEPPING, LC_IN_DIVERGED, LC_STOPPED, LC_ACT_PERSIST_COMMITTED, -1);
    expect(LC_RESUMING, LC_IN_DIVERGED, LC_STOPPED, LC_ACT_PERSIST_COMMITTED, -1);
}

/* Every e2e test's clean end; a spare that took a rank in the last steps ends from RESUMING. */
static void test_last_step_done(void) {
    expect(LC_STEPPING, LC_IN_FINISHED, LC_DONE, LC_ACT_REPORT_DONE, -1);
    expect(LC_RESUMING, LC_IN_FINISHED, LC_DONE, LC_ACT_REPORT_DONE, -1);
}

/* --- recovery ----------------------------------------------------------------------------- */

/* A survivor named by the decision keeps its rank and restores its own generation. */
static void test_survivor_named_by_the_decision(void) {
    expect(LC_WAITING, LC_IN_DECISION_MINE, LC_RESTORING, LC_ACT_RESTORE, DP_ROLE_SURVIVOR);
}

/* e2e_hotswap crash_kill9: the spare takes the failed rank and leaves the pool. */
static void test_spare_named_by_the_decision(void) {
    expect(LC_SPARE, LC_IN_DECISION_MINE, LC_RESTORING, LC_ACT_LEAVE_POOL | LC_ACT_RESTORE, DP_ROLE_RECOVERED);
}

static void test_restored_then_rejoins(void) { expect(LC_RESTORING, LC_IN_RESTORED, LC_REJOINING, LC_ACT_REJOIN, -1); }

static void test_rejoined_resumes(void) { expect(LC_REJOINING, LC_IN_JOINED, LC_RESUMING, 0, -1); }

/* e2e_hotswap failure_during_recovery, e2e_example kill_hang_recovery_failure, e2e_torch
 * torch_failure_during_recovery (rkill): the replacement dies after its restore, the others'
 * rendezvous fails; they report join_failed "rendezvous" and wait for the next decision. */
static void test_failure_during_recovery(void) { expect_join_failed(LC_REJOINING, LC_IN_JOIN_FAILED, JOIN_RENDEZVOUS); }

/* ...and the next decision names them again: they restore, their role unchanged (a
 * survivor's is survivor, see the walk of a spare whose takeover failed). */
static void test_decision_after_a_failed_join(void) {
    expect(LC_RETRYING, LC_IN_DECISION_MINE, LC_RESTORING, LC_ACT_RESTORE, -1);
}

/* No copy of the rank's state is reachable (the coordinator stops the job on this report). */
static void test_restore_failure_reports_phase_restore(void) {
    expect_join_failed(LC_RESTORING, LC_IN_RESTORE_FAILED, JOIN_RESTORE);
}

/* No member restored the identical state: found after the rendezvous, as hopeless. */
static void test_identical_state_lost_reports_phase_restore(void) {
    expect_join_failed(LC_REJOINING, LC_IN_RESTORE_FAILED, JOIN_RESTORE);
}

/* e2e_hotswap hung_worker_fenced_when_it_wakes, network_loss_detected_fenced_and_cleaned_up:
 * the process stopped or cut off finds, waiting, a decision that replaced it. */
static void test_fence_while_waiting(void) { expect(LC_WAITING, LC_IN_FENCED, LC_FENCED, LC_ACT_REPORT_FENCED, -1); }

static void test_fence_after_a_failed_join(void) {
    expect(LC_RETRYING, LC_IN_FENCED, LC_FENCED, LC_ACT_REPORT_FENCED, -1);
}

/* e2e_blink: Redis gone past --control-wait while a failure waits: persist, stop. */
static void test_control_plane_lost_while_waiting(void) {
    expect(LC_WAITING, LC_IN_CONTROL_LOST, LC_STOPPED, LC_ACT_PERSIST_LOCAL, -1);
}

/* ...after a failed join alike: a survivor whose join failed still holds what it committed
 * (its old epoch's snapshots), and with every member retrying nobody else would write it. */
static void test_control_plane_lost_after_a_failed_join(void) {
    expect(LC_RETRYING, LC_IN_CONTROL_LOST, LC_STOPPED, LC_ACT_PERSIST_LOCAL, -1);
}

static void test_control_plane_lost_as_a_spare(void) {
    expect(LC_SPARE, LC_IN_CONTROL_LOST, LC_STOPPED, LC_ACT_LEAVE_POOL, -1);
}

/* Every e2e run with a spare left: the job ends, the spare leaves the pool and stops. */
static void test_spare_told_the_job_ended(void) { expect(LC_SPARE, LC_IN_JOB_OVER, LC_STOPPED, LC_ACT_LEAVE_POOL, -1); }

/* e2e_hotswap no_spare_persists_then_resume_bit_identical, owner_and_only_holder_lost: the
 * coordinator persists and stops the job while the survivors wait. */
static void test_job_over_while_waiting(void) {
    expect(LC_WAITING, LC_IN_JOB_OVER, LC_STOPPED, 0, -1);
    expect(LC_RETRYING, LC_IN_JOB_OVER, LC_STOPPED, 0, -1);
}

static void test_no_decision_fails(void) {
    expect(LC_WAITING, LC_IN_NO_DECISION, LC_FAILED, 0, -1);
    expect(LC_RETRYING, LC_IN_NO_DECISION, LC_FAILED, 0, -1);
}

/* --- whole walks, as runtime.c feeds them -------------------------------------------------- */

static lc_state walk(lc_state s, const lc_input *ins, int n, unsigned *all_flags) {
    *all_flags = 0;
    for (int i = 0; i < n && s != LC_INVALID; i++) {
        lc_actions a;
        s = lc_step(s, ins[i], &a);
        *all_flags |= a.flags;
    }
    return s;
}

/* e2e_example kill_hang_recovery_failure, a survivor's life: start, a kill, recover, a hang,
 * recover, a kill whose replacement dies in recovery, recover again, finish. */
static void test_walk_survivor_through_three_failures(void) {
    static const lc_input ins[] = {
        LC_IN_RANK_CLAIMED, LC_IN_STARTED, LC_IN_COMMITTED, LC_IN_STEP_FAILED, LC_IN_DECISION_MINE, LC_IN_RESTORED,
        LC_IN_JOINED, LC_IN_COMMITTED, LC_IN_COMMITTED, LC_IN_STEP_FAILED, LC_IN_DECISION_MINE, LC_IN_RESTORED,
        LC_IN_JOINED, LC_IN_COMMITTED, LC_IN_STEP_FAILED, LC_IN_DECISION_MINE, LC_IN_RESTORED, LC_IN_JOIN_FAILED,
        LC_IN_DECISION_MINE, LC_IN_RESTORED, LC_IN_JOINED, LC_IN_COMMITTED, LC_IN_FINISHED,
    };
    unsigned flags;
    lc_state end = walk(LC_INIT, ins, (int)(sizeof ins / sizeof ins[0]), &flags);
    CHECK(end == LC_DONE, "ends %s", lc_state_name(end));
    CHECK(!(flags & (LC_ACT_LEAVE_POOL | LC_ACT_PERSIST_LOCAL | LC_ACT_REPORT_FENCED)), "flags 0x%x", flags);
}

/* ...a spare's: it waits, takes a rank, trains, and is fenced when it hangs. */
static void test_walk_spare_taken_then_fenced(void) {
    static const lc_input ins[] = {
        LC_IN_NO_RANK, LC_IN_DECISION_MINE, LC_IN_RESTORED, LC_IN_JOINED, LC_IN_COMMITTED, LC_IN_COMMITTED,
        LC_IN_STEP_FAILED, LC_IN_FENCED,
    };
    unsigned flags;
    lc_state end = walk(LC_INIT, ins, (int)(sizeof ins / sizeof ins[0]), &flags);
    CHECK(end == LC_FENCED, "ends %s", lc_state_name(end));
    CHECK((flags & (LC_ACT_LEAVE_POOL | LC_ACT_FIRST_COMMIT | LC_ACT_REPORT_FENCED)) ==
              (LC_ACT_LEAVE_POOL | LC_ACT_FIRST_COMMIT | LC_ACT_REPORT_FENCED), "flags 0x%x", flags);
}

/* The role a walk leaves, as lc_feed keeps it (a transition's role, or the one before). */
static int walk_role(const lc_input *ins, int n) {
    lc_state s = LC_INIT;
    int role = -1;
    for (int i = 0; i < n && s != LC_INVALID; i++) {
        lc_actions a;
        s = lc_step(s, ins[i], &a);
        if (a.role >= 0) role = a.role;
    }
    return role;
}

/* e2e_hotswap failure_during_recovery's survivors, seen from a spare: it takes a rank, a
 * member dies while they recover, the rendezvous fails; the next decision names it again.
 * It is still the spare that took the rank (DP_ROLE_RECOVERED when dp_join returns), not a
 * survivor: it never rolled back from buffers of its own. It left the pool once; the second
 * decision restores as the first did (its own buffers only if they hold its rank's
 * generation, else a holder). A survivor in the same walk stays a survivor. */
static void test_walk_spare_whose_takeover_failed_stays_recovered(void) {
    static const lc_input ins[] = {
        LC_IN_NO_RANK, LC_IN_DECISION_MINE, LC_IN_RESTORED, LC_IN_JOIN_FAILED, LC_IN_DECISION_MINE, LC_IN_RESTORED,
        LC_IN_JOINED, LC_IN_COMMITTED,
    };
    int n = (int)(sizeof ins / sizeof ins[0]);
    unsigned flags;
    lc_state end = walk(LC_INIT, ins, n, &flags);
    CHECK(end == LC_STEPPING, "ends %s", lc_state_name(end));
    int role = walk_role(ins, n);
    CHECK(role == DP_ROLE_RECOVERED, "role %d, expected %d (recovered)", role, DP_ROLE_RECOVERED);
    lc_actions a;
    lc_state s = lc_step(LC_RETRYING, LC_IN_DECISION_MINE, &a);
    CHECK(s == LC_RESTORING && a.flags == LC_ACT_RESTORE, "the second decision: %s, actions 0x%x", lc_state_name(s),
          a.flags);
    static const lc_input survivor[] = {
        LC_IN_RANK_CLAIMED, LC_IN_STARTED, LC_IN_COMMITTED, LC_IN_STEP_FAILED, LC_IN_DECISION_MINE, LC_IN_RESTORED,
        LC_IN_JOIN_FAILED, LC_IN_DECISION_MINE, LC_IN_RESTORED, LC_IN_JOINED,
    };
    role = walk_role(survivor, (int)(sizeof survivor / sizeof survivor[0]));
    CHECK(role == DP_ROLE_SURVIVOR, "a survivor's role %d, expected %d (survivor)", role, DP_ROLE_SURVIVOR);
}

/* e2e_hotswap kill_while_the_job_starts: a member dies as the job starts, epoch 0's
 * rendezvous is aborted. The others report it and wait for the decision that replaces it, as
 * survivors (nothing committed yet); before, they failed the start, exited as a bad job, and
 * the job stopped. */
static void test_start_rendezvous_failed_waits_as_a_survivor(void) {
    lc_actions a;
    expect(LC_NEW, LC_IN_JOIN_FAILED, LC_RETRYING, LC_ACT_REPORT_JOIN_FAILED | LC_ACT_END_COMMS | LC_ACT_AWAIT_DECISION,
           DP_ROLE_SURVIVOR);
    lc_step(LC_NEW, LC_IN_JOIN_FAILED, &a);
    CHECK(a.phase == JOIN_RENDEZVOUS, "phase %s, expected rendezvous", join_phase_name(a.phase));
    static const lc_input ins[] = {
        LC_IN_RANK_CLAIMED, LC_IN_JOIN_FAILED, LC_IN_DECISION_MINE, LC_IN_RESTORED, LC_IN_JOINED, LC_IN_COMMITTED,
        LC_IN_FINISHED,
    };
    unsigned flags;
    lc_state end = walk(LC_INIT, ins, (int)(sizeof ins / sizeof ins[0]), &flags);
    CHECK(end == LC_DONE, "ends %s", lc_state_name(end));
    /* giving up there (no decision came) is a failed process, replaced like a crash */
    static const lc_input gave_up[] = {LC_IN_RANK_CLAIMED, LC_IN_JOIN_FAILED, LC_IN_NO_DECISION};
    int n = (int)(sizeof gave_up / sizeof gave_up[0]);
    end = walk(LC_INIT, gave_up, n, &flags);
    int rc = lc_exit_status(DP_ERR, (dp_role)walk_role(gave_up, n), 0, 0, 0);
    CHECK(end == LC_FAILED && rc == DP_EXIT_FAILED, "gave up: %s, exit status %d, expected %d (failed)", lc_state_name(end),
          rc, DP_EXIT_FAILED);
}

/* --- the exit status (dp_finish) ------------------------------------------------------------ */

/* A spare takes a rank, its rendezvous fails (a member died recovering), and no decision
 * comes: it gives up (dp_join returns DP_ERR, never joined). The takeover failed, not the job:
 * it exits as failed (the launcher replaces it like a crash), not as a bad job (the launcher
 * would stop the whole job on it, or the coordinator call it unrestorable). */
static void test_spare_giving_up_after_a_failed_takeover_exits_failed(void) {
    static const lc_input ins[] = {
        LC_IN_NO_RANK, LC_IN_DECISION_MINE, LC_IN_RESTORED, LC_IN_JOIN_FAILED, LC_IN_NO_DECISION,
    };
    int n = (int)(sizeof ins / sizeof ins[0]);
    unsigned flags;
    lc_state end = walk(LC_INIT, ins, n, &flags);
    CHECK(end == LC_FAILED, "ends %s", lc_state_name(end));
    int rc = lc_exit_status(DP_ERR, (dp_role)walk_role(ins, n), 0, 0, 0);
    CHECK(rc == DP_EXIT_FAILED, "exit status %d, expected %d (failed)", rc, DP_EXIT_FAILED);
    /* ...also when the old table made it a survivor, and after a failed restore (DP_ERR or
     * DP_FAILED alike) */
    CHECK(lc_exit_status(DP_ERR, DP_ROLE_SURVIVOR, 0, 0, 0) == DP_EXIT_FAILED, "as a survivor");
    CHECK(lc_exit_status(DP_FAILED, DP_ROLE_RECOVERED, 0, 0, 0) == DP_EXIT_FAILED, "DP_FAILED");
    /* ...and a takeover that ends otherwise keeps its status */
    CHECK(lc_exit_status(DP_STOPPED, DP_ROLE_RECOVERED, 0, 0, 0) == DP_EXIT_STOPPED, "stopped");
    CHECK(lc_exit_status(DP_FENCED, DP_ROLE_RECOVERED, 0, 0, 0) == DP_EXIT_FENCED, "fenced");
}

/* What did not change: a process that never took a rank and failed to start is a bad job
 * (unless the control plane was away), and a member's statuses. */
static void test_exit_status_of_the_other_endings(void) {
    CHECK(lc_exit_status(DP_FAILED, DP_ROLE_INITIAL, 0, 0, 0) == DP_EXIT_BAD_JOB, "initial rank, start failed");
    CHECK(lc_exit_status(DP_ERR, DP_ROLE_SPARE, 0, 0, 0) == DP_EXIT_BAD_JOB, "spare refused by the pool");
    CHECK(lc_exit_status(DP_ERR, DP_ROLE_SPARE, 0, 1, 0) == DP_EXIT_FAILED, "...for the control plane's absence");
    CHECK(lc_exit_status(DP_FAILED, DP_ROLE_INITIAL, 0, 1, 0) == DP_EXIT_FAILED, "start failed, transient");
    CHECK(lc_exit_status(DP_STOPPED, DP_ROLE_SPARE, 0, 0, 0) == DP_EXIT_STOPPED, "a spare told the job ended");
    CHECK(lc_exit_status(DP_OK, DP_ROLE_INITIAL, 1, 0, 1) == DP_EXIT_DONE, "done");
    CHECK(lc_exit_status(DP_ERR, DP_ROLE_INITIAL, 1, 0, 1) == DP_EXIT_OUTPUT, "trained, output failed");
    CHECK(lc_exit_status(DP_ERR, DP_ROLE_SURVIVOR, 1, 0, 0) == DP_EXIT_FAILED, "member, no decision");
    CHECK(lc_exit_status(DP_FAILED, DP_ROLE_INITIAL, 1, 0, 0) == DP_EXIT_FAILED, "member gave up");
    CHECK(lc_exit_status(DP_FENCED, DP_ROLE_SURVIVOR, 1, 0, 0) == DP_EXIT_FENCED, "fenced");
}

/* A survivor's recovery whose rendezvous fails (a member died meanwhile), then the control
 * plane is lost past --control-wait: what it committed before the failure goes to disk. */
static void test_walk_survivor_failed_join_then_control_lost_persists(void) {
    static const lc_input ins[] = {
        LC_IN_RANK_CLAIMED, LC_IN_STARTED, LC_IN_COMMITTED, LC_IN_STEP_FAILED, LC_IN_DECISION_MINE, LC_IN_RESTORED,
        LC_IN_JOIN_FAILED, LC_IN_CONTROL_LOST,
    };
    unsigned flags;
    lc_state end = walk(LC_INIT, ins, (int)(sizeof ins / sizeof ins[0]), &flags);
    CHECK(end == LC_STOPPED, "ends %s", lc_state_name(end));
    CHECK(flags & LC_ACT_PERSIST_LOCAL, "flags 0x%x: the committed state is not persisted", flags);
}

/* --- what is rejected ------------------------------------------------------------------- */

/* The whole table: every accepted (state, input) pair. Anything else is LC_INVALID. */
typedef struct {
    lc_state s;
    lc_input in;
    lc_state next;
} Edge;

static const Edge EDGES[] = {
    {LC_INIT, LC_IN_RANK_CLAIMED, LC_NEW},
    {LC_INIT, LC_IN_NO_RANK, LC_SPARE},
    {LC_NEW, LC_IN_STARTED, LC_STEPPING},
    {LC_NEW, LC_IN_START_FAILED, LC_FAILED},
    {LC_NEW, LC_IN_JOIN_FAILED, LC_RETRYING},
    {LC_SPARE, LC_IN_DECISION_MINE, LC_RESTORING},
    {LC_SPARE, LC_IN_JOB_OVER, LC_STOPPED},
    {LC_SPARE, LC_IN_CONTROL_LOST, LC_STOPPED},
    {LC_SPARE, LC_IN_START_FAILED, LC_FAILED},
    {LC_RESTORING, LC_IN_RESTORED, LC_REJOINING},
    {LC_RESTORING, LC_IN_RESTORE_FAILED, LC_RETRYING},
    {LC_REJOINING, LC_IN_JOINED, LC_RESUMING},
    {LC_REJOINING, LC_IN_JOIN_FAILED, LC_RETRYING},
    {LC_REJOINING, LC_IN_RESTORE_FAILED, LC_RETRYING},
    {LC_RESUMING, LC_IN_COMMITTED, LC_STEPPING},
    {LC_RESUMING, LC_IN_STEP_FAILED, LC_WAITING},
    {LC_RESUMING, LC_IN_JOB_OVER, LC_STOPPED},
    {LC_RESUMING, LC_IN_DIVERGED, LC_STOPPED},
    {LC_RESUMING, LC_IN_FINISHED, LC_DONE},
    {LC_STEPPING, LC_IN_COMMITTED, LC_STEPPING},
    {LC_STEPPING, LC_IN_STEP_FAILED, LC_WAITING},
    {LC_STEPPING, LC_IN_JOB_OVER, LC_STOPPED},
    {LC_STEPPING, LC_IN_DIVERGED, LC_STOPPED},
    {LC_STEPPING, LC_IN_FINISHED, LC_DONE},
    {LC_WAITING, LC_IN_DECISION_MINE, LC_RESTORING},
    {LC_WAITING, LC_IN_FENCED, LC_FENCED},
    {LC_WAITING, LC_IN_JOB_OVER, LC_STOPPED},
    {LC_WAITING, LC_IN_CONTROL_LOST, LC_STOPPED},
    {LC_WAITING, LC_IN_NO_DECISION, LC_FAILED},
    {LC_RETRYING, LC_IN_DECISION_MINE, LC_RESTORING},
    {LC_RETRYING, LC_IN_FENCED, LC_FENCED},
    {LC_RETRYING, LC_IN_JOB_OVER, LC_STOPPED},
    {LC_RETRYING, LC_IN_CONTROL_LOST, LC_STOPPED},
    {LC_RETRYING, LC_IN_NO_DECISION, LC_FAILED},
};

static void test_every_other_pair_is_rejected(void) {
    int accepted = 0, n = (int)(sizeof EDGES / sizeof EDGES[0]);
    for (int s = 0; s < LC_STATES; s++)
        for (int in = 0; in < LC_INPUTS; in++) {
            const Edge *e = NULL;
            for (int i = 0; i < n; i++)
                if (EDGES[i].s == (lc_state)s && EDGES[i].in == (lc_input)in) e = &EDGES[i];
            lc_actions a;
            memset(&a, 0xAB, sizeof a);
            lc_state got = lc_step((lc_state)s, (lc_input)in, &a);
            if (e) {
                accepted++;
                CHECK(got == e->next, "%s + %s: %s, expected %s", lc_state_name((lc_state)s), lc_input_name((lc_input)in),
                      lc_state_name(got), lc_state_name(e->next));
            } else {
                CHECK(got == LC_INVALID, "%s + %s accepted (-> %s)", lc_state_name((lc_state)s),
                      lc_input_name((lc_input)in), lc_state_name(got));
                CHECK(a.flags == 0 && a.role == -1, "%s + %s: rejected with actions 0x%x role %d",
                      lc_state_name((lc_state)s), lc_input_name((lc_input)in), a.flags, a.role);
            }
        }
    CHECK(accepted == n, "%d of the table's %d edges seen", accepted, n);
}

/* The cases a caller could get wrong, spelled out. */
static void test_invalid_transitions_rejected(void) {
    expect(LC_SPARE, LC_IN_COMMITTED, LC_INVALID, 0, -1);     /* a spare has no step */
    expect(LC_STEPPING, LC_IN_DECISION_MINE, LC_INVALID, 0, -1); /* a decision is read only while waiting */
    expect(LC_STEPPING, LC_IN_FENCED, LC_INVALID, 0, -1);
    expect(LC_WAITING, LC_IN_COMMITTED, LC_INVALID, 0, -1);   /* no step while waiting */
    expect(LC_WAITING, LC_IN_STEP_FAILED, LC_INVALID, 0, -1); /* dp_recover twice */
    expect(LC_RESTORING, LC_IN_JOINED, LC_INVALID, 0, -1);    /* joined without its restore */
    expect(LC_NEW, LC_IN_STEP_FAILED, LC_INVALID, 0, -1);     /* dp_recover before dp_join */
    expect(LC_NEW, LC_IN_FINISHED, LC_INVALID, 0, -1);
    expect(LC_STEPPING, LC_IN_CONTROL_LOST, LC_INVALID, 0, -1); /* training does not wait for the control plane */
    for (int t = LC_DONE; t <= LC_FAILED; t++) {
        CHECK(lc_terminal((lc_state)t), "%s terminal", lc_state_name((lc_state)t));
        for (int in = 0; in < LC_INPUTS; in++) expect((lc_state)t, (lc_input)in, LC_INVALID, 0, -1);
    }
    for (int s = 0; s < LC_DONE; s++) CHECK(!lc_terminal((lc_state)s), "%s not terminal", lc_state_name((lc_state)s));
}

static void test_out_of_range_rejected(void) {
    expect(LC_INVALID, LC_IN_COMMITTED, LC_INVALID, 0, -1);
    expect(LC_STATES, LC_IN_COMMITTED, LC_INVALID, 0, -1);
    expect((lc_state)1000, LC_IN_STARTED, LC_INVALID, 0, -1);
    expect(LC_STEPPING, LC_INPUTS, LC_INVALID, 0, -1);
    expect(LC_STEPPING, (lc_input)-1, LC_INVALID, 0, -1);
    CHECK(!strcmp(lc_state_name((lc_state)1000), "invalid") && !strcmp(lc_input_name((lc_input)-3), "invalid"), "names");
}

/* Every state and input has a name of its own (they appear in the log). */
static void test_names_distinct(void) {
    for (int i = 0; i < LC_STATES; i++)
        for (int j = 0; j < i; j++)
            CHECK(strcmp(lc_state_name((lc_state)i), lc_state_name((lc_state)j)) != 0, "state %d and %d", i, j);
    for (int i = 0; i < LC_INPUTS; i++) {
        CHECK(strcmp(lc_input_name((lc_input)i), "invalid") != 0, "input %d unnamed", i);
        for (int j = 0; j < i; j++)
            CHECK(strcmp(lc_input_name((lc_input)i), lc_input_name((lc_input)j)) != 0, "input %d and %d", i, j);
    }
}

int main(void) {
    RUN_TEST(test_init_claims_a_rank);
    RUN_TEST(test_init_without_rank_is_a_spare);
    RUN_TEST(test_member_starts_stepping);
    RUN_TEST(test_failed_start_fails);
    RUN_TEST(test_start_rendezvous_failed_waits_as_a_survivor);
    RUN_TEST(test_spare_refused_by_the_pool_fails);
    RUN_TEST(test_commit_keeps_stepping);
    RUN_TEST(test_first_commit_of_an_epoch);
    RUN_TEST(test_step_failure_waits_for_a_decision);
    RUN_TEST(test_step_failure_before_the_first_commit);
    RUN_TEST(test_job_over_while_stepping);
    RUN_TEST(test_divergence_persists_and_stops);
    RUN_TEST(test_last_step_done);
    RUN_TEST(test_survivor_named_by_the_decision);
    RUN_TEST(test_spare_named_by_the_decision);
    RUN_TEST(test_restored_then_rejoins);
    RUN_TEST(test_rejoined_resumes);
    RUN_TEST(test_failure_during_recovery);
    RUN_TEST(test_decision_after_a_failed_join);
    RUN_TEST(test_restore_failure_reports_phase_restore);
    RUN_TEST(test_identical_state_lost_reports_phase_restore);
    RUN_TEST(test_fence_while_waiting);
    RUN_TEST(test_fence_after_a_failed_join);
    RUN_TEST(test_control_plane_lost_while_waiting);
    RUN_TEST(test_control_plane_lost_after_a_failed_join);
    RUN_TEST(test_control_plane_lost_as_a_spare);
    RUN_TEST(test_spare_told_the_job_ended);
    RUN_TEST(test_job_over_while_waiting);
    RUN_TEST(test_no_decision_fails);
    RUN_TEST(test_walk_survivor_through_three_failures);
    RUN_TEST(test_walk_spare_taken_then_fenced);
    RUN_TEST(test_walk_survivor_failed_join_then_control_lost_persists);
    RUN_TEST(test_walk_spare_whose_takeover_failed_stays_recovered);
    RUN_TEST(test_spare_giving_up_after_a_failed_takeover_exits_failed);
    RUN_TEST(test_exit_status_of_the_other_endings);
    RUN_TEST(test_every_other_pair_is_rejected);
    RUN_TEST(test_invalid_transitions_rejected);
    RUN_TEST(test_out_of_range_rejected);
    RUN_TEST(test_names_distinct);
    TEST_MAIN_END();
}
