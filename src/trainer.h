/* trainer.h — one data-parallel rank's training loop (ZeRO-1 over the comm layer).
 *
 * Per step k on rank r of N, with A micro-batches per rank:
 *   1. forward + backward on micro-batches r*A .. r*A+A-1 of step k (pure functions of seed, k);
 *   2. gradients summed over ranks by a ring allreduce (fixed order, timing-independent);
 *   3. global-norm clipping, then AdamW on this rank's 1/N shard of parameters and moments;
 *   4. allgather of the updated shards, so every rank holds the same parameters. */
#ifndef DEADPOOL_TRAINER_H
#define DEADPOOL_TRAINER_H

#include <stddef.h>
#include "comm.h"
#include "config.h"
#include "model.h"
#include "snapshot.h"

typedef struct Trainer Trainer;

typedef struct {
    int step;            /* the step just completed (0-based) */
    float loss;          /* mean loss over every rank's micro-batches */
    float lr;
    float grad_norm;     /* before clipping */
    double step_ms;
    double tokens_per_s; /* whole job */
    double snapshot_wait_ms; /* time the step blocked on the previous snapshot's copy */
} StepStats;

/* Loads the model (preset + init, or llm.c file, or with cfg->resume_step >= 0 the checkpoint's
 * model and this rank's verified shard state) and the data for this job. rank/size describe
 * the data-parallel group. NULL + err on any problem (bad file, vocabulary mismatch, memory). */
Trainer *trainer_create(const JobConfig *cfg, int rank, int size, char *err, size_t errlen);
void trainer_free(Trainer *t);
/* The model shape a job trains (from its preset, model file or resumed checkpoint). 0 / -1. */
int trainer_job_model_config(const JobConfig *cfg, GPT2Config *mc, char *err, size_t errlen);

const GPT2Config *trainer_model_config(const Trainer *t);
size_t trainer_num_params(const Trainer *t);
const char *trainer_data_description(const Trainer *t);

/* The step to run next (0, or the resumed checkpoint's step + 1). */
int trainer_first_step(const Trainer *t);

/* A warm spare builds its trainer before it knows which rank it will replace; taking a rank
 * only changes which micro-batches and which shard are its own. */
void trainer_set_rank(Trainer *t, int rank);
/* Loads a verified state payload (shard_state.h layout) of this rank. 0 / -1 + err. */
int trainer_restore(Trainer *t, const SnapHeader *h, const void *payload, char *err, size_t errlen);
/* Back to the initial state (rollback before the first committed generation). */
void trainer_reinit(Trainer *t);
/* Rebuilds the full parameters from every rank's shard (allgather). */
comm_status trainer_sync_params(Trainer *t, comm_t *comm);

/* The live non-reconstructible state as regions in shard_state.h's layout (4 regions). */
int trainer_state_regions(Trainer *t, SnapRegion regions[4]);
/* Before each gradient reduction the trainer waits for `snap` to commit the previous
 * generation, and after each optimizer update it hands `snap` the new one. NULL detaches. */
void trainer_attach_snapshot(Trainer *t, Snapshot *snap);

typedef enum {
    TRAIN_OK = 0,
    TRAIN_COMM = 1,    /* a collective failed: see comm_last_error */
    TRAIN_SNAPSHOT = 2, /* the previous generation could not be replicated (a holder is lost) */
    TRAIN_FENCED = 3    /* the epoch was closed: stopped before changing any state */
} train_status;

/* Asked after the gradient reduction, before the optimizer changes any state: non-zero
 * means the epoch is closed and the step must not go on. */
void trainer_set_fence_check(Trainer *t, int (*closed)(void *arg), void *arg);
/* Called in the middle of every step, after its forward/backward, before any communication:
 * where injected faults fire (a failure mid-compute is the common case). */
void trainer_set_mid_step_hook(Trainer *t, void (*hook)(void *arg, int step), void *arg);
/* A flag raised from another thread when the epoch closes: the step in flight is abandoned
 * between layers (TRAIN_FENCED) instead of computing to the end. */
void trainer_set_abort_flag(Trainer *t, const _Atomic int *flag);

/* Runs step `step` over comm. On failure the trainer's live state is undefined until restored. */
train_status trainer_step(Trainer *t, comm_t *comm, int step, StepStats *stats);

/* Writes the current parameters as an llm.c model file. 0 / -1 + err. */
int trainer_save_model(const Trainer *t, const char *path, char *err, size_t errlen);

#endif
