/* runtime_internal.h — the runtime's own header, shared by runtime.c (deadpool.h's flow and
 * the lifecycle's driving) and its pieces, src/runtime/rt_*.c: struct dp, one process's runtime,
 * and the functions one piece calls in another. Internal: not installed, and nothing here is
 * exported from libdeadpool (hidden visibility; deadpool.h's DP_EXPORT functions only). */
#ifndef DEADPOOL_RUNTIME_INTERNAL_H
#define DEADPOOL_RUNTIME_INTERNAL_H

#include "deadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "secret.h"
#include "comm_auth.h"
#include "config.h"
#include "control.h"
#include "generation.h"
#include "inject.h"
#include "lifecycle.h"
#include "recovery.h"
#include "replica.h"
#include "snapshot.h"

struct dp {
    /* the process */
    redis_addr addr;
    char job[64];
    JobConfig cfg;
    char cfg_text[JOB_CONFIG_TEXT_MAX];
    int64_t t0_wall_ms;
    long proc_id;
    ctl_t *ctl;
    char bind_host[256];
    char node[128];           /* the machine this process runs on (node_id_default) */
    char resume_dir[4200];
    ReplicaServer *replicas; /* holds other ranks' snapshots; every process runs one */
    char job_key[JOB_KEY_HEX_LEN + 1];      /* secret.h: from the launcher (DEADPOOL_JOB_KEY), never from Redis */
    unsigned char comm_key[COMM_KEY_BYTES]; /* the data plane's key (comm_key_derive), from the job's secret */
    FaultSpec faults[INJECT_MAX];
    int nfaults;
    pthread_t hb_thread, abort_thread;
    atomic_int hb_stop;
    atomic_int job_over;      /* the launcher set the job's state to stopping/done/failed */
    atomic_int abort_step;    /* the coordinator closed our epoch: abandon the step in flight */
    atomic_int control_lost;  /* a failure waited --control-wait for an unreachable redis: persist and stop */
    atomic_long cur_epoch;
    /* The control plane's outages (issue 27, item 11): training needs Redis only to handle a
     * failure, so while it is away nothing on the training path waits for it. */
    atomic_int ctl_down;      /* a call found Redis unreachable; cleared once everything is republished */
    atomic_int down_logged;   /* ...and the heartbeat thread confirmed it (said so in the log) */
    _Atomic double down_since; /* when (now_ms) */
    pthread_mutex_t pub_mu;   /* what this process republishes when Redis is back, and the metrics queue */
    long long pub_epoch, pub_step; /* newest local commit (epoch, step; -1 none) and its rank */
    int pub_rank;
    atomic_int in_pool;       /* a spare in the spare pool */
    char reg_replica[300], reg_host[256], reg_pid[32]; /* the registration's facts */
    char *mq[8192];           /* metrics lines waiting for Redis (rank 0), oldest first: a minute of short steps */
    int mq_n, mq_dropped, mq_flushing;
    _Atomic double step_ewma; /* a step's usual time, ms (main thread): the training path's Redis bound */
    pthread_cond_t pub_cv;    /* wakes the heartbeat thread: something waits to be republished */
    size_t gen_bytes_pending; /* ...KEY_GEN_BYTES likewise (0: none) */
    char err[1024];           /* dp_last_error */
    /* membership */
    dp_callbacks cb;
    lc_state lc;              /* where the process is in its life (lifecycle.h); changed by lc_feed only */
    dp_role role;             /* dp_get_role: set by the lifecycle's transitions */
    int joined;               /* dp_join succeeded once (history, not the state: a process back in
                               * RETRYING may or may not have been a member; dp_finish asks) */
    int rank;
    long epoch;
    int64_t next_step;
    comm_t *comm;
    /* asynchronous collectives (rt_async.c): their queue, run in order by aq_thread */
    pthread_mutex_t aq_mu;
    pthread_cond_t aq_cv, aq_done; /* something queued / a request done */
    struct dp_request *aq_head, *aq_tail;
    pthread_t aq_thread;
    int aq_started, aq_stop;
    struct dp_group *groups;  /* the epoch's groups (dp_group_join), ended with the epoch */
    Snapshot *snap;
    Snapshot *restore_src;    /* a previous epoch's snapshots, kept until the next epoch commits */
    void *warm_buf;           /* a spare's buffer for the state it will restore, pages faulted in */
    size_t warm_cap;
    int warm_wanted;          /* the spare restores into warm_buf (not into its declared blocks) */
    pthread_t warm_thread;    /* grows it in the background (warm_grow_check) */
    int warm_growing;
    atomic_int warm_grown;
    void *warm_next;          /* ...into this buffer of warm_next_cap bytes */
    size_t warm_next_cap;
    size_t restore_cold;      /* bytes this recovery received into memory not faulted in before */
    size_t gen_bytes_published; /* KEY_GEN_BYTES of this rank, as this process set it */
    ctl_t *snap_ctl;          /* the snapshot threads' own connection (rt_on_commit) */
    pthread_mutex_t snap_ctl_mu; /* ...shared by the current epoch's thread and a finishing one */
    int persist_answered;     /* the no-spare persist request of this epoch was answered */
    int64_t cur_step;
    double step_t0;           /* when the step in flight started (end of the previous commit) */
    double snapshot_wait_ms;  /* the step in flight waited this long for the previous generation */
    long long last_disk_step; /* --ft disk: newest checkpoint, steps completed */
    /* capture staging: head + table + extra of the generation in flight, and its regions */
    unsigned char *head;
    size_t head_cap;
    dp_region app_regions[GEN_MAX_REGIONS];
    SnapRegion snap_regions[GEN_MAX_REGIONS + 1];
    /* ...and its local part (snapshot.h): on ranks other than 0 the DP_IDENTICAL regions
     * behind a head of their own, kept in this rank's snapshots but not replicated */
    unsigned char *local_head;
    size_t local_head_cap;
    SnapRegion snap_locals[GEN_MAX_REGIONS + 1];
    int nlocals;
    int own_seen;             /* pub_mu: a generation this process committed or restored had state of
                               * its own: it claims no more (KEY_STATELESS) */
    /* state DeadPool owns (dp_state_declare): two blocks, one per generation parity, each
     * [head area | region 0 | region 1 | ...], so that a generation is one contiguous payload */
    dp_state_spec state[GEN_MAX_REGIONS];
    size_t state_off[GEN_MAX_REGIONS]; /* of each region within a block, after the head area */
    int nstate;
    int spread_block;         /* dp_replica_spread: prefer holders outside our block of ranks */
    /* the job's processes' replica addresses and machines, looked up once each (rt_placement.c) */
    pthread_mutex_t facts_mu;
    struct ProcFacts *facts;
    int nfacts, facts_cap;
    unsigned char *block[2];
    size_t head_area, block_bytes;
    void *restored_extra;     /* the extra state of the generation restored last */
    size_t restored_extra_len;
    int restored_identical;   /* ...and whether it carried the DP_IDENTICAL regions */
    Decision decision;        /* the one being followed (large: not on the stack) */
};

