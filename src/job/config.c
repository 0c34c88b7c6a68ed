/* config.c — the job's option table, its checks and (de)serialisation. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inject.h"
#include "options.h"
#include "util.h"

static const char *const FT_NAMES[] = {"deadpool", "disk", "none", NULL};
static const char *const PLACEMENT_NAMES[] = {"ring", "spares", NULL};
static const char *const TRANSPORT_NAMES[] = {"auto", "tcp", NULL};

#define F(field) offsetof(JobConfig, field)
#define S(field) offsetof(JobConfig, field), sizeof(((JobConfig *)0)->field)
static const OptSpec OPTIONS[] = {
    {"workers", OPT_INT, F(workers), 0, 1, DP_MAX_RANKS, NULL, "data-parallel worker processes"},
    {"spares", OPT_INT, F(spares), 0, 0, DP_MAX_RANKS, NULL, "warm spare processes"},
    {"steps", OPT_INT, F(steps), 0, 1, 1e9, NULL, "optimizer steps, numbered 1..K in --inject, the progress line and ckpt/step_N (0..K-1 in deadpool.h)"},
    {"seed", OPT_U64, F(seed), 0, 0, 0, NULL, "seed for initialisation and data sampling"},
    {"out", OPT_STR, S(out), 0, 0, NULL, "output directory (model.bin, metrics.jsonl, events.jsonl)"},
    {"redis", OPT_STR, S(redis), 0, 0, NULL, "redis://HOST:PORT (or redis-sentinel://, unix:///PATH), password in DEADPOOL_REDIS_PASSWORD or --redis-file FILE (a 0600 file holding the whole URL); a password written in this URL is readable by every user of the machine (ps) until deadpool overwrites it, at once but not before (default: embedded server on a unix socket only this user can open)"},
    {"detect-timeout-ms", OPT_INT, F(detect_timeout_ms), 0, 50, 3600000, NULL, "a silent (hung, cut off) process is failed after this"},
    {"comm-timeout-ms", OPT_INT, F(comm_timeout_ms), 0, 0, 3600000, NULL, "fixed base of every collective's bound (0 = the detect timeout + 4 usual steps; the bytes' time is added)"},
    {"start-timeout-ms", OPT_INT, F(start_timeout_ms), 0, 100, 3600000, NULL, "bound on joining the job"},
    {"ft", OPT_ENUM, F(ft), 0, 0, 0, FT_NAMES, "fault tolerance: deadpool (in-memory snapshots), disk, none"},
    {"ckpt-every", OPT_INT, F(ckpt_every), 0, 0, 1e9, NULL, "--ft disk: synchronous checkpoint every K steps"},
    {"persist-every", OPT_INT, F(persist_every), 0, 0, 1e9, NULL, "--ft deadpool: persist a committed snapshot every K steps (0 = never)"},
    {"snapshot-every", OPT_INT, F(snapshot_every), 0, 1, 1e9, NULL, "--ft deadpool: snapshot every K steps (a failure rolls back up to K)"},
    {"replicas", OPT_INT, F(replicas), 0, 0, 16, NULL, "replica holders per rank"},
    {"replica-placement", OPT_ENUM, F(replica_placement), 0, 0, 0, PLACEMENT_NAMES, "ring (rank i -> i+1 mod N) or spares"},
    {"replica-transport", OPT_ENUM, F(replica_transport), 0, 0, 0, TRANSPORT_NAMES, "auto (a holder on this machine copies from memory, else TCP) or tcp"},
    {"resume", OPT_STR, S(resume), 0, 0, NULL, "continue from the newest checkpoint in this directory"},
    {"resume-step", OPT_INT, F(resume_step), 0, -1, 1e9, NULL, "(internal) the checkpoint step --resume found"},
    {"spare-wait", OPT_INT, F(spare_wait), 0, 0, 1e6, NULL, "seconds to wait for a new spare when none is left (and a waiting spare, for a launcher that went away)"},
    {"control-wait", OPT_INT, F(control_wait), 0, 1, 1e6, NULL, "seconds a failure waits for an unreachable control plane (Redis) before the job stops with its committed state on disk; with no failure the job trains on however long Redis is away"},
    {"inject", OPT_LIST, S(inject), 0, 0, NULL, "fault kill|stop|netdown|corrupt:RANK@STEP (mid-step STEP, 1-based like the progress line; corrupt: RANK's replica holders damage their copies, by mid-step STEP-1), or rkill:RANK@EPOCH (dies recovering into EPOCH; 0: as the job starts); repeatable"},
    {"chaos", OPT_FLOAT, F(chaos), 0, 0, 1, NULL, "probability per step of a random kill or stop"},
    {"respawn-spares", OPT_INT, F(respawn_spares), 0, 0, 1, NULL, "start a new local spare for each one used, and at once one for each failed rank that finds no spare (one machine only: across machines spares are spare machines)"},
    {"metrics-port", OPT_INT, F(metrics_port), 0, 0, 65535, NULL, "serve Prometheus metrics at http://BIND:PORT/metrics while the job runs (0 = off)"},
    {"bind", OPT_STR, S(bind), 0, 0, NULL, "address the metrics server listens on (default 127.0.0.1, loopback only); with --nnodes also where this machine's processes are reached (default: the address it reaches Redis from)"},
    {"redis-ha", OPT_INT, F(redis_ha), 0, 0, 1, NULL, "embedded control plane with Redis Sentinel: a master, a replica and three sentinels on loopback (a master's loss is survived); --redis-ha alone = 1"},
    {"fresh", OPT_INT, F(fresh), 0, 0, 1, NULL, "with --job: a job id whose earlier run is dead (no launcher, machine or process of it left) starts afresh, its keys in Redis discarded (its checkpoints on disk stay); --fresh alone = 1. Without it such an id is refused, unless --resume continues from that run's checkpoints"},
    {"report", OPT_INT, F(report), 0, 0, 1, NULL, "write DIR/report.html (plots of the run) when the job ends; --report alone = 1"},
    {"nnodes", OPT_INT, F(nnodes), 0, 0, DP_MAX_RANKS, NULL, "machines that run ranks: run the same command on each (and on spare machines); needs --redis and --job"},
    {"nproc-per-node", OPT_INT, F(nproc_per_node), 0, 0, DP_MAX_RANKS, NULL, "with --nnodes: ranks per machine (a spare machine starts as many spares)"},
    {"job", OPT_STR, S(job), 0, 0, NULL, "with --nnodes: the job's name, the same on every machine"},
    {"node-id", OPT_STR, S(node_id), 0, 0, NULL, "with --nnodes: what identifies this machine (default: its boot id and hostname)"},
    {"spare-nodes", OPT_INT, F(spare_nodes), 0, 0, DP_MAX_RANKS, NULL, "under Slurm: how many of the step's nodes are spare machines (they start spares, not ranks)"},
    {"slurm", OPT_INT, F(slurm), 0, 0, 1, NULL, "(internal) 1: --nnodes, --job and the control plane came from Slurm"},
    {"program", OPT_STR, S(program), 0, 0, NULL, "(internal) the training program and its arguments"},
};
#undef F
#undef S
static const OptTable TABLE = {OPTIONS, sizeof OPTIONS / sizeof OPTIONS[0]};

void job_config_defaults(JobConfig *c) {
    memset(c, 0, sizeof *c);
    c->workers = 4;
    c->spares = 1;
    c->steps = 100;
    c->seed = 1337;
    snprintf(c->out, sizeof c->out, "out");
    c->start_timeout_ms = 60000;
    c->detect_timeout_ms = 2000;
    c->spare_wait = 30;
    c->control_wait = 60;
    c->respawn_spares = 1;
    c->ft = FT_DEADPOOL;
    c->replicas = 1;
    c->snapshot_every = 1;
    c->replica_placement = PLACE_RING;
    c->replica_transport = TRANSPORT_AUTO;
    c->resume_step = -1;
    snprintf(c->program, sizeof c->program, "%s", DP_BUILTIN_PROGRAM);
}

int job_comm_timeout_ms(const JobConfig *c) { return c->comm_timeout_ms ? c->comm_timeout_ms : c->detect_timeout_ms; }
int job_control_outage_ms(const JobConfig *c) { return c->control_wait > 0 ? c->control_wait * 1000 : 60000; }
int node_alive_ttl_ms(const JobConfig *c) { return c->detect_timeout_ms / 16 > 0 ? c->detect_timeout_ms / 16 : 1; }

int job_config_set(JobConfig *c, const char *name, const char *value, char *err, size_t errlen) {
    return opt_set(TABLE, c, name, value, err, errlen);
}

int job_config_has(const char *name) { return opt_find(TABLE, name) != NULL; }

static const char *const NODE_LOCAL[] = {"out", "redis", "redis-ha", "bind", "metrics-port", "report", "node-id", "resume", "fresh", NULL};

int job_config_node_local(const char *name) {
    for (int i = 0; NODE_LOCAL[i]; i++)
        if (!strcmp(NODE_LOCAL[i], name)) return 1;
    return 0;
}

/* The value of option `name` in a serialised config ("" when absent) into out. */
static void config_value(const char *text, const char *name, char *out, size_t len) {
    size_t n = strlen(name);
    out[0] = 0;
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        if (!strncmp(line, name, n) && line[n] == '=') {
            snprintf(out, len, "%.*s", (int)strcspn(line + n + 1, "\n"), line + n + 1);
            return;
        }
}

