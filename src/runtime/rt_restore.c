/* rt_restore.c — generations back into the application's memory: a restore from this rank's
 * buffers, a holder or disk, the identical state's broadcast, and a spare's warm buffer for
 * it. Capture, and the state DeadPool owns, is rt_capture.c. */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime_internal.h"

#include "checkpoint.h"
#include "protocol.h"
#include "util.h"

/* Copies each saved region into the application's region of the same id (declared state
 * is restored by restore_declared, before). */
static int default_restore(dp_t *dp, const dp_generation *g, char *err, size_t errlen) {
    dp_region now[GEN_MAX_REGIONS];
    int n = dp->cb.regions(dp->cb.arg, now, GEN_MAX_REGIONS);
    for (int i = 0; i < g->nregions; i++) {
        const dp_region *s = &g->regions[i];
        if (rt_state_index(dp, s->id) >= 0) continue;
        int found = 0;
        for (int j = 0; j < n && !found; j++) {
            if (now[j].id != s->id) continue;
            found = 1;
            if (now[j].len != s->len) {
                snprintf(err, errlen, "region %u: saved %zu bytes, the application has %zu", s->id, s->len, now[j].len);
                return -1;
            }
            memcpy(now[j].ptr, s->ptr, s->len);
        }
        if (!found) {
            snprintf(err, errlen, "region %u is in the generation but not among the application's regions (give a "
                     "restore callback to allocate it)", s->id);
            return -1;
        }
    }
    return 0;
}

/* Declared state of generation g into its block (g->step & 1); nothing to copy when g is
 * that block already (a survivor rolling back to its own newest generation). */
static int restore_declared(dp_t *dp, const dp_generation *g, char *err, size_t errlen) {
    int seen = 0;
    for (int i = 0; i < g->nregions; i++) {
        int k = rt_state_index(dp, g->regions[i].id);
        if (k < 0) continue;
        seen++;
        if (g->regions[i].len != dp->state[k].len) {
            snprintf(err, errlen, "region %u: saved %zu bytes, declared %zu", g->regions[i].id, g->regions[i].len,
                     dp->state[k].len);
            return -1;
        }
        void *dst = rt_state_at(dp, k, g->step);
        if (dst != g->regions[i].ptr) memmove(dst, g->regions[i].ptr, g->regions[i].len);
    }
    if (g->rank == dp->rank && seen != dp->nstate) {
        snprintf(err, errlen, "the generation holds %d of the %d declared regions", seen, dp->nstate);
        return -1;
    }
    return 0;
}

static int app_restore(dp_t *dp, const dp_generation *g, char *err, size_t errlen) {
    if (restore_declared(dp, g, err, errlen) != 0) return -1;
    if (dp->cb.restore) return dp->cb.restore(dp->cb.arg, g, err, errlen);
    return default_restore(dp, g, err, errlen);
}

/* Checks a verified payload of this rank (with its local part local[0..local_len), from this
 * rank's own snapshot; 0 bytes: none) and hands it to the application: one generation. */
