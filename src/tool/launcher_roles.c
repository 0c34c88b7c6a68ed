/* launcher_roles.c — the decisions the launcher's roles make (launcher_roles.h). */
#include "launcher_roles.h"

#include "config.h"

launcher_role roles_after_lease(launcher_role role, long long lease_rc) {
    if (role == ROLE_COORDINATING) return lease_rc == 0 ? ROLE_FOLLOWING : ROLE_COORDINATING;
    return lease_rc > 0 ? ROLE_COORDINATING : ROLE_FOLLOWING;
}

int roles_job_over(int stopped, int failed, int job_done, int redis_lost) {
    return stopped || failed || job_done || redis_lost;
}

follow_verdict roles_follow_state(FollowWatch *w, int got, job_state state, int running, int exited_ok, int nchildren,
                                  double now_ms, int ttl_ms) {
    if (got < 0) /* cut off for as long as the job takes to forget a launcher: replaced, as are its ranks */
        return now_ms - w->reached_ms > ttl_ms ? FOLLOW_UNREACHABLE : FOLLOW_GOING;
    w->reached_ms = now_ms;
    if (got == 0) {
        if (!w->absent_ms) w->absent_ms = now_ms;
        if (running == 0) return nchildren > 0 && exited_ok == nchildren ? FOLLOW_GONE_DONE : FOLLOW_GONE_FAILED;
        return now_ms - w->absent_ms > ttl_ms ? FOLLOW_GONE_TOO_LONG : FOLLOW_GOING;
    }
    w->absent_ms = 0;
    switch (state) {
    case JOB_STATE_RUNNING: return FOLLOW_GOING;
    case JOB_STATE_DONE: return FOLLOW_DONE;
    case JOB_STATE_STOPPING: return FOLLOW_STOPPED;
    default: return FOLLOW_FAILED;
    }
}

int roles_follow_done(follow_verdict v) { return v == FOLLOW_DONE || v == FOLLOW_GONE_DONE; }

int roles_follow_failed(follow_verdict v) { return v != FOLLOW_GOING && !roles_follow_done(v); }

int roles_follow_stopped_elsewhere(follow_verdict v) { return v == FOLLOW_STOPPED; }

int roles_state_ended(int got, job_state state) { return got == 1 && state != JOB_STATE_RUNNING; }

int roles_keep_on_stop(int stopped, int coordinating, int failed, int job_done, int redis_lost, int ft) {
    return stopped && coordinating && !failed && !job_done && !redis_lost && ft == FT_DEADPOOL;
}

int roles_follower_waits_on_stop(int stopped, int job_done, int failed, int ft) {
    return stopped && !job_done && !failed && ft == FT_DEADPOOL;
}

job_state roles_final_state(int stopped, int failed, int redis_lost) {
    return stopped ? JOB_STATE_STOPPING : failed || redis_lost ? JOB_STATE_FAILED : JOB_STATE_DONE;
}

int roles_lost_after_done(int exited_ok, int workers) { return exited_ok >= workers; }

roles_end roles_coordinator_end(int stopped, int failed, int last_step, int steps) {
    if (stopped) return ROLES_END_STOPPED;
    return !failed && last_step == steps ? ROLES_END_DONE : ROLES_END_FAILED;
}

roles_end roles_follower_end(int stopped, int job_done) {
    if (stopped) return ROLES_END_STOPPED;
    return job_done ? ROLES_END_DONE : ROLES_END_FAILED;
}

int roles_exit_code(roles_end e) { return e == ROLES_END_STOPPED ? 130 : e == ROLES_END_DONE ? 0 : 1; }

const char *roles_leave_reason(int stopped, int stopped_elsewhere) {
    return stopped ? "stopped by a signal" : stopped_elsewhere ? "the job was stopped"
                                                               : "the job failed or its coordinator is gone";
}