int job_config_mismatch(const char *mine, const char *job, char *err, size_t errlen) {
    static char a[JOB_CONFIG_TEXT_MAX], b[JOB_CONFIG_TEXT_MAX];
    for (size_t i = 0; i < TABLE.n; i++) {
        const char *name = TABLE.opts[i].name;
        if (job_config_node_local(name) || !strcmp(name, "resume-step")) continue; /* the first machine chooses it */
        config_value(mine, name, a, sizeof a);
        config_value(job, name, b, sizeof b);
        if (strcmp(a, b) != 0) {
            for (char *p = a; *p; p++) if (*p == DP_ARG_SEP) *p = ' ';
            for (char *p = b; *p; p++) if (*p == DP_ARG_SEP) *p = ' ';
            snprintf(err, errlen, "--%s: this machine has '%.300s', the job (as its first machine created it) has "
                     "'%.300s'", name, a, b);
            return -1;
        }
    }
    return 0;
}

int job_config_validate(const JobConfig *c, char *err, size_t errlen) {
    if (!c->out[0]) { snprintf(err, errlen, "--out: expected a directory, found nothing"); return -1; }
    if (!c->program[0]) { snprintf(err, errlen, "expected a program to run, found nothing"); return -1; }
    if (c->ft == FT_DISK && c->ckpt_every < 1) {
        snprintf(err, errlen, "--ft disk needs --ckpt-every K (K >= 1)");
        return -1;
    }
    if (c->persist_every > 0 && c->persist_every % c->snapshot_every != 0) {
        snprintf(err, errlen, "--persist-every: expected a multiple of --snapshot-every (%d), found %d", c->snapshot_every,
                 c->persist_every);
        return -1;
    }
    if (c->replica_placement == PLACE_SPARES && c->replicas > c->spares) {
        snprintf(err, errlen, "--replica-placement spares: --replicas %d needs at least that many spares, found --spares %d",
                 c->replicas, c->spares);
        return -1;
    }
    if (c->redis_ha && (c->redis[0] || c->nnodes > 0)) {
        snprintf(err, errlen, "--redis-ha starts an embedded control plane on this machine: not with --redis or --nnodes "
                 "(give a redis-sentinel:// URL instead)");
        return -1;
    }
    if (c->nnodes > 0) {
        if (!c->redis[0] && !c->slurm) { snprintf(err, errlen, "--nnodes: expected --redis URL (every machine must reach the same Redis), found none"); return -1; }
        if (!c->job[0]) { snprintf(err, errlen, "--nnodes: expected --job NAME (the same on every machine), found none"); return -1; }
        if (c->nproc_per_node < 1) { snprintf(err, errlen, "--nnodes: expected --nproc-per-node P (P >= 1), found %d", c->nproc_per_node); return -1; }
        if ((long)c->nnodes * c->nproc_per_node > DP_MAX_RANKS) {
            snprintf(err, errlen, "--nnodes %d x --nproc-per-node %d: expected at most %d ranks", c->nnodes, c->nproc_per_node, DP_MAX_RANKS);
            return -1;
        }
        if (c->workers != c->nnodes * c->nproc_per_node) {
            snprintf(err, errlen, "--workers %d: with --nnodes it is --nnodes x --nproc-per-node = %d", c->workers,
                     c->nnodes * c->nproc_per_node);
            return -1;
        }
        if (inject_netdown_rank(c->inject) >= 0) { snprintf(err, errlen, "--inject netdown: one machine only (cut a machine's link instead)"); return -1; }
        if (c->ft == FT_DISK) {
            snprintf(err, errlen, "--ft disk: one machine only (its restart needs every checkpoint file on one disk); "
                     "across machines use --ft deadpool with --persist-every K");
            return -1;
        }
        if (c->ft == FT_DEADPOOL && c->replica_placement == PLACE_RING && c->replicas > c->nnodes - 1) {
            snprintf(err, errlen, "--replicas %d: each rank's replicas live on other machines, so --nnodes must be at least "
                     "%d, found %d (or --replica-placement spares)", c->replicas, c->replicas + 1, c->nnodes);
            return -1;
        }
    }
    if (c->spare_nodes > 0 && !c->slurm) {
        snprintf(err, errlen, "--spare-nodes %d: only under Slurm (in an srun step); elsewhere run the same command on "
                 "more machines than --nnodes", c->spare_nodes);
        return -1;
    }
    for (const char *p = c->job; *p; p++)
        if (!name_char((unsigned char)*p)) {
            snprintf(err, errlen, "--job: expected letters, digits, '-', '_' or '.', found '%.60s'", c->job);
            return -1;
        }
    FaultSpec faults[INJECT_MAX];
    if (inject_parse(c->inject, c->workers, faults, INJECT_MAX, err, errlen) < 0) return -1;
    if (c->redis[0] && inject_netdown_rank(c->inject) >= 0) { /* redis must listen on the namespace's link */
        snprintf(err, errlen, "--inject netdown needs the embedded redis-server: a Redis the job does not own "
                 "(--redis %.200s) is never reconfigured", c->redis);
        return -1;
    }
    return 0;
}

