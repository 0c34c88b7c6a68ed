/* snapshot.h — per-iteration in-memory snapshots with ping-pong buffers and replication.
 *
 * After the optimizer update of step k and its allgather, the trainer calls snapshot_capture(k).
 * A background thread copies the live state into the free one of two host buffers
 * (checksumming as it copies), then sends it to every replica holder and waits for their
 * verdicts. Starting after the allgather keeps this work out of a collective. Generation k
 * is committed when the local copy and all replicas are complete and verified; until then the
 * other buffer keeps the previous committed generation untouched.
 *
 * The training loop waits in snapshot_wait_previous before the gradient reduction of step k+1
 * until generation k is committed (normally long done: replication overlaps the whole forward
 * and backward pass). Waiting there rather than just before the next optimizer update costs
 * nothing in practice and buys the invariant recovery relies on: when any rank captures k+1,
 * every rank has committed k, so the newest generation committed by all ranks is always still
 * in every rank's ping-pong buffers and in its holders' two slots. */
#ifndef DEADPOOL_SNAPSHOT_H
#define DEADPOOL_SNAPSHOT_H

#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

#include "replica.h"

typedef struct {
    const void *ptr;
    size_t len;
} SnapRegion;

typedef struct {
    char host[256];
    int port;
    long proc; /* the holder's process id in the job: the handshake proves it is that holder */
} ReplicaTarget;

typedef struct {
    const char *job;
    int64_t epoch;
    int rank, world;
    const SnapRegion *regions; /* live state, concatenated in this order (may be 0: see capture_regions) */
    int nregions;
    size_t bytes_hint;            /* expected payload size, for setting the buffers up before the first capture */
    const ReplicaTarget *targets; /* replica holders (may be 0) */
    int ntargets;
    int timeout_ms;               /* bound on connecting to / sending to a holder */
    int allow_pull;               /* holders on this machine may copy straight from our memory */
    const unsigned char *key;     /* the job's channel key (REPLICA_KEY_BYTES, copied); needed with targets */
    int external;                 /* generations come from snapshot_capture_external: no buffers of our own */
    /* Called on the snapshot thread after generation `h->step` commits, with the local copy. */
    void (*on_commit)(const SnapHeader *h, const void *payload, void *arg);
    /* Non-zero while the epoch is being closed (the runtime's abort flag; may be NULL):
     * snapshot_wait_previous stops waiting then, so that a holder cut off with its machine
     * never keeps a survivor from its recovery for longer than the detection. */
    const atomic_int *abort;
    void *arg;
} SnapshotConfig;

typedef struct {
    uint64_t captures, commits, failures;
    uint64_t waits;          /* snapshot_wait_read calls that actually blocked */
    double wait_ms_total;
    double copy_ms_last, replicate_ms_last;
    double copy_ms_total, replicate_ms_total; /* over every generation, for means */
    double cpu_ms_total;     /* CPU time the snapshot thread spent copying and replicating */
    double warmup_ms, warmup_cpu_ms; /* setting up the buffers here and on the holders: wall, CPU */
    uint64_t bytes_copied, bytes_replicated;
    uint64_t bytes_pulled;   /* part of bytes_replicated that same-machine holders pulled */
} SnapshotStats;

typedef struct Snapshot Snapshot;

Snapshot *snapshot_create(const SnapshotConfig *cfg, char *err, size_t errlen);
/* Finishes the generation in flight (bounded by the config's timeout), stops the thread. */
void snapshot_destroy(Snapshot *s);

/* Starts capturing generation `step` from the live regions. Returns at once. */
void snapshot_capture(Snapshot *s, int64_t step);
/* The same from these regions, which replace the config's from now on (the state an
 * application reports may change between generations: the buffers grow to fit). `local`
 * (nlocal regions, may be 0) is copied too, behind the payload in buffers of their own, and
 * committed with it, but never replicated nor counted in the header (length, CRC): state that
 * other ranks hold as well, which only a rollback of this rank reads back (snapshot_local_use).
 * Waits for a generation in flight first. 0, or -1 without memory. */
int snapshot_capture_regions(Snapshot *s, int64_t step, const SnapRegion *regions, int n, const SnapRegion *local,
                             int nlocal);
/* Generation `step` is the caller's payload[0..len) itself: it is replicated where it lies,
 * not copied, and it is the local copy a rollback uses. Its CRC32C is computed once, by the
 * first holder that pulls it, in the same pass as its copy (here only before a TCP send, or
 * when there is no holder). The caller must leave those bytes unchanged until the next
 * generation it captures has committed (the training loop's order guarantees that: see
 * rt_capture.c, state DeadPool owns). `local` as above (copied). Waits for a generation in flight
 * first. */
int snapshot_capture_external(Snapshot *s, int64_t step, const void *payload, size_t len, const SnapRegion *local,
                              int nlocal);
/* Blocks until the generation in flight (if any) is committed or has failed, or until
 * *cfg.abort; *waited_ms gets the time spent. 0 if every captured generation committed, -1 if
 * the last one failed (a replica holder is lost: the job must re-place its replicas) or the
 * wait was aborted (the generation may still be in flight: snapshot_drain before reuse). */
int snapshot_wait_previous(Snapshot *s, double *waited_ms);
/* Copy (malloc'ed) of the local committed generation `step`, if either buffer holds it. 0 / -1. */
int snapshot_local_copy(Snapshot *s, int64_t step, SnapHeader *h, void **payload);
/* Calls use(h, payload, local, local_len, arg) on the local committed generation `step` in
 * place (no copy), with the buffer held; local[0..local_len) is its local part (local_len 0:
 * none). Returns use's result, or -1 if neither buffer holds `step`. */
int snapshot_local_use(Snapshot *s, int64_t step,
                       int (*use)(const SnapHeader *h, const void *payload, const void *local, size_t local_len, void *arg),
                       void *arg);
/* Lets the thread finish its transfer in the background, without callbacks, and free itself:
 * recovery must not wait for a send to a dead holder. A callback already running returns
 * first: after this, none runs. */
void snapshot_abandon(Snapshot *s);
/* Blocks (up to timeout_ms) until no generation is in flight. 0, or -1 on timeout. */
int snapshot_drain(Snapshot *s, int timeout_ms);
/* Newest committed generation, -1 before the first. */
int64_t snapshot_committed(Snapshot *s);
void snapshot_stats(Snapshot *s, SnapshotStats *out);

#endif