/* --- runtime.c ---------------------------------------------------------------------- */

/* The step's failure: logged, reported to the coordinator (unless Redis is away), in dp->err. */
dp_status rt_comm_failed(dp_t *dp, const char *what);
/* The step abandoned: the coordinator closed the epoch after a failure. */
dp_status rt_epoch_closed(dp_t *dp);

/* --- rt_inject.c --------------------------------------------------------------------- */

/* dp_step_before_reduce: fires the --inject and --chaos faults of step `step`. */
void rt_maybe_inject(dp_t *dp, int64_t step);
/* join_epoch and join_initial: rkill, the process taking its rank dies while it joins dp->epoch
 * (a recovery, or epoch 0 as the job starts). */
void rt_maybe_inject_in_recovery(dp_t *dp);

/* --- rt_exec.c ----------------------------------------------------------------------- */

/* What dp_options leaves unset, from the environment a launcher set (worker_env_set). */
void rt_options_from_env(dp_options *o);

/* --- rt_telemetry.c ------------------------------------------------------------------ */

/* Marks the control plane down (confirmed: by the heartbeat thread's own beat, which logs it;
 * else a call on the training path that timed out) and wakes the heartbeat thread. */
void rt_control_down(dp_t *dp, const ctl_t *c, int confirmed);
/* After a failed call on c: marks the control plane down when it was the server's absence. */
void rt_note_failure(dp_t *dp, const ctl_t *c);
/* The bound on a Redis call on the training path (about a third of a step). */
int rt_path_timeout_ms(const dp_t *dp);
int rt_collective_bound_ms(const dp_t *dp, uint64_t bytes);
/* rt_async.c: waits until no asynchronous collective is queued (before a synchronous one);
 * fails what is queued at the end of an epoch (before its communicator goes); stops the
 * queue's thread (before the process's memory goes). */
void rt_async_idle(dp_t *dp);
void rt_async_end_epoch(dp_t *dp);
void rt_async_stop(dp_t *dp);
/* A Redis connection of a thread of this process (named `who` in the log), tried again while
 * the control plane is away, until it connects or the process stops (dp->hb_stop): NULL then,
 * or for a failure that is no outage. */
ctl_t *rt_thread_connect(dp_t *dp, const char *who);
/* The heartbeat thread (pthread_create's start routine; arg: the dp_t). */
void *rt_heartbeat_loop(void *arg);
/* Rank 0's metrics line of step `step`: pushed at once, or queued while Redis is away. */
void rt_push_metrics(dp_t *dp, int64_t step, const dp_metrics *m, double step_ms);
/* Rank 0 of a new epoch, after its first step: the `recovered` event(s) with the timeline. */
void rt_report_recovery(dp_t *dp);
/* The `snapshot_stats` event of this process's snapshot engine (dp->snap). */
void rt_report_snapshot_stats(dp_t *dp);

/* --- rt_capture.c -------------------------------------------------------------------- */

/* Captures snapshot generation `step` where the declared state lies (no copy): 1 captured, 0
 * not possible (gather the regions and copy as usual). */
int rt_capture_zero_copy(dp_t *dp, int64_t step, const void *extra, size_t extra_len);
/* The application's regions now into dp->snap_regions (head first) and the local part into
 * dp->snap_locals. The number of snapshot regions, -1 + dp->err. */