int job_config_serialize(const JobConfig *c, char *buf, size_t len) { return opt_serialize(TABLE, c, buf, len); }

int job_config_parse_lines(JobConfig *c, const char *text, char *err, size_t errlen) {
    job_config_defaults(c);
    if (opt_parse_lines(TABLE, c, text, 1, err, errlen) != 0) return -1;
    return job_config_validate(c, err, errlen);
}

int job_config_program_argv(const JobConfig *c, char *buf, size_t len, char **argv, int max) {
    snprintf(buf, len, "%s", c->program);
    int n = 0;
    char *p = buf;
    while (p && *p && n < max - 1) {
        argv[n++] = p;
        p = strchr(p, DP_ARG_SEP);
        if (p) *p++ = 0;
    }
    argv[n] = NULL;
    return n;
}

const char *job_config_resume_command(const JobConfig *c, char *buf, size_t len) {
    size_t n = strlen(DP_BUILTIN_PROGRAM);
    if (!strncmp(c->program, DP_BUILTIN_PROGRAM, n) && (c->program[n] == 0 || c->program[n] == DP_ARG_SEP)) {
        snprintf(buf, len, "deadpool run --resume %s", c->out);
        return buf;
    }
    snprintf(buf, len, "deadpool run --resume %s -- %s", c->out, c->program);
    for (char *p = buf; *p; p++)
        if (*p == DP_ARG_SEP) *p = ' ';
    return buf;
}

void job_config_print_help(void) {
    JobConfig d;
    job_config_defaults(&d);
    opt_print_help(TABLE, &d);
}
