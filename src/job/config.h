/* config.h — the job's configuration: every option of `deadpool run` that belongs to the
 * runtime (the training program's own options belong to the program: the built-in GPT-2
 * trainer has its table in gpt2/options.c).
 *
 * One table (config.c) describes each option once. The launcher parses the command line
 * with it, stores the result in Redis as "name=value" lines, and every worker — local or on
 * another host — parses those lines with the same table, so all processes of a job agree. */
#ifndef DEADPOOL_CONFIG_H
#define DEADPOOL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

/* The most ranks (and spares) a job may have: every per-rank array is sized by it and
 * --workers / --spares are checked against it when parsed. */
#define DP_MAX_RANKS 1024
/* Room for the serialised config: every option at its longest. */
#define JOB_CONFIG_TEXT_MAX 32768
/* A program and its arguments, joined by this byte (never in an argument we accept). */
#define DP_ARG_SEP '\x1f'
/* The program that stands for the built-in GPT-2 trainer in `program`. */
#define DP_BUILTIN_PROGRAM "@gpt2"

typedef enum { FT_DEADPOOL = 0, FT_DISK = 1, FT_NONE = 2 } ft_mode;
typedef enum { PLACE_RING = 0, PLACE_SPARES = 1 } replica_placement;
typedef enum { TRANSPORT_AUTO = 0, TRANSPORT_TCP = 1 } replica_transport;

typedef struct {
    int workers;          /* data-parallel ranks */
    int spares;           /* warm spare processes */
    int steps;            /* optimizer steps to run */
    uint64_t seed;
    char out[1024];       /* output directory */
    char redis[1024];     /* redis URL; "" = embedded redis-server */
    int detect_timeout_ms;/* heartbeat expiry: a silent process is declared failed after this */
    int comm_timeout_ms;  /* bound on every collective; 0 = detect_timeout_ms */
    int start_timeout_ms; /* bound on joining the job (rendezvous, registration) */
    int ft;               /* ft_mode */
    int ckpt_every;       /* --ft disk: synchronous checkpoint every K steps */
    int persist_every;    /* --ft deadpool: write a committed snapshot to disk every K steps (0 = never) */
    int snapshot_every;   /* --ft deadpool: in-memory snapshot after every K-th step (default 1) */
    int replicas;         /* replica holders per rank */
    int replica_placement;/* replica_placement */
    int replica_transport;/* replica_transport */
    char resume[1024];    /* directory whose newest checkpoint the job continues from ("" = none) */
    int resume_step;      /* that checkpoint's step, -1 = fresh start (set by the launcher) */
    int spare_wait;       /* seconds to wait for a new spare when none is left */
    int control_wait;     /* seconds a failure waits for an unreachable control plane before the job stops */
    char inject[1024];    /* faults, inject.h's grammar */
    float chaos;          /* probability per step of a random fault (kill or stop) */
    int respawn_spares;   /* the launcher starts a new local spare for each one consumed */
    int metrics_port;     /* serve Prometheus /metrics on this port while the job runs (0 = off) */
    char bind[256];       /* address this host listens on for the metrics server ("" = 127.0.0.1) */
    int report;           /* 1: write DIR/report.html when the job ends */
    int fresh;            /* 1: --job's dead earlier run is discarded (not continued) */
    int redis_ha;         /* 1: the embedded control plane is a master, a replica and three sentinels */
    int nnodes;           /* --nnodes: machines that run ranks (0 = one machine, --workers ranks) */
    int nproc_per_node;   /* --nproc-per-node: ranks per machine (and spares per spare machine) */
    char job[40];         /* --job: the job's name in a Redis shared by its machines (the replica wire format holds 39 bytes) */
    char node_id[128];    /* --node-id: what identifies this machine ("" = boot id + hostname) */
    int spare_nodes;      /* --spare-nodes: under Slurm, how many of the step's nodes are spare machines */
    int slurm;            /* 1: a task of an srun step; what the command line left open came from Slurm (slurm.h) */
    const struct SlurmEnv *slurm_env; /* ...and Slurm's view of the step (not serialised; NULL = none) */
    const char *job_secret; /* --secret-file's secret, shared by the job's machines (not serialised; NULL = none) */
    char program[8192];   /* PROGRAM and ARGS joined by DP_ARG_SEP; DP_BUILTIN_PROGRAM first = GPT-2 */
} JobConfig;

/* Effective collective timeout. */
int job_comm_timeout_ms(const JobConfig *c);
/* How long a failure waits for an unreachable control plane before the job gives up on it (its
 * processes persist what they committed and stop): --control-wait. Without a failure nothing
 * waits for the control plane: training goes on however long it is away (issue 27, item 11). */
int job_control_outage_ms(const JobConfig *c);
/* Life of a machine's KEY_NODE_ALIVE (a sixteenth of the detect timeout, at least 1 ms): how
 * long a crashed machine goes unnoticed when no peer is in a collective with it. */
int node_alive_ttl_ms(const JobConfig *c);

void job_config_defaults(JobConfig *c);

/* Sets option `name` (without leading dashes) from its text value. 0, or -1 with err
 * ("--steps: expected an integer in [1, 1e+09], found 'x'"). */
int job_config_set(JobConfig *c, const char *name, const char *value, char *err, size_t errlen);
/* 1 if `name` is one of the job's options. */
int job_config_has(const char *name);
/* 1 if option `name` belongs to one machine of a multi-node job (its --out, --bind, ...):
 * machines joining a job may differ in these, never in the others. */
int job_config_node_local(const char *name);
/* Compares the job-wide options of mine with the job's (each a serialised config): 0 when
 * they agree, else -1 with err naming the first option that differs, both values. */
int job_config_mismatch(const char *mine, const char *job, char *err, size_t errlen);

/* Checks cross-field constraints after all options are set. 0 / -1 + err. */
int job_config_validate(const JobConfig *c, char *err, size_t errlen);

/* "name=value\n" lines for every option; job_config_parse_lines reads them back (lines of
 * other tables are skipped) and validates. */
int job_config_serialize(const JobConfig *c, char *buf, size_t len);
int job_config_parse_lines(JobConfig *c, const char *text, char *err, size_t errlen);

/* Splits c->program into argv (pointers into buf, NULL-terminated). The argument count. */
int job_config_program_argv(const JobConfig *c, char *buf, size_t len, char **argv, int max);

/* The command that continues this job from its checkpoints, for messages: `deadpool run
 * --resume OUT`, followed by `-- PROGRAM ARGS` unless the program is the built-in trainer
 * (--resume never runs the program a checkpoint names: it must be given again). buf. */
const char *job_config_resume_command(const JobConfig *c, char *buf, size_t len);

/* Prints the option table (name, default, help) for `deadpool run --help`. */
void job_config_print_help(void);

#endif
