/* config.c — option table, parsing, validation and (de)serialisation of JobConfig. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { OPT_INT, OPT_U64, OPT_FLOAT, OPT_STR, OPT_LIST } OptType; /* LIST: repeated flags append */

typedef struct {
    const char *name;
    OptType type;
    size_t offset;
    double min, max; /* numeric range, inclusive */
    const char *help;
} OptSpec;

#define F(field) offsetof(JobConfig, field)
static const OptSpec OPTIONS[] = {
    {"workers", OPT_INT, F(workers), 1, 4096, "data-parallel worker processes"},
    {"spares", OPT_INT, F(spares), 0, 4096, "warm spare processes"},
    {"model", OPT_STR, F(model), 0, 0, "preset (tiny, small, gpt2-124m) or llm.c model file"},
    {"data", OPT_STR, F(data), 0, 0, "llm.c token shard or text file (default: built-in corpus)"},
    {"steps", OPT_INT, F(steps), 1, 1e9, "optimizer steps"},
    {"seed", OPT_U64, F(seed), 0, 0, "seed for initialisation and data sampling"},
    {"batch", OPT_INT, F(batch), 1, 65536, "sequences per micro-batch per rank (B)"},
    {"seq-len", OPT_INT, F(seq_len), 0, 1 << 20, "tokens per sequence (T); 0 = model's max"},
    {"grad-accum", OPT_INT, F(grad_accum), 1, 65536, "micro-batches per rank per step"},
    {"lr", OPT_FLOAT, F(lr), 0, 10, "peak learning rate"},
    {"warmup", OPT_INT, F(warmup), 0, 1e9, "linear warmup steps"},
    {"weight-decay", OPT_FLOAT, F(weight_decay), 0, 10, "AdamW decoupled weight decay"},
    {"grad-clip", OPT_FLOAT, F(grad_clip), 0, 1e9, "max global gradient norm (0 = off)"},
    {"final-lr-frac", OPT_FLOAT, F(final_lr_frac), 0, 1, "cosine schedule floor, fraction of lr"},
    {"out", OPT_STR, F(out), 0, 0, "output directory (model.bin, metrics.jsonl, events.jsonl)"},
    {"redis", OPT_STR, F(redis), 0, 0, "redis://[:PASSWORD@]HOST:PORT (default: embedded server)"},
    {"threads", OPT_INT, F(threads), 1, 256, "BLAS threads per worker"},
    {"detect-timeout-ms", OPT_INT, F(detect_timeout_ms), 50, 3600000, "a silent (hung, cut off) process is failed after this"},
    {"comm-timeout-ms", OPT_INT, F(comm_timeout_ms), 0, 3600000, "bound on every collective (0 = detect timeout)"},
    {"start-timeout-ms", OPT_INT, F(start_timeout_ms), 100, 3600000, "bound on joining the job"},
    {"ft", OPT_STR, F(ft), 0, 0, "fault tolerance: deadpool (in-memory snapshots), disk, none"},
    {"ckpt-every", OPT_INT, F(ckpt_every), 0, 1e9, "--ft disk: synchronous checkpoint every K steps"},
    {"persist-every", OPT_INT, F(persist_every), 0, 1e9, "--ft deadpool: persist a committed snapshot every K steps (0 = never)"},
    {"snapshot-every", OPT_INT, F(snapshot_every), 1, 1e9, "--ft deadpool: snapshot every K steps (default 1; a failure rolls back up to K)"},
    {"replicas", OPT_INT, F(replicas), 0, 16, "replica holders per rank"},
    {"replica-placement", OPT_STR, F(replica_placement), 0, 0, "ring (rank i -> i+1 mod N) or spares"},
    {"replica-transport", OPT_STR, F(replica_transport), 0, 0, "auto (a holder on this machine copies from memory, else TCP) or tcp"},
    {"resume", OPT_STR, F(resume), 0, 0, "continue from the newest checkpoint in this directory"},
    {"resume-step", OPT_INT, F(resume_step), -1, 1e9, "(internal) the checkpoint step --resume found"},
    {"spare-wait", OPT_INT, F(spare_wait), 0, 1e6, "seconds to wait for a new spare when none is left"},
    {"inject", OPT_LIST, F(inject), 0, 0, "fault kill|stop|netdown:RANK@STEP (mid-step), or rkill:RANK@EPOCH (dies recovering); repeatable"},
    {"chaos", OPT_FLOAT, F(chaos), 0, 1, "probability per step of a random kill or stop"},
    {"respawn-spares", OPT_INT, F(respawn_spares), 0, 1, "start a new local spare for each one used"},
};
#undef F
#define NUM_OPTIONS (sizeof OPTIONS / sizeof OPTIONS[0])

