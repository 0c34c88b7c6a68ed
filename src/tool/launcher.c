/* launcher.c — the `deadpool run` process: job setup, child processes, output files, teardown. */
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
volatile sig_atomic_t lau_stop_signal;

static void on_stop_signal(int sig) { lau_stop_signal = sig; }

void lau_make_job_id(char *out, size_t len) {
    unsigned char b[4] = {0};
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        uint64_t x = (uint64_t)wall_ms() ^ (uint64_t)getpid();
        memcpy(b, &x, sizeof b);
    }
    snprintf(out, len, "%02x%02x%02x%02x", b[0], b[1], b[2], b[3]);
}

/* --redis-ha: a replica of the embedded master and three sentinels watching it, all on
 * loopback with the job's password; addr becomes the sentinels' (quorum 2). 0 / -1 + err. */
static int start_ha(Launcher *L, redis_addr *addr, char *err, size_t errlen) {
    snprintf(L->ha_dir, sizeof L->ha_dir, "%s", L->run_dir); /* 0700: the sentinels' files hold the password */
    if (redis_server_start_replica(&L->ha[0], &L->server, L->ha_dir, 5000, err, errlen) != 0) return -1;
    /* A replica promoted before it has synchronised would bring an empty control plane. */
    if (redis_server_replica_synced(&L->ha[0], 20000) != 0) {
        snprintf(err, errlen, "--redis-ha: the replica did not synchronise with the master within 20 s");
        return -1;
    }
    addr->nsentinels = 3;
    snprintf(addr->master, sizeof addr->master, "%s", HA_MASTER);
    for (int i = 0; i < 3; i++) {
        if (redis_server_start_sentinel(&L->ha[1 + i], &L->server, L->ha_dir, HA_MASTER, 5000, err, errlen) != 0) return -1;
        snprintf(addr->sentinel_host[i], sizeof addr->sentinel_host[i], "127.0.0.1");
        addr->sentinel_port[i] = L->ha[1 + i].port;
    }
    if (sentinel_wait_ready(addr, 20000, err, errlen) != 0) return -1;
    log_msg("control plane: embedded Redis with Sentinel: master 127.0.0.1:%d (pid %d), replica :%d (pid %d), sentinels "
            ":%d (pid %d) :%d (pid %d) :%d (pid %d) in %s", L->server.port, L->server.pid, L->ha[0].port, L->ha[0].pid,
            L->ha[1].port, L->ha[1].pid, L->ha[2].port, L->ha[2].pid, L->ha[3].port, L->ha[3].pid, L->ha_dir);
    return 0;
}