int rt_gather_regions(dp_t *dp, int64_t step, const void *extra, size_t extra_len);
/* The state DeadPool owns (dp_state_declare), as the restore finds it too: the block that
 * holds generation gen, the index of region `id` among the declared ones (-1: not declared),
 * generation gen of the k-th declared region. */
unsigned char *rt_block_of(const dp_t *dp, int64_t gen);
int rt_state_index(const dp_t *dp, uint32_t id);
unsigned char *rt_state_at(const dp_t *dp, int k, int64_t gen);
/* The application's regions now, then the declared state of generation gen (at most max). The
 * number, -1 + dp->err. */
int rt_app_regions(dp_t *dp, int64_t gen, dp_region *out, int max);

/* --- rt_restore.c -------------------------------------------------------------------- */

/* Checks a verified payload of this rank (and its local part) and hands it to the application. */
int rt_restore_payload(dp_t *dp, const SnapHeader *h, const void *payload, const void *local, size_t local_len,
                       char *err, size_t errlen);
/* Rank's state of the resumed checkpoint: this machine's disk, else the launcher that has it. */
int rt_read_resumed_state(dp_t *dp, int rank, SnapHeader *h, void **payload, char *err, size_t errlen);
/* Puts this rank's state at generation `rollback` (-1: the initial state). 0 / -1 + err. */
int rt_restore_generation(dp_t *dp, Snapshot *old, long long rollback, char *err, size_t errlen);
/* After a restore: the identical state's broadcast, then the application's rebuild. */
dp_status rt_share_and_rebuild(dp_t *dp, int *state_lost, char *err, size_t errlen);
/* A spare's warm buffer: allocated at join, grown while it waits, taken, released. */
void rt_warm_restore_buffer(dp_t *dp);
void rt_warm_grow_check(dp_t *dp);
void rt_warm_grow_finish(dp_t *dp, int wait);
void rt_release_warm_buffer(dp_t *dp);
/* Fetches rank's generation `step` from a holder recorded in recent epochs. 0 / -1. */
int rt_fetch_from_holders(dp_t *dp, int rank, long long step, long newest_epoch, SnapHeader *h, void **payload);
/* 1 when no generation of `rank` carried state of its own (so g holds the identical state at most). */
int rt_rank_stateless(dp_t *dp, int rank, long long g);
/* A payload in memory DeadPool keeps (not to be freed). */
int rt_payload_is_ours(const dp_t *dp, const void *p);

/* --- rt_persist.c -------------------------------------------------------------------- */

/* Writes a committed generation of rank h->rank to disk and counts it; the last rank
 * completes the checkpoint. */
void rt_persist_generation(dp_t *dp, ctl_t *c, const SnapHeader *h, const void *payload);
/* The snapshot engine's commit callback (SnapshotConfig.on_commit; arg: the dp_t). */
void rt_on_commit(const SnapHeader *h, const void *payload, void *arg);
/* --ft disk: every rank writes its live state, then rank 0 completes the checkpoint. */
dp_status rt_disk_checkpoint(dp_t *dp, int64_t step, const void *extra, size_t extra_len);
/* While waiting for a decision: the coordinator's no-spare persist request, answered once. */
void rt_answer_persist_request(dp_t *dp);
/* The control plane is lost: the generations in the local buffers go to disk (no Redis). */
void rt_persist_without_control(dp_t *dp);

/* --- rt_placement.c ------------------------------------------------------------------ */

/* Chooses this rank's replica holders for dp->epoch, records them, and starts the epoch's
 * snapshot engine (dp->snap). 0; -1 + err; -2 + err when it failed for the control plane's
 * absence (a Redis call or connection that found no server: trying again may work). */
int rt_start_snapshots(dp_t *dp, char *err, size_t errlen);

/* --- rt_comm.c ----------------------------------------------------------------------- */

/* Where the epoch's rendezvous happens: under Sentinel the master the control connection
 * found last; the epoch's fence key ends a rendezvous nobody will complete (see fence_epoch). */
typedef struct {
    char host[256], fence[256];
    comm_store_addr addr;
} EpochStore;
int rt_epoch_store(dp_t *dp, EpochStore *es, char *err, size_t errlen);
/* Ends the epoch's groups, then its communicator. */
void rt_end_epoch_comms(dp_t *dp);

/* --- runtime.c and rt_membership.c: what the flow's two files call in each other ----------- */
extern atomic_int rt_init_transient;
int rt_retry_transient(const ctl_t *c, double deadline);
void rt_emit_error(dp_t *dp, const char *what, const char *err);
void rt_set_role_log(dp_t *dp);
lc_actions rt_lc_feed(dp_t *dp, lc_input in);
void rt_priority_default(void);
void rt_control_lost_persist(dp_t *dp, char *err, size_t errlen);
void rt_report_fenced(dp_t *dp, long e);
lc_actions rt_await_decision(dp_t *dp, Decision *d, long *epoch);
dp_status rt_follow_decisions(dp_t *dp, Decision *d, char *err, size_t errlen);

#endif