int rt_restore_payload(dp_t *dp, const SnapHeader *h, const void *payload, const void *local, size_t local_len,
                       char *err, size_t errlen) {
    if (h->rank != dp->rank || h->world != dp->cfg.workers) {
        snprintf(err, errlen, "state of rank %d of %d offered to rank %d of %d", h->rank, h->world, dp->rank,
                 dp->cfg.workers);
        return -1;
    }
    dp_region regions[2 * GEN_MAX_REGIONS];
    dp_generation g = {.step = h->step, .rank = h->rank, .world = h->world}, l = g;
    uint64_t seed, lseed = dp->cfg.seed;
    int64_t next, lnext = h->step + 1;
    if (gen_parse(payload, h->length, &g, regions, GEN_MAX_REGIONS, &seed, &next, err, errlen) != 0) return -1;
    if (local_len && gen_parse(local, local_len, &l, regions + g.nregions, GEN_MAX_REGIONS, &lseed, &lnext, err, errlen) != 0)
        return -1;
    if (seed != dp->cfg.seed || next != h->step + 1 || lseed != seed || lnext != next) {
        snprintf(err, errlen, "state of step %lld: taken with seed %llu, next step %lld; this job has seed %llu",
                 (long long)h->step + 1, (unsigned long long)seed, (long long)next, (unsigned long long)dp->cfg.seed);
        return -1;
    }
    if (local_len) g.nregions += l.nregions;
    if (gen_own_state(payload, h->length)) { /* no stateless claim may cover it (ctl_committed_set) */
        pthread_mutex_lock(&dp->pub_mu);
        dp->own_seen = 1;
        pthread_mutex_unlock(&dp->pub_mu);
    }
    dp->restored_identical = 0;
    for (int i = 0; i < g.nregions; i++) dp->restored_identical |= regions[i].kind == DP_IDENTICAL;
    /* Kept for the restore point's snapshot in the new epoch, which must carry it too. */
    void *copy = malloc(g.extra_len ? g.extra_len : 1);
    if (!copy) { snprintf(err, errlen, "out of memory for %zu bytes of extra state", g.extra_len); return -1; }
    if (g.extra_len) memcpy(copy, g.extra, g.extra_len);
    free(dp->restored_extra);
    dp->restored_extra = copy;
    dp->restored_extra_len = g.extra_len;
    return app_restore(dp, &g, err, errlen);
}

static int restore_in_place(const SnapHeader *h, const void *payload, const void *local, size_t local_len, void *arg) {
    dp_t *dp = arg;
    char err[512];
    if (rt_restore_payload(dp, h, payload, local, local_len, err, sizeof err) == 0) return 0;
    log_msg("local copy of step %lld unusable: %s", (long long)h->step + 1, err);
    return -1;
}

/* Where a fetched generation lands: this rank's own generation straight into its block of
 * declared state (head right before the regions, as capture_zero_copy lays it out, so that
 * nothing is copied after), anything else in the spare's warm buffer when it fits; NULL: a
 * fresh buffer. */
typedef struct {
    dp_t *dp;
    int64_t own_step; /* INT64_MIN: not this rank's generation */
} Placement;

static void *place_restore(void *arg, uint64_t length) {
    Placement *p = arg;
    dp_t *dp = p->dp;
    size_t regions = dp->block_bytes - dp->head_area;
    if (p->own_step != INT64_MIN && dp->nstate && length >= regions && length - regions <= dp->head_area)
        return rt_block_of(dp, p->own_step) + dp->head_area - (length - regions);
    if (dp->warm_buf && length <= dp->warm_cap) return dp->warm_buf;
    dp->restore_cold += length; /* into a fresh buffer: faulted in as it arrives */
    return NULL;
}

/* A payload in memory DeadPool keeps (not to be freed). */
int rt_payload_is_ours(const dp_t *dp, const void *p) {
    const unsigned char *b = p;
    if (b && b == dp->warm_buf) return 1;
    for (int i = 0; i < 2; i++)
        if (dp->block[i] && b >= dp->block[i] && b < dp->block[i] + dp->block_bytes) return 1;
    return 0;
}

/* Fetches rank's generation `step` from any holder recorded in recent epochs, where
 * place_restore says (else *payload is malloc'ed). 0 / -1. */
