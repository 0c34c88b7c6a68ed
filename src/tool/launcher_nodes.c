/* launcher_nodes.c — a launcher among machines: the coordinator's lease and the roles
 * (coordinating, following), joining a job as a machine, following one, and resuming across
 * machines without a shared filesystem (inventories, the step to resume, serving states). */
#include "launcher.h"
#include "launcher_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "checkpoint.h"
#include "control.h"
#include "redis_server.h"
#include "coordinator.h"
#include "decide.h"
#include "events.h"
#include "inject.h"
#include "launcher_roles.h"
#include "metrics_http.h"
#include "netns.h"
#include "protocol.h"
#include "recovery.h"
#include "replica.h"
#include "runtime.h"
#include "secret.h"
#include "slurm.h"
#include "util.h"
/* --- the coordinator's lease (across machines) -------------------------------------------
 * The first machine takes it when it creates the job; whoever holds it renews it every
 * sixteenth of the detect timeout for a quarter of it. Any other launcher tries to take it as often: when the
 * coordinating machine is lost (or its launcher stopped for longer), another one coordinates
 * within the detect timeout, with a new fencing token (decisions are published under it). A
 * coordinator that finds its lease gone (it was stopped, its successor decides now) follows. */
int lau_lease_ttl_ms(const JobConfig *c) { return c->detect_timeout_ms / 4 > 0 ? c->detect_timeout_ms / 4 : 1; }

/* This launcher coordinates from now on (token: the lease's; 1 = the job's first). 0 / -1. */
int lau_become_coordinator(Launcher *L, long long token) {
    L->coord = coord_create(L->ctl, &L->run_cfg, L->t0_wall_ms, L->node_id);
    if (!L->coord) return -1;
    if (L->cfg->nnodes > 0) coord_set_fence(L->coord, L->lease);
    if (token > 1 && coord_take_over(L->coord) != 0) {
        log_msg("taking over as coordinator: the job's state cannot be read: %s", ctl_last_error(L->ctl));
        coord_free(L->coord);
        L->coord = NULL;
        return -1;
    }
    L->coordinating = 1;
    L->beat_ms = 0;
    if (token > 1) {
        log_msg("this machine coordinates the job from now on (lease %s)", L->lease);
        lau_node_event(L, "coordinator", "\"lease\":\"%s\"", L->lease);
        lau_drain_outputs(L); /* what members reported meanwhile, before the first tick dates anything */
    }
    return 0;
}

static void lease_tick(Launcher *L) {
    if (L->cfg->nnodes == 0) return;
    double now = now_ms();
    int period = lau_lease_ttl_ms(L->cfg) / 4 > 0 ? lau_lease_ttl_ms(L->cfg) / 4 : 1;
    if (L->lease_ms && now - L->lease_ms < period) return;
    L->lease_ms = now;
    if (L->coordinating) {
        int renewed = ctl_lease_renew(L->ctl, L->lease, lau_lease_ttl_ms(L->cfg));
        if (roles_after_lease(ROLE_COORDINATING, renewed) == ROLE_COORDINATING) return; /* renewed, or Redis trouble */
        log_msg("the coordinator's lease has passed to another machine (this launcher was held up): it follows now");
        coord_free(L->coord);
        L->coord = NULL;
        L->coordinating = 0;
        return;
    }
    char holder[64];
    snprintf(holder, sizeof holder, "machine%d", L->node_index);
    long long token = ctl_lease_acquire(L->ctl, holder, lau_lease_ttl_ms(L->cfg), L->lease, sizeof L->lease);
    if (roles_after_lease(ROLE_FOLLOWING, token) == ROLE_COORDINATING && lau_become_coordinator(L, token) != 0)
        L->lease[0] = 0; /* it expires; another one tries */
}

static void follow(Launcher *L);

static void supervise(Launcher *L);

/* How many of the processes this launcher started have exited with status 0. */
int lau_count_exited_ok(const Launcher *L) {
    int n = 0;
    for (int i = 0; i < L->nchildren; i++)
        if (L->children[i].exited && WIFEXITED(L->children[i].status) && WEXITSTATUS(L->children[i].status) == 0) n++;
    return n;
}

