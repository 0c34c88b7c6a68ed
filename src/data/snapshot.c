/* snapshot.c — the snapshot thread: ping-pong copy, replication, commit. */
#include "snapshot.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checksum.h"
#include "util.h"

typedef struct {
    SnapHeader header;
    unsigned char *data; /* the generation's payload: own, or the caller's (snapshot_capture_external) */
    unsigned char *own;  /* this slot's buffer, for copied generations */
    size_t cap;          /* bytes allocated at own */
    unsigned char *local; /* the generation's local part (never replicated), local_len bytes */
    size_t local_cap, local_len;
    int committed;       /* holds a committed generation (header.step) */
    int crc_known;       /* header.crc is computed (an external payload's is left to its first holder) */
} Slot;

struct Snapshot {
    SnapshotConfig cfg;
    char job[40];
    unsigned char key[REPLICA_KEY_BYTES]; /* cfg.key points here */
    SnapRegion *regions;    /* the live regions of the next generation */
    int nregions, regions_cap;
    SnapRegion *locals;     /* ...and of its local part */
    int nlocals, locals_cap;
    ReplicaTarget *targets;
    ReplicaConn **conns;
    size_t bytes;           /* payload size: sum of the current regions' lengths */
    Slot slots[2];
    int committed_slot;     /* -1 before the first commit */

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;  /* a capture was requested, or stop */
    pthread_cond_t done_cv;  /* a generation finished */
    int64_t pending;         /* requested generation, -1 none */
    const unsigned char *ext; /* the pending generation's payload when it is the caller's, else NULL */
    size_t ext_len;
    int busy;                /* a generation is in flight */
    int stop;
    int64_t committed;
    SnapshotStats stats;
    int warned;              /* replication failure already logged */
    int last_failed;         /* the newest finished generation failed to commit */
    int abandoned;           /* nobody waits for the thread: it frees everything itself */
    int in_callback;         /* on_commit is running (snapshot_abandon waits for it to return) */
};

/* Everything of a generation's header but step, crc and the seal. */
static void init_header(const Snapshot *s, SnapHeader *h) {
    memset(h, 0, sizeof *h);
    h->magic = SNAP_MAGIC;
    h->version = SNAP_VERSION;
    snprintf(h->job, sizeof h->job, "%s", s->job);
    h->epoch = s->cfg.epoch;
    h->rank = s->cfg.rank;
    h->world = s->cfg.world;
    h->length = s->bytes;
}

static void copy_regions(Snapshot *s, Slot *slot) {
    uint32_t crc = 0;
    size_t off = 0;
    for (int i = 0; i < s->nregions; i++) {
        crc = crc32c_copy(crc, slot->data + off, s->regions[i].ptr, s->regions[i].len);
        off += s->regions[i].len;
    }
    init_header(s, &slot->header);
    slot->header.length = off;
    slot->header.crc = crc;
}

/* The connection to holder i, opened now if there is none. NULL if it cannot be reached. */
static ReplicaConn *target_conn(Snapshot *s, int i) {
    if (!s->conns[i]) {
        char err[256];
        s->conns[i] = replica_connect(s->targets[i].host, s->targets[i].port, s->targets[i].proc, s->cfg.timeout_ms,
                                      s->cfg.allow_pull, s->key, err, sizeof err);
    }
    return s->conns[i];
}

/* Runs once when the thread starts, before any capture: has every holder set up its two
 * slots for us, then faults in our own two. Without it the first two generations pay for
 * 4 x bytes of page faults (about 70 ms per 31 MiB here) while training runs; a recovery
 * still must not wait for this, which is why it is done here and not in snapshot_create. */
static void warm_up(Snapshot *s) {
    double t0 = now_ms(), cpu0 = thread_cpu_ms();
    SnapHeader h;
    init_header(s, &h);
    h.length = s->slots[0].own ? s->slots[0].cap : s->bytes; /* external: the size hint */
    h.step = -1;
    snap_header_seal(&h);
    for (int i = 0; i < s->cfg.ntargets; i++) {
        ReplicaConn *c = target_conn(s, i);
        if (c) replica_reserve(c, &h, s->cfg.timeout_ms); /* advisory: a failure is retried by the first PUT */
    }
    if (s->slots[0].own) prefault(s->slots[0].own, s->slots[0].cap);
    if (s->slots[1].own) prefault(s->slots[1].own, s->slots[1].cap);
    pthread_mutex_lock(&s->mu);
    s->stats.warmup_ms = now_ms() - t0;
    s->stats.warmup_cpu_ms = thread_cpu_ms() - cpu0;
    pthread_mutex_unlock(&s->mu);
}

