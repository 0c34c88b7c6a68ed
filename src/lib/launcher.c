/* launcher.c — the `deadpool run` process: job setup, child processes, output files, teardown. */
#include "launcher.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint.h"
#include "control.h"
#include "coordinator.h"
#include "events.h"
#include "inject.h"
#include "netns.h"
#include "runtime.h"
#include "util.h"

#define MAX_CHILDREN 4096

typedef struct {
    pid_t pid;
    int rank;    /* -1 for a spare */
    int exited;
    int status;  /* waitpid status */
    int pidfd;   /* readable when the child exits; -1 if the kernel has no pidfds */
} Child;

/* The classic baseline (--ft disk): a failure tears the whole job down and restarts every
 * process from the newest disk checkpoint, the way a TorchElastic-style restart works. */
typedef struct {
    int pending;           /* a restart happened; its `recovered` event waits for the first step */
    int rank;
    char kind[16];
    int64_t t_fail_ms;
    long long checkpoint;  /* 0-based step restarted from, -1 = from scratch */
    int last_step;         /* steps completed before the failure */
    int count;
} Restart;

typedef struct {
    const JobConfig *cfg;
    JobConfig run_cfg;      /* cfg as the current incarnation runs it (restarts change it) */
    redis_addr addr;
    Restart restart;
    char job[32];
    char url[600];          /* redis URL without the password */
    redis_server server;    /* embedded server; pid 0 when --redis was given */
    ctl_t *ctl;
    int64_t t0_wall_ms;
    FILE *events, *metrics;
    Child children[MAX_CHILDREN];
    int nchildren;
    int last_step;
    float last_loss;
    int failed;             /* the job cannot continue */
    int job_done;           /* rank 0 said every rank finished: the job is done */
    Coordinator *coord;
    NetNs netns;            /* --inject netdown: one rank runs behind a link we can cut */
    long netdown_epoch;     /* the link went down in this epoch; -1 = up */
    char self_path[4096];   /* this executable: the built-in trainer is its `train` command */
} Launcher;

static volatile sig_atomic_t stop_signal;
static void on_stop_signal(int sig) { stop_signal = sig; }

static void make_job_id(char *out, size_t len) {
    unsigned char b[4] = {0};
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        uint64_t x = (uint64_t)wall_ms() ^ (uint64_t)getpid();
        memcpy(b, &x, sizeof b);
    }
    snprintf(out, len, "%02x%02x%02x%02x", b[0], b[1], b[2], b[3]);
}

static int start_control_plane(Launcher *L, char *err, size_t errlen) {
    redis_addr addr;
    if (L->cfg->redis[0]) {
        if (redis_addr_parse(L->cfg->redis, &addr, err, errlen) != 0) return -1;
        log_msg("control plane: redis at %s:%d", addr.host, addr.port);
    } else {
            if (redis_server_start(&L->server, 5000, err, errlen) != 0) return -1;
        memset(&addr, 0, sizeof addr);
        snprintf(addr.host, sizeof addr.host, "127.0.0.1");
        addr.port = L->server.port;
        snprintf(addr.password, sizeof addr.password, "%s", L->server.password);
        log_msg("control plane: embedded redis-server on 127.0.0.1:%d (pid %d, password hidden)", addr.port,
                L->server.pid);
    }
    snprintf(L->url, sizeof L->url, "redis://%s:%d", addr.host, addr.port);
    /* Children inherit the secret through the environment, never through argv (visible in ps). */
    if (addr.password[0]) setenv("DEADPOOL_REDIS_PASSWORD", addr.password, 1);
    L->addr = addr;
    L->ctl = ctl_connect(&addr, L->job, 5000, err, errlen);
    return L->ctl ? 0 : -1;
}

static int publish_job(Launcher *L, char *err, size_t errlen) {
    char text[JOB_CONFIG_TEXT_MAX], t0[32];
    if (job_config_serialize(&L->run_cfg, text, sizeof text) != 0) { snprintf(err, errlen, "job config too large"); return -1; }
    if (!L->t0_wall_ms) L->t0_wall_ms = wall_ms();
    snprintf(t0, sizeof t0, "%lld", (long long)L->t0_wall_ms);
    if (ctl_config_set(L->ctl, "config", text) != 0 || ctl_config_set(L->ctl, "t0_ms", t0) != 0 ||
        ctl_state_set(L->ctl, "running") != 0) {
        snprintf(err, errlen, "publishing the job to redis failed: %s", ctl_last_error(L->ctl));
        return -1;
    }
    return 0;
}

