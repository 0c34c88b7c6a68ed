/* launcher_outputs.c — what the launcher writes: DIR/events.jsonl and metrics.jsonl from the
 * job's lists, the progress line and its ETA, the metrics it serves, the report. */
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
/* The command that continues this job from its checkpoints in out: a program other than the
 * built-in trainer is named again after -- (a checkpoint never names what runs). */
int lau_open_outputs(Launcher *L, char *err, size_t errlen) {
    char path[1200], why[1200];
    if (mkdir_p(L->cfg->out) != 0) {
        snprintf(err, errlen, "--out %.900s: cannot create directory: %s", L->cfg->out, strerror(errno));
        return -1;
    }
    /* Files are written into --out and its ckpt/ (and pruned there) as this user, root maybe:
     * only a directory nobody else can write is safe from links planted in it. */
    snprintf(path, sizeof path, "%s/ckpt", L->cfg->out);
    if (dir_is_private(L->cfg->out, why, sizeof why) != 0 ||
        (access(path, F_OK) == 0 && dir_is_private(path, why, sizeof why) != 0)) {
        snprintf(err, errlen, "--out %.900s", why);
        return -1;
    }
    /* One job per output directory: a second one would interleave its files with ours. */
    snprintf(path, sizeof path, "%s/.lock", L->cfg->out);
    L->lock_fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (L->lock_fd < 0) {
        snprintf(err, errlen, "--out %.900s/.lock: cannot open: %s", L->cfg->out, strerror(errno));
        return -1;
    }
    if (flock(L->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        snprintf(err, errlen, "--out %.900s is in use by another running job (locked .lock)", L->cfg->out);
        return -1;
    }
    /* A resumed job continues its predecessor's logs. */
    int append = L->cfg->resume_step >= 0;
    snprintf(path, sizeof path, "%s/events.jsonl", L->cfg->out);
    L->events = lau_open_log(path, append);
    if (L->events) {
        snprintf(path, sizeof path, "%s/metrics.jsonl", L->cfg->out);
        L->metrics = lau_open_log(path, append);
    }
    if (!L->events || !L->metrics) {
        if (errno == ELOOP) snprintf(err, errlen, "%.900s: is a symbolic link; refused (no link in --out is followed)", path);
        else snprintf(err, errlen, "%.900s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, "%s/model.bin", L->cfg->out);
    unlink(path); /* a stale model must never pass for this run's result */
    return 0;
}

/* Starts one process of the job: the job's program (the built-in trainer is this executable's
 * `train` command), the job handed over in the environment; the netdown rank runs inside its
 * network namespace. */
pid_t lau_spawn_process(Launcher *L, int rank, long proc) {
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
                    .bind_host = L->netns.active ? (in_ns ? L->netns.ns_addr : L->netns.host_addr)
                                 : L->bind_addr[0] ? L->bind_addr : NULL,
                    .node = L->node_id, .out = L->cfg->nnodes > 0 ? L->cfg->out : NULL,
                    .resume = L->cfg->nnodes > 0 && L->cfg->resume[0] ? L->cfg->resume : NULL, .proc = proc};
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0) return pid;
    worker_env_set(&a);
    /* Own process group: Ctrl-C reaches only the launcher, which stops the job in order.
     * Workers run at the default priority, below the control plane's. */
    setpgid(0, 0);
    if (setpriority(PRIO_PROCESS, 0, 0) != 0) { /* keep the inherited one */ }
    /* A spare starts (imports its framework, builds its model) at the lowest priority, so that
     * a replacement started during a recovery takes no CPU the job needs; it returns to the
     * default when it takes a rank (rt_priority_default). Only where it may go back up. */
    struct rlimit nl;
    if (rank < 0 && (geteuid() == 0 || (getrlimit(RLIMIT_NICE, &nl) == 0 && nl.rlim_cur >= 20)))
        if (setpriority(PRIO_PROCESS, 0, 19) != 0) { /* keep the default */ }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* Slurm's signal (--signal=USR1@T, scancel --signal=USR1) reaches every process of the
     * step: the launcher keeps the work (lau_keep_on_stop); the processes must live on for it. */
    if (L->cfg->slurm) signal(SIGUSR1, SIG_IGN);
    if (in_ns) setenv("DEADPOOL_NETDOWN_IF", L->netns.ns_if, 1);
    execvp(argv[0], argv);
    fprintf(stderr, "[deadpool] cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(DP_EXIT_BAD_JOB);
}

/* A number member of o into *out. 0, or -1 (absent or not a number: *out unchanged). */
int lau_jnum(const json_t *o, const char *key, double *out) {
    const json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) return -1;
    *out = json_number_value(v);
    return 0;
}

/* A string member of o into out ("" when absent). */
static void jtext(const json_t *o, const char *key, char *out, size_t len) {
    const char *v = json_string_value(json_object_get(o, key));
    snprintf(out, len, "%s", v ? v : "");
}

/* Seconds until the last step at the pace of the newest ETA_WINDOW steps (a rollback starts
 * the window again); -1 while unknown. */
static double update_eta(Launcher *L, double step, double t) {
    if (L->eta_n > 0 && step <= L->eta_step[(L->eta_n - 1) % ETA_WINDOW]) L->eta_n = 0;
    L->eta_step[L->eta_n % ETA_WINDOW] = step;
    L->eta_t[L->eta_n % ETA_WINDOW] = t;
    L->eta_n = L->eta_n < 1 << 30 ? L->eta_n + 1 : ETA_WINDOW + L->eta_n % ETA_WINDOW + 1;
    if (L->eta_n < 2) return -1;
    int old = L->eta_n <= ETA_WINDOW ? 0 : L->eta_n % ETA_WINDOW;
    double ds = step - L->eta_step[old], dt = t - L->eta_t[old], left = L->cfg->steps - step;
    if (ds <= 0 || dt < 0) return -1;
    return left > 0 ? left * dt / ds : 0;
}

static void eta_text(double s, char *out, size_t len) {
    if (s < 0 || s != s) snprintf(out, len, "--:--");
    else if (s > 359999) snprintf(out, len, ">99h");
    else if (s < 3600) snprintf(out, len, "%d:%02d", (int)s / 60, (int)s % 60);
    else snprintf(out, len, "%d:%02d:%02d", (int)s / 3600, (int)s / 60 % 60, (int)s % 60);
}

/* The progress line of one step, and the step's numbers for /metrics. */
void lau_observe_metric(Launcher *L, const json_t *o, double step, double loss, double ms, double tps, double t) {
    LiveMetrics *m = &L->live;
    double committed = -1, epoch = m->epoch, wait = 0, lr = NAN, gn = NAN;
    lau_jnum(o, "committed_step", &committed);
    lau_jnum(o, "epoch", &epoch);
    lau_jnum(o, "snapshot_wait_ms", &wait);
    lau_jnum(o, "lr", &lr);
    lau_jnum(o, "grad_norm", &gn);
    m->step = step;
    m->loss = loss;
    m->step_ms = ms;
    m->tokens_per_s = tps;
    m->t = t;
    m->committed_step = committed;
    m->epoch = epoch;
    m->snapshot_wait_ms = wait;
    m->lr = lr;
    m->grad_norm = gn;
    m->snapshot_wait_ms_total += wait;
    m->steps_reported += 1;
    m->eta_s = update_eta(L, step, t);
    char eta[16], spares[40], comm[24];
    eta_text(m->eta_s, eta, sizeof eta);
    if (m->spares_available >= 0) snprintf(spares, sizeof spares, "%d", (int)m->spares_available);
    else snprintf(spares, sizeof spares, "?");
    if (L->spares_failed) snprintf(spares + strlen(spares), sizeof spares - strlen(spares), " (%d failed)", L->spares_failed);
    if (committed >= 1) snprintf(comm, sizeof comm, "%d", (int)committed);
    else snprintf(comm, sizeof comm, "-");
    char loss_text[24];
    if (isnan(loss)) snprintf(loss_text, sizeof loss_text, "     -");
    else snprintf(loss_text, sizeof loss_text, "%.4f", loss);
    printf("step %5d/%d | loss %s | %8.0f tok/s | %8.1f ms/step | committed %5s | spares %s | ETA %s | %7.1f s\n",
           (int)step, L->cfg->steps, loss_text, tps, ms, comm, spares, eta, t);
}

/* One line per recovery with its phases (the timeline of the `recovered` event), and the
 * recovery's numbers for /metrics. */
static void observe_recovery(Launcher *L, const json_t *o) {
    LiveMetrics *m = &L->live;
    static const char *const keys[] = {"detect_ms", "decide_ms", "restore_ms", "rebuild_ms", "resnapshot_ms"};
    static const char *const names[] = {"detect", "decide", "restore", "rebuild", "re-snapshot"};
    double rank = -1, spare = -1, rollback = 0, total = NAN, first = NAN, recomputed = 0;
    char kind[32], mode[32], line[1024];
    jtext(o, "failure_kind", kind, sizeof kind);
    jtext(o, "mode", mode, sizeof mode);
    lau_jnum(o, "rank", &rank);
    lau_jnum(o, "spare", &spare);
    lau_jnum(o, "rollback_step", &rollback);
    lau_jnum(o, "total_ms", &total);
    lau_jnum(o, "first_step_done_ms", &first);
    lau_jnum(o, "steps_recomputed", &recomputed);
    live_kind_add(m->recoveries, kind);
    m->last_recovery_ms = total;
    m->steps_recomputed_total += recomputed > 0 ? recomputed : 0;
    int n = snprintf(line, sizeof line, "[deadpool] recovery of rank %d (%s", (int)rank, kind[0] ? kind : "?");
    if (!strcmp(mode, "restart")) n += snprintf(line + n, sizeof line - (size_t)n, ", whole job restarted from disk");
    else if (spare >= 0) n += snprintf(line + n, sizeof line - (size_t)n, ", spare %d", (int)spare);
    n += snprintf(line + n, sizeof line - (size_t)n, "):");
    const char *sep = " ";
    for (int i = 0; i < 5; i++) {
        double v = NAN;
        lau_jnum(o, keys[i], &v);
        m->last_recovery_phase_ms[i] = v;
        if (v != v || (size_t)n >= sizeof line) continue;
        n += snprintf(line + n, sizeof line - (size_t)n, "%s%s %.1f", sep, names[i], v);
        sep = " + ";
    }
    m->last_recovery_phase_ms[LIVE_PHASES - 1] = first == first && total == total ? first - total : NAN;
    static const char *const conn_keys[LIVE_CONN_KINDS] = {"survivor_connections_max", "replacement_connections_max",
                                                           "connections_total"};
    for (int i = 0; i < LIVE_CONN_KINDS; i++) {
        double v = NAN;
        lau_jnum(o, conn_keys[i], &v);
        m->last_recovery_connections[i] = v >= 0 ? v : NAN; /* -1: none of that kind reported */
    }
    if ((size_t)n < sizeof line)
        n += snprintf(line + n, sizeof line - (size_t)n, "%s-> resumed after %.0f ms, first step done at %.0f ms; rolled "
                      "back to step %d, %d step%s recomputed", *sep == ' ' && sep[1] == '+' ? " ms " : " ", total, first,
                      (int)rollback, (int)recomputed, recomputed == 1 ? "" : "s");
    const double *cn = m->last_recovery_connections;
    if ((size_t)n < sizeof line && cn[2] == cn[2] && cn[0] == cn[0])
        snprintf(line + n, sizeof line - (size_t)n, "; %.0f data-plane connections made, at most %.0f by a survivor", cn[2],
                 cn[0]);
    printf("%s\n", line);
    fflush(stdout);
}

/* Events that change what /metrics or the progress line report. */
static void observe_event(Launcher *L, const json_t *o) {
    LiveMetrics *m = &L->live;
    char ev[64], kind[32];
    jtext(o, "event", ev, sizeof ev);
    if (!strcmp(ev, "failure") || !strcmp(ev, "restart")) {
        jtext(o, "kind", kind, sizeof kind);
        live_kind_add(m->failures, kind);
    } else if (!strcmp(ev, "recovered")) {
        observe_recovery(L, o);
    } else if (!strcmp(ev, "snapshot_stats")) {
        double copied = 0, replicated = 0, captures = 0;
        lau_jnum(o, "bytes_copied", &copied);
        lau_jnum(o, "bytes_replicated", &replicated);
        lau_jnum(o, "captures", &captures);
        m->snapshot_bytes_copied += copied;
        m->snapshot_bytes_replicated += replicated;
        m->snapshot_generations += captures;
    } else if (!strcmp(ev, "error")) {
        char msg[1024];
        jtext(o, "message", msg, sizeof msg);
        log_msg("worker reported: %s", msg);
    }
    if (!strncmp(ev, "spare_", 6) || !strcmp(ev, "decision")) L->spares_checked_ms = 0;
}

/* Counts the spare pool now and then (one Redis round trip) and hands /metrics the newest numbers. */
static void publish_live(Launcher *L) {
    double now = now_ms();
    if (L->ctl && now - L->spares_checked_ms >= 250) {
        long n = ctl_spare_count(L->ctl);
        if (n >= 0) L->live.spares_available = (double)n;
        L->spares_checked_ms = now;
    }
    metrics_server_publish(L->metrics_srv, &L->live);
}

/* --report: `deadpool report OUT`, in a process of its own, once the logs are closed. */
void lau_write_report(Launcher *L) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        execl(L->self_path, L->self_path, "report", L->cfg->out, (char *)NULL);
        fprintf(stderr, "[deadpool] cannot run %s report: %s\n", L->self_path, strerror(errno));
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        log_msg("--report: no report was written (see above; `deadpool report %s` tries again)", L->cfg->out);
}

