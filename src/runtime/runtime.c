/* runtime.c — deadpool.h's flow: one process's life in a job. dp_init (registration, rank,
 * the heartbeat and abort-watch threads), dp_join (membership of an epoch, or a spare waiting
 * warm until a decision hands it a failed rank), the step hooks, dp_recover (wait for the
 * coordinator's decision, restore the rollback generation, rebuild, go on) and dp_finish, each
 * driving the lifecycle (lifecycle.h) through lc_feed. What they carry out is in the pieces
 * that share runtime_internal.h: capture (rt_capture.c), restore (rt_restore.c), replica placement
 * (rt_placement.c), persistence (rt_persist.c), telemetry (rt_telemetry.c), fault injection
 * (rt_inject.c), collectives and groups (rt_comm.c), launching (rt_exec.c). It knows nothing of
 * the application: state is regions and callbacks. */
#include "deadpool.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "checkpoint.h"
#include "comm.h"
#include "comm_auth.h"
#include "config.h"
#include "control.h"
#include "events.h"
#include "generation.h"
#include "inject.h"
#include "lifecycle.h"
#include "protocol.h"
#include "recovery.h"
#include "replica.h"
#include "runtime.h"
#include "runtime_internal.h"
#include "secret.h"
#include "snapshot.h"
#include "util.h"
/* --- small helpers ------------------------------------------------------------------- */

/* dp_init's last failure was the control plane's absence, not a bad job (item 12): the
 * process exits as failed (DP_EXIT_FAILED), and the job replaces it, instead of tearing down. */
atomic_int rt_init_transient;

/* While starting: a Redis call on c failed; 1 when it was the server's absence and the bound
 * (deadline, now_ms) is not reached, after a pause: try again. */
int rt_retry_transient(const ctl_t *c, double deadline) {
    if (!ctl_error_transient(c) || now_ms() > deadline) {
        if (ctl_error_transient(c)) atomic_store(&rt_init_transient, 1);
        return 0;
    }
    sleep_ms(200);
    return 1;
}

void rt_emit_error(dp_t *dp, const char *what, const char *err) {
    char esc[2048];
    log_msg("%s%s", what, err);
    json_escape(err, esc, sizeof esc);
    event_emit(dp->ctl, dp->t0_wall_ms, "error", "\"rank\":%d,\"message\":\"%s\"", dp->rank, esc);
}

const char *dp_last_error(const dp_t *dp) { return dp->err; }

const char *dp_version(void) { return DEADPOOL_VERSION; }

const char *dp_status_str(dp_status st) {
    switch (st) {
    case DP_OK: return "ok";
    case DP_ERR: return "error";
    case DP_FAILED: return "failed";
    case DP_STOPPED: return "stopped";
    case DP_FENCED: return "fenced";
    }
    return "unknown";
}

dp_role dp_get_role(const dp_t *dp) { return dp->role; }

int dp_rank(const dp_t *dp) { return dp->rank; }

int dp_world(const dp_t *dp) { return dp->cfg.workers; }

int64_t dp_next_step(const dp_t *dp) { return dp->next_step; }

int64_t dp_steps(const dp_t *dp) { return dp->cfg.steps; }

uint64_t dp_seed(const dp_t *dp) { return dp->cfg.seed; }

const char *dp_out_dir(const dp_t *dp) { return dp->cfg.out; }

const char *dp_resume_dir(const dp_t *dp) { return dp->resume_dir[0] ? dp->resume_dir : NULL; }

long dp_epoch(const dp_t *dp) { return dp->epoch; }

int dp_aborted(const dp_t *dp) { return atomic_load(&((dp_t *)dp)->abort_step) != 0; }

int dp_store_prefix(const dp_t *dp, char *out, size_t len) {
    if (!dp->ctl) return -1;
    ctl_key_full(dp->ctl, out, len, KEY_APP, dp->epoch, 0);
    return 0;
}

void dp_log(const dp_t *dp, const char *fmt, ...) {
    (void)dp;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_msg("%s", msg);
}

void rt_set_role_log(dp_t *dp) {
    char role[32];
    if (dp->rank >= 0) snprintf(role, sizeof role, "rank %d", dp->rank);
    else snprintf(role, sizeof role, "spare");
    log_set_role(role);
}

