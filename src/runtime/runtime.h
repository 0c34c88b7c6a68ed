/* runtime.h — what the launcher and the CLI share with the runtime behind deadpool.h: the
 * exit statuses of a job's processes and the environment through which a launcher hands a
 * process its job (the only place these names are spelled). */
#ifndef DEADPOOL_RUNTIME_H
#define DEADPOOL_RUNTIME_H

#include <stddef.h>

#include "config.h"

/* Exit statuses of a DeadPool process (dp_finish returns them). */
typedef enum {
    DP_EXIT_DONE = 0,    /* every step done */
    DP_EXIT_BAD_JOB = 1, /* bad configuration: a replacement would fail alike */
    DP_EXIT_FAILED = 2,  /* training failed and no recovery decision came */
    DP_EXIT_STOPPED = 3, /* stopped by the job (Ctrl-C, or the job ended elsewhere) */
    DP_EXIT_FENCED = 4,  /* a newer epoch replaced this process (it hung or was cut off) */
    DP_EXIT_OUTPUT = 5   /* every step done, but the program could not write its output: not a
                          * crash (no spare is swapped in); its own message says what was kept */
} dp_exit;

#define DP_ENV_REDIS "DEADPOOL_REDIS"       /* redis://HOST:PORT of the job's control plane */
#define DP_ENV_PASSWORD "DEADPOOL_REDIS_PASSWORD"
#define DP_ENV_JOB "DEADPOOL_JOB"
#define DP_ENV_RANK "DEADPOOL_RANK"         /* the rank to claim; absent: the first free one */
#define DP_ENV_SPARE "DEADPOOL_SPARE"       /* "1": join as a spare */
#define DP_ENV_BIND "DEADPOOL_BIND"         /* the address peers reach this process at */
#define DP_ENV_NODE "DEADPOOL_NODE"         /* the machine (failure domain) this process runs on */
#define DP_ENV_OUT "DEADPOOL_OUT"           /* this machine's output directory (else the job's --out) */
#define DP_ENV_RESUME "DEADPOOL_RESUME"     /* this machine's --resume directory (else the job's) */
#define DP_ENV_PROC "DEADPOOL_PROC"         /* the process id its launcher drew for it (else drawn at init) */

typedef struct {
    const char *redis_url;  /* password from the URL or DEADPOOL_REDIS_PASSWORD */
    const char *job;
    int spare;              /* join as a spare even if a rank is free */
    int rank;               /* claim this rank; -1 = first free rank */
    const char *bind_host;  /* address peers reach this process at (NULL: 127.0.0.1) */
    const char *node;       /* the machine's node id (NULL: node_id_default) */
    const char *out;        /* this machine's output directory (NULL: the job's --out) */
    const char *resume;     /* this machine's --resume directory (NULL: the job's) */
    long proc;              /* a process id drawn by the launcher (0: drawn by the process) */
    const char *secret_file; /* the job's shared secret (secret.h; NULL: DEADPOOL_JOB_KEY is set) */
} WorkerArgs;

/* Node ids name failure domains: two processes share a node when they would die with the same
 * machine. The default is the hostname and the kernel's boot id (a hostname alone is not
 * unique: clusters reuse them, containers copy them). Only [A-Za-z0-9._-] (it is part of
 * Redis keys); 0, or -1 when the boot id cannot be read. */
int node_id_default(char *buf, size_t len);
/* Where rank looks for replica holders (rt_placement.c's ring_holders): offsets into the ring of
 * world ranks, per_node ranks per machine (0 = one machine); world - 1 entries. */
void holder_offsets(int world, int per_node, int *offsets);
/* The ranks `rank` asks to hold its replicas, in order of preference (world - 1 entries): the
 * holder_offsets order, those outside rank's block of `block` consecutive ranks first
 * (dp_replica_spread; 0: no blocks). ring_holders then takes them machine by machine. */
void holder_order(int world, int per_node, int block, int rank, int *order);
/* Keeps only [A-Za-z0-9._-] of an id given by the user (other bytes become '_'). */
void node_id_clean(char *id);

/* `deadpool worker`: reads the job's program from its Redis and replaces this process with
 * it, the job handed over in the environment. self_exe runs the built-in trainer. Returns
 * only on failure (an exit status, message on stderr). */
int worker_exec(const WorkerArgs *a, const char *self_exe);
/* Sets the environment variables above for a process of this job. */
void worker_env_set(const WorkerArgs *a);
/* Fills argv (pointers into buf, NULL-terminated) with the job's program, the built-in
 * trainer mapped to self_exe + "train". The argument count. */
int program_argv(const JobConfig *c, const char *self_exe, char *buf, size_t len, char **argv, int max);

#endif
