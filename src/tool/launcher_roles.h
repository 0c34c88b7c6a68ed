/* launcher_roles.h — the decisions the launcher's roles make, as pure functions.
 *
 * A launcher (launcher.c) is one machine of a job, in one of two roles: it coordinates the job
 * (it holds the coordinator's lease: it runs the coordinator and decides failures) or it
 * follows (it supervises its own processes and reads the job's state). The lease moves it
 * between them (docs/DESIGN.md, "The launcher's roles"):
 *
 *   following ──(takes the lease: the coordinating machine is gone)──▶ coordinating
 *   coordinating ──(finds its lease held by another: it was held up)──▶ following
 *
 * and the role it is in when the job ends says how it finishes. What each role decides from
 * what it has read (the lease's answer, the job's state, its processes' exits, a stop
 * signal) is here: no I/O, no clock, no globals, so every case is unit-tested
 * (tests/test_launcher_roles.c). launcher.c reads the inputs and carries out the outcome. */
#ifndef DEADPOOL_LAUNCHER_ROLES_H
#define DEADPOOL_LAUNCHER_ROLES_H

#include "protocol.h" /* job_state */

typedef enum {
    ROLE_FOLLOWING = 0,    /* another machine coordinates; this one supervises its processes */
    ROLE_COORDINATING = 1, /* this machine holds the lease and runs the coordinator */
} launcher_role;

/* The role after a look at the lease. lease_rc is what the look returned: coordinating, the
 * renewal's (1 renewed, 0 lost: expired or another launcher holds it, -1 Redis trouble);
 * following, the attempt to take it (> 0 the new fencing token, 0 held by another, -1 Redis
 * trouble). Trouble changes nothing: a coordinator that cannot reach Redis keeps its role
 * (its lease may still hold), a follower cannot take a lease it cannot read. Taking the
 * lease makes a follower the coordinator only once it has taken over (launcher.c); it
 * follows on if that fails. */
launcher_role roles_after_lease(launcher_role role, long long lease_rc);

/* A role's loop ends when the job does for this launcher: a stop signal, the job failed or
 * is done, or the control plane is lost. 1 = over. */
int roles_job_over(int stopped, int failed, int job_done, int redis_lost);

/* --- following: the job's state as this machine reads it ------------------------------- */

typedef enum {
    FOLLOW_GOING = 0,     /* running, or not known yet: follow on */
    FOLLOW_DONE,          /* done: the job finished */
    FOLLOW_FAILED,        /* failed */
    FOLLOW_STOPPED,       /* stopping: another machine's launcher was stopped */
    FOLLOW_GONE_DONE,     /* no state (the job's keys are gone), and every process here exited 0 */
    FOLLOW_GONE_FAILED,   /* no state, and this machine's processes have exited, not all with 0 */
    FOLLOW_GONE_TOO_LONG, /* no state for longer than the launcher TTL, with processes running */
    FOLLOW_UNREACHABLE,   /* the control plane not reached for longer than the launcher TTL */
} follow_verdict;

/* What a follower remembers between two looks at the job's state (times in ms, one clock). */
typedef struct {
    double reached_ms; /* the control plane was last reached (the follower's start before that) */
    double absent_ms;  /* the state was first seen absent in this run of absences; 0 = present */
} FollowWatch;

/* One look at the job's state. got: ctl_state_get's result (1: state was read; 0: absent, the
 * job's keys are gone, its coordinator ended it while this launcher was held up, or they are
 * being republished after an outage; -1: the control plane not reached, state not read);
 * running: this machine's processes not yet exited; exited_ok / nchildren: those that exited
 * with status 0, out of all it started; ttl_ms: how long the job takes to forget a launcher.
 * Updates *w. With no state, this machine's own processes see the same and leave: their
 * exits tell how the job ended. */
follow_verdict roles_follow_state(FollowWatch *w, int got, job_state state, int running, int exited_ok, int nchildren,
                                  double now_ms, int ttl_ms);
/* The verdict's effect on the launcher: the job is done / cannot continue here / was
 * stopped by another machine's launcher. */
int roles_follow_done(follow_verdict v);
int roles_follow_failed(follow_verdict v);
int roles_follow_stopped_elsewhere(follow_verdict v);

/* A state read during a stop (got: ctl_state_get's result) that says the job has ended
 * (read, and not running). */
int roles_state_ended(int got, job_state state);

/* --- the end --------------------------------------------------------------------------- */

/* The coordinator, stopped by a signal while the job runs under --ft deadpool, has the ranks
 * write the newest generation every rank committed before it stops (keep_on_stop). */
int roles_keep_on_stop(int stopped, int coordinating, int failed, int job_done, int redis_lost, int ft);
/* A follower stopped by the same signal waits for its ranks to write it (bounded). */
int roles_follower_waits_on_stop(int stopped, int job_done, int failed, int ft);

/* The job's state the coordinator writes at the end: stopping, failed or done. */
job_state roles_final_state(int stopped, int failed, int redis_lost);
/* The control plane was lost, yet every rank had finished: at least `workers` processes
 * exited with status 0 (they finished without the means to say so). */
int roles_lost_after_done(int exited_ok, int workers);

typedef enum {
    ROLES_END_DONE = 0,    /* exit 0 */
    ROLES_END_FAILED = 1,  /* exit 1 */
    ROLES_END_STOPPED = 2, /* exit 130: a stop signal */
} roles_end;

/* How a coordinating launcher's job ended: stopped, done (not failed, every step run), or
 * failed. */
roles_end roles_coordinator_end(int stopped, int failed, int last_step, int steps);
/* How a following launcher's part ended: stopped, done (the job said so) or failed. */
roles_end roles_follower_end(int stopped, int job_done);
/* The launcher's exit status: 0 done, 1 failed, 130 stopped. */
int roles_exit_code(roles_end e);
/* Why a follower leaves a job it did not see finish (for its last line). */
const char *roles_leave_reason(int stopped, int stopped_elsewhere);

#endif