/* Every change of the process's lifecycle state goes through here (lifecycle.h): the new
 * state, and the actions the caller carries out. An input the state does not accept is a bug:
 * it is logged, the state is kept and nothing is to be done. */
lc_actions rt_lc_feed(dp_t *dp, lc_input in) {
    lc_actions a;
    lc_state next = lc_step(dp->lc, in, &a);
    if (next == LC_INVALID) {
        log_msg("lifecycle: state %s does not accept %s (state kept)", lc_state_name(dp->lc), lc_input_name(in));
        return a;
    }
    dp->lc = next;
    if (a.role >= 0) dp->role = (dp_role)a.role;
    return a;
}

/* --- the abort watch (the heartbeat thread: rt_telemetry.c) --------------------------- */

/* Waits on the process's "abort" list; a value e+1 with e >= our epoch raises abort_step. */
static void *abort_watch_loop(void *arg) {
    dp_t *dp = arg;
    pthread_setname_np(pthread_self(), "dp-abort");
    ctl_t *c = rt_thread_connect(dp, "abort watcher");
    if (!c) return NULL;
    while (!atomic_load(&dp->hb_stop)) {
        long v = ctl_wait_notice(c, dp->proc_id, KEY_ABORT, 200);
        if (v < 0) sleep_ms(100);
        else if (v > 0 && v - 1 >= atomic_load(&dp->cur_epoch)) atomic_store(&dp->abort_step, 1);
    }
    ctl_close(c);
    return NULL;
}

/* --- joining the job ----------------------------------------------------------------- */

static int read_job(dp_t *dp, char *err, size_t errlen) {
    if (ctl_config_get(dp->ctl, CFG_CONFIG, dp->cfg_text, sizeof dp->cfg_text) != 0) {
        snprintf(err, errlen, "job '%s' not found in redis (no config): %s", dp->job, ctl_last_error(dp->ctl));
        return -1;
    }
    if (ctl_launcher_alive(dp->ctl) == 0) { /* its keys outlived a launcher killed with -9 */
        snprintf(err, errlen, "job '%s' has no launcher running (its launcher key expired): it ended or its launcher "
                 "died; start it again (deadpool run ... --resume OUT)", dp->job);
        return -1;
    }
    if (job_config_parse_lines(&dp->cfg, dp->cfg_text, err, errlen) != 0) return -1;
    /* Each machine of a multi-node job writes into its own --out. */
    const char *out = getenv(DP_ENV_OUT), *resume = getenv(DP_ENV_RESUME);
    if (out && *out) snprintf(dp->cfg.out, sizeof dp->cfg.out, "%s", out);
    if (resume && *resume) snprintf(dp->cfg.resume, sizeof dp->cfg.resume, "%s", resume);
    char t0[32];
    if (ctl_config_get(dp->ctl, CFG_T0_MS, t0, sizeof t0) != 0) { snprintf(err, errlen, "job has no start time"); return -1; }
    long long t0v;
    if (proto_int_parse(t0, "config t0_ms", 0, LLONG_MAX, &t0v, err, errlen) != 0) return -1;
    dp->t0_wall_ms = t0v;
    dp->nfaults = inject_parse(dp->cfg.inject, dp->cfg.workers, dp->faults, INJECT_MAX, err, errlen);
    if (dp->nfaults < 0) return -1;
    if (dp->cfg.resume_step >= 0) {
        char d[4200];
        checkpoint_path(d, sizeof d, dp->cfg.resume, dp->cfg.resume_step, "");
        d[strlen(d) - 1] = 0; /* the directory, without the trailing '/' */
        snprintf(dp->resume_dir, sizeof dp->resume_dir, "%s", d);
    }
    return 0;
}

/* Claims rank r for us: 1 claimed, 0 taken, -1 Redis failed (a transient error is retried
 * within --control-wait; a claim whose answer was lost finds its own proc id there). */