int rt_fetch_from_holders(dp_t *dp, int rank, long long step, long newest_epoch, SnapHeader *h, void **payload) {
    for (long e = newest_epoch; e >= 0 && e >= newest_epoch - 3; e--) {
        char list[HOLDERS_TEXT_MAX];
        Holder holders[HOLDERS_MAX];
        if (holders_read(dp->ctl, e, rank, list, sizeof list) != 0) continue;
        int n = holders_parse(list, holders, HOLDERS_MAX);
        for (int i = 0; i < n; i++) {
            char err[256];
            /* Connecting includes the holder's proof of the job's key, so it waits for the
             * holder's threads like the GET does: the same bound, not a bare TCP connect's. */
            ReplicaConn *c = replica_connect(holders[i].host, holders[i].port, holders[i].proc,
                                             job_comm_timeout_ms(&dp->cfg), 0, replica_server_key(dp->replicas), err,
                                             sizeof err);
            if (!c) {
                log_msg("rank %d's holder %s:%d: %s", rank, holders[i].host, holders[i].port, err);
                continue;
            }
            Placement pl = {dp, rank == dp->rank ? step : INT64_MIN};
            replica_status st = replica_get_into(c, dp->job, rank, step, h, place_restore, &pl, payload,
                                                 job_comm_timeout_ms(&dp->cfg));
            replica_close(c);
            if (st == REPLICA_OK && h->step == step) return 0;
            if (st == REPLICA_OK && !rt_payload_is_ours(dp, *payload)) free(*payload);
            *payload = NULL;
        }
    }
    return -1;
}

/* Rank's state of the resumed checkpoint: from this machine's disk, else (machines without a
 * shared filesystem) from the launcher that serves it from its machine's disk (verified on
 * the way like any replica). 0 / -1 + err. */
int rt_read_resumed_state(dp_t *dp, int rank, SnapHeader *h, void **payload, char *err, size_t errlen) {
    int64_t step = dp->cfg.resume_step;
    if (checkpoint_read_shard(dp->cfg.resume, step, rank, h, payload, err, errlen) == 0) return 0;
    if (dp->cfg.nnodes == 0) return -1;
    /* The machine that has it may still be loading its files (a spare machine joins last). */
    double deadline = now_ms() + dp->cfg.start_timeout_ms;
    Endpoint ep;
    int got;
    while ((got = ctl_resume_holder_get(dp->ctl, rank, &ep, err, errlen)) == 0) {
        if (now_ms() > deadline) {
            snprintf(err, errlen, "rank %d's state of step %lld is neither on this machine's disk nor offered by "
                     "another machine within --start-timeout-ms", rank, (long long)step + 1);
            return -1;
        }
        sleep_ms(50);
    }
    if (got < 0) return -1;
    char cerr[256];
    ReplicaConn *c = replica_connect(ep.host, ep.port, 0 /* a launcher */, job_comm_timeout_ms(&dp->cfg) + 5000,
                                     0, replica_server_key(dp->replicas), cerr, sizeof cerr);
    if (!c) {
        snprintf(err, errlen, "rank %d's state of step %lld: not on this machine, and its machine's launcher at %s:%d "
                 "cannot be reached: %s", rank, (long long)step + 1, ep.host, ep.port, cerr);
        return -1;
    }
    replica_status st = replica_get(c, dp->job, rank, step, h, payload, job_comm_timeout_ms(&dp->cfg) + 5000);
    replica_close(c);
    if (st == REPLICA_OK && h->step == step) return 0;
    if (st == REPLICA_OK) free(*payload);
    *payload = NULL;
    snprintf(err, errlen, "rank %d's state of step %lld from %s:%d: %s", rank, (long long)step + 1, ep.host, ep.port,
             st == REPLICA_OK ? "another step" : replica_status_str(st));
    return -1;
}

/* 1 when generation g of `rank` holds the identical state at most: a verified claim of the
 * rank covers g (ctl_stateless_through), and g is not the resumed checkpoint's (whose files
 * exist); 0 when it may hold more, or when Redis cannot say. */
int rt_rank_stateless(dp_t *dp, int rank, long long g) {
    if (g == dp->cfg.resume_step) return 0;
    return g >= 0 && ctl_stateless_through(dp->ctl, rank) >= g;
}

/* 1 when this rank need not fetch generation `rollback`: it has nothing of its own and some
 * member survives to provide the identical state (or the rank is not 0, whose replica alone
 * carries it). The members besides this process: one that held its rank before this
 * decision and comes here has no copy in its own buffers (a spare whose takeover failed:
 * it never committed its rank's state), so it provides nothing. */