/* Sends the slot to every holder; reconnects once per holder on a connection that failed fast
 * (a reset: the holder restarted its end), not after a failure that took more than half the
 * timeout: a holder cut off with its machine costs one timeout, not two. */
static int replicate(Snapshot *s, Slot *slot, uint64_t *pulled) {
    int ok = 1;
    *pulled = 0;
    for (int i = 0; i < s->cfg.ntargets; i++) {
        replica_status st = REPLICA_IO;
        double t0 = now_ms();
        for (int attempt = 0; attempt < 2 && st == REPLICA_IO; attempt++) {
            if (attempt > 0 && now_ms() - t0 > s->cfg.timeout_ms / 2) break;
            if (!target_conn(s, i)) continue;
            st = slot->crc_known ? replica_put(s->conns[i], &slot->header, slot->data, s->cfg.timeout_ms)
                                 : replica_put_summing(s->conns[i], &slot->header, slot->data, s->cfg.timeout_ms);
            if (st == REPLICA_OK) slot->crc_known = 1;
            if (st == REPLICA_OK && replica_last_put_pulled(s->conns[i])) *pulled += slot->header.length;
            if (st == REPLICA_IO) {
                replica_close(s->conns[i]);
                s->conns[i] = NULL;
            }
        }
        if (st != REPLICA_OK) {
            ok = 0;
            if (!s->warned) {
                log_msg("snapshot of step %lld not replicated to %s:%d: %s", (long long)slot->header.step,
                        s->targets[i].host, s->targets[i].port, replica_status_str(st));
                s->warned = 1;
            }
        }
    }
    return ok;
}

/* The payload of `step` into the slot: copied from the live regions (with its CRC), or, for
 * an external generation, left where it lies without its CRC: the first holder computes that
 * as it copies the bytes (replica_put_summing), which spares this thread a pass over them.
 * 0, or -1 without memory. */
static int fill_local(Snapshot *s, Slot *slot, int64_t step) {
    size_t bytes = 0;
    for (int i = 0; i < s->nlocals; i++) bytes += s->locals[i].len;
    if (bytes > slot->local_cap) {
        unsigned char *grown = alloc_huge(bytes);
        if (!grown) {
            log_msg("snapshot of step %lld: out of memory for %zu bytes of local state", (long long)step, bytes);
            return -1;
        }
        free(slot->local);
        slot->local = grown;
        slot->local_cap = bytes;
    }
    size_t off = 0;
    for (int i = 0; i < s->nlocals; i++) {
        memcpy(slot->local + off, s->locals[i].ptr, s->locals[i].len);
        off += s->locals[i].len;
    }
    slot->local_len = off;
    return 0;
}

static int fill_slot(Snapshot *s, Slot *slot, int64_t step, const unsigned char *ext, size_t ext_len) {
    if (fill_local(s, slot, step) != 0) return -1;
    if (ext) {
        init_header(s, &slot->header);
        slot->data = (unsigned char *)ext;
        slot->header.length = ext_len;
        slot->crc_known = 0;
        return 0;
    }
    if (slot->cap < s->bytes || !slot->own) { /* the state grew (e.g. optimizer moments allocated at the first step) */
        unsigned char *grown = alloc_huge(s->bytes ? s->bytes : 1);
        if (!grown) {
            log_msg("snapshot of step %lld: out of memory for %zu bytes", (long long)step, s->bytes);
            return -1;
        }
        free(slot->own);
        slot->own = grown;
        slot->cap = s->bytes;
    }
    slot->data = slot->own;
    copy_regions(s, slot);
    slot->crc_known = 1;
    return 0;
}