/* Once the job is two steps past its resumed step every rank has restored (a rollback goes to
 * a newer generation from then on): the state files served from this machine's disk can go. */
static void resumed_states_done(Launcher *L, double step) {
    if (!L->shards || step < L->run_cfg.resume_step + 3) return;
    replica_server_stop(L->shards);
    L->shards = NULL;
}

StepLine lau_take_metric(Launcher *L, const char *json, const json_t *o) {
    StepLine s = {0};
    fprintf(L->metrics, "%s\n", json);
    lau_jnum(o, "step", &s.step);
    s.loss = NAN; /* absent: the loop reports none */
    int has_loss = lau_jnum(o, "loss", &s.loss) == 0;
    lau_jnum(o, "step_ms", &s.ms);
    lau_jnum(o, "tokens_per_s", &s.tps);
    lau_jnum(o, "t", &s.t);
    L->last_step = (int)s.step;
    L->have_loss = has_loss;
    L->last_loss = (float)s.loss;
    resumed_states_done(L, s.step);
    return s;
}

static void on_metric(const char *json, void *arg) {
    Launcher *L = arg;
    json_t *o = lau_json_line(json);
    if (!o) {
        log_msg("a metrics line that is not a JSON object: %.200s", json);
        return;
    }
    StepLine s = lau_take_metric(L, json, o);
    if (L->coord) coord_progress(L->coord, (int)s.step);
    if (L->restart.pending) {
        Restart *r = &L->restart;
        r->pending = 0;
        /* Training resumed when this first step started. */
        long long done = (long long)(wall_ms() - r->t_fail_ms), resumed = done - (long long)s.ms;
        event_emit(L->ctl, L->t0_wall_ms, "recovered",
                   "\"mode\":\"restart\",\"rank\":%d,\"failure_kind\":\"%s\",\"rollback_step\":%lld,"
                   "\"total_ms\":%lld,\"first_step_done_ms\":%lld,\"steps_recomputed\":%lld",
                   r->rank, r->kind, r->checkpoint + 1, resumed, done, (long long)r->last_step - (r->checkpoint + 1));
        printf("[deadpool] restarted the whole job from the checkpoint of step %lld: training resumed %lld ms after "
               "the failure\n", r->checkpoint + 1, resumed);
    }
    lau_observe_metric(L, o, s.step, s.loss, s.ms, s.tps, s.t);
    json_decref(o);
    fflush(stdout);
}