static int nothing_of_its_own(dp_t *dp, long long rollback) {
    int survivors = dp->decision.world - dp->decision.nfailed;
    if (!decision_rank_replaced(&dp->decision, dp->rank)) survivors--;
    if (dp->rank == 0 && survivors <= 0) return 0;
    return rt_rank_stateless(dp, dp->rank, rollback);
}

/* Puts this rank's state at generation `rollback`: from our own ping-pong buffer, else (a
 * rank with nothing of its own) an empty generation, else from a replica holder, else (the
 * resumed checkpoint) from disk; -1 means the initial state. */
int rt_restore_generation(dp_t *dp, Snapshot *old, long long rollback, char *err, size_t errlen) {
    dp->next_step = rollback + 1;
    if (rollback < 0) {
        dp->cb.reset(dp->cb.arg);
        return 0;
    }
    if (old && snapshot_local_use(old, rollback, restore_in_place, dp) == 0) return 0;
    if (nothing_of_its_own(dp, rollback)) { /* its identical state comes with the broadcast (share_and_rebuild) */
        log_msg("rank %d has no state of its own: nothing to fetch for step %lld", dp->rank, rollback + 1);
        free(dp->restored_extra);
        dp->restored_extra = NULL;
        dp->restored_extra_len = 0;
        dp->restored_identical = 0;
        dp_generation g = {.step = rollback, .rank = dp->rank, .world = dp->cfg.workers};
        return app_restore(dp, &g, err, errlen);
    }
    SnapHeader h;
    void *payload = NULL;
    int found = rt_fetch_from_holders(dp, dp->rank, rollback, dp->epoch - 1, &h, &payload) == 0;
    if (!found && rollback == dp->cfg.resume_step) found = rt_read_resumed_state(dp, dp->rank, &h, &payload, err, errlen) == 0;
    if (!found) {
        snprintf(err, errlen, "no copy of rank %d's state at step %lld is reachable", dp->rank, rollback + 1);
        return -1;
    }
    int rc = rt_restore_payload(dp, &h, payload, NULL, 0, err, errlen);
    if (!rt_payload_is_ours(dp, payload)) free(payload);
    return rc;
}

/* A spare's state arrives from a holder (and the identical state in the broadcast after it)
 * into memory that should not be touched for the first time then: the kernel's first-touch
 * faults cost 150 ms for 31 MiB on this VM, twice the transfer. At join the buffer holds the
 * largest generation this process could be asked to restore as the state is sized then: every
 * region as rank 0 keeps them (sharded and identical); state that appears later (optimizer
 * moments allocated at the first step) grows it while the spare waits (warm_grow_check). */
void rt_warm_restore_buffer(dp_t *dp) {
    dp_region r[GEN_MAX_REGIONS];
    if (dp->nstate && dp->cb.regions(dp->cb.arg, r, GEN_MAX_REGIONS) == 0) return; /* all declared: lands in a block */
    dp->warm_wanted = 1;
    int n = rt_app_regions(dp, 0, r, GEN_MAX_REGIONS);
    if (n < 0) return;
    size_t bytes = gen_head_bytes(n, DP_STATE_EXTRA_MAX); /* extra state: a cursor, an RNG */
    for (int i = 0; i < n; i++) bytes += r[i].len;
    void *b = alloc_huge(bytes);
    if (!b) return; /* only slower */
    prefault(b, bytes);
    dp->warm_buf = b;
    dp->warm_cap = bytes;
}

static void *warm_grow_thread(void *arg) {
    dp_t *dp = arg;
    void *b = alloc_huge(dp->warm_next_cap);
    if (b) prefault(b, dp->warm_next_cap);
    dp->warm_next = b; /* only slower without it */
    atomic_store(&dp->warm_grown, 1);
    return NULL;
}

