/* config.h — the job configuration: every `deadpool run` option, its default and its check.
 *
 * One table describes each option once. The launcher parses the command line with it, stores
 * the result in Redis as "name=value" lines, and every worker — local or from another host —
 * parses those lines with the same table, so all processes of a job train the same thing. */
#ifndef DEADPOOL_CONFIG_H
#define DEADPOOL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int workers;          /* data-parallel ranks */
    int spares;           /* warm spare processes */
    char model[1024];     /* preset name or llm.c model file */
    char data[1024];      /* token shard or text file; "" = built-in corpus */
    int steps;            /* optimizer steps to run */
    uint64_t seed;
    int batch;            /* sequences per micro-batch (B) */
    int seq_len;          /* tokens per sequence (T); 0 = the model's max_seq_len */
    int grad_accum;       /* micro-batches per rank per step */
    float lr, weight_decay, grad_clip, final_lr_frac;
    int warmup;           /* warmup steps */
    char out[1024];       /* output directory */
    char redis[1024];     /* redis URL; "" = embedded redis-server */
    int threads;          /* BLAS threads per worker */
    int detect_timeout_ms;/* heartbeat expiry: a silent process is declared failed after this */
    int comm_timeout_ms;  /* bound on every collective; 0 = detect_timeout_ms */
    int start_timeout_ms; /* bound on joining the job (rendezvous, registration) */
    char ft[16];          /* fault tolerance: "deadpool", "disk" or "none" */
    int ckpt_every;       /* --ft disk: synchronous checkpoint every K steps */
    int persist_every;    /* --ft deadpool: write a committed snapshot to disk every K steps (0 = never) */
    int snapshot_every;   /* --ft deadpool: in-memory snapshot after every K-th step (default 1) */
    int replicas;         /* replica holders per rank */
    char replica_placement[16]; /* "ring" (rank i -> i+1..i+R) or "spares" */
    char replica_transport[16]; /* "auto" (same-machine holders pull from memory) or "tcp" */
    char resume[1024];    /* directory whose newest checkpoint the job continues from ("" = none) */
    int resume_step;      /* that checkpoint's step, -1 = fresh start (set by the launcher) */
    int spare_wait;       /* seconds to wait for a new spare when none is left */
    char inject[1024];    /* faults "kind:RANK@STEP,..." (kind: kill, stop, netdown) */
    float chaos;          /* probability per step of a random fault (kill or stop) */
    int respawn_spares;   /* the launcher starts a new local spare for each one consumed */
} JobConfig;

/* Effective collective timeout. */
int job_comm_timeout_ms(const JobConfig *c);

void job_config_defaults(JobConfig *c);

/* Sets option `name` (without leading dashes) from its text value. 0, or -1 with err
 * ("--steps: expected an integer >= 1, found 'x'"). */
int job_config_set(JobConfig *c, const char *name, const char *value, char *err, size_t errlen);
/* Checks cross-field constraints after all options are set. 0 / -1 + err. */
int job_config_validate(const JobConfig *c, char *err, size_t errlen);

/* "name=value\n" lines for every option; job_config_parse_lines reads them back. */
int job_config_serialize(const JobConfig *c, char *buf, size_t len);
int job_config_parse_lines(JobConfig *c, const char *text, char *err, size_t errlen);

/* Prints the option table (name, default, help) for `deadpool run --help`. */
void job_config_print_help(void);

#endif