/* An event line: logged to events.jsonl and observed for /metrics and the progress lines.
 * Nothing is decided from it: decisions come from reports (on_report). */
static void on_event(const char *json, void *arg) {
    Launcher *L = arg;
    fprintf(L->events, "%s\n", json);
    fflush(L->events);
    json_t *o = lau_json_line(json);
    if (o) observe_event(L, o);
    json_decref(o);
}

/* A typed report from a process (recovery.h): what the launcher and its coordinator act on. */
static void on_report(const char *text, void *arg) {
    Launcher *L = arg;
    Report r;
    char err[256];
    if (report_parse(text, strlen(text), &r, err, sizeof err) != 0) {
        log_msg("a process sent a malformed report (%s): ignored", err);
        return;
    }
    switch (r.kind) {
    case REPORT_COMM_FAILURE:
        if (L->coord) coord_comm_failure(L->coord, r.epoch, r.t_wall_ms); /* when the member saw it */
        break;
    case REPORT_JOIN_FAILED:
        if (L->coord) coord_join_failed(L->coord, r.epoch, r.rank, r.phase == JOIN_RESTORE, r.text);
        break;
    case REPORT_RECOVERED: lau_respawn_now(L); break;
    case REPORT_DIVERGED: /* the job cannot go on: say why and stop */
        log_msg("%s", r.text);
        L->failed = 1;
        break;
    case REPORT_JOB_DONE: L->job_done = 1; break;
    case REPORT_MODEL_SAVED: /* the final line says where the model really went (elsewhere after a full disk) */
        snprintf(L->model_path, sizeof L->model_path, "%s", r.text);
        break;
    case REPORT_LINK_DOWN:
        L->netns.link_down = 1;
        L->netdown_epoch = L->coord ? coord_epoch(L->coord) : 0;
        break;
    case REPORT_KINDS: break;
    }
}