/* Takes the grown buffer once the thread is done (wait: wait for it). */
void rt_warm_grow_finish(dp_t *dp, int wait) {
    if (!dp->warm_growing || (!wait && !atomic_load(&dp->warm_grown))) return;
    pthread_join(dp->warm_thread, NULL);
    dp->warm_growing = 0;
    if (!dp->warm_next) return;
    free(dp->warm_buf);
    dp->warm_buf = dp->warm_next;
    dp->warm_cap = dp->warm_next_cap;
    dp->warm_next = NULL;
}

/* While a spare waits: when a rank has committed a generation larger than the warm buffer
 * (KEY_GEN_BYTES: what a spare fetches, and bounds the identical state's broadcast), a new
 * one is allocated and faulted in on a thread of its own, so that a decision is never late
 * for it. One MGET of the world's keys. */
void rt_warm_grow_check(dp_t *dp) {
    rt_warm_grow_finish(dp, 0);
    if (!dp->warm_wanted || dp->warm_growing) return;
    size_t want = (size_t)ctl_gen_bytes_max(dp->ctl, dp->cfg.workers);
    if (want <= dp->warm_cap) return;
    dp->warm_next_cap = want;
    atomic_store(&dp->warm_grown, 0);
    dp->warm_growing = pthread_create(&dp->warm_thread, NULL, warm_grow_thread, dp) == 0;
}

void rt_release_warm_buffer(dp_t *dp) {
    rt_warm_grow_finish(dp, 1);
    free(dp->warm_buf);
    dp->warm_buf = NULL;
    dp->warm_cap = 0;
}

/* 1 if the application reports a DP_IDENTICAL region now. */
static int reports_identical(dp_t *dp) {
    dp_region r[GEN_MAX_REGIONS];
    int n = dp->cb.regions(dp->cb.arg, r, GEN_MAX_REGIONS);
    for (int i = 0; i < n; i++)
        if (r[i].kind == DP_IDENTICAL) return 1;
    return 0;
}

/* Rank 0, when no member restored the identical state: the members counted on for it (by the
 * decision, and by nothing_of_its_own) were spares whose takeover had failed, which never had
 * it. Rank 0's replica carries it: fetched and restored now. 1 when rank 0 has it then. */
static int identical_from_replica(dp_t *dp) {
    SnapHeader h;
    void *payload = NULL;
    char err[512];
    long long g = (long long)dp->next_step - 1;
    if (rt_fetch_from_holders(dp, 0, g, dp->epoch - 1, &h, &payload) != 0) return 0;
    int rc = rt_restore_payload(dp, &h, payload, NULL, 0, err, sizeof err);
    if (!rt_payload_is_ours(dp, payload)) free(payload);
    if (rc != 0) {
        log_msg("rank 0's replica of step %lld is unusable: %s", g + 1, err);
        return 0;
    }
    if (dp->restored_identical) log_msg("no member restored the identical state: rank 0's replica of step %lld has it", g + 1);
    return dp->restored_identical;
}

/* After a restore: the lowest rank whose restored generation carried the DP_IDENTICAL regions
 * (a survivor from its own snapshot, rank 0 from its replica or its checkpoint file)
 * broadcasts them, and the ranks whose generation lacked them (a spare that took another
 * rank, a rank other than 0 resuming from disk) hand them to the application: a second
 * restore call. Then the application rebuilds what is derived. *state_lost (may be NULL) is
 * set when no member restored the identical state, nor could rank 0 from its replica then:
 * trying again cannot help. */
