/* rt_placement.c — where a rank's replicas go: the machines (node ids: failure domains), the
 * holders on the ring of ranks or among the spares, the processes' replica addresses (looked
 * up once each), and the snapshot engine that replicates to the holders chosen. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime_internal.h"

#include "protocol.h"
#include "runtime.h"
#include "util.h"

int node_id_default(char *buf, size_t len) {
    char host[256] = "", boot[64] = "";
    gethostname(host, sizeof host - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    int ok = f && fgets(boot, sizeof boot, f) != NULL;
    if (f) fclose(f);
    boot[strcspn(boot, "\n")] = 0;
    snprintf(buf, len, "%.100s-%.12s", host[0] ? host : "host", boot);
    node_id_clean(buf);
    return ok && boot[0] ? 0 : -1;
}

void node_id_clean(char *id) {
    for (char *p = id; *p; p++)
        if (!name_char((unsigned char)*p)) *p = '_';
}

void dp_replica_spread(dp_t *dp, int block) { dp->spread_block = block > 0 ? block : 0; }

/* A process's replica server address and host never change (a process id names one process),
 * so they are cached for the life of the process's runtime (struct dp: facts): a recovery
 * looks up the new member only, and a spare taking a rank looks up everyone in one round trip. */
typedef struct ProcFacts {
    long proc;
    Holder h;
    char node[128];
} ProcFacts;

/* Facts of procs[0..n) into out (out[i].proc = 0 when proc i has registered no replica
 * server), the unknown ones fetched in one round trip. 0 / -1 (Redis unreachable). */
static int proc_facts(dp_t *dp, const long *procs, int n, ProcFacts *out) {
    static const ctl_proc_field fields[] = {PROC_REPLICA, PROC_NODE};
    pthread_mutex_lock(&dp->facts_mu);
    long *missing = malloc(sizeof *missing * (size_t)(n > 0 ? n : 1));
    int *where = malloc(sizeof *where * (size_t)(n > 0 ? n : 1)), m = 0, rc = 0;
    if (!missing || !where) rc = -1;
    for (int i = 0; i < n && rc == 0; i++) {
        out[i].proc = 0;
        for (int k = 0; k < dp->nfacts; k++)
            if (dp->facts[k].proc == procs[i]) { out[i] = dp->facts[k]; break; }
        if (!out[i].proc && procs[i] > 0) { missing[m] = procs[i]; where[m++] = i; }
    }
    char (*v)[300] = m > 0 && rc == 0 ? malloc(sizeof *v * 2 * (size_t)m) : NULL;
    if (m > 0 && (!v || ctl_proc_get_many(dp->ctl, missing, m, fields, 2, v[0], sizeof v[0]) != 0)) rc = -1;
    for (int j = 0; j < m && rc == 0; j++) {
        ProcFacts *f = &out[where[j]];
        Endpoint ep;
        if (endpoint_parse(v[2 * j], &ep, NULL, 0) != 0) continue; /* not registered (yet) */
        f->proc = missing[j];
        f->h.proc = missing[j];
        snprintf(f->h.host, sizeof f->h.host, "%s", ep.host);
        f->h.port = ep.port;
        snprintf(f->node, sizeof f->node, "%.127s", v[2 * j + 1]);
        if (dp->nfacts == dp->facts_cap) {
            int cap = dp->facts_cap ? 2 * dp->facts_cap : 64;
            ProcFacts *grown = realloc(dp->facts, sizeof *grown * (size_t)cap);
            if (!grown) continue; /* not cached: looked up again next time */
            dp->facts = grown;
            dp->facts_cap = cap;
        }
        dp->facts[dp->nfacts++] = *f;
    }
    pthread_mutex_unlock(&dp->facts_mu);
    free(v);
    free(missing);
    free(where);
    return rc;
}

/* owners[r] = the process of rank r in this epoch: from the decision being followed, else one
 * MGET. 0 / -1. */
static int current_owners(dp_t *dp, long *owners) {
    int world = dp->cfg.workers;
    if (dp->epoch > 0 && dp->decision.epoch == dp->epoch && dp->decision.world == world) {
        memcpy(owners, dp->decision.procs, sizeof *owners * (size_t)world);
        return 0;
    }
    return ctl_rank_owners(dp->ctl, world, owners);
}

/* The order in which rank looks for holders among the other ranks: offsets P, 2P, ... first
 * (with P ranks per machine, the same local rank on the next machines: one holder per
 * machine, and each machine holds one replica of each other machine's ranks), then the rest
 * of the ring rank+1, rank+2, ... (P = 0: the plain ring). offsets gets world - 1 entries. */