/* Ctrl-C or SIGTERM (scancel, a time limit) keeps the work: the newest generation every rank
 * committed is in their memory, so it is written to --out (each rank its own state, as when no
 * spare is left) before the job stops, and `--resume` continues from it. Bounded: a second
 * signal, or 30 s, and the job stops with what is on disk. */
void lau_keep_on_stop(Launcher *L) {
    char err[256];
    long long g = coord_persist_on_stop(L->coord);
    if (g < 0 || checkpoint_latest(L->run_cfg.out, err, sizeof err) >= g) return;
    log_msg("stopping: writing step %lld, the newest every rank committed, to %s/ckpt (Ctrl-C again to skip)", g + 1,
            L->run_cfg.out);
    sig_atomic_t first = lau_stop_signal;
    lau_stop_signal = 0;
    double deadline = now_ms() + COORD_PERSIST_WAIT_MS;
    while (!lau_stop_signal && now_ms() < deadline && L->coordinating) {
        if (coord_persisted(L->coord, g)) {
            char cmd[9000];
            log_msg("step %lld is on disk: continue with `%s`", g + 1,
                    job_config_resume_command(&L->run_cfg, cmd, sizeof cmd));
            event_emit(L->ctl, L->t0_wall_ms, "kept_on_stop", "\"step\":%lld", g + 1);
            break;
        }
        lease_tick(L);
        lau_launcher_beat(L);
        lau_reap_children(L);
        lau_drain_outputs(L);
        sleep_ms(50);
    }
    if (now_ms() >= deadline) log_msg("stopping: step %lld was not written within %d s", g + 1, COORD_PERSIST_WAIT_MS / 1000);
    lau_stop_signal = first;
}

/* The role loop. Across machines a launcher may change roles, a two-state machine:
 *   following ──(takes the lease: the coordinating machine is gone)──▶ coordinating
 *   coordinating ──(finds its lease held by another: it was held up)──▶ following
 * The lease moves it (lease_tick, roles_after_lease); each role's loop returns when the job
 * ends or the role changes. Returns the role the job ended in: it says how the launcher
 * finishes (coordinator_finish / follower_finish). */
launcher_role lau_run_roles(Launcher *L) {
    launcher_role role = L->coordinating ? ROLE_COORDINATING : ROLE_FOLLOWING;
    while (!roles_job_over(lau_stop_signal != 0, L->failed, L->job_done, L->redis_lost)) {
        switch (role) {
        case ROLE_COORDINATING: supervise(L); break;
        case ROLE_FOLLOWING: follow(L); break;
        }
        role = L->coordinating ? ROLE_COORDINATING : ROLE_FOLLOWING; /* what lease_tick made it */
    }
    return role;
}