dp_status rt_share_and_rebuild(dp_t *dp, int *state_lost, char *err, size_t errlen) {
    if (dp->cfg.workers > 1) {
        /* The flags wait for every member's restore (a spare fetches a state about the size of
         * ours), the blob for its bytes: both bounds follow what they wait for. */
        int world = dp->cfg.workers, from = -1, to = rt_collective_bound_ms(dp, 2 * (uint64_t)dp->block_bytes);
        float *has = malloc(sizeof *has * (size_t)world);
        if (!has) { snprintf(err, errlen, "out of memory for %d flags", world); return DP_ERR; }
        has[dp->rank] = dp->restored_identical ? 1.0f : 0.0f;
        comm_status st = comm_allgather(dp->comm, has + dp->rank, has, 1, to);
        for (int r = 0; r < world && from < 0 && st == COMM_OK; r++)
            if (has[r] != 0.0f) from = r;
        free(has);
        if (st != COMM_OK) goto comm_failed;
        if (from < 0 && reports_identical(dp)) { /* every rank sees this: rank 0 tries its replica, says if it could */
            float got = dp->rank == 0 && identical_from_replica(dp) ? 1.0f : 0.0f;
            if (comm_broadcast(dp->comm, &got, sizeof got, 0, to) != COMM_OK) goto comm_failed;
            if (got == 0.0f) { /* no use trying again: the job stops (join_failed) */
                if (state_lost) *state_lost = 1;
                snprintf(err, errlen, "no member restored the state every rank holds identically (DP_IDENTICAL) of step %lld",
                         (long long)dp->next_step);
                return DP_ERR;
            }
            from = 0;
        }
        dp_region all[GEN_MAX_REGIONS], same[GEN_MAX_REGIONS];
        unsigned char *blob = NULL;
        uint64_t size = 0;
        int k = 0;
        if (dp->rank == from) {
            int n = dp->cb.regions(dp->cb.arg, all, GEN_MAX_REGIONS);
            for (int i = 0; i < n; i++)
                if (all[i].kind == DP_IDENTICAL) same[k++] = all[i];
            size = gen_head_bytes(k, 0);
            for (int i = 0; i < k; i++) size += same[i].len;
        }
        if (from >= 0 && comm_broadcast(dp->comm, &size, sizeof size, from, to) != COMM_OK) goto comm_failed;
        if (size > gen_head_bytes(0, 0)) {
            /* A spare's restored generation is in the application by now: its warm buffer is free. */
            int warm = dp->warm_buf && size <= dp->warm_cap;
            blob = warm ? dp->warm_buf : malloc(size);
            if (!blob) { snprintf(err, errlen, "out of memory for %llu bytes of identical state", (unsigned long long)size); return DP_ERR; }
            if (!warm && !dp->restored_identical) dp->restore_cold += size;
            if (dp->rank == from) {
                gen_head_write(blob, dp->cfg.seed, dp->next_step, same, k, NULL, 0);
                size_t off = gen_head_bytes(k, 0);
                for (int i = 0; i < k; i++) { memcpy(blob + off, same[i].ptr, same[i].len); off += same[i].len; }
            }
            if (comm_broadcast(dp->comm, blob, size, from, rt_collective_bound_ms(dp, size)) != COMM_OK) {
                if (!warm) free(blob);
                goto comm_failed;
            }
            if (!dp->restored_identical) {
                dp_region regions[GEN_MAX_REGIONS];
                dp_generation g = {.step = dp->next_step - 1, .rank = from, .world = world};
                uint64_t seed;
                int64_t next;
                int rc = gen_parse(blob, size, &g, regions, GEN_MAX_REGIONS, &seed, &next, err, errlen);
                if (rc == 0) rc = app_restore(dp, &g, err, errlen);
                if (rc != 0) {
                    if (!warm) free(blob);
                    return DP_ERR;
                }
            }
            if (!warm) free(blob);
        }
    }
    if (dp->cb.rebuild) {
        dp->err[0] = '\0';
        dp_status st = dp->cb.rebuild(dp, dp->cb.arg);
        if (st != DP_OK) { /* a collective's failure is in dp->err (comm_failed), else the epoch's */
            const char *why = dp->err[0] ? dp->err : comm_last_error(dp->comm);
            snprintf(err, errlen, "rebuilding the derived state failed: %s", why[0] ? why : "the application's rebuild failed");
            return st == DP_ERR ? DP_ERR : DP_FAILED;
        }
    }
    return DP_OK;
comm_failed:
    snprintf(err, errlen, "broadcasting the identical state failed: %s", comm_last_error(dp->comm));
    return DP_FAILED;
}
