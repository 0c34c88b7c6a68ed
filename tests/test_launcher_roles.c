/* test_launcher_roles.c — the decisions of the launcher's roles (launcher_roles.h), pure
 * functions, in each of their cases: the role after a look at the lease, when a role's loop
 * ends, a follower's reading of the job's state (and its processes' exits when the state is
 * gone), and the end: keeping the work on a stop, the final state, the control plane lost
 * after the last step, the exit status and the follower's last words. */
#include <string.h>

#include "config.h"
#include "harness.h"
#include "launcher_roles.h"

/* --- roles ---------------------------------------------------------------------------- */

static void test_coordinator_keeps_its_role_while_renewed(void) {
    CHECK(roles_after_lease(ROLE_COORDINATING, 1) == ROLE_COORDINATING, "renewed");
}

static void test_coordinator_keeps_its_role_on_redis_trouble(void) {
    /* Unreachable, its lease may still hold: it does not step down on an error. */
    CHECK(roles_after_lease(ROLE_COORDINATING, -1) == ROLE_COORDINATING, "Redis trouble");
}

static void test_coordinator_follows_once_its_lease_is_lost(void) {
    CHECK(roles_after_lease(ROLE_COORDINATING, 0) == ROLE_FOLLOWING, "lost: held up, another coordinates");
}

static void test_follower_coordinates_once_it_takes_the_lease(void) {
    CHECK(roles_after_lease(ROLE_FOLLOWING, 1) == ROLE_COORDINATING, "token 1");
    CHECK(roles_after_lease(ROLE_FOLLOWING, 7) == ROLE_COORDINATING, "token 7");
    CHECK(roles_after_lease(ROLE_FOLLOWING, 1LL << 40) == ROLE_COORDINATING, "a large token");
}

static void test_follower_follows_while_the_lease_is_held_or_unreadable(void) {
    CHECK(roles_after_lease(ROLE_FOLLOWING, 0) == ROLE_FOLLOWING, "held by another");
    CHECK(roles_after_lease(ROLE_FOLLOWING, -1) == ROLE_FOLLOWING, "Redis trouble");
}

static void test_a_role_loop_ends_with_the_job(void) {
    CHECK(!roles_job_over(0, 0, 0, 0), "nothing happened");
    CHECK(roles_job_over(1, 0, 0, 0), "stop signal");
    CHECK(roles_job_over(0, 1, 0, 0), "failed");
    CHECK(roles_job_over(0, 0, 1, 0), "done");
    CHECK(roles_job_over(0, 0, 0, 1), "control plane lost");
    CHECK(roles_job_over(1, 1, 1, 1), "all at once");
}

/* --- following ------------------------------------------------------------------------ */

#define TTL 2000

static FollowWatch watch_at(double reached, double absent) {
    FollowWatch w = {.reached_ms = reached, .absent_ms = absent};
    return w;
}

static void test_follow_running_goes_on(void) {
    FollowWatch w = watch_at(1000, 0);
    CHECK(roles_follow_state(&w, 1, JOB_STATE_RUNNING, 2, 0, 2, 5000, TTL) == FOLLOW_GOING, "running");
    CHECK(w.reached_ms == 5000, "reached now: %.0f", w.reached_ms);
    CHECK(w.absent_ms == 0, "present");
}

static void test_follow_done(void) {
    FollowWatch w = watch_at(1000, 0);
    follow_verdict v = roles_follow_state(&w, 1, JOB_STATE_DONE, 2, 0, 2, 1100, TTL);
    CHECK(v == FOLLOW_DONE, "done: %d", v);
    CHECK(roles_follow_done(v) && !roles_follow_failed(v) && !roles_follow_stopped_elsewhere(v), "done's effect");
}

