/* deadpool.h — DeadPool's public API: put any training loop under in-memory fault tolerance.
 *
 * A DeadPool job is a set of processes started by `deadpool run [options] -- PROGRAM ARGS`
 * (or joined by hand with `deadpool worker`): W ranks that train and S warm spares that wait.
 * Every iteration each rank hands DeadPool its non-reconstructible state (optimizer shard,
 * cursor, RNG); DeadPool keeps the two newest generations in host memory and replicates them
 * to peers in the background. When a rank crashes, hangs or loses its network, the survivors
 * abandon the step, a spare takes the failed rank, every rank restores the newest generation
 * all of them committed, the collectives are rebuilt and the loop goes on: the job never
 * restarts, and (for a loop that is deterministic in its step) the result is bit-identical.
 *
 * The loop, in full (examples/mlp.c is a complete program):
 *
 *     dp_t *dp = dp_init(NULL, err, sizeof err);           // role, rank, world from the job
 *     if (!dp) return dp_finish(NULL, DP_ERR);             // a bad job, or Redis away too long
 *     build the model for dp_world(dp) ranks;               // warm: spares do this too
 *     dp_join(dp, &callbacks, err, sizeof err);             // spares block here until needed
 *     for (;;) {
 *         dp_status st = DP_OK;
 *         for (int64_t step = dp_next_step(dp); step < dp_steps(dp) && st == DP_OK; step++) {
 *             forward + backward;
 *             st = dp_step_before_reduce(dp, step);         // previous generation committed
 *             if (st == DP_OK) st = dp_allreduce_sum(dp, grads, n);
 *             if (st == DP_OK) st = dp_step_before_update(dp); // epoch not closed
 *             if (st == DP_OK) { optimizer update; st = dp_step_commit(dp, step, &extra, sizeof extra, &metrics); }
 *         }
 *         if (st != DP_FAILED || (st = dp_recover(dp, err, sizeof err)) != DP_OK) { finish = st; break; }
 *     }
 *     if (finish == DP_OK && dp_rank(dp) == 0) write the model to dp_out_dir(dp); // see dp_local_rank
 *     return dp_finish(dp, finish);
 *
 * Numbering. Steps are 0-based in this API: the loop runs steps 0 .. dp_steps(dp) - 1, and
 * dp_next_step, the `step` arguments and dp_generation.step count from 0. What a user reads or
 * types counts steps done, from 1: `--inject kill:R@N` fires in API step N - 1, the progress
 * line's "step N/K" and the checkpoint directory `ckpt/step_N` (dp_generation.step = N - 1)
 * are the state after API step N - 1. `--inject kill:R@0` is refused (steps start at 1).
 *
 * Contract. The regions an application reports must not change between dp_step_commit of
 * step k and the next dp_step_before_reduce (the snapshot of k is copied from them in the
 * background meanwhile); in a loop shaped as above this holds by construction. Every call
 * is made from the thread that called dp_init, except the callbacks marked otherwise.
 * Errors: functions that can fail take `char *err, size_t errlen` and write a one-line
 * message naming the problem. This header is C11 and C++ compatible. */
#ifndef DEADPOOL_H
#define DEADPOOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One version for the header, the library's soname (its major) and the pkg-config file (the
 * Makefile reads it from here). API_VERSION counts incompatible changes of this header. */
#define DEADPOOL_VERSION "1.1.0"
#define DEADPOOL_API_VERSION 1

/* Only this header's functions are exported from libdeadpool.so (built -fvisibility=hidden). */
#if defined(__GNUC__)
#define DP_EXPORT __attribute__((visibility("default")))
#else
#define DP_EXPORT
#endif

typedef struct dp dp_t;

typedef enum {
    DP_OK = 0,
    DP_ERR = -1,      /* a usage or setup error; err says which */
    DP_FAILED = 1,    /* the step failed (a peer died, the epoch closed, a holder is lost): call dp_recover */
    DP_STOPPED = 2,   /* the job is over (stopped, or it cannot continue): leave with dp_finish */
    DP_FENCED = 3     /* a newer epoch replaced this process (it hung or was cut off): leave */
} dp_status;

typedef enum {
    DP_ROLE_INITIAL = 0,   /* a member since the job started (or was resumed from disk) */
    DP_ROLE_SURVIVOR = 1,  /* a member that rolled back from its own buffers after a failure */
    DP_ROLE_RECOVERED = 2, /* a spare that took a failed rank and restored its state */
    DP_ROLE_SPARE = 3      /* a spare still waiting (before dp_join returns) */
} dp_role;