void job_config_defaults(JobConfig *c) {
    memset(c, 0, sizeof *c);
    c->workers = 4;
    c->spares = 1;
    snprintf(c->model, sizeof c->model, "tiny");
    c->steps = 100;
    c->seed = 1337;
    c->batch = 4;
    c->grad_accum = 1;
    c->lr = 1e-3f;
    c->warmup = 0;
    c->weight_decay = 0.0f;
    c->grad_clip = 1.0f;
    c->final_lr_frac = 0.1f;
    snprintf(c->out, sizeof c->out, "out");
    c->threads = 1;
    c->start_timeout_ms = 60000;
    c->detect_timeout_ms = 2000;
    c->spare_wait = 30;
    c->respawn_spares = 1;
    snprintf(c->ft, sizeof c->ft, "deadpool");
    c->replicas = 1;
    c->snapshot_every = 1;
    snprintf(c->replica_placement, sizeof c->replica_placement, "ring");
    snprintf(c->replica_transport, sizeof c->replica_transport, "auto");
    c->resume_step = -1;
}

/* String fields are char arrays of different sizes: the gap to the next field's offset
 * would be fragile, so name them. */
static size_t field_capacity(const OptSpec *o) {
    if (o->offset == offsetof(JobConfig, ft)) return sizeof(((JobConfig *)0)->ft);
    if (o->offset == offsetof(JobConfig, replica_placement)) return sizeof(((JobConfig *)0)->replica_placement);
    if (o->offset == offsetof(JobConfig, replica_transport)) return sizeof(((JobConfig *)0)->replica_transport);
    return 1024;
}

static const OptSpec *find_option(const char *name) {
    for (size_t i = 0; i < NUM_OPTIONS; i++)
        if (strcmp(OPTIONS[i].name, name) == 0) return &OPTIONS[i];
    return NULL;
}

static int set_number(const OptSpec *o, void *field, const char *value, char *err, size_t errlen) {
    char *end = NULL;
    errno = 0;
    if (o->type == OPT_U64) {
        unsigned long long v = strtoull(value, &end, 10);
        if (errno || end == value || *end || value[0] == '-') goto bad;
        *(uint64_t *)field = v;
        return 0;
    }
    double v = o->type == OPT_INT ? (double)strtoll(value, &end, 10) : strtod(value, &end);
    if (errno || end == value || *end || v < o->min || v > o->max) goto bad;
    if (o->type == OPT_INT) *(int *)field = (int)v;
    else *(float *)field = (float)v;
    return 0;
bad:
    if (o->type == OPT_U64)
        snprintf(err, errlen, "--%s: expected a non-negative integer, found '%s'", o->name, value);
    else
        snprintf(err, errlen, "--%s: expected %s in [%g, %g], found '%s'", o->name,
                 o->type == OPT_INT ? "an integer" : "a number", o->min, o->max, value);
    return -1;
}

static int job_config_set_list(JobConfig *c, const OptSpec *o, const char *value, char *err, size_t errlen) {
    if (strlen(value) >= 1024) { snprintf(err, errlen, "--%s: more than 1023 characters in all", o->name); return -1; }
    snprintf((char *)c + o->offset, 1024, "%s", value);
    return 0;
}

int job_comm_timeout_ms(const JobConfig *c) { return c->comm_timeout_ms ? c->comm_timeout_ms : c->detect_timeout_ms; }

int job_config_set(JobConfig *c, const char *name, const char *value, char *err, size_t errlen) {
    const OptSpec *o = find_option(name);
    if (!o) { snprintf(err, errlen, "unknown option --%s (see deadpool run --help)", name); return -1; }
    void *field = (char *)c + o->offset;
    if (o->type != OPT_STR && o->type != OPT_LIST) return set_number(o, field, value, err, errlen);
    if (o->type == OPT_LIST && ((char *)field)[0] && value[0]) {
        char joined[2100];
        snprintf(joined, sizeof joined, "%s,%s", (char *)field, value);
        return job_config_set_list(c, o, joined, err, errlen);
    }
    if (strlen(value) >= 1024 || strchr(value, '\n')) {
        snprintf(err, errlen, "--%s: value too long or contains a newline", name);
        return -1;
    }
    size_t cap = field_capacity(o);
    if (strlen(value) >= cap) {
        snprintf(err, errlen, "--%s: value longer than %zu characters", name, cap - 1);
        return -1;
    }
    snprintf((char *)field, cap, "%s", value);
    return 0;
}

