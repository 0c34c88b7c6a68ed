/* slurm.c — Slurm's environment and hostlists for `deadpool run` under srun (slurm.h). */
#include "slurm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sodium.h>
#include <sys/socket.h>

#include "secret.h"
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
    if (s->nnodes == 1 && !given->nnodes) {
        /* One node (a user debugging, say): a one-machine job, its Redis private to this node,
         * its spares local, its replicas on its other processes. */
        if (!given->job) snprintf(c->job, sizeof c->job, "%s", s->job_id);
        c->workers = c->nproc_per_node > 0 ? c->nproc_per_node : 1;
        c->nproc_per_node = 0;
        c->nnodes = 0;
        c->slurm = 0;
        SAY("one node (%s): a one-machine job, --job %s, %d rank(s) and %d local spare(s); warning: every replica is "
            "on this node, so losing it loses the in-memory state (--persist-every K keeps checkpoints on its disk)",
            s->hosts[0], c->job, c->workers, c->spares);
        return 0;
    }
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

int slurm_plane_master(const SlurmEnv *s) { return s->nhosts > 1 ? 1 : 0; }
int slurm_plane_replica(const SlurmEnv *s) { return s->nhosts > 2 ? 2 : 0; }

int slurm_plane_port(const char *job, const char *secret) {
    char h[JOB_KEY_HEX_LEN + 1];
    if (job_secret_hash("deadpool-slurm-port", job, secret, h) != 0) return -1;
    h[8] = 0; /* 32 bits of the hash are plenty to pick one of SLURM_PORT_SLOTS */
    unsigned long v = strtoul(h, NULL, 16);
    sodium_memzero(h, sizeof h);
    return SLURM_PORT_BASE + (int)(v % SLURM_PORT_SLOTS) * 8;
}

/* The IPv4 address of a node name (its first). 0 / -1 + err. */
static int node_address(const char *name, char *out, size_t len, char *err, size_t errlen) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int r = getaddrinfo(name, NULL, &hints, &res);
    if (r != 0 || !res) {
        set_err(err, errlen, "node '%s' of SLURM_STEP_NODELIST has no IPv4 address: %s", name, gai_strerror(r));
        return -1;
    }
    inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, out, (socklen_t)len);
    freeaddrinfo(res);
    return 0;
}

int slurm_control_plane(const SlurmEnv *s, const char *job, const char *secret, redis_server *master,
                        redis_server *replica, redis_server sentinels[3], char *dir, size_t dirlen, redis_addr *addr,
                        char *err, size_t errlen) {
    memset(master, 0, sizeof *master);
    memset(replica, 0, sizeof *replica);
    memset(sentinels, 0, 3 * sizeof *sentinels);
    memset(addr, 0, sizeof *addr);
    if (!secret || strlen(secret) < 16) {
        set_err(err, errlen, "under Slurm without --redis the job's nodes start its control plane, and they need a "
                "secret they share: the batch script draws it before srun, e.g. `export %s=$(head -c 32 /dev/urandom | "
                "od -An -tx1 | tr -d ' \\n')` (srun passes it to every node; never on a command line)%s",
                SLURM_SECRET_ENV, secret ? ": the one set is shorter than 16 characters" : "");
        return -1;
    }
    /* the password: the secret hashed for this use (secret.h), never the job key */
    char password[JOB_KEY_HEX_LEN + 1];
    int port = -1, n = s->nhosts, me = s->node;
    if (job_secret_hash("deadpool-redis", job, secret, password) != 0 || (port = slurm_plane_port(job, secret)) < 0) {
        sodium_memzero(password, sizeof password);
        set_err(err, errlen, "libsodium did not initialise");
        return -1;
    }
    char mine[64], where[3][64];
    if (node_address(s->hosts[me], mine, sizeof mine, err, errlen) != 0) return -1;
    redis_server m = {0};
    int at_master = slurm_plane_master(s), at_replica = slurm_plane_replica(s);
    if (node_address(s->hosts[at_master], m.host, sizeof m.host, err, errlen) != 0) return -1;
    m.port = port;
    snprintf(m.password, sizeof m.password, "%s", password);
    for (int i = 0; i < 3; i++)
        if (node_address(s->hosts[i % n], where[i], sizeof where[i], err, errlen) != 0) return -1;
    int need_dir = me == at_replica || me < 3;
    if (need_dir && !dir[0]) {
        const char *tmp = getenv("TMPDIR"); /* a node's own, where the cluster sets one per job */
        if (!tmp || !*tmp || (size_t)snprintf(dir, dirlen, "%s/deadpool-plane-XXXXXX", tmp) >= dirlen)
            snprintf(dir, dirlen, "/tmp/deadpool-plane-XXXXXX");
        if (!mkdtemp(dir)) { /* 0700: the sentinels' files hold the password */
            set_err(err, errlen, "cannot create a directory for the control plane's files: %s", strerror(errno));
            dir[0] = 0;
            return -1;
        }
    }
    char why[512];
    if (me == at_master && redis_server_start_on(master, mine, port, password, NULL, NULL, NULL, 10000, why, sizeof why) != 0) {
        set_err(err, errlen, "the Redis master on %s:%d: %s", mine, port, why);
        goto fail;
    }
    if (me == at_replica && redis_server_start_on(replica, mine, port + 1, password, &m, dir, NULL, 10000, why, sizeof why) != 0) {
        set_err(err, errlen, "the Redis replica on %s:%d: %s", mine, port + 1, why);
        goto fail;
    }
    for (int i = 0; i < 3; i++)
        if (i % n == me && redis_server_start_on(&sentinels[i], mine, port + 2 + i, password, &m, dir,
                                                 SLURM_SENTINEL_MASTER, 10000, why, sizeof why) != 0) {
            set_err(err, errlen, "sentinel %d on %s:%d: %s", i, mine, port + 2 + i, why);
            goto fail;
        }
    addr->nsentinels = 3;
    snprintf(addr->master, sizeof addr->master, "%s", SLURM_SENTINEL_MASTER);
    snprintf(addr->password, sizeof addr->password, "%s", password);
    for (int i = 0; i < 3; i++) {
        snprintf(addr->sentinel_host[i], sizeof addr->sentinel_host[i], "%s", where[i]);
        addr->sentinel_port[i] = port + 2 + i;
    }
    snprintf(addr->host, sizeof addr->host, "%s", where[0]);
    addr->port = port + 2;
    sodium_memzero(password, sizeof password);
    return 0;
fail:
    sodium_memzero(password, sizeof password);
    redis_server_stop(master, 3000);
    redis_server_stop(replica, 3000);
    for (int i = 0; i < 3; i++) redis_server_stop(&sentinels[i], 3000);
    return -1;
}