/* The control plane answers again after an outage: what the launcher owns there is written
 * again, for a Redis that came back empty (restarted without persistence) or older (a replica
 * promoted before it had the last writes): its key, the job's config, start time and
 * state, and the process counter (an id is never handed out twice). The coordinator and
 * every process republish theirs. */
static void republish_job(Launcher *L) {
    if (!L->coordinating || !L->job_key[0]) return;
    L->beat_ms = 0;
    lau_launcher_beat(L);
    long long max_proc = 0;
    for (int i = 0; i < L->nchildren; i++)
        if (L->children[i].proc > max_proc) max_proc = L->children[i].proc;
    int ok = L->beat_ms && lau_write_job_keys(L) == 0 && ctl_proc_ids_at_least(L->ctl, max_proc + 1000) == 0; /* spares joined by hand drew ids too */
    ctl_wait_replica(L->ctl, 1000);
    log_msg("the control plane answers again: the job's keys are %s", ok ? "republished" : "not all republished (tried again)");
    if (!ok) L->redis_failing_since = L->redis_failing_since ? L->redis_failing_since : now_ms();
}

void lau_control_plane_lost(Launcher *L, const char *why) {
    L->redis_lost = 1;
    log_msg("the control plane is lost (%s): no failure can be handled any more; the workers keep their "
            "committed state on disk and stop", why);
}