static void supervise(Launcher *L) {
    while (!lau_stop_signal && !L->failed && !L->job_done && !L->redis_lost && L->coordinating) {
        lease_tick(L);
        if (!L->coordinating) break;
        /* Exits first: a crash is known the moment waitpid says so. */
        if (lau_reap_children(L) == 0 && L->cfg->nnodes == 0) { /* across machines the job lives elsewhere too */
            /* Rank 0 sends job_done before it exits, so when every local process has left
             * between two drains (rank 1 a spare started by hand, say) the report is queued
             * in Redis: read it before taking the exits for a failure. */
            lau_drain_outputs(L);
            if (L->job_done) break;
            char err[256], cmd[9000];
            int64_t ck = checkpoint_latest(L->run_cfg.out, err, sizeof err);
            if (ck >= 0)
                log_msg("every process has exited before the job finished; the newest checkpoint is of step %lld: "
                        "continue with `%s`", (long long)ck + 1,
                        job_config_resume_command(&L->run_cfg, cmd, sizeof cmd));
            else
                log_msg("every process has exited before the job finished");
            L->failed = 1;
            break;
        }
        int used = 0;
        coord_state cs = coord_tick(L->coord, &used);
        lau_drain_outputs(L);
        if (cs == COORD_FAILED && L->run_cfg.ft == FT_DISK && L->restart.count < 100) {
            if (lau_restart_from_disk(L) == 0) continue;
            L->failed = 1;
            break;
        }
        if (cs == COORD_FAILED) {
            log_msg("%s", coord_message(L->coord));
            char esc[4200];
            json_escape(coord_message(L->coord), esc, sizeof esc);
            event_emit(L->ctl, L->t0_wall_ms, "job_failed", "\"message\":\"%s\"", esc);
            L->failed = 1;
            break;
        }
        lau_launcher_beat(L);
        lau_node_beat(L);
        if (used && L->cfg->respawn_spares && L->cfg->nnodes == 0) lau_respawn_later(L, used);
        int wanted = coord_spares_wanted(L->coord) - lau_spares_arriving(L);
        if (wanted > 0) lau_respawn_spares(L, wanted); /* a failure is waiting for them: now */
        if (L->respawn_due && now_ms() >= L->respawn_at) lau_respawn_now(L);
        /* The link comes back once the cut-off worker has been replaced: it must find itself fenced. */
        if (L->netdown_epoch >= 0 && L->coord && coord_epoch(L->coord) > L->netdown_epoch) {
            netns_link_up(&L->netns);
            L->netdown_epoch = -1;
        }
        /* Events and metrics have no latency requirement: draining them when the coordinator
         * ticks (every 25 ms when all is well) is enough. */
        lau_wait_for_children(L, coord_tick_due_ms(L->coord));
    }
    lau_drain_outputs(L);
}

/* The same --job again (a rerun, a requeue on a shared Redis): keys of an earlier run whose
 * launchers, machines and processes are all gone are that run's, not this one's, and
 * continuing it would fail at once. A new run must say what it wants: --resume (continue from
 * that run's checkpoints) or --fresh (start again); either discards the dead run's keys. A
 * run with anything still alive is joined as before (a machine coming back). 0 / -1 + err. */
int lau_claim_job_id(Launcher *L, char *err, size_t errlen) {
    double deadline = now_ms() + L->cfg->start_timeout_ms;
    for (;;) {
        long long seen = 0;
        int dead = ctl_job_dead_run(L->ctl, &seen);
        if (dead < 0) { snprintf(err, errlen, "--job %s: reading its keys failed: %s", L->job, ctl_last_error(L->ctl)); return -1; }
        if (dead == 0) return 0;
        char ago[48] = "";
        if (seen > 0) snprintf(ago, sizeof ago, " (last seen %.0f s ago)", (double)(wall_ms() - seen) / 1e3);
        if (!L->cfg->resume[0] && !L->cfg->fresh) {
            snprintf(err, errlen, "--job %s: Redis holds the keys of an earlier run of this id whose launchers and "
                     "processes are all gone%s. Continue it with --resume OUT (its checkpoints), or start it again "
                     "with --fresh (its keys are discarded; checkpoints on disk stay)", L->job, ago);
            return -1;
        }
        int r = ctl_job_dead_run_delete(L->ctl, L->cfg->start_timeout_ms);
        if (r < 0) { snprintf(err, errlen, "--job %s: discarding the dead run's keys failed: %s", L->job, ctl_last_error(L->ctl)); return -1; }
        if (r == 1) {
            log_msg("job %s: discarded the keys of its earlier, dead run%s; %s", L->job, ago,
                    L->cfg->resume[0] ? "resuming from the checkpoints" : "starting afresh (--fresh)");
            return 0;
        }
        /* another machine of this run is discarding them: wait until it has */
        if (now_ms() > deadline || lau_stop_signal) {
            snprintf(err, errlen, "--job %s: another machine claimed the dead run's keys but they are still there "
                     "after --start-timeout-ms %d", L->job, L->cfg->start_timeout_ms);
            return -1;
        }
        sleep_ms(50);
    }
}

/* Registers this machine in the job: the order of joining gives its index (0 creates the
 * job and coordinates it). 0 / -1 + err. */
