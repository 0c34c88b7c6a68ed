/* trainer.h — the built-in GPT-2 trainer: one rank's loop, a client of deadpool.h and nothing
 * more.
 *
 * Data parallel (ZeRO-1), per step k on rank r of N, with A micro-batches per rank:
 *   1. forward + backward on micro-batches r*A .. r*A+A-1 of step k (pure functions of seed, k);
 *   2. gradients summed over ranks by a ring allreduce (fixed order, timing-independent);
 *   3. global-norm clipping, then AdamW on this rank's 1/N shard of parameters and moments;
 *   4. allgather of the updated shards, so every rank holds the same parameters.
 * With --tp/--pp (layout.h) the rank holds a part of the model (a tensor slice of a pipeline
 * stage): step 1 is a 1F1B pipeline over the A micro-batches of its data-parallel replica d,
 * with the tensor-parallel allreduces inside the model; steps 2-4 run in its data-parallel
 * group (same stage and slice); the tied embedding's gradient is summed between the first and
 * the last stage, the loss and the norm over all ranks (docs/DESIGN.md, "3D parallelism").
 * Its non-reconstructible state is the rank's parameter shard and AdamW moments (three
 * DP_SHARDED regions); the data position, learning rate and every random choice are
 * functions of (seed, step, replica), so no extra state is needed. */
#ifndef DEADPOOL_TRAINER_H
#define DEADPOOL_TRAINER_H

#include <stddef.h>

#include "deadpool.h"
#include "model.h"
#include "train_options.h"

typedef struct Trainer Trainer;

/* Loads the model (preset + init, an llm.c file, or the resumed checkpoint's model) and the
 * data for a job of dp_world(dp) ranks. NULL + err on any problem (bad file, vocabulary
 * mismatch, memory). */
Trainer *trainer_create(const TrainOptions *o, dp_t *dp, char *err, size_t errlen);
void trainer_free(Trainer *t);

/* DeadPool's callbacks for this trainer (arg = t). */
dp_callbacks trainer_callbacks(Trainer *t);

/* Runs steps dp_next_step .. dp_steps-1: DP_OK when all are done, else the status that
 * stopped it (DP_FAILED: recover and call again). */
dp_status trainer_train(Trainer *t);

/* After the last step of a 3D-parallel job, gathers the whole model from every rank's shard
 * (a collective over all ranks; nothing to do without model parallelism). DP_OK, DP_FAILED. */
dp_status trainer_gather_model(Trainer *t);

/* Writes the current parameters as an llm.c model file. 0 / -1 + err. */
int trainer_save_model(const Trainer *t, const char *path, char *err, size_t errlen);

/* The built-in trainer as a program (`deadpool train ARGS`, started by `deadpool run`). */
int gpt2_main(int argc, char **argv);

#endif