static void test_follow_failed(void) {
    FollowWatch w = watch_at(1000, 0);
    follow_verdict v = roles_follow_state(&w, 1, JOB_STATE_FAILED, 2, 0, 2, 1100, TTL);
    CHECK(v == FOLLOW_FAILED, "failed: %d", v);
    CHECK(!roles_follow_done(v) && roles_follow_failed(v) && !roles_follow_stopped_elsewhere(v), "failed's effect");
}

static void test_follow_unknown_state_is_a_failure(void) {
    /* A text that is no job state never gets here (ctl_state_get refuses it: test_control);
     * a value out of the enum ends the job here as failed does. */
    FollowWatch w = watch_at(1000, 0);
    CHECK(roles_follow_state(&w, 1, JOB_STATES, 2, 0, 2, 1100, TTL) == FOLLOW_FAILED, "out of the enum");
}

static void test_follow_stopping(void) {
    FollowWatch w = watch_at(1000, 0);
    follow_verdict v = roles_follow_state(&w, 1, JOB_STATE_STOPPING, 2, 0, 2, 1100, TTL);
    CHECK(v == FOLLOW_STOPPED, "stopping: %d", v);
    CHECK(!roles_follow_done(v) && roles_follow_failed(v) && roles_follow_stopped_elsewhere(v), "stopping's effect");
}

static void test_follow_state_present_again_clears_the_absence(void) {
    FollowWatch w = watch_at(1000, 900);
    CHECK(roles_follow_state(&w, 1, JOB_STATE_RUNNING, 1, 0, 2, 1200, TTL) == FOLLOW_GOING, "back");
    CHECK(w.absent_ms == 0, "absence forgotten: %.0f", w.absent_ms);
    /* A later absence is timed from its own start, not the first one's. */
    CHECK(roles_follow_state(&w, 0, JOB_STATE_DONE, 1, 0, 2, 5000, TTL) == FOLLOW_GOING, "absent anew");
    CHECK(w.absent_ms == 5000, "timed from 5000: %.0f", w.absent_ms);
}

static void test_follow_absent_with_processes_running_waits(void) {
    FollowWatch w = watch_at(1000, 0);
    CHECK(roles_follow_state(&w, 0, JOB_STATE_DONE, 1, 1, 2, 1100, TTL) == FOLLOW_GOING, "first absence");
    CHECK(w.absent_ms == 1100, "absence starts: %.0f", w.absent_ms);
    CHECK(roles_follow_state(&w, 0, JOB_STATE_DONE, 1, 1, 2, 1100 + TTL, TTL) == FOLLOW_GOING, "at the TTL exactly");
    CHECK(w.absent_ms == 1100, "absence start kept: %.0f", w.absent_ms);
    CHECK(w.reached_ms == 1100 + TTL, "reached: %.0f", w.reached_ms);
}

static void test_follow_absent_too_long_leaves(void) {
    FollowWatch w = watch_at(1000, 0);
    (void)roles_follow_state(&w, 0, JOB_STATE_DONE, 1, 1, 2, 1100, TTL);
    follow_verdict v = roles_follow_state(&w, 0, JOB_STATE_DONE, 1, 1, 2, 1100 + TTL + 1, TTL);
    CHECK(v == FOLLOW_GONE_TOO_LONG, "past the TTL: %d", v);
    CHECK(!roles_follow_done(v) && roles_follow_failed(v) && !roles_follow_stopped_elsewhere(v), "leaving's effect");
}

static void test_follow_absent_all_exited_ok_is_done(void) {
    /* The coordinator ended the job and removed its keys while this launcher was held up:
     * its processes saw the end and finished. */
    FollowWatch w = watch_at(1000, 0);
    follow_verdict v = roles_follow_state(&w, 0, JOB_STATE_DONE, 0, 3, 3, 1100, TTL);
    CHECK(v == FOLLOW_GONE_DONE, "all exited 0: %d", v);
    CHECK(roles_follow_done(v) && !roles_follow_failed(v), "gone-done's effect");
    /* Decided at once, however long the absence lasted. */
    w = watch_at(1000, 0);
    (void)roles_follow_state(&w, 0, JOB_STATE_DONE, 1, 2, 3, 1100, TTL);
    CHECK(roles_follow_state(&w, 0, JOB_STATE_DONE, 0, 3, 3, 1100 + 10 * TTL, TTL) == FOLLOW_GONE_DONE, "long absence, all ok");
}