static void run_generation(Snapshot *s, int64_t step, const unsigned char *ext, size_t ext_len) {
    int free_slot = s->committed_slot == 0 ? 1 : 0;
    Slot *slot = &s->slots[free_slot];
    pthread_mutex_lock(&s->mu);
    slot->committed = 0;
    pthread_mutex_unlock(&s->mu);
    double t0 = now_ms(), cpu0 = thread_cpu_ms();
    if (fill_slot(s, slot, step, ext, ext_len) != 0) {
        pthread_mutex_lock(&s->mu);
        s->last_failed = 1;
        s->stats.failures++;
        s->busy = s->pending >= 0;
        pthread_cond_broadcast(&s->done_cv);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    slot->header.step = step;
    snap_header_seal(&slot->header);
    double t1 = now_ms();

    pthread_mutex_lock(&s->mu);
    s->stats.copy_ms_last = t1 - t0;
    s->stats.copy_ms_total += t1 - t0;
    if (!ext) s->stats.bytes_copied += slot->header.length;
    s->stats.bytes_copied += slot->local_len;
    pthread_mutex_unlock(&s->mu);

    uint64_t pulled;
    int ok = replicate(s, slot, &pulled);
    if (ok && !slot->crc_known) { /* no holder: the local copy is checked against it when it is read back */
        slot->header.crc = crc32c(0, slot->data, slot->header.length);
        snap_header_seal(&slot->header);
        slot->crc_known = 1;
    }
    double t2 = now_ms();

    pthread_mutex_lock(&s->mu);
    s->stats.replicate_ms_last = t2 - t1;
    s->stats.replicate_ms_total += t2 - t1;
    s->stats.cpu_ms_total += thread_cpu_ms() - cpu0;
    s->last_failed = !ok;
    if (ok) {
        s->stats.bytes_replicated += slot->header.length * (uint64_t)s->cfg.ntargets;
        s->stats.bytes_pulled += pulled;
        slot->committed = 1;
        s->committed_slot = free_slot;
        s->committed = step;
        s->stats.commits++;
    } else {
        s->stats.failures++;
    }
    pthread_mutex_unlock(&s->mu);
    /* The committed slot is not written again until the next generation commits elsewhere,
     * so the callback may read it without the lock. */
    pthread_mutex_lock(&s->mu);
    int call = ok && s->cfg.on_commit && !s->abandoned;
    s->in_callback = call;
    pthread_mutex_unlock(&s->mu);
    if (call) {
        s->cfg.on_commit(&slot->header, slot->data, s->cfg.arg);
        pthread_mutex_lock(&s->mu);
        s->in_callback = 0;
        pthread_cond_broadcast(&s->done_cv);
        pthread_mutex_unlock(&s->mu);
    }

    pthread_mutex_lock(&s->mu);
    s->busy = s->pending >= 0; /* a capture may have been queued while we replicated */
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
}

static void snapshot_free(Snapshot *s);

static void free_memory(Snapshot *s) {
    free(s->slots[0].own);
    free(s->slots[1].own);
    free(s->slots[0].local);
    free(s->slots[1].local);
    free(s->regions);
    free(s->locals);
    free(s->targets);
    free(s->conns);
    explicit_bzero(s->key, sizeof s->key);
    free(s);
}

static void *snapshot_thread(void *arg) {
    Snapshot *s = arg;
    pthread_setname_np(pthread_self(), "dp-snapshot");
    warm_up(s);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->pending < 0 && !s->stop) pthread_cond_wait(&s->work_cv, &s->mu);
        if (s->pending < 0 || s->abandoned) break;
        int64_t step = s->pending;
        const unsigned char *ext = s->ext;
        size_t ext_len = s->ext_len;
        s->pending = -1;
        s->ext = NULL;
        pthread_mutex_unlock(&s->mu);
        run_generation(s, step, ext, ext_len);
        pthread_mutex_lock(&s->mu);
    }
    int abandoned = s->abandoned;
    pthread_mutex_unlock(&s->mu);
    if (abandoned) snapshot_free(s);
    return NULL;
}

