/* launcher_children.c — the launcher's child processes: starting workers and spares (in a
 * network namespace for --inject netdown), reaping them and reporting each exit, stopping
 * them, starting spares again, and a restart from disk (--ft disk). */
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
/* --inject netdown: put the rank behind a veth link and let Redis listen on it too. */
int lau_setup_netns(Launcher *L, char *err, size_t errlen) {
    if (geteuid() == 0) netns_reap();
    L->netdown_epoch = -1;
    int rank = inject_netdown_rank(L->cfg->inject);
    if (rank < 0) return 0;

    if (rank >= L->cfg->workers) { snprintf(err, errlen, "--inject netdown:%d: no such rank", rank); return -1; }
    if (netns_create(&L->netns, L->job, rank, err, errlen) != 0) return -1;
    char bind[80];
    snprintf(bind, sizeof bind, "127.0.0.1 %s", L->netns.host_addr);
    if (ctl_server_config_set(L->ctl, "bind", bind) != 0) {
        snprintf(err, errlen, "redis: cannot listen on %s: %s", L->netns.host_addr, ctl_last_error(L->ctl));
        return -1;
    }
    log_msg("rank %d runs in network namespace %s (%s); its link goes down at the injected step", rank, L->netns.ns,
            L->netns.ns_addr);
    return 0;
}

static void add_child(Launcher *L, pid_t pid, long proc, int rank) {
    L->children[L->nchildren++] =
        (Child){.pid = pid, .proc = proc, .rank = rank, .pidfd = (int)syscall(SYS_pidfd_open, pid, 0)};
}

/* Draws the process id, starts the process, supervises it. 0 / -1. */
static int start_process(Launcher *L, int rank) {
    if (L->nchildren >= MAX_CHILDREN) return -1;
    long proc = ctl_new_proc_id(L->ctl);
    /* Redis away for a moment is no reason to start nothing (item 12): retried, bounded. */
    for (double until = now_ms() + job_control_outage_ms(L->cfg); proc <= 0 && ctl_error_transient(L->ctl) && now_ms() < until;) {
        sleep_ms(200);
        proc = ctl_new_proc_id(L->ctl);
    }
    if (proc <= 0) return -1;
    pid_t pid = lau_spawn_process(L, rank, proc);
    if (pid < 0) return -1;
    add_child(L, pid, proc, rank);
    return 0;
}

void lau_forget_children(Launcher *L) {
    for (int i = 0; i < L->nchildren; i++)
        if (L->children[i].pidfd >= 0) close(L->children[i].pidfd);
    L->nchildren = 0;
}

/* Sleeps up to ms, or until a child exits: the supervisor sees a crash at once without
 * polling waitpid (and Redis) every few milliseconds. */
void lau_wait_for_children(Launcher *L, int ms) {
    struct pollfd p[MAX_CHILDREN];
    int n = 0;
    for (int i = 0; i < L->nchildren; i++) {
        if (L->children[i].exited) continue;
        if (L->children[i].pidfd < 0 && ms > 2) ms = 2; /* no pidfd: poll waitpid often */
        if (L->children[i].pidfd >= 0) p[n++] = (struct pollfd){.fd = L->children[i].pidfd, .events = POLLIN};
    }
    if (poll(p, (nfds_t)n, ms) < 0) { /* EINTR: a stop signal, seen by the caller */ }
}

/* This machine's processes: all ranks and spares on one machine; with --nnodes, machine k <
 * N runs ranks k*P .. k*P+P-1 (and --spares spares), a machine beyond N runs P spares. */
int lau_spawn_all(Launcher *L) {
    const JobConfig *c = L->cfg;
    int first = 0, ranks = c->workers, spares = c->spares;
    if (c->nnodes > 0) {
        int worker_node = L->node_index < c->nnodes;
        first = worker_node ? L->node_index * c->nproc_per_node : 0;
        ranks = worker_node ? c->nproc_per_node : 0;
        spares = worker_node ? c->spares : c->nproc_per_node;
    }
    if (ranks + spares > MAX_CHILDREN) return -1;
    for (int i = 0; i < ranks + spares; i++)
        if (start_process(L, i < ranks ? first + i : -1) != 0) return -1;
    return 0;
}