static void test_follow_absent_some_exited_badly_failed(void) {
    FollowWatch w = watch_at(1000, 0);
    follow_verdict v = roles_follow_state(&w, 0, JOB_STATE_DONE, 0, 2, 3, 1100, TTL);
    CHECK(v == FOLLOW_GONE_FAILED, "one of 3 exited non-zero: %d", v);
    CHECK(!roles_follow_done(v) && roles_follow_failed(v) && !roles_follow_stopped_elsewhere(v), "gone-failed's effect");
    CHECK(roles_follow_state(&w, 0, JOB_STATE_DONE, 0, 0, 3, 1100, TTL) == FOLLOW_GONE_FAILED, "none exited 0");
}

static void test_follow_absent_with_no_process_failed(void) {
    /* A machine that started nothing has no exits to tell the job's end by. */
    FollowWatch w = watch_at(1000, 0);
    CHECK(roles_follow_state(&w, 0, JOB_STATE_DONE, 0, 0, 0, 1100, TTL) == FOLLOW_GONE_FAILED, "no process");
}

static void test_follow_unreachable_within_ttl_goes_on(void) {
    FollowWatch w = watch_at(1000, 0);
    CHECK(roles_follow_state(&w, -1, JOB_STATE_DONE, 2, 0, 2, 1000 + TTL, TTL) == FOLLOW_GOING, "at the TTL exactly");
    CHECK(w.reached_ms == 1000, "not reached: %.0f", w.reached_ms);
}

static void test_follow_unreachable_too_long_leaves(void) {
    FollowWatch w = watch_at(1000, 0);
    follow_verdict v = roles_follow_state(&w, -1, JOB_STATE_DONE, 2, 0, 2, 1000 + TTL + 1, TTL);
    CHECK(v == FOLLOW_UNREACHABLE, "past the TTL: %d", v);
    CHECK(!roles_follow_done(v) && roles_follow_failed(v) && !roles_follow_stopped_elsewhere(v), "leaving's effect");
    /* Unreached, whatever the buffer holds is not the job's state: nothing is read from it,
     * not even a "done" left over from elsewhere, and its processes' exits do not count. */
    w = watch_at(1000, 0);
    CHECK(roles_follow_state(&w, -1, JOB_STATE_DONE, 2, 0, 2, 1100, TTL) == FOLLOW_GOING, "stale done ignored");
    CHECK(roles_follow_state(&w, -1, JOB_STATE_DONE, 0, 2, 2, 1100, TTL) == FOLLOW_GOING, "exits not read as the end");
    CHECK(w.absent_ms == 0, "unreached is not absent");
}

static void test_follow_reaching_again_restarts_the_clock(void) {
    FollowWatch w = watch_at(1000, 0);
    CHECK(roles_follow_state(&w, -1, JOB_STATE_DONE, 2, 0, 2, 2500, TTL) == FOLLOW_GOING, "cut off 1.5 s");
    CHECK(roles_follow_state(&w, 1, JOB_STATE_RUNNING, 2, 0, 2, 2600, TTL) == FOLLOW_GOING, "reached");
    CHECK(roles_follow_state(&w, -1, JOB_STATE_DONE, 2, 0, 2, 2600 + TTL, TTL) == FOLLOW_GOING, "cut off again, within");
    CHECK(roles_follow_state(&w, -1, JOB_STATE_DONE, 2, 0, 2, 2601 + TTL, TTL) == FOLLOW_UNREACHABLE, "cut off again, past");
}