typedef enum {
    DP_SHARDED = 0,   /* this rank's own state (a ZeRO shard): snapshotted and replicated by every rank */
    /* The same bytes on every rank: every rank keeps them in its own snapshots (a survivor
     * rolls back with them), rank 0 alone replicates them and writes them to checkpoints.
     * After a restore the lowest rank that restored them broadcasts them to those that did
     * not (see restore). A rank whose state is all DP_IDENTICAL, with no extra, has nothing
     * of its own: its failure loses nothing, even together with its replica holders, as long
     * as one member survives (or rank 0's holder does). */
    DP_IDENTICAL = 1
} dp_region_kind;

/* One piece of state. ids are the application's and must be unique within a generation. */
typedef struct {
    uint32_t id;
    dp_region_kind kind;
    void *ptr;
    size_t len;
} dp_region;

/* A verified generation handed back to the application: its regions point into DeadPool's
 * buffer and are valid only during the callback. */
typedef struct {
    int64_t step;            /* the 0-based step whose update it follows */
    int rank, world;
    const void *extra;       /* the bytes given to dp_step_commit */
    size_t extra_len;
    const dp_region *regions;
    int nregions;
} dp_generation;

typedef struct {
    /* Required. Fills out[0..max) with the state as it is now and returns how many regions
     * (or -1: too many). Asked again at every capture, so state may appear (lazily
     * allocated optimizer moments) or move between steps. */
    int (*regions)(void *arg, dp_region *out, int max);
    /* Puts a generation back into the application. Called first with this rank's generation:
     * its DP_SHARDED regions and extra, with the DP_IDENTICAL regions when the generation
     * carries them, which it does on a survivor (rolled back from its own snapshot) and on
     * rank 0 restored from its replica or its checkpoint file. Where it does not (a spare that
     * took a rank other than 0, whose replica holds that rank's own state only; a spare that
     * took a rank with nothing of its own, which fetches nothing: an empty generation; a rank
     * other than 0 resuming from a checkpoint), it is called a second time, after the new
     * epoch's collectives are up, with only the DP_IDENTICAL regions (g->rank: the rank that
     * broadcast them). So at most twice per recovery or resume. NULL: DeadPool copies each
     * region into the one with the same id that `regions` reports now (same length
     * required). 0 / -1 + err. */
    int (*restore)(void *arg, const dp_generation *g, char *err, size_t errlen);
    /* Back to the initial state (a rollback before the first generation). Required. */
    void (*reset)(void *arg);
    /* After a restore, with the new epoch's collectives: rebuild what can be derived from
     * every rank's state (e.g. allgather the parameter shards). NULL: nothing. DP_OK or
     * DP_FAILED. */
    dp_status (*rebuild)(dp_t *dp, void *arg);
    /* A checkpoint of step `step` has every rank's state on disk in directory `dir`; write the
     * application's own files there (e.g. the model), reading the states with
     * dp_checkpoint_read. May run on a DeadPool thread while the loop trains: touch only
     * immutable application data. NULL: nothing. 0 / -1 + err. */
    int (*checkpoint)(void *arg, const char *dir, int64_t step, int world, char *err, size_t errlen);
    void *arg;
} dp_callbacks;

/* --- state DeadPool owns: snapshots without a copy -------------------------------------
 * Regions given to dp_state_declare live in two buffers DeadPool allocates: generation k of
 * region id is at dp_state(dp, id, k). A training step k reads generation k - 1 from
 * dp_state(dp, id, k - 1) and writes generation k into dp_state(dp, id, k), so that when a
 * step that takes a snapshot commits, its generation is already in a DeadPool buffer and is
 * replicated where it lies, not copied. After a snapshot the two pointers differ (an
 * out-of-place update: the snapshot stays intact); between two snapshots (--snapshot-every >
 * 1), and without in-memory snapshots (--ft none, disk) after the first step, they are the
 * same (in place). The update must allow both: element by element, each output written only
 * after its inputs are read. The initial state goes into dp_state(dp, id, -1) (also from the
 * reset callback). After a rollback to generation g (dp_next_step = g + 1), dp_state(dp, id,
 * g) holds it. Declared regions are DP_SHARDED, restored by DeadPool itself, and not reported
 * by the regions callback (which reports the rest, if any). Call once, before dp_join; DP_OK
 * or DP_ERR + err. */