/* A JSON line of our own (an event or a metrics line) as an object; NULL if it is not one. */
json_t *lau_json_line(const char *line) {
    json_t *o = json_loads(line, 0, NULL);
    if (o && !json_is_object(o)) {
        json_decref(o);
        o = NULL;
    }
    return o;
}

static Child *find_child(Launcher *L, pid_t pid) {
    for (int i = 0; i < L->nchildren; i++)
        if (L->children[i].pid == pid) return &L->children[i];
    return NULL;
}

static void describe_exit(int status, char *out, size_t len) {
    if (WIFEXITED(status)) snprintf(out, len, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status)) snprintf(out, len, "killed by signal %d", WTERMSIG(status));
    else snprintf(out, len, "status %d", status);
}

/* On a machine that does not coordinate: tells the coordinator how a process ended (it sees
 * the record within a liveness period, long before the heartbeat would expire). The same
 * classification as the coordinator's own (coord_child_exited). */
static void report_exit(Launcher *L, const Child *c) {
    int code = WIFEXITED(c->status) ? WEXITSTATUS(c->status) : -1;
    ExitRecord e = {.how = code == DP_EXIT_BAD_JOB ? EXITED_BAD_JOB
                           : code == DP_EXIT_DONE || code == DP_EXIT_FENCED || code == DP_EXIT_OUTPUT ? EXITED_DEPARTED
                           : EXITED_CRASH,
                    .wall_ms = wall_ms()};
    if (ctl_exit_report(L->ctl, c->proc, &e) != 0)
        log_msg("reporting process %d's exit: %s", (int)c->pid, ctl_last_error(L->ctl));
}

static int restart_unjoined(Launcher *L, const Child *c, const char *how) {
    if (c->rank < 0 || L->failed || L->job_done || (L->coord && coord_is_member(L->coord, c->pid))) return -1;
    if (ctl_epoch(L->ctl) != 0 || ctl_rank_owner(L->ctl, c->rank) != 0) return -1;
    if (++L->unjoined_restarts > START_RESTARTS_MAX) {
        log_msg("process %d, started for rank %d, %s before it claimed the rank; %d processes died so: the job cannot "
                "start", (int)c->pid, c->rank, how, L->unjoined_restarts);
        L->failed = 1;
        return 0;
    }
    log_msg("process %d, started for rank %d, %s before it claimed the rank: starting another for it", (int)c->pid,
            c->rank, how);
    if (start_process(L, c->rank) != 0) {
        log_msg("starting a process for rank %d failed: the job cannot start", c->rank);
        L->failed = 1;
    }
    return 0;
}