static void test_follow_going_has_no_effect(void) {
    CHECK(!roles_follow_done(FOLLOW_GOING) && !roles_follow_failed(FOLLOW_GOING) &&
              !roles_follow_stopped_elsewhere(FOLLOW_GOING), "going");
}

static void test_state_ended_during_a_stop(void) {
    CHECK(roles_state_ended(1, JOB_STATE_DONE), "done");
    CHECK(roles_state_ended(1, JOB_STATE_FAILED), "failed");
    CHECK(roles_state_ended(1, JOB_STATE_STOPPING), "stopping");
    CHECK(!roles_state_ended(1, JOB_STATE_RUNNING), "running");
    CHECK(!roles_state_ended(0, JOB_STATE_DONE), "absent: not known to have ended");
    CHECK(!roles_state_ended(-1, JOB_STATE_DONE), "unreached: the buffer is not read");
}

/* --- the end -------------------------------------------------------------------------- */

static void test_keep_on_stop(void) {
    CHECK(roles_keep_on_stop(1, 1, 0, 0, 0, FT_DEADPOOL), "stopped while running: keep the work");
    CHECK(!roles_keep_on_stop(0, 1, 0, 0, 0, FT_DEADPOOL), "no stop");
    CHECK(!roles_keep_on_stop(1, 0, 0, 0, 0, FT_DEADPOOL), "not coordinating (demoted)");
    CHECK(!roles_keep_on_stop(1, 1, 1, 0, 0, FT_DEADPOOL), "failed: nothing consistent to keep");
    CHECK(!roles_keep_on_stop(1, 1, 0, 1, 0, FT_DEADPOOL), "done: the model is written");
    CHECK(!roles_keep_on_stop(1, 1, 0, 0, 1, FT_DEADPOOL), "control plane lost: the workers keep it themselves");
    CHECK(!roles_keep_on_stop(1, 1, 0, 0, 0, FT_DISK), "--ft disk: no in-memory generation");
    CHECK(!roles_keep_on_stop(1, 1, 0, 0, 0, FT_NONE), "--ft none");
}

static void test_follower_waits_on_stop(void) {
    CHECK(roles_follower_waits_on_stop(1, 0, 0, FT_DEADPOOL), "stopped while running: wait for the kept work");
    CHECK(!roles_follower_waits_on_stop(0, 0, 0, FT_DEADPOOL), "no stop");
    CHECK(!roles_follower_waits_on_stop(1, 1, 0, FT_DEADPOOL), "done");
    CHECK(!roles_follower_waits_on_stop(1, 0, 1, FT_DEADPOOL), "failed");
    CHECK(!roles_follower_waits_on_stop(1, 0, 0, FT_DISK), "--ft disk");
    CHECK(!roles_follower_waits_on_stop(1, 0, 0, FT_NONE), "--ft none");
}

static void test_final_state(void) {
    CHECK(roles_final_state(0, 0, 0) == JOB_STATE_DONE, "done");
    CHECK(roles_final_state(0, 1, 0) == JOB_STATE_FAILED, "failed");
    CHECK(roles_final_state(0, 0, 1) == JOB_STATE_FAILED, "control plane lost");
    CHECK(roles_final_state(0, 1, 1) == JOB_STATE_FAILED, "both");
    CHECK(roles_final_state(1, 0, 0) == JOB_STATE_STOPPING, "stopped");
    CHECK(roles_final_state(1, 1, 1) == JOB_STATE_STOPPING, "a stop wins");
}

static void test_lost_after_done(void) {
    CHECK(roles_lost_after_done(4, 4), "every worker exited 0");
    CHECK(roles_lost_after_done(6, 4), "spares that finished too");
    CHECK(!roles_lost_after_done(3, 4), "one worker short");
    CHECK(!roles_lost_after_done(0, 4), "none");
}