/* "kind:RANK@STEP[,...]" with kind kill, stop or netdown. */
static int check_faults(const char *list, char *err, size_t errlen) {
    const char *at = list;
    while (*at) {
        char kind[16];
        int rank, step, n = 0;
        if (sscanf(at, "%15[a-z]:%d@%d%n", kind, &rank, &step, &n) != 3 || rank < 0 || step < 1 ||
            (strcmp(kind, "kill") && strcmp(kind, "stop") && strcmp(kind, "netdown") && strcmp(kind, "rkill"))) {
            snprintf(err, errlen, "--inject: expected kill|stop|netdown:RANK@STEP or rkill:RANK@EPOCH, found '%.60s'", at);
            return -1;
        }
        at += n;
        if (*at == ',') at++;
        else if (*at) { snprintf(err, errlen, "--inject: unexpected '%.30s'", at); return -1; }
    }
    return 0;
}

int job_config_validate(const JobConfig *c, char *err, size_t errlen) {
    if (!c->model[0]) { snprintf(err, errlen, "--model: expected a preset or a file, found nothing"); return -1; }
    if (!c->out[0]) { snprintf(err, errlen, "--out: expected a directory, found nothing"); return -1; }
    if (strcmp(c->ft, "deadpool") && strcmp(c->ft, "disk") && strcmp(c->ft, "none")) {
        snprintf(err, errlen, "--ft: expected deadpool, disk or none, found '%s'", c->ft);
        return -1;
    }
    if (!strcmp(c->ft, "disk") && c->ckpt_every < 1) {
        snprintf(err, errlen, "--ft disk needs --ckpt-every K (K >= 1)");
        return -1;
    }
    if (c->persist_every > 0 && c->persist_every % c->snapshot_every != 0) {
        snprintf(err, errlen, "--persist-every: expected a multiple of --snapshot-every (%d), found %d", c->snapshot_every,
                 c->persist_every);
        return -1;
    }
    if (strcmp(c->replica_placement, "ring") && strcmp(c->replica_placement, "spares")) {
        snprintf(err, errlen, "--replica-placement: expected ring or spares, found '%s'", c->replica_placement);
        return -1;
    }
    if (strcmp(c->replica_transport, "auto") && strcmp(c->replica_transport, "tcp")) {
        snprintf(err, errlen, "--replica-transport: expected auto or tcp, found '%s'", c->replica_transport);
        return -1;
    }
    if (!strcmp(c->replica_placement, "spares") && c->replicas > c->spares) {
        snprintf(err, errlen, "--replica-placement spares: --replicas %d needs at least that many spares, found --spares %d",
                 c->replicas, c->spares);
        return -1;
    }
    if (check_faults(c->inject, err, errlen) != 0) return -1;
    if (c->warmup > c->steps) {
        snprintf(err, errlen, "--warmup: expected <= --steps (%d), found %d", c->steps, c->warmup);
        return -1;
    }
    return 0;
}

/* Formats one option's value; %.9g round-trips every float exactly. */
static int format_value(const JobConfig *c, const OptSpec *o, char *buf, size_t len) {
    const void *field = (const char *)c + o->offset;
    switch (o->type) {
    case OPT_INT: return snprintf(buf, len, "%d", *(const int *)field);
    case OPT_U64: return snprintf(buf, len, "%" PRIu64, *(const uint64_t *)field);
    case OPT_FLOAT: return snprintf(buf, len, "%.9g", (double)*(const float *)field);
    default: return snprintf(buf, len, "%s", (const char *)field); /* OPT_STR, OPT_LIST */
    }
}

int job_config_serialize(const JobConfig *c, char *buf, size_t len) {
    size_t used = 0;
    for (size_t i = 0; i < NUM_OPTIONS; i++) {
        char value[1100];
        format_value(c, &OPTIONS[i], value, sizeof value);
        int n = snprintf(buf + used, len - used, "%s=%s\n", OPTIONS[i].name, value);
        if (n < 0 || (size_t)n >= len - used) return -1;
        used += (size_t)n;
    }
    return 0;
}

int job_config_parse_lines(JobConfig *c, const char *text, char *err, size_t errlen) {
    job_config_defaults(c);
    const char *line = text;
    while (*line) {
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        char buf[1200];
        if (n >= sizeof buf) { snprintf(err, errlen, "job config: line too long"); return -1; }
        memcpy(buf, line, n);
        buf[n] = 0;
        char *eq = strchr(buf, '=');
        if (n > 0) {
            if (!eq) { snprintf(err, errlen, "job config: malformed line '%s'", buf); return -1; }
            *eq = 0;
            if (job_config_set(c, buf, eq + 1, err, errlen) != 0) return -1;
        }
        line += n + (nl ? 1 : 0);
    }
    return job_config_validate(c, err, errlen);
}

void job_config_print_help(void) {
    JobConfig d;
    job_config_defaults(&d);
    for (size_t i = 0; i < NUM_OPTIONS; i++) {
        char def[1100];
        format_value(&d, &OPTIONS[i], def, sizeof def);
        printf("  --%-18s %s%s%s%s\n", OPTIONS[i].name, OPTIONS[i].help, def[0] ? " [" : "", def, def[0] ? "]" : "");
    }
}