/* Reaps exited children and tells the coordinator. Returns the number still running. */
int lau_reap_children(Launcher *L) {
    pid_t pid;
    int status;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        Child *c = find_child(L, pid);
        if (!c && (L->cfg->redis_ha || L->cfg->slurm) && pid > 0) { /* Sentinel fails over: the job goes on */
            for (int i = -1; i < 4; i++) {
                redis_server *s = i < 0 ? &L->server : &L->ha[i];
                if (s->pid != pid) continue;
                char how[64];
                describe_exit(status, how, sizeof how);
                log_msg("embedded %s (pid %d) %s%s", i < 0 ? "Redis master" : i == 0 ? "Redis replica" : "sentinel", (int)pid, how,
                        i < 0 ? ": the sentinels fail over to the replica" : "");
                s->pid = 0;
            }
            continue;
        }
        if (!c && pid == L->server.pid) { /* the embedded redis-server died */
            char how[64], why[1200], err[1024];
            describe_exit(status, how, sizeof how);
            snprintf(why, sizeof why, "the embedded redis-server, pid %d, %s", (int)pid, how);
            L->server.pid = 0;
            /* Started again on the same port with the same password, empty: everybody
             * reconnects and republishes what it owns there; training does not wait for it. */
            if (!lau_stop_signal && !L->job_done && redis_server_restart(&L->server, 5000, err, sizeof err) == 0) {
                char where[REDIS_UNIX_PATH_MAX + 32];
                if (L->server.sock[0]) snprintf(where, sizeof where, "%s", L->server.sock);
                else snprintf(where, sizeof where, "127.0.0.1:%d", L->server.port);
                log_msg("%s: started again on %s (pid %d); the job's keys are republished", why, where, L->server.pid);
                if (!L->redis_failing_since) {
                    L->redis_failing_since = now_ms();
                    L->redis_failing_wall = wall_ms();
                }
            } else {
                if (L->server.pid == 0 && !lau_stop_signal && !L->job_done) log_msg("restarting it: %s", err);
                lau_control_plane_lost(L, why);
            }
        }
        if (!c) continue;
        c->exited = 1;
        c->status = status;
        if (L->cfg->nnodes > 0) report_exit(L, c); /* for whichever launcher coordinates, now or later */
        /* A member that finished says so here too: its job_done may not have reached Redis (the
         * control plane away at the end), and its silence must not read as a crash. */
        if (!lau_stop_signal && WIFEXITED(status) && WEXITSTATUS(status) == 0 && L->coord) coord_child_exited(L->coord, pid, status);
        if (lau_stop_signal || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) continue;
        char how[64];
        describe_exit(status, how, sizeof how);
        if (L->coordinating) event_emit(L->ctl, L->t0_wall_ms, "process_exit", "\"pid\":%d,\"status\":\"%s\"", (int)pid, how);
        else lau_node_event(L, "process_exit", "\"pid\":%d,\"proc\":%ld,\"status\":\"%s\"", (int)pid, c->proc, how);
        if (WIFEXITED(status) && WEXITSTATUS(status) == DP_EXIT_BAD_JOB && c->rank < 0) {
            /* A spare never fails a job (issue 47): a problem that every process would hit
             * stops the ranks too, and they fail it. This one is reported and not started
             * again (its replacement would likely hit it again); the job goes on with the
             * spares it has. */
            log_msg("spare process %d could not start (see the message above): the job goes on without it", (int)pid);
            L->spares_failed++;
            if (L->coordinating) event_emit(L->ctl, L->t0_wall_ms, "spare_failed", "\"pid\":%d", (int)pid);
            else lau_node_event(L, "spare_failed", "\"pid\":%d,\"proc\":%ld", (int)pid, c->proc);
            if (L->coord) coord_child_exited(L->coord, pid, status); /* if it had registered: gone */
        } else if (WIFEXITED(status) && WEXITSTATUS(status) == DP_EXIT_BAD_JOB) {
            log_msg("process %d stopped on a bad job (see the message above)", (int)pid);
            L->failed = 1; /* a configuration problem: every replacement would fail alike */
        } else if (WIFEXITED(status) && WEXITSTATUS(status) == DP_EXIT_OUTPUT) {
            log_msg("process %d trained every step but could not write its output (see the message above)", (int)pid);
            L->failed = 1; /* not a crash: a spare would not write it any better */
        } else if (restart_unjoined(L, c, how) == 0) {
            continue;
        } else if (L->coord) {
            coord_child_exited(L->coord, pid, status);
        }
    }
    int running = 0;
    for (int i = 0; i < L->nchildren; i++)
        if (!L->children[i].exited) running++;
    return running;
}

/* Every child gets grace_ms to leave on its own, then SIGKILL; all are reaped. */
void lau_stop_children(Launcher *L, int grace_ms) {
    double deadline = now_ms() + grace_ms;
    for (;;) {
        int left = 0;
        for (int i = 0; i < L->nchildren; i++) {
            Child *c = &L->children[i];
            if (c->exited) continue;
            if (waitpid(c->pid, &c->status, WNOHANG) == c->pid) c->exited = 1;
            else left++;
        }
        if (!left) return;
        if (now_ms() > deadline) break;
        lau_drain_outputs(L);
        lau_node_beat(L); /* still here: the first machine keeps the job's keys until we leave */
        sleep_ms(10);
    }
    for (int i = 0; i < L->nchildren; i++) {
        Child *c = &L->children[i];
        if (c->exited) continue;
        if (grace_ms > 0) log_msg("process %d did not stop in time: killing it", (int)c->pid);
        kill(c->pid, SIGKILL);
        waitpid(c->pid, &c->status, 0);
        c->exited = 1;
    }
}

