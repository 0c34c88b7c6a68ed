/* slurm.h — `deadpool run` under Slurm: what a task of an srun step learns from Slurm's
 * environment (job id, the step's nodes, this node's place among them, the requeue count),
 * the hostlist grammar ("node[1-3,5]"), and how that fills the job's options. Pure functions:
 * the environment comes through a lookup function, so the tests give their own. */
#ifndef DEADPOOL_SLURM_H
#define DEADPOOL_SLURM_H

#include <stddef.h>

#include "config.h"
#include "control.h"
#include "redis_server.h"

#define SLURM_HOST_MAX 64 /* a node name's room, its terminating 0 included */

typedef struct SlurmEnv {
    int in_step;            /* 1: a task of an srun step of a job (SLURM_JOB_ID, SLURM_NODEID, the step's nodes) */
    char job_id[40];        /* SLURM_JOB_ID (the same after a requeue) */
    int nnodes;             /* the step's nodes (SLURM_STEP_NUM_NODES, else SLURM_NNODES) */
    int node;               /* this node's index among them (SLURM_NODEID) */
    int ntasks;             /* the step's tasks (SLURM_STEP_NUM_TASKS; 0 = not said) */
    int restart_count;      /* SLURM_RESTART_COUNT: how many times the job was requeued (0 = first run) */
    int nhosts;             /* the step's node list, expanded (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST) */
    char hosts[DP_MAX_RANKS][SLURM_HOST_MAX];
} SlurmEnv;

/* Expands a Slurm hostlist ("node[1-3,5]", "a[01-02]b,c", "r[1-2]n[1-2]") into out, in order:
 * the number of names, or -1 with err naming the problem (unbalanced brackets, a bad range,
 * a name too long, more than max names). */
int slurm_hostlist_expand(const char *list, char (*out)[SLURM_HOST_MAX], int max, char *err, size_t errlen);

/* Reads Slurm's environment through get (getenv, or a test's). Not in a step: 0 with
 * s->in_step = 0. In a step: 0 with the fields set, or -1 with err naming the variable and
 * what it holds. */
int slurm_env_read(SlurmEnv *s, const char *(*get)(const char *name), char *err, size_t errlen);

/* Which options the command line gave (those win over Slurm's). */
typedef struct {
    int nnodes, nproc_per_node, job, workers, spares;
} SlurmGiven;

/* Fills what the command line left open from Slurm: --nnodes (the step's nodes less
 * --spare-nodes: the step's first --spare-nodes nodes are spare machines, node 0 (the batch
 * script's) first), --nproc-per-node (1), --job (the job id), and c->slurm. `said` gets the
 * start line's list of what came from Slurm ("job 42, 3 nodes (node[1-3]): 2 with ranks + 1
 * spare, this is node 0"). 0 / -1 + err (one launcher per node, --spare-nodes too large). */
int slurm_apply(JobConfig *c, const SlurmEnv *s, const SlurmGiven *given, char *said, size_t saidlen, char *err,
                size_t errlen);

/* The environment variable with the secret every node of the job shares (the batch script
 * draws it: srun hands it to every task); the control plane's password is derived from it. */
#define SLURM_SECRET_ENV "DEADPOOL_JOB_SECRET"
#define SLURM_SENTINEL_MASTER "deadpool" /* the name the sentinels monitor the master under */

/* Without --redis, a Slurm job brings its control plane: the step's node 1 runs the Redis
 * master, node 2 a replica, nodes 0, 1 and 2 a sentinel each (fewer nodes: node 0 takes what
 * is left), on ports drawn from the job's secret and id (slurm_plane_port); every node knows where from
 * the node list alone. Node 0 runs the batch script and srun: its loss ends the job whatever
 * DeadPool does, so it holds neither the master nor the replica (and is the spare node). The password is derived from SLURM_SECRET_ENV and the job id (BLAKE2b). This
 * node's share is started into master / replica / sentinels[3] (pid 0 = not here; their files
 * in dir, a private directory made here when needed) and *addr is the sentinels' address. 0 /
 * -1 + err. */
int slurm_control_plane(const SlurmEnv *s, const char *job, const char *secret, redis_server *master,
                        redis_server *replica, redis_server sentinels[3], char *dir, size_t dirlen, redis_addr *addr,
                        char *err, size_t errlen);
/* Where the master and the replica run: indexes into s->hosts. */
int slurm_plane_master(const SlurmEnv *s);
int slurm_plane_replica(const SlurmEnv *s);
/* The first of the job's ports: master P, replica P+1, sentinels P+2..P+4, P one of
 * SLURM_PORT_SLOTS in 20480..32712 drawn from the job's secret and id (job_secret_hash
 * "deadpool-slurm-port"): a user without the secret cannot tell which ports to take before the
 * job starts. Below Linux's ephemeral range (32768..60999 by default), so an outgoing
 * connection's local port never holds one (a sentinel once failed to bind 51724 so). -1 when
 * libsodium does not initialise. */
#define SLURM_PORT_BASE 20480
#define SLURM_PORT_SLOTS 1530
int slurm_plane_port(const char *job, const char *secret);

#endif