int lau_join_as_node(Launcher *L, char *err, size_t errlen) {
    /* Under Slurm the step's first nodes beyond --nnodes are the spare machines (node 0, the
     * batch script's, first: its loss ends a Slurm job anyway): they join once the others have
     * (machines run ranks in the order they join). */
    if (L->cfg->slurm && L->cfg->slurm_env && L->cfg->slurm_env->node < L->cfg->slurm_env->nnodes - L->cfg->nnodes) {
        static char ids[DP_MAX_RANKS][128];
        static int idx[DP_MAX_RANKS];
        double deadline = now_ms() + L->cfg->start_timeout_ms;
        while (ctl_nodes_read(L->ctl, ids[0], sizeof ids[0], idx, DP_MAX_RANKS) < L->cfg->nnodes && now_ms() < deadline &&
               !lau_stop_signal)
            sleep_ms(50);
    }
    int r = ctl_node_join(L->ctl, L->node_id, &L->node_index);
    if (r < 0) { snprintf(err, errlen, "registering this machine failed: %s", ctl_last_error(L->ctl)); return -1; }
    if (r == 0) {
        snprintf(err, errlen, "machine id '%s' is in use in job '%s' by a launcher that is running (two launchers on one "
                 "machine need distinct --node-id)", L->node_id, L->job);
        return -1;
    }
    L->coordinating = L->node_index == 0;
    if (L->cfg->nnodes > 0) log_msg("joined job %s as its machine %d", L->job, L->node_index);
    if (L->cfg->nnodes > 0 && !L->cfg->bind[0] && ctl_local_addr(L->ctl, L->bind_addr, sizeof L->bind_addr) != 0) {
        snprintf(err, errlen, "--bind: cannot tell this machine's address (give --bind ADDR)");
        return -1;
    }
    if (L->cfg->nnodes > 0 && L->cfg->bind[0]) snprintf(L->bind_addr, sizeof L->bind_addr, "%s", L->cfg->bind);
    if (L->cfg->nnodes > 0 && (!strcmp(L->bind_addr, "0.0.0.0") || !strcmp(L->bind_addr, "::"))) {
        snprintf(err, errlen, "--bind %s: the other machines need an address of this one they can reach", L->bind_addr);
        return -1;
    }
    lau_node_beat(L);
    return 0;
}

/* The first machine takes the coordinator's lease before it publishes the job: once the job is
 * "running", the other machines try to take a lease nobody holds (lease_tick). Held for 10 s
 * (publishing may take longer than a lease lives), then renewed as usual. 0 / -1 + err. */
int lau_take_first_lease(Launcher *L, char *err, size_t errlen) {
    if (L->cfg->nnodes == 0) return 0;
    int ttl = lau_lease_ttl_ms(L->cfg) > 10000 ? lau_lease_ttl_ms(L->cfg) : 10000;
    if (ctl_lease_acquire(L->ctl, "machine0", ttl, L->lease, sizeof L->lease) > 0) return 0;
    L->lease[0] = 0;
    snprintf(err, errlen, "the coordinator's lease of job %s is taken: is another first machine running it? (%s)", L->job,
             ctl_last_error(L->ctl));
    return -1;
}

/* A machine other than the first: the job as its first machine published it, which must
 * agree with this machine's options (bar the machine's own: --out, --bind, ...). 0 / -1. */