static int claim_one(dp_t *dp, int r) {
    for (double deadline = now_ms() + job_control_outage_ms(&dp->cfg);;) {
        int got = ctl_claim_rank(dp->ctl, r, dp->proc_id);
        if (got == 1) return 1;
        if (got == 0) { /* taken: by us, when Redis ran an earlier try whose reply timed out */
            long owner = ctl_rank_owner(dp->ctl, r); /* a failed read is no "taken by another" */
            if (owner == dp->proc_id) return 1;
            if (owner > 0) return 0;
            if (owner == 0 && now_ms() < deadline) continue; /* gone meanwhile (a Redis restarted empty) */
        }
        if (!rt_retry_transient(dp->ctl, deadline)) return -1;
    }
}

/* Claims the requested rank, or the first free one. Returns the rank, -1 if none is free,
 * -2 when Redis failed. */
static int claim_rank(dp_t *dp, int wanted) {
    if (wanted >= 0) {
        int got = claim_one(dp, wanted);
        return got == 1 ? wanted : got < 0 ? -2 : -1;
    }
    for (int r = 0; r < dp->cfg.workers; r++) {
        int got = claim_one(dp, r);
        if (got == 1) return r;
        if (got < 0) return -2;
    }
    return -1;
}

/* Every process holds replicas: start the server and tell the job where it is. The replica
 * channel's key and the data plane's (comm_key_derive, kept for comm_create) are derived from
 * the job key its launcher handed over (secret.h), never read from Redis; they are never
 * logged, and the server keeps the only copy of the replica key. */
static int start_replica_server(dp_t *dp, char *err, size_t errlen) {
    unsigned char key[REPLICA_KEY_BYTES];
    if (replica_key_derive(dp->job_key, key) != 0 || comm_key_derive(dp->job_key, dp->comm_key) != 0) {
        snprintf(err, errlen, "the job key does not derive the channels' keys");
        return -1;
    }
    dp->replicas = replica_server_start(dp->bind_host, 0, dp->job, dp->cfg.workers, dp->proc_id, key, err, errlen);
    explicit_bzero(key, sizeof key);
    if (!dp->replicas) return -1;
    char *addr = dp->reg_replica, *host = dp->reg_host, *pid = dp->reg_pid;
    Endpoint me = {.port = replica_server_port(dp->replicas)};
    snprintf(me.host, sizeof me.host, "%s", dp->bind_host);
    if (endpoint_format(&me, addr, sizeof dp->reg_replica) != 0 || proto_int_format(getpid(), pid, sizeof dp->reg_pid) != 0) {
        snprintf(err, errlen, "the replica server's address '%s' port %d is not a valid endpoint", me.host, me.port);
        return -1;
    }
    gethostname(host, sizeof dp->reg_host - 1);
    for (double deadline = now_ms() + job_control_outage_ms(&dp->cfg);;) { /* a transient error is retried */
        if (ctl_proc_set(dp->ctl, dp->proc_id, PROC_REPLICA, addr) == 0 && ctl_proc_set(dp->ctl, dp->proc_id, PROC_HOST, host) == 0 &&
            ctl_proc_set(dp->ctl, dp->proc_id, PROC_NODE, dp->node) == 0 && ctl_proc_set(dp->ctl, dp->proc_id, PROC_PID, pid) == 0)
            return 0;
        if (!ctl_error_transient(dp->ctl) || now_ms() > deadline) break;
        sleep_ms(200);
    }
    snprintf(err, errlen, "registering the replica server failed: %s", ctl_last_error(dp->ctl));
    rt_init_transient = ctl_error_transient(dp->ctl);
    return -1;
}

/* A spare started at a low priority (the launcher's) takes a rank at the default one: every
 * thread of the process (on Linux the priority is a thread's; those started since inherited it). */
void rt_priority_default(void) {
    errno = 0;
    if (getpriority(PRIO_PROCESS, 0) <= 0 || errno) return;
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int failed = 0;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.' && setpriority(PRIO_PROCESS, (id_t)atoi(e->d_name), 0) != 0) failed = 1;
    if (d) closedir(d);
    if (!d || failed) log_msg("this spare keeps its low priority (%s)", strerror(errno ? errno : ENOENT));
}

