/* launcher_internal.h — what the launcher's files share (not included outside src/tool):
 * the Launcher and its children's records, and the calls that cross its files. The
 * launcher's API is launcher.h. */
#ifndef DEADPOOL_LAUNCHER_INTERNAL_H
#define DEADPOOL_LAUNCHER_INTERNAL_H

#include <signal.h>
#include <stdio.h>
#include <sys/types.h>

#include <jansson.h>

#include "launcher.h"
#include "control.h"
#include "coordinator.h"
#include "launcher_roles.h"
#include "metrics_http.h"
#include "netns.h"
#include "redis_server.h"
#include "slurm.h"
#include "replica.h"
#include "secret.h"
#include "checkpoint.h"
#include "protocol.h"

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
/* How long a job's launcher must have been silent before another launcher deletes its keys:
 * far longer than any stall a live job survives (a host paused, a launcher stopped). */
#define ORPHAN_GRACE_MS (10 * 60 * 1000LL)
#define HA_MASTER "deadpool" /* the name the --redis-ha sentinels monitor the master under */
#define LAUNCHER_BEAT_MS 1000
/* A step's metrics line: into metrics.jsonl, and its numbers. */
typedef struct {
    double step, loss, ms, tps, t;
} StepLine;
/* A process started for a rank died before it claimed it (a crash, a kill, a machine's OOM
 * killer as the job starts): nobody's failure to the coordinator, which knows epoch 0's
 * members only once every rank is claimed, while the other ranks wait in the rendezvous for
 * it. Nothing of it was committed, so another process is started for the rank, at most
 * START_RESTARTS_MAX times per launcher (a program that dies so every time is a bad job).
 * 0 when restarted (or the job failed on it); -1 when the exit is the coordinator's (a member
 * it knows, a claimed rank, a job past its start, or Redis does not say). A known member's
 * crash costs no Redis read here: it is on the recovery's path. */
#define START_RESTARTS_MAX 3

extern volatile sig_atomic_t lau_stop_signal;
void lau_make_job_id(char *out, size_t len);
int lau_set_job_key(Launcher *L, char *err, size_t errlen);
int lau_launcher_ttl_ms(const JobConfig *cfg);
void lau_launcher_beat(Launcher *L);
void lau_node_beat(Launcher *L);
void lau_node_event(Launcher *L, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int lau_write_job_keys(Launcher *L);
int lau_publish_job(Launcher *L, char *err, size_t errlen);
FILE *lau_open_log(const char *path, int append);
int lau_open_outputs(Launcher *L, char *err, size_t errlen);
pid_t lau_spawn_process(Launcher *L, int rank, long proc);
int lau_jnum(const json_t *o, const char *key, double *out);
void lau_observe_metric(Launcher *L, const json_t *o, double step, double loss, double ms, double tps, double t);
void lau_write_report(Launcher *L);
void lau_respawn_now(Launcher *L);
StepLine lau_take_metric(Launcher *L, const char *json, const json_t *o);
void lau_control_plane_lost(Launcher *L, const char *why);
void lau_drain_outputs(Launcher *L);
int lau_setup_netns(Launcher *L, char *err, size_t errlen);
void lau_forget_children(Launcher *L);
void lau_wait_for_children(Launcher *L, int ms);
int lau_spawn_all(Launcher *L);
json_t *lau_json_line(const char *line);
int lau_reap_children(Launcher *L);
void lau_stop_children(Launcher *L, int grace_ms);
int lau_spares_arriving(Launcher *L);
void lau_respawn_spares(Launcher *L, int n);
void lau_respawn_later(Launcher *L, int n);
int lau_restart_from_disk(Launcher *L);
int lau_lease_ttl_ms(const JobConfig *c);
int lau_become_coordinator(Launcher *L, long long token);
int lau_count_exited_ok(const Launcher *L);
void lau_keep_on_stop(Launcher *L);
launcher_role lau_run_roles(Launcher *L);
int lau_claim_job_id(Launcher *L, char *err, size_t errlen);
int lau_join_as_node(Launcher *L, char *err, size_t errlen);
int lau_take_first_lease(Launcher *L, char *err, size_t errlen);
int lau_follow_job(Launcher *L, char *err, size_t errlen);
int lau_publish_inventory(Launcher *L, char *err, size_t errlen);
int lau_choose_resume_step(Launcher *L, char *err, size_t errlen);
int lau_serve_resumed_states(Launcher *L, char *err, size_t errlen);
void lau_wait_other_nodes(Launcher *L, int ms);

#endif