int lau_follow_job(Launcher *L, char *err, size_t errlen) {
    static char text[JOB_CONFIG_TEXT_MAX], mine[JOB_CONFIG_TEXT_MAX];
    char t0[32], why[900];
    job_state state = JOB_STATE_RUNNING;
    double deadline = now_ms() + L->cfg->start_timeout_ms;
    /* The first machine writes the job's fields one by one and "running" last. */
    for (;;) {
        int got = ctl_state_get(L->ctl, &state) == 1; /* absent: not published yet */
        if (got && state == JOB_STATE_RUNNING) break;
        if (got) { /* failed, done, stopping */
            snprintf(err, errlen, "job '%s' is %s: a new run needs a new --job", L->job, job_state_name(state));
            return -1;
        }
        if (now_ms() > deadline || lau_stop_signal) {
            snprintf(err, errlen, "job '%s': its first machine did not publish the job within --start-timeout-ms %d",
                     L->job, L->cfg->start_timeout_ms);
            return -1;
        }
        lau_node_beat(L);
        sleep_ms(50);
    }
    if (ctl_launcher_alive(L->ctl) == 0 || ctl_config_get(L->ctl, CFG_CONFIG, text, sizeof text) != 0) {
        snprintf(err, errlen, "job '%s' is in redis but its first machine's launcher is gone: a new run needs a new "
                 "--job", L->job);
        return -1;
    }
    /* Resuming, the job's options come from the checkpoint on the first machine's disk; a
     * machine with none on its disk must agree on the job's shape at least. */
    JobConfig job;
    if (job_config_parse_lines(&job, text, why, sizeof why) != 0) {
        snprintf(err, errlen, "job '%s': its config does not parse: %s", L->job, why);
        return -1;
    }
    const JobConfig *c = L->cfg;
    if (c->resume[0] && c->resume_step < 0) { /* nothing on this disk: at least the same shape */
        if (c->nnodes != job.nnodes || c->nproc_per_node != job.nproc_per_node || c->workers != job.workers) {
            snprintf(err, errlen, "this machine's --nnodes %d --nproc-per-node %d differ from job '%s' (%d x %d)",
                     c->nnodes, c->nproc_per_node, L->job, job.nnodes, job.nproc_per_node);
            return -1;
        }
    } else if (job_config_serialize(c, mine, sizeof mine) != 0 || job_config_mismatch(mine, text, why, sizeof why) != 0) {
        snprintf(err, errlen, "this machine's options differ from job '%s': %s", L->job, why);
        return -1;
    }
    L->run_cfg.resume_step = job.resume_step;
    if (ctl_config_get(L->ctl, CFG_T0_MS, t0, sizeof t0) != 0) { snprintf(err, errlen, "job '%s' has no start time", L->job); return -1; }
    long long t0v;
    if (proto_int_parse(t0, "config t0_ms", 0, LLONG_MAX, &t0v, err, errlen) != 0) return -1;
    L->t0_wall_ms = t0v;
    return 0;
}

/* --- resuming across machines without a shared filesystem ------------------------------ */

/* What this machine's --resume directory holds, for the first machine to choose from. */
int lau_publish_inventory(Launcher *L, char *err, size_t errlen) {
    static char inv[INVENTORY_TEXT_MAX];
    if (checkpoint_inventory(L->cfg->resume, inv, sizeof inv) != 0) {
        snprintf(err, errlen, "--resume %.900s: the checkpoints there take more than %d bytes to list: remove old "
                 "ones", L->cfg->resume, INVENTORY_TEXT_MAX);
        return -1;
    }
    if (ctl_inventory_set(L->ctl, L->node_index, inv) != 0) {
        snprintf(err, errlen, "publishing this machine's checkpoints: %s", ctl_last_error(L->ctl));
        return -1;
    }
    log_msg("--resume: this machine has %s", inv[0] ? inv : "no checkpoint");
    return 0;
}

/* The first machine: waits (--start-timeout-ms) for every machine that runs ranks to say what
 * it has, a second more for spare machines, and resumes from the newest step whose every
 * rank's state is on some machine. 0 / -1 + err. */
