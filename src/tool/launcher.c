/* launcher.c — the `deadpool run` process: job setup, child processes, output files, teardown. */
#include "launcher.h"

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

#define MAX_CHILDREN 4096
#define ETA_WINDOW 32 /* steps the ETA is measured over */

typedef struct {
    pid_t pid;
    long proc;   /* its process id in the job (drawn here: exits are reported by it) */
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
    char job[40];
    char url[600];          /* redis URL without the password */
    redis_server server;    /* embedded server; pid 0 when --redis was given */
    redis_server ha[4];     /* --redis-ha: the replica and three sentinels (the master is `server`) */
    char ha_dir[512];       /* the sentinels' private directory ("" = none): run_dir, or under Slurm the node's */
    char run_dir[64];       /* this launcher's private (0700) directory: Redis's socket, the redis file */
    char redis_file[128];   /* run_dir/redis: the job's URL with its password (0600), for spares to join */
    ctl_t *ctl;
    int64_t t0_wall_ms;
    FILE *events, *metrics;
    Child children[MAX_CHILDREN];
    int nchildren;
    int last_step;
    float last_loss;
    int have_loss;          /* a step's loss was seen (a resumed job that was done has none) */
    char model_path[2048];  /* where the program said it saved the model (model_saved), "" none */
    LiveMetrics live;       /* what the progress line and /metrics report */
    MetricsServer *metrics_srv; /* --metrics-port; NULL = off */
    double spares_checked_ms;   /* when the spare pool was last counted */
    double eta_step[ETA_WINDOW], eta_t[ETA_WINDOW]; /* the newest steps and their times, a ring */
    int eta_n;
    int failed;             /* the job cannot continue */
    int job_done;           /* rank 0 said every rank finished: the job is done */
    int lock_fd;            /* flock on OUT/.lock, held while the job runs */
    int redis_lost;         /* the control plane is gone: workers persist and stop by themselves */
    double redis_failing_since; /* first failed drain of a run of failures, 0 = reachable */
    int64_t redis_failing_wall; /* ...its wall time */
    char shared[JOB_SECRET_MAX + 1]; /* the secret the job's machines share (secret.h; never in Redis) ... */
    char job_key[JOB_KEY_HEX_LEN + 1]; /* ... and the job key derived from it with the job's name */
    char secret_file[128];  /* run_dir/secret: a drawn secret (0600), for spares started by hand */
    Coordinator *coord;
    NetNs netns;            /* --inject netdown: one rank runs behind a link we can cut */
    long netdown_epoch;     /* the link went down in this epoch; -1 = up */
    char self_path[4096];   /* this executable: the built-in trainer is its `train` command */
    int respawn_due;        /* spares used by a decision, started once the recovery is over */
    double respawn_at;      /* ...or at this time (now_ms) should no `recovered` event come */
    int unjoined_restarts;  /* processes started again for a rank their predecessor never claimed */
    int spares_failed;      /* spares of this machine that could not start (shown in the progress line) */
    double beat_ms;         /* when the launcher key was last renewed */
    /* machines: every launcher is one machine of the job (one for `--workers N`) */
    char node_id[128];      /* this machine's id (--node-id, else node_id_default) */
    int node_index;         /* the order it joined in: < --nnodes runs ranks, beyond it spares */
    int coordinating;       /* this launcher runs the coordinator (the job's first machine) */
    char bind_addr[256];    /* where this machine's processes listen ("" = loopback) */
    double node_beat_ms;    /* when KEY_NODE_ALIVE was last renewed */
    double progress_ms;     /* another machine's launcher: when the progress was last read */
    char progress_seen[64]; /* ...and the newest step's line it printed (its "t") */
    ReplicaServer *shards;  /* --resume across machines: serves this machine's state files */
    int stopped_elsewhere;  /* another machine's launcher was stopped (Ctrl-C): the job ends */
    char lease[160];        /* across machines: the coordinator's lease value while we hold it */
    double lease_ms;        /* when the lease was last renewed or tried */
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

/* How long a job's launcher must have been silent before another launcher deletes its keys:
 * far longer than any stall a live job survives (a host paused, a launcher stopped). */
#define ORPHAN_GRACE_MS (10 * 60 * 1000LL)

#define HA_MASTER "deadpool" /* the name the --redis-ha sentinels monitor the master under */

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
static int set_job_key(Launcher *L, char *err, size_t errlen) {
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
    if (!L->ctl || set_job_key(L, err, errlen) != 0) return -1;
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
static int launcher_ttl_ms(const JobConfig *cfg) {
    int ttl = 4 * cfg->detect_timeout_ms;
    return ttl < 10000 ? 10000 : ttl;
}
#define LAUNCHER_BEAT_MS 1000

static void launcher_beat(Launcher *L) {
    double now = now_ms();
    if (L->beat_ms && now - L->beat_ms < LAUNCHER_BEAT_MS) return;
    char who[LAUNCHER_ID_TEXT_MAX];
    LauncherId me = {.pid = (int)getpid()};
    gethostname(me.host, sizeof me.host - 1);
    for (char *h = me.host; *h; h++) /* a host name has none; the format refuses them */
        if ((unsigned char)*h <= ' ' || *h == 0x7f) *h = '_';
    if (launcher_id_format(&me, who, sizeof who) == 0 && ctl_launcher_beat(L->ctl, who, launcher_ttl_ms(L->cfg)) == 0)
        L->beat_ms = now;
}

/* KEY_NODE_ALIVE lives a sixteenth of the detect timeout (node_alive_ttl_ms) and is renewed
 * four times as often. Its expiry is how a machine's crash is noticed when no peer is in a
 * collective with it (the coordinator probes the machine's ranks then), and why a machine cut
 * off or hung is failed as a whole: when its first rank's heartbeat (a whole detect timeout)
 * expires, the machine's key has long expired (decide_nodes_lost). */
static void node_beat(Launcher *L) {
    if (L->cfg->nnodes == 0) return; /* one machine: its coordinator is its launcher */
    double now = now_ms();
    int ttl = node_alive_ttl_ms(L->cfg);
    if (L->node_beat_ms && now - L->node_beat_ms < (ttl / 4 > 0 ? ttl / 4 : 1)) return;
    if (ctl_node_beat(L->ctl, L->node_index, ttl) == 0) L->node_beat_ms = now;
}

/* An event of this machine: into its own events.jsonl, and the job's (the first machine's). */
static void node_event(Launcher *L, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void node_event(Launcher *L, const char *name, const char *fmt, ...) {
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
static int write_job_keys(Launcher *L) {
    char text[JOB_CONFIG_TEXT_MAX], t0[32];
    if (job_config_serialize(&L->run_cfg, text, sizeof text) != 0) return -1;
    proto_int_format((long long)L->t0_wall_ms, t0, sizeof t0);
    return ctl_config_set(L->ctl, CFG_CONFIG, text) == 0 &&
                   ctl_config_set(L->ctl, CFG_T0_MS, t0) == 0 && ctl_state_set(L->ctl, JOB_STATE_RUNNING) == 0
               ? 0
               : -1;
}

static int publish_job(Launcher *L, char *err, size_t errlen) {
    char text[JOB_CONFIG_TEXT_MAX];
    if (job_config_serialize(&L->run_cfg, text, sizeof text) != 0) { snprintf(err, errlen, "job config too large"); return -1; }
    if (!L->t0_wall_ms) L->t0_wall_ms = wall_ms();
    /* The launcher key first: a janitor of another job must never see our config without it. */
    L->beat_ms = 0;
    launcher_beat(L);
    if (!L->beat_ms || write_job_keys(L) != 0) {
        snprintf(err, errlen, "publishing the job to redis failed: %s", ctl_last_error(L->ctl));
        return -1;
    }
    ctl_wait_replica(L->ctl, 1000); /* under Sentinel: the job survives a failover from its start */
    return 0;
}

/* A log of the job in --out, opened following no link (O_NOFOLLOW): continued (append) or
 * started afresh. NULL + errno. */
static FILE *open_log(const char *path, int append) {
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
    FILE *f = fd >= 0 ? fdopen(fd, append ? "a" : "w") : NULL;
    if (fd >= 0 && !f) close(fd);
    return f;
}

/* The command that continues this job from its checkpoints in out: a program other than the
 * built-in trainer is named again after -- (a checkpoint never names what runs). */
static int open_outputs(Launcher *L, char *err, size_t errlen) {
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
    L->events = open_log(path, append);
    if (L->events) {
        snprintf(path, sizeof path, "%s/metrics.jsonl", L->cfg->out);
        L->metrics = open_log(path, append);
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
static pid_t spawn_process(Launcher *L, int rank, long proc) {
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
     * step: the launcher keeps the work (keep_on_stop); the processes must live on for it. */
    if (L->cfg->slurm) signal(SIGUSR1, SIG_IGN);
    if (in_ns) setenv("DEADPOOL_NETDOWN_IF", L->netns.ns_if, 1);
    execvp(argv[0], argv);
    fprintf(stderr, "[deadpool] cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(DP_EXIT_BAD_JOB);
}

/* --inject netdown: put the rank behind a veth link and let Redis listen on it too. */
static int setup_netns(Launcher *L, char *err, size_t errlen) {
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
    pid_t pid = spawn_process(L, rank, proc);
    if (pid < 0) return -1;
    add_child(L, pid, proc, rank);
    return 0;
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

/* This machine's processes: all ranks and spares on one machine; with --nnodes, machine k <
 * N runs ranks k*P .. k*P+P-1 (and --spares spares), a machine beyond N runs P spares. */
static int spawn_all(Launcher *L) {
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
static json_t *json_line(const char *line) {
    json_t *o = json_loads(line, 0, NULL);
    if (o && !json_is_object(o)) {
        json_decref(o);
        o = NULL;
    }
    return o;
}

/* A number member of o into *out. 0, or -1 (absent or not a number: *out unchanged). */
static int jnum(const json_t *o, const char *key, double *out) {
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
static void observe_metric(Launcher *L, const json_t *o, double step, double loss, double ms, double tps, double t) {
    LiveMetrics *m = &L->live;
    double committed = -1, epoch = m->epoch, wait = 0, lr = NAN, gn = NAN;
    jnum(o, "committed_step", &committed);
    jnum(o, "epoch", &epoch);
    jnum(o, "snapshot_wait_ms", &wait);
    jnum(o, "lr", &lr);
    jnum(o, "grad_norm", &gn);
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
    jnum(o, "rank", &rank);
    jnum(o, "spare", &spare);
    jnum(o, "rollback_step", &rollback);
    jnum(o, "total_ms", &total);
    jnum(o, "first_step_done_ms", &first);
    jnum(o, "steps_recomputed", &recomputed);
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
        jnum(o, keys[i], &v);
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
        jnum(o, conn_keys[i], &v);
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
        jnum(o, "bytes_copied", &copied);
        jnum(o, "bytes_replicated", &replicated);
        jnum(o, "captures", &captures);
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
static void write_report(Launcher *L) {
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

static void respawn_now(Launcher *L);

/* Once the job is two steps past its resumed step every rank has restored (a rollback goes to
 * a newer generation from then on): the state files served from this machine's disk can go. */
static void resumed_states_done(Launcher *L, double step) {
    if (!L->shards || step < L->run_cfg.resume_step + 3) return;
    replica_server_stop(L->shards);
    L->shards = NULL;
}

/* A step's metrics line: into metrics.jsonl, and its numbers. */
typedef struct {
    double step, loss, ms, tps, t;
} StepLine;

static StepLine take_metric(Launcher *L, const char *json, const json_t *o) {
    StepLine s = {0};
    fprintf(L->metrics, "%s\n", json);
    jnum(o, "step", &s.step);
    s.loss = NAN; /* absent: the loop reports none */
    int has_loss = jnum(o, "loss", &s.loss) == 0;
    jnum(o, "step_ms", &s.ms);
    jnum(o, "tokens_per_s", &s.tps);
    jnum(o, "t", &s.t);
    L->last_step = (int)s.step;
    L->have_loss = has_loss;
    L->last_loss = (float)s.loss;
    resumed_states_done(L, s.step);
    return s;
}

static void on_metric(const char *json, void *arg) {
    Launcher *L = arg;
    json_t *o = json_line(json);
    if (!o) {
        log_msg("a metrics line that is not a JSON object: %.200s", json);
        return;
    }
    StepLine s = take_metric(L, json, o);
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
    observe_metric(L, o, s.step, s.loss, s.ms, s.tps, s.t);
    json_decref(o);
    fflush(stdout);
}

/* An event line: logged to events.jsonl and observed for /metrics and the progress lines.
 * Nothing is decided from it: decisions come from reports (on_report). */
static void on_event(const char *json, void *arg) {
    Launcher *L = arg;
    fprintf(L->events, "%s\n", json);
    fflush(L->events);
    json_t *o = json_line(json);
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
    case REPORT_RECOVERED: respawn_now(L); break;
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
    char procs[32];
    ctl_key_suffix(procs, sizeof procs, KEY_PROCS, 0, 0);
    L->beat_ms = 0;
    launcher_beat(L);
    long long max_proc = 0;
    for (int i = 0; i < L->nchildren; i++)
        if (L->children[i].proc > max_proc) max_proc = L->children[i].proc;
    int ok = L->beat_ms && write_job_keys(L) == 0 && ctl_counter_at_least(L->ctl, procs, max_proc + 1000) == 0; /* spares joined by hand drew ids too */
    ctl_wait_replica(L->ctl, 1000);
    log_msg("the control plane answers again: the job's keys are %s", ok ? "republished" : "not all republished (tried again)");
    if (!ok) L->redis_failing_since = L->redis_failing_since ? L->redis_failing_since : now_ms();
}

static void control_plane_lost(Launcher *L, const char *why) {
    L->redis_lost = 1;
    log_msg("the control plane is lost (%s): no failure can be handled any more; the workers keep their "
            "committed state on disk and stop", why);
}

static void drain_outputs(Launcher *L) {
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
                control_plane_lost(L, why);
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
    char what[EXIT_RECORD_TEXT_MAX];
    if (exit_record_format(&e, what, sizeof what) != 0 || ctl_exit_report(L->ctl, c->proc, what) != 0)
        log_msg("reporting process %d's exit: %s", (int)c->pid, ctl_last_error(L->ctl));
}

/* A process started for a rank died before it claimed it (a crash, a kill, a machine's OOM
 * killer as the job starts): nobody's failure to the coordinator, which knows epoch 0's
 * members only once every rank is claimed, while the other ranks wait in the rendezvous for
 * it. Nothing of it was committed, so another process is started for the rank, at most
 * START_RESTARTS_MAX times per launcher (a program that dies so every time is a bad job).
 * 0 when restarted (or the job failed on it); -1 when the exit is the coordinator's (a member
 * it knows, a claimed rank, a job past its start, or Redis does not say). A known member's
 * crash costs no Redis read here: it is on the recovery's path. */
#define START_RESTARTS_MAX 3
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
static int reap_children(Launcher *L) {
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
            if (!stop_signal && !L->job_done && redis_server_restart(&L->server, 5000, err, sizeof err) == 0) {
                char where[REDIS_UNIX_PATH_MAX + 32];
                if (L->server.sock[0]) snprintf(where, sizeof where, "%s", L->server.sock);
                else snprintf(where, sizeof where, "127.0.0.1:%d", L->server.port);
                log_msg("%s: started again on %s (pid %d); the job's keys are republished", why, where, L->server.pid);
                if (!L->redis_failing_since) {
                    L->redis_failing_since = now_ms();
                    L->redis_failing_wall = wall_ms();
                }
            } else {
                if (L->server.pid == 0 && !stop_signal && !L->job_done) log_msg("restarting it: %s", err);
                control_plane_lost(L, why);
            }
        }
        if (!c) continue;
        c->exited = 1;
        c->status = status;
        if (L->cfg->nnodes > 0) report_exit(L, c); /* for whichever launcher coordinates, now or later */
        /* A member that finished says so here too: its job_done may not have reached Redis (the
         * control plane away at the end), and its silence must not read as a crash. */
        if (!stop_signal && WIFEXITED(status) && WEXITSTATUS(status) == 0 && L->coord) coord_child_exited(L->coord, pid, status);
        if (stop_signal || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) continue;
        char how[64];
        describe_exit(status, how, sizeof how);
        if (L->coordinating) event_emit(L->ctl, L->t0_wall_ms, "process_exit", "\"pid\":%d,\"status\":\"%s\"", (int)pid, how);
        else node_event(L, "process_exit", "\"pid\":%d,\"proc\":%ld,\"status\":\"%s\"", (int)pid, c->proc, how);
        if (WIFEXITED(status) && WEXITSTATUS(status) == DP_EXIT_BAD_JOB && c->rank < 0) {
            /* A spare never fails a job (issue 47): a problem that every process would hit
             * stops the ranks too, and they fail it. This one is reported and not started
             * again (its replacement would likely hit it again); the job goes on with the
             * spares it has. */
            log_msg("spare process %d could not start (see the message above): the job goes on without it", (int)pid);
            L->spares_failed++;
            if (L->coordinating) event_emit(L->ctl, L->t0_wall_ms, "spare_failed", "\"pid\":%d", (int)pid);
            else node_event(L, "spare_failed", "\"pid\":%d,\"proc\":%ld", (int)pid, c->proc);
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
        node_beat(L); /* still here: the first machine keeps the job's keys until we leave */
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
static int spares_arriving(Launcher *L) {
    int n = 0;
    for (int i = 0; i < L->nchildren; i++) {
        const Child *c = &L->children[i];
        if (c->rank < 0 && !c->exited && coord_spare_arriving(L->coord, c->proc)) n++;
    }
    return n;
}

static void respawn_spares(Launcher *L, int n) {
    for (int i = 0; i < n && L->nchildren < MAX_CHILDREN; i++)
        if (start_process(L, -1) != 0) break;
}

/* Replacements for the spares a decision used start after the recovery, not during it: a
 * program starting up (the trainer initialises a whole model) would take CPU from the
 * spare restoring its state while every survivor waits for it. The pool is short of those
 * spares until then; a failure in between is decided with the spares that remain. Unless
 * the replicas live on spares (a lone worker's always do): the new epoch's first snapshot
 * waits for a spare to hold it, so the recovery cannot end before the respawn: at once. */
static void respawn_later(Launcher *L, int n) {
    int holders_are_spares = L->cfg->workers == 1 || L->cfg->replica_placement == PLACE_SPARES;
    double wait = holders_are_spares ? 0 : 2.0 * L->cfg->detect_timeout_ms + 3000; /* the join bound */
    if (!L->respawn_due) L->respawn_at = now_ms() + wait;
    L->respawn_due += n;
}

static void respawn_now(Launcher *L) {
    int n = L->respawn_due;
    L->respawn_due = 0;
    if (n && !L->job_done && !L->failed && !L->redis_lost && !stop_signal) respawn_spares(L, n);
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
    drain_outputs(L);
    ctl_close(L->ctl);
    coord_free(L->coord);
    make_job_id(L->job, sizeof L->job);
    L->ctl = ctl_connect(&L->addr, L->job, 5000, err, sizeof err);
    L->coord = NULL;
    if (!L->ctl || set_job_key(L, err, sizeof err) != 0 || publish_job(L, err, sizeof err) != 0) { log_msg("restart failed: %s", err); return -1; }
    L->coord = coord_create(L->ctl, &L->run_cfg, L->t0_wall_ms, L->node_id);
    if (!L->coord || spawn_all(L) != 0) return -1;
    r->pending = 1;
    r->count++;
    return 0;
}

/* --- the coordinator's lease (across machines) -------------------------------------------
 * The first machine takes it when it creates the job; whoever holds it renews it every
 * sixteenth of the detect timeout for a quarter of it. Any other launcher tries to take it as often: when the
 * coordinating machine is lost (or its launcher stopped for longer), another one coordinates
 * within the detect timeout, with a new fencing token (decisions are published under it). A
 * coordinator that finds its lease gone (it was stopped, its successor decides now) follows. */
static int lease_ttl_ms(const JobConfig *c) { return c->detect_timeout_ms / 4 > 0 ? c->detect_timeout_ms / 4 : 1; }

/* This launcher coordinates from now on (token: the lease's; 1 = the job's first). 0 / -1. */
static int become_coordinator(Launcher *L, long long token) {
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
        node_event(L, "coordinator", "\"lease\":\"%s\"", L->lease);
        drain_outputs(L); /* what members reported meanwhile, before the first tick dates anything */
    }
    return 0;
}

static void lease_tick(Launcher *L) {
    if (L->cfg->nnodes == 0) return;
    double now = now_ms();
    int period = lease_ttl_ms(L->cfg) / 4 > 0 ? lease_ttl_ms(L->cfg) / 4 : 1;
    if (L->lease_ms && now - L->lease_ms < period) return;
    L->lease_ms = now;
    if (L->coordinating) {
        int renewed = ctl_lease_renew(L->ctl, L->lease, lease_ttl_ms(L->cfg));
        if (roles_after_lease(ROLE_COORDINATING, renewed) == ROLE_COORDINATING) return; /* renewed, or Redis trouble */
        log_msg("the coordinator's lease has passed to another machine (this launcher was held up): it follows now");
        coord_free(L->coord);
        L->coord = NULL;
        L->coordinating = 0;
        return;
    }
    char holder[64];
    snprintf(holder, sizeof holder, "machine%d", L->node_index);
    long long token = ctl_lease_acquire(L->ctl, holder, lease_ttl_ms(L->cfg), L->lease, sizeof L->lease);
    if (roles_after_lease(ROLE_FOLLOWING, token) == ROLE_COORDINATING && become_coordinator(L, token) != 0)
        L->lease[0] = 0; /* it expires; another one tries */
}

static void follow(Launcher *L);
static void supervise(Launcher *L);

/* How many of the processes this launcher started have exited with status 0. */
static int count_exited_ok(const Launcher *L) {
    int n = 0;
    for (int i = 0; i < L->nchildren; i++)
        if (L->children[i].exited && WIFEXITED(L->children[i].status) && WEXITSTATUS(L->children[i].status) == 0) n++;
    return n;
}

/* Ctrl-C or SIGTERM (scancel, a time limit) keeps the work: the newest generation every rank
 * committed is in their memory, so it is written to --out (each rank its own state, as when no
 * spare is left) before the job stops, and `--resume` continues from it. Bounded: a second
 * signal, or 30 s, and the job stops with what is on disk. */
static void keep_on_stop(Launcher *L) {
    char err[256];
    long long g = coord_persist_on_stop(L->coord);
    if (g < 0 || checkpoint_latest(L->run_cfg.out, err, sizeof err) >= g) return;
    log_msg("stopping: writing step %lld, the newest every rank committed, to %s/ckpt (Ctrl-C again to skip)", g + 1,
            L->run_cfg.out);
    sig_atomic_t first = stop_signal;
    stop_signal = 0;
    double deadline = now_ms() + COORD_PERSIST_WAIT_MS;
    while (!stop_signal && now_ms() < deadline && L->coordinating) {
        if (coord_persisted(L->coord, g)) {
            char cmd[9000];
            log_msg("step %lld is on disk: continue with `%s`", g + 1,
                    job_config_resume_command(&L->run_cfg, cmd, sizeof cmd));
            event_emit(L->ctl, L->t0_wall_ms, "kept_on_stop", "\"step\":%lld", g + 1);
            break;
        }
        lease_tick(L);
        launcher_beat(L);
        reap_children(L);
        drain_outputs(L);
        sleep_ms(50);
    }
    if (now_ms() >= deadline) log_msg("stopping: step %lld was not written within %d s", g + 1, COORD_PERSIST_WAIT_MS / 1000);
    stop_signal = first;
}

/* The role loop. Across machines a launcher may change roles, a two-state machine:
 *   following ──(takes the lease: the coordinating machine is gone)──▶ coordinating
 *   coordinating ──(finds its lease held by another: it was held up)──▶ following
 * The lease moves it (lease_tick, roles_after_lease); each role's loop returns when the job
 * ends or the role changes. Returns the role the job ended in: it says how the launcher
 * finishes (coordinator_finish / follower_finish). */
static launcher_role run_roles(Launcher *L) {
    launcher_role role = L->coordinating ? ROLE_COORDINATING : ROLE_FOLLOWING;
    while (!roles_job_over(stop_signal != 0, L->failed, L->job_done, L->redis_lost)) {
        switch (role) {
        case ROLE_COORDINATING: supervise(L); break;
        case ROLE_FOLLOWING: follow(L); break;
        }
        role = L->coordinating ? ROLE_COORDINATING : ROLE_FOLLOWING; /* what lease_tick made it */
    }
    return role;
}

static void supervise(Launcher *L) {
    while (!stop_signal && !L->failed && !L->job_done && !L->redis_lost && L->coordinating) {
        lease_tick(L);
        if (!L->coordinating) break;
        /* Exits first: a crash is known the moment waitpid says so. */
        if (reap_children(L) == 0 && L->cfg->nnodes == 0) { /* across machines the job lives elsewhere too */
            /* Rank 0 sends job_done before it exits, so when every local process has left
             * between two drains (rank 1 a spare started by hand, say) the report is queued
             * in Redis: read it before taking the exits for a failure. */
            drain_outputs(L);
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
        launcher_beat(L);
        node_beat(L);
        if (used && L->cfg->respawn_spares && L->cfg->nnodes == 0) respawn_later(L, used);
        int wanted = coord_spares_wanted(L->coord) - spares_arriving(L);
        if (wanted > 0) respawn_spares(L, wanted); /* a failure is waiting for them: now */
        if (L->respawn_due && now_ms() >= L->respawn_at) respawn_now(L);
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

/* The same --job again (a rerun, a requeue on a shared Redis): keys of an earlier run whose
 * launchers, machines and processes are all gone are that run's, not this one's, and
 * continuing it would fail at once. A new run must say what it wants: --resume (continue from
 * that run's checkpoints) or --fresh (start again); either discards the dead run's keys. A
 * run with anything still alive is joined as before (a machine coming back). 0 / -1 + err. */
static int claim_job_id(Launcher *L, char *err, size_t errlen) {
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
        if (now_ms() > deadline || stop_signal) {
            snprintf(err, errlen, "--job %s: another machine claimed the dead run's keys but they are still there "
                     "after --start-timeout-ms %d", L->job, L->cfg->start_timeout_ms);
            return -1;
        }
        sleep_ms(50);
    }
}

/* Registers this machine in the job: the order of joining gives its index (0 creates the
 * job and coordinates it). 0 / -1 + err. */
static int join_as_node(Launcher *L, char *err, size_t errlen) {
    /* Under Slurm the step's first nodes beyond --nnodes are the spare machines (node 0, the
     * batch script's, first: its loss ends a Slurm job anyway): they join once the others have
     * (machines run ranks in the order they join). */
    if (L->cfg->slurm && L->cfg->slurm_env && L->cfg->slurm_env->node < L->cfg->slurm_env->nnodes - L->cfg->nnodes) {
        static char ids[DP_MAX_RANKS][128];
        static int idx[DP_MAX_RANKS];
        double deadline = now_ms() + L->cfg->start_timeout_ms;
        while (ctl_nodes_read(L->ctl, ids[0], sizeof ids[0], idx, DP_MAX_RANKS) < L->cfg->nnodes && now_ms() < deadline &&
               !stop_signal)
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
    node_beat(L);
    return 0;
}

/* The first machine takes the coordinator's lease before it publishes the job: once the job is
 * "running", the other machines try to take a lease nobody holds (lease_tick). Held for 10 s
 * (publishing may take longer than a lease lives), then renewed as usual. 0 / -1 + err. */
static int take_first_lease(Launcher *L, char *err, size_t errlen) {
    if (L->cfg->nnodes == 0) return 0;
    int ttl = lease_ttl_ms(L->cfg) > 10000 ? lease_ttl_ms(L->cfg) : 10000;
    if (ctl_lease_acquire(L->ctl, "machine0", ttl, L->lease, sizeof L->lease) > 0) return 0;
    L->lease[0] = 0;
    snprintf(err, errlen, "the coordinator's lease of job %s is taken: is another first machine running it? (%s)", L->job,
             ctl_last_error(L->ctl));
    return -1;
}

/* A machine other than the first: the job as its first machine published it, which must
 * agree with this machine's options (bar the machine's own: --out, --bind, ...). 0 / -1. */
static int follow_job(Launcher *L, char *err, size_t errlen) {
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
        if (now_ms() > deadline || stop_signal) {
            snprintf(err, errlen, "job '%s': its first machine did not publish the job within --start-timeout-ms %d",
                     L->job, L->cfg->start_timeout_ms);
            return -1;
        }
        node_beat(L);
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
static int publish_inventory(Launcher *L, char *err, size_t errlen) {
    static char inv[INVENTORY_TEXT_MAX];
    char idx[16], key[32];
    if (checkpoint_inventory(L->cfg->resume, inv, sizeof inv) != 0) {
        snprintf(err, errlen, "--resume %.900s: the checkpoints there take more than %d bytes to list: remove old "
                 "ones", L->cfg->resume, INVENTORY_TEXT_MAX);
        return -1;
    }
    proto_int_format(L->node_index, idx, sizeof idx);
    if (ctl_hash_set(L->ctl, ctl_key_suffix(key, sizeof key, KEY_INVENTORY, 0, 0), idx, inv) != 0) {
        snprintf(err, errlen, "publishing this machine's checkpoints: %s", ctl_last_error(L->ctl));
        return -1;
    }
    log_msg("--resume: this machine has %s", inv[0] ? inv : "no checkpoint");
    return 0;
}

/* The first machine: waits (--start-timeout-ms) for every machine that runs ranks to say what
 * it has, a second more for spare machines, and resumes from the newest step whose every
 * rank's state is on some machine. 0 / -1 + err. */
static int choose_resume_step(Launcher *L, char *err, size_t errlen) {
    int max = DP_MAX_RANKS, n = 0;
    char (*fields)[16] = malloc(sizeof *fields * (size_t)max), *values = malloc((size_t)max * INVENTORY_TEXT_MAX);
    const char **inv = malloc(sizeof *inv * (size_t)max);
    char key[32], why[512];
    if (!fields || !values || !inv) { snprintf(err, errlen, "out of memory"); goto fail; }
    ctl_key_suffix(key, sizeof key, KEY_INVENTORY, 0, 0);
    double t0 = now_ms(), all_at = 0;
    for (;;) {
        n = ctl_hash_getall(L->ctl, key, fields[0], sizeof fields[0], values, INVENTORY_TEXT_MAX, max);
        int workers_in = 0; /* machines 0..nnodes-1 (spare machines may come too) */
        for (int i = 0; i < n; i++) {
            long long m;
            workers_in += proto_int_parse(fields[i], "inventory machine", 0, INT_MAX, &m, NULL, 0) == 0 && m < L->cfg->nnodes;
        }
        if (workers_in >= L->cfg->nnodes && !all_at) all_at = now_ms();
        if ((all_at && now_ms() - all_at >= 1000) || now_ms() - t0 > L->cfg->start_timeout_ms || stop_signal) break;
        node_beat(L);
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
        free(fields); free(values); free(inv);
        return 0;
    }
    if (step < 0) { snprintf(err, errlen, "--resume: no complete checkpoint across the %d machines: %s", n, why); goto fail; }
    if (why[0]) log_msg("--resume: %s; resuming from step %lld", why, (long long)step + 1);
    L->run_cfg.resume_step = (int)step;
    free(fields); free(values); free(inv);
    return 0;
fail:
    free(fields); free(values); free(inv);
    return -1;
}

/* Every machine serves the state files of the chosen step on its disk to the ranks that run
 * elsewhere (through a replica server of its own: the job's key, verified on arrival), and
 * says so in Redis. 0 / -1 + err. */
static int serve_resumed_states(Launcher *L, char *err, size_t errlen) {
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
        char e[512], key[48], where[300];
        if (checkpoint_read_shard(L->cfg->resume, step, r, &h, &payload, e, sizeof e) != 0) continue;
        snprintf(h.job, sizeof h.job, "%s", L->job); /* the previous run's job name: ours now */
        snap_header_seal(&h);
        replica_status st = replica_put(c, &h, payload, 10000 + (int)(h.length / 20000)); /* >= 20 MB/s */
        free(payload);
        Endpoint me = {.port = replica_server_port(L->shards)};
        snprintf(me.host, sizeof me.host, "%s", L->bind_addr);
        if (endpoint_format(&me, where, sizeof where) != 0) snprintf(where, sizeof where, "%s", "");
        if (st != REPLICA_OK || !where[0] || ctl_set_sealed(L->ctl, ctl_key_suffix(key, sizeof key, KEY_RESUME_HOLDER, r, 0), where) != 0) {
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
    char key[32];
    if (ctl_get(L->ctl, ctl_key_suffix(key, sizeof key, KEY_PROGRESS, 0, 0), json, sizeof json) != 0) return;
    json_t *o = json_line(json);
    double tv = -1;
    if (!o || jnum(o, "t", &tv) != 0) {
        json_decref(o);
        return;
    }
    snprintf(t, sizeof t, "%.3f", tv);
    if (!strcmp(t, L->progress_seen)) {
        json_decref(o);
        return;
    }
    snprintf(L->progress_seen, sizeof L->progress_seen, "%s", t);
    StepLine s = take_metric(L, json, o);
    fflush(L->metrics);
    observe_metric(L, o, s.step, s.loss, s.ms, s.tps, s.t);
    json_decref(o);
    fflush(stdout);
}

/* A machine other than the first supervises its own processes: it reports their exits, keeps
 * its machine key alive, prints the job's progress, and ends when the job does (or when the
 * coordinating launcher is gone: nobody could decide a failure any more). */
static void follow(Launcher *L) {
    double state_ms = 0;
    FollowWatch watch = {.reached_ms = now_ms(), .absent_ms = 0};
    while (!stop_signal && !L->failed && !L->job_done && !L->coordinating) {
        int running = reap_children(L);
        node_beat(L);
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
            follow_verdict v = roles_follow_state(&watch, got, state, running, count_exited_ok(L), L->nchildren, now,
                                                  launcher_ttl_ms(L->cfg));
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
        wait_for_children(L, 25);
    }
    show_progress(L);
    if (L->job_done) L->last_step = L->cfg->steps;
}

/* The first machine of a multi-node job keeps the job's keys until the other machines'
 * launchers have seen its end (their machine keys go), bounded. */
static void wait_other_nodes(Launcher *L, int ms) {
    double deadline = now_ms() + ms;
    char (*ids)[128] = malloc(sizeof *ids * DP_MAX_RANKS), (*keys)[48] = malloc(sizeof *keys * DP_MAX_RANKS);
    char (*vals)[8] = malloc(sizeof *vals * DP_MAX_RANKS);
    const char **kp = malloc(sizeof *kp * DP_MAX_RANKS);
    int *idx = malloc(sizeof *idx * DP_MAX_RANKS), *present = malloc(sizeof *present * DP_MAX_RANKS), n = 0;
    if (ids && keys && vals && kp && idx && present)
        n = ctl_nodes_read(L->ctl, ids[0], sizeof ids[0], idx, DP_MAX_RANKS);
    for (int i = 0; i < n; i++) kp[i] = ctl_key_suffix(keys[i], sizeof keys[i], KEY_NODE_ALIVE, idx[i], 0);
    while (n > 0 && now_ms() < deadline) { /* one MGET of the other machines' keys per look */
        int alive = 0;
        if (ctl_get_many(L->ctl, kp, n, vals[0], sizeof vals[0], present) != 0) break;
        for (int i = 0; i < n; i++) alive += present[i] && idx[i] != L->node_index;
        if (!alive) break;
        sleep_ms(50);
    }
    free(ids);
    free(keys);
    free(vals);
    free(kp);
    free(idx);
    free(present);
}

/* --- the launcher's run: start, the roles, the end ----------------------------------------
 * launcher_run: launcher_init (signals, ids, --metrics-port), launcher_start (outputs, the
 * control plane, joining the job), the role's own start (coordinator_start / follower_start),
 * the role loop (run_roles), the end of the role the job ended in (coordinator_finish /
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
    else make_job_id(L->job, sizeof L->job);
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
    if (open_outputs(L, err, sizeof err) != 0 || start_control_plane(L, err, sizeof err) != 0 ||
        (cfg->nnodes > 0 && claim_job_id(L, err, sizeof err) != 0) || join_as_node(L, err, sizeof err) != 0 ||
        (resuming && publish_inventory(L, err, sizeof err) != 0) ||
        (L->coordinating && resuming && choose_resume_step(L, err, sizeof err) != 0) ||
        (L->coordinating ? setup_netns(L, err, sizeof err) != 0 || take_first_lease(L, err, sizeof err) != 0 ||
                               publish_job(L, err, sizeof err) != 0
                         : follow_job(L, err, sizeof err) != 0) ||
        (resuming && serve_resumed_states(L, err, sizeof err) != 0)) {
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
        node_event(L, "node_joined", "\"id\":\"%s\",\"addr\":\"%s\",\"role\":\"%s\"", L->node_id, L->bind_addr,
                   worker_node ? "ranks" : "spares");
        if (L->coordinating && cfg->ft == FT_DEADPOOL && cfg->nnodes > 1 && cfg->replica_placement == PLACE_RING)
            log_msg("each rank's %d replica(s) live on %d other machine(s): the job survives the loss of any %d machine(s) "
                    "at once, given spare machines to take their ranks", cfg->replicas, cfg->replicas, cfg->replicas);
    }
    return 0;
}

/* The following role's start: this machine's processes. 0 / -1 (said; L->failed). */
static int follower_start(Launcher *L) {
    if (spawn_all(L) == 0) return 0;
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
    if (cfg->nnodes > 0 && !(L->lease[0] && ctl_lease_renew(L->ctl, L->lease, lease_ttl_ms(cfg)) == 1) &&
        ctl_lease_acquire(L->ctl, "machine0", lease_ttl_ms(cfg), L->lease, sizeof L->lease) <= 0) {
        log_msg("the coordinator's lease of job %s is taken: is another first machine running it?", L->job);
        L->failed = 1;
        return -1;
    }
    if (become_coordinator(L, 1) != 0 || spawn_all(L) != 0) {
        log_msg("cannot start worker processes: %s", strerror(errno));
        L->failed = 1;
        return -1;
    }
    return 0;
}

/* A follower stopped by a signal that every machine got (Slurm's): the coordinating machine
 * has this machine's ranks write the newest committed step first (keep_on_stop). Bounded like
 * it: 30 s, or a second signal. */
static void follower_wait_kept(Launcher *L) {
    sig_atomic_t first = stop_signal;
    stop_signal = 0;
    double deadline = now_ms() + 30000;
    job_state state = JOB_STATE_RUNNING;
    while (!stop_signal && now_ms() < deadline && reap_children(L) > 0) {
        int got = ctl_state_get(L->ctl, &state);
        if (roles_state_ended(got, state)) break;
        node_beat(L);
        drain_outputs(L);
        sleep_ms(50);
    }
    stop_signal = first;
}

/* The end of a launcher that follows when the job ends: its processes stop, it says how
 * its part ended and leaves the job. Returns the exit status. */
static int follower_finish(Launcher *L) {
    const JobConfig *cfg = L->cfg;
    if (roles_follower_waits_on_stop(stop_signal != 0, L->job_done, L->failed, cfg->ft)) follower_wait_kept(L);
    if (!L->job_done) /* the job failed, stopped, or lost its coordinator: nothing to finish */
        for (int i = 0; i < L->nchildren; i++)
            if (!L->children[i].exited) kill(L->children[i].pid, SIGTERM);
    stop_children(L, 10000);
    roles_end end = roles_follower_end(stop_signal != 0, L->job_done);
    int ok = end == ROLES_END_DONE;
    if (ok) {
        char path[1200];
        snprintf(path, sizeof path, "%s/model.bin", cfg->out);
        log_msg("done: the job finished%s%s", access(path, R_OK) == 0 ? "; the model is in " : " (no rank ran here at the end: "
                "the model is on the machines that ran ranks)", access(path, R_OK) == 0 ? path : "");
    } else {
        log_msg("this machine leaves job %s (%s)", L->job, roles_leave_reason(stop_signal != 0, L->stopped_elsewhere));
    }
    node_event(L, "node_left", "\"status\":\"%s\"", ok ? "done" : "failed");
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
    stop_children(L, 3 * cfg->detect_timeout_ms + job_comm_timeout_ms(cfg) + 20000);
    /* Lost after the last step: every rank finished (exit 0) without the means to say so. */
    if (roles_lost_after_done(count_exited_ok(L), cfg->workers)) {
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
    if (roles_keep_on_stop(stop_signal != 0, L->coordinating, L->failed, L->job_done, L->redis_lost, cfg->ft))
        keep_on_stop(L);

    job_state state = roles_final_state(stop_signal != 0, L->failed, L->redis_lost);
    if (L->redis_lost) coordinator_lost_control_plane(L);
    ctl_state_set(L->ctl, state);
    /* After a failure nothing useful is left to finish: survivors may be blocked in a
     * collective with the dead rank, so they get SIGTERM at once. */
    if (L->failed)
        for (int i = 0; i < L->nchildren; i++)
            if (!L->children[i].exited) kill(L->children[i].pid, SIGTERM);
    stop_children(L, 10000);
    roles_end end = roles_coordinator_end(stop_signal != 0, L->failed, L->last_step, cfg->steps);
    int ok = end == ROLES_END_DONE;
    if (stop_signal) log_msg("stopped by signal %d after step %d", (int)stop_signal, L->last_step);
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
    drain_outputs(L);
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
    forget_children(L);
    netns_destroy(&L->netns);
    coord_free(L->coord);
    if (L->ctl && cfg->redis[0] && L->coordinating) {
        if (cfg->nnodes > 0) wait_other_nodes(L, 15000);
        ctl_job_delete(L->ctl);
    } else if (L->ctl && cfg->slurm && !cfg->redis[0] && (L->server.pid || L->ha[0].pid || L->ha[1].pid || L->ha[2].pid || L->ha[3].pid)) {
        wait_other_nodes(L, 15000); /* this node serves the job's control plane: until the others have left */
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
    if (cfg->report && L->t0_wall_ms) write_report(L); /* only when this job wrote the logs */
}

int launcher_run(const JobConfig *cfg) {
    static Launcher L;
    if (launcher_init(&L, cfg) != 0) return 1;
    int rc = 1;
    if (launcher_start(&L) == 0) {
        launcher_role role = L.coordinating ? ROLE_COORDINATING : ROLE_FOLLOWING;
        if ((role == ROLE_COORDINATING ? coordinator_start(&L) : follower_start(&L)) == 0) role = run_roles(&L);
        rc = role == ROLE_COORDINATING ? coordinator_finish(&L) : follower_finish(&L);
    }
    launcher_cleanup(&L);
    return rc;
}