static void free_process(dp_t *dp) {
    rt_async_stop(dp);
    if (dp->hb_thread) {
        atomic_store(&dp->hb_stop, 1);
        pthread_mutex_lock(&dp->pub_mu);
        pthread_cond_broadcast(&dp->pub_cv);
        pthread_mutex_unlock(&dp->pub_mu);
        pthread_join(dp->hb_thread, NULL);
        if (dp->abort_thread) pthread_join(dp->abort_thread, NULL);
    }
    replica_server_stop(dp->replicas);
    /* A spare gone on purpose says so now rather than let its heartbeat expire (a janitor need
     * not wait for it). Not a member: its silence before the launcher has seen its exit could
     * read as a failure. Skipped when the control plane is lost. */
    if (dp->ctl && dp->proc_id > 0 && dp->rank < 0 && !atomic_load(&dp->control_lost))
        ctl_heartbeat_clear(dp->ctl, dp->proc_id);
    if (dp->ctl) ctl_close(dp->ctl);
    for (int i = 0; i < dp->mq_n; i++) free(dp->mq[i]);
    free(dp->head);
    free(dp->local_head);
    free(dp->warm_buf);
    free(dp->block[0]);
    free(dp->block[1]);
    free(dp->restored_extra);
    free(dp->facts);
    explicit_bzero(dp->comm_key, sizeof dp->comm_key);
    explicit_bzero(dp->job_key, sizeof dp->job_key);
    free(dp);
}

/* A dp_t for options o: its locks, its job's name, its address and its machine's id. */
static dp_t *dp_alloc(const dp_options *o) {
    dp_t *dp = calloc(1, sizeof *dp);
    if (!dp) return NULL;
    dp->rank = -1;
    dp->pub_rank = -1;
    dp->pub_epoch = dp->pub_step = -1;
    pthread_mutex_init(&dp->snap_ctl_mu, NULL);
    pthread_mutex_init(&dp->pub_mu, NULL);
    pthread_mutex_init(&dp->facts_mu, NULL);
    pthread_mutex_init(&dp->aq_mu, NULL);
    pthread_cond_init(&dp->aq_cv, NULL);
    pthread_cond_init(&dp->aq_done, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&dp->pub_cv, &ca);
    pthread_condattr_destroy(&ca);
    snprintf(dp->job, sizeof dp->job, "%s", o->job);
    snprintf(dp->bind_host, sizeof dp->bind_host, "%s", o->bind_host && *o->bind_host ? o->bind_host : "127.0.0.1");
    const char *node = getenv(DP_ENV_NODE);
    if (node && *node) {
        snprintf(dp->node, sizeof dp->node, "%s", node);
        node_id_clean(dp->node);
    } else {
        node_id_default(dp->node, sizeof dp->node);
    }
    return dp;
}

/* Connects to the job's Redis and reads the job. Every Redis call of the start is retried
 * while it fails for the server's absence (a restart, a stall, a failover), within
 * --control-wait (60 s until the job's own is read): such an error says nothing about the
 * job, and a bad job stops it (item 12). spawned: a launcher started this process. 0 / -1. */
static int connect_and_read_job(dp_t *dp, int spawned, char *err, size_t errlen) {
    double deadline = now_ms() + job_control_outage_ms(&dp->cfg);
    while (!(dp->ctl = ctl_connect(&dp->addr, dp->job, 5000, err, errlen))) {
        if (!ctl_connect_error_transient() || now_ms() > deadline) {
            if (ctl_connect_error_transient()) atomic_store(&rt_init_transient, 1);
            return -1;
        }
        sleep_ms(200);
    }
    ctl_set_job_key(dp->ctl, dp->job_key); /* checked by job_key_from_env */
    int64_t offset;
    if (ctl_clock_offset(dp->ctl, &offset) == 0) wall_clock_offset_set(offset); /* the job's one clock */
    /* A process the launcher started belongs to a live job: a config or launcher key missing
     * for a moment is a Redis that came back empty, and the launcher is writing them again. */
    double republished_by = now_ms() + 5000;
    while (read_job(dp, err, errlen) != 0) {
        if (spawned && !ctl_error_transient(dp->ctl) && now_ms() < republished_by) {
            sleep_ms(100);
            continue;
        }
        if (!rt_retry_transient(dp->ctl, deadline)) return -1;
    }
    return 0;
}