int lau_choose_resume_step(Launcher *L, char *err, size_t errlen) {
    int max = DP_MAX_RANKS, n = 0;
    int *machines = malloc(sizeof *machines * (size_t)max);
    char *values = malloc((size_t)max * INVENTORY_TEXT_MAX);
    const char **inv = malloc(sizeof *inv * (size_t)max);
    char why[512];
    if (!machines || !values || !inv) { snprintf(err, errlen, "out of memory"); goto fail; }
    double t0 = now_ms(), all_at = 0;
    for (;;) {
        n = ctl_inventories_get(L->ctl, machines, values, INVENTORY_TEXT_MAX, max);
        int workers_in = 0; /* machines 0..nnodes-1 (spare machines may come too) */
        for (int i = 0; i < n; i++) workers_in += machines[i] < L->cfg->nnodes;
        if (workers_in >= L->cfg->nnodes && !all_at) all_at = now_ms();
        if ((all_at && now_ms() - all_at >= 1000) || now_ms() - t0 > L->cfg->start_timeout_ms || lau_stop_signal) break;
        lau_node_beat(L);
        sleep_ms(50);
    }
    if (!all_at) {
        snprintf(err, errlen, "--resume: not all %d machines joined within --start-timeout-ms %d", L->cfg->nnodes,
                 L->cfg->start_timeout_ms);
        goto fail;
    }
    for (int i = 0; i < n; i++) inv[i] = values + (size_t)i * INVENTORY_TEXT_MAX;
    int64_t step = resume_choose(inv, n, L->cfg->workers, why, sizeof why);
    if (step < 0 && L->cfg->slurm_env && L->cfg->slurm_env->restart_count > 0) {
        /* A requeued Slurm job resumes when its nodes have a complete checkpoint, and starts
         * afresh, deliberately and saying so, when they have none (it was requeued before its
         * first one). */
        log_msg("requeued job %s: no complete checkpoint across the %d machines (%s): starting from step 1", L->job, n, why);
        L->run_cfg.resume_step = -1;
        free(machines); free(values); free(inv);
        return 0;
    }
    if (step < 0) { snprintf(err, errlen, "--resume: no complete checkpoint across the %d machines: %s", n, why); goto fail; }
    if (why[0]) log_msg("--resume: %s; resuming from step %lld", why, (long long)step + 1);
    L->run_cfg.resume_step = (int)step;
    free(machines); free(values); free(inv);
    return 0;
fail:
    free(machines); free(values); free(inv);
    return -1;
}

/* Every machine serves the state files of the chosen step on its disk to the ranks that run
 * elsewhere (through a replica server of its own: the job's key, verified on arrival), and
 * says so in Redis. 0 / -1 + err. */
int lau_serve_resumed_states(Launcher *L, char *err, size_t errlen) {
    int64_t step = L->run_cfg.resume_step;
    unsigned char k[REPLICA_KEY_BYTES];
    if (replica_key_derive(L->job_key, k) != 0) { snprintf(err, errlen, "job '%s': the job key derives no replica key", L->job); return -1; }
    L->shards = replica_server_start(L->bind_addr, 0, L->job, L->cfg->workers, 0 /* a launcher */, k, err, errlen);
    ReplicaConn *c = L->shards ? replica_connect(L->bind_addr, replica_server_port(L->shards), 0, 10000, 0, k, err, errlen)
                               : NULL;
    explicit_bzero(k, sizeof k);
    if (!c) return -1;
    int served = 0;
    for (int r = 0; r < L->cfg->workers; r++) {
        SnapHeader h;
        void *payload = NULL;
        char e[512];
        if (checkpoint_read_shard(L->cfg->resume, step, r, &h, &payload, e, sizeof e) != 0) continue;
        snprintf(h.job, sizeof h.job, "%s", L->job); /* the previous run's job name: ours now */
        snap_header_seal(&h);
        replica_status st = replica_put(c, &h, payload, 10000 + (int)(h.length / 20000)); /* >= 20 MB/s */
        free(payload);
        Endpoint me = {.port = replica_server_port(L->shards)};
        snprintf(me.host, sizeof me.host, "%s", L->bind_addr);
        if (st != REPLICA_OK || ctl_resume_holder_set(L->ctl, r, &me) != 0) {
            log_msg("--resume: cannot offer rank %d's state: %s", r, st != REPLICA_OK ? replica_status_str(st) : ctl_last_error(L->ctl));
            continue;
        }
        served++;
    }
    replica_close(c);
    if (served) log_msg("--resume: serving %d rank state(s) of step %lld from this machine's disk", served, (long long)step + 1);
    return 0;
}

