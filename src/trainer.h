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

const GPT2Config *trainer_model_config(const Trainer *t);
size_t trainer_num_params(const Trainer *t);
const char *trainer_data_description(const Trainer *t);

/* The step to run next (0, or the resumed checkpoint's step + 1). */
int trainer_first_step(const Trainer *t);

/* The live non-reconstructible state as regions in shard_state.h's layout (4 regions). */
int trainer_state_regions(Trainer *t, SnapRegion regions[4]);
/* After each optimizer update the trainer waits for `snap` to finish reading the previous
 * generation (before the update) and hands it the new one (after). NULL detaches. */
void trainer_attach_snapshot(Trainer *t, Snapshot *snap);

/* Runs step `step` over comm. COMM_OK, or the comm error that interrupted it (the trainer's
 * state is then undefined until restored). */
comm_status trainer_step(Trainer *t, comm_t *comm, int step, StepStats *stats);

/* Writes the current parameters as an llm.c model file. 0 / -1 + err. */
int trainer_save_model(const Trainer *t, const char *path, char *err, size_t errlen);

#endif