typedef struct {
    uint32_t id;
    size_t len;
} dp_state_spec;
#define DP_STATE_EXTRA_MAX (64u << 10) /* the largest extra a zero-copy generation carries (else copied) */
DP_EXPORT dp_status dp_state_declare(dp_t *dp, const dp_state_spec *specs, int n, char *err, size_t errlen);
DP_EXPORT void *dp_state(const dp_t *dp, uint32_t id, int64_t gen);

/* Replica placement: take this rank's replica holders from outside its block of `block`
 * consecutive ranks first (rank / block), after the rule that puts them on other machines.
 * For a Megatron layout (rank = t + TP * (d + DP * p)) a block of TP * DP ranks is a pipeline
 * stage: a rank's replicas then live in other stages. Call before dp_join; 0: no blocks. */
DP_EXPORT void dp_replica_spread(dp_t *dp, int block);

/* How to reach the job. NULL (or NULL fields) means: from the environment that `deadpool run`
 * and `deadpool worker` set (DEADPOOL_REDIS, DEADPOOL_JOB, DEADPOOL_RANK or DEADPOOL_SPARE,
 * DEADPOOL_BIND; the password in DEADPOOL_REDIS_PASSWORD). */
typedef struct {
    const char *redis_url;  /* redis://HOST:PORT */
    const char *job;        /* job id */
    int spare;              /* 1: join as a spare */
    int rank;               /* the rank to claim; -1: the first free one */
    const char *bind_host;  /* the address peers reach this process at (default 127.0.0.1) */
} dp_options;

/* Connects to the job, registers this process and claims its role. NULL + err. Process-wide
 * state it changes, and why: SIGPIPE is set to ignored if it was at its default (the Redis
 * client writes to sockets with write(2): a server that closed a connection would otherwise
 * kill the process; a handler of the application's own is left alone). Nothing else: no other
 * signal, and the environment is read, never written (of processes that inherit the id
 * `deadpool run` drew for one process, DEADPOOL_PROC, the first to call dp_init keeps it and
 * the others draw their own). */
DP_EXPORT dp_t *dp_init(const dp_options *opts, char *err, size_t errlen);
/* Becomes a member: an initial member builds the collectives (and, resuming, restores its
 * state from disk); a spare waits, warm, until a failure hands it a rank, then restores that
 * rank's state. DP_OK, DP_STOPPED (the job ended first) or DP_ERR + err. */
DP_EXPORT dp_status dp_join(dp_t *dp, const dp_callbacks *cb, char *err, size_t errlen);
/* Leaves the job; returns the process exit status to use (0 done, non-zero otherwise).
 * `how` is the loop's last status (DP_OK: every step done). Frees dp. After a dp_init that
 * returned NULL, dp_finish(NULL, DP_ERR) is the status to exit with: a bad job (the launcher
 * stops the job) or, when the control plane stayed away past --control-wait, a failed process
 * (the launcher replaces it). */
DP_EXPORT int dp_finish(dp_t *dp, dp_status how);

DP_EXPORT dp_role dp_get_role(const dp_t *dp);
DP_EXPORT int dp_rank(const dp_t *dp);            /* -1 while a spare waits */
DP_EXPORT int dp_world(const dp_t *dp);
/* This rank's place among the job's ranks on its machine (0 = the lowest rank there), -1 for
 * a spare or when it cannot be known (the control plane stayed away past --control-wait, which
 * this call waits out; rank 0 is always 0, without Redis). Who
 * writes the final model, when every rank holds it (plain data parallelism, or ZeRO after
 * its allgather): where dp_local_rank(dp) == 0, one copy per machine into that machine's
 * --out, which is right everywhere (the built-in trainer does this); where dp_rank(dp) == 0,
 * one copy for the job, which is the same thing on one machine or with an --out that every
 * machine shares, but across machines with disks of their own leaves the model on rank 0's
 * machine only (examples/mlp.c, one machine, does this). */
DP_EXPORT int dp_local_rank(dp_t *dp);
DP_EXPORT int64_t dp_next_step(const dp_t *dp);   /* the step to run next (after a join or a recovery) */
DP_EXPORT int64_t dp_steps(const dp_t *dp);       /* --steps */
DP_EXPORT uint64_t dp_seed(const dp_t *dp);       /* --seed */
DP_EXPORT const char *dp_out_dir(const dp_t *dp); /* --out */
/* The checkpoint directory this job resumed from, NULL if none: the application's own files
 * (written by its checkpoint callback) are there. */