void holder_offsets(int world, int per_node, int *offsets) {
    int n = 0;
    if (per_node > 0 && per_node < world)
        for (int j = per_node; j < world; j += per_node) offsets[n++] = j;
    for (int j = 1; j < world; j++)
        if (!(per_node > 0 && per_node < world && j % per_node == 0)) offsets[n++] = j;
}

void holder_order(int world, int per_node, int block, int rank, int *order) {
    int m = world - 1, n = 0;
    int *off = malloc(sizeof *off * (size_t)(m > 0 ? m : 1));
    if (!off) { /* the plain ring */
        for (int j = 1; j < world; j++) order[j - 1] = (rank + j) % world;
        return;
    }
    holder_offsets(world, per_node, off);
    /* a stable partition: other blocks first */
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < m; j++) {
            int r = (rank + off[j]) % world, other = block <= 0 || r / block != rank / block;
            if (other == (pass == 0)) order[n++] = r;
        }
    free(off);
}

/* Holders of this rank's replicas: on other machines than ours and than each other's (so
 * that losing any `want` machines leaves a copy), in holder_offsets order. A single-machine
 * job falls back to holders on this machine; a multi-node job only when no other machine runs
 * a rank any more (a holder beside its owner dies with it: it says so). At most two round trips whatever the world: the owners (from the
 * decision being joined, else one MGET) and the facts of the processes not cached yet. */
static int ring_holders(dp_t *dp, int want, Holder *out) {
    int world = dp->cfg.workers, m = world - 1, n = 0;
    long *owners = malloc(sizeof *owners * (size_t)world), *ring = malloc(sizeof *ring * (size_t)(m > 0 ? m : 1));
    int *order = malloc(sizeof *order * (size_t)(m > 0 ? m : 1));
    ProcFacts *f = malloc(sizeof *f * (size_t)(m > 0 ? m : 1));
    const char *used[HOLDERS_MAX + 1];
    int ok = owners && ring && f && order && current_owners(dp, owners) == 0;
    if (ok) holder_order(world, dp->cfg.nnodes > 0 ? dp->cfg.nproc_per_node : 0, dp->spread_block, dp->rank, order);
    for (int j = 0; ok && j < m; j++) ring[j] = owners[order[j]];
    if (ok) ok = proc_facts(dp, ring, m, f) == 0;
    used[0] = dp->node;
    /* pass 0: a machine not used yet; pass 1: any other machine; pass 2 (one machine only): ours */
    for (int pass = 0; ok && pass < 3 && n < want; pass++) {
        if (pass == 2 && dp->cfg.nnodes > 0 && n == 0)
            log_msg("no other machine runs a rank of the job now: this rank's replicas stay on its machine, which it "
                    "cannot survive losing");
        if (pass == 2 && dp->cfg.nnodes > 0 && n > 0) break;
        for (int j = 0; j < m && n < want; j++) {
            if (f[j].proc <= 0) continue;
            int seen = 0, taken = 0;
            for (int u = 0; u <= n; u++) seen |= !strcmp(f[j].node, used[u]);
            for (int u = 0; u < n; u++) taken |= out[u].proc == f[j].proc;
            if (taken || (pass == 0 && seen) || (pass == 1 && !strcmp(f[j].node, dp->node))) continue;
            out[n] = f[j].h;
            used[++n] = f[j].node;
        }
    }
    free(owners);
    free(ring);
    free(order);
    free(f);
    return n;
}

static int local_rank_once(dp_t *dp) {
    int world = dp->cfg.workers, below = 0;
    long *owners = malloc(sizeof *owners * (size_t)world);
    ProcFacts *f = malloc(sizeof *f * (size_t)world);
    int ok = owners && f && current_owners(dp, owners) == 0;
    if (ok) ok = proc_facts(dp, owners, dp->rank, f) == 0;
    for (int r = 0; ok && r < dp->rank; r++) below += f[r].proc > 0 && !strcmp(f[r].node, dp->node);
    free(owners);
    free(f);
    return ok ? below : -1;
}

/* Asked at the end, to write the model: a Redis that blinks then must not cost a machine its
 * copy, so an outage is waited out within --control-wait. */
int dp_local_rank(dp_t *dp) {
    if (dp->rank <= 0) return dp->rank; /* rank 0 is first wherever it runs: no Redis needed */
    for (double deadline = now_ms() + job_control_outage_ms(&dp->cfg);;) {
        int lr = local_rank_once(dp);
        if (lr >= 0 || !ctl_error_transient(dp->ctl) || now_ms() > deadline) return lr;
        sleep_ms(200);
    }
}