void lau_drain_outputs(Launcher *L) {
    int n;
    if (!L->coordinating) return; /* the job's lists are the coordinating machine's to drain */
    while ((n = ctl_drain(L->ctl, KEY_REPORTS, 256, on_report, L)) > 0) {
    }
    while (n >= 0 && (n = ctl_drain(L->ctl, KEY_EVENTS, 256, on_event, L)) > 0) {
    }
    /* Redis unreachable: training goes on (it needs Redis only to handle a failure). A failure
     * meanwhile waits --control-wait for it; after that the control plane is lost: the workers
     * keep their committed state on disk and stop. Back: the job's keys are republished. */
    if (n < 0 && !L->redis_lost) {
        if (L->redis_failing_since == 0) {
            L->redis_failing_since = now_ms();
            L->redis_failing_wall = wall_ms();
        }
        char kind[16];
        int64_t t_fail = 0;
        if (L->coord && coord_unhandled_failure(L->coord, kind, sizeof kind, &t_fail) >= 0) {
            int64_t since = t_fail > L->redis_failing_wall ? t_fail : L->redis_failing_wall;
            if (wall_ms() - since > job_control_outage_ms(L->cfg)) {
                char why[700];
                snprintf(why, sizeof why, "a failure waited %d s for it: %s", L->cfg->control_wait, ctl_last_error(L->ctl));
                lau_control_plane_lost(L, why);
            }
        }
    } else if (n >= 0 && L->redis_failing_since) {
        L->redis_failing_since = 0;
        republish_job(L);
    }
    while (ctl_drain(L->ctl, KEY_METRICS, 256, on_metric, L) > 0) {
    }
    fflush(L->metrics);
    publish_live(L);
}