static void stop_ha(Launcher *L) {
    for (int i = 0; i < 4; i++) redis_server_stop(&L->ha[i], 3000);
    if (!L->ha_dir[0]) return;
    DIR *d = opendir(L->ha_dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char p[sizeof L->ha_dir + 260];
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", L->ha_dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(L->ha_dir);
}

/* The secret the job's machines share, never kept in Redis (secret.h): DEADPOOL_JOB_SECRET
 * under Slurm, --secret-file (JobConfig.job_secret), or for a job on this machine alone one
 * drawn now and left in run_dir/secret for spares started by hand. 0 / -1 + err. */
static int choose_job_secret(Launcher *L, char *err, size_t errlen) {
    const char *shared = L->cfg->job_secret ? L->cfg->job_secret : L->cfg->slurm ? getenv(SLURM_SECRET_ENV) : NULL;
    if (shared) {
        if (strlen(shared) < JOB_SECRET_MIN || strlen(shared) > JOB_SECRET_MAX) {
            snprintf(err, errlen, "the job's secret (%s) has %zu characters: expected %d to %d",
                     L->cfg->job_secret ? "--secret-file" : SLURM_SECRET_ENV, strlen(shared), JOB_SECRET_MIN,
                     JOB_SECRET_MAX);
            return -1;
        }
        snprintf(L->shared, sizeof L->shared, "%s", shared);
        return 0;
    }
    if (L->cfg->nnodes > 0 || L->cfg->slurm) {
        snprintf(err, errlen, "the machines of a job share its secret, and Redis never holds it: give every machine "
                 "the same --secret-file FILE (mode 0600; e.g. head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > "
                 "FILE)%s", L->cfg->slurm ? ", or export " SLURM_SECRET_ENV " before srun" : "");
        return -1;
    }
    if (replica_secret_new(L->shared, sizeof L->shared) != 0) {
        snprintf(err, errlen, "cannot draw the job's secret (libsodium)");
        return -1;
    }
    snprintf(L->secret_file, sizeof L->secret_file, "%s/secret", L->run_dir);
    if (private_line_write(L->secret_file, L->shared, err, errlen) != 0) return -1;
    setenv(DP_ENV_SECRET_FILE, L->secret_file, 1);
    return 0;
}

/* The job key of this job's name (a --ft disk restart takes a new one): for L->ctl's sealed
 * values, and in DEADPOOL_JOB_KEY for every process this launcher starts. 0 / -1 + err. */
int lau_set_job_key(Launcher *L, char *err, size_t errlen) {
    if (job_key_from_secret(L->shared, L->job, L->job_key, err, errlen) != 0) return -1;
    setenv(DP_ENV_JOB_KEY, L->job_key, 1); /* children inherit it; never on a command line */
    return ctl_set_job_key(L->ctl, L->job_key);
}

static int start_control_plane(Launcher *L, char *err, size_t errlen) {
    redis_addr addr;
    int swept = run_dir_sweep(); /* what launchers killed with -9 left in /tmp */
    if (swept > 0) log_msg("removed %d private director%s of launchers that are gone", swept, swept > 1 ? "ies" : "y");
    if (run_dir_create(L->run_dir, sizeof L->run_dir, err, errlen) != 0) return -1;
    if (choose_job_secret(L, err, errlen) != 0) return -1;
    if (L->cfg->redis[0]) {
        if (redis_addr_parse(L->cfg->redis, &addr, err, errlen) != 0) return -1;
        char shown[4200];
        redis_addr_format(&addr, shown, sizeof shown);
        log_msg("control plane: %s", shown);
    } else if (L->cfg->slurm && L->cfg->slurm_env) { /* the job brings it: on its first nodes */
        redis_server sentinels[3];
        if (slurm_control_plane(L->cfg->slurm_env, L->job, getenv(SLURM_SECRET_ENV), &L->server, &L->ha[0], sentinels,
                                L->ha_dir, sizeof L->ha_dir, &addr, err, errlen) != 0)
            return -1;
        memcpy(&L->ha[1], sentinels, sizeof sentinels);
        signal(SIGUSR1, on_stop_signal); /* the servers started ignoring it (launcher_run) */
        unsetenv(SLURM_SECRET_ENV); /* the processes get the password, not the secret */
        char here[96] = "";
        const char *parts[] = {L->server.pid ? "the master" : NULL, L->ha[0].pid ? "the replica" : NULL,
                               L->ha[1].pid || L->ha[2].pid || L->ha[3].pid ? "a sentinel" : NULL};
        for (int i = 0; i < 3; i++)
            if (parts[i]) snprintf(here + strlen(here), sizeof here - strlen(here), "%s%s", here[0] ? ", " : "", parts[i]);
        log_msg("control plane: Redis master on %s, replica on %s, sentinels on %s:%d %s:%d %s:%d (this node runs %s)",
                L->cfg->slurm_env->hosts[slurm_plane_master(L->cfg->slurm_env)],
                L->cfg->slurm_env->hosts[slurm_plane_replica(L->cfg->slurm_env)],
                addr.sentinel_host[0], addr.sentinel_port[0], addr.sentinel_host[1], addr.sentinel_port[1],
                addr.sentinel_host[2], addr.sentinel_port[2], here[0] ? here : "none of it");
        if (sentinel_wait_ready(&addr, L->cfg->start_timeout_ms, err, errlen) != 0) return -1;
    } else {
        /* Only this user can reach a server on a socket in run_dir. Sentinel and the netdown
         * rank (behind a link that is cut) need TCP: loopback, with the password. */
        int tcp = L->cfg->redis_ha || inject_netdown_rank(L->cfg->inject) >= 0;
        if ((tcp ? redis_server_start(&L->server, 5000, err, errlen)
                 : redis_server_start_private(&L->server, L->run_dir, 5000, err, errlen)) != 0)
            return -1;
        memset(&addr, 0, sizeof addr);
        snprintf(addr.host, sizeof addr.host, "%s", tcp ? "127.0.0.1" : L->server.sock);
        addr.port = L->server.port;
        snprintf(addr.password, sizeof addr.password, "%s", L->server.password);
        if (!L->cfg->redis_ha && tcp)
            log_msg("control plane: embedded redis-server on 127.0.0.1:%d (pid %d, password hidden)", addr.port,
                    L->server.pid);
        else if (!L->cfg->redis_ha)
            log_msg("control plane: embedded redis-server on %s (pid %d, password hidden; only this user can connect)",
                    addr.host, L->server.pid);
        else if (start_ha(L, &addr, err, errlen) != 0)
            return -1;
    }
    redis_addr_format(&addr, L->url, sizeof L->url);
    /* Children inherit the secret through the environment, never through argv (visible in ps). */
    if (addr.password[0]) setenv("DEADPOOL_REDIS_PASSWORD", addr.password, 1);
    /* ... and a spare started by hand reads it from a file only this user can read. */
    if (redis_file_write(&addr, L->run_dir, L->redis_file, sizeof L->redis_file, err, errlen) != 0) return -1;
    setenv(DP_ENV_REDIS_FILE, L->redis_file, 1);
    L->addr = addr;
    L->ctl = ctl_connect(&addr, L->job, 5000, err, errlen);
    if (!L->ctl || lau_set_job_key(L, err, errlen) != 0) return -1;
    /* Every call of the supervising loop is bounded by a second: a stalled Redis does not hold
     * up the reaping of children, and an outage is measured to about that. */
    ctl_set_timeout(L->ctl, 1000);
    int64_t offset;
    if (ctl_clock_offset(L->ctl, &offset) == 0) wall_clock_offset_set(offset); /* the job's one clock */
    /* A Redis shared between jobs: sweep what launchers killed with -9 left behind. */
    int orphans = L->cfg->redis[0] ? ctl_orphan_jobs_delete(L->ctl, ORPHAN_GRACE_MS) : 0;
    if (orphans > 0) log_msg("removed the keys of %d job(s) whose launcher and processes are gone", orphans);
    return 0;
}

/* The launcher key's life: renewed every LAUNCHER_BEAT_MS, so only a launcher gone (or stopped)
 * for this long lets processes joining from outside, and other jobs' janitors, see the job
 * as orphaned. */
int lau_launcher_ttl_ms(const JobConfig *cfg) {
    int ttl = 4 * cfg->detect_timeout_ms;
    return ttl < 10000 ? 10000 : ttl;
}

void lau_launcher_beat(Launcher *L) {
    double now = now_ms();
    if (L->beat_ms && now - L->beat_ms < LAUNCHER_BEAT_MS) return;
    char who[LAUNCHER_ID_TEXT_MAX];
    LauncherId me = {.pid = (int)getpid()};
    gethostname(me.host, sizeof me.host - 1);
    for (char *h = me.host; *h; h++) /* a host name has none; the format refuses them */
        if ((unsigned char)*h <= ' ' || *h == 0x7f) *h = '_';
    if (launcher_id_format(&me, who, sizeof who) == 0 && ctl_launcher_beat(L->ctl, who, lau_launcher_ttl_ms(L->cfg)) == 0)
        L->beat_ms = now;
}

/* KEY_NODE_ALIVE lives a sixteenth of the detect timeout (node_alive_ttl_ms) and is renewed
 * four times as often. Its expiry is how a machine's crash is noticed when no peer is in a
 * collective with it (the coordinator probes the machine's ranks then), and why a machine cut
 * off or hung is failed as a whole: when its first rank's heartbeat (a whole detect timeout)
 * expires, the machine's key has long expired (decide_nodes_lost). */
void lau_node_beat(Launcher *L) {
    if (L->cfg->nnodes == 0) return; /* one machine: its coordinator is its launcher */
    double now = now_ms();
    int ttl = node_alive_ttl_ms(L->cfg);
    if (L->node_beat_ms && now - L->node_beat_ms < (ttl / 4 > 0 ? ttl / 4 : 1)) return;
    if (ctl_node_beat(L->ctl, L->node_index, ttl) == 0) L->node_beat_ms = now;
}

void lau_node_event(Launcher *L, const char *name, const char *fmt, ...) {
    char fields[2048], json[2600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fields, sizeof fields, fmt, ap);
    va_end(ap);
    snprintf(json, sizeof json, "{\"event\":\"%s\",\"t\":%.3f,\"node\":%d,%s}", name,
             (double)(wall_ms() - L->t0_wall_ms) / 1e3, L->node_index, fields);
    ctl_push_event(L->ctl, json);
    if (L->events && !L->coordinating) { /* the first machine's own copy comes from the job's list */
        fprintf(L->events, "%s\n", json);
        fflush(L->events);
    }
}

/* What the launcher owns in the job's hash, written at the start and again after an outage:
 * the config text and the start time (sealed, ctl_config_set) and the state "running". 0 / -1. */
int lau_write_job_keys(Launcher *L) {
    char text[JOB_CONFIG_TEXT_MAX], t0[32];
    if (job_config_serialize(&L->run_cfg, text, sizeof text) != 0) return -1;
    proto_int_format((long long)L->t0_wall_ms, t0, sizeof t0);
    return ctl_config_set(L->ctl, CFG_CONFIG, text) == 0 &&
                   ctl_config_set(L->ctl, CFG_T0_MS, t0) == 0 && ctl_state_set(L->ctl, JOB_STATE_RUNNING) == 0
               ? 0
               : -1;
}

int lau_publish_job(Launcher *L, char *err, size_t errlen) {
    char text[JOB_CONFIG_TEXT_MAX];
    if (job_config_serialize(&L->run_cfg, text, sizeof text) != 0) { snprintf(err, errlen, "job config too large"); return -1; }
    if (!L->t0_wall_ms) L->t0_wall_ms = wall_ms();
    /* The launcher key first: a janitor of another job must never see our config without it. */
    L->beat_ms = 0;
    lau_launcher_beat(L);
    if (!L->beat_ms || lau_write_job_keys(L) != 0) {
        snprintf(err, errlen, "publishing the job to redis failed: %s", ctl_last_error(L->ctl));
        return -1;
    }
    ctl_wait_replica(L->ctl, 1000); /* under Sentinel: the job survives a failover from its start */
    return 0;
}

/* A log of the job in --out, opened following no link (O_NOFOLLOW): continued (append) or
 * started afresh. NULL + errno. */
FILE *lau_open_log(const char *path, int append) {
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
    FILE *f = fd >= 0 ? fdopen(fd, append ? "a" : "w") : NULL;
    if (fd >= 0 && !f) close(fd);
    return f;
}

/* --- the launcher's run: start, the roles, the end ----------------------------------------
 * launcher_run: launcher_init (signals, ids, --metrics-port), launcher_start (outputs, the
 * control plane, joining the job), the role's own start (coordinator_start / follower_start),
 * the role loop (lau_run_roles), the end of the role the job ended in (coordinator_finish /
 * follower_finish), launcher_cleanup. */

/* What precedes the job's files: a failure here has nothing to clean up. 0 / -1 (said). */
static int launcher_init(Launcher *L, const JobConfig *cfg) {
    char err[1024];
    memset(L, 0, sizeof *L);
    L->cfg = cfg;
    L->run_cfg = *cfg;
    L->lock_fd = -1;
    L->last_step = cfg->resume_step + 1; /* resuming a finished job has no step left to run */
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
    /* Under Slurm, USR1 is the job's "time is nearly up" (sbatch/srun --signal=USR1@T): like
     * SIGTERM it keeps the work. Ignored until the control plane's servers have started (they
     * inherit the ignoring: Slurm sends it to every process of the step). */
    if (cfg->slurm) signal(SIGUSR1, cfg->redis[0] ? on_stop_signal : SIG_IGN);
    log_set_role("deadpool");
    if (cfg->nnodes > 0) snprintf(L->job, sizeof L->job, "%s", cfg->job);
    else lau_make_job_id(L->job, sizeof L->job);
    if (cfg->node_id[0]) {
        snprintf(L->node_id, sizeof L->node_id, "%s", cfg->node_id);
        node_id_clean(L->node_id);
    } else if (node_id_default(L->node_id, sizeof L->node_id) != 0 && cfg->nnodes > 0) {
        log_msg("--nnodes: cannot read this machine's boot id (/proc/sys/kernel/random/boot_id): give --node-id");
        return -1;
    }
    ssize_t self_len = readlink("/proc/self/exe", L->self_path, sizeof L->self_path - 1);
    if (self_len > 0) L->self_path[self_len] = 0;
    /* The control plane must stay responsive while the workers saturate every core: when
     * allowed (root), the launcher and its redis-server run at a higher priority. Workers
     * keep the default one. */
    if (setpriority(PRIO_PROCESS, 0, -5) != 0) { /* not permitted: run at the default priority */ }

    live_metrics_init(&L->live);
    snprintf(L->live.job, sizeof L->live.job, "%s", L->job);
    L->live.workers = cfg->workers;
    L->live.spares_configured = cfg->spares;
    L->live.steps_target = cfg->steps;
    /* --metrics-port first: an address in use stops the job before it starts anything. */
    if (cfg->metrics_port > 0 && !(L->metrics_srv = metrics_server_start(cfg->bind, cfg->metrics_port, err, sizeof err))) {
        log_msg("--metrics-port: %s", err);
        return -1;
    }
    return 0;
}

/* The job's files, the control plane, and this machine's place in the job: after it,
 * L->coordinating says whether this launcher starts as the coordinator. 0 / -1 (said). */
static int launcher_start(Launcher *L) {
    const JobConfig *cfg = L->cfg;
    char err[1024];
    int resuming = cfg->nnodes > 0 && cfg->resume[0];
    if (lau_open_outputs(L, err, sizeof err) != 0 || start_control_plane(L, err, sizeof err) != 0 ||
        (cfg->nnodes > 0 && lau_claim_job_id(L, err, sizeof err) != 0) || lau_join_as_node(L, err, sizeof err) != 0 ||
        (resuming && lau_publish_inventory(L, err, sizeof err) != 0) ||
        (L->coordinating && resuming && lau_choose_resume_step(L, err, sizeof err) != 0) ||
        (L->coordinating ? lau_setup_netns(L, err, sizeof err) != 0 || lau_take_first_lease(L, err, sizeof err) != 0 ||
                               lau_publish_job(L, err, sizeof err) != 0
                         : lau_follow_job(L, err, sizeof err) != 0) ||
        (resuming && lau_serve_resumed_states(L, err, sizeof err) != 0)) {
        log_msg("%s", err);
        if (L->coordinating && L->ctl && cfg->nnodes > 0) ctl_state_set(L->ctl, JOB_STATE_FAILED); /* the others stop waiting */
        return -1;
    }
    if (cfg->nnodes > 0) {
        int worker_node = L->node_index < cfg->nnodes, first = L->node_index * cfg->nproc_per_node;
        if (worker_node)
            log_msg("machine %d of %d (%s, %s): ranks %d..%d%s", L->node_index, cfg->nnodes, L->node_id, L->bind_addr, first,
                    first + cfg->nproc_per_node - 1, L->coordinating ? "; this machine coordinates the job" : "");
        else
            log_msg("spare machine %d (%s, %s): %d warm spare processes", L->node_index - cfg->nnodes, L->node_id, L->bind_addr,
                    cfg->nproc_per_node);
        lau_node_event(L, "node_joined", "\"id\":\"%s\",\"addr\":\"%s\",\"role\":\"%s\"", L->node_id, L->bind_addr,
                   worker_node ? "ranks" : "spares");
        if (L->coordinating && cfg->ft == FT_DEADPOOL && cfg->nnodes > 1 && cfg->replica_placement == PLACE_RING)
            log_msg("each rank's %d replica(s) live on %d other machine(s): the job survives the loss of any %d machine(s) "
                    "at once, given spare machines to take their ranks", cfg->replicas, cfg->replicas, cfg->replicas);
    }
    return 0;
}

/* The following role's start: this machine's processes. 0 / -1 (said; L->failed). */
static int follower_start(Launcher *L) {
    if (lau_spawn_all(L) == 0) return 0;
    log_msg("cannot start this machine's processes: %s", strerror(errno));
    L->failed = 1;
    return -1;
}

/* The coordinating role's start: the job's start event and lines, the lease, the
 * coordinator, the processes. 0 / -1 (said; L->failed). */
static int coordinator_start(Launcher *L) {
    const JobConfig *cfg = L->cfg;
    /* The program as a user reads it: arguments separated by spaces. */
    char program[sizeof cfg->program], program_esc[2 * sizeof cfg->program];
    snprintf(program, sizeof program, "%s", cfg->program);
    for (char *p = program; *p; p++)
        if (*p == DP_ARG_SEP) *p = ' ';
    json_escape(program, program_esc, sizeof program_esc);
    static const char *const ft_names[] = {"deadpool", "disk", "none"};
    event_emit(L->ctl, L->t0_wall_ms, "start", "\"job\":\"%s\",\"workers\":%d,\"spares\":%d,\"program\":\"%s\",\"steps\":%d,\"seed\":%llu,"
               "\"t0_ms\":%lld", L->job, cfg->workers, cfg->spares, program_esc, cfg->steps, (unsigned long long)cfg->seed,
               (long long)L->t0_wall_ms);
    if (L->metrics_srv) {
        const char *host = cfg->bind[0] ? cfg->bind : "127.0.0.1";
        int v6 = strchr(host, ':') != NULL;
        char host_esc[600];
        json_escape(host, host_esc, sizeof host_esc);
        log_msg("metrics: http://%s%s%s:%d/metrics (Prometheus text format)", v6 ? "[" : "", host, v6 ? "]" : "",
                metrics_server_port(L->metrics_srv));
        event_emit(L->ctl, L->t0_wall_ms, "metrics_server", "\"bind\":\"%s\",\"port\":%d", host_esc,
                   metrics_server_port(L->metrics_srv));
    }
    log_msg("job %s: %d workers + %d spares, %d steps, out %s, ft %s, program: %s", L->job, cfg->workers, cfg->spares,
            cfg->steps, cfg->out, ft_names[cfg->ft], program);
    if (L->run_cfg.resume_step >= 0) {
        log_msg("resuming from the checkpoint of step %d in %s", L->run_cfg.resume_step + 1, cfg->resume);
        event_emit(L->ctl, L->t0_wall_ms, "resume", "\"step\":%d", L->run_cfg.resume_step + 1);
    }
    if (cfg->nnodes > 0 && !(L->lease[0] && ctl_lease_renew(L->ctl, L->lease, lau_lease_ttl_ms(cfg)) == 1) &&
        ctl_lease_acquire(L->ctl, "machine0", lau_lease_ttl_ms(cfg), L->lease, sizeof L->lease) <= 0) {
        log_msg("the coordinator's lease of job %s is taken: is another first machine running it?", L->job);
        L->failed = 1;
        return -1;
    }
    if (lau_become_coordinator(L, 1) != 0 || lau_spawn_all(L) != 0) {
        log_msg("cannot start worker processes: %s", strerror(errno));
        L->failed = 1;
        return -1;
    }
    return 0;
}

/* A follower stopped by a signal that every machine got (Slurm's): the coordinating machine
 * has this machine's ranks write the newest committed step first (lau_keep_on_stop). Bounded like
 * it: 30 s, or a second signal. */
static void follower_wait_kept(Launcher *L) {
    sig_atomic_t first = lau_stop_signal;
    lau_stop_signal = 0;
    double deadline = now_ms() + 30000;
    job_state state = JOB_STATE_RUNNING;
    while (!lau_stop_signal && now_ms() < deadline && lau_reap_children(L) > 0) {
        int got = ctl_state_get(L->ctl, &state);
        if (roles_state_ended(got, state)) break;
        lau_node_beat(L);
        lau_drain_outputs(L);
        sleep_ms(50);
    }
    lau_stop_signal = first;
}

/* The end of a launcher that follows when the job ends: its processes stop, it says how
 * its part ended and leaves the job. Returns the exit status. */
static int follower_finish(Launcher *L) {
    const JobConfig *cfg = L->cfg;
    if (roles_follower_waits_on_stop(lau_stop_signal != 0, L->job_done, L->failed, cfg->ft)) follower_wait_kept(L);
    if (!L->job_done) /* the job failed, stopped, or lost its coordinator: nothing to finish */
        for (int i = 0; i < L->nchildren; i++)
            if (!L->children[i].exited) kill(L->children[i].pid, SIGTERM);
    lau_stop_children(L, 10000);
    roles_end end = roles_follower_end(lau_stop_signal != 0, L->job_done);
    int ok = end == ROLES_END_DONE;
    if (ok) {
        char path[1200];
        snprintf(path, sizeof path, "%s/model.bin", cfg->out);
        log_msg("done: the job finished%s%s", access(path, R_OK) == 0 ? "; the model is in " : " (no rank ran here at the end: "
                "the model is on the machines that ran ranks)", access(path, R_OK) == 0 ? path : "");
    } else {
        log_msg("this machine leaves job %s (%s)", L->job, roles_leave_reason(lau_stop_signal != 0, L->stopped_elsewhere));
    }
    lau_node_event(L, "node_left", "\"status\":\"%s\"", ok ? "done" : "failed");
    ctl_node_beat(L->ctl, L->node_index, 1); /* gone now, not in half a detect timeout */
    return roles_exit_code(end);
}

/* The control plane was lost while coordinating: spares go, the workers keep their
 * committed state on disk and leave by themselves (bounded). Unless every rank had finished
 * (then L->redis_lost is cleared: the job is done), the job failed. */
static void coordinator_lost_control_plane(Launcher *L) {
    const JobConfig *cfg = L->cfg;
    /* Spares have nothing to keep and no reason to leave by themselves: they go now. */
    for (int i = 0; i < L->nchildren; i++)
        if (!L->children[i].exited && L->coord && !coord_is_member(L->coord, L->children[i].pid)) kill(L->children[i].pid, SIGTERM);
    /* The workers see the loss within the detect timeout, write their committed state
     * and leave; give them that long (plus a blocked collective's timeout), then stop them. */
    lau_stop_children(L, 3 * cfg->detect_timeout_ms + job_comm_timeout_ms(cfg) + 20000);
    /* Lost after the last step: every rank finished (exit 0) without the means to say so. */
    if (roles_lost_after_done(lau_count_exited_ok(L), cfg->workers)) {
        log_msg("the control plane was lost after every rank had finished: the job is done");
        L->redis_lost = 0;
        L->last_step = cfg->steps;
        return;
    }
    char err[1024], cmd[9000];
    int64_t ck = checkpoint_latest_intact(cfg->out, err, sizeof err);
    if (ck >= 0)
        log_msg("the state of step %lld is in %s/ckpt: continue with `%s`", (long long)ck + 1, cfg->out,
                job_config_resume_command(cfg, cmd, sizeof cmd));
    else
        log_msg("no checkpoint could be completed without the control plane: %s", err);
    fprintf(L->events, "{\"event\":\"control_plane_lost\",\"t\":%.3f,\"checkpoint_step\":%lld}\n",
            (double)(wall_ms() - L->t0_wall_ms) / 1e3, (long long)ck + 1);
    L->failed = 1;
}

/* The end of a launcher that coordinates when the job ends: the work kept on a stop, the
 * job's final state, its processes stopped, the last line and the `finish` event. Returns
 * the exit status. */
static int coordinator_finish(Launcher *L) {
    const JobConfig *cfg = L->cfg;
    if (roles_keep_on_stop(lau_stop_signal != 0, L->coordinating, L->failed, L->job_done, L->redis_lost, cfg->ft))
        lau_keep_on_stop(L);

    job_state state = roles_final_state(lau_stop_signal != 0, L->failed, L->redis_lost);
    if (L->redis_lost) coordinator_lost_control_plane(L);
    ctl_state_set(L->ctl, state);
    /* After a failure nothing useful is left to finish: survivors may be blocked in a
     * collective with the dead rank, so they get SIGTERM at once. */
    if (L->failed)
        for (int i = 0; i < L->nchildren; i++)
            if (!L->children[i].exited) kill(L->children[i].pid, SIGTERM);
    lau_stop_children(L, 10000);
    roles_end end = roles_coordinator_end(lau_stop_signal != 0, L->failed, L->last_step, cfg->steps);
    int ok = end == ROLES_END_DONE;
    if (lau_stop_signal) log_msg("stopped by signal %d after step %d", (int)lau_stop_signal, L->last_step);
    else if (ok) {
        char loss[64] = "", model[2100] = "";
        if (L->have_loss) snprintf(loss, sizeof loss, ", final loss %.4f", L->last_loss);
        if (!L->model_path[0]) snprintf(L->model_path, sizeof L->model_path, "%.1000s/model.bin", cfg->out);
        if (access(L->model_path, F_OK) == 0) snprintf(model, sizeof model, ", model in %s", L->model_path);
        log_msg("done: %d steps%s%s", L->last_step, loss, model);
    }
    else log_msg("job failed after step %d (see %s/events.jsonl)", L->last_step, cfg->out);
    /* CPU time of every worker and spare (all reaped by now): what the job cost the machine,
     * a steadier measure than wall time on a busy one. */
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    double cpu_s = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    event_emit(L->ctl, L->t0_wall_ms, "finish", "\"status\":\"%s\",\"steps\":%d,\"workers_cpu_s\":%.3f",
               job_state_name(ok ? JOB_STATE_DONE : state),
               L->last_step, cpu_s);
    lau_drain_outputs(L);
    L->live.finished = 1;
    metrics_server_publish(L->metrics_srv, &L->live);
    return roles_exit_code(end);
}

/* What every run ends with, however far it got: servers, children, the job's keys (the
 * coordinating machine's, once the others have left), the embedded Redis, files, the report. */
static void launcher_cleanup(Launcher *L) {
    const JobConfig *cfg = L->cfg;
    metrics_server_stop(L->metrics_srv); /* NULL when off */
    replica_server_stop(L->shards);      /* NULL when not resuming across machines */
    lau_forget_children(L);
    netns_destroy(&L->netns);
    coord_free(L->coord);
    if (L->ctl && cfg->redis[0] && L->coordinating) {
        if (cfg->nnodes > 0) lau_wait_other_nodes(L, 15000);
        ctl_job_delete(L->ctl);
    } else if (L->ctl && cfg->slurm && !cfg->redis[0] && (L->server.pid || L->ha[0].pid || L->ha[1].pid || L->ha[2].pid || L->ha[3].pid)) {
        lau_wait_other_nodes(L, 15000); /* this node serves the job's control plane: until the others have left */
    }
    if (L->ctl) ctl_close(L->ctl);
    if (L->server.pid > 0) redis_server_stop(&L->server, 3000);
    explicit_bzero(L->shared, sizeof L->shared);
    explicit_bzero(L->job_key, sizeof L->job_key);
    if (L->secret_file[0]) unlink(L->secret_file);
    stop_ha(L);
    run_dir_remove(L->run_dir);
    if (L->events) fclose(L->events);
    if (L->lock_fd >= 0) close(L->lock_fd);
    if (L->metrics) fclose(L->metrics);
    if (cfg->report && L->t0_wall_ms) lau_write_report(L); /* only when this job wrote the logs */
}

int launcher_run(const JobConfig *cfg) {
    static Launcher L;
    if (launcher_init(&L, cfg) != 0) return 1;
    int rc = 1;
    if (launcher_start(&L) == 0) {
        launcher_role role = L.coordinating ? ROLE_COORDINATING : ROLE_FOLLOWING;
        if ((role == ROLE_COORDINATING ? coordinator_start(&L) : follower_start(&L)) == 0) role = lau_run_roles(&L);
        rc = role == ROLE_COORDINATING ? coordinator_finish(&L) : follower_finish(&L);
    }
    launcher_cleanup(&L);
    return rc;
}