/* This process's id in the job. A launcher draws its processes' ids (DEADPOOL_PROC, `drawn`),
 * so that it can report their exits by id. The variable stays as it is (a library does not
 * change its host's environment): a process this one starts, or one beside it, inherits it,
 * and the claim gives the id to the first of them only; the others draw ids of their own.
 * The id, -1 when Redis stayed away past deadline. */
static long register_process(dp_t *dp, long drawn, double deadline) {
    long id = -1;
    while (drawn > 0) {
        int claimed = ctl_proc_claim(dp->ctl, drawn, (long)getpid());
        if (claimed >= 0) {
            id = claimed ? drawn : 0;
            break;
        }
        if (!rt_retry_transient(dp->ctl, deadline)) break;
    }
    if (id == 0 || drawn <= 0) id = ctl_new_proc_id(dp->ctl);
    while (id < 0 && rt_retry_transient(dp->ctl, deadline)) id = ctl_new_proc_id(dp->ctl);
    return id;
}

dp_t *dp_init(const dp_options *opts, char *err, size_t errlen) {
    struct sigaction pipe_was;
    if (sigaction(SIGPIPE, NULL, &pipe_was) == 0 && pipe_was.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
    dp_options o = {.rank = -1};
    if (opts) o = *opts;
    rt_options_from_env(&o);
    if (!o.redis_url || !o.job) {
        snprintf(err, errlen, "no job to join: expected %s and %s in the environment (start the program with `deadpool "
                 "run -- PROGRAM`) or in dp_options", DP_ENV_REDIS, DP_ENV_JOB);
        return NULL;
    }
    dp_t *dp = dp_alloc(&o);
    if (!dp) { snprintf(err, errlen, "out of memory"); return NULL; }
    const char *proc = getenv(DP_ENV_PROC);
    long drawn = proc ? atol(proc) : 0;
    log_set_role(o.spare ? "spare" : "rank");
    if (redis_addr_parse(o.redis_url, &dp->addr, err, errlen) != 0) goto fail;
    if (job_key_from_env(dp->job_key, err, errlen) != 0) goto fail;
    if (connect_and_read_job(dp, drawn > 0, err, errlen) != 0) goto fail;
    double deadline = now_ms() + job_control_outage_ms(&dp->cfg);
    if (!o.spare && o.rank >= dp->cfg.workers) { /* refused now, not later by the collectives */
        snprintf(err, errlen, "--rank %d: job '%s' has %d ranks (0 to %d)", o.rank, dp->job, dp->cfg.workers,
                 dp->cfg.workers - 1);
        goto fail;
    }
    dp->proc_id = register_process(dp, drawn, deadline);
    if (dp->proc_id < 0) { snprintf(err, errlen, "registration failed: %s", ctl_last_error(dp->ctl)); goto fail; }
    if (start_replica_server(dp, err, errlen) != 0) goto fail;
    ctl_heartbeat(dp->ctl, dp->proc_id, dp->cfg.detect_timeout_ms);
    pthread_create(&dp->hb_thread, NULL, rt_heartbeat_loop, dp);
    pthread_create(&dp->abort_thread, NULL, abort_watch_loop, dp);
    dp->rank = o.spare ? -1 : claim_rank(dp, o.rank);
    if (dp->rank == -2) {
        snprintf(err, errlen, "claiming a rank failed: %s", ctl_last_error(dp->ctl));
        goto fail;
    }
    if (!o.spare && o.rank >= 0 && dp->rank < 0) log_msg("rank %d is taken; joining as a spare", o.rank);
    dp->pub_rank = dp->rank;
    rt_lc_feed(dp, dp->rank >= 0 ? LC_IN_RANK_CLAIMED : LC_IN_NO_RANK); /* NEW or SPARE, and the role */
    ctl_wait_replica(dp->ctl, 1000); /* the registration (replica address, machine, rank) on a replica */
    dp->next_step = dp->cfg.resume_step + 1;
    rt_set_role_log(dp);
    return dp;
fail:
    free_process(dp);
    return NULL;
}

/* --- the step ------------------------------------------------------------------------ */

dp_status rt_comm_failed(dp_t *dp, const char *what) {
    log_msg("step %lld: %s", (long long)dp->cur_step + 1, what);
    /* With the control plane away the report could not arrive: the coordinator finds the
     * failure through the exit or the silence, once Redis is back. */
    if (!atomic_load(&dp->ctl_down)) {
        Report r = {.kind = REPORT_COMM_FAILURE, .epoch = dp->epoch, .rank = dp->rank,
                    .step = (long long)dp->cur_step + 1, .t_wall_ms = wall_ms()};
        snprintf(r.text, sizeof r.text, "%s", what);
        report_send(dp->ctl, dp->t0_wall_ms, &r);
    }
    snprintf(dp->err, sizeof dp->err, "%s", what);
    return DP_FAILED;
}

dp_status rt_epoch_closed(dp_t *dp) {
    log_msg("step %lld abandoned: epoch %ld was closed after a failure", (long long)dp->cur_step + 1, dp->epoch);
    snprintf(dp->err, sizeof dp->err, "epoch %ld was closed after a failure", dp->epoch);
    return DP_FAILED;
}

dp_status dp_step_before_reduce(dp_t *dp, int64_t step) {
    dp->cur_step = step;
    if (atomic_load(&dp->job_over)) {
        rt_lc_feed(dp, LC_IN_JOB_OVER); /* STOPPED */
        return DP_STOPPED;
    }
    rt_maybe_inject(dp, step);
    if (atomic_load(&dp->abort_step)) return rt_epoch_closed(dp);
    /* No rank reduces step k+1 before its generation k is committed (see snapshot.h). */
    dp->snapshot_wait_ms = 0;
    if (dp->snap && snapshot_wait_previous(dp->snap, &dp->snapshot_wait_ms) != 0)
        return atomic_load(&dp->abort_step) ? rt_epoch_closed(dp) /* the wait ended with the epoch */
                                            : rt_comm_failed(dp, "replication of the previous snapshot failed");
    return DP_OK;
}

/* The fence check, bounded by about a step. While the control plane is away it is skipped:
 * nobody can close the epoch then (the coordinator closes it through the same Redis, and
 * decides nothing until the processes have republished after its return), and the abort
 * watcher still ends the step when a close reaches it. */
dp_status dp_step_before_update(dp_t *dp) {
    if (atomic_load(&dp->abort_step)) return rt_epoch_closed(dp);
    if (atomic_load(&dp->ctl_down)) return DP_OK;
    int saved = ctl_timeout(dp->ctl);
    ctl_set_timeout(dp->ctl, rt_path_timeout_ms(dp));
    int fenced = epoch_fenced(dp->ctl, dp->epoch);
    if (!fenced) rt_note_failure(dp, dp->ctl);
    ctl_set_timeout(dp->ctl, saved);
    if (fenced) return rt_epoch_closed(dp);
    return DP_OK;
}

/* The step's loss or gradient norm is not finite: its state is never committed. Every rank
 * sees the same (reduced) values, so every rank comes here: each persists its newest
 * committed generation, and once all have (a barrier), rank 0 tells the job why it stops and
 * where the last good state is. No restart: a NaN that would recur cannot loop. */
static dp_status diverged(dp_t *dp, int64_t step, const dp_metrics *m) {
    long long good = -1;
    if (dp->snap) {
        snapshot_drain(dp->snap, rt_collective_bound_ms(dp, dp->block_bytes));
        good = snapshot_committed(dp->snap);
        SnapHeader h;
        void *payload = NULL;
        if (good >= 0 && snapshot_local_copy(dp->snap, good, &h, &payload) == 0) {
            rt_persist_generation(dp, dp->ctl, &h, payload);
            free(payload);
        }
    } else if (dp->cfg.ft == FT_DISK) {
        good = dp->last_disk_step - 1;
    }
    comm_barrier(dp->comm, rt_collective_bound_ms(dp, dp->block_bytes)); /* every rank's state is on disk */
    if (dp->rank == 0) {
        char cmd[1024];
        Report r = {.kind = REPORT_DIVERGED, .epoch = dp->epoch, .rank = dp->rank, .step = (long long)step + 1,
                    .t_wall_ms = wall_ms()};
        if (good >= 0)
            snprintf(r.text, sizeof r.text, "step %lld: loss %g, gradient norm %g: training diverged and nothing after step %lld "
                     "was committed. The state of step %lld is in %.700s/ckpt; continue with `%s` and, say, a smaller "
                     "learning rate", (long long)step + 1, m->loss, m->grad_norm, good + 1, good + 1, dp->cfg.out,
                     job_config_resume_command(&dp->cfg, cmd, sizeof cmd));
        else
            snprintf(r.text, sizeof r.text, "step %lld: loss %g, gradient norm %g: training diverged before any state was "
                     "committed", (long long)step + 1, m->loss, m->grad_norm);
        report_send(dp->ctl, dp->t0_wall_ms, &r);
    }
    snprintf(dp->err, sizeof dp->err, "training diverged at step %lld", (long long)step + 1);
    return DP_STOPPED;
}

dp_status dp_step_commit(dp_t *dp, int64_t step, const void *extra, size_t extra_len, const dp_metrics *m) {
    dp_status st = DP_OK;
    if (m && (!isfinite(m->loss) || !isfinite(m->grad_norm))) {
        lc_actions a = rt_lc_feed(dp, LC_IN_DIVERGED); /* STOPPED */
        if (a.flags & LC_ACT_PERSIST_COMMITTED) return diverged(dp, step, m);
        snprintf(dp->err, sizeof dp->err, "training diverged at step %lld", (long long)step + 1);
        return DP_STOPPED;
    }
    if (dp->snap && (step + 1) % dp->cfg.snapshot_every == 0) {
        snapshot_wait_previous(dp->snap, NULL); /* the head buffer is the thread's until then */
        if (!rt_capture_zero_copy(dp, step, extra, extra_len)) {
            int n = rt_gather_regions(dp, step, extra, extra_len);
            if (n < 0 || snapshot_capture_regions(dp->snap, step, dp->snap_regions, n, dp->snap_locals, dp->nlocals) != 0)
                return DP_ERR;
        }
    } else if (dp->cfg.ft == FT_DISK && (step + 1) % dp->cfg.ckpt_every == 0) {
        /* A synchronous checkpoint is part of the step it follows. */
        st = rt_disk_checkpoint(dp, step, extra, extra_len);
        if (st == DP_FAILED) return rt_comm_failed(dp, comm_last_error(dp->comm));
        if (st != DP_OK) return st;
    }
    dp->next_step = step + 1;
    double t = now_ms();
    lc_actions a = rt_lc_feed(dp, LC_IN_COMMITTED); /* STEPPING; from RESUMING: the epoch's first commit */
    if (a.flags & LC_ACT_STEP_TIME) /* the usual step time: the bound on the training path's Redis calls */
        dp->step_ewma = dp->step_ewma > 0 ? 0.9 * dp->step_ewma + 0.1 * (t - dp->step_t0) : t - dp->step_t0;
    if (dp->rank == 0) {
        rt_push_metrics(dp, step, m, t - dp->step_t0);
        if (a.flags & LC_ACT_FIRST_COMMIT) rt_report_recovery(dp);
    }
    if ((a.flags & LC_ACT_FIRST_COMMIT) && dp->restore_src) { /* the new epoch has committed its restore point */
        snapshot_abandon(dp->restore_src);
        dp->restore_src = NULL;
    }
    dp->step_t0 = now_ms();
    return DP_OK;
}

dp_status dp_recover(dp_t *dp, char *err, size_t errlen) {
    lc_actions a = rt_lc_feed(dp, LC_IN_STEP_FAILED); /* WAITING */
    if (a.flags & LC_ACT_END_COMMS) rt_end_epoch_comms(dp);
    Decision *d = &dp->decision;
    long e = 0;
    if (atomic_load(&dp->control_lost)) a = rt_lc_feed(dp, LC_IN_CONTROL_LOST); /* lost while an earlier failure waited */
    else if (a.flags & LC_ACT_AWAIT_DECISION) a = rt_await_decision(dp, d, &e);
    else a = (lc_actions){.role = -1}; /* not reached: the lifecycle logged why */
    if (a.flags & LC_ACT_PERSIST_LOCAL) rt_control_lost_persist(dp, err, errlen);
    if (dp->lc == LC_STOPPED) return DP_STOPPED;
    if (a.flags & LC_ACT_REPORT_FENCED) rt_report_fenced(dp, e);
    if (dp->lc == LC_FENCED) return DP_FENCED;
    if (!(a.flags & LC_ACT_RESTORE)) { /* FAILED: no decision came */
        snprintf(err, errlen, "no recovery decision arrived: giving up");
        log_msg("%s", err);
        return DP_ERR;
    }
    return rt_follow_decisions(dp, d, err, errlen);
}

/* --- leaving ------------------------------------------------------------------------- */

int dp_finish(dp_t *dp, dp_status how) {
    if (!dp) return atomic_load(&rt_init_transient) ? DP_EXIT_FAILED : DP_EXIT_BAD_JOB;
    int rc = lc_exit_status(how, dp->role, dp->joined, atomic_load(&rt_init_transient), dp->next_step >= dp->cfg.steps);
    /* Every step done: DONE. Any other status leaves the state as it is (the step or the call
     * that ended the loop moved it already, or the application gave up on its own). */
    lc_actions a = how == DP_OK ? rt_lc_feed(dp, LC_IN_FINISHED) : (lc_actions){.role = -1};
    int done = (a.flags & LC_ACT_REPORT_DONE) != 0;
    if (dp->snap) {
        snapshot_drain(dp->snap, rt_collective_bound_ms(dp, dp->block_bytes));
        rt_report_snapshot_stats(dp);
        /* Every rank's last replication is done before anyone closes its replica server. */
        if (done) comm_barrier(dp->comm, rt_collective_bound_ms(dp, dp->block_bytes));
        snapshot_destroy(dp->snap);
    }
    /* Rank 0 says the job is done once every rank is: the launcher ends the job on it. That
     * and the metrics lines still queued need the control plane: with it away, rank 0 waits
     * for it (--control-wait at most: after that the launcher sees every rank exit 0). */
    if (done && dp->rank == 0) {
        double until = now_ms() + job_control_outage_ms(&dp->cfg);
        for (;;) {
            pthread_mutex_lock(&dp->pub_mu);
            int queued = dp->mq_n;
            pthread_mutex_unlock(&dp->pub_mu);
            if ((!atomic_load(&dp->ctl_down) && !queued) || now_ms() > until) break;
            sleep_ms(50);
        }
    }
    if (done && dp->rank == 0) {
        Report r = {.kind = REPORT_JOB_DONE, .epoch = dp->epoch, .rank = 0, .step = (long long)dp->next_step,
                    .t_wall_ms = wall_ms()};
        report_send(dp->ctl, dp->t0_wall_ms, &r);
    }
    snapshot_abandon(dp->restore_src);
    if (dp->snap_ctl) ctl_close(dp->snap_ctl);
    rt_end_epoch_comms(dp);
    free_process(dp);
    return rc;
}

void dp_output_saved(dp_t *dp, const char *path) {
    Report r = {.kind = REPORT_MODEL_SAVED, .epoch = dp->epoch, .rank = dp->rank, .step = -1, .t_wall_ms = wall_ms()};
    if (snprintf(r.text, sizeof r.text, "%s", path) >= (int)sizeof r.text) log_msg("output path too long to report: %s", path);
    report_send(dp->ctl, dp->t0_wall_ms, &r);
}

/* --- checkpoints --------------------------------------------------------------------- */

int dp_checkpoint_read(const char *dir, int rank, int (*fn)(void *arg, const dp_generation *g), void *arg, char *err,
                       size_t errlen) {
    SnapHeader h;
    void *payload = NULL;
    if (checkpoint_read_state(dir, rank, -1, &h, &payload, err, errlen) != 0) return -1;
    dp_region regions[GEN_MAX_REGIONS];
    dp_generation g = {.step = h.step, .rank = h.rank, .world = h.world};
    uint64_t seed;
    int64_t next;
    int rc = gen_parse(payload, h.length, &g, regions, GEN_MAX_REGIONS, &seed, &next, err, errlen);
    if (rc == 0) rc = fn(arg, &g);
    free(payload);
    return rc;
}