Snapshot *snapshot_create(const SnapshotConfig *cfg, char *err, size_t errlen) {
    Snapshot *s = calloc(1, sizeof *s);
    if (!s) { snprintf(err, errlen, "out of memory"); return NULL; }
    s->cfg = *cfg;
    snprintf(s->job, sizeof s->job, "%s", cfg->job);
    s->cfg.job = s->job;
    if (cfg->ntargets > 0 && !cfg->key) {
        snprintf(err, errlen, "snapshots: replica holders given without the job's channel key");
        free(s);
        return NULL;
    }
    if (cfg->key) memcpy(s->key, cfg->key, sizeof s->key);
    s->cfg.key = s->key;
    s->regions_cap = cfg->nregions > 0 ? cfg->nregions : 1;
    s->regions = calloc((size_t)s->regions_cap, sizeof *s->regions);
    s->targets = calloc((size_t)cfg->ntargets + 1, sizeof *s->targets);
    s->conns = calloc((size_t)cfg->ntargets + 1, sizeof *s->conns);
    if (!s->regions || !s->targets || !s->conns) goto oom;
    if (cfg->nregions) memcpy(s->regions, cfg->regions, (size_t)cfg->nregions * sizeof *s->regions);
    s->nregions = cfg->nregions;
    if (cfg->ntargets) memcpy(s->targets, cfg->targets, (size_t)cfg->ntargets * sizeof *s->targets);
    s->cfg.regions = NULL;
    s->cfg.targets = s->targets;
    for (int i = 0; i < cfg->nregions; i++) s->bytes += cfg->regions[i].len;
    if (cfg->bytes_hint > s->bytes) s->bytes = cfg->bytes_hint;
    for (int i = 0; i < 2 && !cfg->external; i++) {
        /* Faulted in by the thread (warm_up), not here: a recovery builds a new Snapshot for
         * the new epoch and must not wait for that. Huge pages make the holders'
         * process_vm_readv of a slot about 40% cheaper. */
        s->slots[i].own = s->slots[i].data = alloc_huge(s->bytes ? s->bytes : 1);
        if (!s->slots[i].own) goto oom;
        s->slots[i].cap = s->bytes;
    }
    s->committed_slot = -1;
    s->committed = -1;
    s->pending = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    if (pthread_create(&s->thread, NULL, snapshot_thread, s) == 0) return s;
    snprintf(err, errlen, "cannot start the snapshot thread");
    goto fail;
oom:
    snprintf(err, errlen, "out of memory allocating snapshot buffers (2 x %zu bytes)", s->bytes);
fail:
    free_memory(s);
    return NULL;
}

/* *to (capacity *cap) = from[0..n), grown if needed. 0, or -1 without memory. Under s->mu. */
static int set_regions(SnapRegion **to, int *cap, int *count, const SnapRegion *from, int n) {
    if (n > *cap) {
        SnapRegion *grown = realloc(*to, (size_t)n * sizeof *grown);
        if (!grown) return -1;
        *to = grown;
        *cap = n;
    }
    if (n > 0) memcpy(*to, from, (size_t)n * sizeof *from);
    *count = n;
    return 0;
}

int snapshot_capture_regions(Snapshot *s, int64_t step, const SnapRegion *regions, int n, const SnapRegion *local,
                             int nlocal) {
    pthread_mutex_lock(&s->mu);
    while (s->busy) pthread_cond_wait(&s->done_cv, &s->mu); /* the regions are the thread's while it copies */
    if (set_regions(&s->regions, &s->regions_cap, &s->nregions, regions, n) != 0 ||
        set_regions(&s->locals, &s->locals_cap, &s->nlocals, local, nlocal) != 0) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    s->bytes = 0;
    for (int i = 0; i < n; i++) s->bytes += regions[i].len;
    pthread_mutex_unlock(&s->mu);
    snapshot_capture(s, step);
    return 0;
}

int snapshot_capture_external(Snapshot *s, int64_t step, const void *payload, size_t len, const SnapRegion *local,
                              int nlocal) {
    pthread_mutex_lock(&s->mu);
    while (s->busy) pthread_cond_wait(&s->done_cv, &s->mu);
    if (set_regions(&s->locals, &s->locals_cap, &s->nlocals, local, nlocal) != 0) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    s->ext = payload;
    s->ext_len = len;
    s->bytes = len;
    pthread_mutex_unlock(&s->mu);
    snapshot_capture(s, step);
    return 0;
}

