/* slurm.h — `deadpool run` under Slurm: what a task of an srun step learns from Slurm's
 * environment (job id, the step's nodes, this node's place among them, the requeue count),
 * the hostlist grammar ("node[1-3,5]"), and how that fills the job's options. Pure functions:
 * the environment comes through a lookup function, so the tests give their own. */
#ifndef DEADPOOL_SLURM_H
#define DEADPOOL_SLURM_H

#include <stddef.h>

#include "config.h"

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
 * --spare-nodes), --nproc-per-node (1), --job (the job id), and c->slurm. `said` gets the
 * start line's list of what came from Slurm ("job 42, 3 nodes (node[1-3]): 2 with ranks + 1
 * spare, this is node 0"). 0 / -1 + err (one launcher per node, --spare-nodes too large). */
int slurm_apply(JobConfig *c, const SlurmEnv *s, const SlurmGiven *given, char *said, size_t saidlen, char *err,
                size_t errlen);

#endif