DP_EXPORT const char *dp_resume_dir(const dp_t *dp);
DP_EXPORT long dp_epoch(const dp_t *dp);          /* membership epoch: +1 at every recovery */
/* Redis key prefix and address of the current epoch, for a program that builds its own
 * collectives: "dp:JOB:eEPOCH:app:". Redis is untrusted storage: whoever holds its password
 * can change what the program keeps there, so it should hold nothing it does not verify.
 * 0 / -1. */
DP_EXPORT int dp_store_prefix(const dp_t *dp, char *out, size_t len);
DP_EXPORT const char *dp_last_error(const dp_t *dp);
/* DEADPOOL_VERSION of the library as built (it may be newer than the header compiled against). */
DP_EXPORT const char *dp_version(void);
/* "ok", "error", "failed", "stopped", "fenced"; "unknown" for any other value. */
DP_EXPORT const char *dp_status_str(dp_status st);

/* --- the step ------------------------------------------------------------------------- */

/* After the forward/backward of `step`, before any communication: fires injected faults,
 * then waits until the previous generation is committed. DP_OK or DP_FAILED. */
DP_EXPORT dp_status dp_step_before_reduce(dp_t *dp, int64_t step);
/* After the gradient reduction, before the optimizer changes any state: DP_FAILED if the
 * epoch was closed by a failure elsewhere (nothing has changed yet). */
DP_EXPORT dp_status dp_step_before_update(dp_t *dp);
typedef struct {
    double loss;       /* mean loss of the step over every rank (reported by rank 0) */
    double lr, grad_norm;
    double tokens;     /* samples or tokens the whole job processed in the step, for the rate */
} dp_metrics;
/* After the update of `step`: captures generation `step` (the regions, plus `extra` copied
 * now), or with --ft disk writes a checkpoint; reports the step's metrics (may be NULL).
 * DP_OK or DP_FAILED. */
DP_EXPORT dp_status dp_step_commit(dp_t *dp, int64_t step, const void *extra, size_t extra_len, const dp_metrics *m);
/* 1 once the epoch is closed by a failure elsewhere: a long step may poll it and give up
 * early (then return DP_FAILED from its loop). Safe from any thread. */
DP_EXPORT int dp_aborted(const dp_t *dp);
/* After DP_FAILED: waits for the coordinator's decision, rolls back to the newest generation
 * every rank committed (restore, rebuild), and returns DP_OK with dp_next_step set; or
 * DP_STOPPED / DP_FENCED (leave), DP_ERR + err. A survivor keeps its rank and the world does
 * not change: each failed rank is taken by a spare (dp_rank and dp_world are the same after
 * dp_recover; dp_epoch and dp_get_role, now DP_ROLE_SURVIVOR, are not). */
DP_EXPORT dp_status dp_recover(dp_t *dp, char *err, size_t errlen);

/* --- collectives of the current epoch (a fixed-order ring: deterministic) --------------- */
DP_EXPORT dp_status dp_allreduce_sum(dp_t *dp, float *buf, size_t n);
/* The mean over the ranks, in place: the sum of dp_allreduce_sum (the same ring, the same
 * order), then each element multiplied by inv = 1.0f / (float)dp_world(dp), computed once in
 * float. So the bits are the same on every rank and in every run; for a world that is not a
 * power of two an element may differ by 1 ulp from sum / world. Put the step's loss after
 * the gradients (buf[n - 1]) and it is averaged in the same collective: no second allreduce
 * of one float. */
DP_EXPORT dp_status dp_allreduce_mean(dp_t *dp, float *buf, size_t n);
/* out[r*n .. (r+1)*n) = rank r's in[0..n); in may alias out + rank*n. */
DP_EXPORT dp_status dp_allgather(dp_t *dp, const float *in, float *out, size_t n);
DP_EXPORT dp_status dp_broadcast(dp_t *dp, void *buf, size_t nbytes, int root);
DP_EXPORT dp_status dp_barrier(dp_t *dp);

/* --- asynchronous collectives of the current epoch ---------------------------------------
 * Start a collective, go on computing, wait for it later (a gradient bucket's allreduce while
 * backward computes the next). Requests run one at a time on a DeadPool thread, in the order
 * started, on the same fixed ring as the collectives above: the same bits whatever the timing,
 * as long as every rank starts the same requests in the same order. A buffer belongs to
 * DeadPool from the start until dp_wait returns. A synchronous collective first waits for the
 * requests started before it. When the epoch closes (a failure), the request in flight and
 * every one queued fail at once: dp_wait returns DP_FAILED for each, as a failed collective
 * does. Every request is waited for once (dp_wait frees it), also after a failure, before
 * dp_recover. */