/* The newest step's progress line, on a machine that does not drain the job's metrics. */
static void show_progress(Launcher *L) {
    char json[4096], t[64] = "";
    if (now_ms() - L->progress_ms < 500) return;
    L->progress_ms = now_ms();
    if (ctl_progress_get(L->ctl, json, sizeof json) != 0) return;
    json_t *o = lau_json_line(json);
    double tv = -1;
    if (!o || lau_jnum(o, "t", &tv) != 0) {
        json_decref(o);
        return;
    }
    snprintf(t, sizeof t, "%.3f", tv);
    if (!strcmp(t, L->progress_seen)) {
        json_decref(o);
        return;
    }
    snprintf(L->progress_seen, sizeof L->progress_seen, "%s", t);
    StepLine s = lau_take_metric(L, json, o);
    fflush(L->metrics);
    lau_observe_metric(L, o, s.step, s.loss, s.ms, s.tps, s.t);
    json_decref(o);
    fflush(stdout);
}

/* A machine other than the first supervises its own processes: it reports their exits, keeps
 * its machine key alive, prints the job's progress, and ends when the job does (or when the
 * coordinating launcher is gone: nobody could decide a failure any more). */
static void follow(Launcher *L) {
    double state_ms = 0;
    FollowWatch watch = {.reached_ms = now_ms(), .absent_ms = 0};
    while (!lau_stop_signal && !L->failed && !L->job_done && !L->coordinating) {
        int running = lau_reap_children(L);
        lau_node_beat(L);
        lease_tick(L);
        if (L->coordinating) return; /* the coordinator's loop takes over */
        double now = now_ms();
        if (now - state_ms >= 100) {
            job_state state = JOB_STATE_RUNNING;
            state_ms = now;
            int got = ctl_state_get(L->ctl, &state);
            /* No state: the job's keys are gone (its coordinator ended it while this launcher
             * was held up) or being republished after an outage. This machine's processes see
             * the same and leave; their exits tell how the job ended. Cut off for as long as
             * the job takes to forget a launcher: this machine's ranks have been replaced (they
             * stop by themselves once they see it), and so has it. */
            follow_verdict v = roles_follow_state(&watch, got, state, running, lau_count_exited_ok(L), L->nchildren, now,
                                                  lau_launcher_ttl_ms(L->cfg));
            if (v == FOLLOW_GONE_DONE || v == FOLLOW_GONE_FAILED)
                log_msg("the job's state is gone from the control plane (it ended while this launcher was held up): "
                        "this machine's processes %s", v == FOLLOW_GONE_DONE ? "all finished" : "did not all finish");
            else if (v == FOLLOW_GONE_TOO_LONG)
                log_msg("the job's state has been gone from the control plane for %.0f s: leaving the job",
                        (now - watch.absent_ms) / 1e3);
            else if (v == FOLLOW_UNREACHABLE)
                log_msg("this machine has not reached the control plane for %.0f s (%s): leaving the job",
                        (now - watch.reached_ms) / 1e3, ctl_last_error(L->ctl));
            if (roles_follow_done(v)) L->job_done = 1;
            else if (roles_follow_failed(v)) {
                L->failed = 1;
                L->stopped_elsewhere = roles_follow_stopped_elsewhere(v);
            }
        }
        show_progress(L);
        lau_wait_for_children(L, 25);
    }
    show_progress(L);
    if (L->job_done) L->last_step = L->cfg->steps;
}

/* The first machine of a multi-node job keeps the job's keys until the other machines'
 * launchers have seen its end (their machine keys go), bounded. */
void lau_wait_other_nodes(Launcher *L, int ms) {
    double deadline = now_ms() + ms;
    char (*ids)[128] = malloc(sizeof *ids * DP_MAX_RANKS);
    int *idx = malloc(sizeof *idx * DP_MAX_RANKS), *present = malloc(sizeof *present * DP_MAX_RANKS), n = 0;
    if (ids && idx && present) n = ctl_nodes_read(L->ctl, ids[0], sizeof ids[0], idx, DP_MAX_RANKS);
    while (n > 0 && now_ms() < deadline) { /* one MGET of the other machines' keys per look */
        int alive = 0;
        if (ctl_nodes_alive(L->ctl, idx, n, present) != 0) break;
        for (int i = 0; i < n; i++) alive += present[i] && idx[i] != L->node_index;
        if (!alive) break;
        sleep_ms(50);
    }
    free(ids);
    free(idx);
    free(present);
}