/* Spares (sorted by process id) rank, rank+1, ... mod S; waits for enough spares to register. */
static int spare_holders(dp_t *dp, int want, Holder *out) {
    long ids[DP_MAX_RANKS], chosen[HOLDERS_MAX] = {0};
    int n = 0;
    double deadline = now_ms() + dp->cfg.start_timeout_ms;
    while ((n = ctl_spare_list(dp->ctl, ids, DP_MAX_RANKS)) < want && now_ms() < deadline) sleep_ms(10);
    if (n < want || want > HOLDERS_MAX) return -1;
    ProcFacts f[HOLDERS_MAX];
    for (int j = 0; j < want; j++) chosen[j] = ids[(dp->rank + j) % n];
    if (proc_facts(dp, chosen, want, f) != 0) return -1;
    for (int j = 0; j < want; j++) {
        if (!f[j].proc) return -1;
        out[j] = f[j].h;
    }
    return want;
}

int rt_start_snapshots(dp_t *dp, char *err, size_t errlen) {
    Holder holders[HOLDERS_MAX];
    ReplicaTarget targets[HOLDERS_MAX];
    int want = dp->cfg.replicas, n;
    /* One worker has no ring peer: its replica goes to a spare (a lone rank must survive too). */
    int on_spares = dp->cfg.replica_placement == PLACE_SPARES || (dp->cfg.workers == 1 && dp->cfg.spares > 0);
    if (!on_spares && want > dp->cfg.workers - 1) want = dp->cfg.workers - 1;
    n = on_spares ? spare_holders(dp, want, holders) : ring_holders(dp, want, holders);
    if (n < want && ctl_error_transient(dp->ctl)) { /* Redis away: no bad job (the caller tries again) */
        snprintf(err, errlen, "looking up the replica holders: %s", ctl_last_error(dp->ctl));
        return -2;
    }
    if (n < want && on_spares) {
        snprintf(err, errlen, "--replica-placement spares: fewer than %d spares registered", want);
        return -1;
    }
    if (n < want) { snprintf(err, errlen, "only %d of %d ring replica holders are registered", n, want); return -1; }
    if (dp->rank == 0 && dp->epoch == 0 && n < dp->cfg.replicas)
        log_msg("%d worker(s): %d replica(s) per rank instead of %d", dp->cfg.workers, n, dp->cfg.replicas);
    char list[HOLDERS_TEXT_MAX];
    holders_format(holders, n, list, sizeof list);
    /* No WAIT here, on the way back to training: a recovery looks these holders up only for a
     * generation committed in this epoch, and the commit record is waited for (rt_on_commit).
     * Replication is one ordered stream, so a replica that has the commit has these holders
     * too. (A replica that died with its machine made this WAIT cost a whole second.) */
    holders_record(dp->ctl, dp->epoch, dp->rank, list);
    for (int i = 0; i < n; i++) {
        snprintf(targets[i].host, sizeof targets[i].host, "%s", holders[i].host);
        targets[i].port = holders[i].port;
        targets[i].proc = holders[i].proc;
    }
    if (!dp->snap_ctl && (dp->snap_ctl = ctl_connect(&dp->addr, dp->job, 5000, err, errlen)))
        ctl_set_job_key(dp->snap_ctl, dp->job_key);
    if (!dp->snap_ctl) return ctl_connect_error_transient() ? -2 : -1;
    /* The buffers are sized from the state as it is now; they grow if it does. */
    size_t hint = 0;
    int nr = rt_gather_regions(dp, dp->next_step - 1, NULL, 0);
    for (int i = 0; i < nr; i++) hint += dp->snap_regions[i].len;
    SnapshotConfig sc = {.job = dp->job, .epoch = dp->epoch, .rank = dp->rank, .world = dp->cfg.workers,
                         .bytes_hint = hint, .targets = targets, .ntargets = n, .timeout_ms = job_comm_timeout_ms(&dp->cfg),
                         .allow_pull = dp->cfg.replica_transport == TRANSPORT_AUTO,
                         .external = dp->nstate > 0 && nr == dp->nstate + 1,
                         .key = replica_server_key(dp->replicas), .on_commit = rt_on_commit, .arg = dp,
                         .abort = &dp->abort_step};
    dp->snap = snapshot_create(&sc, err, errlen);
    return dp->snap ? 0 : -1;
}