/* Spares started and alive that are neither in the pool nor members yet: a program still
 * starting (importing its framework, building its model). A failure that finds the pool
 * short waits for them rather than start more: a second start would only compete with the
 * first, and with the recovery, for the CPU. */
int lau_spares_arriving(Launcher *L) {
    int n = 0;
    for (int i = 0; i < L->nchildren; i++) {
        const Child *c = &L->children[i];
        if (c->rank < 0 && !c->exited && coord_spare_arriving(L->coord, c->proc)) n++;
    }
    return n;
}

void lau_respawn_spares(Launcher *L, int n) {
    for (int i = 0; i < n && L->nchildren < MAX_CHILDREN; i++)
        if (start_process(L, -1) != 0) break;
}

/* Replacements for the spares a decision used start after the recovery, not during it: a
 * program starting up (the trainer initialises a whole model) would take CPU from the
 * spare restoring its state while every survivor waits for it. The pool is short of those
 * spares until then; a failure in between is decided with the spares that remain. Unless
 * the replicas live on spares (a lone worker's always do): the new epoch's first snapshot
 * waits for a spare to hold it, so the recovery cannot end before the respawn: at once. */
void lau_respawn_later(Launcher *L, int n) {
    int holders_are_spares = L->cfg->workers == 1 || L->cfg->replica_placement == PLACE_SPARES;
    double wait = holders_are_spares ? 0 : 2.0 * L->cfg->detect_timeout_ms + 3000; /* the join bound */
    if (!L->respawn_due) L->respawn_at = now_ms() + wait;
    L->respawn_due += n;
}

void lau_respawn_now(Launcher *L) {
    int n = L->respawn_due;
    L->respawn_due = 0;
    if (n && !L->job_done && !L->failed && !L->redis_lost && !lau_stop_signal) lau_respawn_spares(L, n);
}

static void kill_all_children(Launcher *L) {
    for (int i = 0; i < L->nchildren; i++)
        if (!L->children[i].exited) kill(L->children[i].pid, SIGKILL);
    lau_stop_children(L, 0);
    lau_forget_children(L);
}

/* --ft disk: tear everything down and start a new incarnation of the job from the newest
 * checkpoint. 0, or -1 if that is not possible. */
int lau_restart_from_disk(Launcher *L) {
    Restart *r = &L->restart;
    char err[1024];
    r->rank = coord_unhandled_failure(L->coord, r->kind, sizeof r->kind, &r->t_fail_ms);
    r->last_step = L->last_step;
    ctl_state_set(L->ctl, JOB_STATE_FAILED);
    kill_all_children(L);
    r->checkpoint = checkpoint_latest_intact(L->run_cfg.out, err, sizeof err);
    if (r->checkpoint >= 0) {
        snprintf(L->run_cfg.resume, sizeof L->run_cfg.resume, "%s", L->run_cfg.out);
        L->run_cfg.resume_step = (int)r->checkpoint;
    }
    L->run_cfg.inject[0] = 0; /* injected faults fire once per run */
    L->run_cfg.chaos = 0.0f;
    log_msg("--ft disk: restarting every process from the checkpoint of step %lld", r->checkpoint + 1);
    event_emit(L->ctl, L->t0_wall_ms, "restart", "\"rank\":%d,\"kind\":\"%s\",\"checkpoint_step\":%lld", r->rank,
               r->kind, r->checkpoint + 1);
    lau_drain_outputs(L);
    ctl_close(L->ctl);
    coord_free(L->coord);
    lau_make_job_id(L->job, sizeof L->job);
    L->ctl = ctl_connect(&L->addr, L->job, 5000, err, sizeof err);
    L->coord = NULL;
    if (!L->ctl || lau_set_job_key(L, err, sizeof err) != 0 || lau_publish_job(L, err, sizeof err) != 0) { log_msg("restart failed: %s", err); return -1; }
    L->coord = coord_create(L->ctl, &L->run_cfg, L->t0_wall_ms, L->node_id);
    if (!L->coord || lau_spawn_all(L) != 0) return -1;
    r->pending = 1;
    r->count++;
    return 0;
}