static int open_outputs(Launcher *L, char *err, size_t errlen) {
    char path[1200];
    if (mkdir_p(L->cfg->out) != 0) {
        snprintf(err, errlen, "--out %.900s: cannot create directory: %s", L->cfg->out, strerror(errno));
        return -1;
    }
    /* A resumed job continues its predecessor's logs. */
    const char *mode = L->cfg->resume_step >= 0 ? "a" : "w";
    snprintf(path, sizeof path, "%s/events.jsonl", L->cfg->out);
    L->events = fopen(path, mode);
    snprintf(path, sizeof path, "%s/metrics.jsonl", L->cfg->out);
    L->metrics = fopen(path, mode);
    if (!L->events || !L->metrics) {
        snprintf(err, errlen, "%.900s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, "%s/model.bin", L->cfg->out);
    unlink(path); /* a stale model must never pass for this run's result */
    return 0;
}

/* Starts one process of the job: the job's program (the built-in trainer is this executable's
 * `train` command), the job handed over in the environment; the netdown rank runs inside its
 * network namespace. */
static pid_t spawn_process(Launcher *L, int rank) {
    char ns_url[700], buf[sizeof L->run_cfg.program];
    int in_ns = L->netns.active && rank == L->netns.rank && L->restart.count == 0;
    char *argv[1100];
    int n = 0;
    if (in_ns) {
        argv[n++] = "ip";
        argv[n++] = "netns";
        argv[n++] = "exec";
        argv[n++] = L->netns.ns;
        snprintf(ns_url, sizeof ns_url, "redis://%s:%d", L->netns.host_addr, L->addr.port);
    }
    program_argv(&L->run_cfg, L->self_path, buf, sizeof buf, argv + n, 1100 - n);
    WorkerArgs a = {.redis_url = in_ns ? ns_url : L->url, .job = L->job, .spare = rank < 0, .rank = rank,
                    .bind_host = L->netns.active ? (in_ns ? L->netns.ns_addr : L->netns.host_addr) : NULL};
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0) return pid;
    worker_env_set(&a);
    /* Own process group: Ctrl-C reaches only the launcher, which stops the job in order.
     * Workers run at the default priority, below the control plane's. */
    setpgid(0, 0);
    if (setpriority(PRIO_PROCESS, 0, 0) != 0) { /* keep the inherited one */ }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (in_ns) setenv("DEADPOOL_NETDOWN_IF", L->netns.ns_if, 1);
    execvp(argv[0], argv);
    fprintf(stderr, "[deadpool] cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(DP_EXIT_BAD_JOB);
}

/* --inject netdown: put the rank behind a veth link and let Redis listen on it too. */
static int setup_netns(Launcher *L, char *err, size_t errlen) {
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

static void add_child(Launcher *L, pid_t pid, int rank) {
    L->children[L->nchildren++] = (Child){.pid = pid, .rank = rank, .pidfd = (int)syscall(SYS_pidfd_open, pid, 0)};
}

static void forget_children(Launcher *L) {
    for (int i = 0; i < L->nchildren; i++)
        if (L->children[i].pidfd >= 0) close(L->children[i].pidfd);
    L->nchildren = 0;
}

/* Sleeps up to ms, or until a child exits: the supervisor sees a crash at once without
 * polling waitpid (and Redis) every few milliseconds. */
static void wait_for_children(Launcher *L, int ms) {
    struct pollfd p[MAX_CHILDREN];
    int n = 0;
    for (int i = 0; i < L->nchildren; i++) {
        if (L->children[i].exited) continue;
        if (L->children[i].pidfd < 0 && ms > 2) ms = 2; /* no pidfd: poll waitpid often */
        if (L->children[i].pidfd >= 0) p[n++] = (struct pollfd){.fd = L->children[i].pidfd, .events = POLLIN};
    }
    if (poll(p, (nfds_t)n, ms) < 0) { /* EINTR: a stop signal, seen by the caller */ }
}

static int spawn_all(Launcher *L) {
    int total = L->cfg->workers + L->cfg->spares;
    if (total > MAX_CHILDREN) return -1;
    for (int i = 0; i < total; i++) {
        int rank = i < L->cfg->workers ? i : -1;
        pid_t pid = spawn_process(L, rank);
        if (pid < 0) return -1;
        add_child(L, pid, rank);
    }
    return 0;
}

/* Reads a number member from one of our own flat JSON lines. */
static int json_number(const char *json, const char *key, double *out) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *at = strstr(json, pat);
    if (!at) return -1;
    *out = strtod(at + strlen(pat), NULL);
    return 0;
}

static void on_metric(const char *json, void *arg) {
    Launcher *L = arg;
    fprintf(L->metrics, "%s\n", json);
    double step = 0, loss = 0, ms = 0, tps = 0, t = 0;
    json_number(json, "step", &step);
    json_number(json, "loss", &loss);
    json_number(json, "step_ms", &ms);
    json_number(json, "tokens_per_s", &tps);
    json_number(json, "t", &t);
    L->last_step = (int)step;
    L->last_loss = (float)loss;
    if (L->coord) coord_progress(L->coord, (int)step);
    if (L->restart.pending) {
        Restart *r = &L->restart;
        r->pending = 0;
        /* Training resumed when this first step started. */
        long long done = (long long)(wall_ms() - r->t_fail_ms), resumed = done - (long long)ms;
        event_emit(L->ctl, L->t0_wall_ms, "recovered",
                   "\"mode\":\"restart\",\"rank\":%d,\"failure_kind\":\"%s\",\"rollback_step\":%lld,"
                   "\"total_ms\":%lld,\"first_step_done_ms\":%lld,\"steps_recomputed\":%lld",
                   r->rank, r->kind, r->checkpoint + 1, resumed, done, (long long)r->last_step - (r->checkpoint + 1));
        printf("[deadpool] restarted the whole job from the checkpoint of step %lld: training resumed %lld ms after "
               "the failure\n", r->checkpoint + 1, resumed);
    }
    printf("step %5d/%d | loss %.4f | %8.0f tok/s | %8.1f ms/step | %7.1f s\n", (int)step, L->cfg->steps, loss,
           tps, ms, t);
    fflush(stdout);
}

static void on_event(const char *json, void *arg) {
    Launcher *L = arg;
    fprintf(L->events, "%s\n", json);
    fflush(L->events);
    if (strstr(json, "\"event\":\"error\"")) log_msg("worker reported: %s", json);
    if (strstr(json, "\"event\":\"job_done\"")) L->job_done = 1;
    if (strstr(json, "\"event\":\"fault_injected\"") && strstr(json, "\"kind\":\"netdown\"")) {
        L->netns.link_down = 1;
        L->netdown_epoch = L->coord ? coord_epoch(L->coord) : 0;
    }
    double epoch;
    if (strstr(json, "\"event\":\"comm_failure\"") && json_number(json, "epoch", &epoch) == 0 && L->coord)
        coord_comm_failure(L->coord, (long)epoch);
}

static void drain_outputs(Launcher *L) {
    while (ctl_drain(L->ctl, "events", 256, on_event, L) > 0) {
    }
    while (ctl_drain(L->ctl, "metrics", 256, on_metric, L) > 0) {
    }
    fflush(L->metrics);
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

/* Reaps exited children and tells the coordinator. Returns the number still running. */
static int reap_children(Launcher *L) {
    pid_t pid;
    int status;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        Child *c = find_child(L, pid);
        if (!c) continue;
        c->exited = 1;
        c->status = status;
        if (stop_signal || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) continue;
        char how[64];
        describe_exit(status, how, sizeof how);
        event_emit(L->ctl, L->t0_wall_ms, "process_exit", "\"pid\":%d,\"status\":\"%s\"", (int)pid, how);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 1) {
            log_msg("process %d stopped on a bad job (see the message above)", (int)pid);
            L->failed = 1; /* a configuration problem: every replacement would fail alike */
        } else {
            coord_child_exited(L->coord, pid, status);
        }
    }
    int running = 0;
    for (int i = 0; i < L->nchildren; i++)
        if (!L->children[i].exited) running++;
    return running;
}

/* Every child gets grace_ms to leave on its own, then SIGKILL; all are reaped. */
static void stop_children(Launcher *L, int grace_ms) {
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
        drain_outputs(L);
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

static void respawn_spares(Launcher *L, int n) {
    for (int i = 0; i < n && L->nchildren < MAX_CHILDREN; i++) {
        pid_t pid = spawn_process(L, -1);
        if (pid > 0) add_child(L, pid, -1);
    }
}

static void kill_all_children(Launcher *L) {
    for (int i = 0; i < L->nchildren; i++)
        if (!L->children[i].exited) kill(L->children[i].pid, SIGKILL);
    stop_children(L, 0);
    forget_children(L);
}

/* --ft disk: tear everything down and start a new incarnation of the job from the newest
 * checkpoint. 0, or -1 if that is not possible. */
static int restart_from_disk(Launcher *L) {
    Restart *r = &L->restart;
    char err[1024];
    r->rank = coord_unhandled_failure(L->coord, r->kind, sizeof r->kind, &r->t_fail_ms);
    r->last_step = L->last_step;
    ctl_state_set(L->ctl, "failed");
    kill_all_children(L);
    r->checkpoint = checkpoint_latest(L->run_cfg.out, err, sizeof err);
    if (r->checkpoint >= 0) {
        snprintf(L->run_cfg.resume, sizeof L->run_cfg.resume, "%s", L->run_cfg.out);
        L->run_cfg.resume_step = (int)r->checkpoint;
    }
    L->run_cfg.inject[0] = 0; /* injected faults fire once per run */
    L->run_cfg.chaos = 0.0f;
    log_msg("--ft disk: restarting every process from the checkpoint of step %lld", r->checkpoint + 1);
    event_emit(L->ctl, L->t0_wall_ms, "restart", "\"rank\":%d,\"kind\":\"%s\",\"checkpoint_step\":%lld", r->rank,
               r->kind, r->checkpoint + 1);
    drain_outputs(L);
    ctl_close(L->ctl);
    coord_free(L->coord);
    make_job_id(L->job, sizeof L->job);
    L->ctl = ctl_connect(&L->addr, L->job, 5000, err, sizeof err);
    L->coord = NULL;
    if (!L->ctl || publish_job(L, err, sizeof err) != 0) { log_msg("restart failed: %s", err); return -1; }
    L->coord = coord_create(L->ctl, &L->run_cfg, L->t0_wall_ms);
    if (!L->coord || spawn_all(L) != 0) return -1;
    r->pending = 1;
    r->count++;
    return 0;
}

static void supervise(Launcher *L) {
    while (!stop_signal && !L->failed && !L->job_done) {
        /* Exits first: a crash is known the moment waitpid says so. */
        if (reap_children(L) == 0) {
            log_msg("every process has exited before the job finished");
            L->failed = 1;
            break;
        }
        int used = 0;
        coord_state cs = coord_tick(L->coord, &used);
        drain_outputs(L);
        if (cs == COORD_FAILED && L->run_cfg.ft == FT_DISK && L->restart.count < 100) {
            if (restart_from_disk(L) == 0) continue;
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
        if (used && L->cfg->respawn_spares) respawn_spares(L, used);
        /* The link comes back once the cut-off worker has been replaced: it must find itself fenced. */
        if (L->netdown_epoch >= 0 && L->coord && coord_epoch(L->coord) > L->netdown_epoch) {
            netns_link_up(&L->netns);
            L->netdown_epoch = -1;
        }
        /* Events and metrics have no latency requirement: draining them when the coordinator
         * ticks (every 25 ms when all is well) is enough. */
        wait_for_children(L, coord_tick_due_ms(L->coord));
    }
    drain_outputs(L);
}

int launcher_run(const JobConfig *cfg) {
    static Launcher L;
    memset(&L, 0, sizeof L);
    L.cfg = cfg;
    L.run_cfg = *cfg;
    char err[1024];
    int rc = 1;
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
    log_set_role("deadpool");
    make_job_id(L.job, sizeof L.job);
    ssize_t self_len = readlink("/proc/self/exe", L.self_path, sizeof L.self_path - 1);
    if (self_len > 0) L.self_path[self_len] = 0;
    /* The control plane must stay responsive while the workers saturate every core: when
     * allowed (root), the launcher and its redis-server run at a higher priority. Workers
     * keep the default one. */
    if (setpriority(PRIO_PROCESS, 0, -5) != 0) { /* not permitted: run at the default priority */ }

    if (open_outputs(&L, err, sizeof err) != 0 || start_control_plane(&L, err, sizeof err) != 0 ||
        setup_netns(&L, err, sizeof err) != 0 || publish_job(&L, err, sizeof err) != 0) {
        log_msg("%s", err);
        goto out;
    }
    /* The program as a user reads it: arguments separated by spaces. */
    char program[sizeof cfg->program], program_esc[2 * sizeof cfg->program];
    snprintf(program, sizeof program, "%s", cfg->program);
    for (char *p = program; *p; p++)
        if (*p == DP_ARG_SEP) *p = ' ';
    json_escape(program, program_esc, sizeof program_esc);
    static const char *const ft_names[] = {"deadpool", "disk", "none"};
    event_emit(L.ctl, L.t0_wall_ms, "start", "\"job\":\"%s\",\"workers\":%d,\"spares\":%d,\"program\":\"%s\",\"steps\":%d,\"seed\":%llu",
               L.job, cfg->workers, cfg->spares, program_esc, cfg->steps, (unsigned long long)cfg->seed);
    log_msg("job %s: %d workers + %d spares, %d steps, out %s, ft %s, program: %s", L.job, cfg->workers, cfg->spares,
            cfg->steps, cfg->out, ft_names[cfg->ft], program);
    if (cfg->resume_step >= 0) {
        log_msg("resuming from the checkpoint of step %d in %s", cfg->resume_step + 1, cfg->resume);
        event_emit(L.ctl, L.t0_wall_ms, "resume", "\"step\":%d", cfg->resume_step + 1);
    }
    L.coord = coord_create(L.ctl, &L.run_cfg, L.t0_wall_ms);
    if (!L.coord || spawn_all(&L) != 0) {
        log_msg("cannot start worker processes: %s", strerror(errno));
        L.failed = 1;
    } else {
        supervise(&L);
    }

    const char *state = stop_signal ? "stopping" : L.failed ? "failed" : "done";
    ctl_state_set(L.ctl, state);
    /* After a failure nothing useful is left to finish: survivors may be blocked in a
     * collective with the dead rank, so they get SIGTERM at once. */
    if (L.failed)
        for (int i = 0; i < L.nchildren; i++)
            if (!L.children[i].exited) kill(L.children[i].pid, SIGTERM);
    stop_children(&L, 10000);
    int ok = !stop_signal && !L.failed && L.last_step == cfg->steps;
    if (stop_signal) log_msg("stopped by signal %d after step %d", (int)stop_signal, L.last_step);
    else if (ok) log_msg("done: %d steps, final loss %.4f, model in %s/model.bin", L.last_step, L.last_loss, cfg->out);
    else log_msg("job failed after step %d (see %s/events.jsonl)", L.last_step, cfg->out);
    /* CPU time of every worker and spare (all reaped by now): what the job cost the machine,
     * a steadier measure than wall time on a busy one. */
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    double cpu_s = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    event_emit(L.ctl, L.t0_wall_ms, "finish", "\"status\":\"%s\",\"steps\":%d,\"workers_cpu_s\":%.3f", ok ? "done" : state,
               L.last_step, cpu_s);
    drain_outputs(&L);
    rc = stop_signal ? 130 : ok ? 0 : 1;
out:
    forget_children(&L);
    netns_destroy(&L.netns);
    coord_free(L.coord);
    if (L.ctl && cfg->redis[0]) ctl_job_delete(L.ctl);
    if (L.ctl) ctl_close(L.ctl);
    if (L.server.pid > 0) redis_server_stop(&L.server, 3000);
    if (L.events) fclose(L.events);
    if (L.metrics) fclose(L.metrics);
    return rc;
}