void snapshot_capture(Snapshot *s, int64_t step) {
    pthread_mutex_lock(&s->mu);
    s->pending = step;
    s->busy = 1;
    s->stats.captures++;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
}

int snapshot_wait_previous(Snapshot *s, double *waited_ms) {
    pthread_mutex_lock(&s->mu);
    double waited = 0.0;
    int aborted = 0;
    if (s->busy) {
        double t0 = now_ms();
        while (s->busy && !(aborted = s->cfg.abort && atomic_load(s->cfg.abort))) {
            if (!s->cfg.abort) {
                pthread_cond_wait(&s->done_cv, &s->mu);
                continue;
            }
            struct timespec ts; /* the abort flag has no condition variable: look every 5 ms */
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 5000000;
            if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
            pthread_cond_timedwait(&s->done_cv, &s->mu, &ts);
        }
        waited = now_ms() - t0;
        s->stats.waits++;
        s->stats.wait_ms_total += waited;
    }
    int rc = s->last_failed || aborted ? -1 : 0;
    pthread_mutex_unlock(&s->mu);
    if (waited_ms) *waited_ms = waited;
    return rc;
}

/* A generation read back from the caller's memory is checked first: that memory is the
 * application's state, and an older generation's block is overwritten by the update two steps
 * later (a rollback never needs it then, but a persist of both buffers may look). Our own
 * buffers are written only here. */
static int slot_intact(const Slot *slot) {
    if (slot->data == slot->own) return 1;
    return crc32c(0, slot->data, slot->header.length) == slot->header.crc;
}

int snapshot_local_use(Snapshot *s, int64_t step,
                       int (*use)(const SnapHeader *h, const void *payload, const void *local, size_t local_len, void *arg),
                       void *arg) {
    int rc = -1;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < 2; i++) {
        Slot *slot = &s->slots[i];
        if (slot->committed && slot->header.step == step && slot_intact(slot)) {
            rc = use(&slot->header, slot->data, slot->local, slot->local_len, arg);
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int snapshot_local_copy(Snapshot *s, int64_t step, SnapHeader *h, void **payload) {
    int rc = -1;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < 2; i++) {
        Slot *slot = &s->slots[i];
        if (!slot->committed || slot->header.step != step || !slot_intact(slot)) continue;
        *payload = malloc(slot->header.length ? slot->header.length : 1);
        if (*payload) {
            memcpy(*payload, slot->data, slot->header.length);
            *h = slot->header;
            rc = 0;
        }
        break;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int snapshot_drain(Snapshot *s, int timeout_ms) {
    double deadline = now_ms() + timeout_ms;
    pthread_mutex_lock(&s->mu);
    while (s->busy && now_ms() < deadline) {
        pthread_mutex_unlock(&s->mu);
        sleep_ms(1);
        pthread_mutex_lock(&s->mu);
    }
    int rc = s->busy ? -1 : 0;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int64_t snapshot_committed(Snapshot *s) {
    pthread_mutex_lock(&s->mu);
    int64_t c = s->committed;
    pthread_mutex_unlock(&s->mu);
    return c;
}

void snapshot_stats(Snapshot *s, SnapshotStats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->mu);
}

static void snapshot_free(Snapshot *s) {
    for (int i = 0; i < s->cfg.ntargets; i++)
        if (s->conns[i]) replica_close(s->conns[i]);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work_cv);
    pthread_cond_destroy(&s->done_cv);
    free_memory(s);
}

void snapshot_destroy(Snapshot *s) {
    if (!s) return;
    snapshot_drain(s, s->cfg.timeout_ms);
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    snapshot_free(s);
}

void snapshot_abandon(Snapshot *s) {
    if (!s) return;
    pthread_detach(s->thread);
    pthread_mutex_lock(&s->mu);
    /* Once this returns the callback's owner may go away: a callback in progress ends first
     * (a generation still replicating finishes later, without calling it). */
    while (s->in_callback) pthread_cond_wait(&s->done_cv, &s->mu);
    s->stop = 1;
    s->abandoned = 1;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu); /* s may be freed by the thread from here on */
}