typedef enum { DP_FLOAT32 = 0, DP_FLOAT64 = 1, DP_BFLOAT16 = 2, DP_INT64 = 3 } dp_dtype;
/* DP_MEAN: the sum times 1 / world, computed once in the element type (float types; bfloat16
 * in float32, rounded to nearest even), or the sum divided by world (int64, truncated). Max and
 * min of a NaN give the NaN. */
typedef enum { DP_SUM = 0, DP_MEAN = 1, DP_MAX = 2, DP_MIN = 3 } dp_op;
typedef struct dp_request dp_request;

/* Collective. In place over buf[0..n), n elements of `type`. DP_OK with *req set, or DP_ERR
 * (bad arguments, no epoch; *req NULL, dp_last_error says which). */
DP_EXPORT dp_status dp_iallreduce(dp_t *dp, void *buf, size_t n, dp_dtype type, dp_op op, dp_request **req);
/* Collective. out[r*n .. (r+1)*n) = rank r's in[0..n) (n elements of `type`, a multiple of 4
 * bytes); in may alias out + rank*n. */
DP_EXPORT dp_status dp_iallgather(dp_t *dp, const void *in, void *out, size_t n, dp_dtype type, dp_request **req);
/* Collective. Root's buf[0..nbytes) to every rank. */
DP_EXPORT dp_status dp_ibroadcast(dp_t *dp, void *buf, size_t nbytes, int root, dp_request **req);
/* Local. Waits for req and frees it: DP_OK, or DP_FAILED (the step failed: dp_recover), DP_ERR. */
DP_EXPORT dp_status dp_wait(dp_request *req);
/* Local. 1 when req has completed (dp_wait returns at once), else 0. */
DP_EXPORT int dp_test(const dp_request *req);

/* --- groups: collectives among some of the ranks (tensor-, pipeline-, data-parallel) ----- */
typedef struct dp_group dp_group;
/* Joins the group `name` (letters, digits, '_', '-', '.'; at most 64) of `size` ranks as its
 * member `index`: every member passes the same name and size; it returns once all joined.
 * A group belongs to the current epoch: dp_recover ends every group (a failure aborts them
 * together with the epoch's own collectives), so join them again after dp_join and after each
 * dp_recover (dp_epoch changed): in the rebuild callback if it needs them. Join groups in the
 * same order on every rank (a rank waits in each join for that group's members). NULL + err. */
DP_EXPORT dp_group *dp_group_join(dp_t *dp, const char *name, int index, int size, char *err, size_t errlen);
DP_EXPORT int dp_group_index(const dp_group *g);
DP_EXPORT int dp_group_size(const dp_group *g);
DP_EXPORT dp_status dp_group_allreduce_sum(dp_group *g, float *buf, size_t n);
/* dp_allreduce_mean among the group's members: multiplied by 1.0f / (float)dp_group_size(g). */
DP_EXPORT dp_status dp_group_allreduce_mean(dp_group *g, float *buf, size_t n);
DP_EXPORT dp_status dp_group_allgather(dp_group *g, const float *in, float *out, size_t n);
/* Point to point between members (by index), for pipelines. A send is posted and returns at
 * once (the bytes leave when the receiver posts its receive: a send that waited could deadlock
 * two stages sending to each other); buf must stay unchanged until dp_group_wait_sends.
 * Messages between two members under one tag arrive in the order sent. */
DP_EXPORT dp_status dp_group_send(dp_group *g, const void *buf, size_t nbytes, int dst, uint32_t tag);
DP_EXPORT dp_status dp_group_recv(dp_group *g, void *buf, size_t nbytes, int src, uint32_t tag);
DP_EXPORT dp_status dp_group_wait_sends(dp_group *g);

/* --- checkpoints ---------------------------------------------------------------------- */
/* Reads and verifies (CRC32C) rank's state in checkpoint directory `dir` and calls
 * fn(arg, g) with it. fn's result, or -1 + err (missing, truncated, corrupt file). */
DP_EXPORT int dp_checkpoint_read(const char *dir, int rank, int (*fn)(void *arg, const dp_generation *g), void *arg,
                       char *err, size_t errlen);

/* Tells the job that the application wrote an output file (e.g. the final model): a
 * `model_saved` event in events.jsonl. */
DP_EXPORT void dp_output_saved(dp_t *dp, const char *path);

/* --- logging -------------------------------------------------------------------------- */
/* "[deadpool rank R] message" on stderr. */
DP_EXPORT void dp_log(const dp_t *dp, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#ifdef __cplusplus
}
#endif

#endif