static void test_coordinator_end(void) {
    CHECK(roles_coordinator_end(0, 0, 100, 100) == ROLES_END_DONE, "every step, not failed");
    CHECK(roles_coordinator_end(0, 1, 100, 100) == ROLES_END_FAILED, "failed after the last step");
    CHECK(roles_coordinator_end(0, 0, 99, 100) == ROLES_END_FAILED, "a step short");
    CHECK(roles_coordinator_end(0, 1, 50, 100) == ROLES_END_FAILED, "failed midway");
    CHECK(roles_coordinator_end(1, 0, 100, 100) == ROLES_END_STOPPED, "a stop after the last step");
    CHECK(roles_coordinator_end(1, 1, 50, 100) == ROLES_END_STOPPED, "a stop wins over a failure");
}

static void test_follower_end(void) {
    CHECK(roles_follower_end(0, 1) == ROLES_END_DONE, "the job said done");
    CHECK(roles_follower_end(0, 0) == ROLES_END_FAILED, "failed, stopped elsewhere, or coordinator gone");
    CHECK(roles_follower_end(1, 0) == ROLES_END_STOPPED, "stopped");
    CHECK(roles_follower_end(1, 1) == ROLES_END_STOPPED, "stopped after done");
}

static void test_exit_code(void) {
    CHECK(roles_exit_code(ROLES_END_DONE) == 0, "done");
    CHECK(roles_exit_code(ROLES_END_FAILED) == 1, "failed");
    CHECK(roles_exit_code(ROLES_END_STOPPED) == 130, "stopped");
}

static void test_leave_reason(void) {
    CHECK(!strcmp(roles_leave_reason(1, 0), "stopped by a signal"), "signal");
    CHECK(!strcmp(roles_leave_reason(1, 1), "stopped by a signal"), "own signal first");
    CHECK(!strcmp(roles_leave_reason(0, 1), "the job was stopped"), "elsewhere");
    CHECK(!strcmp(roles_leave_reason(0, 0), "the job failed or its coordinator is gone"), "failed");
}

int main(void) {
    RUN_TEST(test_coordinator_keeps_its_role_while_renewed);
    RUN_TEST(test_coordinator_keeps_its_role_on_redis_trouble);
    RUN_TEST(test_coordinator_follows_once_its_lease_is_lost);
    RUN_TEST(test_follower_coordinates_once_it_takes_the_lease);
    RUN_TEST(test_follower_follows_while_the_lease_is_held_or_unreadable);
    RUN_TEST(test_a_role_loop_ends_with_the_job);
    RUN_TEST(test_follow_running_goes_on);
    RUN_TEST(test_follow_done);
    RUN_TEST(test_follow_failed);
    RUN_TEST(test_follow_unknown_state_is_a_failure);
    RUN_TEST(test_follow_stopping);
    RUN_TEST(test_follow_state_present_again_clears_the_absence);
    RUN_TEST(test_follow_absent_with_processes_running_waits);
    RUN_TEST(test_follow_absent_too_long_leaves);
    RUN_TEST(test_follow_absent_all_exited_ok_is_done);
    RUN_TEST(test_follow_absent_some_exited_badly_failed);
    RUN_TEST(test_follow_absent_with_no_process_failed);
    RUN_TEST(test_follow_unreachable_within_ttl_goes_on);
    RUN_TEST(test_follow_unreachable_too_long_leaves);
    RUN_TEST(test_follow_reaching_again_restarts_the_clock);
    RUN_TEST(test_follow_going_has_no_effect);
    RUN_TEST(test_state_ended_during_a_stop);
    RUN_TEST(test_keep_on_stop);
    RUN_TEST(test_follower_waits_on_stop);
    RUN_TEST(test_final_state);
    RUN_TEST(test_lost_after_done);
    RUN_TEST(test_coordinator_end);
    RUN_TEST(test_follower_end);
    RUN_TEST(test_exit_code);
    RUN_TEST(test_leave_reason);
    TEST_MAIN_END();
}
