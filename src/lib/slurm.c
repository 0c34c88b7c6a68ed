/* slurm.c — Slurm's environment and hostlists for `deadpool run` under srun (slurm.h). */
#include "slurm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* A decimal integer in [lo, hi] from the whole of text. 0 / -1. */
static int parse_int(const char *text, long lo, long hi, int *out) {
    if (!text || !*text) return -1;
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

/* Expands one hostlist item (no top-level comma), possibly with several bracket groups, after
 * `prefix`; appends to out. 0 / -1 + err. */
static int expand_item(const char *prefix, const char *s, size_t len, char (*out)[SLURM_HOST_MAX], int *n, int max,
                       char *err, size_t errlen) {
    const char *open = memchr(s, '[', len);
    const char *stray = memchr(s, ']', open ? (size_t)(open - s) : len);
    if (stray) { set_err(err, errlen, "hostlist: a ']' without its '[' in '%.*s'", (int)len, s); return -1; }
    if (!open) {
        if (strlen(prefix) + len + 1 > SLURM_HOST_MAX) {
            set_err(err, errlen, "hostlist: the name '%s%.*s' is longer than %d characters", prefix, (int)len, s,
                    SLURM_HOST_MAX - 1);
            return -1;
        }
        if (*n >= max) { set_err(err, errlen, "hostlist: more than %d names", max); return -1; }
        snprintf(out[*n], SLURM_HOST_MAX, "%s%.*s", prefix, (int)len, s);
        if (!out[*n][0]) { set_err(err, errlen, "hostlist: an empty name"); return -1; }
        (*n)++;
        return 0;
    }
    const char *close = memchr(open, ']', len - (size_t)(open - s));
    if (!close) { set_err(err, errlen, "hostlist: '[' without ']' in '%.*s'", (int)len, s); return -1; }
    char head[SLURM_HOST_MAX];
    if (strlen(prefix) + (size_t)(open - s) + 1 > SLURM_HOST_MAX) {
        set_err(err, errlen, "hostlist: a name longer than %d characters in '%.*s'", SLURM_HOST_MAX - 1, (int)len, s);
        return -1;
    }
    snprintf(head, sizeof head, "%s%.*s", prefix, (int)(open - s), s);
    const char *rest = close + 1;
    size_t rest_len = len - (size_t)(rest - s);
    /* The ranges: "1-3,5,07-09" (a range's width is its first number's, zeros kept). */
    const char *p = open + 1;
    if (p == close) { set_err(err, errlen, "hostlist: empty brackets in '%.*s'", (int)len, s); return -1; }
    while (p < close) {
        const char *comma = memchr(p, ',', (size_t)(close - p));
        const char *end = comma ? comma : close;
        const char *dash = memchr(p, '-', (size_t)(end - p));
        char a[16], b[16];
        size_t la = (size_t)((dash ? dash : end) - p), lb = dash ? (size_t)(end - dash - 1) : la;
        if (la == 0 || lb == 0 || la >= sizeof a || lb >= sizeof b) {
            set_err(err, errlen, "hostlist: expected N or N-M in brackets, found '%.*s'", (int)(end - p), p);
            return -1;
        }
        memcpy(a, p, la); a[la] = 0;
        memcpy(b, dash ? dash + 1 : p, lb); b[lb] = 0;
        int lo, hi;
        if (strspn(a, "0123456789") != la || strspn(b, "0123456789") != lb || parse_int(a, 0, 999999999, &lo) != 0 ||
            parse_int(b, 0, 999999999, &hi) != 0 || hi < lo) {
            set_err(err, errlen, "hostlist: expected N or N-M (N <= M) in brackets, found '%.*s'", (int)(end - p), p);
            return -1;
        }
        if (hi - lo >= max) { set_err(err, errlen, "hostlist: more than %d names", max); return -1; }
        for (int v = lo; v <= hi; v++) {
            char with[SLURM_HOST_MAX + 16];
            snprintf(with, sizeof with, "%s%0*d", head, (int)la, v);
            if (strlen(with) >= SLURM_HOST_MAX) {
                set_err(err, errlen, "hostlist: the name '%s...' is longer than %d characters", with, SLURM_HOST_MAX - 1);
                return -1;
            }
            if (expand_item(with, rest, rest_len, out, n, max, err, errlen) != 0) return -1;
        }
        p = comma ? comma + 1 : close;
        if (comma && p == close) { set_err(err, errlen, "hostlist: a ',' before ']' in '%.*s'", (int)len, s); return -1; }
    }
    return 0;
}

int slurm_hostlist_expand(const char *list, char (*out)[SLURM_HOST_MAX], int max, char *err, size_t errlen) {
    int n = 0;
    if (!list || !*list) { set_err(err, errlen, "hostlist: empty"); return -1; }
    const char *s = list;
    while (*s) {
        /* the item ends at a comma outside brackets */
        const char *e = s;
        int depth = 0;
        for (; *e && (depth || *e != ','); e++) {
            if (*e == '[') {
                if (depth) { set_err(err, errlen, "hostlist: nested '[' in '%s'", list); return -1; }
                depth = 1;
            } else if (*e == ']') depth = 0;
        }
        if (depth) { set_err(err, errlen, "hostlist: '[' without ']' in '%s'", list); return -1; }
        if (e == s) { set_err(err, errlen, "hostlist: an empty name in '%s'", list); return -1; }
        if (expand_item("", s, (size_t)(e - s), out, &n, max, err, errlen) != 0) return -1;
        s = *e ? e + 1 : e;
        if (*e && !*s) { set_err(err, errlen, "hostlist: a trailing ',' in '%s'", list); return -1; }
    }
    return n;
}

int slurm_env_read(SlurmEnv *s, const char *(*get)(const char *name), char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    const char *job = get("SLURM_JOB_ID"), *nodeid = get("SLURM_NODEID");
    const char *nnodes = get("SLURM_STEP_NUM_NODES"), *list = get("SLURM_STEP_NODELIST");
    if (!nnodes) nnodes = get("SLURM_NNODES");
    if (!list) list = get("SLURM_JOB_NODELIST");
    if (!job || !nodeid || !nnodes || !list) return 0; /* not a task of an srun step */
    if (!*job || strlen(job) >= sizeof s->job_id || strspn(job, "0123456789_") != strlen(job)) {
        set_err(err, errlen, "SLURM_JOB_ID: expected a job id (digits), found '%.60s'", job);
        return -1;
    }
    snprintf(s->job_id, sizeof s->job_id, "%s", job);
    if (parse_int(nnodes, 1, DP_MAX_RANKS, &s->nnodes) != 0) {
        set_err(err, errlen, "SLURM_STEP_NUM_NODES: expected a node count in [1, %d], found '%.60s'", DP_MAX_RANKS, nnodes);
        return -1;
    }
    if (parse_int(nodeid, 0, s->nnodes - 1, &s->node) != 0) {
        set_err(err, errlen, "SLURM_NODEID: expected a node index in [0, %d], found '%.60s'", s->nnodes - 1, nodeid);
        return -1;
    }
    const char *tasks = get("SLURM_STEP_NUM_TASKS");
    if (tasks && parse_int(tasks, 1, 1 << 30, &s->ntasks) != 0) {
        set_err(err, errlen, "SLURM_STEP_NUM_TASKS: expected a task count, found '%.60s'", tasks);
        return -1;
    }
    const char *restart = get("SLURM_RESTART_COUNT");
    if (restart && *restart && parse_int(restart, 0, 1 << 30, &s->restart_count) != 0) {
        set_err(err, errlen, "SLURM_RESTART_COUNT: expected a count, found '%.60s'", restart);
        return -1;
    }
    char why[512];
    s->nhosts = slurm_hostlist_expand(list, s->hosts, DP_MAX_RANKS, why, sizeof why);
    if (s->nhosts < 0) { set_err(err, errlen, "SLURM_STEP_NODELIST '%.200s': %s", list, why); return -1; }
    if (s->nhosts != s->nnodes) {
        set_err(err, errlen, "SLURM_STEP_NODELIST '%.200s' names %d nodes, SLURM_STEP_NUM_NODES says %d", list, s->nhosts,
                s->nnodes);
        return -1;
    }
    s->in_step = 1;
    return 0;
}

int slurm_apply(JobConfig *c, const SlurmEnv *s, const SlurmGiven *given, char *said, size_t saidlen, char *err,
                size_t errlen) {
    said[0] = 0;
    if (!s->in_step) return 0;
    /* One launcher per node: it starts the node's ranks (--nproc-per-node) itself. */
    if (s->ntasks > s->nnodes) {
        set_err(err, errlen, "this srun step runs %d tasks on %d nodes: deadpool run is one task per node (srun "
                "--ntasks-per-node=1); the ranks of a node are --nproc-per-node", s->ntasks, s->nnodes);
        return -1;
    }
    if (c->spare_nodes >= s->nnodes && !given->nnodes) {
        set_err(err, errlen, "--spare-nodes %d: the step has %d node(s), so at most %d can be spares", c->spare_nodes,
                s->nnodes, s->nnodes - 1);
        return -1;
    }
    size_t used = 0;
#define SAY(...) (used += (size_t)snprintf(said + used, used < saidlen ? saidlen - used : 0, __VA_ARGS__))
    if (!given->job) {
        snprintf(c->job, sizeof c->job, "%s", s->job_id);
        SAY("--job %s (SLURM_JOB_ID%s)", c->job, s->restart_count ? ", requeued" : "");
    }
    if (!given->nnodes) {
        c->nnodes = s->nnodes - c->spare_nodes;
        SAY("%s--nnodes %d (%d node(s) %s%s%s - --spare-nodes %d)", used ? ", " : "", c->nnodes, s->nnodes, s->hosts[0],
            s->nnodes > 1 ? ".." : "", s->nnodes > 1 ? s->hosts[s->nnodes - 1] : "", c->spare_nodes);
    }
    if (!given->nproc_per_node && c->nproc_per_node < 1) {
        c->nproc_per_node = 1;
        SAY("%s--nproc-per-node 1 (the default under Slurm)", used ? ", " : "");
    }
    SAY("%sthis is node %d (%s)", used ? ", " : "", s->node, s->hosts[s->node]);
#undef SAY
    c->slurm = 1;
    return 0;
}
